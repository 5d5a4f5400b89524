//! Normalizations over channels of `[n, c, ...]` tensors: batch norm (batch statistics as the
//! fused `BatchNorm` op; running statistics as a composition) and group norm (`GroupNorm`),
//! plus dropout masks from the counter-based RNG (the same mask on every device).

use crate::op::Op;
use crate::{DType, Error, Result, Shape, Tensor};

impl Tensor {
    /// Checks x [n, c, ...] (float) and per-channel parameters [c] of x's dtype.
    fn check_channel_params(&self, op: &'static str, params: &[&Tensor]) -> Result<usize> {
        if !self.dtype().is_float() {
            return Err(Error::dtype(op, self.dtype(), "needs a float dtype"));
        }
        if self.rank() < 2 {
            return Err(Error::shape(
                op,
                format!("expected input [n, c, ...], got {}", self.shape()),
            ));
        }
        let c = self.dims()[1];
        for p in params {
            if p.dtype() != self.dtype() {
                return Err(Error::DTypeMismatch {
                    op,
                    lhs: self.dtype(),
                    rhs: p.dtype(),
                });
            }
            if p.dims() != [c] {
                return Err(Error::shape(
                    op,
                    format!(
                        "expected parameters [{c}] for input {}, got {}",
                        self.shape(),
                        p.shape()
                    ),
                ));
            }
        }
        Ok(c)
    }

    /// Batch norm of `x [n, c, ...]` with the batch's statistics -> (y, mean [c], biased
    /// var [c]). A module updating running statistics uses the unbiased variance
    /// `var * m / (m - 1)`, m = n * (product of the trailing dims).
    pub fn batch_norm_train(
        &self,
        weight: &Tensor,
        bias: &Tensor,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let op = "batch_norm";
        let c = self.check_channel_params(op, &[weight, bias])?;
        if self.elem_count() == 0 {
            return Err(Error::shape(
                op,
                format!("needs at least one value per channel, got {}", self.shape()),
            ));
        }
        let stat = (Shape::new([c]), self.dtype());
        let mut o = self.run(
            Op::BatchNorm { eps },
            &[self, weight, bias],
            vec![(self.shape().clone(), self.dtype()), stat.clone(), stat],
        )?;
        match (o.pop(), o.pop(), o.pop()) {
            (Some(var), Some(mean), Some(y)) => Ok((y, mean, var)),
            _ => Err(Error::backend(op, "backend returned too few outputs")),
        }
    }

    /// Batch norm of `x [n, c, ...]` with given statistics `mean [c]`, `var [c]` (eval mode):
    /// `(x - mean) / sqrt(var + eps) * weight + bias`, weight and bias optional.
    pub fn batch_norm_eval(
        &self,
        mean: &Tensor,
        var: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let op = "batch_norm";
        let mut ps = vec![mean, var];
        ps.extend(weight);
        ps.extend(bias);
        let c = self.check_channel_params(op, &ps)?;
        let mut d = vec![1; self.rank()];
        d[1] = c;
        let per_channel = |t: &Tensor| t.reshape(d.clone())?.broadcast_to(self.shape().clone());
        let scale = var.add_scalar(eps)?.rsqrt()?;
        let scale = match weight {
            Some(w) => scale.mul(w)?,
            None => scale,
        };
        let y = self.sub(&per_channel(mean)?)?.mul(&per_channel(&scale)?)?;
        match bias {
            Some(b) => y.add(&per_channel(b)?),
            None => Ok(y),
        }
    }

    /// Group norm of `x [n, c, ...]`: statistics over each sample's `groups` groups of
    /// c / groups channels, then per-channel `weight [c]` and `bias [c]`.
    pub fn group_norm(
        &self,
        groups: usize,
        weight: &Tensor,
        bias: &Tensor,
        eps: f64,
    ) -> Result<Tensor> {
        let op = "group_norm";
        let c = self.check_channel_params(op, &[weight, bias])?;
        check_groups(op, c, groups)?;
        self.run1(
            Op::GroupNorm { groups, eps },
            &[self, weight, bias],
            self.shape().clone(),
            self.dtype(),
        )
    }

    fn norm_backward(
        op: &'static str,
        norm: Op,
        x: &Tensor,
        weight: &Tensor,
        g: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        x.check_channel_params(op, &[weight])?;
        if g.shape() != x.shape() || g.dtype() != x.dtype() {
            return Err(Error::shape(
                op,
                format!(
                    "upstream gradient {} {} does not match input {} {}",
                    g.shape(),
                    g.dtype(),
                    x.shape(),
                    x.dtype()
                ),
            ));
        }
        let p = (weight.shape().clone(), x.dtype());
        let mut o = x.run(
            norm,
            &[x, weight, g],
            vec![(x.shape().clone(), x.dtype()), p.clone(), p],
        )?;
        match (o.pop(), o.pop(), o.pop()) {
            (Some(db), Some(dw), Some(dx)) => Ok((dx, dw, db)),
            _ => Err(Error::backend(op, "backend returned too few outputs")),
        }
    }

    /// (dx, dweight, dbias) of `batch_norm_train(x, weight, _, eps).0` for upstream `g`.
    pub fn batch_norm_backward(
        x: &Tensor,
        weight: &Tensor,
        g: &Tensor,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let op = "batch_norm_backward";
        Tensor::norm_backward(op, Op::BatchNormBackward { eps }, x, weight, g)
    }

    /// (dx, dweight, dbias) of `group_norm(x, groups, weight, _, eps)` for upstream `g`.
    pub fn group_norm_backward(
        x: &Tensor,
        weight: &Tensor,
        g: &Tensor,
        groups: usize,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let op = "group_norm_backward";
        if x.rank() >= 2 {
            check_groups(op, x.dims()[1], groups)?;
        }
        Tensor::norm_backward(op, Op::GroupNormBackward { groups, eps }, x, weight, g)
    }

    /// Inverted dropout: each element kept with probability 1 - p and scaled by 1 / (1 - p).
    /// The mask is `rand_uniform(seed) >= p` over x's shape: the same on every device.
    pub fn dropout(&self, p: f64, seed: u64) -> Result<Tensor> {
        self.dropout_mask("dropout", p, seed, self.dims().to_vec())
    }

    /// Channel dropout of `x [n, c, ...]`: whole channels kept or zeroed (mask `[n, c, 1...]`).
    pub fn dropout2d(&self, p: f64, seed: u64) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(Error::shape(
                "dropout2d",
                format!("expected input [n, c, ...], got {}", self.shape()),
            ));
        }
        let mut d = vec![1; self.rank()];
        d[..2].copy_from_slice(&self.dims()[..2]);
        self.dropout_mask("dropout2d", p, seed, d)
    }

    fn dropout_mask(
        &self,
        op: &'static str,
        p: f64,
        seed: u64,
        mask: Vec<usize>,
    ) -> Result<Tensor> {
        if !self.dtype().is_float() {
            return Err(Error::dtype(op, self.dtype(), "needs a float dtype"));
        }
        if !(0.0..1.0).contains(&p) {
            return Err(Error::shape(op, format!("p must be in [0, 1), got {p}")));
        }
        if p == 0.0 {
            return Ok(self.clone());
        }
        let u = Tensor::rand_uniform(mask, 0.0, 1.0, seed, DType::F32, self.device())?;
        let keep = u
            .ge(&u.scalar_like(p)?)?
            .cast(self.dtype())?
            .mul_scalar(1.0 / (1.0 - p))?;
        self.mul(&keep.broadcast_to(self.shape().clone())?)
    }
}

fn check_groups(op: &'static str, c: usize, groups: usize) -> Result<()> {
    if groups == 0 || !c.is_multiple_of(groups) {
        return Err(Error::shape(
            op,
            format!("groups {groups} must divide the {c} channels"),
        ));
    }
    Ok(())
}
