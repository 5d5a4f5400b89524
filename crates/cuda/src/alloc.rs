//! The caching device allocator.
//!
//! Requests round up to 512 bytes. Small ones (≤ 1 MiB) are carved from 2 MiB segments; large
//! ones from segments rounded up to 2 MiB. Free blocks are kept per pool in a set ordered by
//! (size, address); a request takes the best fit and splits off the rest when the rest is big
//! enough to be useful (512 B small, 1 MiB large). A freed block merges with free neighbours of
//! its segment.
//!
//! Reuse is stream-ordered: every op runs on the device's compute stream, so a block freed while
//! kernels that read it are still queued can be handed to the next op at once: that op is
//! queued behind them. Storages last touched on another stream make the compute stream wait on
//! their event before their block returns here (see `storage.rs`).
//!
//! Out of memory: the cache is emptied (after the compute stream drains) and the allocation
//! retried once; a second failure is an error carrying the counters.
//!
//! During a CUDA graph capture every block handed out is the graph's: its kernels use the
//! address on every replay, so the graph keeps the block out of the cache until it is dropped;
//! so is every older block a captured kernel reads (`hold`), whether or not its tensor
//! outlives the capture. A tensor's handle on such a block that drops while the capture is
//! still recording returns the block to that capture's own free list, merged with free
//! neighbours there, and a later request of the same capture may take it, the best fit, split
//! as the cache splits (stream order holds inside the graph as it does on the stream): a
//! captured step needs about the memory of its eager run, not the sum of everything it
//! allocates.

use crate::driver::Check;
use cudarc::driver::{result as dr, sys};
use ferrite_core::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

const ROUND: usize = 512;
const SMALL_MAX: usize = 1 << 20;
const SMALL_SEGMENT: usize = 2 << 20;
const LARGE_ROUND: usize = 2 << 20;

/// Allocator counters, in bytes unless named otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes in blocks held by live storages (rounded sizes).
    pub in_use: usize,
    /// Bytes obtained from the driver and not yet returned (in use + cached).
    pub reserved: usize,
    /// Highest `in_use` since the last `reset_peak`.
    pub peak_in_use: usize,
    /// Number of `cuMemAlloc` calls that succeeded.
    pub device_allocs: usize,
    /// Number of segments returned with `cuMemFree`.
    pub device_frees: usize,
    /// Requests served from the cache.
    pub cache_hits: usize,
}

impl std::fmt::Display for MemoryStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "in use {} B, reserved {} B, peak {} B, {} device allocations",
            self.in_use, self.reserved, self.peak_in_use, self.device_allocs
        )
    }
}

#[derive(Clone, Copy)]
struct Meta {
    size: usize,
    free: bool,
    small: bool,
    prev: Option<u64>,
    next: Option<u64>,
}

#[derive(Default)]
struct Pool {
    free_small: BTreeSet<(usize, u64)>,
    free_large: BTreeSet<(usize, u64)>,
    blocks: HashMap<u64, Meta>,
    segments: HashMap<u64, usize>,
    stats: MemoryStats,
    /// Set while a CUDA graph is captured.
    capture: Option<Capture>,
    /// Captures begun so far (names a capture in the handles it lends).
    captures: u64,
}

/// The blocks of the capture being recorded.
struct Capture {
    id: u64,
    /// Every block the capture took from the cache, by address; the graph keeps them.
    keep: HashMap<u64, Arc<Block>>,
    /// Blocks of `keep` whose handle dropped during the capture, by (size, address).
    free: BTreeMap<(usize, u64), Arc<Block>>,
    /// Blocks from before the capture that its kernels read, by address.
    held: HashMap<u64, Arc<Block>>,
}

impl Pool {
    fn free_set(&mut self, small: bool) -> &mut BTreeSet<(usize, u64)> {
        if small {
            &mut self.free_small
        } else {
            &mut self.free_large
        }
    }

    /// A new segment of `size` bytes at `base`, one free block.
    fn add_segment(&mut self, base: u64, size: usize, small: bool) {
        self.segments.insert(base, size);
        self.stats.reserved += size;
        self.stats.device_allocs += 1;
        self.blocks.insert(
            base,
            Meta {
                size,
                free: true,
                small,
                prev: None,
                next: None,
            },
        );
        self.free_set(small).insert((size, base));
    }

    /// Cuts the block at `ptr` after its first `size` bytes when the rest is as large as the
    /// cache splits off (512 B small, 1 MiB large): the rest becomes a block of its own, free
    /// or in use as the block was (no free set is touched). Returns its address.
    fn split(&mut self, ptr: u64, size: usize) -> Option<u64> {
        let m = *self.blocks.get(&ptr)?;
        let rest = m.size.checked_sub(size)?;
        if rest < if m.small { ROUND } else { SMALL_MAX } {
            return None;
        }
        let tail = ptr + size as u64;
        if let Some(x) = m.next.and_then(|n| self.blocks.get_mut(&n)) {
            x.prev = Some(tail);
        }
        self.blocks.insert(
            tail,
            Meta {
                size: rest,
                prev: Some(ptr),
                ..m
            },
        );
        self.blocks.insert(
            ptr,
            Meta {
                size,
                next: Some(tail),
                ..m
            },
        );
        Some(tail)
    }

    /// Joins the block after `lo` into `lo` (range and links; `lo` keeps its state). The
    /// caller has taken both off whatever free list held them.
    fn absorb_next(&mut self, lo: u64) {
        let Some(hi) = self.blocks.get(&lo).and_then(|m| m.next) else {
            return;
        };
        let Some(hm) = self.blocks.remove(&hi) else {
            return;
        };
        if let Some(x) = hm.next.and_then(|n| self.blocks.get_mut(&n)) {
            x.prev = Some(lo);
        }
        if let Some(m) = self.blocks.get_mut(&lo) {
            m.size += hm.size;
            m.next = hm.next;
        }
    }

    /// Returns the block at `ptr` to the cache, merged with free neighbours.
    fn release(&mut self, ptr: u64) {
        let Some(m) = self.blocks.get(&ptr).copied() else {
            return;
        };
        self.stats.in_use -= m.size;
        let free_at = |p: &Pool, at: Option<u64>| {
            let a = at?;
            p.blocks
                .get(&a)
                .filter(|x| x.free)
                .map(|x| (a, x.size, x.small))
        };
        // Merge with a free next block, then with a free previous block.
        if let Some((n, size, small)) = free_at(self, m.next) {
            self.free_set(small).remove(&(size, n));
            self.absorb_next(ptr);
        }
        let mut start = ptr;
        if let Some((pv, size, small)) = free_at(self, m.prev) {
            self.free_set(small).remove(&(size, pv));
            self.absorb_next(pv);
            start = pv;
        }
        let Some(b) = self.blocks.get_mut(&start) else {
            return;
        };
        b.free = true;
        let (size, small) = (b.size, b.small);
        self.free_set(small).insert((size, start));
    }
}

pub(crate) struct Allocator {
    pool: Mutex<Pool>,
    /// The compute stream, drained before segments are returned to the driver.
    stream: sys::CUstream,
    pub ordinal: usize,
    /// Test hook: fail device allocations above this many reserved bytes.
    limit: Mutex<Option<usize>>,
}

unsafe impl Send for Allocator {}
unsafe impl Sync for Allocator {}

/// A device block; returns to the allocator's cache when dropped. A block handed out during
/// a capture is a handle lending the capture's own block (`lent`: it and the capture's id).
pub struct Block {
    pub ptr: u64,
    alloc: Option<Arc<Allocator>>,
    lent: Option<(Arc<Block>, u64)>,
}

impl Drop for Block {
    fn drop(&mut self) {
        let Some(a) = &self.alloc else { return };
        match self.lent.take() {
            Some((block, id)) => a.give_back(block, id),
            None => a.release(self.ptr),
        }
    }
}

impl Allocator {
    pub fn new(stream: sys::CUstream, ordinal: usize) -> Allocator {
        Allocator {
            pool: Mutex::new(Pool::default()),
            stream,
            ordinal,
            limit: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn stats(&self) -> MemoryStats {
        self.lock().stats
    }

    pub fn reset_peak(&self) {
        let mut p = self.lock();
        p.stats.peak_in_use = p.stats.in_use;
    }

    pub fn set_limit(&self, bytes: Option<usize>) {
        *self.limit.lock().unwrap_or_else(|p| p.into_inner()) = bytes;
    }

    pub fn begin_capture(&self) {
        let mut p = self.lock();
        p.captures += 1;
        p.capture = Some(Capture {
            id: p.captures,
            keep: HashMap::new(),
            free: BTreeMap::new(),
            held: HashMap::new(),
        });
    }

    /// Ends the capture; its blocks and those it read, for the graph to keep.
    pub fn end_capture(&self) -> Vec<Arc<Block>> {
        let c = self.lock().capture.take();
        c.map(|c| c.keep.into_values().chain(c.held.into_values()).collect())
            .unwrap_or_default()
    }

    /// A kernel being captured reads `block`: the graph keeps it (blocks the capture handed
    /// out are kept already).
    pub fn hold(&self, block: &Arc<Block>) {
        let mut p = self.lock();
        let Some(c) = p.capture.as_mut() else { return };
        if block.ptr == 0 || block.lent.as_ref().is_some_and(|(_, id)| *id == c.id) {
            return;
        }
        c.held.entry(block.ptr).or_insert_with(|| block.clone());
    }

    /// A handle on capture `id`'s `block` dropped: while that capture records, the block may
    /// serve one of its later requests; after, the graph alone holds it.
    fn give_back(&self, block: Arc<Block>, id: u64) {
        let mut p = self.lock();
        if p.capture.as_ref().is_none_or(|c| c.id != id) {
            drop(p);
            drop(block);
            return;
        }
        let (mut at, mut b) = (block.ptr, block);
        // Merge with free neighbours on the capture's free list: the next, then the previous.
        let next = p.blocks.get(&at).and_then(|m| m.next);
        if let Some(n) = next {
            if let Some(nb) = take_capture_free(&mut p, n) {
                if let Err(nb) = join(&mut p, at, nb) {
                    file_capture_free(&mut p, nb);
                }
            }
        }
        let prev = p.blocks.get(&at).and_then(|m| m.prev);
        if let Some(pv) = prev {
            if let Some(pb) = take_capture_free(&mut p, pv) {
                match join(&mut p, pv, b) {
                    Ok(()) => (b, at) = (pb, pv),
                    Err(back) => {
                        file_capture_free(&mut p, pb);
                        b = back;
                    }
                }
            }
        }
        debug_assert_eq!(b.ptr, at);
        file_capture_free(&mut p, b);
    }

    /// During a capture, a handle on the best-fitting of its freed blocks; a remainder as
    /// large as the cache would split off becomes a block of its own (the graph keeps it
    /// too, in use until the graph drops) on the capture's free list.
    fn reuse_in_capture(self: &Arc<Self>, p: &mut Pool, size: usize) -> Option<Block> {
        let c = p.capture.as_ref()?;
        let (&(bsize, ptr), _) = c.free.range((size, 0)..).next()?;
        if let Some(tail) = p.split(ptr, size) {
            let piece = Arc::new(Block {
                ptr: tail,
                alloc: Some(self.clone()),
                lent: None,
            });
            let c = p.capture.as_mut()?;
            c.keep.insert(tail, piece.clone());
            c.free.insert((bsize - size, tail), piece);
        }
        let c = p.capture.as_mut()?;
        let block = c.free.remove(&(bsize, ptr))?;
        p.stats.cache_hits += 1;
        Some(Block {
            ptr,
            alloc: Some(self.clone()),
            lent: Some((block, c.id)),
        })
    }

    /// A block of at least `bytes` bytes for `op`.
    pub fn alloc(self: &Arc<Self>, bytes: usize, op: &'static str) -> Result<Arc<Block>> {
        if bytes == 0 {
            return Ok(Arc::new(Block {
                ptr: 0,
                alloc: None,
                lent: None,
            }));
        }
        let size = bytes.div_ceil(ROUND) * ROUND;
        let small = size <= SMALL_MAX;
        let ptr = {
            let mut p = self.lock();
            if let Some(b) = self.reuse_in_capture(&mut p, size) {
                return Ok(Arc::new(b));
            }
            match take_fit(&mut p, size, small) {
                Some(ptr) => {
                    p.stats.cache_hits += 1;
                    ptr
                }
                None => {
                    drop(p);
                    let seg = if small {
                        SMALL_SEGMENT
                    } else {
                        size.div_ceil(LARGE_ROUND) * LARGE_ROUND
                    };
                    let base = match self.device_alloc(seg) {
                        Ok(b) => b,
                        Err(_) => {
                            self.empty_cache()?;
                            self.device_alloc(seg).map_err(|e| {
                                Error::backend(
                                    op,
                                    format!(
                                        "out of memory on cuda:{} allocating {bytes} bytes ({e}; {})",
                                        self.ordinal,
                                        self.stats()
                                    ),
                                )
                            })?
                        }
                    };
                    let mut p = self.lock();
                    p.add_segment(base, seg, small);
                    take_fit(&mut p, size, small).ok_or_else(|| {
                        Error::backend(op, "allocator: a new segment did not fit its request")
                    })?
                }
            }
        };
        let mut p = self.lock();
        let got = p.blocks.get(&ptr).map(|m| m.size).unwrap_or(size);
        p.stats.in_use += got;
        p.stats.peak_in_use = p.stats.peak_in_use.max(p.stats.in_use);
        let block = Arc::new(Block {
            ptr,
            alloc: Some(self.clone()),
            lent: None,
        });
        match p.capture.as_mut() {
            Some(c) => {
                c.keep.insert(ptr, block.clone());
                Ok(Arc::new(Block {
                    ptr,
                    alloc: Some(self.clone()),
                    lent: Some((block, c.id)),
                }))
            }
            None => Ok(block),
        }
    }

    fn device_alloc(&self, bytes: usize) -> std::result::Result<u64, String> {
        let limit = *self.limit.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = limit {
            if self.lock().stats.reserved + bytes > l {
                return Err("CUDA_ERROR_OUT_OF_MEMORY (allocator limit)".into());
            }
        }
        // SAFETY: plain device allocation in the current context.
        unsafe { dr::malloc_sync(bytes) }.map_err(|e| {
            e.error_name()
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_else(|_| format!("{:?}", e.0))
        })
    }

    fn release(&self, ptr: u64) {
        self.lock().release(ptr);
    }

    /// Returns every wholly free segment to the driver, after the compute stream drains.
    pub fn empty_cache(&self) -> Result<()> {
        // SAFETY: the stream belongs to this device.
        unsafe { dr::stream::synchronize(self.stream) }.op("empty_cache")?;
        let mut p = self.lock();
        let whole: Vec<(u64, usize)> = p
            .segments
            .iter()
            .filter(|(base, size)| {
                p.blocks
                    .get(base)
                    .is_some_and(|m| m.free && m.size == **size)
            })
            .map(|(b, s)| (*b, *s))
            .collect();
        for (base, size) in whole {
            let small = p.blocks.get(&base).is_some_and(|m| m.small);
            p.free_set(small).remove(&(size, base));
            p.blocks.remove(&base);
            p.segments.remove(&base);
            p.stats.reserved -= size;
            p.stats.device_frees += 1;
            // SAFETY: the segment came from cuMemAlloc and no block of it is in use.
            unsafe { dr::free_sync(base) }.op("empty_cache")?;
        }
        Ok(())
    }
}

/// Removes the capture's free block at `at` from its free list, if it is there.
fn take_capture_free(p: &mut Pool, at: u64) -> Option<Arc<Block>> {
    let size = p.blocks.get(&at)?.size;
    p.capture.as_mut()?.free.remove(&(size, at))
}

/// Puts a free block of the capture on its free list, filed under its current size.
fn file_capture_free(p: &mut Pool, b: Arc<Block>) {
    let size = p.blocks.get(&b.ptr).map_or(0, |m| m.size);
    if let Some(c) = p.capture.as_mut() {
        c.free.insert((size, b.ptr), b);
    }
}

/// Joins `hi` (a free block of the capture, taken off its free list) onto its neighbour
/// below at `lo` (also the capture's, free): `lo`'s range grows over `hi`'s, and `hi`'s
/// handle leaves the graph without returning its range to the cache. Gives `hi` back when
/// something else still holds it.
fn join(p: &mut Pool, lo: u64, hi: Arc<Block>) -> std::result::Result<(), Arc<Block>> {
    let at = hi.ptr;
    let Some(c) = p.capture.as_mut() else {
        return Err(hi);
    };
    if p.blocks.get(&lo).and_then(|m| m.next) != Some(at) {
        return Err(hi);
    }
    drop(c.keep.remove(&at));
    match Arc::try_unwrap(hi) {
        Ok(mut b) => b.alloc = None,
        Err(hi) => {
            c.keep.insert(at, hi.clone());
            return Err(hi);
        }
    }
    p.absorb_next(lo);
    Ok(())
}

/// Takes the best-fitting free block of at least `size` bytes, splitting off the remainder.
fn take_fit(p: &mut Pool, size: usize, small: bool) -> Option<u64> {
    let &(bsize, ptr) = p.free_set(small).range((size, 0)..).next()?;
    p.free_set(small).remove(&(bsize, ptr));
    if let Some(tail) = p.split(ptr, size) {
        p.free_set(small).insert((bsize - size, tail));
    }
    p.blocks.get_mut(&ptr)?.free = false;
    Some(ptr)
}

#[cfg(test)]
mod tests {
    //! The bookkeeping alone, on a made-up segment (no device is touched: every request
    //! fits the segment, and nothing is returned to the driver).
    use super::*;

    const MIB: usize = 1 << 20;
    const BASE: u64 = 1 << 40;

    fn allocator(segment: usize) -> Arc<Allocator> {
        let a = Arc::new(Allocator::new(std::ptr::null_mut(), 0));
        a.lock().add_segment(BASE, segment, false);
        a
    }

    /// (address, size, free) of every block, in address order.
    fn blocks(a: &Allocator) -> Vec<(u64, usize, bool)> {
        let p = a.lock();
        let mut v: Vec<_> = p
            .blocks
            .iter()
            .map(|(&at, m)| (at, m.size, m.free))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn the_cache_splits_and_merges() {
        let a = allocator(8 * MIB);
        let x = a.alloc(2 * MIB, "t").unwrap();
        let y = a.alloc(2 * MIB, "t").unwrap();
        assert_eq!((x.ptr, y.ptr), (BASE, BASE + 2 * MIB as u64));
        assert_eq!(
            blocks(&a),
            [
                (BASE, 2 * MIB, false),
                (BASE + 2 * MIB as u64, 2 * MIB, false),
                (BASE + 4 * MIB as u64, 4 * MIB, true)
            ]
        );
        // A remainder under 1 MiB stays with a large block.
        let z = a.alloc(3 * MIB + 512 * 1024, "t").unwrap();
        assert_eq!(blocks(&a)[2], (BASE + 4 * MIB as u64, 4 * MIB, false));
        drop((x, z));
        assert_eq!(a.stats().in_use, 2 * MIB);
        // y's release joins both free neighbours: one free block, the whole segment.
        drop(y);
        assert_eq!(blocks(&a), [(BASE, 8 * MIB, true)]);
        assert_eq!(
            a.lock().free_large.iter().collect::<Vec<_>>(),
            [&(8 * MIB, BASE)]
        );
        assert_eq!(a.stats().in_use, 0);
    }

    #[test]
    fn a_capture_splits_and_merges_its_freed_blocks() {
        let a = allocator(64 * MIB);
        a.begin_capture();
        drop(a.alloc(64 * MIB, "t").unwrap());
        // The freed 64 MiB serve two 16-MiB requests, split.
        let x = a.alloc(16 * MIB, "t").unwrap();
        let y = a.alloc(16 * MIB, "t").unwrap();
        assert_eq!((x.ptr, y.ptr), (BASE, BASE + 16 * MIB as u64));
        assert_eq!(a.stats().in_use, 64 * MIB);
        // Given back, they merge with the free rest into the whole block again, which serves
        // a request of its full size.
        drop((x, y));
        let free: Vec<_> = a
            .lock()
            .capture
            .as_ref()
            .unwrap()
            .free
            .keys()
            .copied()
            .collect();
        assert_eq!(free, [(64 * MIB, BASE)]);
        let w = a.alloc(64 * MIB, "t").unwrap();
        assert_eq!(w.ptr, BASE);
        drop(w);
        // The graph keeps one block (the pieces were joined back); dropping it returns the
        // segment to the cache whole.
        let kept = a.end_capture();
        assert_eq!(kept.len(), 1);
        assert_eq!(blocks(&a), [(BASE, 64 * MIB, false)]);
        drop(kept);
        assert_eq!(blocks(&a), [(BASE, 64 * MIB, true)]);
        assert_eq!(a.stats().in_use, 0);
    }
}
