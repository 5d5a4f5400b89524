//! CUDA storage: a device block plus the point in a stream after which its data is valid.

use crate::alloc::Block;
use crate::device::CudaBackend;
use crate::driver::Event;
use cudarc::driver::sys;
use ferrite_core::{DType, Error, Result, Storage};
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub struct CudaStorage {
    pub(crate) block: Arc<Block>,
    dtype: DType,
    len: usize,
    /// Recorded right after the latest work that wrote the block (its producer, or an
    /// in-place `write_into`). `None`: written while a graph was captured; valid after that
    /// graph's replay.
    ready: Mutex<Option<Arc<Event>>>,
    /// Produced on the copy stream: the compute stream must wait on `ready` before reading it.
    on_copy_stream: AtomicBool,
    compute: sys::CUstream,
}

// SAFETY: the stream handle is only used to order work; the block is owned.
unsafe impl Send for CudaStorage {}
unsafe impl Sync for CudaStorage {}

impl CudaStorage {
    pub(crate) fn new(
        block: Arc<Block>,
        dtype: DType,
        len: usize,
        ready: Option<Arc<Event>>,
        on_copy_stream: bool,
        compute: sys::CUstream,
    ) -> CudaStorage {
        CudaStorage {
            block,
            dtype,
            len,
            ready: Mutex::new(ready),
            on_copy_stream: AtomicBool::new(on_copy_stream),
            compute,
        }
    }

    /// Device address of element 0.
    pub fn device_ptr(&self) -> u64 {
        self.block.ptr
    }

    /// Orders the compute stream after this storage's producer (a no-op for compute-stream
    /// producers: stream order already holds).
    pub(crate) fn ready_for_compute(&self, dev: &CudaBackend) -> Result<()> {
        if self.on_copy_stream.load(Ordering::Acquire) {
            if let Some(e) = &self.ready() {
                if dev.capturing.load(Ordering::Acquire) {
                    e.synchronize()?;
                } else {
                    e.wait_on(&dev.compute)?;
                }
            }
            self.on_copy_stream.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// The event a host read must wait for.
    fn ready(&self) -> Option<Arc<Event>> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Marks the block as rewritten in place on the compute stream up to `ready` (`None`
    /// inside a graph capture). The caller has ordered the compute stream after any copy-stream
    /// producer (`ready_for_compute`).
    pub(crate) fn rewritten(&self, ready: Option<Arc<Event>>) {
        *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = ready;
    }

    pub(crate) fn ready_point(&self, dev: &CudaBackend) -> Result<Option<Arc<Event>>> {
        match &self.ready() {
            Some(e) => Ok(Some(e.clone())),
            None => match dev
                .last_replay
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
            {
                Some(e) => Ok(Some(e)),
                None => Err(Error::backend(
                    "to_host",
                    "tensor was produced inside a CUDA graph that has not been replayed",
                )),
            },
        }
    }
}

impl Drop for CudaStorage {
    fn drop(&mut self) {
        // A block last written on the copy stream: order the compute stream after that copy
        // before the block returns to the (compute-stream ordered) cache.
        if self.on_copy_stream.load(Ordering::Acquire) {
            if let Some(e) = &self.ready() {
                // SAFETY: both handles are alive (the device outlives its storages).
                unsafe {
                    let _ = cudarc::driver::result::stream::wait_event(
                        self.compute,
                        e.raw,
                        sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                    );
                }
            }
        }
    }
}

impl Storage for CudaStorage {
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
