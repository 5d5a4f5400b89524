//! The error type: every message names the op and what was wrong.

use crate::{DType, Shape};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Shapes that do not fit the op, e.g. `matmul: inner dimensions differ: [4, 3] x [5, 2]`.
    #[error("{op}: {msg}")]
    Shape { op: &'static str, msg: String },
    #[error("{op}: dtype {found} not supported ({msg})")]
    DType {
        op: &'static str,
        found: DType,
        msg: String,
    },
    #[error("{op}: dtypes differ: {lhs} and {rhs}")]
    DTypeMismatch {
        op: &'static str,
        lhs: DType,
        rhs: DType,
    },
    #[error("{op}: axis {axis} out of range for a tensor of rank {rank}")]
    Axis {
        op: &'static str,
        axis: isize,
        rank: usize,
    },
    #[error("{op}: index {index} out of range for axis {axis} of size {size}")]
    Index {
        op: &'static str,
        index: i64,
        axis: usize,
        size: usize,
    },
    #[error("{op}: tensors are on different devices: {lhs} and {rhs}")]
    DeviceMismatch {
        op: &'static str,
        lhs: String,
        rhs: String,
    },
    #[error("{op}: {msg}")]
    Backend { op: &'static str, msg: String },
    /// An error in a layer (`ferrite-nn`): `path` is its dotted place in the model (empty at
    /// the root), `module` its type: `features.3 (Conv2d): expected 64 input channels, ...`.
    #[error("{}", module_message(path, module, msg))]
    Module {
        path: String,
        module: &'static str,
        msg: String,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

fn module_message(path: &str, module: &str, msg: &str) -> String {
    match path.is_empty() {
        true => format!("{module}: {msg}"),
        false => format!("{path} ({module}): {msg}"),
    }
}

impl Error {
    pub fn shape(op: &'static str, msg: impl Into<String>) -> Error {
        Error::Shape {
            op,
            msg: msg.into(),
        }
    }

    pub fn dtype(op: &'static str, found: DType, msg: impl Into<String>) -> Error {
        Error::DType {
            op,
            found,
            msg: msg.into(),
        }
    }

    /// An error of a layer of type `module` at the model's root (containers prefix the path).
    pub fn module(module: &'static str, msg: impl Into<String>) -> Error {
        Error::Module {
            path: String::new(),
            module,
            msg: msg.into(),
        }
    }

    pub fn backend(op: &'static str, msg: impl Into<String>) -> Error {
        Error::Backend {
            op,
            msg: msg.into(),
        }
    }
}

/// `[4, 3]`-style rendering for error messages.
pub(crate) fn fmt_shapes(shapes: &[&Shape]) -> String {
    shapes
        .iter()
        .map(|s| format!("{s}"))
        .collect::<Vec<_>>()
        .join(" x ")
}
