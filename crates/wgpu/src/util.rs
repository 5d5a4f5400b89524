//! Helpers shared by the op wrappers: storages of tensors, layouts as parameter words, grids.

use crate::device::WgpuBackend;
use crate::storage::WgpuStorage;
use ferrite_core::{Error, Layout, Result, Tensor};

/// Threads per workgroup of every 1-D kernel (`WG` in common.wgsl).
pub(crate) const WG: usize = 256;

pub(crate) fn storage<'a>(t: &'a Tensor, op: &'static str) -> Result<&'a WgpuStorage> {
    WgpuStorage::of(t.storage(), op)
}

/// Workgroups covering `n` threads.
pub(crate) fn groups(n: usize) -> usize {
    n.div_ceil(WG)
}

/// An f32 parameter word.
pub(crate) fn fw(x: f64) -> u32 {
    (x as f32).to_bits()
}

/// A size or index as a parameter word; errors past u32 (which buffers cannot reach anyway).
pub(crate) fn uw(op: &'static str, x: usize) -> Result<u32> {
    u32::try_from(x).map_err(|_| Error::backend(op, format!("size {x} exceeds u32")))
}

/// `layout` as `[rank, offset, dims.., strides..]` (common.wgsl's `strided`), with size-1 dims
/// dropped and mergeable neighbours merged so the kernel divides less.
pub(crate) fn layout_words(op: &'static str, l: &Layout) -> Result<Vec<u32>> {
    let mut dims: Vec<(usize, usize)> = Vec::new();
    for (&d, &s) in l.dims().iter().zip(l.strides()) {
        if d == 1 {
            continue;
        }
        match dims.last_mut() {
            Some(last) if last.1 == s * d => {
                last.0 *= d;
                last.1 = s;
            }
            _ => dims.push((d, s)),
        }
    }
    let mut w = vec![uw(op, dims.len())?, uw(op, l.offset())?];
    for &(d, _) in &dims {
        w.push(uw(op, d)?);
    }
    for &(_, s) in &dims {
        w.push(uw(op, s)?);
    }
    Ok(w)
}

/// A tensor's elements contiguous in a buffer: its own storage (at an offset) when its layout
/// already is, else a copy.
pub(crate) enum Contig<'a> {
    Borrowed(&'a WgpuStorage, usize),
    Owned(WgpuStorage),
}

impl Contig<'_> {
    pub fn buffer(&self) -> &wgpu::Buffer {
        match self {
            Contig::Borrowed(s, _) => s.buffer(),
            Contig::Owned(s) => s.buffer(),
        }
    }

    /// Word offset of element 0.
    pub fn offset(&self) -> u32 {
        match self {
            Contig::Borrowed(_, o) => *o as u32,
            Contig::Owned(_) => 0,
        }
    }
}

pub(crate) fn contig<'a>(dev: &WgpuBackend, t: &'a Tensor, op: &'static str) -> Result<Contig<'a>> {
    let st = storage(t, op)?;
    if t.layout().is_contiguous() {
        uw(op, t.layout().offset())?;
        Ok(Contig::Borrowed(st, t.layout().offset()))
    } else {
        Ok(Contig::Owned(crate::elementwise::copy_layout(
            dev,
            st,
            t.layout(),
        )?))
    }
}
