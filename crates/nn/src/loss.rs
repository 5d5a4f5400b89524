//! Losses as in `torch.nn.functional`, each with PyTorch's reductions and defaults.
//! Cross-entropy over class indices runs through the fused `cross_entropy` op (log-softmax +
//! NLL in one pass per row, with its own backward kernel; probabilities never stored); the
//! others are compositions of primitive ops differentiated by autodiff.

use ferrite_core::{no_grad, DType, Error, Result, Tensor};

/// How per-element losses are combined.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// Per-element losses, shaped like the input (less the class dim where there is one).
    None,
    #[default]
    Mean,
    Sum,
}

fn reduce(l: Tensor, r: Reduction) -> Result<Tensor> {
    match r {
        Reduction::None => Ok(l),
        Reduction::Mean => l.mean(&[], false),
        Reduction::Sum => l.sum_all(),
    }
}

fn same_shape(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(Error::shape(
            op,
            format!(
                "input {} and target {} differ in shape",
                a.shape(),
                b.shape()
            ),
        ));
    }
    Ok(())
}

/// Options of `cross_entropy` (PyTorch's defaults: no weight, ignore_index -100, no
/// smoothing, mean).
#[derive(Clone, Debug)]
pub struct CrossEntropyOptions {
    /// Class weights [C] (no gradient flows into them).
    pub weight: Option<Tensor>,
    pub ignore_index: i64,
    pub label_smoothing: f64,
    pub reduction: Reduction,
}

impl Default for CrossEntropyOptions {
    fn default() -> CrossEntropyOptions {
        CrossEntropyOptions {
            weight: None,
            ignore_index: -100,
            label_smoothing: 0.0,
            reduction: Reduction::Mean,
        }
    }
}

/// `input` as rows [R, C] with the class dim last: [C] -> [1, C]; [N, C] as is;
/// [N, C, d...] -> [N * d..., C]. Returns the rows and the per-row shape ([N, d...]).
fn class_rows(op: &'static str, input: &Tensor) -> Result<(Tensor, Vec<usize>)> {
    match input.rank() {
        0 => Err(Error::shape(
            op,
            "input must have a class dim, got a scalar",
        )),
        1 => Ok((input.unsqueeze(0)?, vec![])),
        2 => Ok((input.clone(), vec![input.dims()[0]])),
        r => {
            let mut perm = vec![0];
            perm.extend(2..r);
            perm.push(1);
            let mut lead = vec![input.dims()[0]];
            lead.extend_from_slice(&input.dims()[2..]);
            let rows: usize = lead.iter().product();
            Ok((
                input.permute(&perm)?.reshape([rows, input.dims()[1]])?,
                lead,
            ))
        }
    }
}

fn class_weight(op: &'static str, w: &Option<Tensor>, c: usize, like: &Tensor) -> Result<Tensor> {
    match w {
        Some(w) => {
            if w.dims() != [c] {
                return Err(Error::shape(
                    op,
                    format!("weight must be [{c}] for {c} classes, got {}", w.shape()),
                ));
            }
            w.detach().cast(like.dtype())
        }
        None => Tensor::constant(1.0, [c], like.dtype(), like.device()),
    }
}

/// Cross-entropy between logits `input` ([C], [N, C] or [N, C, d...]) and `target`: class
/// indices (an integer tensor shaped like input without its class dim) or class
/// probabilities (a float tensor shaped like input).
pub fn cross_entropy(input: &Tensor, target: &Tensor, o: &CrossEntropyOptions) -> Result<Tensor> {
    let op = "cross_entropy";
    if !(0.0..=1.0).contains(&o.label_smoothing) {
        return Err(Error::shape(
            op,
            format!(
                "label_smoothing must be in [0, 1], got {}",
                o.label_smoothing
            ),
        ));
    }
    let (rows, lead) = class_rows(op, input)?;
    let c = rows.dims()[1];
    let w = class_weight(op, &o.weight, c, input)?;
    if target.dtype().is_float() {
        same_shape(op, input, target)?;
        let (p, _) = class_rows(op, target)?;
        let p = p
            .mul_scalar(1.0 - o.label_smoothing)?
            .add_scalar(o.label_smoothing / c as f64)?;
        let l = p
            .mul(&rows.log_softmax(-1)?)?
            .mul(&w)?
            .sum(&[-1], false)?
            .neg()?
            .reshape(lead)?;
        return reduce(l, o.reduction);
    }
    if target.dims() != lead.as_slice() {
        return Err(Error::shape(
            op,
            format!(
                "class-index target must be {lead:?} for input {}, got {}",
                input.shape(),
                target.shape()
            ),
        ));
    }
    let n = rows.dims()[0];
    let t = target.reshape([n])?;
    // Per row (loss, lse, w[t]) in the accumulator dtype: f32 for 16-bit logits, computed in
    // f32; w[t] is 0 on ignored rows.
    let out = Tensor::cross_entropy_rows(&rows, &t, &w, o.ignore_index, o.label_smoothing)?;
    let l = || out.narrow(1, 0, 1)?.reshape([n]);
    let loss = match o.reduction {
        Reduction::None => l()?.reshape(lead),
        Reduction::Sum => l()?.sum_all(),
        // Divided by the summed class weights of the rows not ignored (their count without
        // class weights), which the op wrote beside each row's loss: both sums from one
        // reduction of the rows.
        Reduction::Mean => {
            let s = out.sum(&[0], false)?;
            s.narrow(0, 0, 1)?
                .div(&s.narrow(0, 2, 1)?.detach())?
                .reshape(())
        }
    }?;
    // Under autocast the loss stays f32 (PyTorch's autocast runs cross_entropy in f32, so
    // 16-bit logits reach it without an f32 copy of them); otherwise it has the logits' dtype.
    if loss.dtype() == input.dtype() || ferrite_core::autocast::autocast_dtype().is_some() {
        Ok(loss)
    } else {
        loss.cast(input.dtype())
    }
}

/// Negative log-likelihood of log-probabilities `input` ([C], [N, C] or [N, C, d...]) at
/// class indices `target`; mean divides by the summed weights of non-ignored targets.
pub fn nll_loss(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    ignore_index: i64,
    reduction: Reduction,
) -> Result<Tensor> {
    let op = "nll_loss";
    let (rows, lead) = class_rows(op, input)?;
    let c = rows.dims()[1];
    let w = class_weight(op, &weight.cloned(), c, input)?;
    if !target.dtype().is_int() || target.dims() != lead.as_slice() {
        return Err(Error::shape(
            op,
            format!(
                "target must be integer {lead:?} for input {}, got {} {}",
                input.shape(),
                target.dtype(),
                target.shape()
            ),
        ));
    }
    let r = rows.dims()[0];
    let t = target.reshape([r])?.cast(DType::I64)?;
    let (safe, wt) = no_grad(|| -> Result<(Tensor, Tensor)> {
        let valid = t.ne(&Tensor::constant(
            ignore_index as f64,
            (),
            DType::I64,
            t.device(),
        )?)?;
        let safe = Tensor::where_cond(&valid, &t, &t.zeros_like()?)?;
        // Targets outside [0, C) fail in index_select/gather (checked on the device).
        let wt = w.index_select(&safe, 0)?.mul(&valid.cast(w.dtype())?)?;
        Ok((safe, wt))
    })?;
    let picked = rows.gather(&safe.unsqueeze(1)?, 1)?.reshape([r])?;
    let l = picked.mul(&wt)?.neg()?;
    match reduction {
        Reduction::None => l.reshape(lead),
        Reduction::Sum => l.sum_all(),
        Reduction::Mean => l.sum_all()?.div(&wt.sum_all()?),
    }
}

/// -w (t log x + (1 - t) log(1 - x)) on probabilities `input`; logs clamped at -100 as in
/// PyTorch.
pub fn binary_cross_entropy(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    same_shape("binary_cross_entropy", input, target)?;
    let lx = input.log()?.maximum_scalar(-100.0)?;
    let l1x = input
        .neg()?
        .add_scalar(1.0)?
        .log()?
        .maximum_scalar(-100.0)?;
    let mut l = target
        .mul(&lx)?
        .add(&target.neg()?.add_scalar(1.0)?.mul(&l1x)?)?
        .neg()?;
    if let Some(w) = weight {
        l = l.mul(w)?;
    }
    reduce(l, reduction)
}

/// Binary cross-entropy on logits, stably: (1 - t) x + (1 + (pw - 1) t) (log(1 + e^-|x|) +
/// max(-x, 0)); `pos_weight` broadcasts over the class (last) dims.
pub fn binary_cross_entropy_with_logits(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    pos_weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    same_shape("binary_cross_entropy_with_logits", input, target)?;
    let sp = input
        .abs()?
        .neg()?
        .exp()?
        .add_scalar(1.0)?
        .log()?
        .add(&input.neg()?.maximum_scalar(0.0)?)?;
    let one_minus_t = target.neg()?.add_scalar(1.0)?;
    let coef = match pos_weight {
        Some(pw) => target.mul(&pw.sub_scalar(1.0)?)?.add_scalar(1.0)?,
        None => target.ones_like()?,
    };
    let mut l = one_minus_t.mul(input)?.add(&coef.mul(&sp)?)?;
    if let Some(w) = weight {
        l = l.mul(w)?;
    }
    reduce(l, reduction)
}

/// torchvision's `sigmoid_focal_loss`: bce_with_logits (1 - p_t)^γ, times α_t when α ≥ 0.
pub fn sigmoid_focal_loss(
    input: &Tensor,
    target: &Tensor,
    alpha: f64,
    gamma: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    let ce = binary_cross_entropy_with_logits(input, target, None, None, Reduction::None)?;
    let p = input.sigmoid()?;
    let one_minus_t = target.neg()?.add_scalar(1.0)?;
    let p_t = p
        .mul(target)?
        .add(&p.neg()?.add_scalar(1.0)?.mul(&one_minus_t)?)?;
    let mut l = ce.mul(&p_t.neg()?.add_scalar(1.0)?.pow_scalar(gamma)?)?;
    if alpha >= 0.0 {
        let a_t = target
            .mul_scalar(alpha)?
            .add(&one_minus_t.mul_scalar(1.0 - alpha)?)?;
        l = l.mul(&a_t)?;
    }
    reduce(l, reduction)
}

/// x where y = 1, max(0, margin - x) where y = -1 (PyTorch's `hinge_embedding_loss`).
pub fn hinge_embedding_loss(
    input: &Tensor,
    target: &Tensor,
    margin: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    same_shape("hinge_embedding_loss", input, target)?;
    let z = input.zeros_like()?;
    let m = input.neg()?.add_scalar(margin)?.maximum_scalar(0.0)?;
    let out_margin = Tensor::where_cond(&target.ne(&target.scalar_like(1.0)?)?, &m, &z)?;
    let out_self = Tensor::where_cond(&target.ne(&target.scalar_like(-1.0)?)?, input, &z)?;
    reduce(out_margin.add(&out_self)?, reduction)
}

/// Σ_{j ≠ y} max(0, margin - x[y] + x[j])^p w[y] / C over rows of `input` [N, C] (or [C]).
pub fn multi_margin_loss(
    input: &Tensor,
    target: &Tensor,
    p: u32,
    margin: f64,
    weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    let op = "multi_margin_loss";
    if p != 1 && p != 2 {
        return Err(Error::shape(op, format!("p must be 1 or 2, got {p}")));
    }
    let x = if input.rank() == 1 {
        input.unsqueeze(0)?
    } else {
        input.clone()
    };
    if x.rank() != 2 {
        return Err(Error::shape(
            op,
            format!("input must be [N, C] or [C], got {}", input.shape()),
        ));
    }
    let (n, c) = (x.dims()[0], x.dims()[1]);
    let t = target.reshape([n])?.cast(DType::I64)?;
    let xy = x.gather(&t.unsqueeze(1)?, 1)?;
    let mut m = x.sub(&xy)?.add_scalar(margin)?.maximum_scalar(0.0)?;
    if p == 2 {
        m = m.square()?;
    }
    if let Some(w) = weight {
        m = m.mul(&w.index_select(&t, 0)?.unsqueeze(1)?)?;
    }
    // Drop the j = y terms.
    let not_y = no_grad(|| {
        Tensor::arange(0.0, c as f64, 1.0, DType::I64, x.device())?
            .unsqueeze(0)?
            .ne(&t.unsqueeze(1)?)?
            .cast(x.dtype())
    })?;
    let l = m.mul(&not_y)?.sum(&[1], false)?.div_scalar(c as f64)?;
    let l = if input.rank() == 1 { l.reshape(())? } else { l };
    reduce(l, reduction)
}

pub fn mse_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    same_shape("mse_loss", input, target)?;
    reduce(input.sub(target)?.square()?, reduction)
}

pub fn l1_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    same_shape("l1_loss", input, target)?;
    reduce(input.sub(target)?.abs()?, reduction)
}

/// 0.5 d² where |d| < δ, else δ (|d| - 0.5 δ).
pub fn huber_loss(
    input: &Tensor,
    target: &Tensor,
    delta: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    same_shape("huber_loss", input, target)?;
    if delta.is_nan() || delta <= 0.0 {
        return Err(Error::shape(
            "huber_loss",
            format!("delta must be positive, got {delta}"),
        ));
    }
    let d = input.sub(target)?;
    let a = d.abs()?;
    let quad = d.square()?.mul_scalar(0.5)?;
    let lin = a.sub_scalar(0.5 * delta)?.mul_scalar(delta)?;
    reduce(
        Tensor::where_cond(&a.lt(&a.scalar_like(delta)?)?, &quad, &lin)?,
        reduction,
    )
}

/// 0.5 d² / β where |d| < β, else |d| - 0.5 β; β = 0 is the L1 loss.
pub fn smooth_l1_loss(
    input: &Tensor,
    target: &Tensor,
    beta: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    same_shape("smooth_l1_loss", input, target)?;
    if beta.is_nan() || beta < 0.0 {
        return Err(Error::shape(
            "smooth_l1_loss",
            format!("beta must be non-negative, got {beta}"),
        ));
    }
    let a = input.sub(target)?.abs()?;
    if beta == 0.0 {
        return reduce(a, reduction);
    }
    let quad = a.square()?.mul_scalar(0.5 / beta)?;
    let lin = a.sub_scalar(0.5 * beta)?;
    reduce(
        Tensor::where_cond(&a.lt(&a.scalar_like(beta)?)?, &quad, &lin)?,
        reduction,
    )
}

/// `kl_div`'s reductions: PyTorch's "mean" averages over every element; "batchmean" (the
/// mathematically correct KL) divides the sum by the batch size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KlReduction {
    None,
    #[default]
    Mean,
    BatchMean,
    Sum,
}

/// KL(target ‖ input) with `input` log-probabilities: target (log target - input), 0 where
/// target = 0; with `log_target`, exp(t) (t - input).
pub fn kl_div(
    input: &Tensor,
    target: &Tensor,
    reduction: KlReduction,
    log_target: bool,
) -> Result<Tensor> {
    same_shape("kl_div", input, target)?;
    let l = if log_target {
        target.exp()?.mul(&target.sub(input)?)?
    } else {
        let pos = target.gt(&target.zeros_like()?)?;
        // xlogy: 0 log 0 = 0; the masked branch's log sees 1 so its gradient stays finite.
        let safe = Tensor::where_cond(&pos, target, &target.ones_like()?)?;
        let xlogx = Tensor::where_cond(&pos, &target.mul(&safe.log()?)?, &target.zeros_like()?)?;
        xlogx.sub(&target.mul(input)?)?
    };
    match reduction {
        KlReduction::None => Ok(l),
        KlReduction::Mean => l.mean(&[], false),
        KlReduction::Sum => l.sum_all(),
        KlReduction::BatchMean => {
            let b = if input.rank() == 0 {
                1
            } else {
                input.dims()[0]
            };
            l.sum_all()?.div_scalar(b as f64)
        }
    }
}

/// 1 - cos(x1, x2) where y = 1, max(0, cos - margin) where y = -1; cos over the last dim with
/// PyTorch's 1e-12 added to each squared norm.
pub fn cosine_embedding_loss(
    x1: &Tensor,
    x2: &Tensor,
    target: &Tensor,
    margin: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    same_shape("cosine_embedding_loss", x1, x2)?;
    let prod = x1.mul(x2)?.sum(&[-1], false)?;
    let m1 = x1.square()?.sum(&[-1], false)?.add_scalar(1e-12)?;
    let m2 = x2.square()?.sum(&[-1], false)?.add_scalar(1e-12)?;
    let cos = prod.div(&m1.mul(&m2)?.sqrt()?)?;
    let z = cos.zeros_like()?;
    let t = target.cast(cos.dtype())?;
    let pos = Tensor::where_cond(
        &t.eq(&t.scalar_like(1.0)?)?,
        &cos.neg()?.add_scalar(1.0)?,
        &z,
    )?;
    let neg = Tensor::where_cond(
        &t.eq(&t.scalar_like(-1.0)?)?,
        &cos.sub_scalar(margin)?.maximum_scalar(0.0)?,
        &z,
    )?;
    reduce(pos.add(&neg)?, reduction)
}

/// max(0, -y (x1 - x2) + margin).
pub fn margin_ranking_loss(
    x1: &Tensor,
    x2: &Tensor,
    target: &Tensor,
    margin: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    same_shape("margin_ranking_loss", x1, x2)?;
    let l = target
        .neg()?
        .mul(&x1.sub(x2)?)?
        .add_scalar(margin)?
        .maximum_scalar(0.0)?;
    reduce(l, reduction)
}

/// ‖a - b + eps‖_p over the last dim (PyTorch's `pairwise_distance`).
pub fn pairwise_distance(a: &Tensor, b: &Tensor, p: f64, eps: f64) -> Result<Tensor> {
    let d = a.sub(b)?.add_scalar(eps)?;
    if p == 2.0 {
        d.square()?.sum(&[-1], false)?.sqrt()
    } else if p == 1.0 {
        d.abs()?.sum(&[-1], false)
    } else {
        d.abs()?
            .pow_scalar(p)?
            .sum(&[-1], false)?
            .pow_scalar(1.0 / p)
    }
}

/// max(d(a, p) - d(a, n) + margin, 0), with `swap` taking min(d(a, n), d(p, n)).
#[allow(clippy::too_many_arguments)]
pub fn triplet_margin_loss(
    anchor: &Tensor,
    positive: &Tensor,
    negative: &Tensor,
    margin: f64,
    p: f64,
    eps: f64,
    swap: bool,
    reduction: Reduction,
) -> Result<Tensor> {
    same_shape("triplet_margin_loss", anchor, positive)?;
    same_shape("triplet_margin_loss", anchor, negative)?;
    if p.is_nan() || p <= 0.0 {
        return Err(Error::shape(
            "triplet_margin_loss",
            format!("p must be positive, got {p}"),
        ));
    }
    let d_ap = pairwise_distance(anchor, positive, p, eps)?;
    let mut d_an = pairwise_distance(anchor, negative, p, eps)?;
    if swap {
        d_an = d_an.minimum(&pairwise_distance(positive, negative, p, eps)?)?;
    }
    reduce(
        d_ap.sub(&d_an)?.add_scalar(margin)?.maximum_scalar(0.0)?,
        reduction,
    )
}
