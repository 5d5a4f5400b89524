//! The engine: requests in, tokens out, many sequences advanced per step.
//!
//! A caller adds requests (prompt tokens, sampling settings, limits) and calls [`Engine::step`]
//! repeatedly; each step runs one batch through the model definition ([`crate::model::step`])
//! and returns the new token (or the end) of every request that produced one. Scheduling:
//! every running sequence whose next input is one token (a decode step, or the last token of
//! its prompt) gets it; prompt chunks of the others fill the rest of the step's token budget
//! in arrival order (chunked prefill), so a long prompt never stalls the decoding sequences.
//!
//! Admission: a request may use up to `prompt + max_new` positions, which must fit the
//! context; it is admitted when the KV cache can hold the blocks it may need on top of what
//! the running sequences may still need (so a running sequence never finds the cache full),
//! else refused, or queued if it asked for that. Prompt prefixes already in the cache (blocks
//! of running sequences or of finished ones) are shared, not recomputed.

use std::collections::VecDeque;

use crate::error::{Error, Result};
use crate::gpu::GpuModel;
use crate::kv_cache::{CpuKvStore, KvStats, KvStore, PagedKv, BLOCK_SIZE};
use crate::logits_processor::LogitsProcessor;
use crate::model::step::{self, Batch, Kernels, Out};
use crate::model::{Config, CpuKernels, CudaKernels, CudaKvStore, CudaLimits, Model};
use crate::sampler::{Sampler, SamplerConfig};

/// What the engine needs of a kernel set besides the model definition's kernels: its KV
/// storage, and the results of a step (greedy tokens where the kernel set picks them itself,
/// else the logits on the host).
pub trait EngineKernels: Kernels<Kv: KvStore> {
    /// Storage for `n_blocks` blocks of [`BLOCK_SIZE`] positions.
    fn new_store(&self, n_blocks: usize) -> Result<Self::Kv>;
    /// The token of each logit row of the last step, where the kernel set picks them
    /// (CUDA, wgpu): the greedy one (largest logit, lowest id on ties), or the device sampler's for
    /// the rows given to [`EngineKernels::sample_rows`]; None: the engine samples from
    /// [`EngineKernels::host_logits`].
    fn device_tokens(&mut self) -> Result<Option<Vec<u32>>>;
    /// Starts sampling request `id` on the device (settings `cfg`, token history `history`,
    /// room for `cap` history tokens in all); false where the kernel set has no device
    /// sampler and the engine samples on the host.
    fn add_sampler(
        &mut self,
        _id: u64,
        _cfg: &SamplerConfig,
        _history: &[u32],
        _cap: usize,
    ) -> Result<bool> {
        Ok(false)
    }
    /// Ends request `id`'s device sampler, if it has one.
    fn remove_sampler(&mut self, _id: u64) {}
    /// Draws the tokens of the given (logit row, request id) pairs of the last step with
    /// their device samplers; [`EngineKernels::device_tokens`] then returns them.
    fn sample_rows(&mut self, rows: &[(usize, u64)]) -> Result<()> {
        if rows.is_empty() {
            Ok(())
        } else {
            Err(Error::Other(
                "engine: this kernel set samples on the host".into(),
            ))
        }
    }
    /// Whether a step's input token may be the previous step's pick of the same row left on
    /// the device (`step::PREV_TOKEN`), with picks read later (`queue_tokens`, `take_tokens`):
    /// a decode loop then queues step n + 1 before it waits for step n's token.
    fn chains_picks(&self) -> bool {
        false
    }
    /// Queues the read of the last step's picks (`device_tokens`' values) without waiting.
    fn queue_tokens(&mut self) -> Result<()> {
        Err(Error::Other(
            "engine: this kernel set does not chain its picks".into(),
        ))
    }
    /// The picks of the oldest step whose read `queue_tokens` queued (waits for that step).
    fn take_tokens(&mut self) -> Result<Vec<u32>> {
        Err(Error::Other(
            "engine: this kernel set does not chain its picks".into(),
        ))
    }
    /// The last step's logits on the host, `[logit rows][vocab]` (the sampler's penalties
    /// change them in place).
    fn host_logits(&mut self) -> Result<&mut [f32]>;
    /// The host logits of the last step, if `host_logits` produced them.
    fn last_host_logits(&self) -> Option<&[f32]>;
}

impl EngineKernels for CpuKernels<'_> {
    fn new_store(&self, n_blocks: usize) -> Result<CpuKvStore> {
        let c = &self.model().cfg;
        // f16 KV as on CUDA, f32 for the exact mode (its reference contract).
        let half = self.model().precision() != crate::model::Precision::Exact;
        CpuKvStore::new(
            c.n_layer,
            c.n_kv_head,
            c.head_dim,
            BLOCK_SIZE,
            n_blocks,
            half,
        )
        .map_err(|e| crate::Error::Context(e.to_string()))
    }

    fn device_tokens(&mut self) -> Result<Option<Vec<u32>>> {
        Ok(None)
    }

    fn host_logits(&mut self) -> Result<&mut [f32]> {
        Ok(self.logits_mut())
    }

    fn last_host_logits(&self) -> Option<&[f32]> {
        Some(self.logits())
    }
}

impl EngineKernels for CudaKernels<'_> {
    fn new_store(&self, n_blocks: usize) -> Result<CudaKvStore> {
        CudaKvStore::new(self.model(), n_blocks)
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
        // FERRITE_GPU_DEVICE_SAMPLING=0: on the host (to compare)
        if !crate::env::flag_or("FERRITE_GPU_DEVICE_SAMPLING", true) {
            return Ok(false);
        }
        CudaKernels::add_sampler(self, id, cfg, history, cap)?;
        Ok(true)
    }

    fn remove_sampler(&mut self, id: u64) {
        CudaKernels::remove_sampler(self, id);
    }

    fn sample_rows(&mut self, rows: &[(usize, u64)]) -> Result<()> {
        CudaKernels::sample_rows(self, rows)
    }

    fn chains_picks(&self) -> bool {
        self.chains()
    }

    fn queue_tokens(&mut self) -> Result<()> {
        CudaKernels::queue_tokens(self)
    }

    fn take_tokens(&mut self) -> Result<Vec<u32>> {
        CudaKernels::take_tokens(self)
    }

    fn host_logits(&mut self) -> Result<&mut [f32]> {
        self.fetch_logits()
    }

    fn last_host_logits(&self) -> Option<&[f32]> {
        self.fetched_logits()
    }
}

/// Names a request for its whole life (never reused by an engine).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "request {}", self.0)
    }
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct Request {
    /// At least one token, each inside the vocabulary.
    pub prompt: Vec<u32>,
    pub sampling: SamplerConfig,
    /// Most tokens to generate (>= 1).
    pub max_new: usize,
    /// Tokens that end the request when sampled (end-of-text ids); not returned as output.
    pub stop_tokens: Vec<u32>,
    /// Wait for room when the cache cannot take the request now, instead of a refusal.
    pub queue: bool,
}

impl Request {
    /// Greedy, `max_new` tokens, no stop tokens, refused when it does not fit now.
    pub fn greedy(prompt: Vec<u32>, max_new: usize) -> Request {
        Request {
            prompt,
            sampling: SamplerConfig::greedy(),
            max_new,
            stop_tokens: Vec::new(),
            queue: false,
        }
    }
}

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// This stop token was sampled (not part of the output).
    StopToken(u32),
    /// `max_new` tokens were generated.
    MaxTokens,
}

/// One request's news from a step: a new token, the end, or both (the last token).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepOutput {
    pub id: RequestId,
    pub token: Option<u32>,
    pub finish: Option<FinishReason>,
}

/// Engine sizes.
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    /// Most positions (prompt + generated) of one sequence; at most the model's context.
    pub ctx: usize,
    /// Blocks of [`BLOCK_SIZE`] positions in the KV cache, shared by all sequences.
    pub kv_blocks: usize,
    /// Most sequences in one step.
    pub max_seqs: usize,
    /// Most tokens in one step (decode tokens plus prompt chunks); >= `max_seqs`.
    pub step_tokens: usize,
}

impl EngineConfig {
    /// `max_seqs` sequences of up to `ctx` positions each, all of them at once.
    pub fn new(ctx: usize, max_seqs: usize) -> EngineConfig {
        EngineConfig {
            ctx,
            kv_blocks: max_seqs * (ctx.div_ceil(BLOCK_SIZE) + 1),
            max_seqs,
            step_tokens: 512.max(max_seqs),
        }
    }
}

/// Counters (for a server's `/metrics`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub kv: KvStats,
}

struct Seq {
    id: RequestId,
    /// Prompt, then the generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Positions whose keys and values are in the cache.
    computed: usize,
    max_new: usize,
    stop_tokens: Vec<u32>,
    sampler: Sampler,
    /// Blocks it may take from the pool over its life.
    need_blocks: usize,
    /// Runs on the logits before the sampler (logit bias, constrained decoding).
    processor: Option<Box<dyn LogitsProcessor>>,
    /// Its tokens are drawn by the kernel set's device sampler (not `sampler`).
    on_device: bool,
}

impl Seq {
    fn pending(&self) -> usize {
        self.tokens.len() - self.computed
    }
}

/// The engine over one model and a kernel set (see the module docs): `Engine<'m>` runs on
/// the CPU ([`Engine::new`]), `Engine<'m, CudaKernels<'m>>` on a CUDA device
/// ([`Engine::cuda`]).
pub struct Engine<'m, K: EngineKernels = CpuKernels<'m>> {
    mcfg: &'m Config,
    cfg: EngineConfig,
    kv: PagedKv,
    store: K::Kv,
    k: K,
    /// Read every step's logits to the host even where the kernel set picks greedy tokens.
    keep_logits: bool,
    batch: Batch,
    running: Vec<Seq>,
    waiting: VecDeque<Seq>,
    next_id: u64,
    /// (index into `running`, tokens fed) of the current step.
    plan: Vec<(usize, usize)>,
    /// The logit row of each request that sampled in the last step.
    sampled: Vec<(RequestId, usize)>,
}

impl<'m> Engine<'m> {
    /// An engine on the CPU.
    pub fn new(model: &'m Model, cfg: EngineConfig) -> Result<Engine<'m>> {
        Engine::with_kernels(&model.cfg, cfg, CpuKernels::new(model))
    }

    pub fn model(&self) -> &'m Model {
        self.k.model()
    }
}

impl<'g> Engine<'g, CudaKernels<'g>> {
    /// An engine on the CUDA device holding `m` (scratch for `cfg.step_tokens` rows, a
    /// device KV cache of `cfg.kv_blocks` blocks).
    pub fn cuda(m: &'g GpuModel, cfg: EngineConfig) -> Result<Engine<'g, CudaKernels<'g>>> {
        let lim = CudaLimits {
            max_rows: cfg.step_tokens,
            max_out: cfg.max_seqs,
            max_table: cfg.max_seqs.saturating_mul(cfg.ctx.div_ceil(BLOCK_SIZE)),
            ctx: cfg.ctx,
        };
        Self::check(&m.cfg, &cfg)?;
        Engine::with_kernels(&m.cfg, cfg, CudaKernels::new(m, lim)?)
    }

    pub fn kernels(&self) -> &CudaKernels<'g> {
        &self.k
    }

    pub fn kernels_mut(&mut self) -> &mut CudaKernels<'g> {
        &mut self.k
    }
}

impl<'m, K: EngineKernels> Engine<'m, K> {
    fn check(c: &Config, cfg: &EngineConfig) -> Result<()> {
        if cfg.ctx == 0 || cfg.ctx > c.ctx_train {
            return Err(Error::Context(format!(
                "engine: context {} must be between 1 and the model's context length {}",
                cfg.ctx, c.ctx_train
            )));
        }
        if cfg.max_seqs == 0 || cfg.step_tokens < cfg.max_seqs {
            return Err(Error::Other(format!(
                "engine: max_seqs {} must be >= 1 and at most step_tokens {}",
                cfg.max_seqs, cfg.step_tokens
            )));
        }
        Ok(())
    }

    /// An engine over the kernel set `k` of a model of configuration `mcfg`.
    pub fn with_kernels(mcfg: &'m Config, cfg: EngineConfig, k: K) -> Result<Engine<'m, K>> {
        Self::check(mcfg, &cfg)?;
        let kv = PagedKv::new(cfg.kv_blocks, BLOCK_SIZE)?;
        let store = k.new_store(cfg.kv_blocks)?;
        Ok(Engine {
            mcfg,
            cfg,
            kv,
            store,
            k,
            keep_logits: false,
            batch: Batch::default(),
            running: Vec::new(),
            waiting: VecDeque::new(),
            next_id: 0,
            plan: Vec::new(),
            sampled: Vec::new(),
        })
    }

    /// Read every step's logits to the host (for [`Engine::last_logits`]) even where the
    /// kernel set picks greedy tokens itself (CUDA, wgpu). Off by default.
    pub fn set_keep_logits(&mut self, on: bool) {
        self.keep_logits = on;
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv: self.kv.stats(),
        }
    }

    /// Whether any request is running or waiting.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// Validates and admits (or queues) a request. Errors, before any work: an empty prompt,
    /// a token or stop-token id outside the vocabulary, `max_new == 0`, sampler settings out
    /// of range, prompt + `max_new` over the context or over the whole cache, or (unless
    /// `queue`) over what the cache can take now; each names the numbers.
    pub fn add_request(&mut self, req: Request) -> Result<RequestId> {
        self.add_request_with(req, None)
    }

    /// [`Engine::add_request`] with a [`LogitsProcessor`] that sees the request's logits
    /// before its sampler does, and every token it then samples.
    pub fn add_request_with(
        &mut self,
        req: Request,
        processor: Option<Box<dyn LogitsProcessor>>,
    ) -> Result<RequestId> {
        let vocab = self.mcfg.vocab;
        if req.prompt.is_empty() {
            return Err(Error::Other("engine: empty prompt".into()));
        }
        if let Some(&id) = req
            .prompt
            .iter()
            .chain(&req.stop_tokens)
            .find(|&&t| t as usize >= vocab)
        {
            return Err(Error::Token { id, vocab });
        }
        if req.max_new == 0 {
            return Err(Error::Other(
                "engine: max_new must be at least 1, got 0".into(),
            ));
        }
        let sampler = Sampler::new(req.sampling).map_err(|e| Error::Other(e.to_string()))?;
        let (p, n) = (req.prompt.len(), req.max_new);
        let positions = p.saturating_add(n);
        if positions > self.cfg.ctx {
            return Err(Error::Context(format!(
                "prompt of {p} tokens plus up to {n} generated need {positions} positions, but the context is {}",
                self.cfg.ctx
            )));
        }
        let need = self.kv.blocks_needed(positions);
        let total = self.kv.n_blocks();
        if need > total {
            return Err(Error::Context(format!(
                "prompt of {p} tokens plus up to {n} generated need {need} KV blocks of {BLOCK_SIZE} positions, but the cache has {total}"
            )));
        }
        let id = RequestId(self.next_id);
        self.next_id += 1;
        let seq = Seq {
            id,
            tokens: req.prompt,
            prompt_len: p,
            computed: 0,
            max_new: n,
            stop_tokens: req.stop_tokens,
            sampler,
            need_blocks: need,
            processor,
            on_device: false,
        };
        if self.waiting.is_empty() && self.fits_now(need) {
            self.start(seq)?;
        } else if req.queue {
            self.waiting.push_back(seq);
        } else if self.running.len() >= self.cfg.max_seqs {
            return Err(Error::Context(format!(
                "engine: {} sequences are running, the most at once",
                self.cfg.max_seqs
            )));
        } else {
            return Err(Error::Context(format!(
                "prompt of {p} tokens plus up to {n} generated need {need} KV blocks of {BLOCK_SIZE} positions, but {} of {total} are free now",
                self.free_now()
            )));
        }
        Ok(id)
    }

    /// Blocks not promised to running sequences.
    fn free_now(&self) -> usize {
        let promised: usize = self
            .running
            .iter()
            .map(|s| s.need_blocks.saturating_sub(self.kv.taken(s.id.0)))
            .sum();
        self.kv.available().saturating_sub(promised)
    }

    fn fits_now(&self, need: usize) -> bool {
        self.running.len() < self.cfg.max_seqs && need <= self.free_now()
    }

    fn start(&mut self, mut seq: Seq) -> Result<()> {
        // A request that samples (not greedy) without a logits processor draws its tokens on
        // the device where the kernel set can: no logits to the host.
        if seq.processor.is_none() && !seq.sampler.config().is_plain_greedy() {
            let cap = seq.prompt_len + seq.max_new;
            seq.on_device = self
                .k
                .add_sampler(seq.id.0, seq.sampler.config(), &seq.tokens, cap)?;
        }
        match self.kv.add_seq(seq.id.0, &seq.tokens) {
            Ok(c) => seq.computed = c,
            Err(e) => {
                self.k.remove_sampler(seq.id.0);
                return Err(e);
            }
        }
        self.running.push(seq);
        Ok(())
    }

    /// Ends a request now, freeing its blocks; an unknown or finished id is a no-op.
    /// Returns whether a request was running or waiting.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            self.running.remove(i);
            self.kv.remove(id.0);
            self.k.remove_sampler(id.0);
            true
        } else if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(i);
            true
        } else {
            false
        }
    }

    /// Runs one step over every running sequence (after admitting waiting requests that fit)
    /// and returns what each request that sampled produced. No work: an empty list.
    pub fn step(&mut self) -> Result<Vec<StepOutput>> {
        while let Some(s) = self.waiting.front() {
            if !self.fits_now(s.need_blocks) {
                break;
            }
            let s = self.waiting.pop_front().unwrap_or_else(|| unreachable!());
            self.start(s)?;
        }
        let mut outputs = Vec::new();
        self.sampled.clear();
        if self.running.is_empty() {
            return Ok(outputs);
        }
        // Decode tokens (and last prompt tokens) first, then prompt chunks in arrival order.
        self.plan.clear();
        let mut budget = self.cfg.step_tokens;
        for (i, s) in self.running.iter().enumerate() {
            if s.pending() == 1 {
                self.plan.push((i, 1));
                budget -= 1;
            }
        }
        for (i, s) in self.running.iter().enumerate() {
            if s.pending() > 1 && budget > 0 {
                let n = s.pending().min(budget);
                self.plan.push((i, n));
                budget -= n;
            }
        }
        self.batch.clear();
        for &(i, n) in &self.plan {
            let s = &self.running[i];
            self.kv.prepare(s.id.0, n, &mut self.store)?;
            let out = if s.computed + n == s.tokens.len() {
                Out::Last
            } else {
                Out::None
            };
            let toks = &s.tokens[s.computed..s.computed + n];
            self.batch
                .push(toks, s.computed, self.kv.table(s.id.0), out);
        }
        step::forward(self.mcfg, &mut self.k, &mut self.store, &self.batch)?;
        let vocab = self.mcfg.vocab;
        // Logit rows follow the plan: one per sequence whose input ends this step. Rows of
        // device samplers are drawn there; the others need the host logits unless they are
        // greedy (the kernel set's pick) and nothing asked for the logits.
        let mut on_device = Vec::new();
        let mut host = self.keep_logits;
        let mut row = 0;
        for &(i, n) in &self.plan {
            let s = &self.running[i];
            if s.computed + n == s.tokens.len() {
                if s.on_device {
                    on_device.push((row, s.id.0));
                } else if s.processor.is_some() || !s.sampler.config().is_plain_greedy() {
                    host = true;
                }
                row += 1;
            }
        }
        self.k.sample_rows(&on_device)?;
        let picked = if host && on_device.is_empty() {
            None
        } else {
            self.k.device_tokens()?
        };
        let host = host || picked.is_none();
        if host {
            self.k.host_logits()?;
            self.run_processors()?;
        }
        let mut row = 0;
        let mut done = Vec::new();
        for &(i, n) in &self.plan {
            let s = &mut self.running[i];
            self.kv
                .commit(s.id.0, &s.tokens[s.computed..s.computed + n])?;
            s.computed += n;
            if s.computed < s.tokens.len() {
                continue;
            }
            self.sampled.push((s.id, row));
            let tok = match &picked {
                Some(t) if s.on_device || !host => t[row],
                _ => {
                    // Its processor (if any) has run on this row in `run_processors`.
                    let logits = &mut self.k.host_logits()?[row * vocab..(row + 1) * vocab];
                    s.sampler
                        .sample(logits, &s.tokens)
                        .map_err(|e| Error::Other(format!("engine: {}: {e}", s.id)))?
                }
            };
            if let Some(p) = &mut s.processor {
                p.accept(tok);
            }
            row += 1;
            let out = if s.stop_tokens.contains(&tok) {
                StepOutput {
                    id: s.id,
                    token: None,
                    finish: Some(FinishReason::StopToken(tok)),
                }
            } else {
                s.tokens.push(tok);
                let finished = s.tokens.len() - s.prompt_len >= s.max_new;
                StepOutput {
                    id: s.id,
                    token: Some(tok),
                    finish: finished.then_some(FinishReason::MaxTokens),
                }
            };
            if out.finish.is_some() {
                done.push(s.id);
            }
            outputs.push(out);
        }
        for id in done {
            self.cancel(id);
        }
        Ok(outputs)
    }

    /// Runs the logits processor of every sequence that samples in this step on its row of
    /// the host logits, in parallel (a grammar constraint's mask is a trie walk per row).
    /// Rows follow the plan: one per sequence whose input ends this step.
    fn run_processors(&mut self) -> Result<()> {
        let vocab = self.mcfg.vocab;
        let mut jobs: Vec<(usize, usize)> = Vec::new();
        let mut row = 0;
        for &(i, n) in &self.plan {
            let s = &self.running[i];
            if s.computed + n == s.tokens.len() {
                if s.processor.is_some() {
                    jobs.push((row, i));
                }
                row += 1;
            }
        }
        if jobs.is_empty() {
            return Ok(());
        }
        let logits = self.k.host_logits()?;
        let mut rows: Vec<Option<&mut [f32]>> = logits.chunks_mut(vocab).map(Some).collect();
        let mut seqs: Vec<Option<&mut Seq>> = self.running.iter_mut().map(Some).collect();
        let mut work = Vec::with_capacity(jobs.len());
        for (r, i) in jobs {
            if let (Some(l), Some(s)) = (
                rows.get_mut(r).and_then(Option::take),
                seqs.get_mut(i).and_then(Option::take),
            ) {
                work.push((l, s));
            }
        }
        use rayon::prelude::*;
        work.par_iter_mut().try_for_each(|(l, s)| {
            let Seq {
                processor,
                tokens,
                id,
                ..
            } = &mut **s;
            match processor {
                Some(p) => p
                    .process(l, tokens)
                    .map_err(|e| Error::Other(format!("engine: {id}: {e}"))),
                None => Ok(()),
            }
        })
    }

    /// The logits request `id` sampled from in the last step (after the sampler's
    /// penalties, if it has any), or None if it did not sample then.
    /// On CUDA and wgpu only where the step read its logits (a request sampling on the host
    /// was in it, or [`Engine::set_keep_logits`]).
    pub fn last_logits(&self, id: RequestId) -> Option<&[f32]> {
        let vocab = self.mcfg.vocab;
        let &(_, row) = self.sampled.iter().find(|(r, _)| *r == id)?;
        self.k
            .last_host_logits()
            .and_then(|l| l.get(row * vocab..(row + 1) * vocab))
    }

    /// Steps until every request has ended; returns each request's generated tokens and
    /// finish reason, by id.
    pub fn run_to_end(&mut self) -> Result<Vec<(RequestId, Vec<u32>, FinishReason)>> {
        let mut acc: std::collections::BTreeMap<RequestId, Vec<u32>> = Default::default();
        let mut out = Vec::new();
        while self.has_work() {
            for o in self.step()? {
                let toks = acc.entry(o.id).or_default();
                toks.extend(o.token);
                if let Some(f) = o.finish {
                    out.push((o.id, acc.remove(&o.id).unwrap_or_default(), f));
                }
            }
        }
        out.sort_by_key(|(id, _, _)| *id);
        Ok(out)
    }
}
