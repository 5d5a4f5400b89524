//! CPU storage: a host buffer, plus typed access to a tensor's elements.

use ferrite_core::{DType, Error, HostBuffer, Result, Storage, Tensor, WithDType};
use std::any::Any;
use std::borrow::Cow;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A host buffer owned by a tensor storage. Construct with `CpuStorage::new` so that
/// `bytes_in_use` counts it.
///
/// The buffer changes only through `CpuBackend::write_into` (in-place parameter writes). Every
/// read of it (an op's inputs in `exec`, `to_host`) happens while a `ReadGuard` on the storage
/// is held, and a write takes the storage exclusively, so no read overlaps a write.
pub struct CpuStorage {
    buf: UnsafeCell<HostBuffer>,
    /// The buffer's dtype and length, fixed for life (writes replace elements only).
    dtype: DType,
    len: usize,
    /// Readers holding the storage; `WRITING` while a write runs.
    readers: AtomicUsize,
}

const WRITING: usize = usize::MAX;

// SAFETY: `buf` is only mutated under the exclusive state of `readers` (see `write`), and
// only read while a `ReadGuard` holds it.
unsafe impl Sync for CpuStorage {}

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn bytes(b: &HostBuffer) -> usize {
    b.len() * b.dtype().size_in_bytes()
}

impl CpuStorage {
    pub fn new(b: HostBuffer) -> CpuStorage {
        let now = IN_USE.fetch_add(bytes(&b), Ordering::Relaxed) + bytes(&b);
        PEAK.fetch_max(now, Ordering::Relaxed);
        CpuStorage {
            dtype: b.dtype(),
            len: b.len(),
            buf: UnsafeCell::new(b),
            readers: AtomicUsize::new(0),
        }
    }

    /// Address of element 0 (stable for the storage's life: in-place writes reuse it).
    pub fn as_ptr(&self) -> usize {
        let _g = self.read();
        // SAFETY: read under a guard.
        host_ptr(unsafe { &*self.buf.get() })
    }

    /// Holds the storage for reading until the guard drops; waits while a write runs.
    /// Readers never wait for each other (nested reads on one thread cannot deadlock).
    pub(crate) fn read(&self) -> ReadGuard<'_> {
        let mut n = self.readers.load(Ordering::Acquire);
        loop {
            if n == WRITING {
                std::thread::yield_now();
                n = self.readers.load(Ordering::Acquire);
                continue;
            }
            match self
                .readers
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return ReadGuard(self),
                Err(m) => n = m,
            }
        }
    }

    /// Runs `f` on the buffer with exclusive access (waits for current readers).
    pub(crate) fn write<R>(&self, f: impl FnOnce(&mut HostBuffer) -> R) -> R {
        let mut g = self.lock_write();
        f(g.buffer())
    }

    /// Holds the storage exclusively until the guard drops (waits for current readers).
    pub(crate) fn lock_write(&self) -> WriteGuard<'_> {
        while self
            .readers
            .compare_exchange_weak(0, WRITING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            std::thread::yield_now();
        }
        WriteGuard(self)
    }

    /// The buffer without a guard: only for code running under a `ReadGuard` of this storage
    /// (`exec`, `to_host`).
    fn buffer_unguarded(&self) -> &HostBuffer {
        // SAFETY: callers hold a ReadGuard (module contract), so no write runs.
        unsafe { &*self.buf.get() }
    }
}

fn host_ptr(b: &HostBuffer) -> usize {
    match b {
        HostBuffer::F32(v) => v.as_ptr() as usize,
        HostBuffer::F64(v) => v.as_ptr() as usize,
        HostBuffer::F16(v) => v.as_ptr() as usize,
        HostBuffer::BF16(v) => v.as_ptr() as usize,
        HostBuffer::I32(v) => v.as_ptr() as usize,
        HostBuffer::I64(v) => v.as_ptr() as usize,
        HostBuffer::U32(v) => v.as_ptr() as usize,
        HostBuffer::U8(v) => v.as_ptr() as usize,
        HostBuffer::Bool(v) => v.as_ptr() as usize,
    }
}

/// A storage held exclusively (see `CpuStorage::lock_write`).
pub(crate) struct WriteGuard<'a>(&'a CpuStorage);

impl WriteGuard<'_> {
    pub(crate) fn buffer(&mut self) -> &mut HostBuffer {
        // SAFETY: the state is WRITING while the guard lives, so no reader or other writer
        // holds the buffer; `&mut self` keeps this borrow unique.
        unsafe { &mut *self.0.buf.get() }
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.0.readers.store(0, Ordering::Release);
    }
}

/// A storage held for reading (see `CpuStorage::read`).
pub(crate) struct ReadGuard<'a>(&'a CpuStorage);

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.0.readers.fetch_sub(1, Ordering::Release);
    }
}

/// Bytes held by live CPU tensor storages (pooled idle buffers not included).
pub fn bytes_in_use() -> usize {
    IN_USE.load(Ordering::Relaxed)
}

/// The highest `bytes_in_use` since the last `reset_peak` (or since start).
pub fn peak_bytes_in_use() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Starts a new peak at the bytes in use now.
pub fn reset_peak() {
    PEAK.store(IN_USE.load(Ordering::Relaxed), Ordering::Relaxed);
}

impl Drop for CpuStorage {
    fn drop(&mut self) {
        let b = std::mem::replace(self.buf.get_mut(), HostBuffer::U8(Vec::new()));
        IN_USE.fetch_sub(bytes(&b), Ordering::Relaxed);
        crate::alloc::recycle(b);
    }
}

impl Storage for CpuStorage {
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

/// Read guards on the CPU storages of `tensors` (held while an op reads them).
pub(crate) fn guards<'a>(tensors: &[&'a Tensor]) -> Vec<ReadGuard<'a>> {
    tensors
        .iter()
        .filter_map(|t| t.storage().as_any().downcast_ref::<CpuStorage>())
        .map(|s| s.read())
        .collect()
}

/// The buffer of a storage; callers run under a guard of it (`guards`, `CpuStorage::read`).
pub(crate) fn host<'a>(s: &'a dyn Storage, op: &'static str) -> Result<&'a HostBuffer> {
    s.as_any()
        .downcast_ref::<CpuStorage>()
        .map(|c| c.buffer_unguarded())
        .ok_or_else(|| Error::backend(op, "input is not on the CPU"))
}

/// The whole storage behind a tensor as a `T` slice.
pub(crate) fn raw<'a, T: WithDType>(t: &'a Tensor, op: &'static str) -> Result<&'a [T]> {
    T::unwrap(host(t.storage(), op)?)
        .ok_or_else(|| Error::dtype(op, t.dtype(), format!("expected {}", T::DTYPE)))
}

/// The tensor's elements in row-major order: borrowed when contiguous, else gathered.
pub(crate) fn contig<'a, T: WithDType>(t: &'a Tensor, op: &'static str) -> Result<Cow<'a, [T]>> {
    let data = raw::<T>(t, op)?;
    let l = t.layout();
    if l.is_contiguous() {
        let n = t.elem_count();
        Ok(Cow::Borrowed(&data[l.offset()..l.offset() + n]))
    } else {
        Ok(Cow::Owned(crate::elementwise::gather_strided(data, l)))
    }
}

/// Integer elements of an index tensor as i64.
pub(crate) fn indices(t: &Tensor, op: &'static str) -> Result<Vec<i64>> {
    Ok(match t.dtype() {
        DType::I32 => contig::<i32>(t, op)?.iter().map(|&x| x as i64).collect(),
        DType::I64 => contig::<i64>(t, op)?.into_owned(),
        DType::U32 => contig::<u32>(t, op)?.iter().map(|&x| x as i64).collect(),
        DType::U8 => contig::<u8>(t, op)?.iter().map(|&x| x as i64).collect(),
        dt => return Err(Error::dtype(op, dt, "index must be an integer dtype")),
    })
}

/// Float compute data: f64 stays f64, every other float dtype computes in f32.
pub(crate) enum Floats<'a> {
    F32(Cow<'a, [f32]>),
    F64(Cow<'a, [f64]>),
}

pub(crate) fn floats<'a>(t: &'a Tensor, op: &'static str) -> Result<Floats<'a>> {
    Ok(match t.dtype() {
        DType::F32 => Floats::F32(contig::<f32>(t, op)?),
        DType::F64 => Floats::F64(contig::<f64>(t, op)?),
        DType::F16 => Floats::F32(Cow::Owned(
            contig::<half::f16>(t, op)?
                .iter()
                .map(|x| x.to_f32())
                .collect(),
        )),
        DType::BF16 => Floats::F32(Cow::Owned(
            contig::<half::bf16>(t, op)?
                .iter()
                .map(|x| x.to_f32())
                .collect(),
        )),
        dt => return Err(Error::dtype(op, dt, "needs a float dtype")),
    })
}

/// f32 results back to the float dtype they were computed for.
pub(crate) fn from_f32(v: Vec<f32>, dtype: DType) -> HostBuffer {
    match dtype {
        DType::F16 => HostBuffer::F16(v.iter().map(|&x| half::f16::from_f32(x)).collect()),
        DType::BF16 => HostBuffer::BF16(v.iter().map(|&x| half::bf16::from_f32(x)).collect()),
        _ => HostBuffer::F32(v),
    }
}

/// Runs a float kernel generic over f32/f64 on the inputs' compute data and converts back to
/// the first input's dtype.
macro_rules! float_kernel {
    ($op:expr, $dtype:expr, [$($t:expr),+], |$($x:ident),+| $body:expr) => {{
        use $crate::storage::{floats, Floats, from_f32};
        match ($(floats($t, $op)?,)+) {
            ($(Floats::F32($x),)+) => { $(let $x: &[f32] = &$x;)+ from_f32($body, $dtype) }
            ($(Floats::F64($x),)+) => { $(let $x: &[f64] = &$x;)+ ferrite_core::HostBuffer::F64($body) }
            #[allow(unreachable_patterns)]
            _ => return Err(ferrite_core::Error::backend($op, "inputs of mixed precision")),
        }
    }};
}
pub(crate) use float_kernel;

/// Like `float_kernel!`, for kernels with several outputs: the body returns a `Vec` of output
/// vectors, each converted back to `$dtype`.
macro_rules! float_kernel_many {
    ($op:expr, $dtype:expr, [$($t:expr),+], |$($x:ident),+| $body:expr) => {{
        use $crate::storage::{floats, Floats, from_f32};
        match ($(floats($t, $op)?,)+) {
            ($(Floats::F32($x),)+) => { $(let $x: &[f32] = &$x;)+ $body.into_iter().map(|v| from_f32(v, $dtype)).collect::<Vec<_>>() }
            ($(Floats::F64($x),)+) => { $(let $x: &[f64] = &$x;)+ $body.into_iter().map(ferrite_core::HostBuffer::F64).collect::<Vec<_>>() }
            #[allow(unreachable_patterns)]
            _ => return Err(ferrite_core::Error::backend($op, "inputs of mixed precision")),
        }
    }};
}
pub(crate) use float_kernel_many;
