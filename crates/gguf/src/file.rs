//! `GgufFile`: an opened, validated GGUF model (one file or all shards of a split model).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{shown, Error, Result};
use crate::reader::{self, TensorInfo};
use crate::value::{Array, Value};

enum Storage {
    Mmap(memmap2::Mmap),
    Bytes(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Bytes(b) => b,
        }
    }
}

struct Shard {
    path: Option<PathBuf>,
    storage: Storage,
    data_start: u64,
}

/// A validated GGUF model. Tensor bytes are zero-copy views into the memory-mapped file(s).
/// For split models the metadata is that of the first shard and the tensors are those of all
/// shards, in shard order.
pub struct GgufFile {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    shards: Vec<Shard>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("paths", &self.paths())
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

fn map_file(path: &Path) -> Result<Storage> {
    // Checked before opening: opening a FIFO would block, and directories cannot be mapped.
    let md = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !md.is_file() {
        let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file");
        return Err(Error::io(path, e));
    }
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if len == 0 {
        return Ok(Storage::Bytes(Vec::new()));
    }
    // SAFETY: the map is read-only. Like every mmap-based reader, we rely on the file not
    // being truncated or rewritten by another process while it is open.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    Ok(Storage::Mmap(map))
}

/// `(prefix, index, count)` of `prefix-00001-of-00003.gguf` (index and count 1-based).
fn split_name(path: &Path) -> Option<(String, u32, u32)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, index) = rest.rsplit_once('-')?;
    if index.len() != 5 || count.len() != 5 {
        return None;
    }
    let index: u32 = index.parse().ok()?;
    let count: u32 = count.parse().ok()?;
    (index >= 1 && index <= count).then(|| (prefix.to_string(), index, count))
}

fn split_int(h: &reader::Header, key: &str) -> Option<i128> {
    h.index
        .get(key)
        .and_then(|&i| h.metadata.get(i))
        .and_then(|(_, v)| v.as_int())
}

impl GgufFile {
    /// Opens and validates a GGUF file. A file named `name-0000K-of-0000N.gguf` opens all N
    /// shards of that split model (from the same folder) as one model.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        match split_name(path) {
            Some((prefix, _, count)) if count > 1 => {
                let dir = path.parent().unwrap_or(Path::new(""));
                let paths: Vec<PathBuf> = (1..=count)
                    .map(|i| dir.join(format!("{prefix}-{i:05}-of-{count:05}.gguf")))
                    .collect();
                Self::open_shards(&paths)
            }
            _ => Self::open_shards(&[path.to_path_buf()]),
        }
    }

    /// Validates an in-memory GGUF file.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_storages(vec![(None, Storage::Bytes(bytes))])
    }

    fn open_shards(paths: &[PathBuf]) -> Result<GgufFile> {
        let mut storages = Vec::with_capacity(paths.len());
        for p in paths {
            storages.push((Some(p.clone()), map_file(p)?));
        }
        Self::from_storages(storages)
    }

    fn from_storages(storages: Vec<(Option<PathBuf>, Storage)>) -> Result<GgufFile> {
        let n_shards = storages.len();
        let mut shards = Vec::with_capacity(n_shards);
        let mut first: Option<reader::Header> = None;
        let mut tensors = Vec::new();
        let mut tensor_index = HashMap::new();
        for (i, (path, storage)) in storages.into_iter().enumerate() {
            let mut header =
                reader::parse(storage.bytes()).map_err(|e| match (&path, n_shards) {
                    (Some(p), n) if n > 1 => Error::Split {
                        path: p.clone(),
                        what: format!("shard {}: {e}", i + 1),
                    },
                    _ => e,
                })?;
            if n_shards > 1 {
                let split_err = |what: String| Error::Split {
                    path: path.clone().unwrap_or_default(),
                    what,
                };
                if let Some(no) = split_int(&header, "split.no") {
                    if no != i as i128 {
                        return Err(split_err(format!("split.no is {no}, expected {i}")));
                    }
                }
                if let Some(count) = split_int(&header, "split.count") {
                    if count != n_shards as i128 {
                        return Err(split_err(format!(
                            "split.count is {count}, expected {n_shards}"
                        )));
                    }
                }
            }
            for mut t in std::mem::take(&mut header.tensors) {
                if tensor_index.contains_key(&t.name) {
                    return Err(Error::DuplicateTensor {
                        name: shown(&t.name),
                        offset: t.info_offset,
                    });
                }
                t.shard = i;
                tensor_index.insert(t.name.clone(), tensors.len());
                tensors.push(t);
            }
            shards.push(Shard {
                path,
                storage,
                data_start: header.data_start,
            });
            if first.is_none() {
                first = Some(header);
            }
        }
        let first = first.ok_or_else(|| Error::Split {
            path: PathBuf::new(),
            what: "no files to open".to_string(),
        })?;
        if n_shards > 1 {
            if let Some(total) = split_int(&first, "split.tensors.count") {
                if total != tensors.len() as i128 {
                    return Err(Error::Split {
                        path: shards[0].path.clone().unwrap_or_default(),
                        what: format!(
                            "split.tensors.count is {total}, but the shards hold {}",
                            tensors.len()
                        ),
                    });
                }
            }
        }
        Ok(GgufFile {
            version: first.version,
            alignment: first.alignment,
            metadata: first.metadata,
            index: first.index,
            tensors,
            tensor_index,
            shards,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data alignment in bytes (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The files this model was read from (empty for `from_bytes`).
    pub fn paths(&self) -> Vec<&Path> {
        self.shards
            .iter()
            .filter_map(|s| s.path.as_deref())
            .collect()
    }

    /// Total size in bytes of the file(s).
    pub fn file_size(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.storage.bytes().len() as u64)
            .sum()
    }

    /// Offset of the data section in the first file.
    pub fn data_start(&self) -> u64 {
        self.shards.first().map_or(0, |s| s.data_start)
    }

    /// Metadata key/value pairs in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index
            .get(key)
            .and_then(|&i| self.metadata.get(i))
            .map(|(_, v)| v)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| Error::MissingKey {
            key: key.to_string(),
        })
    }

    fn wrong(key: &str, expected: &'static str, v: &Value) -> Error {
        Error::WrongType {
            key: key.to_string(),
            expected,
            found: v.type_desc(),
        }
    }

    fn int<T: TryFrom<i128>>(&self, key: &str, expected: &'static str) -> Result<T> {
        let v = self.require(key)?;
        let n = v.as_int().ok_or_else(|| Self::wrong(key, expected, v))?;
        T::try_from(n).map_err(|_| Error::WrongType {
            key: key.to_string(),
            expected,
            found: format!("{} {n} (out of range)", v.type_desc()),
        })
    }

    /// Any integer value that fits in u32 (converters differ in the integer type they write).
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.int(key, "an integer fitting u32")
    }

    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.int(key, "an integer fitting u64")
    }

    pub fn get_i32(&self, key: &str) -> Result<i32> {
        self.int(key, "an integer fitting i32")
    }

    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.int(key, "an integer fitting i64")
    }

    pub fn get_usize(&self, key: &str) -> Result<usize> {
        self.int(key, "an integer fitting usize")
    }

    /// An f32 value (an f64 value is narrowed).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        match self.require(key)? {
            Value::F32(v) => Ok(*v),
            Value::F64(v) => Ok(*v as f32),
            v => Err(Self::wrong(key, "f32", v)),
        }
    }

    pub fn get_f64(&self, key: &str) -> Result<f64> {
        match self.require(key)? {
            Value::F32(v) => Ok(f64::from(*v)),
            Value::F64(v) => Ok(*v),
            v => Err(Self::wrong(key, "f64", v)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            Value::Bool(v) => Ok(*v),
            v => Err(Self::wrong(key, "bool", v)),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            Value::String(v) => Ok(v),
            v => Err(Self::wrong(key, "string", v)),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<&Array> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            v => Err(Self::wrong(key, "array", v)),
        }
    }

    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        match self.require(key)? {
            Value::Array(Array::String(v)) => Ok(v.iter().collect()),
            v => Err(Self::wrong(key, "array of string", v)),
        }
    }

    pub fn get_f32_array(&self, key: &str) -> Result<&[f32]> {
        match self.require(key)? {
            Value::Array(Array::F32(v)) => Ok(v),
            v => Err(Self::wrong(key, "array of f32", v)),
        }
    }

    pub fn get_i32_array(&self, key: &str) -> Result<&[i32]> {
        match self.require(key)? {
            Value::Array(Array::I32(v)) => Ok(v),
            v => Err(Self::wrong(key, "array of i32", v)),
        }
    }

    pub fn get_u32_array(&self, key: &str) -> Result<&[u32]> {
        match self.require(key)? {
            Value::Array(Array::U32(v)) => Ok(v),
            v => Err(Self::wrong(key, "array of u32", v)),
        }
    }

    /// An integer array of any element type, widened to i64 (u64 values above i64::MAX
    /// are an error).
    pub fn get_int_array(&self, key: &str) -> Result<Vec<i64>> {
        let v = self.require(key)?;
        let a = v
            .as_array()
            .ok_or_else(|| Self::wrong(key, "array of integers", v))?;
        let mut out = Vec::with_capacity(a.len());
        for i in 0..a.len() {
            let n = a
                .get(i)
                .and_then(|e| e.as_int())
                .and_then(|n| i64::try_from(n).ok())
                .ok_or_else(|| Self::wrong(key, "array of integers fitting i64", v))?;
            out.push(n);
        }
        Ok(out)
    }

    /// Tensor infos: file order, shard after shard.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index
            .get(name)
            .and_then(|&i| self.tensors.get(i))
    }

    /// The tensor's bytes, zero-copy (`info.n_bytes` long, validated at open). An info that
    /// does not come from this file yields an empty slice.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let Some(shard) = self.shards.get(info.shard) else {
            return &[];
        };
        let (Ok(start), Ok(n)) = (usize::try_from(info.offset), usize::try_from(info.n_bytes))
        else {
            return &[];
        };
        shard
            .storage
            .bytes()
            .get(start..start.saturating_add(n))
            .unwrap_or(&[])
    }

    /// Drops this process's resident pages of the tensor's bytes, for a caller that keeps
    /// the tensor in another layout: a hint (`MADV_DONTNEED`); the file stays mapped and a
    /// later read faults the pages back in from the page cache, with the same bytes. Pages
    /// shared with neighbouring tensors go too (they come back the same way). No-op for a
    /// file read into memory and off Unix.
    pub fn release(&self, info: &TensorInfo) {
        #[cfg(unix)]
        if let Some(Shard {
            storage: Storage::Mmap(map),
            ..
        }) = self.shards.get(info.shard)
        {
            let data = self.tensor_data(info);
            let offset = (data.as_ptr() as usize).wrapping_sub(map.as_ptr() as usize);
            if !data.is_empty() && offset + data.len() <= map.len() {
                // SAFETY: the map is a read-only shared mapping of a file that is not
                // modified while open (the same assumption as `open`): the pages dropped
                // here read back with the same bytes, so outstanding borrows still see
                // what they saw. The range lies inside the map (checked above).
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        offset,
                        data.len(),
                    )
                };
            }
        }
        #[cfg(not(unix))]
        let _ = info;
    }

    /// The named tensor dequantized to f32 (`n_elements` values, GGUF order). Errors name
    /// the tensor: missing, or `unsupported tensor type IQ2_XXS in tensor X`.
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self.tensor(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
        })?;
        self.dequantize(info)
    }

    /// `info`'s data dequantized to f32.
    pub fn dequantize(&self, info: &TensorInfo) -> Result<Vec<f32>> {
        if !info.ty.is_supported() {
            return Err(Error::UnsupportedTensor {
                ty: info.ty.name(),
                tensor: shown(&info.name),
            });
        }
        let n = usize::try_from(info.n_elements).map_err(|_| Error::Length {
            op: "dequantize",
            what: format!("tensor {} has too many elements", shown(&info.name)),
        })?;
        let mut out = vec![0f32; n];
        crate::quant::dequantize(info.ty, self.tensor_data(info), &mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_file_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<GgufFile>();
    }

    #[test]
    fn split_names_parse() {
        let p = |s: &str| split_name(Path::new(s));
        assert_eq!(
            p("dir/m-00002-of-00003.gguf"),
            Some(("m".to_string(), 2, 3))
        );
        assert_eq!(
            p("a-b-00001-of-00001.gguf"),
            Some(("a-b".to_string(), 1, 1))
        );
        assert_eq!(p("m-00004-of-00003.gguf"), None);
        assert_eq!(p("m-0001-of-00003.gguf"), None);
        assert_eq!(p("m.gguf"), None);
    }
}
