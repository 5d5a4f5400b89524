//! ferrite-wgpu: the portable GPU backend (DESIGN.md, "Portable GPU (wgpu)"): every primitive
//! op as WGSL compute shaders on Vulkan, Metal or DX12 through wgpu.
//!
//! - Execution, implicit synchronization and uploads: `device.rs` (ops are recorded into a
//!   command batch and return at once; a host read waits for exactly the submission it needs).
//! - Memory: a caching buffer pool with CUDA's counters (`pool.rs`).
//! - Kernels: WGSL next to its wrapper (`elementwise.wgsl` by `elementwise.rs`, ...), one
//!   32-bit word per element, instantiated per dtype and compiled once per pipeline
//!   (`shader.rs` says how dtypes map to words).
//! - Errors found on the device (bad indices, integer division by zero): `errors.rs`.
//! - Quantized matrices (`QTensor`s in GGUF block formats) and their products:
//!   `qmatrix.rs` (storage, per-format WGSL modules), `qmatmul.rs` (the op).
//! - The LLM engine's fused kernels (norms, paged attention, the device sampler), which its
//!   wgpu kernel set records into its steps: `llm/` (`ops.wgsl` by `ops.rs`, ...).

mod attention;
mod channel_norm;
mod conv;
mod create;
mod device;
mod elementwise;
mod errors;
mod index;
pub mod llm;
mod matmul;
mod norm;
mod pool;
mod qmatmul;
pub mod qmatrix;
mod reduce;
mod scan;
mod shader;
mod storage;
mod util;

/// The wgpu crate this backend is built on, for kernel sets that record their own work on a
/// [`WgpuDevice`]'s device and queue (the LLM engine's, in ferrite-llm).
pub use ::wgpu as raw;
pub use device::{SyncStats, WgpuBackend};
pub use pool::MemoryStats;
pub use shader::SUBGROUP_MARK;
pub use storage::WgpuStorage;

use ferrite_core::{
    Backend, BinaryOp, DType, Device, DeviceKind, Error, HostBuffer, Layout, Op, ReduceOp, Result,
    Shape, Storage, Tensor,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

fn instance() -> &'static wgpu::Instance {
    static I: OnceLock<wgpu::Instance> = OnceLock::new();
    I.get_or_init(|| {
        // WGPU_BACKEND and friends may narrow the choice (wgpu's own variables).
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env())
    })
}

fn raw_adapters() -> &'static Vec<wgpu::Adapter> {
    static A: OnceLock<Vec<wgpu::Adapter>> = OnceLock::new();
    A.get_or_init(|| pollster::block_on(instance().enumerate_adapters(wgpu::Backends::all())))
}

/// What `ferrite devices` prints about one adapter.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    /// Index for `wgpu(i)` / `--device wgpu:i`.
    pub index: usize,
    pub name: String,
    /// "vulkan", "metal", "dx12".
    pub backend: String,
    /// "discrete", "integrated", "cpu", "virtual", "other".
    pub device_type: String,
    pub driver: String,
    /// The largest buffer the adapter allows, in bytes (wgpu reports no total memory).
    pub max_buffer_size: u64,
    pub max_storage_binding: u64,
    pub max_workgroup_storage: u32,
    pub shader_f16: bool,
    /// `unpack2x16float` in shaders (`DownlevelFlags::SHADER_F16_IN_F32`).
    pub f16_in_f32: bool,
    pub subgroups: bool,
    /// Every optional feature, as wgpu names them.
    pub features: String,
}

/// Every adapter wgpu finds on this machine (empty where there is no Vulkan, Metal or DX12).
pub fn adapters() -> Vec<AdapterSummary> {
    raw_adapters()
        .iter()
        .enumerate()
        .map(|(index, a)| {
            let info = a.get_info();
            let l = a.limits();
            let f = a.features();
            AdapterSummary {
                index,
                name: info.name.clone(),
                backend: info.backend.to_str().to_string(),
                device_type: match info.device_type {
                    wgpu::DeviceType::DiscreteGpu => "discrete",
                    wgpu::DeviceType::IntegratedGpu => "integrated",
                    wgpu::DeviceType::Cpu => "cpu",
                    wgpu::DeviceType::VirtualGpu => "virtual",
                    wgpu::DeviceType::Other => "other",
                }
                .to_string(),
                driver: format!("{} {}", info.driver, info.driver_info)
                    .trim()
                    .to_string(),
                max_buffer_size: l.max_buffer_size,
                max_storage_binding: l.max_storage_buffer_binding_size,
                max_workgroup_storage: l.max_compute_workgroup_storage_size,
                shader_f16: f.contains(wgpu::Features::SHADER_F16),
                f16_in_f32: a
                    .get_downlevel_capabilities()
                    .flags
                    .contains(wgpu::DownlevelFlags::SHADER_F16_IN_F32),
                subgroups: f.contains(wgpu::Features::SUBGROUP),
                features: format!("{f:?}"),
            }
        })
        .collect()
}

/// The adapter `--device wgpu` means: the first GPU (discrete before integrated), else the
/// first adapter of any kind (a CPU one such as lavapipe).
pub fn default_adapter() -> Option<usize> {
    let all = adapters();
    let rank = |t: &str| match t {
        "discrete" => 0,
        "integrated" => 1,
        "virtual" | "other" => 2,
        _ => 3,
    };
    all.iter()
        .min_by_key(|a| (rank(&a.device_type), a.index))
        .map(|a| a.index)
}

/// The first adapter of backend `name` ("vulkan", "metal", "dx12").
pub fn adapter_of_backend(name: &str) -> Option<usize> {
    let all = adapters();
    let rank = |t: &str| match t {
        "discrete" => 0,
        "integrated" => 1,
        _ => 2,
    };
    all.iter()
        .filter(|a| a.backend == name)
        .min_by_key(|a| (rank(&a.device_type), a.index))
        .map(|a| a.index)
}

/// The adapter a `--device` name picks: `wgpu` (the default adapter), `wgpu:N`, or a backend
/// name (`vulkan`, `metal`, `dx12`: the first adapter of that backend). `Ok(None)` for names
/// that are not wgpu's; an error listing what was found when the asked-for adapter is absent.
pub fn select(name: &str) -> Result<Option<usize>> {
    let missing = |what: &str| {
        Error::backend(
            "wgpu",
            format!("--device {name}: no {what}; found: {}", describe_adapters()),
        )
    };
    match name {
        "wgpu" => default_adapter()
            .map(Some)
            .ok_or_else(|| missing("wgpu adapter")),
        "vulkan" | "metal" | "dx12" => adapter_of_backend(name)
            .map(Some)
            .ok_or_else(|| missing(&format!("{name} adapter"))),
        _ => match name.strip_prefix("wgpu:") {
            Some(i) => match i.parse::<usize>() {
                Ok(i) if i < adapters().len() => Ok(Some(i)),
                Ok(i) => Err(missing(&format!("wgpu adapter {i}"))),
                Err(_) => Err(Error::backend(
                    "wgpu",
                    format!("--device {name}: expected wgpu:N with N an adapter index"),
                )),
            },
            None => Ok(None),
        },
    }
}

/// Whether any adapter exists.
pub fn is_available() -> bool {
    !raw_adapters().is_empty()
}

/// "adapter 0: NAME (vulkan, cpu)"-style lines, or a line saying there is none.
pub fn describe_adapters() -> String {
    let all = adapters();
    if all.is_empty() {
        return "no wgpu adapter (no Vulkan, Metal or DX12 driver was found)".to_string();
    }
    all.iter()
        .map(|a| {
            format!(
                "wgpu:{} {} ({}, {})",
                a.index, a.name, a.backend, a.device_type
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn registry() -> &'static Mutex<HashMap<usize, Arc<WgpuBackend>>> {
    static R: OnceLock<Mutex<HashMap<usize, Arc<WgpuBackend>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A wgpu device with the backend-specific API (counters, adapter facts). One per adapter per
/// process; cheap to clone.
#[derive(Clone)]
pub struct WgpuDevice(Arc<WgpuBackend>);

impl WgpuDevice {
    /// Adapter `index` (of `adapters()`), opened at first use with the adapter's own limits.
    pub fn new(index: usize) -> Result<WgpuDevice> {
        let mut r = registry().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = r.get(&index) {
            return Ok(WgpuDevice(b.clone()));
        }
        let Some(adapter) = raw_adapters().get(index) else {
            return Err(Error::backend(
                "wgpu",
                format!("no wgpu adapter {index}; found: {}", describe_adapters()),
            ));
        };
        let b = Arc::new(WgpuBackend::new(index, adapter)?);
        r.insert(index, b.clone());
        Ok(WgpuDevice(b))
    }

    /// The wgpu device behind a `Device`, if it is one.
    pub fn from_device(d: &Device) -> Option<WgpuDevice> {
        match d.kind() {
            DeviceKind::Wgpu(i) => registry()
                .lock()
                .ok()
                .and_then(|r| r.get(&i).cloned())
                .map(WgpuDevice),
            DeviceKind::Cpu | DeviceKind::Cuda(_) => None,
        }
    }

    /// The generic handle ops take.
    pub fn device(&self) -> Device {
        Device::new(Arc::new(Handle(self.0.clone())))
    }

    pub fn backend(&self) -> &WgpuBackend {
        &self.0
    }

    /// This device's adapter index (of `adapters()`).
    pub fn index(&self) -> usize {
        self.0.index
    }

    pub fn name(&self) -> &str {
        &self.0.info.name
    }

    /// "vulkan", "metal", "dx12".
    pub fn backend_name(&self) -> &'static str {
        self.0.info.backend.to_str()
    }

    /// Whether the adapter runs on the CPU (Mesa's lavapipe, WARP): kernels that size their
    /// workgroups to a GPU's width may take smaller ones there.
    pub fn is_cpu(&self) -> bool {
        self.0.info.device_type == wgpu::DeviceType::Cpu
    }

    /// The limits the device was opened with (the adapter's own).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.0.limits
    }

    /// The wgpu device, for kernel sets that record their own dispatches (the LLM engine's).
    /// Their buffers are their own: work on the device's queue is ordered with this
    /// backend's submitted batches, not with its open one.
    pub fn raw_device(&self) -> &wgpu::Device {
        &self.0.device
    }

    /// The queue of [`WgpuDevice::raw_device`].
    pub fn raw_queue(&self) -> &wgpu::Queue {
        &self.0.queue
    }

    /// The first asynchronous wgpu error reported on this device (validation, out of memory),
    /// as an error of `op`.
    pub fn check_errors(&self, op: &'static str) -> Result<()> {
        self.0.check(op)
    }

    pub fn memory_stats(&self) -> MemoryStats {
        self.0.memory_stats()
    }

    pub fn reset_peak_memory(&self) {
        self.0.pool.reset_peak()
    }

    /// Releases cached, unused buffers.
    pub fn empty_cache(&self) {
        self.0.empty_cache()
    }

    /// Caps the bytes the pool may reserve (tests of the out-of-memory path).
    pub fn set_memory_limit(&self, bytes: Option<usize>) {
        self.0.pool.set_limit(bytes)
    }

    /// Whether kernels may use subgroup operations where the adapter has them (the default);
    /// `false` runs the workgroup-memory fallbacks (tests compare both).
    pub fn use_subgroups(&self, on: bool) {
        self.0.set_subgroups(on);
    }

    /// Whether kernels use subgroup operations on this device.
    pub fn subgroups(&self) -> bool {
        self.0.subgroups()
    }

    /// Whether shaders use `unpack2x16float` and friends (f16 values held in f32s): where the
    /// adapter has them (`DownlevelFlags::SHADER_F16_IN_F32`; Vulkan on Mesa lacks them
    /// without `shader-f16`) unless turned off by [`WgpuDevice::use_f16_in_f32`].
    pub fn f16_in_f32(&self) -> bool {
        self.0.f16_unpack.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Turns the use of `unpack2x16float` on (where the adapter has it) or off (kernels
    /// compiled after this call read f16 fields with bit operations; tests compare both).
    pub fn use_f16_in_f32(&self, on: bool) {
        self.0.f16_unpack.store(
            on && self.0.f16_in_f32,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    pub fn sync_stats(&self) -> SyncStats {
        self.0.sync_stats()
    }

    /// Submits the ops recorded so far without waiting (benchmarks: to time the submission).
    pub fn flush(&self) {
        self.0.flush()
    }

    /// Waits for all queued work (benchmarks only; reads already wait for what they need).
    pub fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }
}

/// wgpu adapter `index` as a generic `Device`.
pub fn wgpu(index: usize) -> Result<Device> {
    Ok(WgpuDevice::new(index)?.device())
}

/// Every WGSL variant the backend can compile, the LLM kernels' modules included, as (file or
/// generated module, entry points, full source): what the naga test validates and translates
/// to MSL and SPIR-V. Sources that
/// use subgroup operations begin with [`SUBGROUP_MARK`]; those that call `unpack2x16float`
/// need `SHADER_F16_IN_F32`.
pub fn all_shader_sources() -> Result<Vec<(String, &'static [&'static str], String)>> {
    let mut out = Vec::new();
    for k in all_kernels() {
        for v in k.variants() {
            out.push((k.file.to_string(), k.entries, shader::source(k, &v)?));
        }
    }
    for (name, entries, src, _) in qmatrix::shader_sources() {
        out.push((name, entries, src));
    }
    out.extend(llm::shader_sources());
    Ok(out)
}

fn all_kernels() -> Vec<&'static shader::Kernel> {
    vec![
        &elementwise::ELEMENTWISE,
        &elementwise::CAST,
        &create::CREATE,
        &reduce::REDUCE,
        &matmul::MATMUL,
        &index::INDEX,
        &scan::SCAN,
        &norm::NORM,
        &conv::CONV,
        &attention::ATTENTION,
        &channel_norm::CHANNEL_NORM,
    ]
}

struct Handle(Arc<WgpuBackend>);

/// A backend output (one storage) as a contiguous tensor of `shape` on `like`'s device.
/// A norm backward's outputs with `acc` (x's shape and dtype) added to the first, dx.
fn add_to_first(
    dev: &WgpuBackend,
    mut outs: Vec<Arc<dyn Storage>>,
    acc: Option<&Tensor>,
    x: &Tensor,
) -> Result<Vec<Arc<dyn Storage>>> {
    if let (Some(acc), false) = (acc, outs.is_empty()) {
        let dx = as_tensor(vec![outs.remove(0)], x.shape(), x)?;
        let sum = elementwise::binary(dev, BinaryOp::Add, acc, &dx)?;
        outs.splice(0..0, sum);
    }
    Ok(outs)
}

pub(crate) fn as_tensor(s: Vec<Arc<dyn Storage>>, shape: &Shape, like: &Tensor) -> Result<Tensor> {
    let s = s
        .into_iter()
        .next()
        .ok_or_else(|| Error::backend("wgpu", "an op returned no output"))?;
    Ok(Tensor::from_storage(
        s,
        Layout::contiguous(shape.clone()),
        like.device().clone(),
    ))
}

impl Backend for Handle {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Wgpu(self.0.index)
    }

    fn capturing(&self) -> bool {
        false
    }

    fn upload(&self, data: HostBuffer) -> Result<Arc<dyn Storage>> {
        self.0.upload(&data)
    }

    fn to_host(&self, storage: &dyn Storage, layout: &Layout) -> Result<HostBuffer> {
        self.0.download(storage, layout)
    }

    fn write_into(&self, dst: &Tensor, src: &Tensor) -> Result<()> {
        elementwise::write_into(&self.0, dst, src)
    }

    fn sum_squares(&self, _tensors: &[Tensor]) -> Result<Arc<dyn Storage>> {
        Err(Error::backend(
            "sum_squares",
            "the wgpu backend has no fused optimizer kernels; optimizers on wgpu take their \
             composed implementation (tensor ops)",
        ))
    }

    fn step_scalars(&self, _s: &ferrite_core::optim::StepScalars<'_>) -> Result<Arc<dyn Storage>> {
        Err(Error::backend(
            "step_scalars",
            "the wgpu backend has no fused optimizer kernels; optimizers on wgpu take their \
             composed implementation (tensor ops)",
        ))
    }

    fn fused_update(&self, _update: &ferrite_core::optim::FusedUpdate<'_>) -> Result<()> {
        Err(Error::backend(
            "fused_update",
            "the wgpu backend has no fused optimizer kernels; optimizers on wgpu take their \
             composed implementation (tensor ops)",
        ))
    }

    fn upload_quant(
        &self,
        ty: ferrite_core::QType,
        rows: usize,
        cols: usize,
        bytes: &ferrite_core::QBytes,
    ) -> Result<Arc<dyn ferrite_core::QStorage>> {
        qmatmul::upload_quant(&self.0, ty, rows, cols, bytes)
    }

    fn qmatmul(
        &self,
        w: &ferrite_core::QTensor,
        x: &Tensor,
        act: ferrite_core::ActFormat,
    ) -> Result<Arc<dyn Storage>> {
        qmatmul::qmatmul(&self.0, w, x, act)
    }

    fn exec(
        &self,
        op: &Op,
        inputs: &[&Tensor],
        outs: &[(Shape, DType)],
    ) -> Result<Vec<Arc<dyn Storage>>> {
        let dev = &*self.0;
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
        for t in inputs {
            shader::word(name, t.dtype())?;
        }
        for (_, dt) in outs {
            shader::word(name, *dt)?;
        }
        match op {
            Op::Unary(u) => elementwise::unary(dev, *u, input(0)?),
            Op::Binary(b) => elementwise::binary(dev, *b, input(0)?, input(1)?),
            Op::Cmp(c) => elementwise::cmp(dev, *c, input(0)?, input(1)?),
            Op::Where => elementwise::where_cond(dev, input(0)?, input(1)?, input(2)?),
            Op::Reduce { op, axes } => reduce::reduce(dev, *op, input(0)?, axes),
            Op::Matmul => {
                let (shape, dt) = out(0)?;
                matmul::matmul_to(dev, input(0)?, input(1)?, None, shape, *dt)
            }
            Op::MatmulBias { acc } => {
                let (shape, dt) = out(0)?;
                let y = matmul::matmul_to(dev, input(0)?, input(1)?, Some(input(2)?), shape, *dt)?;
                match acc {
                    // The residual added after (rounded twice for a 16-bit output).
                    true => {
                        let acc = input(3)?;
                        let y = as_tensor(y, acc.shape(), acc)?;
                        elementwise::binary(dev, BinaryOp::Add, acc, &y)
                    }
                    false => Ok(y),
                }
            }
            Op::MatmulBiasGelu => {
                let (shape, dt) = out(0)?;
                matmul::matmul_bias_gelu(dev, input(0)?, input(1)?, input(2)?, shape, *dt)
            }
            Op::MatmulGeluBackward => {
                let (shape, _) = out(0)?;
                matmul::matmul_gelu_backward(dev, input(0)?, input(1)?, input(2)?, shape)
            }
            Op::Cast(dt) => elementwise::cast(dev, input(0)?, *dt),
            Op::CastColSums(dt) => {
                let x = input(0)?;
                let mut o = elementwise::cast(dev, x, *dt)?;
                o.extend(reduce::reduce(dev, ReduceOp::Sum, x, &[0])?);
                Ok(o)
            }
            Op::CastEach(dt) => {
                let mut o = Vec::with_capacity(inputs.len());
                for x in inputs {
                    o.extend(elementwise::cast(dev, x, *dt)?);
                }
                Ok(o)
            }
            Op::Copy => elementwise::contiguous(dev, input(0)?),
            Op::IndexSelect { axis } => index::index_select(dev, input(0)?, input(1)?, *axis),
            Op::Gather { axis } => index::gather(dev, input(0)?, input(1)?, *axis),
            Op::ScatterAdd { axis } => {
                index::scatter_add(dev, input(0)?, input(1)?, input(2)?, *axis)
            }
            Op::Cat { axis } => index::cat(dev, inputs, *axis, out(0)?),
            Op::Cumsum { axis } => scan::cumsum(dev, input(0)?, *axis),
            Op::Sort { axis, descending } => scan::sort(dev, input(0)?, *axis, *descending),
            Op::Softmax => norm::softmax(dev, input(0)?, false),
            Op::LogSoftmax => norm::softmax(dev, input(0)?, true),
            Op::SoftmaxBackward { log } => norm::softmax_backward(dev, input(0)?, input(1)?, *log),
            Op::LayerNorm { eps } => {
                let y = norm::layer_norm(dev, input(0)?, input(1)?, Some(input(2)?), *eps, false)?;
                // A 16-bit output of f32 rows: the f32 result rounded once.
                let (shape, dt) = out(0)?;
                match *dt == input(0)?.dtype() {
                    true => Ok(y),
                    false => elementwise::cast(dev, &as_tensor(y, shape, input(0)?)?, *dt),
                }
            }
            Op::RmsNorm { eps } => norm::layer_norm(dev, input(0)?, input(1)?, None, *eps, true),
            Op::LayerNormBackward { eps, acc } => {
                // A 16-bit gradient of f32 rows is read widened.
                let (x, g) = (input(0)?, input(2)?);
                let wide = match g.dtype() == x.dtype() {
                    true => None,
                    false => Some(as_tensor(
                        elementwise::cast(dev, g, x.dtype())?,
                        g.shape(),
                        g,
                    )?),
                };
                let o = norm::norm_backward(
                    dev,
                    x,
                    input(1)?,
                    wide.as_ref().unwrap_or(g),
                    *eps,
                    false,
                )?;
                add_to_first(dev, o, acc.then(|| input(3)).transpose()?, x)
            }
            Op::RmsNormBackward { eps, acc } => {
                let x = input(0)?;
                let o = norm::norm_backward(dev, x, input(1)?, input(2)?, *eps, true)?;
                add_to_first(dev, o, acc.then(|| input(3)).transpose()?, x)
            }
            Op::Rope { interleaved } => {
                norm::rope(dev, input(0)?, input(1)?, input(2)?, *interleaved)
            }
            Op::CrossEntropy {
                ignore_index,
                label_smoothing,
            } => norm::cross_entropy(
                dev,
                [input(0)?, input(1)?, input(2)?],
                *ignore_index,
                *label_smoothing,
            ),
            Op::CrossEntropyBackward {
                ignore_index,
                label_smoothing,
            } => norm::cross_entropy_backward(
                dev,
                [input(0)?, input(1)?, input(2)?, input(3)?, input(4)?],
                *ignore_index,
                *label_smoothing,
            ),
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
            // The saved output and lse (inputs after g) are not read: the row kernel
            // recomputes the probabilities.
            Op::AttentionBackward {
                causal,
                scale,
                key_mask,
                saved: _,
                packed,
            } => {
                let q = input(0)?;
                let grads = attention::attention_backward(
                    dev,
                    [
                        q,
                        input(1)?,
                        input(2)?,
                        input(if *key_mask { 4 } else { 3 })?,
                    ],
                    key_mask.then(|| input(3)).transpose()?,
                    *causal,
                    *scale,
                )?;
                if !packed {
                    return Ok(grads);
                }
                // [b, l, h, d] each -> one [b, l, 3, h, d].
                let d = q.dims();
                let rows = Shape::from(vec![d[0], d[2], 1, d[1] * d[3]]);
                let parts = grads
                    .into_iter()
                    .map(|g| as_tensor(vec![g], &rows, q))
                    .collect::<Result<Vec<Tensor>>>()?;
                let spec = (Shape::from(vec![d[0], d[2], 3, d[1] * d[3]]), q.dtype());
                index::cat(dev, &parts.iter().collect::<Vec<_>>(), 2, &spec)
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
                channel_norm::channel_norm(dev, input(0)?, input(1)?, input(2)?, None, *eps)
            }
            Op::BatchNormBackward { eps } => channel_norm::channel_norm_backward(
                dev,
                input(0)?,
                input(1)?,
                input(2)?,
                None,
                *eps,
            ),
            Op::GroupNorm { groups, eps } => channel_norm::channel_norm(
                dev,
                input(0)?,
                input(1)?,
                input(2)?,
                Some(*groups),
                *eps,
            ),
            Op::GroupNormBackward { groups, eps } => channel_norm::channel_norm_backward(
                dev,
                input(0)?,
                input(1)?,
                input(2)?,
                Some(*groups),
                *eps,
            ),
            Op::Fill { value } => create::fill(dev, *value, out(0)?),
            Op::Arange { start, step } => create::arange(dev, *start, *step, out(0)?),
            Op::RandUniform { seed, low, high } => {
                create::rand(dev, *seed, *low, *high, false, out(0)?)
            }
            Op::RandNormal { seed, mean, std } => {
                create::rand(dev, *seed, *mean, *std, true, out(0)?)
            }
        }
    }
}
