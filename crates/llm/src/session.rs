//! One sequence over the model definition on any kernel set: what `run`, `chat`,
//! `perplexity` and the batch-1 `bench` drive. A [`Session`] is a batch of one sequence with
//! its own paged KV cache of `ctx` positions, stepped through [`step::forward`] with the
//! kernel set's step limits; [`crate::engine::Engine`] runs many sequences over the same
//! kernel sets.
//!
//! Where the kernel set picks tokens itself (CUDA, wgpu: the greedy pick, or a device
//! sampler set by [`Session::set_sampler`]), [`Session::forward_pick`] returns the next
//! token with 4 bytes read back; the logits stay on the device unless asked for. Where it
//! also chains its picks (CUDA, wgpu), a decode loop keeps one step queued ahead of the token it
//! reads ([`Session::forward_queue`], [`Session::forward_chained`], [`Session::take_pick`]),
//! so the device does not idle while the host reads a token and queues the next step. A
//! chained step's input is recorded in the KV bookkeeping as `PREV_TOKEN` (a session never
//! shares its blocks by prefix, so those records are not read).

use crate::engine::EngineKernels;
use crate::error::{Error, Result};
use crate::gpu::GpuModel;
use crate::kv_cache::{PagedKv, BLOCK_SIZE};
use crate::model::step::{self, Batch, Out, PREV_TOKEN};
use crate::model::{
    Config, CpuKernels, CudaKernels, CudaLimits, Logits, Model, WgpuKernels, WgpuModel, MAX_BATCH,
};
use crate::sampler::SamplerConfig;

/// Rows of one CUDA session step (prompt chunks): the size the prefill's tensor-core
/// products were tuned for.
pub const CUDA_ROWS: usize = 512;

/// Logit rows one CUDA session step may return (`Logits::All`): as many as fit 16M values
/// (64 MiB), 1 to [`CUDA_ROWS`].
pub fn cuda_out_rows(vocab: usize) -> usize {
    (16 * 1024 * 1024 / vocab.max(1)).clamp(1, CUDA_ROWS)
}

/// The sequence id of a session's only sequence.
const SEQ: u64 = 0;

/// One sequence on a kernel set: `Session<'m>` on the CPU ([`Session::new`]),
/// `Session<'g, CudaKernels<'g>>` on CUDA ([`Session::cuda`]), `Session<'g, WgpuKernels<'g>>`
/// on wgpu ([`Session::wgpu`]).
pub struct Session<'m, K: EngineKernels = CpuKernels<'m>> {
    cfg: &'m Config,
    ctx: usize,
    /// Most rows in one step, and most logit rows (`Logits::All` steps are cut to these).
    rows: usize,
    out_rows: usize,
    // Boxed: keeps the session small (the CLI holds one in an enum).
    kv: Box<PagedKv>,
    store: K::Kv,
    k: K,
    batch: Batch,
    /// Logits of a multi-step `Logits::All` call, gathered on the host.
    logits: Vec<f32>,
    /// Whether the kernel set draws this sequence's tokens with a device sampler.
    device_sampler: bool,
}

impl<'m> Session<'m> {
    /// A CPU session whose KV cache holds `ctx` positions (1..=the model's context length).
    pub fn new(model: &'m Model, ctx: usize) -> Result<Session<'m>> {
        Session::with_kernels(
            &model.cfg,
            ctx,
            CpuKernels::new(model),
            MAX_BATCH,
            MAX_BATCH,
        )
    }

    pub fn model(&self) -> &'m Model {
        self.k.model()
    }
}

impl<'g> Session<'g, CudaKernels<'g>> {
    /// A session on the CUDA device holding `m`, with a KV cache of `ctx` positions: steps of
    /// up to [`CUDA_ROWS`] rows, decode steps replayed from a captured graph.
    pub fn cuda(m: &'g GpuModel, ctx: usize) -> Result<Session<'g, CudaKernels<'g>>> {
        check_ctx(&m.cfg, ctx)?;
        let out_rows = cuda_out_rows(m.cfg.vocab);
        let lim = CudaLimits {
            max_rows: CUDA_ROWS,
            max_out: out_rows,
            max_table: ctx.div_ceil(BLOCK_SIZE),
            ctx,
        };
        let k = CudaKernels::new(m, lim)?;
        Session::with_kernels(&m.cfg, ctx, k, CUDA_ROWS, out_rows)
    }
}

impl<'g> Session<'g, WgpuKernels<'g>> {
    /// A session on the wgpu device holding `m`, with a KV cache of `ctx` positions.
    pub fn wgpu(m: &'g WgpuModel, ctx: usize) -> Result<Session<'g, WgpuKernels<'g>>> {
        Session::with_kernels(&m.cfg, ctx, WgpuKernels::new(m), MAX_BATCH, MAX_BATCH)
    }
}

fn check_ctx(c: &Config, ctx: usize) -> Result<()> {
    if ctx == 0 || ctx > c.ctx_train {
        return Err(Error::Context(format!(
            "context size {ctx} must be between 1 and the model's context length {}",
            c.ctx_train
        )));
    }
    Ok(())
}

impl<'m, K: EngineKernels> Session<'m, K> {
    /// A session over kernel set `k` of a model of configuration `cfg`: a KV cache of `ctx`
    /// positions, steps of at most `rows` rows and `out_rows` logit rows.
    pub fn with_kernels(
        cfg: &'m Config,
        ctx: usize,
        k: K,
        rows: usize,
        out_rows: usize,
    ) -> Result<Session<'m, K>> {
        check_ctx(cfg, ctx)?;
        if rows == 0 || out_rows == 0 || out_rows > rows {
            return Err(Error::Other(format!(
                "session: steps of {rows} rows and {out_rows} logit rows (need rows >= logit rows >= 1)"
            )));
        }
        let blocks = ctx.div_ceil(BLOCK_SIZE);
        let store = k.new_store(blocks)?;
        let mut kv = PagedKv::new(blocks, BLOCK_SIZE)?;
        kv.add_seq(SEQ, &[])?;
        Ok(Session {
            cfg,
            ctx,
            rows,
            out_rows,
            kv: Box::new(kv),
            store,
            k,
            batch: Batch::default(),
            logits: Vec::new(),
            device_sampler: false,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &'m Config {
        self.cfg
    }

    /// Tokens processed so far (the position of the next token).
    pub fn pos(&self) -> usize {
        self.kv.len(SEQ)
    }

    /// Capacity of the KV cache in tokens.
    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// The kernel set (its counters and switches).
    pub fn kernels(&self) -> &K {
        &self.k
    }

    pub fn kernels_mut(&mut self) -> &mut K {
        &mut self.k
    }

    /// The KV storage.
    pub fn kv_store(&self) -> &K::Kv {
        &self.store
    }

    /// Forgets every position from `pos` on (`pos <= self.pos()`).
    pub fn truncate(&mut self, pos: usize) {
        self.kv.truncate(SEQ, pos);
    }

    /// Checks that `tokens` fit after the cached positions and are inside the vocabulary.
    fn check(&self, tokens: &[u32]) -> Result<()> {
        let vocab = self.cfg.vocab;
        if tokens.is_empty() {
            return Err(Error::Other("forward: no tokens".into()));
        }
        let need = self.pos() + tokens.len();
        if need > self.ctx {
            return Err(Error::Context(format!(
                "{} tokens already in the cache plus {} new need {need} positions, but the context size is {}",
                self.pos(),
                tokens.len(),
                self.ctx
            )));
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Token { id, vocab });
        }
        Ok(())
    }

    /// One step over `chunk` at the next positions, returning logits per `out`.
    fn step(&mut self, chunk: &[u32], out: Out) -> Result<()> {
        let pos = self.pos();
        self.kv.prepare(SEQ, chunk.len(), &mut self.store)?;
        self.batch.clear();
        self.batch.push(chunk, pos, self.kv.table(SEQ), out);
        step::forward(self.cfg, &mut self.k, &mut self.store, &self.batch)?;
        self.kv.commit(SEQ, chunk)
    }

    /// Runs `tokens` at positions `pos()..pos() + tokens.len()`, appending them to the KV
    /// cache, and returns the logits asked for (`[rows][vocab]`). Errors (before any work)
    /// if the tokens do not fit the cache or an id is outside the vocabulary.
    pub fn forward(&mut self, tokens: &[u32], which: Logits) -> Result<&[f32]> {
        self.check(tokens)?;
        let size = match which {
            Logits::All => self.out_rows,
            Logits::Last => self.rows,
        };
        let n_chunks = tokens.len().div_ceil(size);
        let gather = which == Logits::All && n_chunks > 1;
        if gather {
            self.logits.clear();
        }
        for (i, chunk) in tokens.chunks(size).enumerate() {
            let out = match which {
                Logits::All => Out::All,
                Logits::Last if i + 1 == n_chunks => Out::Last,
                Logits::Last => Out::None,
            };
            self.step(chunk, out)?;
            if gather {
                let l = self.k.host_logits()?;
                self.logits.extend_from_slice(l);
            }
        }
        if gather {
            Ok(&self.logits)
        } else {
            Ok(self.k.host_logits()?)
        }
    }

    /// Runs `tokens` as `forward` does and returns the next token where the kernel set picks
    /// it (the device sampler's draw when one is set, else the greedy token: largest logit,
    /// lowest id on ties), or None where it does not (the CPU): then [`Session::logits`]
    /// holds the last row's logits.
    pub fn forward_pick(&mut self, tokens: &[u32]) -> Result<Option<u32>> {
        self.run_to_pick(tokens)?;
        Ok(self.k.device_tokens()?.and_then(|t| t.first().copied()))
    }

    /// Runs `tokens` (Out::Last on the last piece) and the device sampler, if set.
    fn run_to_pick(&mut self, tokens: &[u32]) -> Result<()> {
        self.check(tokens)?;
        let n_chunks = tokens.len().div_ceil(self.rows);
        for (i, chunk) in tokens.chunks(self.rows).enumerate() {
            let last = i + 1 == n_chunks;
            self.step(chunk, if last { Out::Last } else { Out::None })?;
        }
        if self.device_sampler {
            self.k.sample_rows(&[(0, SEQ)])?;
        }
        Ok(())
    }

    /// Whether the kernel set chains its picks (CUDA, wgpu): `forward_queue`, `forward_chained`
    /// and `take_pick` run only there.
    pub fn chains(&self) -> bool {
        self.k.chains_picks()
    }

    /// Runs `tokens` as `forward_pick` does, but queues the read of the pick instead of
    /// waiting for it ([`Session::take_pick`] returns it).
    pub fn forward_queue(&mut self, tokens: &[u32]) -> Result<()> {
        self.run_to_pick(tokens)?;
        self.k.queue_tokens()
    }

    /// Queues one decode step whose input is the previous step's pick, still on the device
    /// (not read yet), and the read of this step's pick. Picks are read in order by
    /// [`Session::take_pick`]. Errors if the kernel set does not chain its picks or the cache
    /// is full.
    pub fn forward_chained(&mut self) -> Result<()> {
        if !self.chains() {
            return Err(Error::Other(
                "session: this kernel set does not chain its picks".into(),
            ));
        }
        if self.pos() + 1 > self.ctx {
            return Err(Error::Context(format!(
                "{} tokens already in the cache plus 1 new need {} positions, but the context size is {}",
                self.pos(),
                self.pos() + 1,
                self.ctx
            )));
        }
        self.step(&[PREV_TOKEN], Out::Last)?;
        if self.device_sampler {
            self.k.sample_rows(&[(0, SEQ)])?;
        }
        self.k.queue_tokens()
    }

    /// The oldest queued pick (`forward_queue`, `forward_chained`): waits for its step only.
    pub fn take_pick(&mut self) -> Result<u32> {
        self.k
            .take_tokens()?
            .first()
            .copied()
            .ok_or_else(|| Error::Other("session: a step picked no token".into()))
    }

    /// The last step's logits on the host, `[logit rows][vocab]` (read from the device once
    /// per step; a device sampler's penalties applied in place).
    pub fn logits(&mut self) -> Result<&mut [f32]> {
        self.k.host_logits()
    }

    /// Draws this sequence's next tokens with a device sampler of settings `cfg` whose
    /// penalty history starts with `history`, with room for `cap` history tokens (`None`:
    /// back to the greedy pick). Returns whether the kernel set samples on the device;
    /// where it does not, the caller samples from [`Session::logits`].
    pub fn set_sampler(
        &mut self,
        cfg: Option<&SamplerConfig>,
        history: &[u32],
        cap: usize,
    ) -> Result<bool> {
        if self.device_sampler {
            self.k.remove_sampler(SEQ);
            self.device_sampler = false;
        }
        if let Some(cfg) = cfg {
            self.device_sampler = self.k.add_sampler(SEQ, cfg, history, cap)?;
        }
        Ok(self.device_sampler)
    }
}
