//! A decode session on the GPU: the KV cache (f16, preallocated to the model's context),
//! activation buffers, and the token step as a fixed list of kernel launches, captured once
//! as a CUDA graph and replayed.
//!
//! The device parameter block is u32 [token, pos, next token, sample]: the host writes the
//! first two (and `sample`: whether the step's last kernel picks a token) before each step and
//! reads the third after it. The last kernel is the argmax, or with a sampler set
//! (`set_sampler`) the device sampler (`sample.rs`), whose settings, history and draw counter
//! stay on the device. `FERRITE_GPU_EAGER=1` launches the
//! kernels one by one instead of replaying the graph (for debugging and profiling).

use ferrite_cuda::{Buffer, CudaDevice, Graph};

use super::decode::{self, AttnScratch, AttnShape, KvLayer, RopeSpec};
use super::matvec::{self, Mode, Seg};
use super::prefill::{self, Prefill};
use super::sample::GpuSampler;
use super::weights::GpuModel;
use super::{zeros, CudaResult, Launch};
use crate::error::{Error, Result};
use crate::model::{Arch, Config};
use crate::sampler::SamplerConfig;

/// Device bytes of a session's buffers besides the weights and the KV cache.
pub(crate) fn scratch_bytes(c: &Config, ctx: usize, sm_count: u32) -> usize {
    let shape = AttnShape {
        n_head: c.n_head,
        n_kv_head: c.n_kv_head,
        head_dim: c.head_dim,
        ctx,
    };
    let (_, split) = shape.splits(sm_count);
    let q = c.n_head * c.head_dim;
    let acts = 3 * c.d_model + q + 2 * c.n_kv_head * c.head_dim + q + c.n_ff + c.vocab;
    acts * 4
        + shape.part_bytes(split)
        + c.n_head * 4
        + matvec::blocks_for(c.vocab) * 8
        + matvec::q8_bytes(c.d_model.max(c.n_ff).max(q))
        + 4096
}

/// Decode state of one sequence on the GPU.
pub struct GpuSession<'g> {
    m: &'g GpuModel,
    dev: CudaDevice,
    pos: usize,
    params: Buffer,
    logits: Buffer,
    steps: Vec<Launch>,
    graph: Option<Graph>,
    eager: bool,
    /// The decode step's input row (f32 [d]) and the KV cache.
    x: Buffer,
    kc: Buffer,
    vc: Buffer,
    /// Batched prefill buffers (at the first prompt of two or more tokens).
    pf: Option<Prefill>,
    batched: bool,
    chunk: usize,
    /// Prompt positions the batched path covers: the smallest sliding window, if any layer
    /// has one (the attention op has no window).
    batch_end: usize,
    /// The device sampler, when set: its launch replaces the argmax (`steps[lm_at + 1]`).
    sampler: Option<GpuSampler>,
    argmax: Launch,
    lm_at: usize,
    /// Buffers the launches point into (kept alive with the session).
    _bufs: Vec<Buffer>,
}

impl<'g> GpuSession<'g> {
    /// A session over `m` with an empty KV cache of `m.ctx()` positions.
    pub fn new(m: &'g GpuModel) -> Result<GpuSession<'g>> {
        let dev = m.dev.clone();
        let sm = dev.sm_count();
        let c = &m.cfg;
        let (d, hd, nh, nkv, ff) = (c.d_model, c.head_dim, c.n_head, c.n_kv_head, c.n_ff);
        let shape = AttnShape {
            n_head: nh,
            n_kv_head: nkv,
            head_dim: hd,
            ctx: m.ctx,
        };
        let f32s = |n: usize, what| zeros(&dev, n * 4, what);
        let params = zeros(&dev, 16, "llm params")?;
        let x = f32s(d, "llm activations")?;
        let qkv = f32s((nh + 2 * nkv) * hd, "llm activations")?;
        let att = f32s(nh * hd, "llm activations")?;
        let hid = f32s(ff, "llm activations")?;
        let tmp = f32s(d, "llm activations")?;
        let logits = f32s(c.vocab, "llm logits")?;
        let kv_bytes = c.n_layer * shape.kv_layer_bytes();
        let kc = zeros(&dev, kv_bytes, "llm kv cache")?;
        let vc = zeros(&dev, kv_bytes, "llm kv cache")?;
        let scratch = AttnScratch::new(&dev, &shape, None)?;
        let am = zeros(&dev, matvec::blocks_for(c.vocab) * 8, "llm argmax partials")?;

        let mut steps = vec![Launch::Embed(matvec::plan_embed(
            &m.tok_embd,
            &params,
            &x,
            c.embed_scale,
        )?)];
        let glu = if c.arch == Arch::Gemma3 {
            Mode::GluGelu
        } else {
            Mode::GluSilu
        };
        for (il, l) in m.layers.iter().enumerate() {
            let qkv_segs = [
                Seg {
                    w: &l.wq,
                    bias: l.bq.as_ref(),
                    out_off: 0,
                },
                Seg {
                    w: &l.wk,
                    bias: l.bk.as_ref(),
                    out_off: nh * hd,
                },
                Seg {
                    w: &l.wv,
                    bias: l.bv.as_ref(),
                    out_off: (nh + nkv) * hd,
                },
            ];
            steps.push(Launch::Matvec(matvec::plan(
                sm,
                &qkv_segs,
                Mode::Store,
                &x,
                Some((&l.attn_norm, c.eps)),
                &qkv,
                None,
            )?));
            let kv = KvLayer {
                k: &kc,
                v: &vc,
                off: il * shape.kv_layer_bytes(),
            };
            let local = c.is_local(il);
            let rope = RopeSpec {
                inv_freq: if local {
                    &m.inv_freq_local
                } else {
                    &m.inv_freq
                },
                rope_dim: c.rope_dim,
                neox: c.rope_neox,
                pos_scale: if local { 1.0 } else { 1.0 / c.rope_scale },
                qk_norm: match (&l.q_norm, &l.k_norm) {
                    (Some(q), Some(k)) => Some((q, k, c.eps)),
                    _ => None,
                },
            };
            let window = if local { c.sliding_window } else { 0 };
            steps.push(Launch::Attn(decode::plan_attn(
                &shape,
                &rope,
                window,
                c.attn_scale,
                &qkv,
                &kv,
                &params,
                &scratch,
                &att,
            )?));
            let wo = [Seg {
                w: &l.wo,
                bias: None,
                out_off: 0,
            }];
            match &l.post_attn_norm {
                Some(pn) => {
                    steps.push(Launch::Matvec(matvec::plan(
                        sm,
                        &wo,
                        Mode::Store,
                        &att,
                        None,
                        &tmp,
                        None,
                    )?));
                    steps.push(Launch::Norm(decode::plan_norm(
                        &x, &tmp, pn, d, c.eps, true,
                    )?));
                }
                None => steps.push(Launch::Matvec(matvec::plan(
                    sm,
                    &wo,
                    Mode::Add,
                    &att,
                    None,
                    &x,
                    None,
                )?)),
            }
            let gu = [
                Seg {
                    w: &l.w_gate,
                    bias: None,
                    out_off: 0,
                },
                Seg {
                    w: &l.w_up,
                    bias: None,
                    out_off: 0,
                },
            ];
            steps.push(Launch::Matvec(matvec::plan(
                sm,
                &gu,
                glu,
                &x,
                Some((&l.ffn_norm, c.eps)),
                &hid,
                None,
            )?));
            let down = [Seg {
                w: &l.w_down,
                bias: None,
                out_off: 0,
            }];
            match &l.post_ffn_norm {
                Some(pn) => {
                    steps.push(Launch::Matvec(matvec::plan(
                        sm,
                        &down,
                        Mode::Store,
                        &hid,
                        None,
                        &tmp,
                        None,
                    )?));
                    steps.push(Launch::Norm(decode::plan_norm(
                        &x, &tmp, pn, d, c.eps, true,
                    )?));
                }
                None => steps.push(Launch::Matvec(matvec::plan(
                    sm,
                    &down,
                    Mode::Add,
                    &hid,
                    None,
                    &x,
                    None,
                )?)),
            }
        }
        let lm = matvec::plan(
            sm,
            &[Seg {
                w: m.output_matrix(),
                bias: None,
                out_off: 0,
            }],
            Mode::Store,
            &x,
            Some((&m.output_norm, c.eps)),
            &logits,
            Some(&am),
        )?;
        let lm_at = steps.len();
        steps.push(Launch::Matvec(lm));
        let argmax = Launch::Argmax(matvec::plan_argmax(&am, lm.tiles(), &params, 8)?);
        steps.push(argmax);
        // Fast mode (the CPU's Q8 precision): products over formats with an integer kernel
        // take their input quantized to 8-bit units (one scratch: the products run in order).
        let mut q8buf = None;
        if m.precision == crate::Precision::Q8 {
            let q = zeros(
                &dev,
                matvec::q8_bytes(d.max(ff).max(nh * hd)),
                "llm q8 input",
            )?;
            for s in steps.iter_mut() {
                if let Launch::Matvec(l) = s {
                    *l = l.with_q8(sm, &q)?;
                }
            }
            q8buf = Some(q);
        }
        let eager = crate::env::flag_or("FERRITE_GPU_EAGER", false);
        let batched = crate::env::flag_or("FERRITE_GPU_PREFILL", true);
        let batch_end = (0..c.n_layer)
            .filter(|&il| c.is_local(il) && c.sliding_window > 0)
            .map(|_| c.sliding_window)
            .min()
            .unwrap_or(usize::MAX);
        Ok(GpuSession {
            x: x.clone(),
            kc: kc.clone(),
            vc: vc.clone(),
            pf: None,
            batched,
            chunk: prefill::CHUNK.min(m.ctx),
            batch_end,
            m,
            dev,
            pos: 0,
            params,
            logits,
            steps,
            graph: None,
            eager,
            sampler: None,
            argmax,
            lm_at,
            _bufs: vec![
                x,
                qkv,
                att,
                hid,
                tmp,
                kc,
                vc,
                scratch.part,
                scratch.count,
                am,
            ]
            .into_iter()
            .chain(q8buf)
            .collect(),
        })
    }

    pub fn model(&self) -> &'g GpuModel {
        self.m
    }

    /// Tokens processed so far (the position of the next token).
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Capacity of the KV cache in tokens.
    pub fn ctx(&self) -> usize {
        self.m.ctx
    }

    /// Bytes of the KV cache (keys and values, every layer, `ctx` positions).
    pub fn kv_bytes(&self) -> usize {
        self.kc.bytes() + self.vc.bytes()
    }

    /// Forgets every position from `pos` on.
    pub fn truncate(&mut self, pos: usize) {
        self.pos = self.pos.min(pos);
    }

    /// Kernel launches per token.
    pub fn launches_per_token(&self) -> usize {
        self.steps
            .iter()
            .map(|s| match s {
                Launch::Matvec(l) => l.kernels(),
                _ => 1,
            })
            .sum()
    }

    /// Whether the products take 8-bit activations (the model's precision was `Q8` when the
    /// session was created; see `GpuModel::set_precision`).
    pub fn is_q8(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(s, Launch::Matvec(l) if l.is_q8()))
    }

    /// Whether steps launch kernels one by one (`FERRITE_GPU_EAGER`) rather than replay a graph.
    pub fn is_eager(&self) -> bool {
        self.eager
    }

    pub fn set_eager(&mut self, eager: bool) {
        self.eager = eager;
    }

    fn check(&self, tokens: &[u32]) -> Result<()> {
        let vocab = self.m.cfg.vocab;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Token { id, vocab });
        }
        let need = self.pos + tokens.len();
        if need > self.ctx() {
            return Err(Error::Context(format!(
                "{} tokens already in the cache plus {} new need {need} positions, but the context size is {}",
                self.pos,
                tokens.len(),
                self.ctx()
            )));
        }
        Ok(())
    }

    fn enqueue(&self) -> Result<()> {
        for s in &self.steps {
            s.enqueue(&self.dev)?;
        }
        Ok(())
    }

    /// Sets the device sampler: later steps that pick a token (`forward_token`, the last of
    /// `forward_tokens`) sample with `cfg` on the device instead of taking the argmax, reading
    /// back only the token id. `None`, or a greedy `cfg` without penalties, restores the argmax.
    /// Setting the config already set keeps the sampler's state (history, draw counter);
    /// another starts a new one (draw counter 0). The penalties change `logits()` in place, as
    /// the CPU sampler does. Sampled tokens follow the CPU sampler's distribution, not its
    /// random stream (see `sample.rs`).
    pub fn set_sampler(&mut self, cfg: Option<&SamplerConfig>) -> Result<()> {
        let cfg = cfg.filter(|c| !device_greedy(c));
        match (cfg, &self.sampler) {
            (None, None) => return Ok(()),
            (Some(c), Some(s)) if *c == s.cfg => return Ok(()),
            _ => {}
        }
        let k = self.lm_at + 1;
        match cfg {
            None => {
                self.sampler = None;
                self.steps[k] = self.argmax;
            }
            Some(c) => {
                let s = GpuSampler::new(&self.dev, c, self.m.cfg.vocab, self.m.ctx)?;
                self.steps[k] =
                    Launch::Sample(s.plan(&self.logits, self.m.cfg.vocab, &self.params)?);
                self.sampler = Some(s);
            }
        }
        self.graph = None;
        Ok(())
    }

    /// Whether a device sampler is set (see `set_sampler`).
    pub fn is_sampling(&self) -> bool {
        self.sampler.is_some()
    }

    /// Replaces the device sampler's token history (the penalties' window looks at its last
    /// `penalty_last_n`); each sampled token is appended on the device. No-op without a sampler.
    pub fn set_history(&mut self, tokens: &[u32]) -> Result<()> {
        match &self.sampler {
            Some(s) => s.set_history(&self.dev, tokens),
            None => Ok(()),
        }
    }

    /// Queues the step of `token` at the current position (checked by the caller); `pick`:
    /// whether the step ends by choosing the next token (the sampler samples only then).
    fn step(&mut self, token: u32, pick: bool) -> Result<()> {
        let mut p = [0u8; 16];
        p[..4].copy_from_slice(&token.to_le_bytes());
        p[4..8].copy_from_slice(&(self.pos as u32).to_le_bytes());
        p[12..].copy_from_slice(&u32::from(pick).to_le_bytes());
        self.dev.write_bytes(&self.params, 0, &p).gpu()?;
        if self.eager {
            self.enqueue()?;
        } else if let Some(g) = &self.graph {
            g.replay().gpu()?;
        } else {
            // First step: launched eagerly (compiles and loads the kernels outside the
            // capture), then captured for the next ones.
            self.enqueue()?;
            let g = self
                .dev
                .capture(|| {
                    self.enqueue()
                        .map_err(|e| ferrite_core::Error::backend("llm decode", e.to_string()))?;
                    Ok(Vec::new())
                })
                .gpu()?;
            self.graph = Some(g);
        }
        self.pos += 1;
        Ok(())
    }

    fn read_next(&self) -> Result<u32> {
        let b = self.dev.read_bytes(&self.params, 8, 4).gpu()?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Runs `token` at position `pos()` and returns the greedy next token (argmax of the
    /// logits, lowest id on ties), or with a sampler set the sampled one, computed on the device.
    pub fn forward_token(&mut self, token: u32) -> Result<u32> {
        self.check(&[token])?;
        self.step(token, true)?;
        self.read_next()
    }

    /// Runs `tokens` and returns the greedy token after the last one: two or more tokens by
    /// the batched prefill (chunks of up to `PREFILL_CHUNK`), unless `set_batched(false)` or
    /// `FERRITE_GPU_PREFILL=0`; otherwise one decode step each (no host wait between them).
    pub fn forward_tokens(&mut self, tokens: &[u32]) -> Result<u32> {
        if tokens.is_empty() {
            return Err(Error::Other("forward: no tokens".into()));
        }
        self.check(tokens)?;
        if self.batched && tokens.len() >= 2 {
            return self.prefill(tokens, false).map(|(t, _)| t);
        }
        for (i, &t) in tokens.iter().enumerate() {
            self.step(t, i + 1 == tokens.len())?;
        }
        self.read_next()
    }

    /// Whether prompts of two or more tokens go through the batched prefill.
    pub fn is_batched(&self) -> bool {
        self.batched
    }

    pub fn set_batched(&mut self, batched: bool) {
        self.batched = batched;
    }

    /// Tokens per prefill chunk (at most).
    pub fn prefill_chunk(&self) -> usize {
        self.chunk
    }

    /// Sets the prefill chunk (1..=`PREFILL_CHUNK`; buffers are sized at the first prefill).
    pub fn set_prefill_chunk(&mut self, chunk: usize) {
        if self.pf.is_none() {
            self.chunk = chunk.clamp(1, prefill::CHUNK).min(self.ctx());
        }
    }

    /// Runs `tokens` through the batched path and returns the logits of every position
    /// (f32 [tokens][vocab], row i the distribution after token i), for perplexity. Positions
    /// the batched path does not cover (past a sliding window) run as decode steps.
    pub fn forward_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::Other("forward: no tokens".into()));
        }
        self.check(tokens)?;
        self.prefill(tokens, true).map(|(_, l)| l)
    }

    /// The batched prefill of `tokens` (checked): the greedy token after the last one (the
    /// last position's logits left in `logits()`), and with `all` every position's logits.
    fn prefill(&mut self, tokens: &[u32], all: bool) -> Result<(u32, Vec<f32>)> {
        if self.pf.is_none() {
            self.pf = Some(Prefill::new(self.m, self.chunk)?);
        }
        let vocab = self.m.cfg.vocab;
        let mut out = Vec::with_capacity(if all { tokens.len() * vocab } else { 0 });
        let mut batched_last = false;
        let mut left = tokens.len();
        for ch in tokens.chunks(self.chunk) {
            let p0 = self.pos;
            if p0 + ch.len() <= self.batch_end {
                let pf = self.pf.as_mut().expect("allocated above");
                pf.run(self.m, &self.kc, &self.vc, ch, p0)?;
                if all {
                    out.extend(pf.logits(self.m, ch.len())?);
                }
                self.pos += ch.len();
                left -= ch.len();
                batched_last = true;
            } else {
                for &t in ch {
                    left -= 1;
                    self.step(t, left == 0)?;
                    if all {
                        out.extend(self.logits()?);
                    }
                }
                batched_last = false;
            }
        }
        if batched_last {
            // The last position's logits and greedy token by the decode step's own launches.
            let pf = self.pf.as_ref().expect("allocated above");
            let n = tokens.len().min(self.chunk);
            let last = (tokens.len() - 1) % self.chunk;
            debug_assert!(last < n);
            pf.copy_row(&self.dev, last, self.m.cfg.d_model, &self.x)?;
            self.dev
                .write_bytes(&self.params, 12, &1u32.to_le_bytes())
                .gpu()?;
            for s in &self.steps[self.lm_at..] {
                s.enqueue(&self.dev)?;
            }
        }
        Ok((self.read_next()?, out))
    }

    /// The logits of the last step (vocab values).
    pub fn logits(&self) -> Result<Vec<f32>> {
        super::read_f32(&self.dev, &self.logits, self.m.cfg.vocab)
    }

    /// Greedy continuation (sampled, with a sampler set): runs `prompt`, then `n` tokens, each the argmax after the one
    /// before; returns the `n` chosen ids (as `generate::greedy`).
    pub fn greedy(&mut self, prompt: &[u32], n: usize) -> Result<Vec<u32>> {
        let need = self.pos + prompt.len() + n;
        if need > self.ctx() {
            return Err(Error::Context(format!(
                "prompt of {} tokens plus {n} to generate need {need} positions, but the context size is {}",
                prompt.len(),
                self.ctx()
            )));
        }
        let mut out = Vec::with_capacity(n);
        if n == 0 {
            return Ok(out);
        }
        let mut next = self.forward_tokens(prompt)?;
        for i in 0..n {
            out.push(next);
            if i + 1 < n {
                next = self.forward_token(next)?;
            }
        }
        Ok(out)
    }
}

/// Whether `c` always picks the argmax of the raw logits (the step's own argmax does).
pub(crate) fn device_greedy(c: &SamplerConfig) -> bool {
    let no_penalty = c.penalty_last_n == 0
        || (c.repeat_penalty == 1.0 && c.presence_penalty == 0.0 && c.frequency_penalty == 0.0);
    c.temperature == 0.0 && no_penalty
}
