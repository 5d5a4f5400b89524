//! Attention on CUDA (kernels in attention.cu): forward and backward.

use crate::device::CudaBackend;
use crate::kernels::KernelSource;
use ferrite_core::{Error, Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "attention",
    src: include_str!("attention.cu"),
};

pub(crate) fn attention(
    _dev: &CudaBackend,
    _q: &Tensor,
    _k: &Tensor,
    _v: &Tensor,
    _causal: bool,
    _scale: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    Err(Error::backend("attention", "not yet on CUDA"))
}
pub(crate) fn attention_backward(
    _dev: &CudaBackend,
    _q: &Tensor,
    _k: &Tensor,
    _v: &Tensor,
    _g: &Tensor,
    _causal: bool,
    _scale: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    Err(Error::backend("attention_backward", "not yet on CUDA"))
}
