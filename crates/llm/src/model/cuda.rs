//! The CUDA kernel set of the model definition ([`super::step`]): a thin wrapper that plans
//! the launches of ferrite-cuda's kernels (`matvec` products; `llm::paged` attention and
//! friends, `llm::prefill`, `llm::sample`) over scratch buffers allocated once for the largest
//! step, so every launch of a step has fixed addresses and a decode step can be captured as a
//! CUDA graph.
//!
//! A step's data (tokens, each row's position and block-table offset, the logit rows, the
//! block tables) goes to the device in one write at `begin`; the kernel calls of the
//! definition only plan launches; `logits` (the last call) runs them: eagerly, or for a
//! decode-only step (one row per sequence) through the graph of its batch-size bucket (1, 2,
//! 4, ... 64 rows; padding rows are skipped by the attention and ignored elsewhere), captured
//! the second time the bucket is seen (the first run compiles the kernels) and replayed after.
//! A prompt chunk that starts its sequence and is alone in its step (a session's prompt, a
//! request arriving at an idle engine) on the int8 tensor-core products is padded to a
//! multiple of [`PREFILL_BUCKET`] rows and replayed the same way: the host then queues one
//! graph instead of ~14 launches a layer.
//!
//! Every row is computed independently of the others by every kernel (the products read
//! the weights once per row and sum in a fixed order; the attention splits a row's keys by
//! its own position), so a sequence's logits do not depend on what else is in the batch.

use std::collections::{HashMap, HashSet};

use ferrite_cuda::llm::decode::{self, AttnShape};
use ferrite_cuda::llm::paged::{self, PagedAttnArgs, PagedLaunch, RopeStoreArgs, KV_BS, PAD_ROW};
use ferrite_cuda::llm::prefill;
use ferrite_cuda::llm::sample::{self, SamplerState};
use ferrite_cuda::llm::Launch;
use ferrite_cuda::matvec::{self, Mode, Seg};
use ferrite_cuda::qmatrix::GpuMatrix;
use ferrite_cuda::{Buffer, CudaDevice, Graph, Mailbox, Recording};

use super::config::Config;
use super::step::{Batch, Buf, Glu, Kernels, Mat, Norm, Out};
use crate::error::{Error, Result};
use crate::gpu::weights::{self, gm, GpuModel};
use crate::gpu::zeros;
use crate::kv_cache::{BlockId, KvStore};
use crate::sampler::SamplerConfig;

const _: () = assert!(KV_BS == crate::kv_cache::BLOCK_SIZE);

/// Largest batch-size bucket with a captured graph.
pub const MAX_GRAPH_ROWS: usize = 64;

/// The graph bucket of a decode-only step of `rows` rows: the next power of two, if it is
/// at most `MAX_GRAPH_ROWS` and `cap` (the rows the scratch holds).
pub fn bucket(rows: usize, cap: usize) -> Option<usize> {
    let b = rows.max(1).next_power_of_two();
    (rows > 0 && b <= MAX_GRAPH_ROWS && b <= cap).then_some(b)
}

/// Prompt chunks that start their sequence, alone in a step (see the module notes), are padded
/// to a multiple of this many rows for their graphs.
pub const PREFILL_BUCKET: usize = 64;

/// The largest such chunk with a graph.
pub const MAX_PREFILL_GRAPH_ROWS: usize = 512;

/// The rows a prompt chunk of `rows` rows that starts its sequence runs as in its graph: the
/// next multiple of `PREFILL_BUCKET`, at most `cap` (the step's rows and the context), at
/// least `rows`.
pub fn prefill_bucket(rows: usize, cap: usize) -> usize {
    rows.next_multiple_of(PREFILL_BUCKET).min(cap).max(rows)
}

/// A captured step: its rows, the KV store it reads (the address of its keys), and its kind
/// (0: decode-only; 1 + logit rows: a lone prompt chunk from position 0).
type GraphKey = (usize, u64, u8);

/// Where the sections of the step metadata (u32s) start in the device buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaLayout {
    /// tokens [max_rows]
    pub tokens: usize,
    /// [max_rows][2]: position (PAD_ROW for a padding row), offset of the block table; at an
    /// even offset (8-byte aligned: kernels load a row's pair as one word)
    pub rows: usize,
    /// [max_out]: the batch row of each logit row
    pub out: usize,
    /// [1]: the mailbox slot where the step's picks go (`MAIL_SLOTS`)
    pub mail: usize,
    /// block tables, back to back
    pub tables: usize,
    pub len: usize,
}

impl MetaLayout {
    pub fn new(max_rows: usize, max_out: usize, max_table: usize) -> MetaLayout {
        let rows = max_rows.next_multiple_of(2);
        let out = rows + 2 * max_rows;
        MetaLayout {
            tokens: 0,
            rows,
            out,
            mail: out + max_out,
            tables: out + max_out + 1,
            len: out + max_out + 1 + max_table,
        }
    }
}

/// The metadata of `batch` launched as `rows` rows (>= batch.rows(); the rest padding) with
/// `out_rows` logit rows (>= batch.out_rows(); the rest repeat row i's id, i < rows) and its
/// picks going to mailbox slot `mail`, into `meta` (resized to the used length: up to the
/// end of the tables).
pub fn pack_meta(
    batch: &Batch,
    rows: usize,
    out_rows: usize,
    mail: usize,
    l: &MetaLayout,
    meta: &mut Vec<u32>,
) {
    meta.clear();
    meta.resize(l.tables + batch.blocks.len(), 0);
    for (i, &t) in batch.tokens.iter().enumerate() {
        meta[l.tokens + i] = t;
    }
    for i in batch.rows()..rows {
        meta[l.rows + 2 * i] = PAD_ROW;
    }
    for s in &batch.seqs {
        for (k, r) in s.rows.clone().enumerate() {
            meta[l.rows + 2 * r] = (s.pos + k) as u32;
            meta[l.rows + 2 * r + 1] = s.blocks.start as u32;
        }
    }
    let n_out = batch.out_rows();
    for (i, r) in batch.out_row_ids().enumerate() {
        meta[l.out + i] = r as u32;
    }
    for i in n_out..out_rows {
        meta[l.out + i] = i.min(rows.saturating_sub(1)) as u32;
    }
    meta[l.mail] = mail as u32;
    meta[l.tables..].copy_from_slice(&batch.blocks);
}

/// Keys and values of the paged cache on the device: f16
/// `[block][layer][kv_head][BLOCK_SIZE][head_dim]` each (one block, all layers, is one range).
pub struct CudaKvStore {
    dev: CudaDevice,
    kc: Buffer,
    vc: Buffer,
    n_blocks: usize,
    block_bytes: usize,
}

impl CudaKvStore {
    /// `n_blocks` blocks for `m`'s layers, zeroed.
    pub fn new(m: &GpuModel, n_blocks: usize) -> Result<CudaKvStore> {
        let c = &m.cfg;
        paged::check_shape(c.n_head, c.n_kv_head, c.head_dim)
            .map_err(|e| Error::Model(e.to_string()))?;
        let block_bytes = c.n_layer * c.n_kv_head * KV_BS * c.head_dim * 2;
        let total = block_bytes
            .checked_mul(n_blocks)
            .filter(|&t| n_blocks > 0 && n_blocks <= u32::MAX as usize && t < (1 << 46))
            .ok_or_else(|| {
                Error::Context(format!(
                    "KV cache: {n_blocks} blocks of {block_bytes} bytes is not a valid size"
                ))
            })?;
        let dev = m.device().clone();
        let kc = zeros(&dev, total, "llm paged kv cache")?;
        let vc = zeros(&dev, total, "llm paged kv cache")?;
        Ok(CudaKvStore {
            dev,
            kc,
            vc,
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

impl KvStore for CudaKvStore {
    fn copy_block(&mut self, src: BlockId, dst: BlockId) -> Result<()> {
        Ok(paged::copy_block(
            &self.dev,
            &self.kc,
            &self.vc,
            src,
            dst,
            self.block_bytes,
        )?)
    }
}

/// Sizes of a [`CudaKernels`]' scratch.
#[derive(Clone, Copy, Debug)]
pub struct CudaLimits {
    /// Most rows (tokens) in one step.
    pub max_rows: usize,
    /// Most logit rows in one step.
    pub max_out: usize,
    /// Most block-table entries in one step (all sequences together).
    pub max_table: usize,
    /// Longest sequence (positions): sets the attention's splits.
    pub ctx: usize,
}

/// A flash chunk's held copy of the attention's f16 output rows into f32 rows
/// (`CudaKernels::held_attn`).
struct HeldAttn {
    copy: PagedLaunch,
    /// The f16 rows (the attention op's output) and the f32 rows the copy writes.
    rows16: u64,
    rows32: u64,
    /// The attention op's output, kept alive until its reader is queued.
    _out: ferrite_core::Tensor,
}

/// The CUDA kernel set (see the module docs).
pub struct CudaKernels<'g> {
    m: &'g GpuModel,
    dev: CudaDevice,
    sm: u32,
    q8: bool,
    lim: CudaLimits,
    /// The step data's layout: this step's, and that of steps outside the graph buckets.
    layout: MetaLayout,
    full_layout: MetaLayout,
    meta_bytes: Vec<u8>,
    x: Buffer,
    qkv: Buffer,
    att: Buffer,
    gate: Buffer,
    up: Buffer,
    tmp: Buffer,
    xo: Buffer,
    logits: Buffer,
    q8buf: Buffer,
    meta: Buffer,
    tokens_out: Buffer,
    /// The greedy pick's per-slice partials and per-row counters (`PagedLaunch::Argmax`).
    am_part: Buffer,
    am_count: Buffer,
    part: Buffer,
    count: Buffer,
    ngrp: usize,
    maxsplit: usize,
    /// `paged::split_keys` when the kernel set was made.
    split_keys: usize,
    meta_host: Vec<u32>,
    /// Rows and logit rows launched this step (bucket-padded for a graph step), logit rows
    /// asked for.
    rows: usize,
    launch_out: usize,
    n_out: usize,
    bucket: Option<usize>,
    plan: Vec<Launch>,
    /// The rows of this step's prefill graph bucket (`prefill_bucket`), None where the step
    /// is not such a chunk.
    big: Option<usize>,
    /// Prefill graphs allowed (`FERRITE_GPU_PREFILL_GRAPHS`, on by default).
    big_graphs: bool,
    /// The capture of this step's prefill graph, begun by `replay` and finished by `run`.
    recording: Option<(Recording, GraphKey)>,
    /// Graphs by `GraphKey`; each key runs eagerly once.
    graphs: HashMap<GraphKey, Graph>,
    warm: HashSet<GraphKey>,
    kv_key: u64,
    eager: bool,
    graphs_on: bool,
    replays: usize,
    /// The last step's logits, once read (`fetch_logits`).
    host_logits: Vec<f32>,
    fetched: bool,
    /// Steps of at least this many rows (not graph steps) take the tensor-core products, as
    /// the session's prefill: q8x2 inputs on the int8 kernels for a model on f32 activations
    /// (`mq2`), else activations x weights dequantized to `dt`, cuBLASLt.
    tc_rows: usize,
    tc: bool,
    /// Every row of the step (padding included) is a logit row, in order.
    all_rows_out: bool,
    /// Their operand type, as the session's prefill: f32 for a model on f32 activations
    /// (`Precision::Exact`: its prompts then give the decode steps' answers), else bf16
    /// (Gemma-3, or FERRITE_GPU_PREFILL_BF16=1) or f16.
    dt: ferrite_core::DType,
    /// Their scratch (at the first such step): `dt` activations, dequantized weights.
    h16: Option<Buffer>,
    w16: Option<Buffer>,
    gu32: Option<Buffer>,
    /// The activation whose rows the 16-bit scratch holds for the next product of a large
    /// step, written there by its producer (attention output, gated unit): that product
    /// converts nothing, and the f32 rows of that activation are not written.
    h16_holds: Option<Buf>,
    /// Prompt chunks of a large step of at least this many rows attend on the flash op.
    flash_rows: usize,
    /// Each sequence of a large step: (first row, rows, position, block-table offset).
    seqs: Vec<(usize, usize, usize, usize)>,
    /// The flash attention's scratch (at the first large step): f16 q rows, gathered keys
    /// and values.
    flash: Option<[Buffer; 3]>,
    /// Fast-mode products of at least this many rows take the int8 tensor-core kernels
    /// (`MvLaunch::with_mma`) where the matrices' format has them; their split-K partials.
    mma_rows: usize,
    mma_part: Option<Buffer>,
    /// A model on f32 activations: the scratch of its large steps' products on the int8
    /// tensor cores with two-level (q8x2) inputs, as the session's prefill
    /// (`prefill::mmq_launches`, over the model's `GpuModel::mmq_copies`), made at the first
    /// large step; None before, or where the device or `FERRITE_GPU_PREFILL_MMQ=0` rules them
    /// out (the f32 cuBLASLt products then).
    mq2: Option<Mq2>,
    mq2_tried: bool,
    /// The last int8 tensor-core product of a large step when it has one segment or is GLU,
    /// held back (with its output's address) so that the next product, if it reads that
    /// output, can hand its input's quantization to this one's split-K sums
    /// (`MvLaunch::quantizing_next`); launched before anything else (`flush`).
    held: Option<(matvec::MvLaunch, u64)>,
    /// A flash chunk's copy of the attention's f16 output into the f32 rows of every row of
    /// the step, held back: the attention output's product, if it reads those rows on the
    /// int8 tensor cores, quantizes the f16 rows itself (`MvLaunch::quantizing_half_input`)
    /// and the copy is dropped; launched before anything else (`flush`).
    held_attn: Option<HeldAttn>,
    /// The device samplers of requests that sample on the device, by request id
    /// (`add_sampler`); the table and the per-row scratch of `sample_rows` (made at its first
    /// call: a u64 per vocabulary entry and logit row).
    samplers: HashMap<u64, SamplerState>,
    sample_scratch: Option<(Buffer, Buffer)>,
    /// Steps may take the previous step's picks as input on the device (`step::PREV_TOKEN`;
    /// off with `FERRITE_GPU_CHAIN=0`).
    chain: bool,
    /// Per-head q and k norm weights (device addresses; 0: none) that `head_norm` left for
    /// the next `rope_attention` to apply before RoPE.
    head_norms: (u64, u64),
    /// Where steps' picks go: each step takes the next of `MAIL_SLOTS` slots (`mail_slot`,
    /// in its step data), written by the greedy pick and the device sampler; the reads
    /// `queue_tokens` queued, oldest first (`take_tokens`).
    mail: Mailbox,
    mail_slot: usize,
    queued: std::collections::VecDeque<Queued>,
}

/// Mailbox slots of the kernel set: steps whose picks can be queued and not yet read.
const MAIL_SLOTS: usize = 8;

/// A queued read of a step's picks: its mailbox slot, or the picks themselves, taken before a
/// later step reused the slot.
enum Queued {
    Slot(usize),
    Taken(Vec<u32>),
}

fn u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Layer and slot (`weights::SLOT_*`) of a matrix, as `GpuModel::mmq_copies` keeps them.
fn mat_slot(w: Mat) -> (usize, usize) {
    match w {
        Mat::Q(il) => (il, weights::SLOT_Q),
        Mat::K(il) => (il, weights::SLOT_K),
        Mat::V(il) => (il, weights::SLOT_V),
        Mat::O(il) => (il, weights::SLOT_O),
        Mat::Gate(il) => (il, weights::SLOT_GATE),
        Mat::Up(il) => (il, weights::SLOT_UP),
        Mat::Down(il) => (il, weights::SLOT_DOWN),
    }
}

/// The int8 tensor-core products of a model on f32 activations (`CudaKernels::mq2`).
struct Mq2 {
    /// Two-level input rows ([max rows][widest row / 32] units), split-K partials.
    q8: Buffer,
    part: Buffer,
    cc: (u32, u32),
}

/// Rows from which a step takes the tensor-core products (`CudaKernels::set_tensor_core_rows`)
/// in the fast mode (below, the int8 kernels are faster: 8B-shaped Q4_0 pp64 on an H100
/// 23,055 tok/s at 128 against 16,970 at 64).
pub const TENSOR_CORE_ROWS: usize = 128;

/// The same for models on f32 activations (f32 operands there; below, the f32 row kernels):
/// SmolLM2-shaped Q4_1 on an H100, pp32 7,113 vs 6,426 and pp64 12,494 vs 6,920 tok/s at 32
/// against 128; pp16 faster on the row kernels (5,592 vs 3,584 at 16).
pub const TENSOR_CORE_ROWS_F32: usize = 32;

/// Rows from which a prompt chunk of a large step attends on the flash attention op (over
/// its keys gathered from the blocks) rather than row by row on paged_attn.
pub const FLASH_ROWS: usize = 16;

/// Rows from which fast-mode products take the int8 tensor-core kernels
/// (`CudaKernels::set_mma_rows`): on an H100 (8B-shaped Q4_0, 512-token prompts, same run) the
/// batched register kernels are faster at 2 and 4 rows (538 vs 383, 863 vs 746 tok/s), the
/// tensor cores from 8 (1,440 vs 1,180).
pub const MMA_ROWS: usize = 5;

/// Device bytes of the step scratch `CudaKernels::new` allocates for steps of `rows` rows
/// and `out_rows` logit rows (activations, logits and their f16 copies, a lower bound of what
/// `new` sizes exactly), plus the device sampler's scratch for `out_rows` sequences (a u64 per
/// vocabulary entry, made at the first sampled step).
pub fn step_scratch_bytes(c: &Config, rows: usize, out_rows: usize) -> usize {
    let per_row = 2 * c.d_model
        + (c.n_head + 2 * c.n_kv_head) * c.head_dim
        + c.n_head * c.head_dim
        + 2 * c.n_ff;
    rows.saturating_mul(per_row)
        .saturating_add(out_rows.saturating_mul(c.d_model + c.vocab))
        .saturating_add(out_rows.saturating_mul(c.vocab).saturating_mul(2))
        .saturating_mul(4)
}

fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Other(format!("cuda kernels: {what} = {v} exceeds u32")))
}

impl<'g> CudaKernels<'g> {
    /// Scratch for steps within `lim` over the weights of `m`.
    pub fn new(m: &'g GpuModel, lim: CudaLimits) -> Result<CudaKernels<'g>> {
        let c = &m.cfg;
        let dev = m.device().clone();
        let sm = dev.sm_count();
        if lim.max_rows == 0 || lim.max_out == 0 || lim.max_out > lim.max_rows || lim.ctx == 0 {
            return Err(Error::Other(format!(
                "cuda kernels: {lim:?} is not a valid size (rows >= logit rows >= 1, ctx >= 1)"
            )));
        }
        paged::check_shape(c.n_head, c.n_kv_head, c.head_dim)
            .map_err(|e| Error::Model(e.to_string()))?;
        let (d, hd, nh, nkv, ff) = (c.d_model, c.head_dim, c.n_head, c.n_kv_head, c.n_ff);
        let r = lim.max_rows;
        let f32s = |n: usize, what| zeros(&dev, n * 4, what);
        let shape = AttnShape {
            n_head: nh,
            n_kv_head: nkv,
            head_dim: hd,
            ctx: lim.ctx,
        };
        let split_keys = paged::split_keys();
        let (_, maxsplit) = shape.splits(sm, split_keys);
        let ngrp = paged::head_groups(nh, nkv);
        let layout = MetaLayout::new(r, lim.max_out, lim.max_table);
        let qkv_w = (nh + 2 * nkv) * hd;
        let mma_part = if m.precision == crate::Precision::Q8 {
            // 8 splits of the widest launch (GLU: gate and up) for up to 64 rows, at most
            // 64 MiB: launches whose partials do not fit take fewer splits
            let bytes = (8 * r.min(64) * qkv_w.max(2 * ff).max(d) * 4).min(64 << 20);
            Some(zeros(&dev, bytes, "llm engine split-K partials")?)
        } else {
            None
        };
        let mail = dev.mailbox(MAIL_SLOTS, lim.max_out * 4)?;
        Ok(CudaKernels {
            m,
            sm,
            q8: m.precision == crate::Precision::Q8,
            x: f32s(r * d, "llm engine activations")?,
            qkv: f32s(r * qkv_w, "llm engine activations")?,
            att: f32s(r * nh * hd, "llm engine activations")?,
            gate: f32s(r * ff, "llm engine activations")?,
            up: f32s(r * ff, "llm engine activations")?,
            tmp: f32s(r * d, "llm engine activations")?,
            xo: f32s(lim.max_out * d, "llm engine activations")?,
            logits: f32s(lim.max_out * c.vocab, "llm engine logits")?,
            q8buf: zeros(
                &dev,
                r * matvec::q8_bytes(d.max(ff).max(nh * hd)),
                "llm engine q8 input",
            )?,
            meta: zeros(&dev, layout.len.max(1) * 4, "llm engine step data")?,
            tokens_out: zeros(&dev, lim.max_out * 4, "llm engine tokens")?,
            am_part: zeros(
                &dev,
                lim.max_out * paged::ARGMAX_SLICES as usize * 8,
                "llm engine greedy partials",
            )?,
            am_count: zeros(&dev, lim.max_out * 4, "llm engine greedy counters")?,
            part: f32s(r * nh * maxsplit * (hd + 2), "llm engine attention")?,
            count: zeros(&dev, r * nkv * ngrp * 4, "llm engine attention")?,
            ngrp,
            maxsplit,
            split_keys,
            layout,
            full_layout: layout,
            meta_bytes: Vec::new(),
            lim,
            dev,
            meta_host: Vec::new(),
            rows: 0,
            launch_out: 0,
            n_out: 0,
            bucket: None,
            big: None,
            big_graphs: crate::env::flag_or("FERRITE_GPU_PREFILL_GRAPHS", true),
            recording: None,
            plan: Vec::new(),
            graphs: HashMap::new(),
            warm: HashSet::new(),
            kv_key: 0,
            eager: crate::env::flag_or("FERRITE_GPU_EAGER", false),
            graphs_on: true,
            replays: 0,
            host_logits: Vec::new(),
            fetched: false,
            tc_rows: if crate::env::flag_or("FERRITE_GPU_PREFILL", true) {
                crate::env::int("FERRITE_GPU_TC_ROWS", 1, 65536)
                    .ok()
                    .flatten()
                    .unwrap_or(if m.precision == crate::Precision::Exact {
                        TENSOR_CORE_ROWS_F32
                    } else {
                        TENSOR_CORE_ROWS
                    })
            } else {
                usize::MAX
            },
            tc: false,
            all_rows_out: false,
            dt: if m.precision == crate::Precision::Exact {
                ferrite_core::DType::F32
            } else if c.arch == crate::model::Arch::Gemma3
                || crate::env::flag_or("FERRITE_GPU_PREFILL_BF16", false)
            {
                ferrite_core::DType::BF16
            } else {
                ferrite_core::DType::F16
            },
            h16: None,
            w16: None,
            gu32: None,
            h16_holds: None,
            flash_rows: FLASH_ROWS,
            seqs: Vec::new(),
            flash: None,
            mma_rows: if crate::env::flag_or("FERRITE_GPU_MMA", true) {
                MMA_ROWS
            } else {
                usize::MAX
            },
            mma_part,
            mq2: None,
            mq2_tried: false,
            held: None,
            held_attn: None,
            samplers: HashMap::new(),
            sample_scratch: None,
            chain: crate::env::flag_or("FERRITE_GPU_CHAIN", true),
            head_norms: (0, 0),
            mail,
            mail_slot: MAIL_SLOTS - 1,
            queued: Default::default(),
        })
    }

    pub fn model(&self) -> &'g GpuModel {
        self.m
    }

    pub fn limits(&self) -> &CudaLimits {
        &self.lim
    }

    /// Whether decode-only steps go through per-bucket graphs (default; off with
    /// `FERRITE_GPU_EAGER=1` or `set_graphs(false)`).
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs_on = on;
    }

    /// Fast-mode products of at least `rows` rows take the int8 tensor-core kernels (default
    /// `MMA_ROWS`, or never with FERRITE_GPU_MMA=0; `usize::MAX`: never). A sequence's
    /// results then depend on the rows of its step in the last bits (another summation
    /// order than the one-row kernels').
    pub fn set_mma_rows(&mut self, rows: usize) {
        self.mma_rows = rows.max(1);
    }

    /// Steps of at least `rows` rows (that are not decode-only graph steps) take the
    /// cuBLASLt products (default `TENSOR_CORE_ROWS`, `TENSOR_CORE_ROWS_F32` for a model on f32
    /// activations; `FERRITE_GPU_TC_ROWS`; `usize::MAX`: never). Their results differ from the
    /// row kernels' (16-bit rounding of the operands in the fast mode, the summation order with
    /// f32 operands), so a sequence's logits then depend on the step it is in (within that).
    pub fn set_tensor_core_rows(&mut self, rows: usize) {
        self.tc_rows = rows.max(1);
    }

    /// Prompt chunks of large steps (see `set_tensor_core_rows`) of at least `rows` rows
    /// attend on the flash attention op, shorter ones row by row (default `FLASH_ROWS`;
    /// tests use small values).
    pub fn set_flash_rows(&mut self, rows: usize) {
        self.flash_rows = rows.max(1);
    }

    /// Whether steps may take the previous step's picks as input (`step::PREV_TOKEN`): on
    /// unless `FERRITE_GPU_CHAIN=0`.
    pub fn chains(&self) -> bool {
        self.chain
    }

    /// Turns chained picks on or off (`chains`).
    pub fn set_chain(&mut self, on: bool) {
        self.chain = on;
    }

    /// Whether decode-only steps replay captured graphs (else every kernel is launched).
    pub fn uses_graphs(&self) -> bool {
        self.graphs_on && !self.eager
    }

    /// Graphs captured so far, and replays run.
    pub fn graph_stats(&self) -> (usize, usize) {
        (self.graphs.len(), self.replays)
    }

    /// Logit rows of the last step.
    pub fn out_rows(&self) -> usize {
        self.n_out
    }

    /// The token of each logit row of the last step (waits for the step): the greedy one
    /// (largest logit, lowest id on ties), or the device sampler's where `sample_rows` drew it.
    pub fn read_tokens(&self) -> Result<Vec<u32>> {
        let b = self.dev.read_bytes(&self.tokens_out, 0, self.n_out * 4)?;
        Ok(u32s(&b))
    }

    /// Queues the read of the last step's tokens (as `read_tokens` would return them) behind
    /// the step, without waiting: later steps can be queued before the host waits for these
    /// (`take_tokens`, oldest first). The step's kernels write them into its mailbox slot, so
    /// nothing is copied on the stream. Errors if the step's read is queued already.
    pub fn queue_tokens(&mut self) -> Result<()> {
        self.mail.mark(self.mail_slot, self.n_out * 4)?;
        self.queued.push_back(Queued::Slot(self.mail_slot));
        Ok(())
    }

    /// The tokens of the oldest step whose read `queue_tokens` queued (waits for that step and
    /// the work before it, not for later steps).
    pub fn take_tokens(&mut self) -> Result<Vec<u32>> {
        match self.queued.pop_front() {
            Some(Queued::Slot(slot)) => Ok(u32s(&self.mail.take(slot)?)),
            Some(Queued::Taken(t)) => Ok(t),
            None => Err(Error::Other("cuda kernels: no queued token read".into())),
        }
    }

    /// Takes the next mailbox slot for a step: a slot whose queued read was not taken yet is
    /// read first (waiting for its step), its picks kept in the queue.
    fn next_mail_slot(&mut self) -> Result<usize> {
        let slot = (self.mail_slot + 1) % MAIL_SLOTS;
        if self.mail.is_marked(slot) {
            let t = u32s(&self.mail.take(slot)?);
            if let Some(q) = self
                .queued
                .iter_mut()
                .find(|q| matches!(q, Queued::Slot(s) if *s == slot))
            {
                *q = Queued::Taken(t);
            }
        }
        self.mail_slot = slot;
        Ok(slot)
    }

    /// Samples request `id`'s tokens on the device from now on (`sample_rows`): settings `cfg`
    /// (validated here), token history `history` (its prompt), room for `cap` history tokens
    /// in all.
    pub fn add_sampler(
        &mut self,
        id: u64,
        cfg: &SamplerConfig,
        history: &[u32],
        cap: usize,
    ) -> Result<()> {
        let settings = crate::gpu::sampler_settings(cfg)?;
        let s = SamplerState::new(&self.dev, &settings, cap.max(history.len()))?;
        s.set_history(&self.dev, history)?;
        self.samplers.insert(id, s);
        Ok(())
    }

    /// Frees request `id`'s device sampler (none: nothing happens).
    pub fn remove_sampler(&mut self, id: u64) {
        self.samplers.remove(&id);
    }

    /// Draws the token of each (logit row, request id) of the last step with that request's
    /// device sampler, in one launch after the step: the token goes to the row's slot of the
    /// step's tokens (`read_tokens`, replacing the greedy pick), the row's logits are
    /// penalized in place, the sampler's history and draw counter advance.
    pub fn sample_rows(&mut self, rows: &[(usize, u64)]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let (vocab, max) = (self.m.cfg.vocab, self.lim.max_out);
        if rows.len() > max {
            return Err(Error::Other(format!(
                "cuda kernels: {} rows to sample; at most {max}",
                rows.len()
            )));
        }
        if self.sample_scratch.is_none() {
            let table = zeros(
                &self.dev,
                max * sample::ROW_BYTES,
                "llm engine sampler table",
            )?;
            let q = zeros(&self.dev, max * vocab * 8, "llm engine sampler scratch")?;
            self.sample_scratch = Some((table, q));
        }
        let Some((table, q)) = &self.sample_scratch else {
            return Err(Error::Other("cuda kernels: sampler scratch missing".into()));
        };
        let mut list = Vec::with_capacity(rows.len());
        for (slot, &(row, id)) in rows.iter().enumerate() {
            if row >= self.n_out {
                return Err(Error::Other(format!(
                    "cuda kernels: logit row {row} to sample; the step has {}",
                    self.n_out
                )));
            }
            let s = self.samplers.get(&id).ok_or_else(|| {
                Error::Other(format!("cuda kernels: request {id} has no device sampler"))
            })?;
            list.push(sample::SampleRow {
                state: s,
                logits: self.logits.ptr() + (row * vocab * 4) as u64,
                scratch: q.ptr() + (slot * vocab * 8) as u64,
                out: self.tokens_out.ptr() + (row * 4) as u64,
                mail: self.mail.slot_ptr(self.mail_slot) + (row * 4) as u64,
            });
        }
        Ok(sample::sample_rows(&self.dev, table, &list, vocab)?)
    }

    /// The logits of the last step, `[out rows][vocab]` (waits for the step).
    pub fn read_logits(&self) -> Result<Vec<f32>> {
        crate::gpu::read_f32(&self.dev, &self.logits, self.n_out * self.m.cfg.vocab)
    }

    /// The last step's logits on the host (read once per step, then kept).
    pub fn fetch_logits(&mut self) -> Result<&mut [f32]> {
        if !self.fetched {
            self.host_logits = self.read_logits()?;
            self.fetched = true;
        }
        Ok(&mut self.host_logits)
    }

    /// The logits `fetch_logits` read in the last step, if it did.
    pub fn fetched_logits(&self) -> Option<&[f32]> {
        self.fetched.then_some(self.host_logits.as_slice())
    }

    /// (buffer, first column, row stride, width) of a named activation, in f32 elements.
    fn view(&self, b: Buf) -> (&Buffer, usize, usize, usize) {
        let c = &self.m.cfg;
        let (d, hd, nh, nkv, ff) = (c.d_model, c.head_dim, c.n_head, c.n_kv_head, c.n_ff);
        let w = (nh + 2 * nkv) * hd;
        match b {
            Buf::X => (&self.x, 0, d, d),
            Buf::Q => (&self.qkv, 0, w, nh * hd),
            Buf::K => (&self.qkv, nh * hd, w, nkv * hd),
            Buf::V => (&self.qkv, (nh + nkv) * hd, w, nkv * hd),
            Buf::Att => (&self.att, 0, nh * hd, nh * hd),
            Buf::Tmp => (&self.tmp, 0, d, d),
            Buf::Gate => (&self.gate, 0, ff, ff),
            Buf::Up => (&self.up, 0, ff, ff),
        }
    }

    /// A packed input (rows of exactly its width) for a product.
    fn input(&self, b: Buf) -> Result<&Buffer> {
        let (buf, off, stride, width) = self.view(b);
        if off != 0 || stride != width {
            return Err(Error::Other(format!(
                "cuda kernels: {b:?} is a view inside a wider row and cannot be a product's input"
            )));
        }
        Ok(buf)
    }

    fn mat(&self, w: Mat) -> (&'g GpuMatrix, Option<&'g Buffer>) {
        let ls = &self.m.layers;
        match w {
            Mat::Q(il) => (gm(&ls[il].wq), ls[il].bq.as_ref()),
            Mat::K(il) => (gm(&ls[il].wk), ls[il].bk.as_ref()),
            Mat::V(il) => (gm(&ls[il].wv), ls[il].bv.as_ref()),
            Mat::O(il) => (gm(&ls[il].wo), None),
            Mat::Gate(il) => (gm(&ls[il].w_gate), None),
            Mat::Up(il) => (gm(&ls[il].w_up), None),
            Mat::Down(il) => (gm(&ls[il].w_down), None),
        }
    }

    fn norm_w(&self, n: Norm) -> Result<&'g Buffer> {
        let ls = &self.m.layers;
        let v = match n {
            Norm::Attn(il) => Some(&ls[il].attn_norm),
            Norm::Ffn(il) => Some(&ls[il].ffn_norm),
            Norm::PostAttn(il) => ls[il].post_attn_norm.as_ref(),
            Norm::PostFfn(il) => ls[il].post_ffn_norm.as_ref(),
            Norm::QHead(il) => ls[il].q_norm.as_ref(),
            Norm::KHead(il) => ls[il].k_norm.as_ref(),
        };
        v.ok_or_else(|| Error::Model(format!("cuda kernels: the model has no norm {n:?}")))
    }

    /// Sets up `mq2` at the first call (it stays None where the int8 products do not apply).
    fn init_mq2(&mut self) -> Result<()> {
        if !self.mq2_tried {
            self.mq2_tried = true;
            let (major, minor) = self.dev.compute_capability();
            let cc = (major.max(0) as u32, minor.max(0) as u32);
            if self.dt == ferrite_core::DType::F32
                && cc.0 >= 8
                && crate::env::flag_or("FERRITE_GPU_PREFILL_MMQ", true)
            {
                let c = &self.m.cfg;
                let widest = c.d_model.max(c.n_ff).max(c.n_head * c.head_dim);
                let most = ((c.n_head + 2 * c.n_kv_head) * c.head_dim)
                    .max(2 * c.n_ff)
                    .max(c.d_model);
                let rows = self.lim.max_rows;
                // the model's copies of its matrices, made now if no prefill made them
                self.m.mmq_copies()?;
                self.mq2 = Some(Mq2 {
                    q8: zeros(
                        &self.dev,
                        rows * matvec::q8x2_bytes(widest),
                        "llm engine q8x2 rows",
                    )?,
                    // two K splits of every output row
                    part: zeros(&self.dev, 2 * rows * most * 4, "llm engine partials")?,
                    cc,
                });
            }
        }
        Ok(())
    }

    /// A large step's product on the int8 tensor cores with two-level inputs (a model on f32
    /// activations): `mats` (matrix, first output element; with their biases) times norm(x)
    /// (the step's f32 rows) into `out` (row stride `ostride` floats) by `mode`. Returns
    /// false, having queued nothing, where they do not apply: the caller takes the cuBLASLt
    /// products.
    fn q8x2_product(
        &mut self,
        mats: &[(Mat, usize)],
        mode: Mode,
        (x, norm): (&Buffer, Option<(&Buffer, f32)>),
        out: &Buffer,
        ostride: usize,
    ) -> Result<bool> {
        use prefill::mmq_launches;
        use weights::mmq_matrix;
        self.init_mq2()?;
        let Some(mq) = &self.mq2 else {
            return Ok(false);
        };
        let copies = self.m.mmq_copies()?;
        let mut segs = Vec::with_capacity(mats.len());
        for &(w, out_off) in mats {
            let (m, bias) = self.mat(w);
            let (il, slot) = mat_slot(w);
            let Some(w) = mmq_matrix(copies, il, slot, m) else {
                return Ok(false);
            };
            segs.push(Seg { w, bias, out_off });
        }
        let q8 = mq.q8.clone();
        let scratch = (&mq.q8, &mq.part, mq.cc);
        let (xn, o) = ((x, norm), (out, ostride));
        let Some(mut ls) = mmq_launches(&self.dev, &segs, mode, xn, o, self.rows, scratch)? else {
            return Ok(false);
        };
        // The held attention output is this input: quantized from its f16 rows.
        if let (Some(h), Some(first)) = (&self.held_attn, ls.first_mut()) {
            if h.rows32 == x.ptr() && norm.is_none() {
                if let Some(l) = first.quantizing_half_input(h.rows16) {
                    *first = l;
                    self.held_attn = None;
                }
            }
        }
        // The held product that wrote this input quantizes it as it sums its splits (a GLU
        // product then writes no f32 rows: only this product reads them).
        if let (Some((h, at)), Some(first)) = (self.held, ls.first_mut()) {
            if at == x.ptr() && first.quantizes() {
                if let Some(h) = h.quantizing_next(segs[0].w.cols, norm, &q8)? {
                    self.held = Some((h, at));
                    *first = first.reusing_input();
                }
            }
        }
        self.flush()?;
        let glu = matches!(mode, Mode::GluSilu | Mode::GluGelu);
        let hold =
            ls.len() == 1 && (glu || segs.len() == 1 && matches!(mode, Mode::Store | Mode::Add));
        let n = ls.len();
        for (i, l) in ls.into_iter().enumerate() {
            if hold && i + 1 == n {
                self.held = Some((l, out.ptr()));
            } else {
                self.push(Launch::Matvec(l))?;
            }
        }
        Ok(true)
    }

    /// Plans one product over the step's rows: `segs` into `out` (row stride `ostride`
    /// floats), input `x` (packed rows), optional norm; fast mode where the model runs it.
    #[allow(clippy::too_many_arguments)]
    fn product(
        &mut self,
        segs: &[Seg<'_>],
        mode: Mode,
        x: &Buffer,
        norm: Option<(&Buffer, f32)>,
        out: &Buffer,
        ostride: usize,
        rows: usize,
    ) -> Result<()> {
        let cols = segs.first().map_or(0, |s| s.w.cols);
        let mut l = matvec::plan(self.sm, segs, mode, x, norm, out, None)?.with_rows(
            rows,
            cols * 4,
            ostride * 4,
        )?;
        if self.q8 {
            l = l.with_q8(self.sm, &self.q8buf)?;
            if rows >= self.mma_rows {
                let (major, minor) = self.dev.compute_capability();
                l = l.with_mma(
                    (major.max(0) as u32, minor.max(0) as u32),
                    self.sm,
                    self.mma_part.as_ref(),
                )?;
            }
        }
        self.push(Launch::Matvec(l))?;
        Ok(())
    }

    /// Queues `l` for the graph of a bucketed step, else launches it now (after the held
    /// product).
    fn push(&mut self, l: Launch) -> Result<()> {
        self.flush()?;
        self.push_now(l)
    }

    /// Launches (or queues) the held product, if any.
    fn flush(&mut self) -> Result<()> {
        if let Some(h) = self.held_attn.take() {
            self.push_now(Launch::Paged(h.copy))?;
        }
        match self.held.take() {
            Some((l, _)) => self.push_now(Launch::Matvec(l)),
            None => Ok(()),
        }
    }

    fn push_now(&mut self, l: Launch) -> Result<()> {
        if self.bucket.is_some() {
            self.plan.push(l);
            Ok(())
        } else {
            Ok(l.enqueue(&self.dev)?)
        }
    }

    /// The operand mode of the large steps' kernels (`pf_*`, `rows_to_h`): 0 f16, 1 bf16,
    /// 2 f32.
    fn mode(&self) -> u32 {
        match self.dt {
            ferrite_core::DType::F32 => 2,
            ferrite_core::DType::BF16 => 1,
            _ => 0,
        }
    }

    /// Bytes of one operand of the large steps.
    fn esize(&self) -> usize {
        self.dt.size_in_bytes()
    }

    /// The tensor-core scratch, allocated at the first step that needs it.
    fn tc_scratch(&mut self) -> Result<(Buffer, Buffer)> {
        if self.h16.is_none() {
            let c = &self.m.cfg;
            let widest = c.d_model.max(c.n_ff).max(c.n_head * c.head_dim);
            // the largest product: q, k and v side by side, gate and up side by side
            let size = |ws: &[&GpuMatrix]| ws.iter().map(|w| w.rows * w.cols).sum::<usize>();
            let most = self
                .m
                .layers
                .iter()
                .map(|l| {
                    size(&[gm(&l.wq), gm(&l.wk), gm(&l.wv)])
                        .max(size(&[gm(&l.w_gate), gm(&l.w_up)]))
                        .max(size(&[gm(&l.wo)]))
                        .max(size(&[gm(&l.w_down)]))
                })
                .max()
                .unwrap_or(0);
            let es = self.esize();
            self.h16 = Some(zeros(
                &self.dev,
                self.lim.max_rows * widest * es,
                "llm engine large-step activations",
            )?);
            self.w16 = Some(zeros(
                &self.dev,
                most * es + 64,
                "llm engine large-step weights",
            )?);
        }
        match (&self.h16, &self.w16) {
            (Some(h), Some(w)) => Ok((h.clone(), w.clone())),
            _ => Err(Error::Other(
                "cuda kernels: tensor-core scratch missing".into(),
            )),
        }
    }

    /// The f32 `[rows][2 * n_ff]` scratch of a large step's gate | up products.
    fn tc_gu(&mut self) -> Result<Buffer> {
        if self.gu32.is_none() {
            let bytes = self.lim.max_rows * 2 * self.m.cfg.n_ff * 4;
            self.gu32 = Some(zeros(&self.dev, bytes, "llm engine gate and up rows")?);
        }
        self.gu32
            .clone()
            .ok_or_else(|| Error::Other("cuda kernels: gate/up scratch missing".into()))
    }

    /// The step's rows of `x` (`cols` wide, RMS-normed by `norm` if given) as 16-bit rows.
    fn half_rows(&mut self, x: &Buffer, norm: Option<&Buffer>, cols: usize) -> Result<Buffer> {
        let (h, _) = self.tc_scratch()?;
        self.h16_holds = None;
        self.push(Launch::Paged(PagedLaunch::ToHalf {
            x: x.ptr(),
            w: norm.map_or(0, |w| w.ptr()),
            n: u32_of(cols, "columns")?,
            eps: self.m.cfg.eps,
            out: h.ptr(),
            mode: self.mode(),
            rows: u32_of(self.rows, "rows")?,
        }))?;
        Ok(h)
    }

    /// For each segment `(w, bias, off)`: `out[r][off..off + w.rows]` (row stride `stride`
    /// floats) (+)= h[r] . w^T (+ bias) for the step's rows, on tensor cores. Segments whose
    /// columns follow each other in `out` (q, k, v) are dequantized side by side and take
    /// one product.
    fn tc_products(
        &mut self,
        h: &Buffer,
        segs: &[(&GpuMatrix, Option<&Buffer>, usize)],
        out: &Buffer,
        stride: usize,
        acc: bool,
    ) -> Result<()> {
        self.flush()?;
        let (_, w16) = self.tc_scratch()?;
        let (dt, es, mode) = (self.dt, self.esize(), self.mode());
        let mut i = 0;
        while i < segs.len() {
            // segments i..j: one product
            let (w0, _, off0) = segs[i];
            let (mut j, mut n) = (i + 1, w0.rows);
            while j < segs.len() && segs[j].2 == off0 + n && segs[j].0.cols == w0.cols {
                n += segs[j].0.rows;
                j += 1;
            }
            let mut r = 0;
            for &(w, _, _) in &segs[i..j] {
                let at = w16.ptr() + (r * w.cols * es) as u64;
                prefill::dequant_rows(&self.dev, w, 0, w.rows, at, mode)?;
                r += w.rows;
            }
            self.dev.gemm_nt_f32(
                dt,
                (h, 0, w0.cols),
                (&w16, 0, w0.cols),
                (out, off0 * 4, stride),
                (self.rows, n, w0.cols),
                acc,
            )?;
            for &(w, bias, off) in &segs[i..j] {
                if let Some(b) = bias {
                    self.push(Launch::Paged(PagedLaunch::Bias {
                        out: out.ptr(),
                        bias: b.ptr(),
                        stride: u32_of(stride, "row stride")?,
                        off: u32_of(off, "column")?,
                        n: u32_of(w.rows, "rows")?,
                        rows: u32_of(self.rows, "rows")?,
                    }))?;
                }
            }
            i = j;
        }
        Ok(())
    }

    /// paged_attn over rows `rows` of a large step only (`at` planned for every row), its
    /// output rows then converted into the 16-bit rows of the next product.
    fn paged_rows(&mut self, at: &PagedAttnArgs, rows: std::ops::Range<usize>) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let (r0, n) = (rows.start as u64, u32_of(rows.len(), "rows")?);
        let w = u64::from(at.nh * at.hd);
        let mut a = *at;
        a.q += r0 * u64::from(a.q_stride) * 4;
        a.rows += r0 * 8;
        a.part += r0 * u64::from(a.nh * a.maxsplit * (a.hd + 2)) * 4;
        a.count += r0 * u64::from(a.nkv * a.ngrp) * 4;
        a.out += r0 * w * 4;
        self.push(Launch::Paged(PagedLaunch::Attn { args: a, rows: n }))?;
        let (h, _) = self.tc_scratch()?;
        self.push(Launch::Paged(PagedLaunch::ToHalf {
            x: a.out,
            w: 0,
            n: w as u32,
            eps: 0.0,
            out: h.ptr() + r0 * w * self.esize() as u64,
            mode: self.mode(),
            rows: n,
        }))
    }

    /// The flash op's f16 operands: q rows ([max rows][nh * hd], row r of the step at row r,
    /// written by `rope_store`), keys and values (`[nkv][lk][hd]`), made at first use.
    fn flash_scratch(&mut self) -> Result<[Buffer; 3]> {
        if self.flash.is_none() {
            let c = &self.m.cfg;
            let (hd, nh, nkv) = (c.head_dim, c.n_head, c.n_kv_head);
            let kvb = nkv * self.lim.ctx * hd * 2;
            self.flash = Some([
                zeros(
                    &self.dev,
                    self.lim.max_rows * nh * hd * 2,
                    "llm engine f16 q",
                )?,
                zeros(&self.dev, kvb, "llm engine f16 keys")?,
                zeros(&self.dev, kvb, "llm engine f16 values")?,
            ]);
        }
        self.flash
            .clone()
            .ok_or_else(|| Error::Other("cuda kernels: flash scratch missing".into()))
    }

    /// Causal attention of a prompt chunk `(r0, n, pos, toff)` (rows `r0..r0 + n` at
    /// positions `pos..pos + n`, block table at `toff`) on the flash attention op, its output
    /// into those rows of the 16-bit scratch. Their f16 q rows are in the flash scratch
    /// (`rope_store`); the keys and values of positions `0..pos + n` are gathered from the
    /// blocks unless `rope_store` wrote them there (`keys_written`: a chunk that starts its
    /// sequence).
    fn flash_rows(
        &mut self,
        kv: &CudaKvStore,
        il: usize,
        (r0, n, pos, toff): (usize, usize, usize, usize),
        keys_written: bool,
    ) -> Result<()> {
        self.flush()?;
        let lk = pos + n;
        let c = &self.m.cfg;
        let (hd, nh, nkv) = (c.head_dim, c.n_head, c.n_kv_head);
        let [qh, kh, vh] = self.flash_scratch()?;
        if !keys_written {
            self.push(Launch::Paged(PagedLaunch::KvGather {
                kc: kv.kc.ptr(),
                vc: kv.vc.ptr(),
                table: self.meta_ptr(self.layout.tables + toff),
                layer: u32_of(il, "layer")?,
                n_layer: u32_of(c.n_layer, "layers")?,
                nkv: nkv as u32,
                hd: hd as u32,
                lk: u32_of(lk, "positions")?,
                kout: kh.ptr(),
                vout: vh.ptr(),
            }))?;
        }
        let f16 = ferrite_core::DType::F16;
        let qt = self
            .dev
            .tensor(&qh, r0 * nh * hd * 2, &[1, n, nh, hd], f16)?
            .transpose(1, 2)?;
        let kt = self.dev.tensor(&kh, 0, &[1, nkv, lk, hd], f16)?;
        let vt = self.dev.tensor(&vh, 0, &[1, nkv, lk, hd], f16)?;
        let o = ferrite_core::Tensor::attention(&qt, &kt, &vt, true, Some(c.attn_scale as f64))?;
        let (ob, ooff) = self.dev.buffer_of(&o)?;
        let (h, _) = self.tc_scratch()?;
        let (rows16, rows32) = (
            ob.ptr() + ooff as u64,
            h.ptr() + (r0 * nh * hd * self.esize()) as u64,
        );
        let copy = PagedLaunch::AttnRows {
            o: rows16,
            nh: nh as u32,
            n: u32_of(n, "rows")?,
            hd: hd as u32,
            out: rows32,
            mode: self.mode(),
        };
        if (r0, n) == (0, self.rows) && self.dt == ferrite_core::DType::F32 {
            self.held_attn = Some(HeldAttn {
                copy,
                rows16,
                rows32,
                _out: o,
            });
            return Ok(());
        }
        self.push(Launch::Paged(copy))
    }

    fn meta_ptr(&self, section: usize) -> u64 {
        self.meta.ptr() + section as u64 * 4
    }

    /// The rows of `batch`'s prefill graph bucket, if it is a prompt chunk that starts its
    /// sequence alone in the step, without every row's logits, large enough for the int8
    /// tensor-core products (a model on f32 activations where they apply: the other large
    /// steps call cuBLASLt and dequantize as they plan).
    fn prefill_graph_rows(&self, batch: &Batch) -> Option<usize> {
        let [s] = &batch.seqs[..] else {
            return None;
        };
        let rows = batch.rows();
        let mq2 = self.dt == ferrite_core::DType::F32 && (self.mq2.is_some() || !self.mq2_tried);
        let ok = self.big_graphs
            && self.uses_graphs()
            && mq2
            && s.pos == 0
            && s.out != Out::All
            && rows >= self.tc_rows
            && rows <= MAX_PREFILL_GRAPH_ROWS;
        ok.then(|| prefill_bucket(rows, self.lim.max_rows.min(self.lim.ctx)))
    }

    /// The graph key of this step, if it is one that graphs serve: a decode-only step of a
    /// bucket, or a prefill chunk of a bucket (`big`), over the KV store whose keys are at
    /// `kv`.
    fn graph_key(&self, kv: u64) -> Option<GraphKey> {
        if !self.uses_graphs() {
            return None;
        }
        match (self.bucket, self.big) {
            (Some(b), _) => Some((b, kv, 0)),
            (None, Some(b)) => Some((b, kv, 1 + self.launch_out.min(1) as u8)),
            _ => None,
        }
    }

    /// Runs the planned step: through the bucket's graph where there is one, else eagerly.
    /// A prefill chunk's launches went out as they were planned (or into its recording).
    fn run(&mut self) -> Result<()> {
        self.flush()?;
        if let Some((rec, k)) = self.recording.take() {
            self.graphs.insert(k, rec.finish(Vec::new())?);
            return self.play(k).map(|_| ());
        }
        let key = self.graph_key(self.kv_key);
        if self.big.is_some() {
            if let Some(k) = key {
                self.warm.insert(k);
            }
            return Ok(());
        }
        match key {
            Some(k) => {
                if !self.graphs.contains_key(&k) {
                    if !self.warm.contains(&k) {
                        // First run of this bucket: compiles and loads the kernels outside a
                        // capture.
                        self.warm.insert(k);
                        return self.enqueue();
                    }
                    let g = self.dev.capture(|| {
                        self.enqueue().map_err(|e| {
                            ferrite_core::Error::backend("llm engine step", e.to_string())
                        })?;
                        Ok(Vec::new())
                    })?;
                    self.graphs.insert(k, g);
                }
                self.play(k).map(|_| ())
            }
            None => self.enqueue(),
        }
    }

    /// Replays the graph of `k`, if there is one.
    fn play(&mut self, k: GraphKey) -> Result<bool> {
        let Some(g) = self.graphs.get(&k) else {
            return Ok(false);
        };
        g.replay()?;
        self.replays += 1;
        Ok(true)
    }

    fn enqueue(&self) -> Result<()> {
        for l in &self.plan {
            l.enqueue(&self.dev)?;
        }
        Ok(())
    }
}

impl Kernels for CudaKernels<'_> {
    type Kv = CudaKvStore;

    fn begin(&mut self, batch: &Batch) -> Result<()> {
        // An unfinished recording or held launch (a step that failed while it was planned)
        // ends here.
        self.recording = None;
        self.held = None;
        self.held_attn = None;
        let (rows, n_out) = (batch.rows(), batch.out_rows());
        if rows == 0 || rows > self.lim.max_rows || n_out > self.lim.max_out {
            return Err(Error::Other(format!(
                "cuda kernels: a step of {rows} rows and {n_out} logit rows; this kernel set holds 1..={} rows and {} logit rows",
                self.lim.max_rows, self.lim.max_out
            )));
        }
        if batch.blocks.len() > self.lim.max_table {
            return Err(Error::Other(format!(
                "cuda kernels: {} block-table entries in one step; at most {}",
                batch.blocks.len(),
                self.lim.max_table
            )));
        }
        for s in &batch.seqs {
            let end = s.pos + s.rows.len();
            if s.blocks.len() * KV_BS < end || end > self.lim.ctx {
                return Err(Error::Other(format!(
                    "cuda kernels: a sequence at positions {}..{end} with {} blocks (context {})",
                    s.pos,
                    s.blocks.len(),
                    self.lim.ctx
                )));
            }
        }
        self.h16_holds = None;
        let decode_only = batch.seqs.iter().all(|s| s.rows.len() == 1) && n_out == rows;
        self.bucket = if decode_only {
            bucket(rows, self.lim.max_out)
        } else {
            None
        };
        self.big = if decode_only {
            None
        } else {
            self.prefill_graph_rows(batch)
        };
        self.rows = self.bucket.or(self.big).unwrap_or(rows);
        self.launch_out = self.bucket.unwrap_or(n_out);
        self.n_out = n_out;
        self.fetched = false;
        self.tc = self.bucket.is_none() && rows >= self.tc_rows;
        self.all_rows_out = decode_only;
        self.seqs.clear();
        if self.tc {
            // a prefill graph's chunk (the step's only sequence) takes its padding rows
            // along: they follow its rows, and the causal mask keeps them out of those
            let big = self.big;
            self.seqs.extend(batch.seqs.iter().map(|s| {
                let n = big.unwrap_or(s.rows.len());
                (s.rows.start, n, s.pos, s.blocks.start)
            }));
        }
        // A graph step's data is laid out for its bucket (a few hundred bytes to copy at
        // batch 1), the others' for the largest step; a graph reads the layout it was
        // captured with, and every step of its bucket packs the same one.
        self.layout = match self.bucket {
            Some(b) => MetaLayout::new(b, b, self.lim.max_table),
            None => self.full_layout,
        };
        let mail = self.next_mail_slot()?;
        pack_meta(
            batch,
            self.rows,
            self.launch_out,
            mail,
            &self.layout,
            &mut self.meta_host,
        );
        self.meta_bytes.clear();
        self.meta_bytes
            .extend(self.meta_host.iter().flat_map(|v| v.to_le_bytes()));
        self.dev.write_bytes(&self.meta, 0, &self.meta_bytes)?;
        self.plan.clear();
        Ok(())
    }

    /// Also begins the capture of a prefill chunk's graph the second time its key is seen
    /// (the chunk's launches then go into it as they are planned; `run` finishes it).
    fn replay(&mut self, kv: &mut CudaKvStore) -> Result<bool> {
        let Some(key) = self.graph_key(kv.kc.ptr()) else {
            return Ok(false);
        };
        if self.play(key)? {
            return Ok(true);
        }
        if self.big.is_some() && self.warm.contains(&key) {
            self.recording = Some((self.dev.record()?, key));
        }
        Ok(false)
    }

    fn embed(&mut self, out: Buf) -> Result<()> {
        let o = self.input(out)?;
        let (w, scale) = (self.m.embedding(), self.m.cfg.embed_scale);
        let l = matvec::plan_embed(w, &self.meta, o, scale, Some(&self.tokens_out))?
            .with_rows(u32_of(self.rows, "rows")?);
        self.push(Launch::Embed(l))?;
        Ok(())
    }

    fn norm_matmul(&mut self, x: Buf, norm: Option<Norm>, outs: &[(Mat, Buf)]) -> Result<()> {
        let xb = self.input(x)?.clone();
        let nb = match norm {
            Some(n) => Some(self.norm_w(n)?),
            None => None,
        };
        let eps = self.m.cfg.eps;
        let rows = self.rows;
        if self.tc && self.dt == ferrite_core::DType::F32 {
            // q, k and v: outputs of one buffer and row stride
            let (ob, _, stride, _) = self.view(outs[0].1);
            let ob = ob.clone();
            let one = outs.iter().all(|&(_, b)| {
                let (bb, _, st, _) = self.view(b);
                bb.ptr() == ob.ptr() && st == stride
            });
            let mats: Vec<(Mat, usize)> = outs.iter().map(|&(w, b)| (w, self.view(b).1)).collect();
            let x = (&xb, nb.map(|w| (w, eps)));
            if one && self.q8x2_product(&mats, Mode::Store, x, &ob, stride)? {
                return Ok(());
            }
        }
        if self.tc {
            let cols = self.view(x).3;
            let h = self.half_rows(&xb, nb, cols)?;
            // outputs in one buffer with one row stride take one pass (q, k, v)
            let mut i = 0;
            while i < outs.len() {
                let (ob, _, stride, _) = self.view(outs[i].1);
                let ob = ob.clone();
                let mut j = i + 1;
                while j < outs.len() && {
                    let (b, _, st, _) = self.view(outs[j].1);
                    b.ptr() == ob.ptr() && st == stride
                } {
                    j += 1;
                }
                let segs: Vec<(&GpuMatrix, Option<&Buffer>, usize)> = outs[i..j]
                    .iter()
                    .map(|&(w, b)| {
                        let (m, bias) = self.mat(w);
                        (m, bias, self.view(b).1)
                    })
                    .collect();
                self.tc_products(&h, &segs, &ob, stride, false)?;
                i = j;
            }
            return Ok(());
        }
        let first = outs
            .first()
            .map(|&(_, b)| self.view(b).0.ptr())
            .unwrap_or(0);
        let shared = outs.iter().all(|&(_, b)| self.view(b).0.ptr() == first) && outs.len() <= 3;
        let groups: Vec<&[(Mat, Buf)]> = if shared {
            vec![outs]
        } else {
            outs.chunks(1).collect()
        };
        for g in groups {
            let (ob, _, stride, _) = self.view(g[0].1);
            let ob = ob.clone();
            let segs: Vec<Seg<'_>> = g
                .iter()
                .map(|&(w, b)| {
                    let (m, bias) = self.mat(w);
                    Seg {
                        w: m,
                        bias,
                        out_off: self.view(b).1,
                    }
                })
                .collect();
            self.product(
                &segs,
                Mode::Store,
                &xb,
                nb.map(|n| (n, eps)),
                &ob,
                stride,
                rows,
            )?;
        }
        Ok(())
    }

    fn head_norm(&mut self, x: Buf, norm: Norm) -> Result<()> {
        let w = self.norm_w(norm)?;
        // q and k norms right before the attention: applied there, with RoPE (no launch)
        match (x, norm) {
            (Buf::Q, Norm::QHead(_)) => {
                self.head_norms.0 = w.ptr();
                return Ok(());
            }
            (Buf::K, Norm::KHead(_)) => {
                self.head_norms.1 = w.ptr();
                return Ok(());
            }
            _ => {}
        }
        let hd = self.m.cfg.head_dim;
        let (buf, off, stride, width) = self.view(x);
        self.push(Launch::Paged(PagedLaunch::HeadNorm {
            x: buf.ptr() + off as u64 * 4,
            w: w.ptr(),
            stride: u32_of(stride, "row stride")?,
            heads: u32_of(width / hd, "heads")?,
            hd: u32_of(hd, "head_dim")?,
            eps: self.m.cfg.eps,
            rows: u32_of(self.rows, "rows")?,
        }))?;
        Ok(())
    }

    fn rope_attention(
        &mut self,
        kv: &mut CudaKvStore,
        il: usize,
        q: Buf,
        k: Buf,
        v: Buf,
        out: Buf,
    ) -> Result<()> {
        if (q, k, v) != (Buf::Q, Buf::K, Buf::V) {
            return Err(Error::Other(format!(
                "cuda kernels: attention reads q, k, v from the Q/K/V rows, not {q:?}, {k:?}, {v:?}"
            )));
        }
        let c = &self.m.cfg;
        let (hd, nh, nkv) = (c.head_dim, c.n_head, c.n_kv_head);
        let local = c.is_local(il);
        let inv = if local {
            &self.m.inv_freq_local
        } else {
            &self.m.inv_freq
        };
        let smem = paged::rope_store_smem(nh, nkv, hd, c.rope_dim);
        if smem > 48 * 1024 {
            return Err(Error::Model(format!(
                "rope_store: {nh} + 2 x {nkv} heads of {hd} need {smem} bytes of shared memory; at most 49152"
            )));
        }
        let qkv_w = (nh + 2 * nkv) * hd;
        let rows = u32_of(self.rows, "rows")?;
        self.kv_key = kv.kc.ptr();
        // A decode-only step (one row per sequence) rotates and stores inside the attention;
        // a step with prompt chunks stores every row's keys before any row attends.
        let fused = self.all_rows_out;
        // A large step's prompt chunks of at least FLASH_ROWS rows (within a local layer's
        // window) attend on the flash op: rope_store then also writes every row's f16 q for
        // it, and the keys and values of a lone such chunk that starts its sequence (no
        // gather from the blocks).
        let window = if local { c.sliding_window } else { 0 };
        let flash_rows = self.flash_rows;
        let on_flash =
            move |n: usize, pos: usize| n >= flash_rows && (window == 0 || pos + n <= window);
        // (qh, kh, vh) device addresses, 0 where not written; rows f0..f1 write kh and vh
        let (mut qh, mut kh, mut vh, mut f0, mut f1) = (0u64, 0u64, 0u64, 0, 0);
        if self.tc && !fused {
            let chunks: Vec<(usize, usize, usize)> = self
                .seqs
                .iter()
                .filter(|&&(_, n, pos, _)| on_flash(n, pos))
                .map(|&(r0, n, pos, _)| (r0, n, pos))
                .collect();
            if !chunks.is_empty() {
                let [q, k, v] = self.flash_scratch()?;
                qh = q.ptr();
                if let [(r0, n, 0)] = chunks[..] {
                    (kh, vh) = (k.ptr(), v.ptr());
                    (f0, f1) = (u32_of(r0, "rows")?, u32_of(r0 + n, "rows")?);
                }
            }
        }
        let keys_written = kh != 0;
        // q and k head norms queued by head_norm (both or neither)
        let (qnorm, knorm) = std::mem::take(&mut self.head_norms);
        if (qnorm == 0) != (knorm == 0) {
            return Err(Error::Other(
                "cuda kernels: a q head norm without a k head norm (or the reverse)".into(),
            ));
        }
        let rs = RopeStoreArgs {
            qkv: self.qkv.ptr(),
            kc: kv.kc.ptr(),
            vc: kv.vc.ptr(),
            rows: self.meta_ptr(self.layout.rows),
            tables: self.meta_ptr(self.layout.tables),
            inv_freq: inv.ptr(),
            nh: nh as u32,
            nkv: nkv as u32,
            hd: hd as u32,
            layer: u32_of(il, "layer")?,
            n_layer: u32_of(c.n_layer, "layers")?,
            rope_dim: u32_of(c.rope_dim, "rope_dim")?,
            neox: u32::from(c.rope_neox),
            qkv_w: u32_of(qkv_w, "qkv width")?,
            pos_scale: if local { 1.0 } else { 1.0 / c.rope_scale },
            eps: c.eps,
            qnorm,
            knorm,
            qh,
            kh,
            vh,
            f0,
            f1,
            // the lone chunk starts at position 0: its keys end at f1 - f0
            lk: f1 - f0,
            pad2: 0,
        };
        if !fused {
            self.push(Launch::Paged(PagedLaunch::RopeStore {
                args: rs,
                rows,
                smem: smem as u32,
            }))?;
        }
        let (ob, ooff, ostride, owidth) = self.view(out);
        if ooff != 0 || ostride != nh * hd || owidth != nh * hd {
            return Err(Error::Other(format!(
                "cuda kernels: attention output {out:?} must be packed rows of {} values",
                nh * hd
            )));
        }
        let at = PagedAttnArgs {
            q: self.qkv.ptr(),
            kc: kv.kc.ptr(),
            vc: kv.vc.ptr(),
            rows: self.meta_ptr(self.layout.rows),
            tables: self.meta_ptr(self.layout.tables),
            part: self.part.ptr(),
            count: self.count.ptr(),
            out: ob.ptr(),
            nh: nh as u32,
            nkv: nkv as u32,
            hd: hd as u32,
            layer: il as u32,
            n_layer: c.n_layer as u32,
            maxsplit: u32_of(self.maxsplit, "splits")?,
            window: u32_of(if local { c.sliding_window } else { 0 }, "window")?,
            ngrp: u32_of(self.ngrp, "head groups")?,
            q_stride: qkv_w as u32,
            scale: c.attn_scale,
            inv_freq: rs.inv_freq,
            rope_dim: rs.rope_dim,
            neox: rs.neox,
            pos_scale: rs.pos_scale,
            fused: u32::from(fused),
            qnorm,
            knorm,
            eps: c.eps,
            split_keys: u32_of(self.split_keys, "split keys")?,
        };
        if !self.tc {
            return self.push(Launch::Paged(PagedLaunch::Attn { args: at, rows }));
        }
        // A large step: the flash chunks on the flash op, the other rows on paged_attn, in
        // runs of rows.
        let seqs = std::mem::take(&mut self.seqs);
        let mut run = 0..0;
        let mut res = Ok(());
        for &(r0, n, pos, toff) in &seqs {
            if on_flash(n, pos) {
                res = self
                    .paged_rows(&at, run.clone())
                    .and_then(|()| self.flash_rows(kv, il, (r0, n, pos, toff), keys_written));
                if res.is_err() {
                    break;
                }
                run = r0 + n..r0 + n;
            } else {
                run.end = r0 + n;
            }
        }
        self.seqs = seqs;
        res?;
        self.paged_rows(&at, run)?;
        self.h16_holds = Some(out);
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
        let xb = self.input(x)?.clone();
        let nw = self.norm_w(norm)?;
        let ob = self.input(out)?.clone();
        let (g, _) = self.mat(gate);
        let (u, _) = self.mat(up);
        let segs = [
            Seg {
                w: g,
                bias: None,
                out_off: 0,
            },
            Seg {
                w: u,
                bias: None,
                out_off: 0,
            },
        ];
        let mode = match act {
            Glu::Silu => Mode::GluSilu,
            Glu::GeluTanh => Mode::GluGelu,
        };
        let (eps, rows, ff) = (self.m.cfg.eps, self.rows, g.rows);
        if self.tc
            && self.dt == ferrite_core::DType::F32
            && self.q8x2_product(&[(gate, 0), (up, 0)], mode, (&xb, Some((nw, eps))), &ob, ff)?
        {
            return Ok(());
        }
        if self.tc {
            let h = self.half_rows(&xb, Some(nw), g.cols)?;
            // gate | up side by side in one product, then the gated unit
            let gu = self.tc_gu()?;
            self.tc_products(&h, &[(g, None, 0), (u, None, ff)], &gu, 2 * ff, false)?;
            // the gated unit goes straight into the 16-bit rows of the down product
            self.push(Launch::Paged(PagedLaunch::GluPairs {
                gu: gu.ptr(),
                out: h.ptr(),
                ff: u32_of(ff, "n_ff")?,
                n: u32_of(rows, "rows")?,
                gelu: u32::from(act == Glu::GeluTanh),
                mode: self.mode(),
            }))?;
            self.h16_holds = Some(out);
            return Ok(());
        }
        self.product(&segs, mode, &xb, Some((nw, eps)), &ob, ff, rows)
    }

    fn matmul_residual(&mut self, x: Buf, w: Mat, y: Buf, post_norm: Option<Norm>) -> Result<()> {
        let xb = self.input(x)?.clone();
        let yb = self.input(y)?.clone();
        let (m, bias) = self.mat(w);
        let seg = [Seg {
            w: m,
            bias,
            out_off: 0,
        }];
        let (d, rows, eps) = (self.m.cfg.d_model, self.rows, self.m.cfg.eps);
        // x . w added onto y, or with a post-norm stored into tmp and y += norm(tmp)
        let tmp = self.tmp.clone();
        let (mode, out) = match post_norm {
            None => (Mode::Add, &yb),
            Some(_) => (Mode::Store, &tmp),
        };
        let held = self.tc && self.h16_holds == Some(x);
        if held {
            self.h16_holds = None;
        }
        // a model on f32 activations: the int8 products read the input's f32 rows, in the
        // large-step scratch where its producer left them
        let q8x2 = self.tc && self.dt == ferrite_core::DType::F32 && {
            let xin = if held {
                self.tc_scratch()?.0
            } else {
                xb.clone()
            };
            self.q8x2_product(&[(w, 0)], mode, (&xin, None), out, d)?
        };
        if !q8x2 {
            if !self.tc {
                self.product(&seg, mode, &xb, None, out, d, rows)?;
            } else {
                let h = if held {
                    self.tc_scratch()?.0
                } else {
                    self.half_rows(&xb, None, m.cols)?
                };
                self.tc_products(&h, &[(m, bias, 0)], out, d, post_norm.is_none())?;
            }
        }
        if let Some(n) = post_norm {
            let pn = self.norm_w(n)?;
            let l =
                decode::plan_norm(&yb, &tmp, pn, d, eps, true)?.with_rows(u32_of(rows, "rows")?);
            self.push(Launch::Norm(l))?;
        }
        Ok(())
    }

    fn logits(&mut self, x: Buf) -> Result<()> {
        let xb = self.input(x)?.clone();
        let c = &self.m.cfg;
        let (d, vocab, eps) = (c.d_model, c.vocab, c.eps);
        let o = self.launch_out;
        if o > 0 {
            // A decode-only step wants every row's logits, in order: no gather.
            let src = if self.all_rows_out {
                xb.clone()
            } else {
                self.push(Launch::Paged(PagedLaunch::Gather {
                    src: xb.ptr(),
                    dst: self.xo.ptr(),
                    ids: self.meta_ptr(self.layout.out),
                    width: u32_of(d, "d_model")?,
                    rows: u32_of(o, "logit rows")?,
                }))?;
                self.xo.clone()
            };
            let seg = [Seg {
                w: self.m.output_matrix(),
                bias: None,
                out_off: 0,
            }];
            let (lg, on) = (self.logits.clone(), self.m.output_norm.clone());
            self.product(&seg, Mode::Store, &src, Some((&on, eps)), &lg, vocab, o)?;
            self.push(Launch::Paged(PagedLaunch::Argmax {
                logits: self.logits.ptr(),
                n: u32_of(vocab, "vocab")?,
                out: self.tokens_out.ptr(),
                part: self.am_part.ptr(),
                count: self.am_count.ptr(),
                mail: self.mail.base(),
                mail_slot: self.meta_ptr(self.layout.mail),
                mail_stride: u32_of(self.lim.max_out, "logit rows")?,
                rows: u32_of(o, "logit rows")?,
            }))?;
        }
        self.run()
    }
}

#[cfg(test)]
mod tests {
    use super::super::step::Out;
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_up_to_64_and_the_scratch() {
        assert_eq!(bucket(1, 64), Some(1));
        assert_eq!(bucket(3, 64), Some(4));
        assert_eq!(bucket(33, 64), Some(64));
        assert_eq!(bucket(64, 64), Some(64));
        assert_eq!(bucket(65, 512), None);
        assert_eq!(bucket(5, 6), None);
        assert_eq!(bucket(0, 64), None);
    }

    #[test]
    fn prefill_buckets_are_multiples_of_64_within_the_cap() {
        assert_eq!(prefill_bucket(32, 512), 64);
        assert_eq!(prefill_bucket(64, 512), 64);
        assert_eq!(prefill_bucket(65, 512), 128);
        assert_eq!(prefill_bucket(500, 512), 512);
        // the context or the step's rows cap the padding, never below the rows
        assert_eq!(prefill_bucket(70, 100), 100);
        assert_eq!(prefill_bucket(100, 100), 100);
        assert_eq!(prefill_bucket(120, 100), 120);
    }

    #[test]
    fn meta_lists_tokens_positions_tables_and_padding() {
        let mut b = Batch::default();
        b.push(&[7, 8, 9], 16, &[4, 5], Out::Last);
        b.push(&[3], 40, &[1, 2, 6], Out::All);
        let l = MetaLayout::new(8, 4, 16);
        assert_eq!(
            (l.rows, l.out, l.mail, l.tables, l.len),
            (8, 24, 28, 29, 45)
        );
        let mut m = Vec::new();
        pack_meta(&b, 6, 3, 5, &l, &mut m);
        assert_eq!(m.len(), 29 + 5);
        assert_eq!(&m[0..4], &[7, 8, 9, 3]);
        // rows: (pos, table offset); 4 and 5 are padding
        assert_eq!(&m[8..16], &[16, 0, 17, 0, 18, 0, 40, 2]);
        assert_eq!(&m[16..20], &[PAD_ROW, 0, PAD_ROW, 0]);
        // logit rows: row 2 (last of the first), row 3, then padding row 2 -> its own index
        assert_eq!(&m[24..27], &[2, 3, 2]);
        assert_eq!(m[28], 5);
        assert_eq!(&m[29..], &[4, 5, 1, 2, 6]);
        // an odd row count: the rows section stays 8-byte aligned
        let l = MetaLayout::new(1, 1, 4);
        assert_eq!((l.rows, l.out, l.mail, l.tables, l.len), (2, 4, 5, 6, 10));
    }
}
