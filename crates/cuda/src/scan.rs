//! Ops along one axis on CUDA (kernels in scan.cu): cumsum and sort, over any layout.
//!
//! Rows along the axis are walked by an `Idx` over the shape without the axis (input strides
//! and the contiguous output's strides), so no input is copied.
//! - cumsum: a thread per (chunk, row) when the axis is not innermost (consecutive rows are
//!   then consecutive in memory) or rows are many and short; else a block per (row, chunk)
//!   (warp-shuffle scan of 4 * blockDim.x-element steps carrying the running total). With
//!   several chunks a row, a first pass writes chunk totals and the scan starts each chunk
//!   from the sum of those before it (thread mode: scanned by a carry pass).
//! - sort: rows whose (key, index) composites fit `TILE_BYTES` (4096 elements; 2048 for
//!   64-bit dtypes) are bitonic-sorted in shared memory, a block per row. Longer rows: tiles
//!   of that size sorted in shared memory, then global merge passes (each element finds its
//!   place by binary search in the partner run), then a gather of values.

use crate::device::CudaBackend;
use crate::elementwise::grid;
use crate::kernels::{suffix, Args, Cfg, Idx, KernelSource};
use ferrite_core::{DType, Error, Result, Shape, Storage, Tensor};
use std::sync::Arc;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "scan",
    src: include_str!("scan.cu"),
    prebuilt: crate::prebuilt::SCAN,
};

/// Bytes of shared memory for one sorting tile of composites.
const TILE_BYTES: usize = 32 << 10;

/// The row walk of `x` along `axis`: an `Idx` over the other dims (operand 0 the input,
/// operand 1 a contiguous output of x's shape), the input's axis stride and the output's.
fn rows_along(op: &'static str, x: &Tensor, axis: usize) -> Result<(Idx, i64, i64)> {
    let dims = x.dims();
    let st = x.layout().strides();
    let ost = Shape::new(dims).contiguous_strides();
    let other = |v: &[usize]| -> Vec<usize> {
        v.iter()
            .enumerate()
            .filter(|&(k, _)| k != axis)
            .map(|(_, &s)| s)
            .collect()
    };
    let (od, ox, oy) = (other(dims), other(st), other(&ost));
    let rw = Idx::new(op, &od, &[(&ox, x.layout().offset()), (&oy, 0)])?;
    Ok((rw, st[axis] as i64, ost[axis] as i64))
}

pub(crate) fn cumsum(dev: &CudaBackend, x: &Tensor, axis: usize) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "cumsum";
    let dt = x.dtype();
    if dt == DType::Bool {
        return Err(Error::dtype(op, dt, "needs a numeric dtype"));
    }
    if axis >= x.rank() {
        return Err(Error::backend(op, format!("axis {axis} of {}", x.shape())));
    }
    let s = dev.input(x, op)?;
    let n = x.elem_count();
    let out = dev.alloc_out(n, dt, op)?;
    if n == 0 {
        return dev.finish_one(out);
    }
    let len = x.dims()[axis] as u64;
    let inner: usize = x.dims()[axis + 1..].iter().product();
    let (rw, sx, sy) = rows_along(op, x, axis)?;
    let rows = rw.n;
    let sm = dev.sm_count.max(1) as u64;
    let sfx = suffix(dt);
    // Accumulator words of the chunk totals (`SumA<T>::A` in scan.cu).
    let tot_dt = if dt.size_in_bytes() == 8 {
        DType::F64
    } else {
        DType::F32
    };
    if inner > 1 || (rows >= sm * 128 && len <= 16) {
        // A thread per (chunk, row): chunks along the axis until about 4096 threads per SM,
        // at most 8192 (the carry pass scans them with one block per row).
        let want = (sm * 4096).div_ceil(rows).min(len / 16).clamp(1, 8192);
        let chunk = len.div_ceil(want);
        let splits = len.div_ceil(chunk);
        let cfg = grid(dev, rows * splits, 1);
        let tot = if splits > 1 {
            Some(dev.alloc_out((splits * rows) as usize, tot_dt, op)?)
        } else {
            None
        };
        let tot_ptr = tot.as_ref().map_or(0, |t| t.ptr());
        if splits > 1 {
            let args = Args::new()
                .arg(rw)
                .arg(s.device_ptr())
                .arg(len)
                .arg(sx)
                .arg(chunk)
                .arg(splits)
                .arg(tot_ptr);
            dev.launch(op, &SOURCE, &format!("cumsum_tot_seq_{sfx}"), cfg, args)?;
            let acc = match dt {
                DType::F64 => "f64",
                DType::I64 => "u64",
                DType::I32 | DType::U32 | DType::U8 => "u32",
                _ => "f32",
            };
            let threads = splits.next_multiple_of(32).min(1024) as u32;
            let cfg2 = Cfg::new((rows.min(sm * 32) as u32, 1, 1), (threads, 1, 1), 0);
            let args = Args::new().arg(tot_ptr).arg(rows).arg(splits);
            dev.launch(op, &SOURCE, &format!("cumsum_carry_{acc}"), cfg2, args)?;
        }
        let args = Args::new()
            .arg(rw)
            .arg(s.device_ptr())
            .arg(out.ptr())
            .arg(len)
            .arg(sx)
            .arg(sy)
            .arg(chunk)
            .arg(splits)
            .arg(tot_ptr);
        dev.launch(op, &SOURCE, &format!("cumsum_seq_{sfx}"), cfg, args)?;
    } else {
        // A block per (row, chunk); chunks when rows are too few to fill the device. Each
        // thread scans 4 elements a step (`SCAN_K` in scan.cu).
        let threads = len.div_ceil(4).next_multiple_of(32).min(256);
        let mut want = 1;
        if rows < sm * 8 && len >= 8192 {
            want = (sm * 8).div_ceil(rows).min(len / 4096);
        }
        let chunk = len.div_ceil(want).next_multiple_of(threads * 4);
        let splits = len.div_ceil(chunk);
        let cfg = Cfg::new(
            ((rows * splits).min(sm * 32) as u32, 1, 1),
            (threads as u32, 1, 1),
            0,
        );
        let tot = if splits > 1 {
            Some(dev.alloc_out((splits * rows) as usize, tot_dt, op)?)
        } else {
            None
        };
        let tot_ptr = tot.as_ref().map_or(0, |t| t.ptr());
        if splits > 1 {
            let args = Args::new()
                .arg(rw)
                .arg(s.device_ptr())
                .arg(len)
                .arg(sx)
                .arg(chunk)
                .arg(splits)
                .arg(tot_ptr);
            dev.launch(op, &SOURCE, &format!("cumsum_tot_block_{sfx}"), cfg, args)?;
        }
        let args = Args::new()
            .arg(rw)
            .arg(s.device_ptr())
            .arg(out.ptr())
            .arg(len)
            .arg(sx)
            .arg(sy)
            .arg(chunk)
            .arg(splits)
            .arg(tot_ptr);
        dev.launch(op, &SOURCE, &format!("cumsum_block_{sfx}"), cfg, args)?;
    }
    dev.finish_one(out)
}

pub(crate) fn sort(
    dev: &CudaBackend,
    x: &Tensor,
    axis: usize,
    descending: bool,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "sort";
    let dt = x.dtype();
    if axis >= x.rank() {
        return Err(Error::backend(op, format!("axis {axis} of {}", x.shape())));
    }
    let len = x.dims()[axis];
    if len > u32::MAX as usize {
        return Err(Error::shape(
            op,
            format!("axis of {len} elements exceeds u32 indices"),
        ));
    }
    let s = dev.input(x, op)?;
    let n = x.elem_count();
    let vals = dev.alloc_out(n, dt, op)?;
    let idx = dev.alloc_out(n, DType::U32, op)?;
    if n == 0 {
        return dev.finish(vec![vals, idx]);
    }
    let (rw, sx, sy) = rows_along(op, x, axis)?;
    let rows = rw.n;
    let len = len as u64;
    let sm = dev.sm_count.max(1) as u64;
    // Composite (key, index) size: scan.cu's `Comp<T>::C`.
    let csize = if dt.size_in_bytes() == 8 { 16 } else { 8 };
    let small = (TILE_BYTES / csize) as u64;
    let desc = descending as u32;
    let sfx = suffix(dt);
    if len <= small {
        let n2 = len.next_power_of_two().max(2);
        let threads = (n2 / 2).clamp(32, 1024) as u32;
        let cfg = Cfg::new(
            (rows.min(sm * 32) as u32, 1, 1),
            (threads, 1, 1),
            (n2 as usize * csize) as u32,
        );
        let args = Args::new()
            .arg(rw)
            .arg(s.device_ptr())
            .arg(len as u32)
            .arg(sx)
            .arg(sy)
            .arg(n2 as u32)
            .arg(desc)
            .arg(vals.ptr())
            .arg(idx.ptr());
        dev.launch(op, &SOURCE, &format!("sort_small_{sfx}"), cfg, args)?;
        return dev.finish(vec![vals, idx]);
    }
    // Two buffers of rows * len composites (as f64 words), merged back and forth.
    let words = n * csize / 8;
    let mut src = dev.alloc_out(words, DType::F64, op)?;
    let mut dst = dev.alloc_out(words, DType::F64, op)?;
    let tiles = rows * len.div_ceil(small);
    let cfg = Cfg::new(
        (tiles.min(sm * 32) as u32, 1, 1),
        (1024, 1, 1),
        TILE_BYTES as u32,
    );
    let args = Args::new()
        .arg(rw)
        .arg(s.device_ptr())
        .arg(len)
        .arg(sx)
        .arg(small as u32)
        .arg(desc)
        .arg(src.ptr());
    dev.launch(op, &SOURCE, &format!("sort_tiles_{sfx}"), cfg, args)?;
    let merge = if csize == 8 {
        "sort_merge_c8"
    } else {
        "sort_merge_c16"
    };
    let mut w = small;
    while w < len {
        let args = Args::new()
            .arg(src.ptr())
            .arg(dst.ptr())
            .arg(rows)
            .arg(len)
            .arg(w);
        dev.launch(op, &SOURCE, merge, grid(dev, rows * len, 1), args)?;
        std::mem::swap(&mut src, &mut dst);
        w *= 2;
    }
    let args = Args::new()
        .arg(rw)
        .arg(s.device_ptr())
        .arg(len)
        .arg(sx)
        .arg(sy)
        .arg(src.ptr())
        .arg(vals.ptr())
        .arg(idx.ptr());
    dev.launch(
        op,
        &SOURCE,
        &format!("sort_out_{sfx}"),
        grid(dev, rows * len, 1),
        args,
    )?;
    dev.finish(vec![vals, idx])
}
