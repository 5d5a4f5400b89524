//! `Backend::upload_quant` and `Backend::qmatmul` on wgpu: a `QTensor`'s storage is a
//! [`WgpuQMat`] (`qmatrix.rs`), and the product is `matvec.wgsl`'s for any number of input
//! rows (one dispatch per chunk of the matrix's rows), with f32 inputs or, for
//! `ActFormat::Q8` on the formats with integer kernels, inputs quantized by `quantize_q8`
//! first (`dot4I8Packed`). `Q8x2` runs the f32 inputs (finer than q8x2), as on CUDA.

use std::sync::Arc;

use ferrite_core::quant::{ActFormat, QBytes, QStorage, QTensor, QType};
use ferrite_core::{DType, Result, Storage, Tensor};

use crate::device::{Arg, Src, WgpuBackend};
use crate::qmatrix::{self, WgpuQMat};
use crate::util::storage;

const OP: &str = "qmatmul";

/// The bytes in GGUF layout (validated by `QTensor::new`), in chunks of the adapter's largest
/// storage binding.
pub(crate) fn upload_quant(
    dev: &WgpuBackend,
    ty: QType,
    rows: usize,
    cols: usize,
    bytes: &QBytes,
) -> Result<Arc<dyn QStorage>> {
    let max = qmatrix::max_binding(&dev.limits);
    let m = WgpuQMat::upload(
        &dev.device,
        "QTensor",
        ty,
        (rows, cols),
        bytes.as_slice(),
        false,
        max,
    )?;
    Ok(Arc::new(m))
}

/// `y = x @ W^T` (`x` contiguous f32 `[t, cols]`, checked by `QTensor::qmatmul`).
pub(crate) fn qmatmul(
    dev: &WgpuBackend,
    w: &QTensor,
    x: &Tensor,
    act: ActFormat,
) -> Result<Arc<dyn Storage>> {
    let m = WgpuQMat::of(w, OP)?;
    let (rows, cols) = (m.rows, m.cols);
    let t = x.elem_count().checked_div(cols).unwrap_or(0);
    let y = dev.alloc(OP, DType::F32, t * rows)?;
    if t == 0 || rows == 0 {
        return Ok(Arc::new(y));
    }
    // The products read their input as vec4s from word 0 of its buffer.
    let x = if x.layout().offset() == 0 {
        x.clone()
    } else {
        x.copy()?
    };
    let xs = storage(&x, OP)?;
    let q8 = act.for_product(w.ty()) == ActFormat::Q8;
    // Bound where a product reads no bias, no norm weights or no 8-bit input.
    let dummy = dev.alloc(OP, DType::F32, 4)?;
    let xq = if q8 {
        let xq = dev.alloc(OP, DType::U32, qmatrix::q8_row_words(cols) * t)?;
        let (params, groups) = qmatrix::quantize_q8_dispatch(cols, t, false, cols)?;
        let args = [
            Arg::W(xq.buffer()),
            Arg::R(xs.buffer()),
            Arg::R(dummy.buffer()),
        ];
        let src = Src::Module {
            key: "quantize_q8.wgsl",
            build: &|| qmatrix::QUANTIZE_Q8.to_string(),
        };
        dev.launch_args(OP, &src, "quantize_q8", &params, &args, &[&xq], groups)?;
        Some(xq)
    } else {
        None
    };
    let r = qmatrix::rows_variant(t);
    let call = qmatrix::Matvec {
        rows: t,
        x_stride: cols,
        out_stride: rows,
        col0: 0,
        flags: 0,
        eps: 0.0,
    };
    let unpack = dev.f16_unpack.load(std::sync::atomic::Ordering::Relaxed);
    for ch in &m.chunks {
        let opw = qmatrix::outs_per_subgroup(ch.rows, r, q8);
        let key = qmatrix::matvec_key(&m.fmt, r, false, opw, unpack, q8);
        let build = || qmatrix::matvec_source(&m.fmt, r, false, opw, unpack, q8);
        let (params, groups) = call.dispatch(m, ch, opw)?;
        let args = [
            Arg::R(&ch.buf),
            Arg::R(xs.buffer()),
            Arg::W(y.buffer()),
            Arg::R(dummy.buffer()),
            Arg::R(xq.as_ref().unwrap_or(&dummy).buffer()),
            Arg::R(dummy.buffer()),
        ];
        let src = Src::Module {
            key: &key,
            build: &build,
        };
        dev.launch_args(OP, &src, "matvec", &params, &args, &[&y], groups)?;
    }
    Ok(Arc::new(y))
}
