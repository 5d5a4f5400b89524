//! Reductions on CUDA (kernels in reduce.cu): sum, max, min, argmax, argmin over any set of
//! axes of any layout.
//!
//! Each output reduces one run of R elements. The reduced axes must merge into one run of a
//! single stride (they usually do). Where they do not, f32/f64 sums and max/min reduce the
//! innermost run first and the remaining axes of that result next (`two_stage`); anything
//! else gets a permuted contiguous copy first. The kept axes are walked by an `Idx`, so any
//! kept layout works without a copy.
//! - stride-1 runs of at least 16 bytes: `reduce_row` (up to 1024 elements a group of 4 to
//!   32 lanes per output, sized to the run, else a block), 16-byte loads;
//! - other strides and shorter runs: `reduce_col` (threads over consecutive outputs, so reads coalesce when
//!   the innermost kept axis has stride 1; a loop over the run);
//! - few outputs and long runs: the run is split over `gridDim.y` blocks writing partial
//!   states to a temporary buffer, combined by `reduce_fin`.

use crate::device::CudaBackend;
use crate::kernels::{suffix, Args, Cfg, Idx, KernelSource};
use ferrite_core::{DType, Error, Layout, ReduceOp, Result, Shape, Storage, Tensor};
use std::sync::Arc;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "reduce",
    src: include_str!("reduce.cu"),
    prebuilt: crate::prebuilt::REDUCE,
};

/// Elements per thread along the run, at least, in a split `reduce_col` chunk.
const MIN_PER_THREAD: u64 = 64;

/// The (len, stride) pairs merged into one run when they form one; the order of reduced
/// elements does not matter for any `ReduceOp` (arg ops take one axis).
fn merge_run(mut dims: Vec<(usize, usize)>) -> Option<(usize, usize)> {
    dims.retain(|&(d, _)| d != 1);
    if dims.iter().any(|&(d, _)| d == 0) {
        return Some((0, 1));
    }
    dims.sort_by_key(|&(_, s)| std::cmp::Reverse(s));
    let mut run: Option<(usize, usize)> = None;
    for (d, s) in dims {
        run = match run {
            None => Some((d, s)),
            Some((rd, rs)) if rs == s * d => Some((rd * d, s)),
            Some(_) => return None,
        };
    }
    Some(run.unwrap_or((1, 1)))
}

/// Reduced axes (axis, len, stride) that do not merge into one run, split into the innermost
/// run (the axes of smallest stride that merge) and the rest: two reductions without a
/// permuted copy of the input (a conv bias gradient: [n, c, h, w] over n, h and w). Sums of
/// f32 and f64 only, whose partial sums keep the accumulator's precision, and max/min
/// (exact); `None` where the split does not apply (nothing left outside the inner run).
fn two_stage(
    op: ReduceOp,
    dt: DType,
    axes: &[(usize, usize, usize)],
) -> Option<(Vec<usize>, Vec<usize>)> {
    let eligible = match op {
        ReduceOp::Sum => matches!(dt, DType::F32 | DType::F64),
        ReduceOp::Max | ReduceOp::Min => true,
        ReduceOp::ArgMax | ReduceOp::ArgMin => false,
    };
    if !eligible {
        return None;
    }
    let mut by_stride: Vec<_> = axes.iter().copied().filter(|&(_, d, _)| d > 1).collect();
    by_stride.sort_by_key(|&(_, _, s)| s);
    let (&(a0, d0, s0), rest) = by_stride.split_first()?;
    let mut inner = vec![a0];
    let mut next = d0 * s0;
    for &(a, d, s) in rest {
        if s != next {
            break;
        }
        inner.push(a);
        next = d * s;
    }
    // Size-1 axes need no pass: the output's elements are the same without reducing them.
    let mut outer: Vec<usize> = rest
        .iter()
        .map(|&(a, _, _)| a)
        .filter(|a| !inner.contains(a))
        .collect();
    outer.sort_unstable();
    (!outer.is_empty()).then_some((inner, outer))
}

/// Byte size of the kernels' accumulator type (`Red<T, OP>::A` in reduce.cu).
fn acc_bytes(dt: DType) -> usize {
    if dt.size_in_bytes() == 8 {
        8
    } else {
        4
    }
}

/// A column kernel's launch: `blocks` x (the run in about `splits` chunks) blocks of
/// (bx, by) threads; returns (config, chunks, chunk length).
fn col_split(blocks: u64, (bx, by): (u64, u64), rlen: u64, splits: u64) -> (Cfg, u64, u64) {
    let chunk = rlen.div_ceil(splits.max(1)).max(1);
    let splits = rlen.div_ceil(chunk).max(1);
    let cfg = Cfg::new(
        (blocks as u32, splits as u32, 1),
        (bx as u32, by as u32, 1),
        0,
    );
    (cfg, splits, chunk)
}

/// `reduce_colv`'s (first-pass config, splits, chunk length) for `packs` 16-byte words of
/// outputs and runs of `rlen` on a device of `sm` multiprocessors.
fn colv_plan(sm: u64, packs: u64, rlen: u64) -> (Cfg, u64, u64) {
    let bx = pow2_floor(packs).clamp(1, 32);
    // No more row lanes than rows (a short run's tree stays short).
    let by = (256 / bx).min(rlen.next_power_of_two().max(1));
    let blocks = packs.div_ceil(bx).min(sm * 32);
    // At least 16 elements of the run a thread (4 rounds of 4 loads in flight); blocks of 256
    // threads that fill the device once.
    let splits = (sm * 8).div_ceil(blocks).min(rlen.div_ceil(by * 16));
    col_split(blocks, (bx, by), rlen, splits)
}

/// `Op::CastColSums`: an f32 matrix [m, n] converted to f16/bf16 and summed over its rows in
/// one `reduce_colv_cast` pass where its rows are 16-byte words (n and the row stride
/// multiples of 4, 16-byte aligned); otherwise a cast and a sum.
pub(crate) fn cast_col_sums(
    dev: &CudaBackend,
    x: &Tensor,
    to: DType,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "cast_col_sums";
    let (d, st) = (x.dims(), x.layout().strides());
    let (m, n) = (d[0], d[1]);
    let base = CudaBackend::ptr(x, dev.input(x, op)?);
    let rs = if m == 1 { n } else { st[0] };
    let fused = x.dtype() == DType::F32
        && matches!(to, DType::F16 | DType::BF16)
        && m > 0
        && n.is_multiple_of(4)
        && n > 0
        && st[1] == 1
        && rs.is_multiple_of(4)
        && base.is_multiple_of(16);
    if !fused {
        let mut o = crate::cast::cast(dev, x, to)?;
        o.extend(reduce(dev, ReduceOp::Sum, x, &[0])?);
        return Ok(o);
    }
    let sm = dev.sm_count.max(1) as u64;
    let (cfg, splits, chunk) = colv_plan(sm, n as u64 / 4, m as u64);
    let xc = dev.alloc_out(m * n, to, op)?;
    let y = dev.alloc_out(n, DType::F32, op)?;
    let pv = match splits > 1 {
        true => Some(dev.alloc_out(splits as usize * n, DType::F32, op)?),
        false => None,
    };
    let pv_ptr = pv.as_ref().map_or(0, |b| b.ptr());
    let args = Args::new()
        .arg(n as u64)
        .arg(base)
        .arg(m as u64)
        .arg(rs as u64)
        .arg(chunk)
        .arg(y.ptr())
        .arg(pv_ptr)
        .arg(xc.ptr());
    let name = format!("reduce_colv_cast_sum_f32_{}", suffix(to));
    dev.launch(op, &SOURCE, &name, cfg, args)?;
    if splits > 1 {
        let threads = splits.next_power_of_two().clamp(32, 256) as u32;
        let blocks = (n as u64).min(sm * 32) as u32;
        let args = Args::new()
            .arg(n as u64)
            .arg(splits)
            .arg(pv_ptr)
            .arg(0u64)
            .arg(y.ptr());
        let cfg = Cfg::new((blocks, 1, 1), (threads, 1, 1), 0);
        dev.launch(op, &SOURCE, "reduce_fin_sum_f32", cfg, args)?;
    }
    dev.finish(vec![xc, y])
}

fn pow2_floor(n: u64) -> u64 {
    if n == 0 {
        1
    } else {
        1 << (63 - n.leading_zeros())
    }
}

pub(crate) fn reduce(
    dev: &CudaBackend,
    op: ReduceOp,
    x: &Tensor,
    axes: &[usize],
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = op.name();
    let dt = x.dtype();
    if dt == DType::Bool {
        return Err(Error::dtype(name, dt, "needs a numeric dtype"));
    }
    let arg = matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin);
    let dims = x.dims();
    let st = x.layout().strides();
    if axes.is_empty() || axes.iter().any(|&a| a >= dims.len()) {
        return Err(Error::backend(
            name,
            format!("axes {axes:?} do not fit shape {}", x.shape()),
        ));
    }
    let kept: Vec<usize> = (0..dims.len()).filter(|a| !axes.contains(a)).collect();
    let r: usize = axes.iter().map(|&a| dims[a]).product();
    let nout: usize = kept.iter().map(|&a| dims[a]).product();
    if arg && r > u32::MAX as usize {
        return Err(Error::shape(
            name,
            format!("axis of {r} elements exceeds u32 indices"),
        ));
    }
    if r == 0 && op != ReduceOp::Sum {
        return Err(Error::shape(
            name,
            format!("cannot reduce an empty axis of {}", x.shape()),
        ));
    }
    let run = merge_run(axes.iter().map(|&a| (dims[a], st[a])).collect());
    if nout > 0 && run.is_none() {
        let reduced: Vec<_> = axes.iter().map(|&a| (a, dims[a], st[a])).collect();
        if let Some((inner, outer)) = two_stage(op, dt, &reduced) {
            // The inner run first (its output is the accumulator for f32/f64 sums and exact
            // for max/min), then the rest of the axes of that contiguous result.
            let part = reduce(dev, op, x, &inner)?;
            let pdims: Vec<usize> = (0..dims.len())
                .filter(|a| !inner.contains(a))
                .map(|a| dims[a])
                .collect();
            let part = Tensor::from_storage(
                part.into_iter()
                    .next()
                    .ok_or_else(|| Error::backend(name, "no output"))?,
                Layout::contiguous(Shape::new(pdims)),
                x.device().clone(),
            );
            let outer: Vec<usize> = outer
                .iter()
                .map(|&a| a - inner.iter().filter(|&&i| i < a).count())
                .collect();
            return reduce(dev, op, &part, &outer);
        }
    }
    let s = dev.input(x, name)?;
    let out = dev.alloc_out(nout, if arg { DType::U32 } else { dt }, name)?;
    if nout == 0 {
        return dev.finish_one(out);
    }
    let kept_dims: Vec<usize> = kept.iter().map(|&a| dims[a]).collect();
    // (kept walk, base pointer, run, a permuted copy kept alive until the launches are queued)
    let (ko, base, (rlen, rs), _copy) = match run {
        Some(run) => {
            let kept_st: Vec<usize> = kept.iter().map(|&a| st[a]).collect();
            let ko = Idx::new(name, &kept_dims, &[(&kept_st, x.layout().offset())])?;
            (ko, s.device_ptr(), run, None)
        }
        None => {
            let perm: Vec<usize> = kept.iter().chain(axes).copied().collect();
            let c = crate::elementwise::copy_into(dev, s, &x.layout().permute(&perm)?, name)?;
            let ko = Idx::new(name, &[nout], &[(&[r], 0)])?;
            (ko, c.ptr(), (r, 1), Some(c))
        }
    };
    let (rlen, nout_u) = (rlen as u64, nout as u64);
    let sm = dev.sm_count.max(1) as u64;
    // Blocks of 256 threads that fill the device once.
    let target = sm * 8;
    // Kernel names: reduce_{row,col,fin}_{op name}_{dtype}.
    let kname = |kind: &str| format!("reduce_{kind}_{name}_{}", suffix(dt));
    // Elements per 16-byte word. Runs shorter than a word read better a thread per output.
    let words = 16 / dt.size_in_bytes() as u64;
    let row = rs == 1 && rlen >= words;
    // Lanes per output in `reduce_row`: enough for one word each, at least a word's elements,
    // at most a warp; 0 (a block per output) past 1024 elements, and from 512 where groups
    // of a warp would leave the device mostly idle (fewer than 512 lanes a multiprocessor:
    // the global mean of [32, 8, 32, 32] over its 1,024-element rows).
    let few = nout_u * 32 < sm * 512;
    let group = if rlen > 1024 || (few && rlen >= 512) {
        0
    } else {
        rlen.div_ceil(words)
            .next_power_of_two()
            .clamp(words.max(4), 32)
    };
    // Float sums whose outputs are contiguous 16-byte words (a bias gradient: the rows of
    // [R, n] summed) read a word a thread: `reduce_colv`.
    let out_off = ko.off[0] as u64 * dt.size_in_bytes() as u64;
    let colv = !row
        && op == ReduceOp::Sum
        && matches!(dt, DType::F32 | DType::F16 | DType::BF16)
        && ko.rank == 1
        && ko.st[0][0] == 1
        && nout_u.is_multiple_of(words)
        && (rs as u64).is_multiple_of(words)
        && (base + out_off).is_multiple_of(16);
    // (first-pass config, splits S, chunk length)
    let (cfg, splits, chunk) = if colv {
        colv_plan(sm, nout_u / words, rlen)
    } else if row {
        let rpb = 256u64.checked_div(group).unwrap_or(1);
        let blocks = nout_u.div_ceil(rpb);
        let mut splits = 1;
        if blocks < target && rlen >= 8192 {
            // Chunks of at least 4096 elements: 16 per thread.
            splits = target.div_ceil(blocks).min(rlen.div_ceil(4096));
        }
        let chunk = rlen.div_ceil(splits).next_multiple_of(64);
        let splits = rlen.div_ceil(chunk);
        let grid = (blocks.min(sm * 32) as u32, splits as u32, 1);
        (Cfg::new(grid, (256, 1, 1), 0), splits, chunk)
    } else {
        let (bx, by) = if nout_u >= 32 {
            let by = pow2_floor(rlen).clamp(1, 8);
            (256 / by, by)
        } else {
            let bx = nout_u.next_power_of_two();
            (bx, pow2_floor(rlen).clamp(1, 256 / bx))
        };
        let blocks = nout_u.div_ceil(bx).min(sm * 32);
        let mut splits = 1;
        if blocks < target && rlen >= by * MIN_PER_THREAD * 4 {
            splits = target
                .div_ceil(blocks)
                .min(rlen.div_ceil(by * MIN_PER_THREAD));
        }
        col_split(blocks, (bx, by), rlen, splits)
    };
    // Partial states of a split reduction: [splits, nout] values (and indices for arg ops).
    let (pv, pi) = if splits > 1 {
        let n = splits as usize * nout;
        let vdt = if acc_bytes(dt) == 8 {
            DType::F64
        } else {
            DType::F32
        };
        let pv = dev.alloc_out(n, vdt, name)?;
        let pi = if arg {
            Some(dev.alloc_out(n, DType::U32, name)?)
        } else {
            None
        };
        (Some(pv), pi)
    } else {
        (None, None)
    };
    let pv_ptr = pv.as_ref().map_or(0, |b| b.ptr());
    let pi_ptr = pi.as_ref().map_or(0, |b| b.ptr());
    if colv {
        let args = Args::new()
            .arg(nout_u)
            .arg(base + out_off)
            .arg(rlen)
            .arg(rs as u64)
            .arg(chunk)
            .arg(out.ptr())
            .arg(pv_ptr);
        dev.launch(name, &SOURCE, &kname("colv"), cfg, args)?;
    } else if row {
        let args = Args::new()
            .arg(ko)
            .arg(base)
            .arg(rlen)
            .arg(chunk)
            .arg(group as u32)
            .arg(out.ptr())
            .arg(pv_ptr)
            .arg(pi_ptr);
        dev.launch(name, &SOURCE, &kname("row"), cfg, args)?;
    } else {
        let args = Args::new()
            .arg(ko)
            .arg(base)
            .arg(rlen)
            .arg(rs as i64)
            .arg(chunk)
            .arg(out.ptr())
            .arg(pv_ptr)
            .arg(pi_ptr);
        dev.launch(name, &SOURCE, &kname("col"), cfg, args)?;
    }
    if splits > 1 {
        let threads = splits.next_power_of_two().clamp(32, 256) as u32;
        let blocks = nout_u.min(sm * 32) as u32;
        let args = Args::new()
            .arg(nout_u)
            .arg(splits)
            .arg(pv_ptr)
            .arg(pi_ptr)
            .arg(out.ptr());
        let cfg = Cfg::new((blocks, 1, 1), (threads, 1, 1), 0);
        dev.launch(name, &SOURCE, &kname("fin"), cfg, args)?;
    }
    dev.finish_one(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_stage_splits_the_innermost_run() {
        // [4, 3, 5, 7] contiguous over n, h, w: h and w merge (stride 1, then 7), n is left.
        let nhw = [(0, 4, 105), (2, 5, 7), (3, 7, 1)];
        assert_eq!(
            two_stage(ReduceOp::Sum, DType::F32, &nhw),
            Some((vec![3, 2], vec![0]))
        );
        assert_eq!(
            two_stage(ReduceOp::Max, DType::BF16, &nhw),
            Some((vec![3, 2], vec![0]))
        );
        // 16-bit sums keep one pass (their partial sums would round); axes that merge and
        // arg ops need no split.
        assert_eq!(two_stage(ReduceOp::Sum, DType::BF16, &nhw), None);
        assert_eq!(two_stage(ReduceOp::Sum, DType::F32, &nhw[1..]), None);
        assert_eq!(two_stage(ReduceOp::ArgMax, DType::F32, &nhw[..1]), None);
        // Size-1 axes do not count; a lone size-1 outer axis leaves a mergeable set.
        assert_eq!(
            two_stage(
                ReduceOp::Sum,
                DType::F32,
                &[(0, 1, 105), (2, 5, 7), (3, 7, 1)]
            ),
            None
        );
    }
}
