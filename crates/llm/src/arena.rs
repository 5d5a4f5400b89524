//! Memory for the CPU's packed weight copies ([`crate::kernels::packed`]): chunks aligned to
//! 2 MiB and, on Linux, advised as transparent huge pages before they are first touched, so
//! that a product streaming a model's weights takes a TLB miss per 2 MiB rather than per
//! 4 KiB (on a 2-core Sapphire Rapids host, one 16 x 32 unit of eight rows: Q8_0 33-37 ns
//! -> 27 ns, Q4_1 26-30 -> 24 ns, streaming a 30 MB matrix). Pieces are handed out once
//! each, 64-byte aligned, and live as long as the arena; nothing is freed before it drops.

use std::alloc::Layout;
use std::sync::Mutex;

/// One huge page.
const HUGE: usize = 2 << 20;
/// Chunks hold at least this much (several matrices of a small model share one).
const CHUNK: usize = 32 << 20;

struct Chunk {
    ptr: *mut u8,
    layout: Layout,
    used: usize,
}

#[derive(Default)]
pub struct Arena {
    chunks: Mutex<Vec<Chunk>>,
}

// SAFETY: the chunks are plain memory owned by the arena; each piece is handed out once
// (under the lock) and written only through that `&mut` before it is shared read-only.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Arena {
    /// A zeroed piece of `n` bytes that lives as long as the arena; None where memory for a
    /// new chunk cannot be had.
    #[allow(clippy::mut_from_ref)]
    pub fn alloc(&self, n: usize) -> Option<&mut [u8]> {
        let n64 = n.next_multiple_of(64);
        let mut chunks = self.chunks.lock().unwrap_or_else(|e| e.into_inner());
        let fits = chunks
            .last()
            .is_some_and(|c| c.layout.size() - c.used >= n64);
        if !fits {
            let size = n64.max(CHUNK).next_multiple_of(HUGE);
            let layout = Layout::from_size_align(size, HUGE).ok()?;
            // SAFETY: size is non-zero.
            let ptr = unsafe { std::alloc::alloc(layout) };
            if ptr.is_null() {
                return None;
            }
            // Before the first touch (below, piece by piece): the pages then fault in huge
            // where the OS can, and a chunk's untouched part takes no memory.
            advise_huge(ptr, size);
            chunks.push(Chunk {
                ptr,
                layout,
                used: 0,
            });
        }
        let c = chunks.last_mut()?;
        // SAFETY: [used, used + n) lies inside the chunk (checked above) and is handed out
        // this once, zeroed; the chunk lives until the arena drops.
        let piece = unsafe {
            std::ptr::write_bytes(c.ptr.add(c.used), 0, n);
            std::slice::from_raw_parts_mut(c.ptr.add(c.used), n)
        };
        c.used += n64;
        Some(piece)
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let chunks = self.chunks.get_mut().unwrap_or_else(|e| e.into_inner());
        for c in chunks.drain(..) {
            // SAFETY: allocated in `alloc` with this layout.
            unsafe { std::alloc::dealloc(c.ptr, c.layout) };
        }
    }
}

#[cfg(target_os = "linux")]
fn advise_huge(ptr: *mut u8, size: usize) {
    // SAFETY: the range is the chunk just allocated, 2 MiB aligned; advice never faults and
    // its failure (no transparent huge pages) leaves ordinary pages.
    unsafe { libc::madvise(ptr as *mut libc::c_void, size, libc::MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_: *mut u8, _: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_zeroed_aligned_and_disjoint() {
        let a = Arena::default();
        let mut seen: Vec<(usize, usize)> = Vec::new();
        for n in [1usize, 100, 4096, 3 << 20, 70, CHUNK] {
            let p = a.alloc(n).unwrap();
            assert_eq!(p.len(), n);
            assert!(p.iter().all(|&b| b == 0));
            let at = p.as_ptr() as usize;
            assert_eq!(at % 64, 0);
            assert!(seen.iter().all(|&(s, l)| at + n <= s || s + l <= at), "{n}");
            p.fill(0xAB);
            seen.push((at, n));
        }
    }
}
