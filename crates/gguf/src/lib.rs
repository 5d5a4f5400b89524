//! GGUF: a validated, memory-mapped reader, a writer, and the ggml quantization formats.
//!
//! The reader is a security boundary: every count, length, dimension and offset in a file is
//! checked against the bytes present before it is used, and every failure is an [`Error`]
//! naming the field and its file offset; no input panics.

mod error;
pub mod fetch;
mod file;
pub mod quant;
mod reader;
mod types;
mod value;
mod writer;

pub use error::{Error, Result};
pub use file::GgufFile;
pub use reader::{
    TensorInfo, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_KV, MAX_NESTED_ARRAYS,
    MAX_TENSORS,
};
pub use types::{GgmlType, QK_K};
pub use value::{Array, StrArray, Value, ValueType};
pub use writer::{GgufWriter, TensorSink};

/// Opens `bytes` and, if valid, touches everything a user could: every metadata value, every
/// tensor's bytes, and the dequantization of small supported tensors. Used by the fuzz target
/// and the corpus replay test; any panic in here is a bug.
#[doc(hidden)]
pub fn fuzz_open(bytes: &[u8]) -> Result<usize> {
    let f = GgufFile::from_bytes(bytes.to_vec())?;
    let mut touched = f.version() as usize + f.alignment() as usize;
    for (k, v) in f.metadata() {
        touched += k.len() + v.to_string().len();
        let _ = (
            f.get_u32(k),
            f.get_f32(k),
            f.get_str(k),
            f.get_str_array(k),
            f.get_int_array(k),
        );
    }
    for t in f.tensors() {
        let data = f.tensor_data(t);
        assert_eq!(
            data.len() as u64,
            t.n_bytes,
            "tensor {} data length",
            t.name
        );
        touched += data.len();
        if t.n_elements <= 1 << 16 {
            match f.dequantize(t) {
                Ok(v) => assert_eq!(v.len() as u64, t.n_elements),
                Err(e) => assert!(!t.ty.is_supported(), "{e}"),
            }
        }
    }
    Ok(touched)
}
