//! `GgufWriter`: builds a GGUF v3 file (metadata, then tensor infos, then tensor data, each
//! tensor's data aligned to `general.alignment`, default 32).
//!
//! Tensors are either added with their bytes (`add_tensor`) or only declared (`declare_tensor`:
//! name, type, dims); the header needs only sizes, so declared tensors are produced one at a
//! time while writing (`write_streaming`), and a file larger than memory can be written.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};
use crate::reader::{DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::types::GgmlType;
use crate::value::{Array, Value};

struct PendingTensor {
    name: String,
    ty: GgmlType,
    dims: Vec<u64>,
    n_bytes: u64,
    /// None for a declared tensor, whose bytes come from `write_streaming`'s callback.
    data: Option<Vec<u8>>,
}

/// Where `write_streaming`'s callback writes one declared tensor's bytes: exactly
/// `n_bytes()` of them, in any number of `write` calls.
pub struct TensorSink<'a> {
    index: usize,
    name: &'a str,
    ty: GgmlType,
    dims: &'a [u64],
    n_bytes: u64,
    written: u64,
    w: &'a mut dyn Write,
    /// Adds the output path to messages.
    ctx: &'a dyn Fn(Error) -> Error,
}

impl TensorSink<'_> {
    /// Position of the tensor in the file (counting added and declared tensors).
    pub fn index(&self) -> usize {
        self.index
    }
    pub fn name(&self) -> &str {
        self.name
    }
    pub fn ty(&self) -> GgmlType {
        self.ty
    }
    /// Dims in GGUF order (dims[0] contiguous).
    pub fn dims(&self) -> &[u64] {
        self.dims
    }
    /// Bytes the tensor takes; the callback must write exactly this many.
    pub fn n_bytes(&self) -> u64 {
        self.n_bytes
    }
    /// Bytes still to write.
    pub fn remaining(&self) -> u64 {
        self.n_bytes - self.written
    }

    /// Appends bytes of the tensor; more than `remaining()` is an error.
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.len() as u64 > self.remaining() {
            return Err((self.ctx)(werr(format!(
                "tensor '{}': {} bytes written past its {} bytes",
                self.name,
                self.written + bytes.len() as u64 - self.n_bytes,
                self.n_bytes
            ))));
        }
        self.w
            .write_all(bytes)
            .map_err(|e| (self.ctx)(werr(e.to_string())))?;
        self.written += bytes.len() as u64;
        Ok(())
    }
}

/// Collects metadata and tensors, then writes them. Everything written is validated the
/// way the reader validates it, so a written file always reads back.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
}

fn werr(what: String) -> Error {
    Error::Write { what }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&a.elem_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::U16(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::I16(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::U32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::I32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::F32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::U64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::I64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::F64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_str(out, s)),
        Array::Array(v) => v.iter().for_each(|a| put_array(out, a)),
    }
}

/// Appends a value's bytes (without its type id).
fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn array_depth(a: &Array) -> usize {
    match a {
        Array::Array(v) => 1 + v.iter().map(array_depth).max().unwrap_or(0),
        _ => 1,
    }
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Sets a metadata value (replacing an earlier value of the same key, keeping its place).
    pub fn set(&mut self, key: &str, value: Value) -> Result<&mut Self> {
        if let Value::Array(a) = &value {
            if array_depth(a) > crate::MAX_ARRAY_DEPTH {
                return Err(werr(format!(
                    "metadata '{key}': arrays nested deeper than {} levels",
                    crate::MAX_ARRAY_DEPTH
                )));
            }
        }
        if key == "general.alignment" {
            match value {
                Value::U32(a) if a != 0 && a.is_power_of_two() => {}
                _ => {
                    return Err(werr(format!(
                        "general.alignment must be a u32 power of two, got {value:?}"
                    )))
                }
            }
        }
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.metadata.push((key.to_string(), value)),
        }
        Ok(self)
    }

    /// Checks a new tensor's name and shape; returns its size in bytes.
    fn check_new(&self, name: &str, ty: GgmlType, dims: &[u64]) -> Result<u64> {
        if self.names.contains(name) {
            return Err(werr(format!("duplicate tensor name '{name}'")));
        }
        if dims.len() > MAX_DIMS || dims.contains(&0) {
            return Err(werr(format!(
                "tensor '{name}': bad dims {dims:?} (1..=4 dims, none 0)"
            )));
        }
        let row = dims.first().copied().unwrap_or(1);
        if row % ty.block_size() as u64 != 0 {
            return Err(werr(format!(
                "tensor '{name}': row of {row} is not a multiple of the {ty} block size {}",
                ty.block_size()
            )));
        }
        let n: Option<u64> = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        n.filter(|&n| n <= i64::MAX as u64)
            .and_then(|n| ty.bytes_for(n))
            .ok_or_else(|| werr(format!("tensor '{name}': {ty} {dims:?} is too large")))
    }

    fn push(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[u64],
        n_bytes: u64,
        data: Option<Vec<u8>>,
    ) {
        self.names.insert(name.to_string());
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            ty,
            dims: dims.to_vec(),
            n_bytes,
            data,
        });
    }

    /// Adds a tensor from its raw bytes (whole blocks of `ty`; dims in GGUF order).
    pub fn add_tensor(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[u64],
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let need = self.check_new(name, ty, dims)?;
        if need != data.len() as u64 {
            return Err(werr(format!(
                "tensor '{name}': {ty} {dims:?} needs {need} bytes, got {}",
                data.len()
            )));
        }
        self.push(name, ty, dims, need, Some(data));
        Ok(self)
    }

    /// Declares a tensor whose bytes `write_streaming`'s callback produces while writing.
    pub fn declare_tensor(&mut self, name: &str, ty: GgmlType, dims: &[u64]) -> Result<&mut Self> {
        let need = self.check_new(name, ty, dims)?;
        self.push(name, ty, dims, need, None);
        Ok(self)
    }

    /// Quantizes `values` (GGUF order) to `ty` and adds the tensor.
    pub fn add_f32_tensor(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[u64],
        values: &[f32],
    ) -> Result<&mut Self> {
        let data = crate::quant::quantize_to_vec(ty, values)?;
        self.add_tensor(name, ty, dims, data)
    }

    fn alignment(&self) -> u64 {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, Value::U32(a))) => u64::from(*a),
            _ => DEFAULT_ALIGNMENT,
        }
    }

    /// The whole file in memory. Every tensor must have been added with its bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }

    /// Writes the file to `path`. Every tensor must have been added with its bytes.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        self.write_streaming(path, no_fill)
    }

    /// Writes the file to any writer. Every tensor must have been added with its bytes.
    pub fn write_to(&self, w: &mut impl Write) -> Result<()> {
        self.write_to_streaming(w, no_fill)
    }

    /// Writes the file to `path`, calling `fill` once per declared tensor, in file order,
    /// after everything before that tensor's data is written. Memory: the header plus
    /// whatever `fill` holds; nothing is buffered beyond the file's `BufWriter`.
    /// On error the partial file is left in place.
    pub fn write_streaming<E: From<Error>>(
        &self,
        path: impl AsRef<Path>,
        fill: impl FnMut(&mut TensorSink<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let path = path.as_ref();
        let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
        let with_path = |e: Error| match e {
            Error::Write { what } => Error::Write {
                what: format!("{}: {what}", path.display()),
            },
            e => e,
        };
        self.write_impl(&mut w, fill, with_path)?;
        w.flush().map_err(|e| Error::io(path, e))?;
        Ok(())
    }

    /// `write_streaming` to any writer.
    pub fn write_to_streaming<E: From<Error>>(
        &self,
        w: &mut impl Write,
        fill: impl FnMut(&mut TensorSink<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.write_impl(w, fill, |e| e)
    }

    fn write_impl<E: From<Error>>(
        &self,
        w: &mut impl Write,
        mut fill: impl FnMut(&mut TensorSink<'_>) -> Result<(), E>,
        ctx: impl Fn(Error) -> Error,
    ) -> Result<(), E> {
        let err = |what: String| E::from(ctx(werr(what)));
        if self.metadata.len() as u64 > crate::MAX_KV
            || self.tensors.len() as u64 > crate::MAX_TENSORS
        {
            return Err(err(format!(
                "{} keys / {} tensors: at most {} of each can be read back",
                self.metadata.len(),
                self.tensors.len(),
                crate::MAX_KV
            )));
        }
        let align = self.alignment();
        let mut head = Vec::new();
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut head, k);
            head.extend_from_slice(&v.ty().id().to_le_bytes());
            put_value(&mut head, v);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut head, &t.name);
            head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ty.id().to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + t.n_bytes).div_ceil(align) * align;
        }
        let pad = |n: u64| vec![0u8; (n.div_ceil(align) * align - n) as usize];
        let io = |e: std::io::Error| err(e.to_string());
        w.write_all(&head).map_err(io)?;
        if !self.tensors.is_empty() {
            w.write_all(&pad(head.len() as u64)).map_err(io)?;
        }
        for (i, t) in self.tensors.iter().enumerate() {
            match &t.data {
                Some(data) => w.write_all(data).map_err(io)?,
                None => {
                    let mut sink = TensorSink {
                        index: i,
                        name: &t.name,
                        ty: t.ty,
                        dims: &t.dims,
                        n_bytes: t.n_bytes,
                        written: 0,
                        w,
                        ctx: &ctx,
                    };
                    fill(&mut sink)?;
                    if sink.written != t.n_bytes {
                        return Err(err(format!(
                            "tensor '{}': {} of its {} bytes were written",
                            t.name, sink.written, t.n_bytes
                        )));
                    }
                }
            }
            if i + 1 < self.tensors.len() {
                w.write_all(&pad(t.n_bytes)).map_err(io)?;
            }
        }
        Ok(())
    }
}

/// The callback of the non-streaming writers: a declared tensor there is an error.
fn no_fill(sink: &mut TensorSink<'_>) -> Result<()> {
    Err(werr(format!(
        "tensor '{}' was declared without data; write it with write_streaming",
        sink.name
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, k: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ k).collect()
    }

    #[test]
    fn streamed_tensors_write_the_same_file_as_added_ones() {
        let q = GgmlType::Q4_0;
        let (a, b) = (bytes(18 * 3, 1), bytes(18 * 4, 2));
        let mut added = GgufWriter::new();
        added.set("k", Value::U32(7)).unwrap();
        added.add_tensor("a", q, &[32, 3], a.clone()).unwrap();
        added
            .add_tensor("x", GgmlType::F32, &[3], vec![0; 12])
            .unwrap();
        added.add_tensor("b", q, &[64, 2], b.clone()).unwrap();
        let mut streamed = GgufWriter::new();
        streamed.set("k", Value::U32(7)).unwrap();
        streamed.declare_tensor("a", q, &[32, 3]).unwrap();
        streamed
            .add_tensor("x", GgmlType::F32, &[3], vec![0; 12])
            .unwrap();
        streamed.declare_tensor("b", q, &[64, 2]).unwrap();
        let mut out = Vec::new();
        let mut seen = Vec::new();
        streamed
            .write_to_streaming(&mut out, |s: &mut TensorSink<'_>| -> Result<()> {
                seen.push((s.index(), s.name().to_string(), s.n_bytes()));
                let data = if s.name() == "a" { &a } else { &b };
                // In two pieces, to check that writes append.
                s.write(&data[..5])?;
                s.write(&data[5..])?;
                assert_eq!(s.remaining(), 0);
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, [(0, "a".into(), 54), (2, "b".into(), 72)]);
        assert_eq!(out, added.to_bytes().unwrap());
        let f = crate::GgufFile::from_bytes(out).unwrap();
        assert_eq!(f.tensor_data(f.tensor("b").unwrap()), &b[..]);
    }

    #[test]
    fn streaming_checks_the_byte_count_and_plain_writes_refuse_declared_tensors() {
        let mut w = GgufWriter::new();
        w.declare_tensor("t", GgmlType::Q8_0, &[32, 2]).unwrap();
        let short =
            w.write_to_streaming(&mut Vec::new(), |s: &mut TensorSink<'_>| s.write(&[0; 34]));
        assert!(short
            .unwrap_err()
            .to_string()
            .contains("tensor 't': 34 of its 68 bytes were written"),);
        let long =
            w.write_to_streaming(&mut Vec::new(), |s: &mut TensorSink<'_>| s.write(&[0; 69]));
        assert!(long
            .unwrap_err()
            .to_string()
            .contains("1 bytes written past its 68 bytes"));
        let plain = w.to_bytes().unwrap_err().to_string();
        assert!(plain.contains("declared without data"), "{plain}");
        assert!(w.declare_tensor("t", GgmlType::Q8_0, &[32]).is_err());
        assert!(w.declare_tensor("u", GgmlType::Q8_0, &[33]).is_err());
    }
}
