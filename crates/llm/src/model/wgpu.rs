//! The wgpu kernel set of the model definition ([`super::step`]): WGSL compute shaders on
//! any wgpu adapter (Vulkan, Metal, DX12; Mesa's lavapipe on the CPU).
//!
//! Activations are f32, or 8-bit in the q8 precision (the CUDA kernel set's rule where none
//! was chosen: q8 above 1 GiB of weights): there each product of Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0, Q4_K or Q6_K weights takes its input quantized by a `quantize_q8` dispatch of its
//! own, in the CPU's blocks (32 values, an f32 scale), and sums integer dot products
//! (`dot4I8Packed`). Where the product has an RMS norm, the blocks hold the input times the
//! norm weights and the product applies the row's 1 / rms to its sums (from the blocks' sums
//! of squares): no dispatch sums a whole row.
//!
//! - [`WgpuModel`] holds the weight matrices as wgpu `QTensor`s (`ferrite_wgpu::qmatrix`:
//!   GGUF blocks read by the shaders as `array<u32>`, split by rows over as many buffers as
//!   the adapter's largest storage binding needs; q, k, v stacked and gate/up interleaved
//!   where they share a type), norms as f32. Everything is checked against the adapter's
//!   limits before the first upload.
//! - [`WgpuKernels`] records a step's dispatches as the definition calls its kernels and
//!   submits them in chunks of `CHUNK_DISPATCHES` (a command buffer and a compute pass
//!   each, the last at `logits`): products (ferrite-wgpu's `matvec.wgsl` and
//!   `quantize_q8.wgsl`, a workgroup per 4 output rows and up to 8 activation rows), norms,
//!   the gated unit and greedy argmax (ferrite-wgpu's `llm/ops.wgsl`), RoPE, the KV append
//!   and causal attention over the paged cache in one kernel, split over workgroups for long
//!   rows (`llm/paged.wgsl`). The host waits only when it reads the step's tokens or logits
//!   (or, with `FERRITE_WGPU_PROFILE`, the timestamps).
//!   Each step's picks are copied to a readback buffer of their own, so a decode loop can
//!   submit step n + 1, whose input is step n's pick still on the device (`PREV_TOKEN`),
//!   before it waits for step n's token (`queue_tokens`, `take_tokens`): the device works
//!   while the host records.
//! - Device sampling (ferrite-wgpu's `llm/sample.wgsl`, the CPU sampler's operations in its
//!   order, as CUDA's `sample.cu`): requests that sample get a sampler state on the device
//!   (`add_sampler`: settings, draw counter, a ring of the last `penalty_last_n` history
//!   tokens), and after a step one `sample_rows` dispatch draws their rows' tokens into the
//!   step's picks, which replace the greedy ones: a sampled step reads back only token ids.
//! - [`WgpuKvStore`]: f32 keys and values, `[block][layer][kv_head][16][head_dim]` each.
//!
//! A step's data (tokens, each row's position and block table, the logit rows, RoPE angles
//! computed on the host as the CPU kernel set computes them) goes to the device in two
//! writes at `begin`; dispatch parameters in one buffer at aligned offsets.
//!
//! Every kernel is ferrite-wgpu's: the products and their modules (`ferrite_wgpu::qmatrix`,
//! which the backend's `qmatmul` runs too) and the fused LLM kernels (`ferrite_wgpu::llm`,
//! each a [`Dispatch`] of given buffers); this kernel set records them into its own steps.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;

use ferrite_core::quant::{join_rows, QBytes, QTensor, RowOrder};
use ferrite_core::SamplerSettings;
use ferrite_wgpu::llm::sample::{self, SampleRow, SamplerArena};
use ferrite_wgpu::llm::{self as kernels, ops, paged, zeros, Dispatch};
use ferrite_wgpu::qmatrix::{self, Format, WgpuQMat};
use ferrite_wgpu::raw as wgpu;
use ferrite_wgpu::WgpuDevice;

use super::config::Config;
use super::step::{Batch, Buf, Glu, Kernels, Mat, Norm, PREV_TOKEN};
use super::{rope_inv_freq, Model, Precision, Weight};
use crate::engine::{Engine, EngineConfig, EngineKernels};
use crate::error::{Error, Result};
use crate::kv_cache::{BlockId, KvStore, BLOCK_SIZE};
use crate::sampler::SamplerConfig;
use ferrite_cpu::llm::rope::rope_table;

// The paged kernel's cache blocks are the engine's.
const _: () = assert!(paged::BLOCK_SLOTS == BLOCK_SIZE);

fn err(msg: impl Into<String>) -> Error {
    Error::Other(format!("wgpu kernels: {}", msg.into()))
}

/// A weight matrix on the device: a wgpu `QTensor` (its rows in chunks of the largest
/// storage binding, `ferrite_wgpu::qmatrix`) and its bias.
struct WMat {
    q: QTensor,
    bias: Option<wgpu::Buffer>,
}

impl WMat {
    fn rows(&self) -> usize {
        self.q.rows()
    }
    fn cols(&self) -> usize {
        self.q.cols()
    }
    fn m(&self) -> Result<&WgpuQMat> {
        WgpuQMat::of(&self.q, "wgpu kernels").map_err(werr)
    }
}

/// A ferrite-wgpu error as this module's.
fn werr(e: ferrite_core::Error) -> Error {
    err(e.to_string())
}

/// A storage buffer holding `v`, padded to whole words plus one.
fn upload_f32(dev: &wgpu::Device, label: &str, v: &[f32]) -> Result<wgpu::Buffer> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    qmatrix::upload_bytes(dev, label, &bytes).map_err(werr)
}

/// The q, k and v matrices: stacked (rows of q, then k, then v: one product into the
/// step's q|k|v rows) where they share a type and all or none have biases, else apart.
enum Qkv {
    Fused(WMat),
    Split(Box<[WMat; 3]>),
}

/// The gate and up matrices: interleaved (row 2i gate row i, row 2i + 1 up row i: one
/// product with the gated unit in its epilogue) where they share a type, else apart.
enum Ffn {
    Fused(WMat),
    Split { gate: WMat, up: WMat },
}

struct WLayer {
    attn_norm: wgpu::Buffer,
    qkv: Qkv,
    wo: WMat,
    q_norm: Option<wgpu::Buffer>,
    k_norm: Option<wgpu::Buffer>,
    post_attn_norm: Option<wgpu::Buffer>,
    ffn_norm: wgpu::Buffer,
    ffn: Ffn,
    w_down: WMat,
    post_ffn_norm: Option<wgpu::Buffer>,
}

/// A model's weights on a wgpu device (see the module docs).
pub struct WgpuModel {
    dev: WgpuDevice,
    pub cfg: Config,
    tok_embd: WMat,
    /// None: tied to the embedding.
    output: Option<WMat>,
    output_norm: wgpu::Buffer,
    layers: Vec<WLayer>,
    rope_freq_factors: Option<Vec<f32>>,
    /// Bound where a product has no bias.
    dummy: wgpu::Buffer,
    weight_bytes: usize,
    /// Products of quantized weights take 8-bit activations (the q8 precision).
    q8: bool,
    max_binding: u64,
    /// Pipelines compiled by any kernel set of this model, shared by the later ones (a
    /// session or engine compiles each entry point once per model, not once per session).
    pipes: Mutex<HashMap<(Module, &'static str), Pipe>>,
}

impl WgpuModel {
    /// Uploads `m`'s weights to `dev`. Every tensor is checked first (a type without a
    /// kernel, a row larger than the adapter's largest storage binding, a head_dim over 256
    /// or not a multiple of 4): a refusal names the tensor, its size and the limit before any
    /// upload.
    pub fn new(m: &Model, dev: &WgpuDevice) -> Result<WgpuModel> {
        WgpuModel::load(m, dev, true, None)
    }

    /// [`WgpuModel::new`]; `fuse` false keeps q, k, v and gate, up apart even where they
    /// share a type (separate products and a separate gated-unit pass: the path of mixed
    /// types); `weight_binding` splits weights by a smaller largest binding than the
    /// adapter's (tests of the split path and of refusals on any adapter).
    pub fn load(
        m: &Model,
        dev: &WgpuDevice,
        fuse: bool,
        weight_binding: Option<u64>,
    ) -> Result<WgpuModel> {
        let c = &m.cfg;
        let lim = dev.limits();
        let max_binding = qmatrix::max_binding(lim);
        let weight_max = weight_binding.map_or(max_binding, |b| b.min(max_binding));
        paged::check_heads(c.head_dim, c.n_head, c.n_kv_head).map_err(werr)?;
        if lim.max_storage_buffers_per_shader_stage < 8 {
            return Err(err(format!(
                "adapter {} binds {} storage buffers per shader stage; the kernels need 8",
                dev.name(),
                lim.max_storage_buffers_per_shader_stage
            )));
        }
        let tied = m.output.info.name == m.tok_embd.info.name;
        let mut all: Vec<&Weight> = vec![&m.tok_embd];
        if !tied {
            all.push(&m.output);
        }
        for l in &m.layers {
            all.extend([&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
        }
        let plan = |name: &str, ty, rows, cols, pairs| {
            qmatrix::plan_chunks(name, ty, rows, cols, pairs, weight_max).map_err(werr)
        };
        for w in &all {
            plan(&w.info.name, w.info.ty, w.rows(), w.cols(), false)?;
        }
        let fused = |l: &super::Layer| fuse && l.w_gate.info.ty == l.w_up.info.ty;
        let stacked = |l: &super::Layer| {
            let biases = [&l.bq, &l.bk, &l.bv].map(|b| b.is_some());
            fuse && l.wq.info.ty == l.wk.info.ty
                && l.wq.info.ty == l.wv.info.ty
                && (biases == [true; 3] || biases == [false; 3])
        };
        for l in m.layers.iter().filter(|l| stacked(l)) {
            let rows = l.wq.rows() + l.wk.rows() + l.wv.rows();
            plan(&l.wq.info.name, l.wq.info.ty, rows, l.wq.cols(), false)?;
        }
        for l in m.layers.iter().filter(|l| fused(l)) {
            let w = &l.w_gate;
            plan(&w.info.name, w.info.ty, 2 * w.rows(), w.cols(), true)?;
        }
        let d = dev.raw_device();
        let mut weight_bytes = 0usize;
        // `parts` (weights of one type and width) as one matrix: as they are (one part),
        // stacked, or with their rows interleaved (gate/up row pairs); its host bytes are
        // the file's, joined only where something reads them.
        let mut upload = |parts: &[&Weight], order: RowOrder, bias: Option<Vec<f32>>| {
            let w0 = parts[0];
            let rows = parts.iter().map(|w| w.rows()).sum();
            let files: Vec<&[u8]> = parts.iter().map(|w| m.file.tensor_data(&w.info)).collect();
            let row_bytes = files[0].len() / w0.rows().max(1);
            let data = match parts.len() {
                1 => Cow::Borrowed(files[0]),
                _ => Cow::Owned(join_rows(&files, row_bytes, order)),
            };
            weight_bytes += data.len();
            let name = &w0.info.name;
            let pairs = order == RowOrder::Interleaved;
            let q = WgpuQMat::upload(
                d,
                name,
                w0.info.ty,
                (rows, w0.cols()),
                &data,
                pairs,
                weight_max,
            )
            .map_err(werr)?;
            let host = parts
                .iter()
                .map(|w| m.tensor_bytes(&w.info.name))
                .collect::<Result<Vec<_>>>()?;
            let host = match host.len() {
                1 => host.into_iter().next().expect("one part"),
                _ => QBytes::join(host, row_bytes, order),
            };
            Ok::<_, Error>(WMat {
                q: WgpuQMat::qtensor(dev, q, host).map_err(werr)?,
                bias: bias.map(|b| upload_f32(d, "bias", &b)).transpose()?,
            })
        };
        let one = RowOrder::Stacked;
        let tok_embd = upload(&[&m.tok_embd], one, None)?;
        let output = if tied {
            None
        } else {
            Some(upload(&[&m.output], one, None)?)
        };
        let mut layers = Vec::with_capacity(m.layers.len());
        for l in &m.layers {
            layers.push(WLayer {
                attn_norm: upload_f32(d, "norm", &l.attn_norm)?,
                qkv: if stacked(l) {
                    let bias: Option<Vec<f32>> = match (&l.bq, &l.bk, &l.bv) {
                        (Some(a), Some(b), Some(c)) => Some([&a[..], b, c].concat()),
                        _ => None,
                    };
                    Qkv::Fused(upload(&[&l.wq, &l.wk, &l.wv], one, bias)?)
                } else {
                    Qkv::Split(Box::new([
                        upload(&[&l.wq], one, l.bq.clone())?,
                        upload(&[&l.wk], one, l.bk.clone())?,
                        upload(&[&l.wv], one, l.bv.clone())?,
                    ]))
                },
                wo: upload(&[&l.wo], one, None)?,
                q_norm: l
                    .q_norm
                    .as_ref()
                    .map(|v| upload_f32(d, "norm", v))
                    .transpose()?,
                k_norm: l
                    .k_norm
                    .as_ref()
                    .map(|v| upload_f32(d, "norm", v))
                    .transpose()?,
                post_attn_norm: l
                    .post_attn_norm
                    .as_ref()
                    .map(|v| upload_f32(d, "norm", v))
                    .transpose()?,
                ffn_norm: upload_f32(d, "norm", &l.ffn_norm)?,
                ffn: if fused(l) {
                    Ffn::Fused(upload(&[&l.w_gate, &l.w_up], RowOrder::Interleaved, None)?)
                } else {
                    Ffn::Split {
                        gate: upload(&[&l.w_gate], one, None)?,
                        up: upload(&[&l.w_up], one, None)?,
                    }
                },
                w_down: upload(&[&l.w_down], one, None)?,
                post_ffn_norm: l
                    .post_ffn_norm
                    .as_ref()
                    .map(|v| upload_f32(d, "norm", v))
                    .transpose()?,
            });
        }
        let output_norm = upload_f32(d, "norm", &m.output_norm)?;
        // The CUDA kernel set's rule where none was chosen: f32 activations up to 1 GiB of
        // weights, 8-bit above (where bandwidth decides); q8x2 means f32 here.
        let precision = if m.precision_is_explicit() {
            m.precision()
        } else {
            crate::gpu::default_precision(weight_bytes)
        };
        // Bound where a product has no bias or no norm (16 bytes: one vec4).
        let dummy = zeros(d, "no bias", 16);
        dev.check_errors("wgpu model upload")
            .map_err(|e| err(e.to_string()))?;
        Ok(WgpuModel {
            dev: dev.clone(),
            cfg: c.clone(),
            tok_embd,
            output,
            output_norm,
            layers,
            rope_freq_factors: m.rope_freq_factors.clone(),
            dummy,
            weight_bytes,
            q8: precision == Precision::Q8,
            max_binding,
            pipes: Mutex::new(HashMap::new()),
        })
    }

    pub fn device(&self) -> &WgpuDevice {
        &self.dev
    }

    /// Bytes of weight blocks on the device.
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// The products' activations: `Q8` (8-bit, for quantized weights) or `Exact` (f32).
    pub fn precision(&self) -> Precision {
        if self.q8 {
            Precision::Q8
        } else {
            Precision::Exact
        }
    }

    /// A buffer size check against the adapter's largest storage binding.
    fn check_binding(&self, what: &str, bytes: usize) -> Result<()> {
        if bytes as u64 > self.max_binding {
            return Err(err(format!(
                "{what} needs {bytes} bytes, more than the adapter's largest storage binding \
                 ({} bytes on {})",
                self.max_binding,
                self.dev.name()
            )));
        }
        Ok(())
    }
}

/// Keys and values of the paged cache on a wgpu device: f32
/// `[block][layer][kv_head][BLOCK_SIZE][head_dim]` each (one block, all layers, is one range).
pub struct WgpuKvStore {
    dev: WgpuDevice,
    kc: wgpu::Buffer,
    vc: wgpu::Buffer,
    /// One block, for copy-on-write.
    tmp: wgpu::Buffer,
    n_blocks: usize,
    block_bytes: usize,
}

impl WgpuKvStore {
    /// `n_blocks` blocks for `m`'s layers; refused (naming both sizes) where keys or values
    /// would exceed the adapter's largest storage binding.
    pub fn new(m: &WgpuModel, n_blocks: usize) -> Result<WgpuKvStore> {
        let c = &m.cfg;
        let block_bytes = c.n_layer * c.n_kv_head * BLOCK_SIZE * c.head_dim * 4;
        let total = block_bytes
            .checked_mul(n_blocks)
            .filter(|_| n_blocks > 0 && n_blocks <= u32::MAX as usize)
            .ok_or_else(|| {
                err(format!(
                    "KV cache: {n_blocks} blocks of {block_bytes} bytes is not a valid size"
                ))
            })?;
        m.check_binding(
            &format!("the KV cache ({n_blocks} blocks of {block_bytes} bytes, keys or values)"),
            total,
        )?;
        let d = m.dev.raw_device();
        Ok(WgpuKvStore {
            dev: m.dev.clone(),
            kc: zeros(d, "kv cache keys", total),
            vc: zeros(d, "kv cache values", total),
            tmp: zeros(d, "kv cache block copy", block_bytes),
            n_blocks,
            block_bytes,
        })
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Device bytes of keys and values together.
    pub fn bytes(&self) -> usize {
        2 * self.n_blocks * self.block_bytes
    }
}

impl KvStore for WgpuKvStore {
    fn copy_block(&mut self, src: BlockId, dst: BlockId) -> Result<()> {
        let (s, t) = (src as usize, dst as usize);
        if s >= self.n_blocks || t >= self.n_blocks {
            return Err(err(format!(
                "copy_block: block {src} or {dst} outside the cache of {} blocks",
                self.n_blocks
            )));
        }
        let b = self.block_bytes as u64;
        let mut enc = self
            .dev
            .raw_device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        // A copy within one buffer is not allowed: through the one-block scratch.
        for c in [&self.kc, &self.vc] {
            enc.copy_buffer_to_buffer(c, s as u64 * b, &self.tmp, 0, b);
            enc.copy_buffer_to_buffer(&self.tmp, 0, c, t as u64 * b, b);
        }
        self.dev.raw_queue().submit([enc.finish()]);
        Ok(())
    }
}

/// What a product does with its sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Epilogue {
    Store,
    /// `y += sums` (the residual stream).
    Add,
    /// Rows 2i, 2i + 1 are gate and up of unit i: `y[i] = act(gate) * up`.
    Glu(Glu),
}

/// A compiled entry point and what the profile calls it (`matvec q4_0 x8`, `attention`).
#[derive(Clone)]
struct Pipe {
    p: kernels::Pipeline,
    name: String,
}

/// Timestamps most dispatches of a step get in the profile (two queries each; wgpu allows
/// 4,096 queries per set).
const PROFILED_DISPATCHES: usize = 2048;

/// The per-dispatch GPU profile (`FERRITE_WGPU_PROFILE=1`, on adapters with timestamps inside
/// passes): a timestamp before and after every dispatch of a step, read back after the step
/// (a host wait per step: profiling only) and summed by kernel; printed to stderr when the
/// kernel set is dropped.
struct Profile {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// Nanoseconds per timestamp tick.
    period: f64,
    /// Kernel name -> (nanoseconds, dispatches).
    totals: HashMap<String, (f64, u64)>,
    steps: u64,
    /// Sum over steps of each step's first-to-last timestamp.
    span_ns: f64,
    /// Host nanoseconds spent recording and submitting the steps' dispatches.
    host_ns: f64,
}

impl Profile {
    /// A profile where `FERRITE_WGPU_PROFILE` is set (not `0`); none where it is not, or
    /// where the device cannot time dispatches (a note on stderr says why).
    fn from_env(dev: &WgpuDevice) -> Option<Profile> {
        let on = std::env::var("FERRITE_WGPU_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0");
        if !on {
            return None;
        }
        Profile::new(dev)
            .map_err(|e| eprintln!("FERRITE_WGPU_PROFILE: {e}; no profile"))
            .ok()
    }

    /// Errors where the device has no timestamp queries inside passes.
    fn new(dev: &WgpuDevice) -> Result<Profile> {
        let need = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        let d = dev.raw_device();
        if !d.features().contains(need) {
            return Err(err(format!(
                "profile: {} has no timestamp queries inside compute passes",
                dev.name()
            )));
        }
        let n = 2 * PROFILED_DISPATCHES as u64;
        Ok(Profile {
            queries: d.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("llm profile"),
                ty: wgpu::QueryType::Timestamp,
                count: n as u32,
            }),
            resolve: d.create_buffer(&wgpu::BufferDescriptor {
                label: Some("llm profile resolve"),
                size: n * 8,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            readback: d.create_buffer(&wgpu::BufferDescriptor {
                label: Some("llm profile readback"),
                size: n * 8,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            period: f64::from(dev.raw_queue().get_timestamp_period()),
            totals: HashMap::new(),
            steps: 0,
            span_ns: 0.0,
            host_ns: 0.0,
        })
    }

    /// Adds the `names.len()` dispatches just timed (waits for them): a step's (`new_step`),
    /// or the device sampler's after it, which count as part of that step.
    fn collect(&mut self, d: &wgpu::Device, names: &[String], new_step: bool) -> Result<()> {
        let n = names.len();
        if n == 0 {
            return Ok(());
        }
        let bytes = (2 * n * 8) as u64;
        let (tx, rx) = std::sync::mpsc::channel();
        self.readback
            .map_async(wgpu::MapMode::Read, 0..bytes, move |r| {
                let _ = tx.send(r);
            });
        d.poll(wgpu::PollType::Wait {
            submission_index: None,
            timeout: None,
        })
        .map_err(|e| err(format!("profile: waiting for the device: {e}")))?;
        match rx.recv() {
            Ok(Ok(())) => {}
            _ => return Err(err("profile: mapping the timestamps failed")),
        }
        let ticks: Vec<u64> = {
            let view = self
                .readback
                .get_mapped_range(0..bytes)
                .map_err(|e| err(format!("profile: mapping: {e}")))?;
            view.chunks_exact(8)
                .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect()
        };
        self.readback.unmap();
        for (i, name) in names.iter().enumerate() {
            let dt = ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * self.period;
            let e = self.totals.entry(name.clone()).or_insert((0.0, 0));
            e.0 += dt;
            e.1 += 1;
        }
        self.span_ns += ticks[2 * n - 1].saturating_sub(ticks[0]) as f64 * self.period;
        self.steps += u64::from(new_step);
        Ok(())
    }

    /// The summary: each kernel's share of the dispatch time, per step.
    fn report(&self) -> String {
        let steps = self.steps.max(1) as f64;
        let busy: f64 = self.totals.values().map(|v| v.0).sum();
        let mut rows: Vec<_> = self.totals.iter().collect();
        rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
        let mut out = format!(
            "wgpu LLM profile: {} steps; per step: {:.3} ms in dispatches, {:.3} ms from the \
             first timestamp to the last, {:.3} ms of host time recording and submitting them\n\
             | kernel | dispatches / step | ms / step | share |\n| --- | ---: | ---: | ---: |\n",
            self.steps,
            busy / steps / 1e6,
            self.span_ns / steps / 1e6,
            self.host_ns / steps / 1e6
        );
        for (name, (ns, count)) in rows {
            out.push_str(&format!(
                "| {name} | {:.1} | {:.4} | {:.1}% |\n",
                *count as f64 / steps,
                ns / steps / 1e6,
                100.0 * ns / busy.max(1e-9)
            ));
        }
        out
    }
}

/// A product's input: rows of `x`, `stride` floats apart, RMS-normed with `norm` on the way
/// where given; `q8` its 8-bit form once a q8 product has quantized it (the other products of
/// the same input reuse it).
struct Input {
    x: wgpu::Buffer,
    norm: Option<wgpu::Buffer>,
    stride: usize,
    q8: Option<wgpu::Buffer>,
}

impl Input {
    fn new(x: wgpu::Buffer, norm: Option<wgpu::Buffer>, stride: usize) -> Input {
        Input {
            x,
            norm,
            stride,
            q8: None,
        }
    }
}

/// One recorded dispatch of a step.
struct Disp {
    pipe: usize,
    params: Vec<u32>,
    binds: Vec<(u32, wgpu::Buffer)>,
    groups: usize,
}

/// Which shader module a pipeline comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Module {
    /// Format, ROWS, NORM, OPW, Q8.
    Matvec(Format, u32, bool, u32, bool),
    /// ferrite-wgpu's `quantize_q8.wgsl`.
    Quantize,
    /// The fused LLM kernels (`ferrite_wgpu::llm`).
    Llm(kernels::Module),
}

/// Scratch of a step, grown to the largest step seen.
struct Scratch {
    rows: usize,
    out: usize,
    bufs: [wgpu::Buffer; 8],
    /// The logit rows' normalized activations, logits, greedy tokens.
    xo: wgpu::Buffer,
    /// A product's input quantized by `quantize_q8` (the q8 precision), rows of the widest
    /// input.
    xq: wgpu::Buffer,
    logits: wgpu::Buffer,
    toks: wgpu::Buffer,
    logits_rb: wgpu::Buffer,
}

/// The device sampler's settings of `cfg`, validated (`op` names the caller in errors).
fn settings(cfg: &SamplerConfig, op: &str) -> Result<SamplerSettings> {
    cfg.settings().map_err(|e| err(format!("{op}: {e}")))
}

/// Draws `draws` tokens from the same `logits` (f32 [vocab]) with the device sampler of
/// `cfg`, draw i with draw counter i, the logits and the history `history` as given (the
/// penalties apply to a fresh copy each time; tests: the empirical distribution of the device
/// sampler against the CPU sampler's probabilities). `ferrite_wgpu::llm::sample::sample_many`
/// with `cfg`'s settings.
pub fn sample_many(
    dev: &WgpuDevice,
    cfg: &SamplerConfig,
    logits: &[f32],
    history: &[u32],
    draws: usize,
) -> Result<Vec<u32>> {
    let s = settings(cfg, "sample_many")?;
    sample::sample_many(dev, &s, logits, history, draws).map_err(werr)
}

/// [`sample_many`] with workgroups of `threads` threads (256 or 1024; tests: the draws do
/// not depend on it).
pub fn sample_many_threads(
    dev: &WgpuDevice,
    cfg: &SamplerConfig,
    logits: &[f32],
    history: &[u32],
    draws: usize,
    threads: u32,
) -> Result<Vec<u32>> {
    let s = settings(cfg, "sample_many")?;
    sample::sample_many_threads(dev, &s, logits, history, draws, threads).map_err(werr)
}

/// The token the device sampler of `cfg` draws from `logits` (f32 [vocab]; a copy is
/// penalized) with history `history` at draw counter `step`, as a step's `sample_rows` would
/// (tests: a step's draw against the sampler alone).
pub fn sample_once(
    dev: &WgpuDevice,
    cfg: &SamplerConfig,
    logits: &[f32],
    history: &[u32],
    step: u64,
) -> Result<u32> {
    let s = settings(cfg, "sample_once")?;
    sample::sample_once(dev, &s, logits, history, step).map_err(werr)
}

/// What a submission of planned dispatches (`flush`) ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flush {
    /// A chunk of [`CHUNK_DISPATCHES`] inside a step.
    Chunk,
    /// The step (its logits and greedy picks).
    Step,
    /// The device sampler's draws after the step (`sample_rows`), which replace picks.
    Sample,
}

/// A step's picks copied into a mappable buffer by the step's last submission: read when the
/// host asks for them (`read_tokens`), or queued (`queue_tokens`) and read later, oldest first.
struct PickRead {
    buf: wgpu::Buffer,
    /// Bytes it holds (one u32 per logit row).
    bytes: usize,
    done: wgpu::SubmissionIndex,
}

/// The wgpu kernel set (see the module docs).
pub struct WgpuKernels<'g> {
    m: &'g WgpuModel,
    pipes: Vec<Pipe>,
    pipe_ids: HashMap<(Module, &'static str), usize>,
    scratch: Option<Scratch>,
    meta: Option<wgpu::Buffer>,
    meta_cap: usize,
    trig: Option<wgpu::Buffer>,
    trig_cap: usize,
    /// Partial attention results of split rows, `[row][head][splits][head_dim + 2]`.
    part: Option<wgpu::Buffer>,
    part_cap: usize,
    /// Attention splits per (row, head) this step: global layers, local (windowed) layers.
    splits: [usize; 2],
    params: Option<wgpu::Buffer>,
    params_cap: usize,
    /// Parameter words the step's submitted chunks took.
    step_words: usize,
    /// Kernel names of the step's timed dispatches so far (the profile).
    prof_names: Vec<String>,
    plan: Vec<Disp>,
    /// Words of meta before each section: rows info, logit row ids.
    rows_at: usize,
    out_at: usize,
    /// Offsets (f32) of the cos/sin tables in trig: global, local.
    trig_at: [usize; 4],
    inv_freq: Vec<f32>,
    inv_freq_local: Vec<f32>,
    n_rows: usize,
    n_out: usize,
    submitted: Option<wgpu::SubmissionIndex>,
    /// Steps may take the previous step's picks as input on the device (`step::PREV_TOKEN`;
    /// off with `FERRITE_WGPU_CHAIN=0`).
    chain: bool,
    /// The last step's picks, not queued; queued reads, oldest first; buffers to reuse.
    pick: Option<PickRead>,
    queued: std::collections::VecDeque<PickRead>,
    spare: Vec<wgpu::Buffer>,
    /// Host time spent waiting for the device in reads of picks, and their count.
    pick_wait: std::time::Duration,
    pick_reads: u64,
    host_logits: Vec<f32>,
    fetched: bool,
    /// Reads of a step's logits to the host (`fetch_logits`), since the kernel set was made.
    logit_reads: u64,
    /// The device samplers of requests that sample on the device (`add_sampler`), and the
    /// masses scratch of `sample_rows` (u64 [rows][vocab], grown to the most rows sampled
    /// in one step), with its rows.
    samplers: SamplerArena,
    sample_q: Option<(wgpu::Buffer, usize)>,
    param_align: usize,
    /// Bind groups by (pipeline, parameter offset and length, buffers): a decode step plans
    /// the same dispatches over the same buffers as the one before it.
    bind_cache: HashMap<BindKey, wgpu::BindGroup>,
    profile: Option<Profile>,
}

impl Drop for WgpuKernels<'_> {
    fn drop(&mut self) {
        if let Some(r) = self.profile_report() {
            eprint!("{r}");
        }
    }
}

type BindKey = (usize, usize, usize, Vec<(u32, wgpu::Buffer)>);

/// Dispatches recorded and submitted together where the device is idle: a decode step of 30
/// layers (~150 dispatches) goes in four submissions, the device starting on the first while
/// the host records the next.
const CHUNK_DISPATCHES: usize = 48;

/// Bind groups kept at most (the cache is cleared past this).
const MAX_BIND_GROUPS: usize = 16384;

fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| err(format!("{what} = {v} exceeds u32")))
}

impl<'g> WgpuKernels<'g> {
    pub fn new(m: &'g WgpuModel) -> WgpuKernels<'g> {
        let c = &m.cfg;
        let factors = m.rope_freq_factors.as_deref();
        let align = m.dev.limits().min_storage_buffer_offset_alignment.max(4) as usize / 4;
        WgpuKernels {
            m,
            pipes: Vec::new(),
            pipe_ids: HashMap::new(),
            scratch: None,
            meta: None,
            meta_cap: 0,
            trig: None,
            trig_cap: 0,
            part: None,
            part_cap: 0,
            splits: [1, 1],
            params: None,
            params_cap: 0,
            step_words: 0,
            prof_names: Vec::new(),
            plan: Vec::new(),
            rows_at: 0,
            out_at: 0,
            trig_at: [0; 4],
            inv_freq: rope_inv_freq(c.rope_dim, c.rope_base, factors),
            inv_freq_local: rope_inv_freq(c.rope_dim, c.rope_base_local, factors),
            n_rows: 0,
            n_out: 0,
            submitted: None,
            chain: crate::env::flag_or("FERRITE_WGPU_CHAIN", true),
            pick: None,
            queued: std::collections::VecDeque::new(),
            spare: Vec::new(),
            pick_wait: std::time::Duration::ZERO,
            pick_reads: 0,
            host_logits: Vec::new(),
            fetched: false,
            logit_reads: 0,
            samplers: SamplerArena::default(),
            sample_q: None,
            param_align: align.max(1),
            bind_cache: HashMap::new(),
            profile: Profile::from_env(&m.dev),
        }
    }

    pub fn model(&self) -> &'g WgpuModel {
        self.m
    }

    /// Times every dispatch from the next step on (what `FERRITE_WGPU_PROFILE=1` turns on);
    /// errors where the device has no timestamp queries inside passes.
    pub fn enable_profile(&mut self) -> Result<()> {
        if self.profile.is_none() {
            self.profile = Some(Profile::new(&self.m.dev)?);
        }
        Ok(())
    }

    /// The profile's summary (a markdown table by kernel), where profiling is on and a step
    /// has run.
    pub fn profile_report(&self) -> Option<String> {
        self.profile
            .as_ref()
            .filter(|p| p.steps > 0)
            .map(Profile::report)
    }

    fn dev(&self) -> &'g wgpu::Device {
        self.m.dev.raw_device()
    }

    /// The pipeline of `entry` in `module`, compiled at first use.
    fn pipe(&mut self, module: Module, entry: &'static str) -> Result<usize> {
        if let Some(&i) = self.pipe_ids.get(&(module, entry)) {
            return Ok(i);
        }
        let shared = self
            .m
            .pipes
            .lock()
            .ok()
            .and_then(|c| c.get(&(module, entry)).cloned());
        if let Some(p) = shared {
            self.pipes.push(p);
            let i = self.pipes.len() - 1;
            self.pipe_ids.insert((module, entry), i);
            return Ok(i);
        }
        let (label, src) = match module {
            Module::Matvec(f, rows, norm, opw, q8) => (
                format!("matvec {}", f.name),
                qmatrix::matvec_source(&f, rows, norm, opw, self.m.dev.f16_in_f32(), q8),
            ),
            Module::Quantize => ("quantize_q8".to_string(), qmatrix::QUANTIZE_Q8.to_string()),
            Module::Llm(m) => (m.label().to_string(), m.source()),
        };
        let name = match module {
            Module::Matvec(f, rows, norm, _, q8) if entry == "matvec" => {
                let norm = if norm { "norm+" } else { "" };
                let q8 = if q8 { " q8" } else { "" };
                format!("{norm}matvec {}{q8} x{rows}", f.name)
            }
            Module::Matvec(f, ..) => format!("{entry} {}", f.name),
            _ => entry.to_string(),
        };
        let p = Pipe {
            p: kernels::compile(self.dev(), &label, src, entry).map_err(werr)?,
            name,
        };
        if let Ok(mut c) = self.m.pipes.lock() {
            c.insert((module, entry), p.clone());
        }
        self.pipes.push(p);
        let i = self.pipes.len() - 1;
        self.pipe_ids.insert((module, entry), i);
        Ok(i)
    }

    fn scratch(&self) -> Result<&Scratch> {
        self.scratch
            .as_ref()
            .ok_or_else(|| err("a kernel was called before begin"))
    }

    fn width(&self, b: Buf) -> usize {
        let c = &self.m.cfg;
        match b {
            Buf::X | Buf::Tmp => c.d_model,
            Buf::Q | Buf::Att => c.n_head * c.head_dim,
            Buf::K | Buf::V => c.n_kv_head * c.head_dim,
            Buf::Gate | Buf::Up => c.n_ff,
        }
    }

    /// Width of a row of the q|k|v buffer.
    fn qkv_width(&self) -> usize {
        let c = &self.m.cfg;
        (c.n_head + 2 * c.n_kv_head) * c.head_dim
    }

    /// (buffer, first column, row stride) of a named activation: q, k and v are column
    /// ranges of one `[rows][q | k | v]` buffer, the others have rows of their width.
    fn view(&self, b: Buf) -> Result<(wgpu::Buffer, usize, usize)> {
        let c = &self.m.cfg;
        let buf = self.scratch()?.bufs[b as usize].clone();
        let (q, kv) = (c.n_head * c.head_dim, c.n_kv_head * c.head_dim);
        Ok(match b {
            Buf::Q => (buf, 0, self.qkv_width()),
            Buf::K => (buf, q, self.qkv_width()),
            Buf::V => (buf, q + kv, self.qkv_width()),
            _ => (buf, 0, self.width(b)),
        })
    }

    /// A packed activation (rows of exactly its width): a product's input.
    fn buf(&self, b: Buf) -> Result<wgpu::Buffer> {
        match b {
            Buf::Q | Buf::K | Buf::V => Err(err(format!(
                "{b:?} is a column range of the q|k|v rows and cannot be a product's input"
            ))),
            _ => Ok(self.scratch()?.bufs[b as usize].clone()),
        }
    }

    /// Grows the scratch to `rows` rows and `out` logit rows.
    fn ensure_scratch(&mut self, rows: usize, out: usize) -> Result<()> {
        if let Some(s) = &self.scratch {
            if s.rows >= rows && s.out >= out {
                return Ok(());
            }
        }
        let (rows, out) = match &self.scratch {
            Some(s) => (rows.max(s.rows), out.max(s.out)),
            None => (rows.max(1), out.max(1)),
        };
        let c = &self.m.cfg;
        for (b, w) in [
            ("gate", c.n_ff),
            ("q|k|v", self.qkv_width()),
            ("x", c.d_model),
        ] {
            self.m
                .check_binding(&format!("activations {b} of {rows} rows"), rows * w * 4)?;
        }
        self.m.check_binding(
            &format!("logits of {out} rows of {}", c.vocab),
            out * c.vocab * 4,
        )?;
        let widest = c.d_model.max(c.n_ff).max(c.n_head * c.head_dim);
        let xq_bytes = rows.max(out) * qmatrix::q8_row_words(widest) * 4;
        self.m
            .check_binding(&format!("8-bit activations of {rows} rows"), xq_bytes)?;
        let d = self.dev();
        let f32s = |n: usize, l: &str| zeros(d, l, n * 4);
        let bufs = [
            Buf::X,
            Buf::Q,
            Buf::K,
            Buf::V,
            Buf::Att,
            Buf::Tmp,
            Buf::Gate,
            Buf::Up,
        ]
        .map(|b| match b {
            // Q, K and V share one buffer (`view`): replaced below.
            Buf::Q | Buf::K | Buf::V => f32s(0, "llm activations"),
            _ => f32s(rows * self.width(b), "llm activations"),
        });
        let qkv = f32s(rows * self.qkv_width(), "llm q|k|v");
        let mut bufs = bufs;
        for b in [Buf::Q, Buf::K, Buf::V] {
            bufs[b as usize] = qkv.clone();
        }
        let rb = |bytes: usize| {
            d.create_buffer(&wgpu::BufferDescriptor {
                label: Some("llm readback"),
                size: bytes.max(4) as u64,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let toks = f32s(out, "llm greedy tokens");
        if let Some(old) = &self.scratch {
            // The last step's picks move along: the next step may read them (PREV_TOKEN).
            let mut enc = d.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            enc.copy_buffer_to_buffer(&old.toks, 0, &toks, 0, (old.out * 4) as u64);
            self.submitted = Some(self.m.dev.raw_queue().submit([enc.finish()]));
        }
        self.scratch = Some(Scratch {
            rows,
            out,
            bufs,
            xo: f32s(out * c.d_model, "llm logit rows"),
            xq: zeros(d, "llm 8-bit activations", xq_bytes),
            logits: f32s(out * c.vocab, "llm logits"),
            toks,
            logits_rb: rb(out * c.vocab * 4),
        });
        Ok(())
    }

    /// Writes `data` into `slot` (grown to fit, never shrunk).
    fn write_grow(
        dev: &wgpu::Device,
        q: &wgpu::Queue,
        slot: &mut Option<wgpu::Buffer>,
        cap: &mut usize,
        bytes: &[u8],
    ) {
        if slot.is_none() || *cap < bytes.len() {
            *cap = bytes.len().next_power_of_two().max(256);
            *slot = Some(zeros(dev, "llm step data", *cap));
        }
        if let Some(b) = slot {
            let n = bytes.len() / 4 * 4;
            if n > 0 {
                q.write_buffer(b, 0, &bytes[..n]);
            }
        }
    }

    /// Plans a dispatch; a full chunk of [`CHUNK_DISPATCHES`] is recorded and submitted at
    /// once, so the device runs the step's first layers while the host records the rest.
    /// Not where a read of picks is queued (a chained decode): the device is still busy with
    /// an earlier step then, and one submission a step costs it less (SmolLM2 decode on an
    /// H200: +3%).
    fn push(
        &mut self,
        pipe: usize,
        params: Vec<u32>,
        binds: Vec<(u32, wgpu::Buffer)>,
        groups: usize,
    ) -> Result<()> {
        if groups > 0 {
            self.plan.push(Disp {
                pipe,
                params,
                binds,
                groups,
            });
        }
        if self.plan.len() >= CHUNK_DISPATCHES && self.queued.is_empty() {
            self.flush(Flush::Chunk)?;
        }
        Ok(())
    }

    /// Plans a dispatch of a fused LLM kernel (its pipeline compiled at first use).
    fn push_kernel(&mut self, d: Dispatch) -> Result<()> {
        let pipe = self.pipe(Module::Llm(d.module), d.entry)?;
        self.push(pipe, d.params, d.binds, d.groups)
    }

    /// Plans `out[:, col0..col0 + w.rows] (+)= x @ w^T (+ bias)` over the step's rows, with
    /// `x` the rows of `input` (normed on the way in where it has a norm over its w.cols
    /// values) and `out` rows `out_stride` wide (`Epilogue::Glu`: `w` holds gate/up row pairs
    /// and `out[:, i] = act(gate_i) * up_i`).
    #[allow(clippy::too_many_arguments)]
    fn product(
        &mut self,
        w: &'g WMat,
        input: &mut Input,
        rows: usize,
        out: wgpu::Buffer,
        out_stride: usize,
        col0: usize,
        mode: Epilogue,
    ) -> Result<()> {
        let r = qmatrix::rows_variant(rows);
        let qm = w.m()?;
        let q8 = self.m.q8 && qmatrix::has_q8(&qm.fmt);
        // q8: the input quantized (and normed) by a dispatch of its own, once for all the
        // products of this input.
        if q8 && input.q8.is_none() {
            let (x, nw) = (&input.x, input.norm.as_ref());
            input.q8 = Some(self.quantize_q8(x, nw, qm.cols, input.stride, rows)?);
        }
        let xq = if q8 { input.q8.clone() } else { None };
        let normed = input.norm.is_some();
        // q8: the norm weights are in the quantized input already.
        let norm = if q8 { None } else { input.norm.clone() };
        let nw = norm.unwrap_or_else(|| self.m.dummy.clone());
        let flags = match mode {
            Epilogue::Store => 0,
            Epilogue::Add => qmatrix::FLAG_ADD,
            Epilogue::Glu(Glu::Silu) => qmatrix::FLAG_GLU,
            Epilogue::Glu(Glu::GeluTanh) => qmatrix::FLAG_GLU | qmatrix::FLAG_GELU,
        } | if w.bias.is_some() {
            qmatrix::FLAG_BIAS
        } else {
            0
        };
        let call = qmatrix::Matvec {
            rows,
            x_stride: input.stride,
            out_stride,
            col0,
            flags,
            eps: self.m.cfg.eps,
        };
        let bias = w.bias.clone().unwrap_or_else(|| self.m.dummy.clone());
        for ch in &qm.chunks {
            let opw = qmatrix::outs_per_subgroup(ch.rows, r, q8);
            let pipe = self.pipe(Module::Matvec(qm.fmt, r, normed, opw, q8), "matvec")?;
            let (params, groups) = call.dispatch(qm, ch, opw).map_err(werr)?;
            let mut binds = vec![
                (1, ch.buf.clone()),
                (2, input.x.clone()),
                (3, out.clone()),
                (4, bias.clone()),
                (6, nw.clone()),
            ];
            // The Q8 products read their input at 5 (`sdata`), which the f32 ones declare too.
            binds.push((5, xq.clone().unwrap_or_else(|| self.m.dummy.clone())));
            self.push(pipe, params.to_vec(), binds, groups)?;
        }
        Ok(())
    }

    /// Plans `quantize_q8` of `rows` rows of `x` (`cols` values, `x_stride` apart), times the
    /// norm weights `norm` where given (with the blocks' sums of squares, for the product to
    /// apply 1 / rms); returns the buffer it fills.
    fn quantize_q8(
        &mut self,
        x: &wgpu::Buffer,
        norm: Option<&wgpu::Buffer>,
        cols: usize,
        x_stride: usize,
        rows: usize,
    ) -> Result<wgpu::Buffer> {
        let xq = self.scratch()?.xq.clone();
        let pipe = self.pipe(Module::Quantize, "quantize_q8")?;
        let (params, groups) =
            qmatrix::quantize_q8_dispatch(cols, rows, norm.is_some(), x_stride).map_err(werr)?;
        let nw = norm.cloned().unwrap_or_else(|| self.m.dummy.clone());
        let binds = vec![(1, xq.clone()), (2, x.clone()), (3, nw)];
        self.push(pipe, params.to_vec(), binds, groups)?;
        Ok(xq)
    }

    fn mat(&self, w: Mat) -> Result<&'g WMat> {
        let ls = &self.m.layers;
        Ok(match w {
            Mat::Q(il) | Mat::K(il) | Mat::V(il) => match &ls[il].qkv {
                Qkv::Split(qkv) => match w {
                    Mat::Q(_) => &qkv[0],
                    Mat::K(_) => &qkv[1],
                    _ => &qkv[2],
                },
                Qkv::Fused(_) => {
                    return Err(err(format!(
                        "{w:?}: q, k and v are stacked in one matrix (norm_matmul runs them)"
                    )))
                }
            },
            Mat::O(il) => &ls[il].wo,
            Mat::Gate(il) | Mat::Up(il) => match &ls[il].ffn {
                Ffn::Split { gate, up } => match w {
                    Mat::Gate(_) => gate,
                    _ => up,
                },
                Ffn::Fused(_) => {
                    return Err(err(format!(
                        "{w:?}: gate and up are interleaved in one matrix (norm_glu runs them)"
                    )))
                }
            },
            Mat::Down(il) => &ls[il].w_down,
        })
    }

    fn norm_w(&self, n: Norm) -> Result<&'g wgpu::Buffer> {
        let ls = &self.m.layers;
        let v = match n {
            Norm::Attn(il) => Some(&ls[il].attn_norm),
            Norm::Ffn(il) => Some(&ls[il].ffn_norm),
            Norm::PostAttn(il) => ls[il].post_attn_norm.as_ref(),
            Norm::PostFfn(il) => ls[il].post_ffn_norm.as_ref(),
            Norm::QHead(il) => ls[il].q_norm.as_ref(),
            Norm::KHead(il) => ls[il].k_norm.as_ref(),
        };
        v.ok_or_else(|| err(format!("the model has no norm {n:?}")))
    }

    /// Plans `dst (+)= rms_norm(src piece) * w` over `pieces` pieces of `n` values (`gather`:
    /// source piece i is the batch row of logit row i).
    #[allow(clippy::too_many_arguments)]
    fn rms_norm(
        &mut self,
        src: wgpu::Buffer,
        dst: wgpu::Buffer,
        w: wgpu::Buffer,
        n: usize,
        pieces: usize,
        add: bool,
        gather: bool,
    ) -> Result<()> {
        let norm = ops::RmsNorm {
            n,
            pieces,
            eps: self.m.cfg.eps,
            add,
            gather,
            sdata_at: self.out_at,
        };
        let d = norm
            .dispatch(&src, &dst, &w, &self.meta_buf()?)
            .map_err(werr)?;
        self.push_kernel(d)
    }

    fn meta_buf(&self) -> Result<wgpu::Buffer> {
        self.meta
            .clone()
            .ok_or_else(|| err("a kernel was called before begin"))
    }

    /// Submits the planned dispatches (one command buffer) and the copies of the step's
    /// greedy tokens to the readback buffer.
    fn run(&mut self) -> Result<()> {
        self.flush(Flush::Step)
    }

    /// Records the planned dispatches (one command buffer, one compute pass) and submits them;
    /// their parameters go to the step's parameter buffer after those of the chunks before
    /// (one queue write). The step's final chunk and the device sampler's dispatch after it
    /// (`Flush::Step`, `Flush::Sample`) also copy the step's picks to a readback buffer of
    /// their own (and the profile's timestamps).
    fn flush(&mut self, kind: Flush) -> Result<()> {
        let last = kind != Flush::Chunk;
        let t0 = std::time::Instant::now();
        let plan = std::mem::take(&mut self.plan);
        let al = self.param_align;
        let base = self.step_words.div_ceil(al) * al;
        let mut words: Vec<u32> = Vec::new();
        let mut offs = Vec::with_capacity(plan.len());
        for d in &plan {
            let start = (base + words.len()).div_ceil(al) * al - base;
            words.resize(start, 0);
            words.extend_from_slice(&d.params);
            offs.push(base + start);
        }
        words.push(0);
        let end = base + words.len();
        self.step_words = end;
        let dev = self.dev();
        let q = self.m.dev.raw_queue();
        if self.params.is_none() || self.params_cap < end * 4 {
            // Chunks already submitted keep the buffer they were bound to.
            self.params_cap = (end * 4).next_power_of_two().max(256);
            self.params = Some(zeros(dev, "llm step parameters", self.params_cap));
            self.bind_cache.clear();
        }
        let params = self
            .params
            .clone()
            .ok_or_else(|| err("no parameter buffer"))?;
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        q.write_buffer(&params, (base * 4) as u64, &bytes);
        let max_dim = self
            .m
            .dev
            .limits()
            .max_compute_workgroups_per_dimension
            .max(1) as usize;
        let mut enc = dev.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("llm step"),
        });
        let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut names = std::mem::take(&mut self.prof_names);
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("llm step"),
                timestamp_writes: None,
            });
            if self.bind_cache.len() + plan.len() > MAX_BIND_GROUPS {
                self.bind_cache.clear();
            }
            for (d, &off) in plan.iter().zip(&offs) {
                let p = &self.pipes[d.pipe];
                let n = d.params.len().max(1);
                let mut binds = d.binds.clone();
                binds.push((0, params.clone()));
                let key = (d.pipe, off, n, binds);
                let bind = self.bind_cache.entry(key).or_insert_with(|| {
                    let mut entries = vec![wgpu::BindGroupEntry {
                        binding: 0,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &params,
                            offset: (off * 4) as u64,
                            size: wgpu::BufferSize::new((n * 4) as u64),
                        }),
                    }];
                    for (b, buf) in &d.binds {
                        entries.push(wgpu::BindGroupEntry {
                            binding: *b,
                            resource: buf.as_entire_binding(),
                        });
                    }
                    dev.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: None,
                        layout: &p.p.layout,
                        entries: &entries,
                    })
                });
                let (gx, gy) = if d.groups <= max_dim {
                    (d.groups, 1)
                } else {
                    (max_dim, d.groups.div_ceil(max_dim))
                };
                let timed = match &self.profile {
                    Some(pr) if names.len() < PROFILED_DISPATCHES => Some(&pr.queries),
                    _ => None,
                };
                if let Some(qs) = timed {
                    pass.write_timestamp(qs, 2 * names.len() as u32);
                }
                pass.set_pipeline(&p.p.pipe);
                pass.set_bind_group(0, &*bind, &[]);
                pass.dispatch_workgroups(gx as u32, gy as u32, 1);
                if let Some(qs) = timed {
                    pass.write_timestamp(qs, 2 * names.len() as u32 + 1);
                    names.push(p.name.clone());
                }
            }
        }
        if let (Some(pr), false, true) = (&self.profile, names.is_empty(), last) {
            let n = 2 * names.len() as u32;
            enc.resolve_query_set(&pr.queries, 0..n, &pr.resolve, 0);
            enc.copy_buffer_to_buffer(&pr.resolve, 0, &pr.readback, 0, u64::from(n) * 8);
        }
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(err(format!("recording the step: {e}")));
        }
        let mut pick = None;
        if last {
            // The step before's picks, unless queued, go back to the spares.
            if let Some(old) = self.pick.take() {
                self.spare.push(old.buf);
            }
        }
        if last && self.n_out > 0 {
            let bytes = self.n_out * 4;
            // A buffer no queued read holds.
            let buf = match self.spare.iter().position(|b| b.size() >= bytes as u64) {
                Some(i) => self.spare.swap_remove(i),
                None => dev.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("llm picks readback"),
                    size: (self.scratch()?.out * 4) as u64,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
            };
            enc.copy_buffer_to_buffer(&self.scratch()?.toks, 0, &buf, 0, bytes as u64);
            pick = Some((buf, bytes));
        }
        let idx = q.submit([enc.finish()]);
        if let Some((buf, bytes)) = pick {
            self.pick = Some(PickRead {
                buf,
                bytes,
                done: idx.clone(),
            });
        }
        self.submitted = Some(idx);
        if let Some(pr) = &mut self.profile {
            pr.host_ns += t0.elapsed().as_nanos() as f64;
        }
        if !last {
            self.prof_names = names;
        } else if let Some(pr) = &mut self.profile {
            pr.collect(dev, &names, kind == Flush::Step)?;
        }
        Ok(())
    }

    /// Maps `buf`'s first `bytes` bytes after submission `done` (and those before it) and
    /// returns them as words.
    fn read_back(
        &self,
        buf: &wgpu::Buffer,
        bytes: usize,
        done: Option<wgpu::SubmissionIndex>,
    ) -> Result<Vec<u32>> {
        kernels::map_words(&self.m.dev, "llm step", buf, bytes, done).map_err(werr)
    }

    /// Samples request `id`'s tokens on the device from now on (`sample_rows`): settings `cfg`
    /// (validated here), token history `history` (its prompt: the penalties' window starts
    /// there), room for `cap` history tokens in all (the ring holds the last
    /// min(`penalty_last_n`, `cap`)). Replaces the request's sampler if it has one.
    pub fn add_sampler(
        &mut self,
        id: u64,
        cfg: &SamplerConfig,
        history: &[u32],
        cap: usize,
    ) -> Result<()> {
        let s = settings(cfg, &format!("add_sampler: request {id}"))?;
        let ring = sample::ring(&s, cap.max(history.len()));
        let words = sample::state_words(&s, history, ring, 0);
        self.samplers.add(&self.m.dev, id, &words).map_err(werr)
    }

    /// Frees request `id`'s device sampler (none: nothing happens).
    pub fn remove_sampler(&mut self, id: u64) {
        self.samplers.remove(id);
    }

    /// Draws the token of each (logit row, request id) of the last step with that request's
    /// device sampler, in one dispatch after the step (a workgroup per row): the token goes to
    /// the row's slot of the step's picks (`read_tokens`, `queue_tokens`, and the next step's
    /// `PREV_TOKEN`, replacing the greedy pick), the row's logits are penalized in place, the
    /// sampler's history and draw counter advance. Only the picks are read back.
    pub fn sample_rows(&mut self, rows: &[(usize, u64)]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let vocab = self.m.cfg.vocab;
        let mut picks = Vec::with_capacity(rows.len());
        for &(row, id) in rows {
            if row >= self.n_out {
                return Err(err(format!(
                    "sample_rows: logit row {row} to sample; the step has {}",
                    self.n_out
                )));
            }
            let state = self
                .samplers
                .offset(id)
                .ok_or_else(|| err(format!("sample_rows: request {id} has no device sampler")))?;
            picks.push(SampleRow {
                state,
                row,
                slot: row,
            });
        }
        if self.sample_q.as_ref().is_none_or(|q| q.1 < rows.len()) {
            let n = rows.len().max(self.sample_q.as_ref().map_or(0, |q| q.1));
            let bytes = sample::masses_bytes(n, vocab);
            self.m.check_binding(
                &format!("the sampler's masses of {n} rows of {vocab}"),
                bytes,
            )?;
            self.sample_q = Some((zeros(self.dev(), "llm sampler masses", bytes), n));
        }
        let (Some((q, _)), Some(states)) = (&self.sample_q, self.samplers.buffer()) else {
            return Err(err("sample_rows: no sampler state"));
        };
        let s = self.scratch()?;
        let threads = sample::sample_threads(&self.m.dev);
        let d = sample::sample_rows(threads, vocab, &picks, states, &s.logits, q, &s.toks)
            .map_err(werr)?;
        self.push_kernel(d)?;
        // The penalties changed the logits on the device.
        self.fetched = false;
        self.flush(Flush::Sample)
    }

    /// The token of each logit row of the last step (waits for the step, not for steps
    /// queued after it): the greedy one (largest logit, lowest id on ties), or the device
    /// sampler's where `sample_rows` drew it.
    pub fn read_tokens(&self) -> Result<Vec<u32>> {
        match &self.pick {
            Some(p) => self.read_back(&p.buf, p.bytes, Some(p.done.clone())),
            None if self.n_out == 0 => Ok(Vec::new()),
            None => Err(err(
                "the last step's tokens were queued for a later read (take_tokens)",
            )),
        }
    }

    /// Whether steps may take the previous step's picks as input (`step::PREV_TOKEN`): on
    /// unless `FERRITE_WGPU_CHAIN=0`.
    pub fn chains(&self) -> bool {
        self.chain
    }

    /// Turns chained picks on or off (`chains`).
    pub fn set_chain(&mut self, on: bool) {
        self.chain = on;
    }

    /// Queues the read of the last step's tokens (as `read_tokens` would return them)
    /// without waiting: later steps can be recorded and submitted before the host waits for
    /// these (`take_tokens`, oldest first).
    pub fn queue_tokens(&mut self) -> Result<()> {
        let p = self
            .pick
            .take()
            .ok_or_else(|| err("queue_tokens: the last step returned no logit rows"))?;
        self.queued.push_back(p);
        Ok(())
    }

    /// The tokens of the oldest step whose read `queue_tokens` queued (waits for that step and
    /// the work before it, not for later steps).
    pub fn take_tokens(&mut self) -> Result<Vec<u32>> {
        let p = self
            .queued
            .pop_front()
            .ok_or_else(|| err("take_tokens: no queued token read"))?;
        let t0 = std::time::Instant::now();
        let t = self.read_back(&p.buf, p.bytes, Some(p.done.clone()));
        self.pick_wait += t0.elapsed();
        self.pick_reads += 1;
        self.spare.push(p.buf);
        t
    }

    /// Host time spent in `take_tokens` (waiting for the device, then mapping) and the number
    /// of reads, since the kernel set was made: where a chained decode's reads take almost no
    /// time, the host's recording, not the device, sets the pace.
    pub fn pick_wait(&self) -> (std::time::Duration, u64) {
        (self.pick_wait, self.pick_reads)
    }

    /// The last step's logits on the host (read once per step, then kept).
    pub fn fetch_logits(&mut self) -> Result<&mut [f32]> {
        if !self.fetched {
            let n = self.n_out * self.m.cfg.vocab * 4;
            if n > 0 {
                let s = self.scratch()?;
                let mut enc = self
                    .dev()
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
                enc.copy_buffer_to_buffer(&s.logits, 0, &s.logits_rb, 0, n as u64);
                let idx = self.m.dev.raw_queue().submit([enc.finish()]);
                self.submitted = Some(idx);
            }
            let s = self.scratch()?;
            let w = self.read_back(&s.logits_rb, n, self.submitted.clone())?;
            self.host_logits = w.into_iter().map(f32::from_bits).collect();
            self.fetched = true;
            self.logit_reads += 1;
        }
        Ok(&mut self.host_logits)
    }

    /// The logits `fetch_logits` read in the last step, if it did.
    pub fn fetched_logits(&self) -> Option<&[f32]> {
        self.fetched.then_some(self.host_logits.as_slice())
    }

    /// Reads of a step's logits to the host since the kernel set was made (a decode loop whose
    /// tokens the kernel set picks or samples makes none).
    pub fn logit_reads(&self) -> u64 {
        self.logit_reads
    }

    /// Logit rows of the last step.
    pub fn out_rows(&self) -> usize {
        self.n_out
    }
}

impl Kernels for WgpuKernels<'_> {
    type Kv = WgpuKvStore;

    fn begin(&mut self, batch: &Batch) -> Result<()> {
        let c = &self.m.cfg;
        let rows = batch.rows();
        let n_out = batch.out_rows();
        // A PREV_TOKEN row r reads pick r of the step before (which had self.n_out picks).
        if let Some(r) = batch.tokens.iter().position(|&t| t == PREV_TOKEN) {
            if !self.chain || r >= self.n_out {
                return Err(err(format!(
                    "row {r} takes the previous step's pick, but {}",
                    if self.chain {
                        format!("that step picked {} tokens", self.n_out)
                    } else {
                        "this kernel set does not chain its picks".to_string()
                    }
                )));
            }
        }
        let sizes = (
            self.meta_cap,
            self.trig_cap,
            self.part_cap,
            self.scratch.as_ref().map(|s| (s.rows, s.out)),
        );
        self.ensure_scratch(rows, n_out)?;
        self.plan.clear();
        self.step_words = 0;
        self.prof_names.clear();
        self.fetched = false;
        self.n_rows = rows;
        self.n_out = n_out;
        // meta: tokens [rows], (position, table index, the sequence's first position in the
        // step) [rows][3], logit rows [n_out], tables.
        self.rows_at = rows;
        self.out_at = 4 * rows;
        let tables_at = 4 * rows + n_out;
        let mut meta = vec![0u32; tables_at + batch.blocks.len() + 1];
        meta[..rows].copy_from_slice(&batch.tokens);
        let mut positions = Vec::with_capacity(rows);
        for s in &batch.seqs {
            for (k, r) in s.rows.clone().enumerate() {
                meta[self.rows_at + 3 * r] = u32_of(s.pos + k, "position")?;
                meta[self.rows_at + 3 * r + 1] = u32_of(tables_at + s.blocks.start, "table")?;
                meta[self.rows_at + 3 * r + 2] = u32_of(s.pos, "position")?;
                positions.push(s.pos + k);
            }
        }
        for (i, r) in batch.out_row_ids().enumerate() {
            meta[self.out_at + i] = r as u32;
        }
        meta[tables_at..tables_at + batch.blocks.len()].copy_from_slice(&batch.blocks);
        // The angles as the CPU kernel set computes them: cos | sin, then the local layers'.
        let (mut trig, mut cos, mut sin) = (Vec::new(), Vec::new(), Vec::new());
        let pos = || positions.iter().copied();
        rope_table(
            &self.inv_freq,
            pos(),
            1.0 / c.rope_scale,
            &mut cos,
            &mut sin,
        );
        let half = c.rope_dim / 2;
        self.trig_at = [0, rows * half, 2 * rows * half, 3 * rows * half];
        trig.append(&mut cos);
        trig.append(&mut sin);
        if c.sliding_window > 0 {
            rope_table(&self.inv_freq_local, pos(), 1.0, &mut cos, &mut sin);
            trig.append(&mut cos);
            trig.append(&mut sin);
        }
        trig.push(0.0);
        let dev = self.m.dev.raw_device();
        let q = self.m.dev.raw_queue();
        let mb: Vec<u8> = meta.iter().flat_map(|w| w.to_le_bytes()).collect();
        Self::write_grow(dev, q, &mut self.meta, &mut self.meta_cap, &mb);
        let tb: Vec<u8> = trig.iter().flat_map(|w| w.to_le_bytes()).collect();
        Self::write_grow(dev, q, &mut self.trig, &mut self.trig_cap, &tb);
        let max_pos = positions.iter().copied().max().unwrap_or(0);
        let local_len = match c.sliding_window {
            0 => max_pos + 1,
            w => (max_pos + 1).min(w),
        };
        self.splits = [
            paged::attn_splits(max_pos + 1),
            paged::attn_splits(local_len),
        ];
        let s_max = self.splits[0].max(self.splits[1]);
        if s_max > 1 {
            let bytes = paged::part_bytes(rows, c.n_head, s_max, c.head_dim);
            if self.part.is_none() || self.part_cap < bytes {
                self.m.check_binding(
                    &format!("partial attention of {rows} rows over {s_max} splits"),
                    bytes,
                )?;
                self.part_cap = bytes.next_power_of_two();
                self.part = Some(zeros(dev, "llm attention splits", self.part_cap));
            }
        }
        let now = (
            self.meta_cap,
            self.trig_cap,
            self.part_cap,
            self.scratch.as_ref().map(|s| (s.rows, s.out)),
        );
        if now != sizes {
            // Bind groups of replaced buffers would never be used again.
            self.bind_cache.clear();
        }
        Ok(())
    }

    fn embed(&mut self, out: Buf) -> Result<()> {
        let w = &self.m.tok_embd;
        let rows = self.n_rows;
        let qm = w.m()?;
        let pipe = self.pipe(Module::Matvec(qm.fmt, 1, false, 1, false), "embed")?;
        let y = self.buf(out)?;
        let meta = self.meta_buf()?;
        let toks = self.scratch()?.toks.clone();
        for ch in &qm.chunks {
            let (params, groups) =
                qmatrix::embed_dispatch(qm, ch, rows, 0, self.m.cfg.embed_scale).map_err(werr)?;
            let binds = vec![
                (1, ch.buf.clone()),
                (3, y.clone()),
                (5, meta.clone()),
                (7, toks.clone()),
            ];
            self.push(pipe, params.to_vec(), binds, groups)?;
        }
        Ok(())
    }

    fn norm_matmul(&mut self, x: Buf, norm: Option<Norm>, outs: &[(Mat, Buf)]) -> Result<()> {
        let rows = self.n_rows;
        let cols = self.width(x);
        let (src, nw) = match norm {
            Some(n) => {
                if cols != self.m.cfg.d_model {
                    return Err(err(format!("norm_matmul: a norm over {x:?} ({cols} wide)")));
                }
                // Folded into each product (`NORM` of matvec.wgsl), whatever the step's
                // rows: a row's result must not depend on its batch.
                (self.buf(x)?, Some(self.norm_w(n)?.clone()))
            }
            None => (self.buf(x)?, None),
        };
        if let [(Mat::Q(a), Buf::Q), (Mat::K(b), Buf::K), (Mat::V(c), Buf::V)] = *outs {
            if let (true, Qkv::Fused(w)) = (a == b && b == c, &self.m.layers[a].qkv) {
                let (ob, _, stride) = self.view(Buf::Q)?;
                if w.cols() != cols || w.rows() != stride {
                    return Err(err(format!(
                        "norm_matmul: q|k|v [{}, {}] for {x:?} ({cols} wide)",
                        w.rows(),
                        w.cols()
                    )));
                }
                let mut input = Input::new(src, nw, cols);
                return self.product(w, &mut input, rows, ob, stride, 0, Epilogue::Store);
            }
        }
        let mut input = Input::new(src, nw, cols);
        for &(m, o) in outs {
            let w = self.mat(m)?;
            if w.cols() != cols || w.rows() != self.width(o) {
                return Err(err(format!(
                    "norm_matmul: {m:?} is [{}, {}] for {x:?} ({cols} wide) into {o:?} ({} wide)",
                    w.rows(),
                    w.cols(),
                    self.width(o)
                )));
            }
            let (ob, col0, stride) = self.view(o)?;
            self.product(w, &mut input, rows, ob, stride, col0, Epilogue::Store)?;
        }
        Ok(())
    }

    fn head_norm(&mut self, x: Buf, norm: Norm) -> Result<()> {
        let c = &self.m.cfg;
        let (buf, col0, stride) = self.view(x)?;
        let hn = ops::HeadNorm {
            head_dim: c.head_dim,
            heads: self.width(x) / c.head_dim,
            rows: self.n_rows,
            eps: c.eps,
            stride,
            col0,
        };
        let d = hn.dispatch(&buf, self.norm_w(norm)?).map_err(werr)?;
        self.push_kernel(d)
    }

    fn rope_attention(
        &mut self,
        kv: &mut WgpuKvStore,
        layer: usize,
        q: Buf,
        k: Buf,
        v: Buf,
        out: Buf,
    ) -> Result<()> {
        let c = &self.m.cfg;
        let local = c.is_local(layer);
        let (cos_at, sin_at) = if local {
            (self.trig_at[2], self.trig_at[3])
        } else {
            (self.trig_at[0], self.trig_at[1])
        };
        let window = if local { c.sliding_window } else { 0 };
        let (qb, q0, qs) = self.view(q)?;
        let (kb, k0, ks) = self.view(k)?;
        let (vb, v0, vs) = self.view(v)?;
        if ks != qs || vs != qs || kb != qb || vb != qb {
            return Err(err(format!(
                "rope_attention: {q:?}, {k:?} and {v:?} must be column ranges of one buffer"
            )));
        }
        let attn = paged::Attention {
            rows: self.n_rows,
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            head_dim: c.head_dim,
            rope_dim: c.rope_dim,
            neox: c.rope_neox,
            cos_at,
            sin_at,
            layer,
            n_layer: c.n_layer,
            rows_at: self.rows_at,
            window,
            scale: c.attn_scale,
            stride: qs,
            q_col: q0,
            k_col: k0,
            v_col: v0,
            splits: self.splits[usize::from(local)],
        };
        let trig = self
            .trig
            .clone()
            .ok_or_else(|| err("rope_attention before begin"))?;
        // Bound where no row is split (never written then).
        let part = self.part.clone().unwrap_or_else(|| self.m.dummy.clone());
        // The attention also writes each row's key and value into the cache.
        let bufs = paged::AttentionBuffers {
            sdata: &self.meta_buf()?,
            trig: &trig,
            qkv: &qb,
            kc: &kv.kc,
            vc: &kv.vc,
            out: &self.buf(out)?,
            part: &part,
        };
        for d in attn.dispatches(&bufs).map_err(werr)? {
            self.push_kernel(d)?;
        }
        Ok(())
    }

    fn norm_glu(
        &mut self,
        x: Buf,
        norm: Norm,
        gate: Mat,
        up: Mat,
        out: Buf,
        act: Glu,
    ) -> Result<()> {
        let il = match (gate, up) {
            (Mat::Gate(a), Mat::Up(b)) if a == b => Some(a),
            _ => None,
        };
        if let Some(Ffn::Fused(w)) = il.map(|il| &self.m.layers[il].ffn) {
            let (rows, cols) = (self.n_rows, self.width(x));
            if w.cols() != cols || w.rows() != 2 * self.width(out) {
                return Err(err(format!(
                    "norm_glu: gate/up pairs [{}, {}] for {x:?} ({cols} wide) into {out:?}",
                    w.rows(),
                    w.cols()
                )));
            }
            let (xb, nw) = (self.buf(x)?, Some(self.norm_w(norm)?.clone()));
            let ob = self.buf(out)?;
            let glu = Epilogue::Glu(act);
            let mut input = Input::new(xb, nw, cols);
            return self.product(w, &mut input, rows, ob, w.rows() / 2, 0, glu);
        }
        self.norm_matmul(x, Some(norm), &[(gate, out), (up, Buf::Up)])?;
        let n = self.n_rows * self.width(out);
        let gelu = act == Glu::GeluTanh;
        let d = ops::glu(n, gelu, &self.buf(out)?, &self.buf(Buf::Up)?).map_err(werr)?;
        self.push_kernel(d)
    }

    fn matmul_residual(&mut self, x: Buf, w: Mat, y: Buf, post_norm: Option<Norm>) -> Result<()> {
        let rows = self.n_rows;
        let wm = self.mat(w)?;
        let cols = self.width(x);
        if wm.cols() != cols || wm.rows() != self.width(y) {
            return Err(err(format!(
                "matmul_residual: {w:?} is [{}, {}] for {x:?} ({cols} wide) onto {y:?}",
                wm.rows(),
                wm.cols()
            )));
        }
        let mut input = Input::new(self.buf(x)?, None, cols);
        let yb = self.buf(y)?;
        match post_norm {
            None => self.product(wm, &mut input, rows, yb, wm.rows(), 0, Epilogue::Add),
            Some(n) => {
                let tmp = self.buf(Buf::Tmp)?;
                let store = Epilogue::Store;
                self.product(wm, &mut input, rows, tmp.clone(), wm.rows(), 0, store)?;
                let nw = self.norm_w(n)?.clone();
                self.rms_norm(tmp, yb, nw, wm.rows(), rows, true, false)
            }
        }
    }

    fn logits(&mut self, x: Buf) -> Result<()> {
        let c = &self.m.cfg;
        let n = self.n_out;
        if n > 0 {
            let (xo, logits, toks) = {
                let s = self.scratch()?;
                (s.xo.clone(), s.logits.clone(), s.toks.clone())
            };
            let on = self.m.output_norm.clone();
            self.rms_norm(self.buf(x)?, xo.clone(), on, c.d_model, n, false, true)?;
            let w = self.m.output.as_ref().unwrap_or(&self.m.tok_embd);
            let mut input = Input::new(xo, None, c.d_model);
            self.product(
                w,
                &mut input,
                n,
                logits.clone(),
                c.vocab,
                0,
                Epilogue::Store,
            )?;
            let d = ops::argmax(c.vocab, n, &logits, &toks).map_err(werr)?;
            self.push_kernel(d)?;
        }
        self.run()
    }
}

impl EngineKernels for WgpuKernels<'_> {
    fn new_store(&self, n_blocks: usize) -> Result<WgpuKvStore> {
        WgpuKvStore::new(self.m, n_blocks)
    }

    fn device_tokens(&mut self) -> Result<Option<Vec<u32>>> {
        self.read_tokens().map(Some)
    }

    fn add_sampler(
        &mut self,
        id: u64,
        cfg: &SamplerConfig,
        history: &[u32],
        cap: usize,
    ) -> Result<bool> {
        // FERRITE_WGPU_DEVICE_SAMPLING=0: on the host (to compare)
        if !crate::env::flag_or("FERRITE_WGPU_DEVICE_SAMPLING", true) {
            return Ok(false);
        }
        WgpuKernels::add_sampler(self, id, cfg, history, cap)?;
        Ok(true)
    }

    fn remove_sampler(&mut self, id: u64) {
        WgpuKernels::remove_sampler(self, id);
    }

    fn sample_rows(&mut self, rows: &[(usize, u64)]) -> Result<()> {
        WgpuKernels::sample_rows(self, rows)
    }

    fn chains_picks(&self) -> bool {
        self.chains()
    }

    fn queue_tokens(&mut self) -> Result<()> {
        WgpuKernels::queue_tokens(self)
    }

    fn take_tokens(&mut self) -> Result<Vec<u32>> {
        WgpuKernels::take_tokens(self)
    }

    fn host_logits(&mut self) -> Result<&mut [f32]> {
        self.fetch_logits()
    }

    fn last_host_logits(&self) -> Option<&[f32]> {
        self.fetched_logits()
    }
}

impl<'g> Engine<'g, WgpuKernels<'g>> {
    /// An engine on the wgpu device holding `m` (scratch grown to the largest step, a device
    /// KV cache of `cfg.kv_blocks` blocks).
    pub fn wgpu(m: &'g WgpuModel, cfg: EngineConfig) -> Result<Engine<'g, WgpuKernels<'g>>> {
        Engine::with_kernels(&m.cfg, cfg, WgpuKernels::new(m))
    }
}
