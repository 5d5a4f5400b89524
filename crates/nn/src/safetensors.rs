//! Safetensors files, read through the `safetensors` crate from a memory map and validated
//! before any tensor is built: the header length (8-byte little-endian size, at most 100 MB,
//! within the file), UTF-8 JSON, no duplicate keys, known dtype names, offsets that tile the
//! data section in order (in bounds, no overlaps, no gaps), byte counts equal to shape x dtype
//! size without overflow, and a data section that ends exactly at the end of the file. A
//! malformed file is one `Error` naming the file and what is wrong; memory use is bounded by
//! the header size (tensors are copied only when loaded, one at a time).

use ::safetensors::tensor::{Dtype, SafeTensors, TensorInfo};
use ferrite_core::{DType, Device, Error, HostBuffer, Result, Tensor};
use std::collections::HashSet;
use std::path::Path;

/// One tensor of a file: name, dtype (as the file names it), shape, byte range in the data
/// section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub start: usize,
    pub end: usize,
}

impl Entry {
    pub fn bytes(&self) -> usize {
        self.end - self.start
    }
}

fn err(what: &str, msg: impl std::fmt::Display) -> Error {
    Error::backend("safetensors", format!("{what}: {msg}"))
}

/// Rejects a header whose JSON object repeats a key (serde maps keep the last silently).
fn check_duplicates(header: &[u8]) -> std::result::Result<(), String> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(
            self,
            mut map: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            let mut seen = HashSet::new();
            let mut dup = None;
            while let Some(k) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                if dup.is_none() && !seen.insert(k.clone()) {
                    dup = Some(k);
                }
            }
            Ok(dup)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(header);
    match de.deserialize_map(Keys) {
        Ok(None) => Ok(()),
        Ok(Some(k)) => Err(format!("duplicate key {k:?} in header")),
        Err(e) => Err(format!("invalid JSON in header: {e}")),
    }
}

/// Parses and validates a whole file's bytes; returns its tensors ordered by offset.
/// `what` names the source in errors (a path).
pub fn parse(bytes: &[u8], what: &str) -> Result<Vec<Entry>> {
    if bytes.len() < 8 {
        return Err(err(
            what,
            format!("file of {} bytes has no header size", bytes.len()),
        ));
    }
    let mut n8 = [0u8; 8];
    n8.copy_from_slice(&bytes[..8]);
    let n = u64::from_le_bytes(n8);
    if n > (bytes.len() - 8) as u64 {
        return Err(err(
            what,
            format!(
                "header size {n} exceeds the {} bytes after it",
                bytes.len() - 8
            ),
        ));
    }
    let header = &bytes[8..8 + n as usize];
    if let Err(e) = std::str::from_utf8(header) {
        return Err(err(what, format!("header is not valid UTF-8: {e}")));
    }
    if header.first() != Some(&b'{') {
        return Err(err(what, "header is not a JSON object"));
    }
    check_duplicates(header).map_err(|m| err(what, m))?;
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| err(what, e))?;
    let mut out: Vec<Entry> = meta
        .tensors()
        .into_iter()
        .map(|(name, info): (String, &TensorInfo)| Entry {
            name,
            dtype: format!("{:?}", info.dtype),
            shape: info.shape.clone(),
            start: info.data_offsets.0,
            end: info.data_offsets.1,
        })
        .collect();
    out.sort_by(|a, b| (a.start, a.end, &a.name).cmp(&(b.start, b.end, &b.name)));
    Ok(out)
}

/// ferrite's dtype for a safetensors dtype name, if it has one.
pub fn dtype_of(name: &str) -> Option<DType> {
    Some(match name {
        "F32" => DType::F32,
        "F64" => DType::F64,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "I32" => DType::I32,
        "I64" => DType::I64,
        "U32" => DType::U32,
        "U8" => DType::U8,
        "BOOL" => DType::Bool,
        _ => return None,
    })
}

fn st_dtype(dt: DType) -> Dtype {
    match dt {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U32 => Dtype::U32,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    }
}

/// Little-endian bytes of one tensor as a host buffer of `dt`.
fn host_from_bytes(dt: DType, b: &[u8]) -> HostBuffer {
    macro_rules! le {
        ($t:ty, $n:expr, $v:ident) => {
            HostBuffer::$v(
                b.chunks_exact($n)
                    .map(|c| {
                        let mut a = [0u8; $n];
                        a.copy_from_slice(c);
                        <$t>::from_le_bytes(a)
                    })
                    .collect(),
            )
        };
    }
    match dt {
        DType::F32 => le!(f32, 4, F32),
        DType::F64 => le!(f64, 8, F64),
        DType::I32 => le!(i32, 4, I32),
        DType::I64 => le!(i64, 8, I64),
        DType::U32 => le!(u32, 4, U32),
        DType::F16 => HostBuffer::F16(
            b.chunks_exact(2)
                .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        DType::BF16 => HostBuffer::BF16(
            b.chunks_exact(2)
                .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        DType::U8 => HostBuffer::U8(b.to_vec()),
        DType::Bool => HostBuffer::Bool(b.iter().map(|&x| x != 0).collect()),
    }
}

fn host_to_bytes(h: &HostBuffer) -> Vec<u8> {
    match h {
        HostBuffer::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        HostBuffer::BF16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        HostBuffer::U8(v) => v.clone(),
        HostBuffer::Bool(v) => v.iter().map(|&x| x as u8).collect(),
    }
}

/// A validated, memory-mapped safetensors file.
pub struct SafetensorsFile {
    map: memmap2::Mmap,
    data_start: usize,
    entries: Vec<Entry>,
    what: String,
}

impl SafetensorsFile {
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        let path = path.as_ref();
        let what = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|e| err(&what, e))?;
        // SAFETY: the map is read-only; a file truncated or rewritten by another process while
        // mapped is outside what any reader can defend against (same contract as ferrite-gguf).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(&what, e))?;
        let entries = parse(&map, &what)?;
        let mut n8 = [0u8; 8];
        n8.copy_from_slice(&map[..8]);
        let data_start = 8 + u64::from_le_bytes(n8) as usize;
        Ok(SafetensorsFile {
            map,
            data_start,
            entries,
            what,
        })
    }

    /// The tensors, ordered by offset.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The raw bytes of an entry.
    pub fn bytes(&self, e: &Entry) -> &[u8] {
        &self.map[self.data_start + e.start..self.data_start + e.end]
    }

    /// Entry `name` as a tensor on `dev`; an error for dtypes ferrite has no type for.
    pub fn tensor(&self, name: &str, dev: &Device) -> Result<Tensor> {
        let e = self
            .entries
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| err(&self.what, format!("no tensor named {name:?}")))?;
        self.load(e, dev)
    }

    pub fn load(&self, e: &Entry, dev: &Device) -> Result<Tensor> {
        let dt = dtype_of(&e.dtype).ok_or_else(|| {
            err(
                &self.what,
                format!(
                    "tensor {:?} has dtype {}, which ferrite does not support",
                    e.name, e.dtype
                ),
            )
        })?;
        Tensor::from_host(host_from_bytes(dt, self.bytes(e)), e.shape.clone(), dev)
    }

    /// Every tensor, in file order.
    pub fn load_all(&self, dev: &Device) -> Result<Vec<(String, Tensor)>> {
        self.entries
            .iter()
            .map(|e| Ok((e.name.clone(), self.load(e, dev)?)))
            .collect()
    }
}

struct HostView {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl ::safetensors::View for HostView {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn views(tensors: &[(String, Tensor)]) -> Result<Vec<(String, HostView)>> {
    let mut seen = HashSet::new();
    tensors
        .iter()
        .map(|(n, t)| {
            if !seen.insert(n.as_str()) {
                return Err(err("save", format!("duplicate tensor name {n:?}")));
            }
            Ok((
                n.clone(),
                HostView {
                    dtype: st_dtype(t.dtype()),
                    shape: t.dims().to_vec(),
                    data: host_to_bytes(&t.to_host()?),
                },
            ))
        })
        .collect()
}

/// Writes `tensors` as a safetensors file (names must be unique).
pub fn save(tensors: &[(String, Tensor)], path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    ::safetensors::serialize_to_file(views(tensors)?, None, path)
        .map_err(|e| err(&path.display().to_string(), e))
}

/// The bytes of a safetensors file holding `tensors`.
pub fn to_bytes(tensors: &[(String, Tensor)]) -> Result<Vec<u8>> {
    ::safetensors::serialize(views(tensors)?, None).map_err(|e| err("serialize", e))
}
