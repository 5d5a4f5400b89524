//! CPU storage: a host buffer, plus typed access to a tensor's elements.

use ferrite_core::{DType, Error, HostBuffer, Result, Storage, Tensor, WithDType};
use std::any::Any;
use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A host buffer owned by a tensor storage. Construct with `CpuStorage::new` so that
/// `bytes_in_use` counts it.
pub struct CpuStorage(HostBuffer);

static IN_USE: AtomicUsize = AtomicUsize::new(0);

fn bytes(b: &HostBuffer) -> usize {
    b.len() * b.dtype().size_in_bytes()
}

impl CpuStorage {
    pub fn new(b: HostBuffer) -> CpuStorage {
        IN_USE.fetch_add(bytes(&b), Ordering::Relaxed);
        CpuStorage(b)
    }

    pub fn buffer(&self) -> &HostBuffer {
        &self.0
    }
}

/// Bytes held by live CPU tensor storages (pooled idle buffers not included).
pub fn bytes_in_use() -> usize {
    IN_USE.load(Ordering::Relaxed)
}

impl Drop for CpuStorage {
    fn drop(&mut self) {
        IN_USE.fetch_sub(bytes(&self.0), Ordering::Relaxed);
        crate::alloc::recycle(std::mem::replace(&mut self.0, HostBuffer::U8(Vec::new())));
    }
}

impl Storage for CpuStorage {
    fn dtype(&self) -> DType {
        self.0.dtype()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

pub(crate) fn host<'a>(s: &'a dyn Storage, op: &'static str) -> Result<&'a HostBuffer> {
    s.as_any()
        .downcast_ref::<CpuStorage>()
        .map(|c| &c.0)
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
