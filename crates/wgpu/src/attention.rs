//! Attention and its backward: not yet in WGSL; both return the explicit error of
//! `crate::unsupported`.

use crate::conv::unsupported;
use crate::device::WgpuBackend;
use ferrite_core::{Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) fn attention(
    _dev: &WgpuBackend,
    _q: &Tensor,
    _k: &Tensor,
    _v: &Tensor,
    _causal: bool,
    _scale: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    Err(unsupported("attention"))
}

pub(crate) fn attention_backward(
    _dev: &WgpuBackend,
    _inputs: [&Tensor; 4],
    _causal: bool,
    _scale: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    Err(unsupported("attention_backward"))
}
