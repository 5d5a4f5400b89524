//! Reductions on CUDA (kernels in reduce.cu).

use crate::device::CudaBackend;
use crate::kernels::KernelSource;
use ferrite_core::{Error, ReduceOp, Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "reduce",
    src: include_str!("reduce.cu"),
};

pub(crate) fn reduce(
    _dev: &CudaBackend,
    op: ReduceOp,
    _x: &Tensor,
    _axes: &[usize],
) -> Result<Vec<Arc<dyn Storage>>> {
    Err(Error::backend(op.name(), "not yet on CUDA"))
}
