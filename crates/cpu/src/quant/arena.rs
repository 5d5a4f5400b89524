//! Memory for the CPU's packed weight copies ([`crate::quant::packed`]): chunks aligned to
//! 2 MiB and, on Linux, advised as transparent huge pages before they are first touched, so
//! that a product streaming a model's weights takes a TLB miss per 2 MiB rather than per
//! 4 KiB (on a 2-core Sapphire Rapids host, one 16 x 32 unit of eight rows: Q8_0 33-37 ns
//! -> 27 ns, Q4_1 26-30 -> 24 ns, streaming a 30 MB matrix). Pieces are handed out once
//! each, 64-byte aligned, and keep their chunk alive: a chunk is freed with its last piece.

use std::alloc::Layout;
use std::sync::{Arc, Mutex, OnceLock};

/// One huge page.
const HUGE: usize = 2 << 20;
/// Chunks hold at least this much (several matrices of a small model share one).
const CHUNK: usize = 32 << 20;

/// Memory freed when the last piece in it (and the arena, while it still fills it) drops.
struct Chunk {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: plain memory; each piece is written once, through the `&mut` that `Arena::alloc`
// lends its `fill`, before the piece is shared read-only.
unsafe impl Send for Chunk {}
// SAFETY: as above.
unsafe impl Sync for Chunk {}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: allocated in `Arena::alloc` with this layout; no piece refers to it now.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// A read-only piece of an arena chunk; the chunk lives while any piece of it does.
pub struct Piece {
    chunk: Arc<Chunk>,
    offset: usize,
    len: usize,
}

impl Piece {
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: [offset, offset + len) lies inside the chunk, was written before this
        // piece was made, and is never written again; the chunk lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.chunk.ptr.add(self.offset), self.len) }
    }
}

/// Hands out pieces of 2 MiB-aligned chunks, one after another; a chunk is freed when
/// every piece of it has dropped and the arena has moved on to the next.
#[derive(Default)]
pub struct Arena {
    /// The chunk being filled and the bytes of it handed out.
    current: Mutex<Option<(Arc<Chunk>, usize)>>,
}

impl Arena {
    /// The process's arena (every packed copy of the CPU's quantized matrices). Between
    /// models it holds at most one chunk that no piece uses.
    pub fn global() -> &'static Arena {
        static ARENA: OnceLock<Arena> = OnceLock::new();
        ARENA.get_or_init(Arena::default)
    }

    /// A piece of `n` bytes, zeroed, then written by `fill` (None from `fill` gives the
    /// memory back to no one: the piece is dropped); None where memory for a new chunk
    /// cannot be had.
    pub fn alloc(&self, n: usize, fill: impl FnOnce(&mut [u8]) -> bool) -> Option<Piece> {
        let n64 = n.next_multiple_of(64);
        let (chunk, offset) = {
            let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
            let fits = cur
                .as_ref()
                .is_some_and(|(c, used)| c.layout.size() - used >= n64);
            if !fits {
                let size = n64.max(CHUNK).next_multiple_of(HUGE);
                let layout = Layout::from_size_align(size, HUGE).ok()?;
                // SAFETY: size is non-zero.
                let ptr = unsafe { std::alloc::alloc(layout) };
                if ptr.is_null() {
                    return None;
                }
                // Before the first touch (below, piece by piece): the pages then fault in
                // huge where the OS can, and a chunk's untouched part takes no memory.
                advise_huge(ptr, size);
                *cur = Some((Arc::new(Chunk { ptr, layout }), 0));
            }
            let (c, used) = cur.as_mut()?;
            let offset = *used;
            *used += n64;
            (Arc::clone(c), offset)
        };
        // SAFETY: [offset, offset + n) lies inside the chunk (checked above) and was handed
        // out this once, under the lock: no other reference to it exists.
        let piece = unsafe {
            std::ptr::write_bytes(chunk.ptr.add(offset), 0, n);
            std::slice::from_raw_parts_mut(chunk.ptr.add(offset), n)
        };
        fill(piece).then_some(Piece {
            chunk,
            offset,
            len: n,
        })
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
        let mut pieces = Vec::new();
        for n in [1usize, 100, 4096, 3 << 20, 70, CHUNK] {
            let p = a
                .alloc(n, |p| {
                    assert!(p.iter().all(|&b| b == 0));
                    p.fill(0xAB);
                    true
                })
                .unwrap();
            assert_eq!(p.as_slice().len(), n);
            let at = p.as_slice().as_ptr() as usize;
            assert_eq!(at % 64, 0);
            assert!(seen.iter().all(|&(s, l)| at + n <= s || s + l <= at), "{n}");
            seen.push((at, n));
            pieces.push(p);
        }
        assert!(pieces
            .iter()
            .all(|p| p.as_slice().iter().all(|&b| b == 0xAB)));
    }

    #[test]
    fn a_chunk_lives_while_a_piece_does() {
        let a = Arena::default();
        let p = a.alloc(100, |p| {
            p.fill(7);
            true
        });
        let p = p.unwrap();
        // The next piece does not fit: the arena moves to a new chunk and lets the old go.
        let q = a.alloc(CHUNK, |_| true).unwrap();
        assert!(p.as_slice().iter().all(|&b| b == 7));
        assert_eq!(Arc::strong_count(&p.chunk), 1);
        assert_eq!(Arc::strong_count(&q.chunk), 2);
        assert!(a.alloc(10, |_| false).is_none());
    }
}
