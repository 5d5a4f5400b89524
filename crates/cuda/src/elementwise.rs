//! Elementwise ops on CUDA (kernels in elementwise.cu): unary, binary, comparisons, where and
//! strided copies. Contiguous operands take the vectorized `_c` kernels; anything else walks
//! a coalesced `Idx`.

use crate::device::{CudaBackend, Out};
use crate::kernels::{suffix, Args, Cfg, Idx, KernelSource};
use crate::storage::CudaStorage;
use ferrite_core::{BinaryOp, CmpOp, DType, Error, Layout, Result, Storage, Tensor, UnaryOp};
use std::sync::Arc;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "elementwise",
    src: include_str!("elementwise.cu"),
    prebuilt: crate::prebuilt::ELEMENTWISE,
};

/// Grid for a grid-stride loop over `n` items handled `per_thread` at a time.
pub(crate) fn grid(dev: &CudaBackend, n: u64, per_thread: u64) -> Cfg {
    let threads = 256u64;
    let blocks = n
        .div_ceil(per_thread.max(1))
        .div_ceil(threads)
        .clamp(1, dev.sm_count.max(1) as u64 * 16);
    Cfg::new((blocks as u32, 1, 1), (threads as u32, 1, 1), 0)
}

fn vec_width(dt: DType) -> u64 {
    (16 / dt.size_in_bytes()) as u64
}

fn code<T: PartialEq>(all: &[T], v: &T) -> u32 {
    all.iter().position(|x| x == v).unwrap_or(0) as u32
}

fn strides_of(t: &Tensor) -> (&[usize], usize) {
    (t.layout().strides(), t.layout().offset())
}

pub(crate) fn unary(dev: &CudaBackend, op: UnaryOp, x: &Tensor) -> Result<Vec<Arc<dyn Storage>>> {
    let name = op.name();
    let dt = x.dtype();
    if dt == DType::Bool {
        return Err(Error::dtype(name, dt, "needs a numeric dtype"));
    }
    if !dt.is_float() && !op.supports_int() {
        return Err(Error::dtype(name, dt, "needs a float dtype"));
    }
    let sx = dev.input(x, name)?;
    let n = x.elem_count();
    let out = dev.alloc_out(n, dt, name)?;
    if n > 0 {
        let opc = code(&UnaryOp::ALL, &op);
        let ix = Idx::new(name, x.dims(), &[strides_of(x)])?;
        if ix.contiguous(1) {
            let args = Args::new()
                .arg(opc)
                .arg(n as u64)
                .arg(CudaBackend::ptr(x, sx))
                .arg(out.ptr());
            let cfg = grid(dev, n as u64, vec_width(dt));
            dev.launch(name, &SOURCE, &format!("unary_c_{}", suffix(dt)), cfg, args)?;
        } else {
            let args = Args::new()
                .arg(opc)
                .arg(ix)
                .arg(sx.device_ptr())
                .arg(out.ptr());
            let cfg = grid(dev, n as u64, 1);
            dev.launch(name, &SOURCE, &format!("unary_s_{}", suffix(dt)), cfg, args)?;
        }
    }
    dev.finish_one(out)
}

pub(crate) fn binary(
    dev: &CudaBackend,
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = op.name();
    let dt = a.dtype();
    if dt == DType::Bool {
        return Err(Error::dtype(name, dt, "needs a numeric dtype"));
    }
    if op.float_only() && !dt.is_float() {
        return Err(Error::dtype(name, dt, "needs a float dtype"));
    }
    let (sa, sb) = (dev.input(a, name)?, dev.input(b, name)?);
    let n = a.elem_count();
    let out = dev.alloc_out(n, dt, name)?;
    if n > 0 {
        let opc = code(&BinaryOp::ALL, &op);
        let ix = Idx::new(name, a.dims(), &[strides_of(a), strides_of(b)])?;
        // The kernels over contiguous packs: (op, n, their shape arguments, a, b, y, their
        // operand-order flag, the fault flag).
        let packed = |kind: &str, shape: &[u64], flag: Option<u32>| -> Result<()> {
            let mut args = Args::new().arg(opc).arg(n as u64);
            for &v in shape {
                args = args.arg(v);
            }
            args = args
                .arg(CudaBackend::ptr(a, sa))
                .arg(CudaBackend::ptr(b, sb))
                .arg(out.ptr());
            if let Some(f) = flag {
                args = args.arg(f);
            }
            let cfg = grid(dev, n as u64, vec_width(dt));
            let kernel = format!("binary_{kind}_{}", suffix(dt));
            dev.launch(name, &SOURCE, &kernel, cfg, args.arg(dev.fault_dev))
        };
        if ix.contiguous(2) {
            packed("c", &[], None)?;
        } else if let Some((m, row_b)) = ix.row_broadcast() {
            packed("r", &[m], Some(row_b as u32))?;
        } else if let Some((m, inner, col_b)) = ix.col_broadcast() {
            packed("k", &[m, inner], Some(col_b as u32))?;
        } else {
            let args = Args::new()
                .arg(opc)
                .arg(ix)
                .arg(sa.device_ptr())
                .arg(sb.device_ptr())
                .arg(out.ptr())
                .arg(dev.fault_dev);
            let cfg = grid(dev, n as u64, 1);
            dev.launch(
                name,
                &SOURCE,
                &format!("binary_s_{}", suffix(dt)),
                cfg,
                args,
            )?;
        }
    }
    dev.finish_one(out)
}

pub(crate) fn cmp(
    dev: &CudaBackend,
    op: CmpOp,
    a: &Tensor,
    b: &Tensor,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = op.name();
    let (sa, sb) = (dev.input(a, name)?, dev.input(b, name)?);
    let n = a.elem_count();
    let out = dev.alloc_out(n, DType::Bool, name)?;
    if n > 0 {
        let ix = Idx::new(name, a.dims(), &[strides_of(a), strides_of(b)])?;
        let args = Args::new()
            .arg(code(&CmpOp::ALL, &op))
            .arg(ix)
            .arg(sa.device_ptr())
            .arg(sb.device_ptr())
            .arg(out.ptr());
        let cfg = grid(dev, n as u64, 1);
        dev.launch(
            name,
            &SOURCE,
            &format!("cmp_s_{}", suffix(a.dtype())),
            cfg,
            args,
        )?;
    }
    dev.finish_one(out)
}

fn width_name(dt: DType) -> &'static str {
    match dt.size_in_bytes() {
        1 => "b1",
        2 => "b2",
        4 => "b4",
        _ => "b8",
    }
}

pub(crate) fn where_cond(
    dev: &CudaBackend,
    c: &Tensor,
    a: &Tensor,
    b: &Tensor,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = "where";
    let (sc, sa, sb) = (
        dev.input(c, name)?,
        dev.input(a, name)?,
        dev.input(b, name)?,
    );
    let n = a.elem_count();
    let dt = a.dtype();
    let out = dev.alloc_out(n, dt, name)?;
    if n > 0 {
        let ix = Idx::new(
            name,
            a.dims(),
            &[strides_of(c), strides_of(a), strides_of(b)],
        )?;
        let args = Args::new()
            .arg(ix)
            .arg(sc.device_ptr())
            .arg(sa.device_ptr())
            .arg(sb.device_ptr())
            .arg(out.ptr());
        let cfg = grid(dev, n as u64, 1);
        dev.launch(
            name,
            &SOURCE,
            &format!("where_s_{}", width_name(dt)),
            cfg,
            args,
        )?;
    }
    dev.finish_one(out)
}

/// The elements `layout` selects from `s`, as a new contiguous buffer (not yet sealed).
pub(crate) fn copy_into(
    dev: &CudaBackend,
    s: &CudaStorage,
    layout: &Layout,
    op: &'static str,
) -> Result<Out> {
    let n = layout.shape().elem_count();
    let out = dev.alloc_out(n, s.dtype(), op)?;
    copy_to(dev, s, layout, out.ptr(), op)?;
    Ok(out)
}

/// Enqueues a copy of the elements `layout` selects from `s` into the contiguous range at
/// `dst` (which must hold them, in a live block of `s`'s dtype), on the compute stream.
pub(crate) fn copy_to(
    dev: &CudaBackend,
    s: &CudaStorage,
    layout: &Layout,
    dst: u64,
    op: &'static str,
) -> Result<()> {
    let dt = s.dtype();
    let n = layout.shape().elem_count();
    if n > 0 {
        let ix = Idx::new(op, layout.dims(), &[(layout.strides(), layout.offset())])?;
        if ix.contiguous(1) {
            let bytes = n * dt.size_in_bytes();
            let src = s.device_ptr() + (layout.offset() * dt.size_in_bytes()) as u64;
            // SAFETY: both ranges lie in live device blocks; ordered on the compute stream.
            unsafe {
                cudarc::driver::sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, dev.compute.0)
                    .result()
                    .map_err(|e| crate::driver::drv(op, e))?;
            }
        } else if let Some(px) = ix.in_packs(dt.size_in_bytes(), &[s.device_ptr()], dst) {
            // Rows of 16-byte packs (a permuted view whose innermost dim is contiguous).
            let args = Args::new().arg(px).arg(s.device_ptr()).arg(dst);
            let cfg = grid(dev, px.n, 1);
            dev.launch(op, &SOURCE, "copy_s_b16", cfg, args)?;
        } else {
            let args = Args::new().arg(ix).arg(s.device_ptr()).arg(dst);
            let cfg = grid(dev, n as u64, 1);
            dev.launch(
                op,
                &SOURCE,
                &format!("copy_s_{}", width_name(dt)),
                cfg,
                args,
            )?;
        }
    }
    Ok(())
}

/// `CudaBackend::write_into`: `src` copied into `dst`'s block in place (see
/// `Backend::write_into`); host reads of `dst` then wait for this copy.
pub(crate) fn write_into(dev: &CudaBackend, dst: &Tensor, src: &Tensor) -> Result<()> {
    let op = "copy_";
    let d = dev.input(dst, op)?;
    let s = dev.input(src, op)?;
    if dst.shares_storage(src) || !dst.is_contiguous() || dst.dtype() != src.dtype() {
        return Err(Error::backend(
            op,
            "source and destination must be distinct storages of one dtype, destination contiguous",
        ));
    }
    if dst.layout().offset() + dst.elem_count() > d.len() || src.elem_count() != dst.elem_count() {
        return Err(Error::backend(op, "destination range outside its storage"));
    }
    copy_to(dev, s, src.layout(), CudaBackend::ptr(dst, d), op)?;
    let ready = dev.ready_now()?;
    d.rewritten(ready);
    Ok(())
}

/// `Op::Copy`: a contiguous copy of a tensor.
pub(crate) fn contiguous(dev: &CudaBackend, x: &Tensor) -> Result<Vec<Arc<dyn Storage>>> {
    let s = dev.input(x, "contiguous")?;
    let out = copy_into(dev, s, x.layout(), "contiguous")?;
    dev.finish_one(out)
}

/// A sealed contiguous copy of a strided view (for host reads).
pub(crate) fn strided_copy(
    dev: &CudaBackend,
    s: &CudaStorage,
    layout: &Layout,
) -> Result<Arc<dyn Storage>> {
    s.ready_for_compute(dev)?;
    let out = copy_into(dev, s, layout, "to_host")?;
    dev.finish_one(out)?
        .pop()
        .ok_or_else(|| Error::backend("to_host", "copy produced no output"))
}
