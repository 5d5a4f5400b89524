//! The one error type of this crate. Every message starts with `gguf:` and, for file data,
//! names the field and its byte offset in the file, so a bad file can be found with a hex dump.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The I/O error is part of the message, not a `source`, so that a chained report
    /// (`{:#}`) prints it once.
    #[error("gguf: {path}: {io}")]
    Io { path: PathBuf, io: std::io::Error },

    #[error("gguf: bad magic {found:02x?} at offset 0x0 (expected \"GGUF\" = [47, 47, 55, 46])")]
    BadMagic { found: Vec<u8> },

    #[error("gguf: unsupported version {version} at offset 0x4 (supported: 2, 3){hint}")]
    UnsupportedVersion { version: u32, hint: &'static str },

    #[error("gguf: {field} (offset {offset:#x}): truncated: needs {need} bytes, file has {len}")]
    Truncated {
        field: String,
        offset: u64,
        need: u64,
        len: u64,
    },

    #[error(
        "gguf: {field} (offset {offset:#x}): count {count} is larger than the {remaining} \
         remaining bytes could hold"
    )]
    CountTooLarge {
        field: String,
        offset: u64,
        count: u64,
        remaining: u64,
    },

    #[error("gguf: {field} (offset {offset:#x}): unknown value type id {id}")]
    UnknownValueType { field: String, offset: u64, id: u32 },

    #[error("gguf: {field} (offset {offset:#x}): {what}")]
    BadValue {
        field: String,
        offset: u64,
        what: String,
    },

    #[error("gguf: {field} (offset {offset:#x}): arrays nested deeper than {max} levels")]
    ArrayTooDeep {
        field: String,
        offset: u64,
        max: usize,
    },

    #[error("gguf: {field} (offset {offset:#x}): not valid UTF-8")]
    NotUtf8 { field: String, offset: u64 },

    #[error("gguf: duplicate key '{key}' (offset {offset:#x})")]
    DuplicateKey { key: String, offset: u64 },

    #[error("gguf: duplicate tensor name '{name}' (offset {offset:#x})")]
    DuplicateTensor { name: String, offset: u64 },

    #[error("gguf: tensor '{tensor}' (offset {offset:#x}): unknown tensor type id {id}")]
    UnknownTensorType {
        tensor: String,
        offset: u64,
        id: u32,
    },

    #[error("gguf: tensor '{tensor}' (offset {offset:#x}): {what}")]
    BadShape {
        tensor: String,
        offset: u64,
        what: String,
    },

    #[error("gguf: general.alignment (offset {offset:#x}): {what}")]
    BadAlignment { offset: u64, what: String },

    #[error("gguf: tensor '{tensor}' (offset {offset:#x}): {what}")]
    BadData {
        tensor: String,
        offset: u64,
        what: String,
    },

    #[error("gguf: {path}: split model: {what}")]
    Split { path: PathBuf, what: String },

    #[error("gguf: tensor '{name}' not found")]
    MissingTensor { name: String },

    #[error("gguf: metadata key '{key}' not found")]
    MissingKey { key: String },

    #[error("gguf: metadata key '{key}': expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },

    #[error("unsupported tensor type {ty} in tensor {tensor}")]
    UnsupportedTensor { ty: &'static str, tensor: String },

    #[error("gguf: {op}: unsupported tensor type {ty}")]
    UnsupportedType { op: &'static str, ty: &'static str },

    #[error("gguf: {op}: {what}")]
    Length { op: &'static str, what: String },

    #[error("gguf: write: {what}")]
    Write { what: String },

    #[error("gguf: fetch {model}: {what}")]
    Fetch { model: &'static str, what: String },
}

/// A name or key from a file as shown in messages: control characters and quotes escaped (an
/// error stays one line), at most 100 characters.
pub(crate) fn shown(s: &str) -> String {
    let mut out: String = s.chars().take(100).flat_map(char::escape_debug).collect();
    if s.chars().nth(100).is_some() {
        out.push_str("...");
    }
    out
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            io: source,
        }
    }
}
