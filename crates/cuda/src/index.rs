//! Index ops on CUDA (kernels in index.cu): index_select, gather, scatter_add, cat.

use crate::device::CudaBackend;
use crate::kernels::KernelSource;
use ferrite_core::{Error, Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "index",
    src: include_str!("index.cu"),
};

pub(crate) fn index_select(
    _dev: &CudaBackend,
    _x: &Tensor,
    _idx: &Tensor,
    _axis: usize,
) -> Result<Vec<Arc<dyn Storage>>> {
    Err(Error::backend("index_select", "not yet on CUDA"))
}
pub(crate) fn gather(
    _dev: &CudaBackend,
    _x: &Tensor,
    _idx: &Tensor,
    _axis: usize,
) -> Result<Vec<Arc<dyn Storage>>> {
    Err(Error::backend("gather", "not yet on CUDA"))
}
pub(crate) fn scatter_add(
    _dev: &CudaBackend,
    _base: &Tensor,
    _idx: &Tensor,
    _src: &Tensor,
    _axis: usize,
) -> Result<Vec<Arc<dyn Storage>>> {
    Err(Error::backend("scatter_add", "not yet on CUDA"))
}
pub(crate) fn cat(
    _dev: &CudaBackend,
    _xs: &[&Tensor],
    _axis: usize,
) -> Result<Vec<Arc<dyn Storage>>> {
    Err(Error::backend("cat", "not yet on CUDA"))
}
