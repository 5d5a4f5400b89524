//! Output buffers. Large ones come from a small pool of buffers that dropped tensors gave back
//! (DESIGN.md "pooled memory"), else are advised to use transparent huge pages: a fresh 64 MiB
//! output otherwise takes 16K page faults and a zeroing pass on first touch, which cost more
//! than the op itself.

use ferrite_core::{HostBuffer, WithDType};
use std::mem::MaybeUninit;
use std::sync::Mutex;

/// At most this many bytes of idle buffers are kept.
const POOL_BYTES: usize = 512 << 20;

static POOL: Mutex<Vec<HostBuffer>> = Mutex::new(Vec::new());

fn capacity_bytes(b: &HostBuffer) -> usize {
    ferrite_core::map_host!(b, v => v.capacity() * std::mem::size_of_val(v.first().unwrap_or(&Default::default())))
}

/// Offers a dropped storage's buffer to the pool (large buffers only, up to `POOL_BYTES`).
pub(crate) fn recycle(mut b: HostBuffer) {
    let bytes = capacity_bytes(&b);
    if bytes < HUGE_MIN {
        return;
    }
    ferrite_core::map_host!(&mut b, v => v.clear());
    if let Ok(mut pool) = POOL.lock() {
        let held: usize = pool.iter().map(capacity_bytes).sum();
        if held + bytes <= POOL_BYTES {
            pool.push(b);
        }
    }
}

/// A pooled, empty vector of `T` with capacity in [n, 2n], if one is idle.
fn take<T: WithDType>(n: usize) -> Option<Vec<T>> {
    let mut pool = POOL.lock().ok()?;
    let i = pool.iter().position(|b| {
        b.dtype() == T::DTYPE
            && ferrite_core::map_host!(b, v => v.capacity() >= n && v.capacity() <= 2 * n)
    })?;
    T::take_vec(pool.swap_remove(i))
}

/// Buffers at least this large get `MADV_HUGEPAGE`.
const HUGE_MIN: usize = 4 << 20;

#[cfg(target_os = "linux")]
fn advise_huge(ptr: *mut u8, bytes: usize) {
    const PAGE: usize = 2 << 20;
    let start = (ptr as usize).next_multiple_of(PAGE);
    let end = (ptr as usize + bytes) / PAGE * PAGE;
    if end > start {
        // SAFETY: [start, end) lies inside an allocation we own and have not initialized;
        // madvise only changes how the kernel backs those pages. A failure is harmless.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_ptr: *mut u8, _bytes: usize) {}

/// A vector of `n` elements, every one written by `init` (which must write all of them: it
/// receives exactly `n` slots).
pub(crate) fn filled<T: WithDType>(n: usize, init: impl FnOnce(&mut [MaybeUninit<T>])) -> Vec<T> {
    let bytes = n * std::mem::size_of::<T>();
    let mut v: Vec<T> = match bytes >= HUGE_MIN {
        true => take(n).unwrap_or_else(|| {
            let mut v = Vec::with_capacity(n);
            advise_huge(v.as_mut_ptr() as *mut u8, bytes);
            v
        }),
        false => Vec::with_capacity(n),
    };
    init(&mut v.spare_capacity_mut()[..n]);
    // SAFETY: `init` was given exactly the first `n` slots and, by this function's contract,
    // wrote each of them; `T: Copy` has no drop obligations.
    unsafe { v.set_len(n) };
    v
}
