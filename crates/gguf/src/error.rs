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

    /// The file does not start with `GGUF`: `found` holds its first bytes (up to 16) and
    /// `len` its size.
    #[error("gguf: not a GGUF file: {}", not_gguf(found, *len))]
    BadMagic { found: Vec<u8>, len: u64 },

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

/// What a file that is not GGUF starts with, in words: its first bytes as text (other bytes
/// as `\xNN`) and, where they are a known format's, that format's name.
fn not_gguf(found: &[u8], len: u64) -> String {
    if len == 0 {
        return "the file is empty (a GGUF file starts with the 4 bytes \"GGUF\")".into();
    }
    let head: String = found
        .iter()
        .take(8)
        .map(|&b| match b {
            b'"' => "\\\"".to_string(),
            b'\\' => "\\\\".to_string(),
            0x20..=0x7e => (b as char).to_string(),
            _ => format!("\\x{b:02x}"),
        })
        .collect();
    let kind = if found.starts_with(b"\x89PNG") {
        " (a PNG image)"
    } else if found.starts_with(&[0x1f, 0x8b]) {
        " (a gzip archive: unpack it first)"
    } else if found.starts_with(b"PK\x03\x04") {
        " (a zip archive, as PyTorch's .pt and .bin files are: convert the model to GGUF)"
    } else if found.starts_with(b"\x7fELF") {
        " (a program, not a model)"
    } else if found.starts_with(b"version https://git-lfs") {
        " (a Git LFS pointer: fetch the file it points to)"
    } else if found.len() >= 9 && found[8] == b'{' {
        " (a safetensors file: convert the model to GGUF)"
    } else if [b"lmgg", b"fmgg", b"tjgg"]
        .iter()
        .any(|m| found.starts_with(*m))
    {
        " (GGML, GGUF's predecessor: re-convert the model)"
    } else if found.starts_with(b"<") {
        " (an HTML or XML page: perhaps a download that returned a web page)"
    } else if len < 4 {
        " (shorter than GGUF's 4-byte magic)"
    } else {
        ""
    };
    format!("it starts with \"{head}\"{kind}; a GGUF file starts with \"GGUF\"")
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            io: source,
        }
    }
}
