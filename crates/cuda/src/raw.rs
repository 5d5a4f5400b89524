//! The low-level API for pipelines that bring their own kernels (LLM decode, fused training
//! steps): device buffers from the caching allocator, launches of `KernelSource` kernels on
//! the compute stream, byte copies, and tensors that view a buffer. Everything here is ordered
//! on the device's compute stream, like the ops; host reads wait for it.

use crate::alloc::Block;
use crate::device::{CudaBackend, Pinned};
use crate::driver::Event;
use crate::kernels::{Args, Cfg, KernelSource};
use crate::storage::CudaStorage;
use crate::CudaDevice;
use cudarc::driver::sys;
use ferrite_core::{DType, Error, Layout, Result, Shape, Storage, Tensor};
use std::sync::Arc;

/// A device buffer; returns to the cache when the last clone (or tensor viewing it) drops.
#[derive(Clone)]
pub struct Buffer {
    block: Arc<Block>,
    bytes: usize,
}

impl Buffer {
    /// Device address of byte 0.
    pub fn ptr(&self) -> u64 {
        self.block.ptr
    }
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Kernel arguments in parameter order; each type must match the kernel's parameter exactly
/// (device pointers as `u64`).
#[derive(Default)]
pub struct KernelArgs(Args);

impl KernelArgs {
    pub fn new() -> KernelArgs {
        KernelArgs(Args::new())
    }
    pub fn arg<T: Copy + 'static>(self, v: T) -> KernelArgs {
        KernelArgs(self.0.arg(v))
    }
}

impl CudaDevice {
    fn be(&self) -> &CudaBackend {
        self.backend()
    }

    /// (free, total) bytes of device memory as the driver reports them (the allocator's
    /// cached blocks count as used; `empty_cache` first to include them).
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.be().bind()?;
        cudarc::driver::result::mem_get_info().map_err(|e| crate::driver::drv("mem_info", e))
    }

    /// Streaming multiprocessors on the device.
    pub fn sm_count(&self) -> u32 {
        self.be().sm_count
    }

    /// An uninitialized device buffer of `bytes` bytes.
    pub fn alloc_bytes(&self, bytes: usize, op: &'static str) -> Result<Buffer> {
        self.be().bind()?;
        Ok(Buffer {
            block: self.be().alloc.alloc(bytes, op)?,
            bytes,
        })
    }

    /// Copies host bytes into `dst` at `offset`, ordered on the compute stream (staged through
    /// pinned memory; returns once the bytes are staged).
    pub fn write_bytes(&self, dst: &Buffer, offset: usize, data: &[u8]) -> Result<()> {
        if offset.checked_add(data.len()).is_none_or(|e| e > dst.bytes) {
            return Err(Error::backend(
                "write_bytes",
                format!(
                    "{} bytes at {offset} overflow a buffer of {}",
                    data.len(),
                    dst.bytes
                ),
            ));
        }
        self.be().bind()?;
        self.be().copy_in_compute(data, dst.ptr() + offset as u64)
    }

    /// Reads `len` bytes at `offset`, waiting for the work queued before the call.
    pub fn read_bytes(&self, src: &Buffer, offset: usize, len: usize) -> Result<Vec<u8>> {
        if offset.checked_add(len).is_none_or(|e| e > src.bytes) {
            return Err(Error::backend(
                "read_bytes",
                format!("{len} bytes at {offset} overflow a buffer of {}", src.bytes),
            ));
        }
        self.be().bind()?;
        self.be().read_compute(src.ptr() + offset as u64, len)
    }

    /// Queues a copy of `len` bytes at `offset` of `src` into `rb`, behind the work queued so
    /// far on the compute stream; work queued after it does not wait for it, and the host
    /// waits only in [`ReadBack::wait`]. `rb` must not hold an unread copy.
    pub fn queue_read(
        &self,
        rb: &mut ReadBack,
        src: &Buffer,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        let op = "queue_read";
        if offset.checked_add(len).is_none_or(|e| e > src.bytes) || len > rb.buf.len {
            return Err(Error::backend(
                op,
                format!(
                    "{len} bytes at {offset} of a buffer of {} into a read-back of {}",
                    src.bytes, rb.buf.len
                ),
            ));
        }
        if rb.done.is_some() {
            return Err(Error::backend(op, "the read-back holds an unread copy"));
        }
        let be = self.be();
        be.bind()?;
        // SAFETY: rb.buf holds len bytes and no copy writes it (done is None); the source
        // range lies in the buffer; ordered on the compute stream.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                rb.buf.ptr as *mut std::ffi::c_void,
                src.ptr() + offset as u64,
                len,
                be.compute.0,
            )
        }
        .result()
        .map_err(|e| crate::driver::drv(op, e))?;
        let e = be.events.get()?;
        e.record(&be.compute)?;
        rb.done = Some(e);
        rb.len = len;
        Ok(())
    }

    /// A read-back buffer of `bytes` bytes (page-locked host memory) for `queue_read`.
    pub fn read_back(&self, bytes: usize) -> Result<ReadBack> {
        self.be().bind()?;
        Ok(ReadBack {
            buf: Pinned::new(bytes.max(16))?,
            len: 0,
            done: None,
            dev: self.clone(),
        })
    }

    /// Fills a byte range with zeros (stream-ordered).
    pub fn zero_bytes(&self, dst: &Buffer) -> Result<()> {
        self.be().bind()?;
        if dst.bytes == 0 {
            return Ok(());
        }
        // SAFETY: the range lies in the buffer; ordered on the compute stream.
        unsafe { sys::cuMemsetD8Async(dst.ptr(), 0, dst.bytes, self.be().compute.0) }
            .result()
            .map_err(|e| crate::driver::drv("zero_bytes", e))
    }

    /// Launches `name` from `src` (compiled at first use) on the compute stream.
    pub fn launch(
        &self,
        op: &'static str,
        src: &'static KernelSource,
        name: &str,
        cfg: Cfg,
        args: KernelArgs,
    ) -> Result<()> {
        self.be().bind()?;
        self.be().launch(op, src, name, cfg, args.0)
    }

    /// `launch` with programmatic dependent launch allowed (sm_90+): the kernel may be
    /// scheduled while the kernel before it on the stream is still running, once every block
    /// of that one has run `griddepcontrol.launch_dependents` (or exited). So it must run
    /// `griddepcontrol.wait` before reading what earlier kernels wrote and before writing
    /// anything they read; work before that (loading weights no kernel writes) overlaps the
    /// previous kernel. Recorded as such in a captured graph. Not counted in `SyncStats`.
    pub fn launch_pdl(
        &self,
        op: &'static str,
        src: &'static KernelSource,
        name: &str,
        cfg: Cfg,
        args: KernelArgs,
    ) -> Result<()> {
        let be = self.be();
        be.bind()?;
        let f = be.kernels.func(src, name)?;
        if cfg.smem > f.smem_allowed {
            be.kernels.allow_smem(src, name, cfg.smem)?;
        }
        let mut args = args.0;
        let mut p = args.ptrs();
        // SAFETY: a zeroed attribute is a valid plain-data value; id and value are set below.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let lc = sys::CUlaunchConfig {
            gridDimX: cfg.grid.0,
            gridDimY: cfg.grid.1,
            gridDimZ: cfg.grid.2,
            blockDimX: cfg.block.0,
            blockDimY: cfg.block.1,
            blockDimZ: cfg.block.2,
            sharedMemBytes: cfg.smem,
            hStream: be.compute.0,
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: as `launch`: the arguments match the kernel's parameters (the caller keeps
        // them in step with its source); `lc`, `attr` and `p` outlive the call.
        unsafe { sys::cuLaunchKernelEx(&lc, f.raw, p.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(|e| {
                Error::backend(
                    op,
                    format!("kernel {name} failed to launch ({cfg:?}): {:?}", e.0),
                )
            })
    }

    /// A tensor viewing `shape` elements of `dtype` from byte `offset` of `buf` (no copy). It
    /// is valid after the work queued so far.
    pub fn tensor(
        &self,
        buf: &Buffer,
        offset: usize,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor> {
        let shape = Shape::new(shape.to_vec());
        let n = shape.elem_count();
        let esz = dtype.size_in_bytes();
        if !offset.is_multiple_of(esz) || offset + n * esz > buf.bytes {
            return Err(Error::backend(
                "tensor",
                format!(
                    "{shape} {dtype} at byte {offset} does not fit a buffer of {} bytes",
                    buf.bytes
                ),
            ));
        }
        let be = self.be();
        be.bind()?;
        let ready = be.ready_now()?;
        let len = buf.bytes / esz;
        let storage = Arc::new(CudaStorage::new(
            buf.block.clone(),
            dtype,
            len,
            ready,
            false,
            be.compute.0,
        ));
        let layout = Layout::new(shape.clone(), shape.contiguous_strides(), offset / esz);
        Ok(Tensor::from_storage(storage, layout, self.device()))
    }

    /// `d[m, n] = a[m, k] b[n, k]^T` (`+ d` when `accumulate`) on cuBLASLt: `a` and `b`
    /// row-major `dt` (f16 or bf16) with row strides `lda`, `ldb` elements, `d` row-major f32
    /// with row stride `ldd`; each operand is (buffer, byte offset, row stride). f32
    /// accumulation; ordered on the compute stream.
    pub fn gemm_nt_f32(
        &self,
        dt: DType,
        a: (&Buffer, usize, usize),
        b: (&Buffer, usize, usize),
        d: (&Buffer, usize, usize),
        (m, n, k): (usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let esz = dt.size_in_bytes();
        let span = |(buf, off, ld): (&Buffer, usize, usize),
                    rows: usize,
                    cols: usize,
                    es: usize| {
            let need = off + ((rows.max(1) - 1) * ld + cols) * es;
            if need > buf.bytes {
                return Err(Error::backend(
                    "gemm_nt_f32",
                    format!(
                        "{rows}x{cols} (row stride {ld}) at byte {off} overflows a buffer of {} bytes",
                        buf.bytes
                    ),
                ));
            }
            Ok(buf.ptr() + off as u64)
        };
        let pa = span(a, m, k, esz)?;
        let pb = span(b, n, k, esz)?;
        let pd = span(d, m, n, 4)?;
        self.be().bind()?;
        crate::matmul::gemm_nt_f32(
            self.be(),
            dt,
            (pa, a.2),
            (pb, b.2),
            (pd, d.2),
            (m, n, k),
            accumulate,
        )
    }

    /// The buffer behind a CUDA tensor, and the byte offset of its first element.
    pub fn buffer_of(&self, t: &Tensor) -> Result<(Buffer, usize)> {
        // Readied for the compute stream, and held by a graph being captured.
        let s = self.be().input(t, "buffer_of")?;
        let esz = t.dtype().size_in_bytes();
        Ok((
            Buffer {
                block: s.block.clone(),
                bytes: s.len() * esz,
            },
            t.layout().offset() * esz,
        ))
    }
}

impl CudaBackend {
    pub(crate) fn copy_in_compute(&self, data: &[u8], dst: u64) -> Result<()> {
        self.copy_in(data, dst, &self.compute).map(|_| ())
    }

    pub(crate) fn read_compute(&self, src: u64, len: usize) -> Result<Vec<u8>> {
        let e = self.mark()?;
        self.read_after(src, len, Some(e))
    }
}

/// Page-locked host memory that a device copy lands in without stalling the stream
/// (`CudaDevice::queue_read`); `wait` returns the bytes once that copy is done.
pub struct ReadBack {
    buf: Pinned,
    len: usize,
    /// Completes with the queued copy; None: no copy is queued.
    done: Option<Event>,
    dev: CudaDevice,
}

// SAFETY: the pinned memory is owned by the ReadBack and touched only through &mut self (the
// device writes it only between queue_read and wait, which take &mut).
unsafe impl Send for ReadBack {}

impl ReadBack {
    /// Whether a queued copy has not been read yet.
    pub fn is_queued(&self) -> bool {
        self.done.is_some()
    }

    /// Waits for the queued copy (only it and the work queued before it) and returns its
    /// bytes; counted as a host wait. Errors if nothing is queued or the device faulted.
    pub fn wait(&mut self) -> Result<&[u8]> {
        let e = self
            .done
            .take()
            .ok_or_else(|| Error::backend("read_back", "no copy is queued"))?;
        let be = self.dev.backend();
        be.bind()?;
        be.count_host_wait();
        e.synchronize()?;
        be.check_fault()?;
        // SAFETY: the copy into buf[..len] is complete (waited above); nothing else writes it.
        Ok(unsafe { std::slice::from_raw_parts(self.buf.ptr, self.len) })
    }
}

impl Drop for ReadBack {
    fn drop(&mut self) {
        // The pinned buffer must outlive any copy into it.
        if let Some(e) = self.done.take() {
            let _ = e.synchronize();
        }
    }
}
