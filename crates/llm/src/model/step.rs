//! The model definition, once for every backend: one step advances a batch of sequences,
//! each by its own rows (a prompt chunk or one decode token) at its own positions, through a
//! small set of fused kernels ([`Kernels`]) that a backend implements ([`super::cpu`] on the
//! CPU). The llama family, qwen2 and gemma3 differ only in which kernels the definition
//! calls and with which weights.
//!
//! Buffers and weights are named ([`Buf`], [`Mat`], [`Norm`]) rather than passed: a backend
//! owns its scratch (fixed addresses, as a captured CUDA graph needs) and its own copy of
//! the weights.

use std::ops::Range;

use super::config::{Arch, Config};
use crate::error::Result;
use crate::kv_cache::BlockId;

/// Which logits a sequence of the batch returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Out {
    None,
    /// Its last row's.
    Last,
    /// Every row's.
    All,
}

/// A batch token that stands for the token the previous step picked for the same row, still on
/// the device: a kernel set that chains picks (`EngineKernels::chains_picks`) reads it there,
/// so a decode step can be queued before the host has read the previous one's token.
pub const PREV_TOKEN: u32 = u32::MAX;

/// One sequence's part of a step.
#[derive(Clone, Debug)]
pub struct BatchSeq {
    /// Its rows of the batch (tokens at positions `pos..pos + rows.len()`).
    pub rows: Range<usize>,
    pub pos: usize,
    /// Its block table in [`Batch::blocks`], covering positions `0..pos + rows.len()`.
    pub blocks: Range<usize>,
    pub out: Out,
}

/// The rows of one step: every sequence's tokens, back to back, and their block tables.
/// Logit rows come out in sequence order (one for `Out::Last`, one per row for `Out::All`).
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub seqs: Vec<BatchSeq>,
    pub blocks: Vec<BlockId>,
}

impl Batch {
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.seqs.clear();
        self.blocks.clear();
    }

    /// Adds a sequence: `tokens` at positions `pos..`, block table `table`.
    pub fn push(&mut self, tokens: &[u32], pos: usize, table: &[BlockId], out: Out) {
        let r0 = self.tokens.len();
        let b0 = self.blocks.len();
        self.tokens.extend_from_slice(tokens);
        self.blocks.extend_from_slice(table);
        self.seqs.push(BatchSeq {
            rows: r0..self.tokens.len(),
            pos,
            blocks: b0..self.blocks.len(),
            out,
        });
    }

    pub fn rows(&self) -> usize {
        self.tokens.len()
    }

    /// Rows of logits the step returns.
    pub fn out_rows(&self) -> usize {
        self.seqs
            .iter()
            .map(|s| match s.out {
                Out::None => 0,
                Out::Last => 1,
                Out::All => s.rows.len(),
            })
            .sum()
    }

    /// For each logit row, the batch row it comes from.
    pub fn out_row_ids(&self) -> impl Iterator<Item = usize> + '_ {
        self.seqs.iter().flat_map(|s| match s.out {
            Out::None => 0..0,
            Out::Last => s.rows.end - 1..s.rows.end,
            Out::All => s.rows.clone(),
        })
    }
}

/// Activation buffers of a step, `[rows][width]` each: `X` the residual stream (d_model),
/// `Q`/`Att` n_head x head_dim, `K`/`V` n_kv_head x head_dim, `Tmp` d_model, `Gate`/`Up` n_ff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    X,
    Q,
    K,
    V,
    Att,
    Tmp,
    Gate,
    Up,
}

/// Quantized matrices of layer `il`, and the output (logits) matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mat {
    Q(usize),
    K(usize),
    V(usize),
    O(usize),
    Gate(usize),
    Up(usize),
    Down(usize),
}

/// RMS-norm weights of layer `il`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norm {
    Attn(usize),
    Ffn(usize),
    /// gemma3: on the attention output before the residual.
    PostAttn(usize),
    /// gemma3: on the FFN output before the residual.
    PostFfn(usize),
    /// gemma3: per head, on q and k before RoPE.
    QHead(usize),
    KHead(usize),
}

/// The gated unit's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    Silu,
    GeluTanh,
}

/// The fused LLM kernels a backend implements. Every method works on all rows of the batch
/// given to `begin`; a backend may queue the work and run it at `logits` (the last call of a
/// step), so results are readable only after the step.
pub trait Kernels {
    /// The backend's KV storage (blocks addressed through the batch's block tables).
    type Kv;

    /// Takes the batch of the step: sizes scratch, positions, RoPE angles, block tables.
    /// Token ids were validated by the caller.
    fn begin(&mut self, batch: &Batch) -> Result<()>;
    /// Queues the whole step begun by `begin` from a recording of a step of the same shape
    /// over the same KV storage (a captured CUDA graph), if the backend holds one: `true`
    /// means the step's work is queued and the other calls of the step are skipped. A
    /// recording reads the step's tokens, positions and block tables from where `begin` put
    /// them, so it serves every step of that shape.
    fn replay(&mut self, kv: &mut Self::Kv) -> Result<bool> {
        let _ = kv;
        Ok(false)
    }
    /// `out[r] = embedding(tokens[r]) * embed_scale`.
    fn embed(&mut self, out: Buf) -> Result<()>;
    /// `outs[i].1 = norm(x) @ outs[i].0^T (+ the matrix's bias)`, all products sharing one
    /// pass over the (normalized, quantized) activations; no norm when `norm` is None.
    fn norm_matmul(&mut self, x: Buf, norm: Option<Norm>, outs: &[(Mat, Buf)]) -> Result<()>;
    /// RMS norm of each head (head_dim values) of every row, in place.
    fn head_norm(&mut self, x: Buf, norm: Norm) -> Result<()>;
    /// RoPE on q and k (each row at its position; the layer's local or global angles),
    /// k and v appended to the KV cache through the block tables, then causal attention
    /// (sliding-window for local layers) of q over each sequence's cached positions.
    fn rope_attention(
        &mut self,
        kv: &mut Self::Kv,
        layer: usize,
        q: Buf,
        k: Buf,
        v: Buf,
        out: Buf,
    ) -> Result<()>;
    /// `out = act(norm(x) @ gate^T) * (norm(x) @ up^T)`: the gated unit, its two products
    /// sharing one pass over the activations (`Buf::Up` may serve as scratch).
    fn norm_glu(
        &mut self,
        x: Buf,
        norm: Norm,
        gate: Mat,
        up: Mat,
        out: Buf,
        act: Glu,
    ) -> Result<()>;
    /// `y += post_norm(x @ w^T)` (or `y += x @ w^T`): a product onto the residual stream
    /// (`Buf::Tmp` may serve as scratch).
    fn matmul_residual(&mut self, x: Buf, w: Mat, y: Buf, post_norm: Option<Norm>) -> Result<()>;
    /// Final norm and output product of the rows the batch asks logits for; ends the step.
    fn logits(&mut self, x: Buf) -> Result<()>;
}

/// One step of the model over `batch`: the whole transformer, written once.
pub fn forward<K: Kernels>(cfg: &Config, k: &mut K, kv: &mut K::Kv, batch: &Batch) -> Result<()> {
    let gemma = cfg.arch == Arch::Gemma3;
    let act = if gemma { Glu::GeluTanh } else { Glu::Silu };
    k.begin(batch)?;
    if k.replay(kv)? {
        return Ok(());
    }
    k.embed(Buf::X)?;
    for il in 0..cfg.n_layer {
        k.norm_matmul(
            Buf::X,
            Some(Norm::Attn(il)),
            &[
                (Mat::Q(il), Buf::Q),
                (Mat::K(il), Buf::K),
                (Mat::V(il), Buf::V),
            ],
        )?;
        if gemma {
            k.head_norm(Buf::Q, Norm::QHead(il))?;
            k.head_norm(Buf::K, Norm::KHead(il))?;
        }
        k.rope_attention(kv, il, Buf::Q, Buf::K, Buf::V, Buf::Att)?;
        k.matmul_residual(
            Buf::Att,
            Mat::O(il),
            Buf::X,
            gemma.then_some(Norm::PostAttn(il)),
        )?;
        k.norm_glu(
            Buf::X,
            Norm::Ffn(il),
            Mat::Gate(il),
            Mat::Up(il),
            Buf::Gate,
            act,
        )?;
        k.matmul_residual(
            Buf::Gate,
            Mat::Down(il),
            Buf::X,
            gemma.then_some(Norm::PostFfn(il)),
        )?;
    }
    k.logits(Buf::X)
}
