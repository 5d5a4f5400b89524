//! Creation ops on CUDA (kernels in create.cu): fill, arange, rand_uniform, rand_normal.

use crate::device::CudaBackend;
use crate::elementwise::grid;
use crate::kernels::{suffix, Args, KernelSource};
use ferrite_core::{map_host, DType, Error, HostBuffer, Result, Shape, Storage};
use std::sync::Arc;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "create",
    src: include_str!("create.cu"),
    prebuilt: crate::prebuilt::CREATE,
};

pub(crate) fn fill(
    dev: &CudaBackend,
    value: f64,
    (shape, dtype): &(Shape, DType),
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "full";
    let n = shape.elem_count();
    let out = dev.alloc_out(n, *dtype, op)?;
    if n > 0 {
        // The value converted exactly as the CPU converts it, as a bit pattern.
        let one = HostBuffer::from_f64_slice(*dtype, &[value]);
        let mut bits = [0u8; 8];
        map_host!(&one, v => {
            let w = std::mem::size_of_val(v.as_slice());
            // SAFETY: plain data of w ≤ 8 bytes.
            let src = unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), w) };
            bits[..w].copy_from_slice(src);
        });
        let cfg = grid(dev, n as u64, 1);
        let args = Args::new().arg(n as u64);
        let (args, name) = match dtype.size_in_bytes() {
            1 => (args.arg(bits[0]), "fill_b1"),
            2 => (args.arg(u16::from_le_bytes([bits[0], bits[1]])), "fill_b2"),
            4 => (
                args.arg(u32::from_le_bytes([bits[0], bits[1], bits[2], bits[3]])),
                "fill_b4",
            ),
            _ => (args.arg(u64::from_le_bytes(bits)), "fill_b8"),
        };
        dev.launch(op, &SOURCE, name, cfg, args.arg(out.ptr()))?;
    }
    dev.finish_one(out)
}

pub(crate) fn arange(
    dev: &CudaBackend,
    start: f64,
    step: f64,
    (shape, dtype): &(Shape, DType),
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "arange";
    let n = shape.elem_count();
    let out = dev.alloc_out(n, *dtype, op)?;
    if n > 0 {
        let args = Args::new()
            .arg(n as u64)
            .arg(start)
            .arg(step)
            .arg(out.ptr());
        let name = format!("arange_{}", suffix(*dtype));
        dev.launch(op, &SOURCE, &name, grid(dev, n as u64, 1), args)?;
    }
    dev.finish_one(out)
}

pub(crate) fn rand(
    dev: &CudaBackend,
    op: &'static str,
    seed: u64,
    a: f64,
    b: f64,
    normal: bool,
    (shape, dtype): &(Shape, DType),
) -> Result<Vec<Arc<dyn Storage>>> {
    if !dtype.is_float() {
        return Err(Error::dtype(op, *dtype, "needs a float dtype"));
    }
    let n = shape.elem_count();
    let out = dev.alloc_out(n, *dtype, op)?;
    if n > 0 {
        let args = Args::new()
            .arg(n as u64)
            .arg(seed)
            .arg(a as f32)
            .arg(b as f32)
            .arg(normal as i32)
            .arg(out.ptr());
        let name = format!("rand_{}", suffix(*dtype));
        dev.launch(op, &SOURCE, &name, grid(dev, n as u64, 1), args)?;
    }
    dev.finish_one(out)
}
