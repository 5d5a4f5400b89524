//! Batched matmul through the `gemm` crate, reading strided (e.g. transposed) views in place.

use crate::storage::{contig, raw};
use ferrite_core::{DType, Error, HostBuffer, Result, Shape, Tensor, WithDType};
use gemm::Parallelism;
use half::{bf16, f16};
use rayon::prelude::*;

/// Storage offset of batch `b` (row-major over the batch dims) for a layout's leading dims.
fn batch_offset(mut b: usize, dims: &[usize], strides: &[usize], offset: usize) -> usize {
    let mut off = offset;
    for k in (0..dims.len()).rev() {
        off += (b % dims[k]) * strides[k];
        b /= dims[k];
    }
    off
}

/// Below this many multiply-adds per matrix, batches run in parallel with single-threaded
/// gemm calls; above, each gemm call uses all threads.
const SMALL: usize = 1 << 18;

/// `a b` (+ `bias` broadcast over rows, + `acc` [.., m, n] contiguous, added to the product in
/// T before it is stored when given: the destination starts as the bias rows plus acc and
/// gemm accumulates onto it).
fn gemm_typed<T: WithDType + Default + std::ops::Add<Output = T>>(
    a: &Tensor,
    b: &Tensor,
    out_shape: &Shape,
    bias: Option<&[T]>,
    acc: Option<&[T]>,
    zero: T,
    one: T,
) -> Result<Vec<T>> {
    let (da, db) = (raw::<T>(a, "matmul")?, raw::<T>(b, "matmul")?);
    let (la, lb) = (a.layout(), b.layout());
    let r = a.rank();
    let (m, k, n) = (a.dims()[r - 2], a.dims()[r - 1], b.dims()[r - 1]);
    let batch: usize = a.dims()[..r - 2].iter().product();
    let (sa, sb) = (la.strides(), lb.strides());
    let mut out = match bias {
        Some(row) if n > 0 => row
            .iter()
            .copied()
            .cycle()
            .take(out_shape.elem_count())
            .collect(),
        _ => crate::alloc::full(out_shape.elem_count(), zero),
    };
    if let Some(acc) = acc {
        for (o, &v) in out.iter_mut().zip(acc) {
            *o = *o + v;
        }
    }
    if m == 0 || n == 0 || batch == 0 || k == 0 {
        return Ok(out);
    }
    let read_dst = bias.is_some() || acc.is_some();
    let run = |bi: usize, dst: &mut [T], par: Parallelism| {
        let oa = batch_offset(bi, &a.dims()[..r - 2], &sa[..r - 2], la.offset());
        let ob = batch_offset(bi, &b.dims()[..r - 2], &sb[..r - 2], lb.offset());
        // SAFETY: the layouts lie within their storages (Tensor guarantees it), so every
        // element gemm reads at these offsets and strides is in bounds; `dst` is an exclusive
        // m x n row-major buffer.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.as_mut_ptr(),
                1,
                n as isize,
                read_dst,
                da.as_ptr().add(oa),
                sa[r - 1] as isize,
                sa[r - 2] as isize,
                db.as_ptr().add(ob),
                sb[r - 1] as isize,
                sb[r - 2] as isize,
                one,
                one,
                false,
                false,
                false,
                par,
            );
        }
    };
    if m * n * k >= SMALL || batch == 1 {
        for (bi, dst) in out.chunks_mut(m * n).enumerate() {
            run(bi, dst, Parallelism::Rayon(0));
        }
    } else {
        out.par_chunks_mut(m * n)
            .enumerate()
            .for_each(|(bi, dst)| run(bi, dst, Parallelism::None));
    }
    Ok(out)
}

/// A 16-bit tensor as f32 values (exact), contiguous in its logical order.
fn widen(t: &Tensor) -> Result<Tensor> {
    let v: Vec<f32> = match t.dtype() {
        DType::BF16 => contig::<bf16>(t, "matmul")?
            .iter()
            .map(|x| x.to_f32())
            .collect(),
        DType::F16 => contig::<f16>(t, "matmul")?
            .iter()
            .map(|x| x.to_f32())
            .collect(),
        _ => contig::<f32>(t, "matmul")?.into_owned(),
    };
    Tensor::from_vec(v, t.shape(), t.device())
}

/// `Op::Matmul` (no bias) and `Op::MatmulBias` (with `acc`, the residual added too): output
/// in `out_dt`, a's dtype or f32 from f16/bf16 operands; f16/bf16 products with a bias or an
/// f32 output, and every bf16 product, compute in f32 (exact products, f32 accumulation, one
/// rounding at the end).
pub(crate) fn matmul(
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    acc: Option<&Tensor>,
    out_shape: &Shape,
    out_dt: DType,
) -> Result<HostBuffer> {
    // Dtypes as `Op::Matmul` / `Op::MatmulBias` state them (checked by `Tensor`); acc comes
    // with a bias.
    let dt = a.dtype();
    let wide = matches!(dt, DType::F16 | DType::BF16)
        && (dt == DType::BF16 || bias.is_some() || out_dt == DType::F32);
    if wide {
        let bias32 = bias.map(widen).transpose()?;
        let row = bias32
            .as_ref()
            .map(|t| contig::<f32>(t, "matmul_bias"))
            .transpose()?;
        let acc32 = acc.map(widen).transpose()?;
        let acc32 = acc32
            .as_ref()
            .map(|t| contig::<f32>(t, "matmul_bias"))
            .transpose()?;
        let out = gemm_typed::<f32>(
            &widen(a)?,
            &widen(b)?,
            out_shape,
            row.as_deref(),
            acc32.as_deref(),
            0.0,
            1.0,
        )?;
        return Ok(match out_dt {
            DType::F32 => HostBuffer::F32(out),
            DType::F16 => HostBuffer::F16(out.iter().map(|&x| f16::from_f32(x)).collect()),
            _ => HostBuffer::BF16(out.iter().map(|&x| bf16::from_f32(x)).collect()),
        });
    }
    Ok(match dt {
        DType::F32 => {
            let row = bias.map(|t| contig::<f32>(t, "matmul_bias")).transpose()?;
            let acc = acc.map(|t| contig::<f32>(t, "matmul_bias")).transpose()?;
            HostBuffer::F32(gemm_typed(
                a,
                b,
                out_shape,
                row.as_deref(),
                acc.as_deref(),
                0f32,
                1f32,
            )?)
        }
        DType::F64 => {
            let row = bias.map(|t| contig::<f64>(t, "matmul_bias")).transpose()?;
            let acc = acc.map(|t| contig::<f64>(t, "matmul_bias")).transpose()?;
            HostBuffer::F64(gemm_typed(
                a,
                b,
                out_shape,
                row.as_deref(),
                acc.as_deref(),
                0f64,
                1f64,
            )?)
        }
        DType::F16 => HostBuffer::F16(gemm_typed(
            a,
            b,
            out_shape,
            None,
            None,
            f16::ZERO,
            f16::ONE,
        )?),
        dt => return Err(Error::dtype("matmul", dt, "needs a float dtype")),
    })
}

/// `b` as a contiguous CPU tensor of `shape`.
fn host_tensor(b: HostBuffer, shape: &Shape, like: &Tensor) -> Tensor {
    let storage = std::sync::Arc::new(crate::storage::CpuStorage::new(b));
    Tensor::from_storage(
        storage,
        ferrite_core::Layout::contiguous(shape.clone()),
        like.device().clone(),
    )
}

/// The dtype a product of `dt` operands accumulates in: f64 for f64, else f32.
fn wide_of(dt: DType) -> DType {
    match dt {
        DType::F64 => DType::F64,
        _ => DType::F32,
    }
}

/// `Op::MatmulBiasGelu`: (gelu_tanh(p), p) with p = a b + bias accumulated in f32 (f64 for
/// f64 operands), each output rounded once from the unrounded p to `out_dt`.
pub(crate) fn matmul_bias_gelu(
    a: &Tensor,
    b: &Tensor,
    bias: &Tensor,
    out_shape: &Shape,
    out_dt: DType,
) -> Result<Vec<HostBuffer>> {
    let wide = wide_of(a.dtype());
    let p = host_tensor(
        matmul(a, b, Some(bias), None, out_shape, wide)?,
        out_shape,
        a,
    );
    let y = host_tensor(
        crate::elementwise::unary(ferrite_core::UnaryOp::GeluTanh, &p)?,
        out_shape,
        a,
    );
    Ok(vec![
        crate::cast::cast(&y, out_dt)?,
        crate::cast::cast(&p, out_dt)?,
    ])
}

/// `Op::MatmulGeluBackward`: gelu_tanh'(x) (g b), the product accumulated in f32 (f64 for
/// f64) and multiplied by the derivative before the one rounding to x's dtype.
pub(crate) fn matmul_gelu_backward(
    g: &Tensor,
    b: &Tensor,
    x: &Tensor,
    out_shape: &Shape,
) -> Result<HostBuffer> {
    let wide = wide_of(x.dtype());
    let q = host_tensor(matmul(g, b, None, None, out_shape, wide)?, out_shape, g);
    let xw = host_tensor(crate::cast::cast(x, wide)?, out_shape, x);
    let d = host_tensor(
        crate::elementwise::binary(ferrite_core::BinaryOp::GeluTanhBackward, &xw, &q)?,
        out_shape,
        x,
    );
    crate::cast::cast(&d, x.dtype())
}
