//! `Op::Cast` on CUDA (kernels in cast.cu): every dtype pair, Rust `as` semantics; contiguous
//! casts between f32, f16 and bf16 take the vectorized `cast_c` kernels.

use crate::device::CudaBackend;
use crate::elementwise::grid;
use crate::kernels::{suffix, Args, Idx, KernelSource};
use ferrite_core::{DType, Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "cast",
    src: include_str!("cast.cu"),
    prebuilt: crate::prebuilt::CAST,
};

pub(crate) fn cast(dev: &CudaBackend, x: &Tensor, to: DType) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "cast";
    let s = dev.input(x, op)?;
    let n = x.elem_count();
    let out = dev.alloc_out(n, to, op)?;
    let half_pair = |a: DType, b: DType| {
        a != b
            && [a, b]
                .iter()
                .all(|d| matches!(d, DType::F32 | DType::F16 | DType::BF16))
    };
    if n > 0 && x.is_contiguous() && half_pair(x.dtype(), to) {
        let args = Args::new()
            .arg(n as u64)
            .arg(CudaBackend::ptr(x, s))
            .arg(out.ptr());
        let name = format!("cast_c_{}_{}", suffix(x.dtype()), suffix(to));
        dev.launch(op, &SOURCE, &name, grid(dev, n as u64, 8), args)?;
    } else if n > 0 {
        let ix = Idx::new(op, x.dims(), &[(x.layout().strides(), x.layout().offset())])?;
        let args = Args::new().arg(ix).arg(s.device_ptr()).arg(out.ptr());
        let name = format!("cast_{}_{}", suffix(x.dtype()), suffix(to));
        dev.launch(op, &SOURCE, &name, grid(dev, n as u64, 1), args)?;
    }
    dev.finish_one(out)
}
