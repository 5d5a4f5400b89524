//! Backward rules: one exhaustive match over every recorded op. Each rule maps the upstream
//! gradient `g` of one output to a gradient per input (`None` where none flows: integer
//! inputs, indices, conditions). Inputs are as the op received them (broadcasting happened in
//! recorded views, so binary rules see equal shapes). Outputs needed by a rule are recomputed
//! from the inputs; nothing else is saved.
//!
//! Fused ops have dedicated backward kernels (`Op::*Backward`); RoPE with trainable angles
//! takes the vector-Jacobian product of its composition.
//!
//! Conventions: sign, floor, ceil and round have derivative 0; abs has derivative sign(x)
//! (0 at 0); relu has 0 at 0. Ties: `maximum`/`minimum` give the gradient to the first operand;
//! `max`/`min` reductions split it equally among all tied elements.

use ferrite_core::graph::{enable_grad, GradOp, ViewOp};
use ferrite_core::{composed, BinaryOp, Op, ReduceOp, Result, Tensor, UnaryOp};

type Grads = Vec<Option<Tensor>>;

fn one(t: Tensor) -> Result<Grads> {
    Ok(vec![Some(t)])
}

pub(crate) fn vjp(op: &GradOp, output: usize, x: &[Tensor], g: &Tensor) -> Result<Grads> {
    match op {
        GradOp::View(v) => view(v, &x[0], g),
        GradOp::Op(op) => primitive(op, output, x, g),
    }
}

fn view(v: &ViewOp, x: &Tensor, g: &Tensor) -> Result<Grads> {
    match v {
        ViewOp::Reshape => one(g.reshape(x.shape())?),
        ViewOp::Permute(perm) => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            one(g.permute(&inv)?)
        }
        ViewOp::Narrow { axis, start } => {
            // Zeros around the narrowed range.
            let full = x.dims()[*axis];
            let len = g.dims()[*axis];
            let pad = |n: usize| -> Result<Tensor> {
                let mut d = g.dims().to_vec();
                d[*axis] = n;
                Tensor::zeros(d, g.dtype(), g.device())
            };
            let (before, after) = (pad(*start)?, pad(full - start - len)?);
            one(Tensor::cat(&[&before, g, &after], *axis as isize)?)
        }
        ViewOp::Broadcast => one(unbroadcast(g, x.dims())?),
    }
}

/// Sums `g` over the dims a broadcast to its shape added or stretched, back to `dims`.
fn unbroadcast(g: &Tensor, dims: &[usize]) -> Result<Tensor> {
    let lead = g.rank() - dims.len();
    let axes: Vec<isize> = (0..g.rank())
        .filter(|&i| i < lead || (dims[i - lead] == 1 && g.dims()[i] != 1))
        .map(|i| i as isize)
        .collect();
    if axes.is_empty() {
        return g.reshape(dims);
    }
    g.sum(&axes, true)?.reshape(dims)
}

fn mask(cond: &Tensor, g: &Tensor) -> Result<Tensor> {
    Tensor::where_cond(cond, g, &g.zeros_like()?)
}

fn unary(op: UnaryOp, x: &Tensor, g: &Tensor) -> Result<Tensor> {
    let zero = || g.zeros_like();
    match op {
        UnaryOp::Neg => g.neg(),
        UnaryOp::Abs => g.mul(&x.sign()?),
        UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => zero(),
        UnaryOp::Exp => g.mul(&x.exp()?),
        UnaryOp::Log => g.div(x),
        UnaryOp::Sqrt => g.div(&x.sqrt()?.mul_scalar(2.0)?),
        UnaryOp::Rsqrt => g.mul(&x.rsqrt()?.div(x)?.mul_scalar(-0.5)?),
        UnaryOp::Recip => g.neg()?.div(&x.square()?),
        UnaryOp::Square => g.mul(&x.mul_scalar(2.0)?),
        UnaryOp::Sin => g.mul(&x.cos()?),
        UnaryOp::Cos => g.mul(&x.sin()?.neg()?),
        UnaryOp::Tanh => g.mul(&x.tanh()?.square()?.neg()?.add_scalar(1.0)?),
        UnaryOp::Sigmoid => {
            let s = x.sigmoid()?;
            g.mul(&s.mul(&s.neg()?.add_scalar(1.0)?)?)
        }
        UnaryOp::Relu => mask(&x.gt(&x.scalar_like(0.0)?)?, g),
        UnaryOp::GeluErf => {
            // Φ(x) + x φ(x), with Φ(x) = gelu(x) / x (0.5 at x = 0).
            let is0 = x.eq(&x.scalar_like(0.0)?)?;
            let safe = Tensor::where_cond(&is0, &x.ones_like()?, x)?;
            let cdf = Tensor::where_cond(&is0, &x.full_like(0.5)?, &x.gelu()?.div(&safe)?)?;
            let pdf = x
                .square()?
                .mul_scalar(-0.5)?
                .exp()?
                .mul_scalar(1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
            g.mul(&cdf.add(&x.mul(&pdf)?)?)
        }
        UnaryOp::GeluTanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let x2 = x.square()?;
            let t = x
                .mul(&x2.mul_scalar(0.044715)?.add_scalar(1.0)?)?
                .mul_scalar(c)?
                .tanh()?;
            let dt = t
                .square()?
                .neg()?
                .add_scalar(1.0)?
                .mul(&x2.mul_scalar(3.0 * 0.044715)?.add_scalar(1.0)?)?
                .mul_scalar(c)?;
            let d = t
                .add_scalar(1.0)?
                .mul_scalar(0.5)?
                .add(&x.mul(&dt)?.mul_scalar(0.5)?)?;
            g.mul(&d)
        }
        UnaryOp::Silu => {
            let s = x.sigmoid()?;
            let d = s.add(&x.mul(&s)?.mul(&s.neg()?.add_scalar(1.0)?)?)?;
            g.mul(&d)
        }
    }
}

fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, g: &Tensor) -> Result<Grads> {
    let (ga, gb) = match op {
        BinaryOp::Add => (g.clone(), g.clone()),
        BinaryOp::Sub => (g.clone(), g.neg()?),
        BinaryOp::Mul => (g.mul(b)?, g.mul(a)?),
        BinaryOp::Div => (g.div(b)?, g.neg()?.mul(a)?.div(&b.square()?)?),
        BinaryOp::Pow => {
            let y = a.pow(b)?;
            let ga = g.mul(b)?.mul(&a.pow(&b.add_scalar(-1.0)?)?)?;
            // d/db a^b = a^b ln a, taken as 0 where a <= 0.
            let pos = a.gt(&a.scalar_like(0.0)?)?;
            let safe = Tensor::where_cond(&pos, a, &a.ones_like()?)?;
            (ga, mask(&pos, &g.mul(&y)?.mul(&safe.log()?)?)?)
        }
        BinaryOp::Maximum => (mask(&a.ge(b)?, g)?, mask(&a.lt(b)?, g)?),
        BinaryOp::Minimum => (mask(&a.le(b)?, g)?, mask(&a.gt(b)?, g)?),
    };
    Ok(vec![Some(ga), Some(gb)])
}

/// Fused ops: the vector-Jacobian product of their composition from primitives.
fn through_composition(
    x: &[Tensor],
    g: &Tensor,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<Grads> {
    enable_grad(|| {
        let vars = x
            .iter()
            .map(|t| {
                if t.dtype().is_float() {
                    crate::Var::new(t).map(Some)
                } else {
                    Ok(None)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let ins: Vec<Tensor> = x
            .iter()
            .zip(&vars)
            .map(|(t, v)| v.as_ref().map_or_else(|| t.clone(), |v| v.tensor().clone()))
            .collect();
        let out = f(&ins)?;
        crate::backward_with(&out, g)?;
        Ok(vars
            .iter()
            .map(|v| v.as_ref().and_then(|v| v.grad()))
            .collect())
    })
}

fn primitive(op: &Op, output: usize, x: &[Tensor], g: &Tensor) -> Result<Grads> {
    match op {
        Op::Unary(u) => one(unary(*u, &x[0], g)?),
        Op::Binary(b) => binary(*b, &x[0], &x[1], g),
        Op::Where => Ok(vec![
            None,
            Some(mask(&x[0], g)?),
            Some(Tensor::where_cond(&x[0], &g.zeros_like()?, g)?),
        ]),
        Op::Reduce { op, axes } => {
            let axes: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
            let xs = x[0].shape();
            match op {
                ReduceOp::Sum => one(g.broadcast_to(xs)?),
                ReduceOp::Max | ReduceOp::Min => {
                    let y = if *op == ReduceOp::Max {
                        x[0].max(&axes, true)?
                    } else {
                        x[0].min(&axes, true)?
                    };
                    let hit = x[0].eq(&y)?;
                    let count = hit.cast(g.dtype())?.sum(&axes, true)?;
                    one(mask(&hit, &g.div(&count)?.broadcast_to(xs)?)?)
                }
                ReduceOp::ArgMax | ReduceOp::ArgMin => Ok(vec![None]),
            }
        }
        Op::Matmul => Ok(vec![
            Some(g.matmul(&x[1].t()?)?),
            Some(x[0].t()?.matmul(g)?),
        ]),
        Op::Cast(_) => Ok(vec![match x[0].dtype().is_float() {
            true => Some(g.cast(x[0].dtype())?),
            false => None,
        }]),
        Op::Copy => one(g.clone()),
        Op::IndexSelect { axis } => {
            let mut shape = vec![1; g.rank()];
            shape[*axis] = x[1].elem_count();
            let idx = x[1].reshape(shape)?.broadcast_to(g.shape())?;
            Ok(vec![
                Some(x[0].zeros_like()?.scatter_add(&idx, g, *axis as isize)?),
                None,
            ])
        }
        Op::Gather { axis } => Ok(vec![
            Some(x[0].zeros_like()?.scatter_add(&x[1], g, *axis as isize)?),
            None,
        ]),
        Op::ScatterAdd { axis } => Ok(vec![
            Some(g.clone()),
            None,
            Some(g.gather(&x[1], *axis as isize)?),
        ]),
        Op::Cat { axis } => {
            let sizes: Vec<usize> = x.iter().map(|t| t.dims()[*axis]).collect();
            Ok(g.split(&sizes, *axis as isize)?
                .into_iter()
                .map(Some)
                .collect())
        }
        Op::Cumsum { axis } => {
            // Reverse cumulative sum: total - cumsum + g.
            let a = *axis as isize;
            one(g.sum(&[a], true)?.sub(&g.cumsum(a)?)?.add(g)?)
        }
        Op::Sort { axis, descending } => {
            debug_assert_eq!(output, 0, "only sorted values carry a gradient");
            let (_, idx) = x[0].sort(*axis as isize, *descending)?;
            one(x[0].zeros_like()?.scatter_add(&idx, g, *axis as isize)?)
        }
        Op::Softmax => one(Tensor::softmax_backward(&x[0].softmax(-1)?, g, false)?),
        Op::LogSoftmax => one(Tensor::softmax_backward(&x[0].log_softmax(-1)?, g, true)?),
        Op::LayerNorm { eps } => {
            let (dx, dw, db) = Tensor::layer_norm_backward(&x[0], &x[1], g, *eps)?;
            Ok(vec![Some(dx), Some(dw), Some(db)])
        }
        Op::RmsNorm { eps } => {
            let (dx, dw) = Tensor::rms_norm_backward(&x[0], &x[1], g, *eps)?;
            Ok(vec![Some(dx), Some(dw)])
        }
        // The rotation is orthogonal: its transpose rotates by -θ, i.e. sin -> -sin.
        Op::Rope { interleaved } if !x[1].requires_grad() && !x[2].requires_grad() => Ok(vec![
            Some(g.rope(&x[1], &x[2].neg()?, *interleaved)?),
            None,
            None,
        ]),
        Op::Rope { interleaved } => {
            through_composition(x, g, |t| composed::rope(&t[0], &t[1], &t[2], *interleaved))
        }
        Op::Attention { causal, scale } => {
            let (dq, dk, dv) = Tensor::attention_backward(&x[0], &x[1], &x[2], g, *causal, *scale)?;
            Ok(vec![Some(dq), Some(dk), Some(dv)])
        }
        // Backward kernels are not differentiated again (they carry no graph node).
        Op::SoftmaxBackward { .. }
        | Op::RmsNormBackward { .. }
        | Op::LayerNormBackward { .. }
        | Op::AttentionBackward { .. } => Ok(vec![None; x.len()]),
        Op::Cmp(_)
        | Op::Fill { .. }
        | Op::Arange { .. }
        | Op::RandUniform { .. }
        | Op::RandNormal { .. } => Ok(vec![None; x.len()]),
    }
}
