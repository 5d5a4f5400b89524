//! The low-level API for pipelines that bring their own kernels (LLM decode, fused training
//! steps): device buffers from the caching allocator, launches of `KernelSource` kernels on
//! the compute stream, byte copies, and tensors that view a buffer. Everything here is ordered
//! on the device's compute stream, like the ops; host reads wait for it.

use crate::alloc::Block;
use crate::device::CudaBackend;
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

    /// A mailbox of `slots` slots of `slot_bytes` bytes each (page-locked host memory mapped
    /// into the device's address space, zeroed) for kernels to write results into.
    pub fn mailbox(&self, slots: usize, slot_bytes: usize) -> Result<Mailbox> {
        let op = "mailbox";
        let bytes = slots
            .checked_mul(slot_bytes)
            .filter(|&b| b > 0)
            .ok_or_else(|| Error::backend(op, format!("{slots} slots of {slot_bytes} bytes")))?;
        self.be().bind()?;
        // SAFETY: a host-mapped page-locked allocation of `bytes` bytes, zeroed before any
        // kernel can see it.
        let ptr =
            unsafe { cudarc::driver::result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_DEVICEMAP) }
                .map_err(|e| crate::driver::drv(op, e))? as *mut u8;
        let mut mail = Mailbox {
            ptr,
            dev_ptr: 0,
            slot_bytes,
            marks: (0..slots).map(|_| None).collect(),
            dev: self.clone(),
        };
        // SAFETY: ptr holds `bytes` bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        // SAFETY: ptr was allocated with DEVICEMAP.
        unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut mail.dev_ptr, ptr as *mut std::ffi::c_void, 0)
        }
        .result()
        .map_err(|e| crate::driver::drv(op, e))?;
        Ok(mail)
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

/// Host memory that kernels write into directly (page-locked, mapped into the device's
/// address space; `CudaDevice::mailbox`), in slots: a pipeline's kernels write a step's
/// results into a slot at [`Mailbox::slot_ptr`], [`Mailbox::mark`] records the point of the
/// compute stream after which the slot's bytes are final, [`Mailbox::take`] waits for it and
/// returns them. Nothing is copied on the stream: reading a step's few bytes back costs the
/// device no copy between steps.
pub struct Mailbox {
    ptr: *mut u8,
    dev_ptr: u64,
    slot_bytes: usize,
    /// Per slot: the event that completes with the kernels writing it, and the bytes to read;
    /// None: not marked.
    marks: Vec<Option<(Event, usize)>>,
    dev: CudaDevice,
}

// SAFETY: the host memory is owned by the Mailbox; the host reads a slot only in `take`,
// after the work that writes it is done, through &mut self.
unsafe impl Send for Mailbox {}

impl Mailbox {
    pub fn slots(&self) -> usize {
        self.marks.len()
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Device address of slot 0 (slot i at `i * slot_bytes()` bytes further).
    pub fn base(&self) -> u64 {
        self.dev_ptr
    }

    /// Device address of `slot` (panics past the last slot).
    pub fn slot_ptr(&self, slot: usize) -> u64 {
        assert!(
            slot < self.slots(),
            "mailbox slot {slot} of {}",
            self.slots()
        );
        self.dev_ptr + (slot * self.slot_bytes) as u64
    }

    /// Whether `slot` is marked and not taken yet.
    pub fn is_marked(&self, slot: usize) -> bool {
        self.marks.get(slot).is_some_and(|m| m.is_some())
    }

    /// Marks `slot`'s first `len` bytes final once the work queued so far on the compute
    /// stream is done. Errors if the slot is marked already or `len` exceeds a slot.
    pub fn mark(&mut self, slot: usize, len: usize) -> Result<()> {
        let op = "mailbox";
        if len > self.slot_bytes {
            return Err(Error::backend(
                op,
                format!("{len} bytes marked in slots of {}", self.slot_bytes),
            ));
        }
        if self.is_marked(slot) {
            return Err(Error::backend(
                op,
                format!("slot {slot} is marked and not taken"),
            ));
        }
        let slots = self.slots();
        let m = self
            .marks
            .get_mut(slot)
            .ok_or_else(|| Error::backend(op, format!("slot {slot} of {slots}")))?;
        let be = self.dev.backend();
        be.bind()?;
        let e = be.events.get()?;
        e.record(&be.compute)?;
        *m = Some((e, len));
        Ok(())
    }

    /// Waits for the work before `slot`'s mark (only that) and returns the bytes marked;
    /// counted as a host wait. Errors if the slot is not marked or the device faulted.
    pub fn take(&mut self, slot: usize) -> Result<Vec<u8>> {
        let (e, len) = self
            .marks
            .get_mut(slot)
            .and_then(Option::take)
            .ok_or_else(|| Error::backend("mailbox", format!("slot {slot} is not marked")))?;
        let be = self.dev.backend();
        be.bind()?;
        be.count_host_wait();
        e.synchronize()?;
        be.check_fault()?;
        let mut out = vec![0u8; len];
        // SAFETY: the slot lies in the allocation; the kernels that write it are done (waited
        // above) and no later one writes it before the slot is marked again.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.add(slot * self.slot_bytes),
                out.as_mut_ptr(),
                len,
            )
        };
        Ok(out)
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        // Kernels that write the memory must be done before it is freed.
        for (e, _) in self.marks.iter_mut().filter_map(Option::take) {
            let _ = e.synchronize();
        }
        let _ = self.dev.backend().bind();
        let _ = self.dev.synchronize();
        // SAFETY: allocated by malloc_host in `CudaDevice::mailbox`; no kernel writes it now.
        unsafe {
            let _ = cudarc::driver::result::free_host(self.ptr as *mut std::ffi::c_void);
        }
    }
}
