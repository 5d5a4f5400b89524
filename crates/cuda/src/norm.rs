//! Fused row ops on CUDA (kernels in norm.cu): softmax, log_softmax, layer_norm, rms_norm,
//! RoPE, and the backward kernels of the norms and softmax.

use crate::device::CudaBackend;
use crate::kernels::KernelSource;
use ferrite_core::{Error, Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "norm",
    src: include_str!("norm.cu"),
};

pub(crate) fn softmax(_dev: &CudaBackend, _x: &Tensor, log: bool) -> Result<Vec<Arc<dyn Storage>>> {
    Err(Error::backend(
        if log { "log_softmax" } else { "softmax" },
        "not yet on CUDA",
    ))
}
pub(crate) fn layer_norm(
    _dev: &CudaBackend,
    _x: &Tensor,
    _w: &Tensor,
    _b: &Tensor,
    _eps: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    Err(Error::backend("layer_norm", "not yet on CUDA"))
}
pub(crate) fn rms_norm(
    _dev: &CudaBackend,
    _x: &Tensor,
    _w: &Tensor,
    _eps: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    Err(Error::backend("rms_norm", "not yet on CUDA"))
}
pub(crate) fn rope(
    _dev: &CudaBackend,
    _x: &Tensor,
    _cos: &Tensor,
    _sin: &Tensor,
    _interleaved: bool,
) -> Result<Vec<Arc<dyn Storage>>> {
    Err(Error::backend("rope", "not yet on CUDA"))
}
pub(crate) fn softmax_backward(
    _dev: &CudaBackend,
    _y: &Tensor,
    _g: &Tensor,
    _log: bool,
) -> Result<Vec<Arc<dyn Storage>>> {
    Err(Error::backend("softmax_backward", "not yet on CUDA"))
}
pub(crate) fn rms_norm_backward(
    _dev: &CudaBackend,
    _x: &Tensor,
    _w: &Tensor,
    _g: &Tensor,
    _eps: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    Err(Error::backend("rms_norm_backward", "not yet on CUDA"))
}
pub(crate) fn layer_norm_backward(
    _dev: &CudaBackend,
    _x: &Tensor,
    _w: &Tensor,
    _g: &Tensor,
    _eps: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    Err(Error::backend("layer_norm_backward", "not yet on CUDA"))
}
