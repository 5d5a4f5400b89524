//! The fused ops written as compositions of primitives: the slow forms each fused kernel is
//! tested against (and a fallback any backend can run).

use crate::{DType, Result, Tensor};

/// Softmax over `axis`: exp(x - max) / sum(exp(x - max)).
pub fn softmax(x: &Tensor, axis: isize) -> Result<Tensor> {
    let e = x.sub(&x.max(&[axis], true)?)?.exp()?;
    e.div(&e.sum(&[axis], true)?)
}

/// Log-softmax over `axis`: x - logsumexp(x).
pub fn log_softmax(x: &Tensor, axis: isize) -> Result<Tensor> {
    x.sub(&x.logsumexp(&[axis], true)?)
}

/// Layer norm over the last axis.
pub fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
    let c = x.sub(&x.mean(&[-1], true)?)?;
    let var = c.square()?.mean(&[-1], true)?;
    c.mul(&var.add_scalar(eps)?.rsqrt()?)?
        .mul(weight)?
        .add(bias)
}

/// `t [c]` as `[1, c, 1, ...]` broadcast to `x`'s shape.
fn per_channel(t: &Tensor, x: &Tensor) -> Result<Tensor> {
    let mut d = vec![1; x.rank()];
    d[1] = x.dims()[1];
    t.reshape(d)?.broadcast_to(x.shape().clone())
}

/// Batch norm of `x [n, c, ...]` with the batch's statistics (biased variance).
pub fn batch_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
    let axes: Vec<isize> = (0..x.rank() as isize).filter(|&a| a != 1).collect();
    let c = x.sub(&x.mean(&axes, true)?)?;
    let var = c.square()?.mean(&axes, true)?;
    c.mul(&var.add_scalar(eps)?.rsqrt()?)?
        .mul(&per_channel(weight, x)?)?
        .add(&per_channel(bias, x)?)
}

/// Group norm of `x [n, c, ...]` over `groups` groups of channels per sample.
pub fn group_norm(
    x: &Tensor,
    groups: usize,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    let n = x.dims()[0];
    let g = x.reshape([n, groups, x.elem_count() / n.max(1) / groups])?;
    let c = g.sub(&g.mean(&[-1], true)?)?;
    let var = c.square()?.mean(&[-1], true)?;
    c.mul(&var.add_scalar(eps)?.rsqrt()?)?
        .reshape(x.shape())?
        .mul(&per_channel(weight, x)?)?
        .add(&per_channel(bias, x)?)
}

/// RMS norm over the last axis.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    x.mul(&x.square()?.mean(&[-1], true)?.add_scalar(eps)?.rsqrt()?)?
        .mul(weight)
}

/// Rotary embedding of `x [..., l, d]` with `cos`, `sin` `[l, d/2]`.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, interleaved: bool) -> Result<Tensor> {
    let d = x.dim(-1)?;
    let h = d / 2;
    if interleaved {
        let mut pairs = x.dims().to_vec();
        pairs.pop();
        pairs.extend([h, 2]);
        let xp = x.reshape(pairs)?;
        let (a, b) = (
            xp.narrow(-1, 0, 1)?.squeeze(-1)?,
            xp.narrow(-1, 1, 1)?.squeeze(-1)?,
        );
        let ra = a.mul(cos)?.sub(&b.mul(sin)?)?;
        let rb = a.mul(sin)?.add(&b.mul(cos)?)?;
        Tensor::stack(&[&ra, &rb], -1)?.reshape(x.shape())
    } else {
        let (a, b) = (x.narrow(-1, 0, h)?, x.narrow(-1, h, h)?);
        let ra = a.mul(cos)?.sub(&b.mul(sin)?)?;
        let rb = a.mul(sin)?.add(&b.mul(cos)?)?;
        Tensor::cat(&[&ra, &rb], -1)
    }
}

/// Attention as matmul, mask, softmax, matmul; kv heads repeated for grouped-query attention.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    scale: Option<f64>,
) -> Result<Tensor> {
    attention_masked(q, k, v, None, causal, scale)
}

/// `attention` with a key-padding mask (bool [b, lk], true = padding) as a -inf fill of the
/// masked keys' scores before the softmax.
pub fn attention_masked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    key_mask: Option<&Tensor>,
    causal: bool,
    scale: Option<f64>,
) -> Result<Tensor> {
    let (b, hq, lq, d) = (q.dims()[0], q.dims()[1], q.dims()[2], q.dims()[3]);
    let (hkv, lk) = (k.dims()[1], k.dims()[2]);
    let g = hq / hkv;
    let repeat = |t: &Tensor| -> Result<Tensor> {
        let dd = t.dims()[3];
        t.unsqueeze(2)?
            .broadcast_to([b, hkv, g, lk, dd])?
            .reshape([b, hq, lk, dd])
    };
    let (k, v) = (repeat(k)?, repeat(v)?);
    let scale = scale.unwrap_or(1.0 / (d as f64).sqrt());
    let mut s = q.matmul(&k.t()?)?.mul_scalar(scale)?;
    if causal {
        let dev = q.device();
        let i = Tensor::arange(0.0, lq as f64, 1.0, DType::I64, dev)?.reshape([lq, 1])?;
        let j = Tensor::arange(0.0, lk as f64, 1.0, DType::I64, dev)?.reshape([1, lk])?;
        let visible = j.le(&i.add_scalar((lk as f64) - (lq as f64))?)?;
        let neg = s.scalar_like(f64::NEG_INFINITY)?;
        s = Tensor::where_cond(&visible, &s, &neg)?;
    }
    if let Some(m) = key_mask {
        let neg = s.scalar_like(f64::NEG_INFINITY)?;
        s = Tensor::where_cond(&m.reshape([b, 1, 1, lk])?, &neg, &s)?;
    }
    softmax(&s, -1)?.matmul(&v)
}
