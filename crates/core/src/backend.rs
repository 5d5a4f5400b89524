//! The interface between `Tensor` and the devices that run ops.

use crate::optim::{FusedUpdate, StepScalars};
use crate::quant::{ActFormat, QBytes, QStorage, QTensor, QType};
use crate::{DType, HostBuffer, Layout, Op, Result, Shape, Tensor};
use std::any::Any;
use std::sync::Arc;

/// Which kind of device, and which one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Cpu,
    Cuda(usize),
    /// A wgpu adapter (Vulkan, Metal, DX12), by its index in `ferrite_wgpu::adapters()`.
    Wgpu(usize),
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceKind::Cpu => f.write_str("cpu"),
            DeviceKind::Cuda(i) => write!(f, "cuda:{i}"),
            DeviceKind::Wgpu(i) => write!(f, "wgpu:{i}"),
        }
    }
}

/// A buffer owned by a backend. Ops never modify their inputs, so tensors share storages
/// freely; the one exception is `Backend::write_into` (`Tensor::copy_`), the in-place write
/// behind parameters and buffers that must keep their address for life. The backend downcasts
/// through `as_any`.
pub trait Storage: Any + Send + Sync {
    fn dtype(&self) -> DType;
    /// Number of elements.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn as_any(&self) -> &dyn Any;
}

/// An execution device. Implementations run every `Op` variant (one exhaustive match) or
/// return an error naming the op; never a default "not implemented".
pub trait Backend: Send + Sync + 'static {
    fn kind(&self) -> DeviceKind;
    /// Whether this device is capturing a graph now (work enqueued joins the graph instead of
    /// running). `Tensor::constant` keeps no constant made during a capture.
    fn capturing(&self) -> bool;
    /// Takes host data as a new contiguous storage.
    fn upload(&self, data: HostBuffer) -> Result<Arc<dyn Storage>>;
    /// Copies the elements a layout selects into a contiguous host buffer, waiting for exactly
    /// the work that produces them.
    fn to_host(&self, storage: &dyn Storage, layout: &Layout) -> Result<HostBuffer>;
    /// Runs `op` (validated by `Tensor`, see `op.rs`) on inputs living on this device, producing
    /// one contiguous storage per entry of `outs`.
    fn exec(
        &self,
        op: &Op,
        inputs: &[&Tensor],
        outs: &[(Shape, DType)],
    ) -> Result<Vec<Arc<dyn Storage>>>;
    /// Writes `src`'s elements (any layout) into `dst`'s existing buffer, in place: `dst`'s
    /// storage keeps its address. Validated by `Tensor::copy_`: both on this device, equal
    /// shapes and dtypes, `dst` contiguous, and the two never share a storage.
    ///
    /// Ordering contract: the write happens after every op already enqueued that reads
    /// `dst` (CPU: ops run to completion and a write waits for readers on other threads;
    /// CUDA: the copy is ordered on the compute stream) and before every later op or host
    /// read of `dst`. Tensors that view `dst`'s storage see the new values.
    fn write_into(&self, dst: &Tensor, src: &Tensor) -> Result<()>;
    /// The sum of squares of every element of `tensors` (validated by `optim::sum_squares`:
    /// contiguous floats on this device), accumulated in f64 in an order fixed by the sizes
    /// alone: one f64 element.
    fn sum_squares(&self, tensors: &[Tensor]) -> Result<Arc<dyn Storage>>;
    /// An optimizer step's device scalars from its gradients (validated by
    /// `optim::step_scalars`; the sum of squares as `sum_squares` computes it), rewritten in
    /// place with `write_into`'s ordering contract; returns the bool `finite` scalar.
    fn step_scalars(&self, s: &StepScalars<'_>) -> Result<Arc<dyn Storage>>;
    /// One fused optimizer update, in place (validated by `optim::fused_update`); the same
    /// ordering contract as `write_into` for every parameter and state tensor it writes.
    fn fused_update(&self, update: &FusedUpdate<'_>) -> Result<()>;
    /// Takes a quantized matrix's host bytes (validated by `QTensor::new`: a matrix format,
    /// exactly `rows x cols` elements in GGUF layout) as this device's form of it.
    fn upload_quant(
        &self,
        ty: QType,
        rows: usize,
        cols: usize,
        bytes: &QBytes,
    ) -> Result<Arc<dyn QStorage>>;
    /// `x @ w^T` (validated by `QTensor::qmatmul`: `w` and `x` on this device, `x` contiguous
    /// f32 `[t, w.cols()]` in any number of leading dims): one contiguous f32 storage of
    /// `t x w.rows()`, activations taken in `act` where the weight has integer kernels
    /// (`ActFormat::for_product`).
    fn qmatmul(&self, w: &QTensor, x: &Tensor, act: ActFormat) -> Result<Arc<dyn Storage>>;
}

/// A handle to a backend; cheap to clone. Two handles are the same device when their kinds are
/// equal.
#[derive(Clone)]
pub struct Device(Arc<dyn Backend>);

impl Device {
    pub fn new(backend: Arc<dyn Backend>) -> Device {
        Device(backend)
    }

    pub fn kind(&self) -> DeviceKind {
        self.0.kind()
    }

    pub fn backend(&self) -> &dyn Backend {
        &*self.0
    }

    pub fn same(&self, other: &Device) -> bool {
        self.kind() == other.kind()
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.kind())
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.kind())
    }
}
