//! The caching buffer pool.
//!
//! Requests round up to a size class: at least 256 bytes, then up to a quarter step of their
//! power of two (so at most 25% is wasted). Free buffers wait per class and are reused by the
//! next request of that class. Reuse is queue-ordered: every dispatch, copy and upload of a
//! device goes through its one queue in recording order, so a buffer dropped while queued work
//! still reads it can back the next op at once; that op runs after those reads.
//!
//! Counters match the CUDA allocator's (`MemoryStats`).

use ferrite_core::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Pool counters, in bytes unless named otherwise (the same fields as CUDA's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes in buffers held by live storages (size classes).
    pub in_use: usize,
    /// Bytes in buffers created and not yet destroyed (in use + cached).
    pub reserved: usize,
    /// Highest `in_use` since the last `reset_peak`.
    pub peak_in_use: usize,
    /// Number of buffers created.
    pub device_allocs: usize,
    /// Number of cached buffers destroyed (`empty_cache`).
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

/// The size class of a request of `bytes`.
pub(crate) fn size_class(bytes: usize) -> usize {
    let b = bytes.max(256);
    let p = usize::BITS - 1 - b.leading_zeros();
    let step = (1usize << p) / 4;
    b.div_ceil(step) * step
}

#[derive(Default)]
struct State {
    free: HashMap<usize, Vec<wgpu::Buffer>>,
    stats: MemoryStats,
    limit: Option<usize>,
}

pub(crate) struct Pool {
    state: Mutex<State>,
    /// Times cached buffers were destroyed: holders of buffer clones (the device's bind-group
    /// cache) drop theirs when it changes.
    generation: AtomicU64,
    /// The adapter's largest buffer and storage binding, in bytes.
    pub max_buffer: u64,
    pub max_binding: u64,
}

/// A pooled device buffer; goes back to the pool's cache when dropped.
pub struct Block {
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) class: usize,
    pool: Arc<Pool>,
}

impl Drop for Block {
    fn drop(&mut self) {
        let mut s = self.pool.lock();
        s.stats.in_use -= self.class;
        s.free
            .entry(self.class)
            .or_default()
            .push(self.buffer.clone());
    }
}

impl Pool {
    pub fn new(max_buffer: u64, max_binding: u64) -> Pool {
        Pool {
            state: Mutex::new(State::default()),
            generation: AtomicU64::new(0),
            max_buffer,
            max_binding,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer of at least `bytes` (storage, copy source and destination) for op `op`.
    pub fn alloc(
        self: &Arc<Self>,
        device: &wgpu::Device,
        op: &'static str,
        bytes: usize,
    ) -> Result<Arc<Block>> {
        let class = size_class(bytes);
        let limit = self.max_buffer.min(self.max_binding);
        if class as u64 > limit {
            return Err(Error::backend(
                op,
                format!(
                    "a buffer of {bytes} bytes exceeds the adapter's limit of {limit} bytes \
                     (max_buffer_size {}, max_storage_buffer_binding_size {})",
                    self.max_buffer, self.max_binding
                ),
            ));
        }
        let mut s = self.lock();
        let cached = s.free.get_mut(&class).and_then(|v| v.pop());
        let buffer = match cached {
            Some(b) => {
                s.stats.cache_hits += 1;
                b
            }
            None => {
                if let Some(l) = s.limit {
                    if s.stats.reserved + class > l {
                        // Give back the cache first, like the CUDA allocator's retry.
                        self.drop_cached(&mut s);
                        if s.stats.reserved + class > l {
                            return Err(Error::backend(
                                op,
                                format!(
                                    "out of device memory allocating {bytes} bytes ({}, limit {l} B)",
                                    s.stats
                                ),
                            ));
                        }
                    }
                }
                s.stats.device_allocs += 1;
                s.stats.reserved += class;
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(op),
                    size: class as u64,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            }
        };
        s.stats.in_use += class;
        s.stats.peak_in_use = s.stats.peak_in_use.max(s.stats.in_use);
        Ok(Arc::new(Block {
            buffer,
            class,
            pool: self.clone(),
        }))
    }

    fn drop_cached(&self, s: &mut State) {
        if s.free.values().any(|v| !v.is_empty()) {
            self.generation.fetch_add(1, Ordering::Relaxed);
        }
        for (class, bufs) in s.free.drain() {
            for b in bufs {
                // Dropped, not destroyed: wgpu keeps a buffer that recorded work uses alive
                // until that work completes.
                drop(b);
                s.stats.reserved -= class;
                s.stats.device_frees += 1;
            }
        }
    }

    pub fn stats(&self) -> MemoryStats {
        self.lock().stats
    }

    pub fn reset_peak(&self) {
        let mut s = self.lock();
        s.stats.peak_in_use = s.stats.in_use;
    }

    /// Releases every cached (unused) buffer; safe at any time (see `drop_cached`).
    pub fn empty_cache(&self) {
        self.drop_cached(&mut self.lock());
    }

    /// Changes whenever cached buffers are destroyed.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    pub fn set_limit(&self, bytes: Option<usize>) {
        self.lock().limit = bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::size_class;

    #[test]
    fn size_classes_round_up_by_at_most_a_quarter() {
        assert_eq!(size_class(0), 256);
        assert_eq!(size_class(1), 256);
        assert_eq!(size_class(257), 320);
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), (1 << 20) + (1 << 18));
        for b in [300usize, 4097, 123_457, 9_999_999] {
            let c = size_class(b);
            assert!(c >= b && (c - b) * 4 <= b, "{b} -> {c}");
        }
    }
}
