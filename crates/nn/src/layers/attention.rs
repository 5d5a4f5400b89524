//! `MultiheadAttention` and `TransformerEncoderLayer` as in PyTorch (packed `in_proj_weight`
//! `[3E, E]`, `out_proj` a Linear; `need_weights=False` semantics). Attention runs through the
//! fused `attention` op, causal and key-padding masks included (`Tensor::attention_masked`):
//! no [B, h, L, S] score tensor is materialized. A query whose every visible key is padding
//! gets NaN outputs (see `Op::Attention`). There is no attention-weight dropout (PyTorch's
//! default p = 0; the fused op has none).

use crate::layers::activation::{gelu, relu};
use crate::layers::linear::linear_low;
use crate::module::{forward_child, in_child};
use crate::{init, Dropout, LayerNorm, Linear, Members, MembersMut, Module, Parameter};
use ferrite_core::{DType, Device, Error, Result, Tensor};
use std::sync::Arc;

pub struct MultiheadAttention {
    pub in_proj_weight: Parameter,
    pub in_proj_bias: Option<Parameter>,
    pub out_proj: Linear,
    embed_dim: usize,
    num_heads: usize,
    batch_first: bool,
}

impl MultiheadAttention {
    /// `MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, batch_first)`:
    /// in_proj_weight xavier_uniform, biases zero, out_proj.weight Linear's default.
    pub fn new(
        embed_dim: usize,
        num_heads: usize,
        bias: bool,
        batch_first: bool,
        dtype: DType,
        dev: &Device,
    ) -> Result<MultiheadAttention> {
        if embed_dim == 0 || num_heads == 0 || !embed_dim.is_multiple_of(num_heads) {
            return Err(Error::module(
                "MultiheadAttention",
                format!(
                    "embed_dim {embed_dim} must be a positive multiple of num_heads {num_heads}"
                ),
            ));
        }
        let mut out_proj = Linear::new(embed_dim, embed_dim, bias, dtype, dev)?;
        if let Some(b) = &mut out_proj.bias {
            b.copy_(&Tensor::zeros([embed_dim], dtype, dev)?)?;
        }
        Ok(MultiheadAttention {
            in_proj_weight: Parameter::new(&init::xavier_uniform(
                [3 * embed_dim, embed_dim],
                1.0,
                dtype,
                dev,
            )?)?,
            in_proj_bias: match bias {
                true => Some(Parameter::new(&Tensor::zeros(
                    [3 * embed_dim],
                    dtype,
                    dev,
                )?)?),
                false => None,
            },
            out_proj,
            embed_dim,
            num_heads,
            batch_first,
        })
    }

    /// Attention of `query` [L, B, E] over `key`/`value` [S, B, E] ([B, L, E] with
    /// batch_first). `key_padding_mask`: bool [B, S], true where a key is padding. `causal`:
    /// query i sees keys j ≤ i + S - L. Returns [L, B, E] (or [B, L, E]).
    pub fn attend(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        key_padding_mask: Option<&Tensor>,
        causal: bool,
    ) -> Result<Tensor> {
        self.attend_add(query, key, value, key_padding_mask, causal, None)
    }

    /// `attend`, plus `residual` (shaped as the output) added by the output projection
    /// (`Linear::forward_add`) when given.
    pub(crate) fn attend_add(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        key_padding_mask: Option<&Tensor>,
        causal: bool,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (e, h) = (self.embed_dim, self.num_heads);
        let d = e / h;
        let to_lbe = |t: &Tensor| {
            if self.batch_first {
                t.transpose(0, 1)
            } else {
                Ok(t.clone())
            }
        };
        let (q, k, v) = (to_lbe(query)?, to_lbe(key)?, to_lbe(value)?);
        for (what, t) in [("query", &q), ("key", &k), ("value", &v)] {
            if t.rank() != 3 || t.dims()[2] != e {
                return Err(Error::module(
                    "MultiheadAttention",
                    format!("expected {what} [len, batch, {e}] (batch_first: [batch, len, {e}]), got {}", t.shape()),
                ));
            }
        }
        let (l, b, s) = (q.dims()[0], q.dims()[1], k.dims()[0]);
        if k.dims()[1] != b || v.dims()[..2] != k.dims()[..2] {
            return Err(Error::module(
                "MultiheadAttention",
                format!(
                    "query {}, key {} and value {} do not agree",
                    q.shape(),
                    k.shape(),
                    v.shape()
                ),
            ));
        }
        let w = self.in_proj_weight.tensor();
        let bias = self.in_proj_bias.as_ref().map(|p| p.tensor());
        // Projected in the caller's layout ([len, B, E], or [B, len, E] with batch_first, so
        // that the rows of a contiguous input are one product), then viewed as [B, h, len, d].
        // [d0, d1, E] -> [B, h, len, d] (a view).
        let heads = |y: &Tensor, x: &Tensor| -> Result<Tensor> {
            let (d0, d1) = (x.dims()[0], x.dims()[1]);
            let order: &[usize] = if self.batch_first {
                &[0, 2, 1, 3]
            } else {
                &[1, 2, 0, 3]
            };
            y.reshape([d0, d1, h, d])?.permute(order)
        };
        let project = |x: &Tensor, i: usize| -> Result<Tensor> {
            let wi = w.narrow(0, i * e, e)?;
            let bi = bias.as_ref().map(|bb| bb.narrow(0, i * e, e)).transpose()?;
            heads(&x.matmul_bias(&wi.t()?, bi.as_ref())?, x)
        };
        let same = |t: &Tensor| {
            Arc::ptr_eq(t.storage_arc(), query.storage_arc()) && t.layout() == query.layout()
        };
        // Self-attention (one tensor in all three roles): one product with the whole [3E, E]
        // weight, q, k and v viewed as its output's thirds. One weight cast and one product
        // forward; backward, their gradients join in one cat (`ferrite-autodiff` keeps the
        // pieces of a narrowed tensor apart) for one product each for the input and weight.
        if same(key) && same(value) {
            let y = match linear_low(query, &w, bias.as_ref(), false)? {
                Some(y) => y,
                None => query.matmul_bias(&w.t()?, bias.as_ref())?,
            };
            let part = |i: usize| heads(&y.narrow(-1, i * e, e)?, query);
            let (qh, kh, vh) = (part(0)?, part(1)?, part(2)?);
            let dims = (l, b, s);
            return self.attend_heads(&qh, &kh, &vh, key_padding_mask, causal, dims, residual);
        }
        // Under autocast the projections stay in the low dtype (bias included) and feed the
        // fused attention without casts; an input given for several roles is cast once.
        let low_inputs = match ferrite_core::autocast::to_low(query)? {
            Some(ql) => {
                let other = |t: &Tensor| -> Result<Option<Tensor>> {
                    match same(t) {
                        true => Ok(Some(ql.clone())),
                        false => Ok(ferrite_core::autocast::to_low(t)?),
                    }
                };
                match (other(key)?, other(value)?) {
                    (Some(kl), Some(vl)) => Some((ql, kl, vl)),
                    _ => None,
                }
            }
            None => None,
        };
        let (qh, kh, vh) = match low_inputs {
            Some((ql, kl, vl)) => {
                let project_low = |x: &Tensor, i: usize| -> Result<Tensor> {
                    let wi = w.narrow(0, i * e, e)?;
                    let bi = bias.as_ref().map(|bb| bb.narrow(0, i * e, e)).transpose()?;
                    match linear_low(x, &wi, bi.as_ref(), false)? {
                        Some(y) => heads(&y, x),
                        None => project(x, i),
                    }
                };
                (
                    project_low(&ql, 0)?,
                    project_low(&kl, 1)?,
                    project_low(&vl, 2)?,
                )
            }
            None => (project(query, 0)?, project(key, 1)?, project(value, 2)?),
        };
        self.attend_heads(&qh, &kh, &vh, key_padding_mask, causal, (l, b, s), residual)
    }

    /// The attention of projected heads q, k, v [B, h, len, d] and the output projection;
    /// (l, b, s): query length, batch, key length.
    #[allow(clippy::too_many_arguments)]
    fn attend_heads(
        &self,
        qh: &Tensor,
        kh: &Tensor,
        vh: &Tensor,
        key_padding_mask: Option<&Tensor>,
        causal: bool,
        (l, b, s): (usize, usize, usize),
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (e, h) = (self.embed_dim, self.num_heads);
        let d = e / h;
        if let Some(mask) = key_padding_mask {
            if mask.dims() != [b, s] || mask.dtype() != DType::Bool {
                return Err(Error::module(
                    "MultiheadAttention",
                    format!(
                        "key_padding_mask must be bool [{b}, {s}], got {} {}",
                        mask.dtype(),
                        mask.shape()
                    ),
                ));
            }
        }
        // The attention kernels read q, k, v through their strides.
        let o = Tensor::attention_masked(
            qh,
            kh,
            vh,
            key_padding_mask,
            causal,
            Some(1.0 / (d as f64).sqrt()),
        )?;
        // [B, h, L, d] -> [L, B, E] (or [B, L, E])
        let o = match self.batch_first {
            true => o.permute(&[0, 2, 1, 3])?.reshape([b, l, e])?,
            false => o.permute(&[2, 0, 1, 3])?.reshape([l, b, e])?,
        };
        match residual {
            Some(r) => self
                .out_proj
                .forward_add(&o, r)
                .map_err(|e| in_child(e, "out_proj", "Linear")),
            None => forward_child("out_proj", &self.out_proj, &o),
        }
    }
}

impl Module for MultiheadAttention {
    fn type_name(&self) -> &'static str {
        "MultiheadAttention"
    }

    /// Self-attention of `x` (query = key = value), no masks.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.attend(x, x, x, None, false)
    }

    fn members(&self) -> Members<'_> {
        let mut params = vec![("in_proj_weight".to_string(), &self.in_proj_weight)];
        if let Some(b) = &self.in_proj_bias {
            params.push(("in_proj_bias".to_string(), b));
        }
        Members {
            params,
            children: vec![("out_proj".to_string(), &self.out_proj as &dyn Module)],
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        let mut params = vec![("in_proj_weight".to_string(), &mut self.in_proj_weight)];
        if let Some(b) = &mut self.in_proj_bias {
            params.push(("in_proj_bias".to_string(), b));
        }
        MembersMut {
            params,
            children: vec![(
                "out_proj".to_string(),
                &mut self.out_proj as &mut dyn Module,
            )],
            ..MembersMut::default()
        }
    }
}

/// The activation between a transformer layer's two feed-forward products: PyTorch's
/// `activation` "relu" and "gelu" (the exact, erf GELU), and the tanh GELU (GPT-2's,
/// `partial(F.gelu, approximate="tanh")` in PyTorch), which runs in the first product's
/// epilogue where the backend has one (`Tensor::matmul_bias_gelu`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activation {
    #[default]
    Relu,
    Gelu,
    GeluTanh,
}

/// `TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation,
/// layer_norm_eps, batch_first, norm_first, bias)`.
pub struct TransformerEncoderLayer {
    pub self_attn: MultiheadAttention,
    pub linear1: Linear,
    pub dropout: Dropout,
    pub linear2: Linear,
    pub norm1: LayerNorm,
    pub norm2: LayerNorm,
    pub dropout1: Dropout,
    pub dropout2: Dropout,
    activation: Activation,
    norm_first: bool,
}

/// Hyperparameters of `TransformerEncoderLayer` (PyTorch's defaults from `new`).
#[derive(Clone, Copy, Debug)]
pub struct EncoderConfig {
    pub d_model: usize,
    pub nhead: usize,
    pub dim_feedforward: usize,
    pub dropout: f64,
    pub activation: Activation,
    pub layer_norm_eps: f64,
    pub batch_first: bool,
    pub norm_first: bool,
    pub bias: bool,
}

impl EncoderConfig {
    pub fn new(d_model: usize, nhead: usize) -> EncoderConfig {
        EncoderConfig {
            d_model,
            nhead,
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: Activation::Relu,
            layer_norm_eps: 1e-5,
            batch_first: false,
            norm_first: false,
            bias: true,
        }
    }
}

/// A pre-norm layer's norm, whose output feeds products only: in the autocast dtype where
/// autocast is on (`LayerNorm::forward_low`).
fn norm_low(name: &str, norm: &LayerNorm, x: &Tensor) -> Result<Tensor> {
    norm.forward_low(x)
        .map_err(|e| in_child(e, name, "LayerNorm"))
}

/// The feed-forward block of the encoder and decoder layers: `linear2(dropout(act(linear1(x))))`,
/// plus `residual` added by linear2 (`Linear::forward_add`) when given. Under autocast
/// linear1's output, its bias and the activation stay in the low dtype (linear2 reads them
/// without a cast), as PyTorch computes them; the tanh GELU is in linear1's op.
fn feed_forward(
    x: &Tensor,
    linear1: &Linear,
    dropout: &Dropout,
    linear2: &Linear,
    activation: Activation,
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    let w1 = linear1.weight.tensor();
    let b1 = linear1.bias.as_ref().map(|b| b.tensor());
    let first =
        |gelu| linear_low(x, &w1, b1.as_ref(), gelu).map_err(|e| in_child(e, "linear1", "Linear"));
    let h = match activation {
        Activation::GeluTanh => match first(true)? {
            Some(h) => h,
            None => linear1
                .forward_gelu_tanh(x)
                .map_err(|e| in_child(e, "linear1", "Linear"))?,
        },
        act => {
            let h = match first(false)? {
                Some(h) => h,
                None => forward_child("linear1", linear1, x)?,
            };
            match act {
                Activation::Gelu => gelu(&h, false)?,
                _ => relu(&h)?,
            }
        }
    };
    let h = forward_child("dropout", dropout, &h)?;
    match residual {
        Some(r) => linear2
            .forward_add(&h, r)
            .map_err(|e| in_child(e, "linear2", "Linear")),
        None => forward_child("linear2", linear2, &h),
    }
}

/// `res + dropout1(self_attn(x))`: the encoder and decoder layers' self-attention block.
fn self_attention_add(
    self_attn: &MultiheadAttention,
    dropout1: &Dropout,
    res: &Tensor,
    x: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
) -> Result<Tensor> {
    residual_add(res, ("dropout1", dropout1), |r| {
        self_attn
            .attend_add(x, x, x, mask, causal, r)
            .map_err(|e| in_child(e, "self_attn", "MultiheadAttention"))
    })
}

/// `residual + dropout(branch)`, a residual connection: where the dropout passes values
/// through (p = 0 or evaluation), `branch(Some(residual))`, whose last product adds the
/// residual itself (one op, no pass over the stream); else `branch(None)` and an add.
fn residual_add(
    residual: &Tensor,
    (name, dropout): (&str, &Dropout),
    branch: impl Fn(Option<&Tensor>) -> Result<Tensor>,
) -> Result<Tensor> {
    match dropout.is_identity() {
        true => branch(Some(residual)),
        false => residual.add(&forward_child(name, dropout, &branch(None)?)?),
    }
}

impl TransformerEncoderLayer {
    pub fn new(c: EncoderConfig, dtype: DType, dev: &Device) -> Result<TransformerEncoderLayer> {
        let ln =
            |dev: &Device| LayerNorm::new(&[c.d_model], c.layer_norm_eps, true, c.bias, dtype, dev);
        Ok(TransformerEncoderLayer {
            self_attn: MultiheadAttention::new(
                c.d_model,
                c.nhead,
                c.bias,
                c.batch_first,
                dtype,
                dev,
            )
            .map_err(|e| in_child(e, "self_attn", "MultiheadAttention"))?,
            linear1: Linear::new(c.d_model, c.dim_feedforward, c.bias, dtype, dev)?,
            dropout: Dropout::new(c.dropout)?,
            linear2: Linear::new(c.dim_feedforward, c.d_model, c.bias, dtype, dev)?,
            norm1: ln(dev)?,
            norm2: ln(dev)?,
            dropout1: Dropout::new(c.dropout)?,
            dropout2: Dropout::new(c.dropout)?,
            activation: c.activation,
            norm_first: c.norm_first,
        })
    }

    /// `res + dropout1(self_attn(x))`.
    fn sa_add(
        &self,
        res: &Tensor,
        x: &Tensor,
        mask: Option<&Tensor>,
        causal: bool,
    ) -> Result<Tensor> {
        self_attention_add(&self.self_attn, &self.dropout1, res, x, mask, causal)
    }

    /// `res + dropout2(feed_forward(x))`.
    fn ff_add(&self, res: &Tensor, x: &Tensor) -> Result<Tensor> {
        residual_add(res, ("dropout2", &self.dropout2), |r| {
            feed_forward(
                x,
                &self.linear1,
                &self.dropout,
                &self.linear2,
                self.activation,
                r,
            )
        })
    }

    /// The layer with an optional key-padding mask (bool [B, S]) and causal self-attention.
    pub fn forward_masked(
        &self,
        x: &Tensor,
        key_padding_mask: Option<&Tensor>,
        causal: bool,
    ) -> Result<Tensor> {
        if self.norm_first {
            let n1 = norm_low("norm1", &self.norm1, x)?;
            let x = self.sa_add(x, &n1, key_padding_mask, causal)?;
            self.ff_add(&x, &norm_low("norm2", &self.norm2, &x)?)
        } else {
            let x = forward_child(
                "norm1",
                &self.norm1,
                &self.sa_add(x, x, key_padding_mask, causal)?,
            )?;
            forward_child("norm2", &self.norm2, &self.ff_add(&x, &x)?)
        }
    }
}

impl Module for TransformerEncoderLayer {
    fn type_name(&self) -> &'static str {
        "TransformerEncoderLayer"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, None, false)
    }

    fn members(&self) -> Members<'_> {
        Members {
            children: vec![
                ("self_attn".to_string(), &self.self_attn as &dyn Module),
                ("linear1".to_string(), &self.linear1),
                ("dropout".to_string(), &self.dropout),
                ("linear2".to_string(), &self.linear2),
                ("norm1".to_string(), &self.norm1),
                ("norm2".to_string(), &self.norm2),
                ("dropout1".to_string(), &self.dropout1),
                ("dropout2".to_string(), &self.dropout2),
            ],
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        MembersMut {
            children: vec![
                (
                    "self_attn".to_string(),
                    &mut self.self_attn as &mut dyn Module,
                ),
                ("linear1".to_string(), &mut self.linear1),
                ("dropout".to_string(), &mut self.dropout),
                ("linear2".to_string(), &mut self.linear2),
                ("norm1".to_string(), &mut self.norm1),
                ("norm2".to_string(), &mut self.norm2),
                ("dropout1".to_string(), &mut self.dropout1),
                ("dropout2".to_string(), &mut self.dropout2),
            ],
            ..MembersMut::default()
        }
    }
}

/// Hyperparameters of `TransformerDecoderLayer` (the encoder layer's).
pub type DecoderConfig = EncoderConfig;

/// `TransformerDecoderLayer`: self-attention, cross-attention over `memory`, feed-forward;
/// pre- or post-norm. Takes two inputs: `forward_decoder`.
pub struct TransformerDecoderLayer {
    pub self_attn: MultiheadAttention,
    pub multihead_attn: MultiheadAttention,
    pub linear1: Linear,
    pub dropout: Dropout,
    pub linear2: Linear,
    pub norm1: LayerNorm,
    pub norm2: LayerNorm,
    pub norm3: LayerNorm,
    pub dropout1: Dropout,
    pub dropout2: Dropout,
    pub dropout3: Dropout,
    activation: Activation,
    norm_first: bool,
}

impl TransformerDecoderLayer {
    pub fn new(c: DecoderConfig, dtype: DType, dev: &Device) -> Result<TransformerDecoderLayer> {
        let ln = || LayerNorm::new(&[c.d_model], c.layer_norm_eps, true, c.bias, dtype, dev);
        let mha = |name: &str| {
            MultiheadAttention::new(c.d_model, c.nhead, c.bias, c.batch_first, dtype, dev)
                .map_err(|e| in_child(e, name, "MultiheadAttention"))
        };
        Ok(TransformerDecoderLayer {
            self_attn: mha("self_attn")?,
            multihead_attn: mha("multihead_attn")?,
            linear1: Linear::new(c.d_model, c.dim_feedforward, c.bias, dtype, dev)?,
            dropout: Dropout::new(c.dropout)?,
            linear2: Linear::new(c.dim_feedforward, c.d_model, c.bias, dtype, dev)?,
            norm1: ln()?,
            norm2: ln()?,
            norm3: ln()?,
            dropout1: Dropout::new(c.dropout)?,
            dropout2: Dropout::new(c.dropout)?,
            dropout3: Dropout::new(c.dropout)?,
            activation: c.activation,
            norm_first: c.norm_first,
        })
    }

    /// `res + dropout1(self_attn(x))`.
    fn sa_add(
        &self,
        res: &Tensor,
        x: &Tensor,
        mask: Option<&Tensor>,
        causal: bool,
    ) -> Result<Tensor> {
        self_attention_add(&self.self_attn, &self.dropout1, res, x, mask, causal)
    }

    /// `res + dropout2(multihead_attn(x, mem))`.
    fn ca_add(
        &self,
        res: &Tensor,
        x: &Tensor,
        mem: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        residual_add(res, ("dropout2", &self.dropout2), |r| {
            self.multihead_attn
                .attend_add(x, mem, mem, mask, false, r)
                .map_err(|e| in_child(e, "multihead_attn", "MultiheadAttention"))
        })
    }

    /// `res + dropout3(feed_forward(x))`.
    fn ff_add(&self, res: &Tensor, x: &Tensor) -> Result<Tensor> {
        residual_add(res, ("dropout3", &self.dropout3), |r| {
            feed_forward(
                x,
                &self.linear1,
                &self.dropout,
                &self.linear2,
                self.activation,
                r,
            )
        })
    }

    /// `tgt` attends to itself (causally when `tgt_causal`, with an optional key-padding mask)
    /// and to `memory` (with an optional memory key-padding mask).
    pub fn forward_decoder(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        tgt_causal: bool,
        tgt_key_padding_mask: Option<&Tensor>,
        memory_key_padding_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (tm, mm) = (tgt_key_padding_mask, memory_key_padding_mask);
        if self.norm_first {
            let x = self.sa_add(tgt, &norm_low("norm1", &self.norm1, tgt)?, tm, tgt_causal)?;
            let x = self.ca_add(&x, &norm_low("norm2", &self.norm2, &x)?, memory, mm)?;
            self.ff_add(&x, &norm_low("norm3", &self.norm3, &x)?)
        } else {
            let x = forward_child(
                "norm1",
                &self.norm1,
                &self.sa_add(tgt, tgt, tm, tgt_causal)?,
            )?;
            let x = forward_child("norm2", &self.norm2, &self.ca_add(&x, &x, memory, mm)?)?;
            forward_child("norm3", &self.norm3, &self.ff_add(&x, &x)?)
        }
    }
}

impl Module for TransformerDecoderLayer {
    fn type_name(&self) -> &'static str {
        "TransformerDecoderLayer"
    }

    /// The decoder takes (tgt, memory): an error pointing to `forward_decoder`.
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Err(Error::module(
            "TransformerDecoderLayer",
            "takes two inputs: call forward_decoder(tgt, memory, ...)",
        ))
    }

    fn members(&self) -> Members<'_> {
        Members {
            children: vec![
                ("self_attn".to_string(), &self.self_attn as &dyn Module),
                ("multihead_attn".to_string(), &self.multihead_attn),
                ("linear1".to_string(), &self.linear1),
                ("dropout".to_string(), &self.dropout),
                ("linear2".to_string(), &self.linear2),
                ("norm1".to_string(), &self.norm1),
                ("norm2".to_string(), &self.norm2),
                ("norm3".to_string(), &self.norm3),
                ("dropout1".to_string(), &self.dropout1),
                ("dropout2".to_string(), &self.dropout2),
                ("dropout3".to_string(), &self.dropout3),
            ],
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        MembersMut {
            children: vec![
                (
                    "self_attn".to_string(),
                    &mut self.self_attn as &mut dyn Module,
                ),
                ("multihead_attn".to_string(), &mut self.multihead_attn),
                ("linear1".to_string(), &mut self.linear1),
                ("dropout".to_string(), &mut self.dropout),
                ("linear2".to_string(), &mut self.linear2),
                ("norm1".to_string(), &mut self.norm1),
                ("norm2".to_string(), &mut self.norm2),
                ("norm3".to_string(), &mut self.norm3),
                ("dropout1".to_string(), &mut self.dropout1),
                ("dropout2".to_string(), &mut self.dropout2),
                ("dropout3".to_string(), &mut self.dropout3),
            ],
            ..MembersMut::default()
        }
    }
}
