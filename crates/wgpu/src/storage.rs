//! wgpu storage: a pooled buffer (one 32-bit word per element, see `shader.rs`) and the batch
//! that last wrote it.

use crate::pool::Block;
use ferrite_core::{DType, Error, Result, Storage};
use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub struct WgpuStorage {
    pub(crate) block: Arc<Block>,
    dtype: DType,
    len: usize,
    /// Id of the batch that last wrote the buffer (its producer or an in-place write).
    written: AtomicU64,
}

impl WgpuStorage {
    pub(crate) fn new(block: Arc<Block>, dtype: DType, len: usize, batch: u64) -> WgpuStorage {
        WgpuStorage {
            block,
            dtype,
            len,
            written: AtomicU64::new(batch),
        }
    }

    pub(crate) fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    pub(crate) fn set_written(&self, batch: u64) {
        self.written.fetch_max(batch, Ordering::AcqRel);
    }

    pub(crate) fn buffer(&self) -> &wgpu::Buffer {
        &self.block.buffer
    }

    /// The wgpu storage behind a generic one; an error naming `op` for another backend's.
    pub(crate) fn of<'a>(s: &'a dyn Storage, op: &'static str) -> Result<&'a WgpuStorage> {
        s.as_any().downcast_ref::<WgpuStorage>().ok_or_else(|| {
            Error::backend(op, "a tensor of another device reached the wgpu backend")
        })
    }
}

impl Storage for WgpuStorage {
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
