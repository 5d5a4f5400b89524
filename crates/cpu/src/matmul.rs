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

fn gemm_typed<T: WithDType + Default>(
    a: &Tensor,
    b: &Tensor,
    out_shape: &Shape,
    zero: T,
    one: T,
) -> Result<Vec<T>> {
    let (da, db) = (raw::<T>(a, "matmul")?, raw::<T>(b, "matmul")?);
    let (la, lb) = (a.layout(), b.layout());
    let r = a.rank();
    let (m, k, n) = (a.dims()[r - 2], a.dims()[r - 1], b.dims()[r - 1]);
    let batch: usize = a.dims()[..r - 2].iter().product();
    let (sa, sb) = (la.strides(), lb.strides());
    let mut out = crate::alloc::full(out_shape.elem_count(), zero);
    if m == 0 || n == 0 || batch == 0 || k == 0 {
        return Ok(out);
    }
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
                false,
                da.as_ptr().add(oa),
                sa[r - 1] as isize,
                sa[r - 2] as isize,
                db.as_ptr().add(ob),
                sb[r - 1] as isize,
                sb[r - 2] as isize,
                zero,
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

pub(crate) fn matmul(a: &Tensor, b: &Tensor, out_shape: &Shape) -> Result<HostBuffer> {
    Ok(match a.dtype() {
        DType::F32 => HostBuffer::F32(gemm_typed(a, b, out_shape, 0f32, 1f32)?),
        DType::F64 => HostBuffer::F64(gemm_typed(a, b, out_shape, 0f64, 1f64)?),
        DType::F16 => HostBuffer::F16(gemm_typed(a, b, out_shape, f16::ZERO, f16::ONE)?),
        DType::BF16 => {
            // gemm has no bf16 kernels: compute in f32 (exact products, f32 accumulation), which
            // is also what bf16 hardware does.
            let up = |t: &Tensor| -> Result<Tensor> {
                let v: Vec<f32> = contig::<bf16>(t, "matmul")?
                    .iter()
                    .map(|x| x.to_f32())
                    .collect();
                Tensor::from_vec(v, t.shape(), t.device())
            };
            let out = gemm_typed::<f32>(&up(a)?, &up(b)?, out_shape, 0.0, 1.0)?;
            HostBuffer::BF16(out.iter().map(|&x| bf16::from_f32(x)).collect())
        }
        dt => return Err(Error::dtype("matmul", dt, "needs a float dtype")),
    })
}
