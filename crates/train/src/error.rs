//! Errors of the training layer: each names the component and the value that was wrong.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A hyperparameter outside its domain, at construction: `StepLR: step_size must be at
    /// least 1, got 0`.
    #[error("{what}: {msg}")]
    Config { what: &'static str, msg: String },
    /// Saved state that does not fit the object it is loaded into, or a use the schedule does
    /// not allow (stepping OneCycleLR past its total steps).
    #[error("{what}: {msg}")]
    State { what: &'static str, msg: String },
    /// Data that cannot be read or used: names the file (and line or byte offset) or the
    /// dataset and what was wrong.
    #[error("{what}: {msg}")]
    Data { what: &'static str, msg: String },
    /// An error from a tensor op (uploading a batch, computing a metric).
    #[error(transparent)]
    Tensor(#[from] ferrite_core::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn config(what: &'static str, msg: impl Into<String>) -> Error {
        Error::Config {
            what,
            msg: msg.into(),
        }
    }

    pub fn data(what: &'static str, msg: impl Into<String>) -> Error {
        Error::Data {
            what,
            msg: msg.into(),
        }
    }

    pub fn state(what: &'static str, msg: impl Into<String>) -> Error {
        Error::State {
            what,
            msg: msg.into(),
        }
    }
}
