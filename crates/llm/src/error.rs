//! Errors of model loading and inference.

/// Everything that can go wrong loading a model or running it. Messages name what was wrong
/// and where (tensor, metadata key, lengths).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gguf(#[from] ferrite_gguf::Error),
    /// The file is not a model this crate can run (unknown architecture, missing or misshapen
    /// tensors, inconsistent hyperparameters).
    #[error("model: {0}")]
    Model(String),
    /// A prompt plus generation that does not fit the KV cache.
    #[error("context: {0}")]
    Context(String),
    /// A token id outside the vocabulary.
    #[error("token id {id} is out of range for a vocabulary of {vocab}")]
    Token { id: u32, vocab: usize },
    #[error("{0}")]
    Other(String),
}

/// A device backend's error (the CUDA products' planning and launches): as the
/// backend worded it, prefixed with `cuda: `.
impl From<ferrite_core::Error> for Error {
    fn from(e: ferrite_core::Error) -> Error {
        Error::Other(format!("cuda: {e}"))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
