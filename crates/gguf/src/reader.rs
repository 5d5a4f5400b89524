//! Parsing and validation of one GGUF file held in memory (an mmap or a buffer).
//!
//! Layout (little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv, n_kv key/value
//! pairs, n_tensors tensor infos, padding to `general.alignment` (default 32), tensor data.
//! A string is a u64 byte length then UTF-8 bytes; an array is a u32 element type, a u64 count,
//! then the elements. A tensor info is a name, u32 n_dims, n_dims u64 dims (dims[0] contiguous),
//! u32 type id, u64 offset relative to the start of the data section.
//!
//! Every count and length is checked against the bytes that remain before anything is
//! allocated for it, so memory use is bounded by a small multiple of the file size.

use std::collections::{HashMap, HashSet};

use crate::error::{shown, Error, Result};
use crate::types::GgmlType;
use crate::value::{Array, StrArray, Value, ValueType};

pub const MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
pub const MAX_DIMS: usize = 4;
/// Arrays may nest this many levels (an array of arrays of scalars is 2).
pub const MAX_ARRAY_DEPTH: usize = 3;
/// Most key/value pairs and tensors one file may declare. Real models have well under a
/// hundred keys and a few thousand tensors; the caps bound the reader's memory (a few hundred
/// bytes per entry) for crafted files of millions of tiny entries.
pub const MAX_KV: u64 = 1 << 16;
pub const MAX_TENSORS: u64 = 1 << 16;
/// Most arrays nested inside other arrays, summed over the whole file.
pub const MAX_NESTED_ARRAYS: usize = 1 << 16;
/// Fewest bytes of one key/value pair: key length, empty key, type id, one byte of value.
const MIN_KV_SIZE: u64 = 8 + 4 + 1;
/// Fewest bytes of one tensor info: name length, n_dims, type id, offset (n_dims = 0).
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 4 + 4 + 8;

/// One tensor's description. `offset` is the absolute byte offset of its data in the file
/// that holds it (shard `shard` of a split model); `rel_offset` is the same position
/// relative to that file's data section, as stored in the GGUF header.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// GGUF order: dims[0] is the contiguous (row) dimension. Every dim is >= 1.
    pub dims: Vec<u64>,
    pub offset: u64,
    pub rel_offset: u64,
    pub n_elements: u64,
    pub n_bytes: u64,
    /// Index of the file (shard) of a split model holding the data; 0 for single files.
    pub shard: usize,
    /// Byte offset of this tensor's info record (its name) in the header, for messages.
    pub info_offset: u64,
}

impl TensorInfo {
    /// Elements in one row (dims[0]).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (product of dims[1..]).
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
}

/// The parsed header of one file.
#[derive(Debug)]
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_start: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Arrays nested inside other arrays still allowed in this file (see `MAX_NESTED_ARRAYS`).
    nested_left: usize,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, field: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let truncated = || Error::Truncated {
            field: field(),
            offset: self.offset(),
            need: n,
            len: self.buf.len() as u64,
        };
        if n > self.remaining() {
            return Err(truncated());
        }
        let n = usize::try_from(n).map_err(|_| truncated())?;
        let bytes = self.buf.get(self.pos..self.pos + n).ok_or_else(truncated)?;
        self.pos += n;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, field: &dyn Fn() -> String) -> Result<[u8; N]> {
        let bytes = self.take(N as u64, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self, field: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A u64-length-prefixed UTF-8 string.
    fn string(&mut self, field: &dyn Fn() -> String) -> Result<String> {
        self.str(field).map(str::to_string)
    }

    /// A u64-length-prefixed UTF-8 string, borrowed from the buffer.
    fn str(&mut self, field: &dyn Fn() -> String) -> Result<&'a str> {
        let len_offset = self.offset();
        let len = self.u64(&|| format!("{} (string length)", field()))?;
        if len > self.remaining() {
            return Err(Error::CountTooLarge {
                field: format!("{} (string length)", field()),
                offset: len_offset,
                count: len,
                remaining: self.remaining(),
            });
        }
        let start = self.offset();
        let bytes = self.take(len, field)?;
        std::str::from_utf8(bytes).map_err(|_| Error::NotUtf8 {
            field: field(),
            offset: start,
        })
    }

    /// A u64 element count for elements of at least `min_size` bytes each, checked against
    /// the remaining bytes.
    fn count(&mut self, min_size: u64, field: &dyn Fn() -> String) -> Result<usize> {
        let offset = self.offset();
        let count = self.u64(field)?;
        let remaining = self.remaining();
        let fits = count.checked_mul(min_size).is_some_and(|n| n <= remaining);
        match usize::try_from(count) {
            Ok(n) if fits => Ok(n),
            _ => Err(Error::CountTooLarge {
                field: field(),
                offset,
                count,
                remaining,
            }),
        }
    }
}

fn value_type(c: &mut Cursor, field: &dyn Fn() -> String) -> Result<ValueType> {
    let offset = c.offset();
    let id = c.u32(field)?;
    ValueType::from_id(id).ok_or_else(|| Error::UnknownValueType {
        field: field(),
        offset,
        id,
    })
}

/// Reads `n` fixed-size little-endian elements (`n * S` bytes were checked to be present).
fn fixed<T, const S: usize>(
    c: &mut Cursor,
    n: usize,
    field: &dyn Fn() -> String,
    conv: fn([u8; S]) -> T,
) -> Result<Vec<T>> {
    let bytes = c.take(n as u64 * S as u64, field)?;
    Ok(bytes
        .chunks_exact(S)
        .map(|ch| {
            let mut a = [0u8; S];
            a.copy_from_slice(ch);
            conv(a)
        })
        .collect())
}

fn read_value(c: &mut Cursor, ty: ValueType, key: &str, depth: usize) -> Result<Value> {
    let field = || format!("value of '{key}'");
    Ok(match ty {
        ValueType::U8 => Value::U8(c.array::<1>(&field)?[0]),
        ValueType::I8 => Value::I8(i8::from_le_bytes(c.array(&field)?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array(&field)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array(&field)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(c.array(&field)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array(&field)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array(&field)?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(c.array(&field)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array(&field)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array(&field)?)),
        ValueType::Bool => {
            let offset = c.offset();
            match c.array::<1>(&field)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(Error::BadValue {
                        field: format!("value of '{key}'"),
                        offset,
                        what: format!("bool byte {b} is neither 0 nor 1"),
                    })
                }
            }
        }
        ValueType::String => Value::String(c.string(&field)?),
        ValueType::Array => Value::Array(read_array(c, key, depth + 1)?),
    })
}

fn read_array(c: &mut Cursor, key: &str, depth: usize) -> Result<Array> {
    let offset = c.offset();
    if depth > MAX_ARRAY_DEPTH {
        return Err(Error::ArrayTooDeep {
            field: format!("value of '{key}'"),
            offset,
            max: MAX_ARRAY_DEPTH,
        });
    }
    let elem = value_type(c, &|| format!("array element type of '{key}'"))?;
    let n = c.count(elem.min_size(), &|| format!("array length of '{key}'"))?;
    let field = || format!("array '{key}'");
    let field: &dyn Fn() -> String = &field;
    Ok(match elem {
        ValueType::U8 => Array::U8(fixed(c, n, field, |[b]: [u8; 1]| b)?),
        ValueType::I8 => Array::I8(fixed(c, n, field, i8::from_le_bytes)?),
        ValueType::U16 => Array::U16(fixed(c, n, field, u16::from_le_bytes)?),
        ValueType::I16 => Array::I16(fixed(c, n, field, i16::from_le_bytes)?),
        ValueType::U32 => Array::U32(fixed(c, n, field, u32::from_le_bytes)?),
        ValueType::I32 => Array::I32(fixed(c, n, field, i32::from_le_bytes)?),
        ValueType::F32 => Array::F32(fixed(c, n, field, f32::from_le_bytes)?),
        ValueType::U64 => Array::U64(fixed(c, n, field, u64::from_le_bytes)?),
        ValueType::I64 => Array::I64(fixed(c, n, field, i64::from_le_bytes)?),
        ValueType::F64 => Array::F64(fixed(c, n, field, f64::from_le_bytes)?),
        ValueType::Bool => {
            let start = c.offset();
            let bytes = c.take(n as u64, field)?;
            if let Some(i) = bytes.iter().position(|&b| b > 1) {
                return Err(Error::BadValue {
                    field: format!("element {i} of '{key}'"),
                    offset: start + i as u64,
                    what: format!("bool byte {} is neither 0 nor 1", bytes[i]),
                });
            }
            Array::Bool(bytes.iter().map(|&b| b == 1).collect())
        }
        ValueType::String => {
            let mut v = StrArray::with_capacity(n);
            for i in 0..n {
                v.push(c.str(&|| format!("element {i} of '{key}'"))?);
            }
            Array::String(v)
        }
        ValueType::Array => {
            // Each inner array costs 32 bytes in memory for 12 in the file; a file-wide budget
            // keeps crafted files of millions of empty arrays small (llama.cpp reads none).
            if n > c.nested_left {
                return Err(Error::BadValue {
                    field: format!("array length of '{key}'"),
                    offset: offset + 4,
                    what: format!(
                        "more than {MAX_NESTED_ARRAYS} arrays nested in arrays in one file"
                    ),
                });
            }
            c.nested_left -= n;
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_array(c, key, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}

fn bad_shape(tensor: &str, offset: u64, what: String) -> Error {
    Error::BadShape {
        tensor: tensor.to_string(),
        offset,
        what,
    }
}

/// Parses and validates the header of `buf` and the placement of every tensor's data in it.
pub(crate) fn parse(buf: &[u8]) -> Result<Header> {
    if !buf.starts_with(MAGIC) {
        return Err(Error::BadMagic {
            found: buf[..buf.len().min(16)].to_vec(),
            len: buf.len() as u64,
        });
    }
    let mut c = Cursor {
        buf,
        pos: MAGIC.len(),
        nested_left: MAX_NESTED_ARRAYS,
    };
    let version = c.u32(&|| "version".to_string())?;
    if version != 2 && version != 3 {
        let hint = if version == 1 {
            " (GGUF v1 is obsolete; re-convert the model)"
        } else if matches!(version.swap_bytes(), 2 | 3) {
            " (this looks like a big-endian file)"
        } else {
            ""
        };
        return Err(Error::UnsupportedVersion { version, hint });
    }
    let n_tensors_offset = c.offset();
    let n_tensors = c.u64(&|| "n_tensors".to_string())?;
    if n_tensors > MAX_TENSORS {
        return Err(Error::BadValue {
            field: "n_tensors".to_string(),
            offset: n_tensors_offset,
            what: format!("{n_tensors} tensors is more than the supported {MAX_TENSORS}"),
        });
    }
    let n_kv_offset = c.offset();
    let n_kv = c.count(MIN_KV_SIZE, &|| "n_kv".to_string())?;
    if n_kv as u64 > MAX_KV {
        return Err(Error::BadValue {
            field: "n_kv".to_string(),
            offset: n_kv_offset,
            what: format!("{n_kv} key/value pairs is more than the supported {MAX_KV}"),
        });
    }
    let fits = n_tensors
        .checked_mul(MIN_TENSOR_INFO_SIZE)
        .is_some_and(|n| n <= c.remaining());
    let n_tensors = match usize::try_from(n_tensors) {
        Ok(n) if fits => n,
        _ => {
            return Err(Error::CountTooLarge {
                field: "n_tensors".to_string(),
                offset: n_tensors_offset,
                count: n_tensors,
                remaining: c.remaining(),
            })
        }
    };

    let mut metadata = Vec::with_capacity(n_kv);
    let mut index = HashMap::with_capacity(n_kv);
    let mut alignment_offset = 0;
    for i in 0..n_kv {
        let key_offset = c.offset();
        let key = c.string(&|| format!("key #{i}"))?;
        let k = shown(&key);
        if index.contains_key(&key) {
            return Err(Error::DuplicateKey {
                key: k,
                offset: key_offset,
            });
        }
        let ty = value_type(&mut c, &|| format!("value type of '{k}'"))?;
        if key == "general.alignment" {
            alignment_offset = c.offset();
        }
        let value = read_value(&mut c, ty, &k, 0)?;
        index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }

    let alignment = match index
        .get("general.alignment")
        .and_then(|&i| metadata.get(i))
    {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if *a != 0 && a.is_power_of_two() => u64::from(*a),
        Some((_, Value::U32(a))) => {
            return Err(Error::BadAlignment {
                offset: alignment_offset,
                what: format!("{a} is not a power of two"),
            })
        }
        Some((_, v)) => {
            return Err(Error::BadAlignment {
                offset: alignment_offset,
                what: format!("expected u32, found {}", v.type_desc()),
            })
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors);
    let mut names = HashSet::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let info_offset = c.offset();
        let name = c.string(&|| format!("tensor #{i} name"))?;
        let n = shown(&name);
        if names.contains(&name) {
            return Err(Error::DuplicateTensor {
                name: n,
                offset: info_offset,
            });
        }
        let n_dims = c.u32(&|| format!("n_dims of tensor '{n}'"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(bad_shape(
                &n,
                info_offset,
                format!("n_dims {n_dims} > {MAX_DIMS}"),
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        let mut n_elements: u64 = 1;
        for d in 0..n_dims {
            let dim = c.u64(&|| format!("dims[{d}] of tensor '{n}'"))?;
            if dim == 0 {
                return Err(bad_shape(&n, info_offset, format!("dims[{d}] is 0")));
            }
            n_elements = n_elements
                .checked_mul(dim)
                .filter(|&n| n <= i64::MAX as u64)
                .ok_or_else(|| {
                    bad_shape(
                        &n,
                        info_offset,
                        format!("element count overflows: dims {dims:?} x {dim}"),
                    )
                })?;
            dims.push(dim);
        }
        let type_offset = c.offset();
        let id = c.u32(&|| format!("type of tensor '{n}'"))?;
        let ty = GgmlType::from_id(id).ok_or_else(|| Error::UnknownTensorType {
            tensor: n.clone(),
            offset: type_offset,
            id,
        })?;
        let row = dims.first().copied().unwrap_or(1);
        if row % ty.block_size() as u64 != 0 {
            return Err(bad_shape(
                &n,
                info_offset,
                format!(
                    "row of {row} elements is not a multiple of the {ty} block size {}",
                    ty.block_size()
                ),
            ));
        }
        let n_bytes = ty.bytes_for(n_elements).ok_or_else(|| {
            bad_shape(
                &n,
                info_offset,
                format!("byte size of {n_elements} {ty} elements overflows"),
            )
        })?;
        let rel_offset = c.u64(&|| format!("data offset of tensor '{n}'"))?;
        names.insert(name.clone());
        tensors.push(TensorInfo {
            name,
            ty,
            dims,
            offset: 0,
            rel_offset,
            n_elements,
            n_bytes,
            shard: 0,
            info_offset,
        });
    }

    let len = buf.len() as u64;
    let header_end = c.offset();
    let data_start = header_end.div_ceil(alignment) * alignment;
    if !tensors.is_empty() && data_start > len {
        return Err(Error::Truncated {
            field: "padding before tensor data".to_string(),
            offset: header_end,
            need: data_start - header_end,
            len,
        });
    }
    for t in &mut tensors {
        let bad = |what: String| Error::BadData {
            tensor: shown(&t.name),
            offset: t.info_offset,
            what,
        };
        if t.rel_offset % alignment != 0 {
            return Err(bad(format!(
                "data offset {:#x} is not a multiple of the alignment {alignment}",
                t.rel_offset
            )));
        }
        let start = data_start.checked_add(t.rel_offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= len => t.offset = start,
            _ => {
                return Err(bad(format!(
                    "data [{:#x}, {:#x}) past end of file ({len} bytes)",
                    data_start as u128 + t.rel_offset as u128,
                    data_start as u128 + t.rel_offset as u128 + t.n_bytes as u128
                )))
            }
        }
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if a.offset + a.n_bytes > b.offset {
            return Err(Error::BadData {
                tensor: shown(&b.name),
                offset: b.info_offset,
                what: format!(
                    "data [{:#x}, {:#x}) overlaps tensor '{}' [{:#x}, {:#x})",
                    b.offset,
                    b.offset + b.n_bytes,
                    shown(&a.name),
                    a.offset,
                    a.offset + a.n_bytes
                ),
            });
        }
    }

    Ok(Header {
        version,
        metadata,
        index,
        tensors,
        alignment,
        data_start,
    })
}
