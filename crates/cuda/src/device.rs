//! One CUDA device: its context, compute and copy streams, events, allocator, kernels and
//! cuBLASLt handle; how op outputs get their "ready" point; host reads and uploads through
//! pinned staging buffers; device-side fault reporting.

use crate::alloc::{Allocator, Block, MemoryStats};
use crate::driver::{Check, Context, Event, EventPool, Stream};
use crate::kernels::{Args, Cfg, KernelSource, Kernels};
use crate::storage::CudaStorage;
use cudarc::driver::{result as dr, sys};
use ferrite_core::{map_host, DType, Error, HostBuffer, Layout, Result, Storage, Tensor};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes per pinned staging chunk (uploads use two in turn; reads one).
const CHUNK: usize = 16 << 20;

/// Host-mapped fault record written by kernels (layout of `ErrFlag` in common.cuh).
#[repr(C)]
struct Fault {
    code: u32,
    pad: u32,
    a: i64,
    b: i64,
}

/// Fault codes shared with the kernels.
pub(crate) mod fault {
    pub const INDEX_SELECT: u32 = 1;
    pub const GATHER: u32 = 2;
    pub const SCATTER_ADD: u32 = 3;
    pub const INT_DIV_ZERO: u32 = 4;
    pub const CROSS_ENTROPY: u32 = 5;
}

pub(crate) struct Pinned {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    /// Completes when the last copy that used this buffer is done.
    busy: Option<Event>,
}

impl Pinned {
    pub(crate) fn new(len: usize) -> Result<Pinned> {
        // SAFETY: page-locked host allocation.
        let ptr = unsafe { dr::malloc_host(len, 0) }.op("cuda")? as *mut u8;
        Ok(Pinned {
            ptr,
            len,
            busy: None,
        })
    }
    fn wait_idle(&mut self) -> Result<()> {
        if let Some(e) = self.busy.take() {
            e.synchronize()?;
        }
        Ok(())
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_host; no copy is pending (callers wait first).
        unsafe {
            let _ = dr::free_host(self.ptr as *mut c_void);
        }
    }
}

#[derive(Default)]
struct Staging {
    up: Vec<Pinned>,
    next_up: usize,
    down: Option<Pinned>,
}

/// Host-side instrumentation, for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Times the host blocked on the device (host reads, explicit synchronize).
    pub host_waits: u64,
    /// Kernels launched.
    pub launches: u64,
    /// Uploads.
    pub uploads: u64,
}

pub struct CudaBackend {
    pub(crate) ctx: Context,
    pub(crate) compute: Stream,
    pub(crate) copy: Stream,
    pub(crate) events: Arc<EventPool>,
    pub(crate) alloc: Arc<Allocator>,
    pub(crate) kernels: Kernels,
    pub(crate) blas: Mutex<Option<crate::matmul::Blas>>,
    pub(crate) cudnn: Mutex<Option<crate::cudnn::Cudnn>>,
    pub(crate) conv: Mutex<crate::cudnn::ConvSettings>,
    pub(crate) conv_cudnn_calls: AtomicU64,
    pub(crate) conv_im2col_calls: AtomicU64,
    pub(crate) conv_direct_calls: AtomicU64,
    pub(crate) tf32: AtomicBool,
    pub(crate) capturing: AtomicBool,
    pub(crate) last_replay: Mutex<Option<Arc<Event>>>,
    staging: Mutex<Staging>,
    fault_host: *mut Fault,
    pub(crate) fault_dev: u64,
    host_waits: AtomicU64,
    launches: AtomicU64,
    uploads: AtomicU64,
    pub name: String,
    pub sm_count: u32,
    pub cc: (i32, i32),
}

// SAFETY: raw handles are used under the context bound per thread; shared state is locked.
unsafe impl Send for CudaBackend {}
unsafe impl Sync for CudaBackend {}

impl CudaBackend {
    pub(crate) fn new(ordinal: usize) -> Result<CudaBackend> {
        let conv = crate::cudnn::ConvSettings::from_env()?;
        let ctx = Context::new(ordinal)?;
        use sys::CUdevice_attribute as A;
        let major = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sm_count = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let name = dr::device::get_name(ctx.dev).op("cuda")?;
        let compute = Stream::new()?;
        let copy = Stream::new()?;
        let alloc = Arc::new(Allocator::new(compute.0, ordinal));
        // SAFETY: host-mapped pinned allocation, zeroed before any kernel can see it.
        let fault_host = unsafe {
            dr::malloc_host(std::mem::size_of::<Fault>(), sys::CU_MEMHOSTALLOC_DEVICEMAP)
        }
        .op("cuda")? as *mut Fault;
        // SAFETY: fault_host points to a Fault-sized allocation.
        unsafe {
            fault_host.write_volatile(Fault {
                code: 0,
                pad: 0,
                a: 0,
                b: 0,
            })
        };
        let mut fault_dev: sys::CUdeviceptr = 0;
        // SAFETY: fault_host was allocated with DEVICEMAP.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut fault_dev, fault_host as *mut c_void, 0) }
            .result()
            .op("cuda")?;
        Ok(CudaBackend {
            kernels: Kernels::new(crate::kernel_key::arch_name(major, minor)),
            ctx,
            compute,
            copy,
            events: Arc::new(EventPool::default()),
            alloc,
            blas: Mutex::new(None),
            cudnn: Mutex::new(None),
            conv: Mutex::new(conv),
            conv_cudnn_calls: AtomicU64::new(0),
            conv_im2col_calls: AtomicU64::new(0),
            conv_direct_calls: AtomicU64::new(0),
            tf32: AtomicBool::new(false),
            capturing: AtomicBool::new(false),
            last_replay: Mutex::new(None),
            staging: Mutex::new(Staging::default()),
            fault_host,
            fault_dev,
            host_waits: AtomicU64::new(0),
            launches: AtomicU64::new(0),
            uploads: AtomicU64::new(0),
            name,
            sm_count,
            cc: (major, minor),
        })
    }

    pub(crate) fn conv_settings(&self) -> crate::cudnn::ConvSettings {
        *self.conv.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind()
    }

    pub fn memory_stats(&self) -> MemoryStats {
        self.alloc.stats()
    }

    pub fn sync_stats(&self) -> SyncStats {
        SyncStats {
            host_waits: self.host_waits.load(Ordering::Relaxed),
            launches: self.launches.load(Ordering::Relaxed),
            uploads: self.uploads.load(Ordering::Relaxed),
        }
    }

    /// Waits for all queued work on this device (benchmarks; never needed for correctness).
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        self.host_waits.fetch_add(1, Ordering::Relaxed);
        // SAFETY: our streams.
        unsafe {
            dr::stream::synchronize(self.compute.0).op("synchronize")?;
            dr::stream::synchronize(self.copy.0).op("synchronize")?;
        }
        self.check_fault()
    }

    /// Reports (and clears) a fault a kernel recorded since the last check.
    /// Counts a host wait (`SyncStats::host_waits`) made outside this module.
    pub(crate) fn count_host_wait(&self) {
        self.host_waits.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn check_fault(&self) -> Result<()> {
        // SAFETY: fault_host is valid for the device's lifetime; the device writes it only
        // through atomics, and all its writers have finished (the caller just waited).
        let f = unsafe { self.fault_host.read_volatile() };
        if f.code == 0 {
            return Ok(());
        }
        // SAFETY: as above.
        unsafe {
            self.fault_host.write_volatile(Fault {
                code: 0,
                pad: 0,
                a: 0,
                b: 0,
            })
        };
        Err(match f.code {
            fault::INDEX_SELECT => Error::backend(
                "index_select",
                format!(
                    "index {} out of range for an axis of size {} (found on the device)",
                    f.a, f.b
                ),
            ),
            fault::GATHER => Error::backend(
                "gather",
                format!(
                    "index {} out of range for an axis of size {} (found on the device)",
                    f.a, f.b
                ),
            ),
            fault::SCATTER_ADD => Error::backend(
                "scatter_add",
                format!(
                    "index {} out of range for an axis of size {} (found on the device)",
                    f.a, f.b
                ),
            ),
            fault::CROSS_ENTROPY => Error::backend(
                "cross_entropy",
                format!(
                    "target {} out of range for {} classes (found on the device)",
                    f.a, f.b
                ),
            ),
            fault::INT_DIV_ZERO => {
                Error::backend("div", "integer division by zero (found on the device)")
            }
            c => Error::backend("cuda", format!("unknown device fault code {c}")),
        })
    }

    /// A new device buffer for `n` elements of `dtype`.
    pub(crate) fn alloc_out(&self, n: usize, dtype: DType, op: &'static str) -> Result<Out> {
        let bytes = n
            .checked_mul(dtype.size_in_bytes())
            .ok_or_else(|| Error::backend(op, "output size overflows"))?;
        Ok(Out {
            block: self.alloc.alloc(bytes, op)?,
            dtype,
            len: n,
        })
    }

    /// Seals op outputs: records where in the compute stream they become valid.
    pub(crate) fn finish(&self, outs: Vec<Out>) -> Result<Vec<Arc<dyn Storage>>> {
        let ready = self.ready_now()?;
        Ok(outs
            .into_iter()
            .map(|o| {
                Arc::new(CudaStorage::new(
                    o.block,
                    o.dtype,
                    o.len,
                    ready.clone(),
                    false,
                    self.compute.0,
                )) as Arc<dyn Storage>
            })
            .collect())
    }

    pub(crate) fn finish_one(&self, out: Out) -> Result<Vec<Arc<dyn Storage>>> {
        self.finish(vec![out])
    }

    /// The CUDA storage of an op input, made safe to read on the compute stream.
    pub(crate) fn input<'a>(&self, t: &'a Tensor, op: &'static str) -> Result<&'a CudaStorage> {
        let s = t
            .storage()
            .as_any()
            .downcast_ref::<CudaStorage>()
            .ok_or_else(|| {
                Error::backend(
                    op,
                    format!("input is on {}, not on CUDA", t.device().kind()),
                )
            })?;
        s.ready_for_compute(self)?;
        if self.capturing.load(std::sync::atomic::Ordering::Acquire) {
            self.alloc.hold(&s.block);
        }
        Ok(s)
    }

    /// Device address of a tensor's first element (`layout.offset` applied).
    pub(crate) fn ptr(t: &Tensor, s: &CudaStorage) -> u64 {
        s.block.ptr + (t.layout().offset() * t.dtype().size_in_bytes()) as u64
    }

    pub(crate) fn launch(
        &self,
        op: &'static str,
        src: &'static KernelSource,
        name: &str,
        cfg: Cfg,
        mut args: Args,
    ) -> Result<()> {
        let f = self.kernels.func(src, name)?;
        if cfg.smem > f.smem_allowed {
            self.kernels.allow_smem(src, name, cfg.smem)?;
        }
        let mut p = args.ptrs();
        self.launches.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the arguments match the kernel's parameters (each wrapper keeps them in
        // step with its .cu source); buffers outlive the queued work (stream-ordered reuse).
        unsafe { dr::launch_kernel(f.raw, cfg.grid, cfg.block, cfg.smem, self.compute.0, &mut p) }
            .map_err(|e| {
                Error::backend(
                    op,
                    format!("kernel {name} failed to launch ({cfg:?}): {:?}", e.0),
                )
            })
    }

    // ---- host <-> device ----

    pub(crate) fn upload_buffer(&self, data: &HostBuffer) -> Result<Arc<dyn Storage>> {
        self.bind()?;
        self.uploads.fetch_add(1, Ordering::Relaxed);
        let (n, dtype) = (data.len(), data.dtype());
        if self.capturing.load(Ordering::Acquire) {
            return Err(Error::backend(
                "upload",
                "cannot upload host data while a CUDA graph is being captured: create the \
                 graph's inputs before the capture and update them with `write`",
            ));
        }
        let out = self.alloc_out(n, dtype, "upload")?;
        // The block may come from the cache with compute-stream kernels still reading its
        // previous contents: the copy stream writes it only after them.
        if n > 0 {
            self.mark()?.wait_on(&self.copy)?;
        }
        let ev = self.copy_in(host_bytes(data), out.block.ptr, &self.copy)?;
        Ok(Arc::new(CudaStorage::new(
            out.block,
            dtype,
            n,
            Some(Arc::new(ev)),
            true,
            self.compute.0,
        )))
    }

    /// Copies host bytes to `dst` on `stream` through the pinned ring; returns an event after
    /// the last chunk.
    pub(crate) fn copy_in(&self, bytes: &[u8], dst: u64, stream: &Stream) -> Result<Event> {
        let mut st = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        if st.up.is_empty() {
            st.up.push(Pinned::new(CHUNK)?);
            st.up.push(Pinned::new(CHUNK)?);
        }
        let mut done = 0;
        while done < bytes.len() {
            let k = st.next_up;
            st.next_up = (k + 1) % st.up.len();
            let buf = &mut st.up[k];
            buf.wait_idle()?;
            let len = (bytes.len() - done).min(buf.len);
            // SAFETY: buf holds len bytes and no copy reads it (waited above).
            unsafe {
                std::ptr::copy_nonoverlapping(bytes[done..].as_ptr(), buf.ptr, len);
                sys::cuMemcpyHtoDAsync_v2(
                    dst + done as u64,
                    buf.ptr as *const c_void,
                    len,
                    stream.0,
                )
                .result()
                .op("upload")?;
            }
            let e = self.events.get()?;
            e.record(stream)?;
            buf.busy = Some(e);
            done += len;
        }
        let e = self.events.get()?;
        e.record(stream)?;
        Ok(e)
    }

    /// Writes host data into an existing contiguous CUDA tensor's buffer, ordered on the
    /// compute stream: how inputs of a captured graph are updated before a replay.
    pub fn write(&self, dst: &Tensor, data: &HostBuffer) -> Result<()> {
        self.bind()?;
        let op = "write";
        if data.dtype() != dst.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: dst.dtype(),
                rhs: data.dtype(),
            });
        }
        if data.len() != dst.elem_count() || !dst.is_contiguous() {
            return Err(Error::shape(
                op,
                format!(
                    "{} elements into a tensor of shape {} (must match and be contiguous)",
                    data.len(),
                    dst.shape()
                ),
            ));
        }
        let s = self.input(dst, op)?;
        let ptr = Self::ptr(dst, s);
        let ev = self.copy_in(host_bytes(data), ptr, &self.compute)?;
        // Host reads of `dst` wait for this write, not only for its producer.
        if !self.capturing.load(Ordering::Acquire) {
            s.rewritten(Some(Arc::new(ev)));
        }
        Ok(())
    }

    pub(crate) fn download(&self, storage: &dyn Storage, layout: &Layout) -> Result<HostBuffer> {
        self.bind()?;
        let op = "to_host";
        if self.capturing.load(Ordering::Acquire) {
            return Err(Error::backend(
                op,
                "cannot read a tensor while a CUDA graph is being captured",
            ));
        }
        let s = storage
            .as_any()
            .downcast_ref::<CudaStorage>()
            .ok_or_else(|| Error::backend(op, "storage is not a CUDA storage"))?;
        let dtype = s.dtype();
        let n = layout.shape().elem_count();
        let esz = dtype.size_in_bytes();
        // The point to wait for, and the contiguous bytes to copy.
        let (src, wait, _tmp): (u64, Option<Arc<Event>>, Option<Arc<dyn Storage>>) =
            if layout.is_contiguous() || n == 0 {
                (
                    s.block.ptr + (layout.offset() * esz) as u64,
                    s.ready_point(self)?,
                    None,
                )
            } else {
                let t = crate::elementwise::strided_copy(self, s, layout)?;
                let c = t
                    .as_any()
                    .downcast_ref::<CudaStorage>()
                    .ok_or_else(|| Error::backend(op, "copy produced a foreign storage"))?;
                (c.block.ptr, c.ready_point(self)?, Some(t.clone()))
            };
        let out = self.read_after(src, n * esz, wait)?;
        Ok(bytes_to_host(dtype, out, n))
    }

    /// Copies `bytes` bytes at `src` to the host once `wait` has passed (on the copy stream,
    /// through the pinned staging buffer); reports device faults.
    pub(crate) fn read_after(
        &self,
        src: u64,
        bytes: usize,
        wait: Option<Arc<Event>>,
    ) -> Result<Vec<u8>> {
        let op = "to_host";
        let mut out = vec![0u8; bytes];
        self.host_waits.fetch_add(1, Ordering::Relaxed);
        if let Some(e) = &wait {
            e.wait_on(&self.copy)?;
        }
        let mut st = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        if st.down.as_ref().is_none_or(|p| p.len < bytes.min(CHUNK)) {
            st.down = Some(Pinned::new(bytes.clamp(4096, CHUNK))?);
        }
        let buf = st
            .down
            .as_mut()
            .ok_or_else(|| Error::backend(op, "no staging buffer"))?;
        let mut done = 0;
        while done < bytes {
            let len = (bytes - done).min(buf.len);
            // SAFETY: buf holds len bytes; we wait for the copy before reading it.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    buf.ptr as *mut c_void,
                    src + done as u64,
                    len,
                    self.copy.0,
                )
                .result()
                .op(op)?;
                dr::stream::synchronize(self.copy.0).op(op)?;
                std::ptr::copy_nonoverlapping(buf.ptr, out[done..].as_mut_ptr(), len);
            }
            done += len;
        }
        drop(st);
        if bytes == 0 {
            if let Some(e) = &wait {
                e.synchronize()?;
            }
        }
        self.check_fault()?;
        Ok(out)
    }

    /// Records an event at the current end of the compute stream.
    pub(crate) fn mark(&self) -> Result<Arc<Event>> {
        let e = self.events.get()?;
        e.record(&self.compute)?;
        Ok(Arc::new(e))
    }

    /// Where the work enqueued so far becomes valid: an event at the current end of the
    /// compute stream, or `None` inside a graph capture (the replay orders it).
    pub(crate) fn ready_now(&self) -> Result<Option<Arc<Event>>> {
        match self.capturing.load(Ordering::Acquire) {
            true => Ok(None),
            false => self.mark().map(Some),
        }
    }
}

/// A freshly allocated op output, sealed by `CudaBackend::finish`.
pub(crate) struct Out {
    pub block: Arc<Block>,
    pub dtype: DType,
    pub len: usize,
}

impl Out {
    pub fn ptr(&self) -> u64 {
        self.block.ptr
    }
}

fn host_bytes(data: &HostBuffer) -> &[u8] {
    // SAFETY: every element type is plain data (bool is one byte, 0 or 1); the slice covers
    // exactly the vector's initialized elements.
    map_host!(data, v => unsafe {
        std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v.as_slice()))
    })
}

fn bytes_to_host(dtype: DType, bytes: Vec<u8>, n: usize) -> HostBuffer {
    fn cast<T: Copy + Default>(b: &[u8], n: usize) -> Vec<T> {
        let mut v = vec![T::default(); n];
        // SAFETY: v has n * size_of::<T>() bytes; b has at least that many.
        unsafe {
            std::ptr::copy_nonoverlapping(
                b.as_ptr(),
                v.as_mut_ptr() as *mut u8,
                n * std::mem::size_of::<T>(),
            );
        }
        v
    }
    match dtype {
        DType::F32 => HostBuffer::F32(cast(&bytes, n)),
        DType::F16 => HostBuffer::F16(cast(&bytes, n)),
        DType::BF16 => HostBuffer::BF16(cast(&bytes, n)),
        DType::F64 => HostBuffer::F64(cast(&bytes, n)),
        DType::I32 => HostBuffer::I32(cast(&bytes, n)),
        DType::I64 => HostBuffer::I64(cast(&bytes, n)),
        DType::U32 => HostBuffer::U32(cast(&bytes, n)),
        DType::U8 => HostBuffer::U8(cast(&bytes, n)),
        // Device bools are bytes 0/1 (kernels write only those).
        DType::Bool => HostBuffer::Bool(bytes.iter().map(|&b| b != 0).collect()),
    }
}
