//! Convolutions, pools and channel norms: not yet in WGSL; each returns the explicit error of
//! `unsupported` (the ops are listed in `crate::UNSUPPORTED_OPS`).

use crate::device::WgpuBackend;
use ferrite_core::{Error, Result, Storage, Tensor};
use std::sync::Arc;

type Out = Result<Vec<Arc<dyn Storage>>>;

/// The explicit error of an op this backend does not run yet (listed in `UNSUPPORTED_OPS`).
pub(crate) fn unsupported(op: &'static str) -> Error {
    Error::backend(
        op,
        "not supported by the wgpu backend yet (see docs/wgpu.md)",
    )
}

pub(crate) fn conv2d(
    _dev: &WgpuBackend,
    _x: &Tensor,
    _w: &Tensor,
    _p: &ferrite_core::Conv2dParams,
    _out: &ferrite_core::Shape,
) -> Out {
    Err(unsupported("conv2d"))
}

pub(crate) fn conv_transpose2d(
    _dev: &WgpuBackend,
    _x: &Tensor,
    _w: &Tensor,
    _p: &ferrite_core::Conv2dParams,
    _out: &ferrite_core::Shape,
) -> Out {
    Err(unsupported("conv_transpose2d"))
}

pub(crate) fn conv2d_backward_weight(
    _dev: &WgpuBackend,
    _x: &Tensor,
    _g: &Tensor,
    _p: &ferrite_core::Conv2dParams,
    _out: &ferrite_core::Shape,
) -> Out {
    Err(unsupported("conv2d_backward_weight"))
}

pub(crate) fn max_pool2d(
    _dev: &WgpuBackend,
    _x: &Tensor,
    p: Option<&ferrite_core::Pool2dParams>,
    _out: &ferrite_core::Shape,
) -> Out {
    Err(unsupported(match p {
        Some(_) => "max_pool2d",
        None => "adaptive_max_pool2d",
    }))
}

pub(crate) fn channel_norm(
    _dev: &WgpuBackend,
    _x: &Tensor,
    _w: &Tensor,
    _b: &Tensor,
    groups: Option<usize>,
    _eps: f64,
) -> Out {
    Err(unsupported(match groups {
        Some(_) => "group_norm",
        None => "batch_norm",
    }))
}

pub(crate) fn channel_norm_backward(
    _dev: &WgpuBackend,
    _x: &Tensor,
    _w: &Tensor,
    _g: &Tensor,
    groups: Option<usize>,
    _eps: f64,
) -> Out {
    Err(unsupported(match groups {
        Some(_) => "group_norm_backward",
        None => "batch_norm_backward",
    }))
}
