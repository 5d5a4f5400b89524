//! `GgufWriter`: builds a GGUF v3 file (metadata, then tensor infos, then tensor data, each
//! tensor's data aligned to `general.alignment`, default 32).

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
    data: Vec<u8>,
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

    /// Adds a tensor from its raw bytes (whole blocks of `ty`; dims in GGUF order).
    pub fn add_tensor(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[u64],
        data: Vec<u8>,
    ) -> Result<&mut Self> {
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
        let need = n.and_then(|n| ty.bytes_for(n));
        if need != Some(data.len() as u64) {
            return Err(werr(format!(
                "tensor '{name}': {ty} {dims:?} needs {need:?} bytes, got {}",
                data.len()
            )));
        }
        self.names.insert(name.to_string());
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            ty,
            dims: dims.to_vec(),
            data,
        });
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

    /// The whole file in memory.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }

    /// Writes the file to `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
        let mut w = std::io::BufWriter::new(file);
        self.write_to(&mut w).map_err(|e| match e {
            Error::Write { what } => Error::Write {
                what: format!("{}: {what}", path.display()),
            },
            e => e,
        })?;
        w.flush().map_err(|e| Error::io(path, e))
    }

    /// Writes the file to any writer.
    pub fn write_to(&self, w: &mut impl Write) -> Result<()> {
        if self.metadata.len() as u64 > crate::MAX_KV
            || self.tensors.len() as u64 > crate::MAX_TENSORS
        {
            return Err(werr(format!(
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
            offset = (offset + t.data.len() as u64).div_ceil(align) * align;
        }
        let pad = |n: u64| vec![0u8; (n.div_ceil(align) * align - n) as usize];
        let io = |e: std::io::Error| werr(e.to_string());
        w.write_all(&head).map_err(io)?;
        if !self.tensors.is_empty() {
            w.write_all(&pad(head.len() as u64)).map_err(io)?;
        }
        for (i, t) in self.tensors.iter().enumerate() {
            w.write_all(&t.data).map_err(io)?;
            if i + 1 < self.tensors.len() {
                w.write_all(&pad(t.data.len() as u64)).map_err(io)?;
            }
        }
        Ok(())
    }
}
