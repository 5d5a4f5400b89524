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
pub use reader::{TensorInfo, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS};
pub use types::{GgmlType, QK_K};
pub use value::{Array, Value, ValueType};
pub use writer::GgufWriter;
