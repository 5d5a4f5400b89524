//! Output buffers. Buffers of dropped storages (from 256 bytes up) go to a pool keyed by dtype and
//! capacity, and an op that needs the same size takes one back (DESIGN.md "pooled memory"):
//! training and decode loops allocate the same shapes every step, and a fresh buffer costs
//! page faults and a zeroing pass on first touch, which for a fast op cost more than the op.
//! Fresh buffers from 4 MiB up are advised to use transparent huge pages.

use ferrite_core::{DType, HostBuffer, WithDType};
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::sync::{LazyLock, Mutex};

/// Smallest buffer the pool keeps (below, the system allocator reuses memory well). Small
/// buffers are pooled too: a recorded forward keeps every activation alive, and freeing them
/// en masse sends malloc down its slow consolidating paths.
const POOL_MIN: usize = 256;
/// At most this many bytes of idle buffers are kept.
const POOL_BYTES: usize = 512 << 20;

struct Pool {
    idle: HashMap<(DType, usize), Vec<HostBuffer>>,
    held: usize,
}

static POOL: LazyLock<Mutex<Pool>> = LazyLock::new(|| {
    Mutex::new(Pool {
        idle: HashMap::new(),
        held: 0,
    })
});

fn capacity(b: &HostBuffer) -> usize {
    ferrite_core::map_host!(b, v => v.capacity())
}

/// Offers a dropped storage's buffer to the pool. Its length is kept: the elements below it
/// are initialized, and `scratch` hands them out again without rewriting them.
pub(crate) fn recycle(b: HostBuffer) {
    let (cap, dt) = (capacity(&b), b.dtype());
    let bytes = cap * dt.size_in_bytes();
    if bytes < POOL_MIN {
        return;
    }
    if let Ok(mut pool) = POOL.lock() {
        if pool.held + bytes <= POOL_BYTES {
            pool.held += bytes;
            pool.idle.entry((dt, cap)).or_default().push(b);
        }
    }
}

/// Offers a scratch vector to the pool.
pub(crate) fn give_back<T: WithDType>(v: Vec<T>) {
    recycle(T::wrap(v));
}

/// An idle vector of `T` with capacity exactly `n` (its length as it was recycled), if the
/// pool has one.
fn take<T: WithDType>(n: usize) -> Option<Vec<T>> {
    let mut pool = POOL.lock().ok()?;
    let b = pool.idle.get_mut(&(T::DTYPE, n))?.pop()?;
    pool.held -= n * T::DTYPE.size_in_bytes();
    T::take_vec(b)
}

/// An empty vector with capacity for `n` elements: pooled, or fresh (huge-page advised when
/// large).
fn empty<T: WithDType>(n: usize) -> Vec<T> {
    let mut v = pooled(n);
    v.clear();
    v
}

/// A vector with capacity for `n` elements: pooled (with its recycled length and values), or
/// fresh and empty.
fn pooled<T: WithDType>(n: usize) -> Vec<T> {
    let bytes = n * std::mem::size_of::<T>();
    if bytes < POOL_MIN {
        return Vec::with_capacity(n);
    }
    take(n).unwrap_or_else(|| {
        let mut v = Vec::with_capacity(n);
        if bytes >= HUGE_MIN {
            advise_huge(v.as_mut_ptr() as *mut u8, bytes);
        }
        v
    })
}

/// `n` copies of `value`, in a pooled buffer when one fits.
pub(crate) fn full<T: WithDType>(n: usize, value: T) -> Vec<T> {
    let mut v = empty(n);
    v.resize(n, value);
    v
}

/// `n` elements whose values are unspecified (for scratch space the caller overwrites before
/// it reads): a recycled buffer keeps the values it held, and only elements no one has
/// written yet are zeroed, so reusing a pooled buffer costs no fill pass.
pub(crate) fn scratch<T: WithDType>(n: usize) -> Vec<T> {
    let mut v = pooled(n);
    v.resize(n, T::default());
    v
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
    let mut v: Vec<T> = empty(n);
    init(&mut v.spare_capacity_mut()[..n]);
    // SAFETY: `init` was given exactly the first `n` slots and, by this function's contract,
    // wrote each of them; `T: Copy` has no drop obligations.
    unsafe { v.set_len(n) };
    v
}
