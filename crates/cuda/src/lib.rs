//! ferrite-cuda: the CUDA backend (DESIGN.md, "Execution model (CUDA)").
//!
//! - Every op enqueues on the device's compute stream and returns at once; its output records
//!   an event right after the producing work. Same-stream consumers need nothing; the copy
//!   stream (uploads, host reads) waits on that event; a host read waits for exactly it.
//! - Device memory comes from a caching allocator (`alloc.rs`) with counters.
//! - Kernels are CUDA C++ next to their wrappers (`elementwise.cu` by `elementwise.rs`, ...),
//!   compiled by NVRTC at first use and cached on disk (`kernels.rs`).
//! - Matmul goes through cuBLASLt (`matmul.rs`); CUDA graphs through `graph.rs`.
//! - Quantized matrices (`QTensor`): `GpuMatrix` (`qmatrix.rs`) and the LLM decode products
//!   over GGUF blocks (`matvec.cu` with `quant.cuh`, by `matvec.rs`), `qmatmul.rs` between
//!   them and the backend; the LLM crate's CUDA kernel set launches them through `step.rs`,
//!   with the fused LLM kernels of `llm/` (attention over the paged KV cache, norms, the
//!   large steps' helpers, the device sampler).
//! - The driver, NVRTC and cuBLASLt are loaded at run time: this crate builds and runs where
//!   there is no CUDA, and asking for a device there is an error ("no CUDA device").

mod alloc;
mod attention;
mod cast;
mod channel_norm;
mod conv;
mod create;
mod cross_entropy;
mod cudnn;
mod device;
mod driver;
mod elementwise;
mod graph;
mod index;
mod kernel_key;
mod kernels;
pub mod llm;
mod matmul;
pub mod matvec;
mod norm;
mod optim;
pub mod qmatmul;
pub mod qmatrix;
mod raw;
mod reduce;
mod scan;
pub mod step;
mod storage;

pub use alloc::MemoryStats;
pub use cudnn::{cudnn_version, ConvImpl, ConvStats};
pub use device::{CudaBackend, SyncStats};
pub use driver::driver_present;
pub use graph::{Graph, Recording};
pub use kernels::{
    all_sources, check_prebuilt, compile, compile_nvrtc, nvrtc_present, prebuilt, prebuilt_key,
    Cfg as LaunchConfig, KernelSource, Prebuilt,
};

/// The kernels compiled at build time (`build.rs`): one `&[Prebuilt]` per source.
mod prebuilt {
    include!(concat!(env!("OUT_DIR"), "/prebuilt.rs"));
}
pub use raw::{Buffer, KernelArgs, Mailbox};
pub use storage::CudaStorage;

use ferrite_core::{
    Backend, DType, Device, DeviceKind, Error, HostBuffer, Layout, Op, Result, Shape, Storage,
    Tensor,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

fn registry() -> &'static Mutex<HashMap<usize, Arc<CudaBackend>>> {
    static R: OnceLock<Mutex<HashMap<usize, Arc<CudaBackend>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Number of CUDA devices (0 where there is no driver).
pub fn device_count() -> usize {
    if !driver_present() {
        return 0;
    }
    if cudarc::driver::result::init().is_err() {
        return 0;
    }
    cudarc::driver::result::device::get_count()
        .map(|n| n as usize)
        .unwrap_or(0)
}

/// Whether at least one CUDA device can be used.
pub fn is_available() -> bool {
    device_count() > 0
}

/// A CUDA device with the backend-specific API (memory counters, graphs, timing). One per
/// ordinal per process; cheap to clone.
#[derive(Clone)]
pub struct CudaDevice(Arc<CudaBackend>);

impl CudaDevice {
    /// Device `ordinal`, initialized at first use. Errors: no driver, no device, bad index.
    pub fn new(ordinal: usize) -> Result<CudaDevice> {
        let mut r = registry().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = r.get(&ordinal) {
            return Ok(CudaDevice(b.clone()));
        }
        let b = Arc::new(CudaBackend::new(ordinal)?);
        r.insert(ordinal, b.clone());
        Ok(CudaDevice(b))
    }

    /// The CUDA device behind a `Device`, if it is one.
    pub fn from_device(d: &Device) -> Option<CudaDevice> {
        match d.kind() {
            DeviceKind::Cuda(i) => registry()
                .lock()
                .ok()
                .and_then(|r| r.get(&i).cloned())
                .map(CudaDevice),
            DeviceKind::Cpu | DeviceKind::Wgpu(_) => None,
        }
    }

    /// The generic handle ops take.
    pub fn device(&self) -> Device {
        Device::new(Arc::new(Handle(self.0.clone())))
    }

    pub fn backend(&self) -> &CudaBackend {
        &self.0
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// (major, minor) compute capability.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.0.cc
    }

    /// Which NVRTC release compiled (or will compile) this device's kernels, and when:
    /// "NVRTC 13.0, at build time (sm_90a)" or "NVRTC 13.5, at first use (sm_90)". The
    /// release shapes the kernels' code and speed, so benchmark reports carry it.
    pub fn kernel_compiler(&self) -> String {
        kernels::compiler(&self.0.kernels.arch)
    }

    pub fn memory_stats(&self) -> MemoryStats {
        self.0.memory_stats()
    }

    pub fn reset_peak_memory(&self) {
        self.0.alloc.reset_peak()
    }

    /// Returns cached, unused device memory to the driver.
    pub fn empty_cache(&self) -> Result<()> {
        self.0.bind()?;
        self.0.alloc.empty_cache()
    }

    /// Caps the bytes the allocator may reserve (tests of the out-of-memory path).
    pub fn set_memory_limit(&self, bytes: Option<usize>) {
        self.0.alloc.set_limit(bytes)
    }

    pub fn sync_stats(&self) -> SyncStats {
        self.0.sync_stats()
    }

    /// Waits for all queued work (benchmarks only; reads already wait for what they need).
    pub fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }

    /// Lets f32 matmuls use TF32 tensor cores (off by default).
    pub fn set_tf32(&self, on: bool) {
        self.0.tf32.store(on, std::sync::atomic::Ordering::Relaxed)
    }

    /// Which convolution implementation conv2d and its gradients use from now on
    /// (initially `FERRITE_CONV`: `auto`, `cudnn` or `im2col`; see docs/gpu.md).
    pub fn set_conv_impl(&self, imp: ConvImpl) {
        self.0.conv.lock().unwrap_or_else(|e| e.into_inner()).imp = imp;
    }

    pub fn conv_impl(&self) -> ConvImpl {
        self.0.conv_settings().imp
    }

    /// Convolution calls (conv2d and both gradients) by the path that ran them.
    pub fn conv_stats(&self) -> ConvStats {
        use std::sync::atomic::Ordering::Relaxed;
        ConvStats {
            cudnn: self.0.conv_cudnn_calls.load(Relaxed),
            im2col: self.0.conv_im2col_calls.load(Relaxed),
            direct: self.0.conv_direct_calls.load(Relaxed),
        }
    }

    /// Captures the work `f` enqueues into a CUDA graph (see `graph.rs`).
    pub fn capture<F>(&self, f: F) -> Result<Graph>
    where
        F: FnOnce() -> Result<Vec<Tensor>>,
    {
        graph::capture(&self.0, f)
    }

    /// Starts capturing the compute stream's work into a CUDA graph, as `capture` does for a
    /// closure, for work queued across several calls: [`Recording::finish`] ends it.
    pub fn record(&self) -> Result<Recording> {
        graph::record(&self.0)
    }

    /// Writes host data into a contiguous tensor of this device, in stream order.
    pub fn write(&self, dst: &Tensor, data: &HostBuffer) -> Result<()> {
        self.0.write(dst, data)
    }

    /// Milliseconds the device spends on the work `f` enqueues (timed with events).
    pub fn time_ms<F: FnOnce() -> Result<()>>(&self, f: F) -> Result<f32> {
        self.0.bind()?;
        let t = driver::Timer::new()?;
        t.start(&self.0.compute)?;
        f()?;
        t.stop_ms(&self.0.compute)
    }
}

/// CUDA device `ordinal` as a generic `Device`.
pub fn cuda(ordinal: usize) -> Result<Device> {
    Ok(CudaDevice::new(ordinal)?.device())
}

struct Handle(Arc<CudaBackend>);

impl Backend for Handle {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda(self.0.ctx.ordinal)
    }

    fn capturing(&self) -> bool {
        self.0.capturing.load(std::sync::atomic::Ordering::Acquire)
    }

    fn upload(&self, data: HostBuffer) -> Result<Arc<dyn Storage>> {
        self.0.upload_buffer(&data)
    }

    fn to_host(&self, storage: &dyn Storage, layout: &Layout) -> Result<HostBuffer> {
        self.0.download(storage, layout)
    }

    fn write_into(&self, dst: &Tensor, src: &Tensor) -> Result<()> {
        self.0.bind()?;
        elementwise::write_into(&self.0, dst, src)
    }

    fn sum_squares(&self, tensors: &[Tensor]) -> Result<Arc<dyn Storage>> {
        self.0.bind()?;
        optim::sum_squares(&self.0, tensors)?
            .pop()
            .ok_or_else(|| Error::backend("sum_squares", "no output"))
    }

    fn step_scalars(&self, s: &ferrite_core::optim::StepScalars<'_>) -> Result<Arc<dyn Storage>> {
        self.0.bind()?;
        optim::step_scalars(&self.0, s)?
            .pop()
            .ok_or_else(|| Error::backend("step_scalars", "no output"))
    }

    fn fused_update(&self, update: &ferrite_core::optim::FusedUpdate<'_>) -> Result<()> {
        self.0.bind()?;
        optim::fused_update(&self.0, update)
    }

    fn upload_quant(
        &self,
        ty: ferrite_core::QType,
        rows: usize,
        cols: usize,
        bytes: &ferrite_core::QBytes,
    ) -> Result<Arc<dyn ferrite_core::QStorage>> {
        qmatmul::upload_quant(&CudaDevice(self.0.clone()), ty, rows, cols, bytes)
    }

    fn qmatmul(
        &self,
        w: &ferrite_core::QTensor,
        x: &Tensor,
        act: ferrite_core::ActFormat,
    ) -> Result<Arc<dyn Storage>> {
        qmatmul::qmatmul(&CudaDevice(self.0.clone()), w, x, act)
    }

    fn exec(
        &self,
        op: &Op,
        inputs: &[&Tensor],
        outs: &[(Shape, DType)],
    ) -> Result<Vec<Arc<dyn Storage>>> {
        let dev = &*self.0;
        dev.bind()?;
        let name = op.name();
        let out = |i: usize| {
            outs.get(i)
                .ok_or_else(|| Error::backend(name, "missing output spec"))
        };
        let input = |i: usize| {
            inputs
                .get(i)
                .copied()
                .ok_or_else(|| Error::backend(name, "missing input"))
        };
        match op {
            Op::Unary(u) => elementwise::unary(dev, *u, input(0)?),
            Op::Binary(b) => elementwise::binary(dev, *b, input(0)?, input(1)?),
            Op::Cmp(c) => elementwise::cmp(dev, *c, input(0)?, input(1)?),
            Op::Where => elementwise::where_cond(dev, input(0)?, input(1)?, input(2)?),
            Op::Reduce { op, axes } => reduce::reduce(dev, *op, input(0)?, axes),
            Op::Matmul => {
                let (shape, dt) = out(0)?;
                matmul::matmul(dev, input(0)?, input(1)?, None, None, shape, *dt)
            }
            Op::MatmulBias { acc } => {
                let (shape, dt) = out(0)?;
                let acc = acc.then(|| input(3)).transpose()?;
                matmul::matmul(dev, input(0)?, input(1)?, Some(input(2)?), acc, shape, *dt)
            }
            Op::MatmulBiasGelu => {
                let (shape, dt) = out(0)?;
                matmul::matmul_bias_gelu(dev, input(0)?, input(1)?, input(2)?, shape, *dt)
            }
            Op::MatmulGeluBackward => {
                let (shape, _) = out(0)?;
                matmul::matmul_gelu_backward(dev, input(0)?, input(1)?, input(2)?, shape)
            }
            Op::Cast(dt) => cast::cast(dev, input(0)?, *dt),
            Op::CastColSums(dt) => reduce::cast_col_sums(dev, input(0)?, *dt),
            Op::CastEach(dt) => cast::cast_each(dev, inputs, *dt),
            Op::Copy => elementwise::contiguous(dev, input(0)?),
            Op::IndexSelect { axis } => index::index_select(dev, input(0)?, input(1)?, *axis),
            Op::Gather { axis } => index::gather(dev, input(0)?, input(1)?, *axis),
            Op::ScatterAdd { axis } => {
                index::scatter_add(dev, input(0)?, input(1)?, input(2)?, *axis)
            }
            Op::Cat { axis } => index::cat(dev, inputs, *axis),
            Op::Cumsum { axis } => scan::cumsum(dev, input(0)?, *axis),
            Op::Sort { axis, descending } => scan::sort(dev, input(0)?, *axis, *descending),
            Op::Softmax => norm::softmax(dev, input(0)?, false),
            Op::LogSoftmax => norm::softmax(dev, input(0)?, true),
            Op::CrossEntropy {
                ignore_index,
                label_smoothing,
            } => cross_entropy::cross_entropy(
                dev,
                [input(0)?, input(1)?, input(2)?],
                *ignore_index,
                *label_smoothing,
            ),
            Op::CrossEntropyBackward {
                ignore_index,
                label_smoothing,
            } => cross_entropy::cross_entropy_backward(
                dev,
                [input(0)?, input(1)?, input(2)?, input(3)?, input(4)?],
                *ignore_index,
                *label_smoothing,
            ),
            Op::LayerNorm { eps } => {
                norm::layer_norm(dev, input(0)?, input(1)?, input(2)?, *eps, out(0)?.1)
            }
            Op::RmsNorm { eps } => norm::rms_norm(dev, input(0)?, input(1)?, *eps),
            Op::Rope { interleaved } => {
                norm::rope(dev, input(0)?, input(1)?, input(2)?, *interleaved)
            }
            Op::Attention {
                causal,
                scale,
                key_mask,
            } => attention::attention(
                dev,
                input(0)?,
                input(1)?,
                input(2)?,
                key_mask.then(|| input(3)).transpose()?,
                *causal,
                *scale,
                outs.len() == 2,
            ),
            Op::SoftmaxBackward { log } => norm::softmax_backward(dev, input(0)?, input(1)?, *log),
            Op::RmsNormBackward { eps, acc } => norm::rms_norm_backward(
                dev,
                [input(0)?, input(1)?, input(2)?],
                acc.then(|| input(3)).transpose()?,
                *eps,
            ),
            Op::LayerNormBackward { eps, acc } => norm::layer_norm_backward(
                dev,
                [input(0)?, input(1)?, input(2)?],
                acc.then(|| input(3)).transpose()?,
                *eps,
            ),
            Op::AttentionBackward {
                causal,
                scale,
                key_mask,
                saved,
                packed,
            } => {
                let gi = if *key_mask { 4 } else { 3 };
                attention::attention_backward(
                    dev,
                    [input(0)?, input(1)?, input(2)?, input(gi)?],
                    key_mask.then(|| input(3)).transpose()?,
                    saved
                        .then(|| Ok::<_, Error>((input(gi + 1)?, input(gi + 2)?)))
                        .transpose()?,
                    *causal,
                    *scale,
                    *packed,
                )
            }
            Op::Conv2d(p) => conv::conv2d(dev, input(0)?, input(1)?, p, &out(0)?.0),
            Op::ConvTranspose2d(p) => {
                conv::conv_transpose2d(dev, input(0)?, input(1)?, p, &out(0)?.0)
            }
            Op::Conv2dBackwardWeight(p) => {
                conv::conv2d_backward_weight(dev, input(0)?, input(1)?, p, &out(0)?.0)
            }
            Op::MaxPool2d(p) => conv::max_pool2d(dev, input(0)?, Some(p), &out(0)?.0),
            Op::AdaptiveMaxPool2d => conv::max_pool2d(dev, input(0)?, None, &out(0)?.0),
            Op::BatchNorm { eps } => {
                channel_norm::batch_norm(dev, input(0)?, input(1)?, input(2)?, *eps)
            }
            Op::BatchNormBackward { eps } => {
                channel_norm::batch_norm_backward(dev, input(0)?, input(1)?, input(2)?, *eps)
            }
            Op::GroupNorm { groups, eps } => {
                channel_norm::group_norm(dev, input(0)?, input(1)?, input(2)?, *groups, *eps)
            }
            Op::GroupNormBackward { groups, eps } => channel_norm::group_norm_backward(
                dev,
                input(0)?,
                input(1)?,
                input(2)?,
                *groups,
                *eps,
            ),
            Op::Fill { value } => create::fill(dev, *value, out(0)?),
            Op::Arange { start, step } => create::arange(dev, *start, *step, out(0)?),
            Op::RandUniform { seed, low, high } => {
                create::rand(dev, name, *seed, *low, *high, false, out(0)?)
            }
            Op::RandNormal { seed, mean, std } => {
                create::rand(dev, name, *seed, *mean, *std, true, out(0)?)
            }
        }
    }
}
