//! The closed set of primitive ops. Every backend implements every variant in one exhaustive
//! `match` (the compiler lists what a new op must touch); composite ops are functions over these
//! in `tensor.rs` and `composite.rs`.
//!
//! Contracts (validated by `Tensor` before a backend sees the op; backends check only
//! data-dependent conditions such as index values):
//! - Inputs of `Binary`, `Cmp`, `Where` have equal shapes (broadcast dims are stride-0 views).
//! - Outputs are contiguous, with the shapes and dtypes `Tensor` passes as specs.
//! - Fused ops (`Softmax` … `Attention`) work on the last axis / trailing dims as documented.

use crate::DType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Abs,
    Sign,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Recip,
    Square,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Relu,
    /// x * Φ(x), with the exact normal CDF (erf).
    GeluErf,
    /// 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))).
    GeluTanh,
    Silu,
    Floor,
    Ceil,
    /// Round half away from zero.
    Round,
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 20] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Sign,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Recip,
        UnaryOp::Square,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::GeluErf,
        UnaryOp::GeluTanh,
        UnaryOp::Silu,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
    ];

    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Sign => "sign",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Recip => "recip",
            UnaryOp::Square => "square",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::GeluErf => "gelu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::Silu => "silu",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Round => "round",
        }
    }

    /// Ops defined on integer dtypes too (the rest need a float dtype).
    pub fn supports_int(self) -> bool {
        matches!(
            self,
            UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Sign
                | UnaryOp::Square
                | UnaryOp::Relu
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Round
        )
    }

    /// The op on one f64 value: the reference every backend is checked against.
    pub fn eval_f64(self, x: f64) -> f64 {
        match self {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Sign => {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            }
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => 1.0 / x.sqrt(),
            UnaryOp::Recip => 1.0 / x,
            UnaryOp::Square => x * x,
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Relu => x.max(0.0),
            UnaryOp::GeluErf => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
            UnaryOp::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
            }
            UnaryOp::Silu => x / (1.0 + (-x).exp()),
            UnaryOp::Floor => x.floor(),
            UnaryOp::Ceil => x.ceil(),
            UnaryOp::Round => x.round(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 7] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
        }
    }

    pub fn eval_f64(self, a: f64, b: f64) -> f64 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Pow => a.powf(b),
            BinaryOp::Maximum => a.max(b),
            BinaryOp::Minimum => a.min(b),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub const ALL: [CmpOp; 6] = [
        CmpOp::Eq,
        CmpOp::Ne,
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        }
    }

    pub fn eval<T: PartialOrd>(self, a: T, b: T) -> bool {
        match self {
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
            CmpOp::Gt => a > b,
            CmpOp::Ge => a >= b,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    /// Index (u32) of the first maximum; NaN counts as the maximum.
    ArgMax,
    /// Index (u32) of the first minimum; NaN counts as the minimum.
    ArgMin,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::ArgMax => "argmax",
            ReduceOp::ArgMin => "argmin",
        }
    }
}

/// A primitive op. Input order and output specs are documented per variant.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// (x) -> same shape and dtype.
    Unary(UnaryOp),
    /// (a, b) of equal shape and dtype -> same.
    Binary(BinaryOp),
    /// (a, b) of equal shape and dtype -> bool.
    Cmp(CmpOp),
    /// (cond: bool, a, b) of equal shape -> dtype of a.
    Where,
    /// (x) -> x's shape with every axis in `axes` set to 1. `axes` sorted, unique, non-empty;
    /// ArgMax/ArgMin take exactly one axis and output u32.
    Reduce { op: ReduceOp, axes: Vec<usize> },
    /// (a [..., m, k], b [..., k, n]) with equal batch dims (stride 0 where broadcast), float
    /// dtypes -> [..., m, n].
    Matmul,
    /// (x) -> x converted to the dtype: floats to ints truncate toward zero and saturate; NaN
    /// becomes 0; nonzero becomes true; true becomes 1.
    Cast(DType),
    /// (x) -> a contiguous copy.
    Copy,
    /// (x, index: 1-D int) -> x with dim `axis` replaced by the index's length.
    IndexSelect { axis: usize },
    /// (x, index: int, same rank; dims other than `axis` ≤ x's) -> index's shape;
    /// out[.., i, ..] = x[.., index[.., i, ..], ..].
    Gather { axis: usize },
    /// (base, index: int, src: index's shape) -> base's shape; out = base, then
    /// out[.., index[.., i, ..], ..] += src[.., i, ..].
    ScatterAdd { axis: usize },
    /// (x0, x1, ...) equal dtypes and equal dims except `axis` -> concatenation along `axis`.
    Cat { axis: usize },
    /// (x) -> inclusive prefix sum along `axis`.
    Cumsum { axis: usize },
    /// (x) -> (values, indices: u32), stable, along `axis`; NaN sorts as the largest value.
    Sort { axis: usize, descending: bool },
    /// (x [..., n]) -> softmax over the last axis.
    Softmax,
    /// (x [..., n]) -> log-softmax over the last axis.
    LogSoftmax,
    /// (x [..., n], weight [n], bias [n]) -> (x - mean) / sqrt(var + eps) * weight + bias.
    LayerNorm { eps: f64 },
    /// (x [..., n], weight [n]) -> x / sqrt(mean(x²) + eps) * weight.
    RmsNorm { eps: f64 },
    /// (x [..., l, d], cos [l, d/2], sin [l, d/2]) -> x rotated. Pairs are (2i, 2i+1) when
    /// `interleaved`, else (i, i + d/2) (the "split halves" / NeoX layout).
    Rope { interleaved: bool },
    /// (q [b, hq, lq, d], k [b, hkv, lk, d], v [b, hkv, lk, dv]) -> [b, hq, lq, dv];
    /// hq % hkv == 0, query head h reads kv head h / (hq / hkv). With `causal`, query i sees
    /// keys j ≤ i + lk - lq.
    Attention { causal: bool, scale: f64 },
    /// Fused log-softmax + NLL over class indices, never materializing probabilities:
    /// (logits [n, c] float, target [n] int, weight [c] logits' dtype) -> [n, 2] of logits'
    /// dtype, per row (loss, lse) with lse = logsumexp(x) and, ε = `label_smoothing`,
    /// loss = (1 - ε) w[t] (lse - x[t]) + (ε / c) Σ_j w[j] (lse - x[j]); rows whose target is
    /// `ignore_index` give (0, lse); any other target outside [0, c) is an error.
    CrossEntropy {
        ignore_index: i64,
        label_smoothing: f64,
    },
    /// Backward of `CrossEntropy`: (logits, target, weight, out [n, 2] (its output), g [n, 2])
    /// -> dlogits [n, c] = g[i, 0] ((1 - ε) w[t] (p - onehot(t)) + (ε / c) (p Σ_j w[j] - w)),
    /// p = exp(x - lse); zero on ignored rows. Only column 0 of g is read (lse carries no
    /// gradient).
    CrossEntropyBackward {
        ignore_index: i64,
        label_smoothing: f64,
    },
    /// Backward of softmax over the last axis: (y = softmax(x), g = dL/dy) -> dL/dx
    /// = y (g - sum(g y)); with `log`, y = log_softmax(x) and dL/dx = g - exp(y) sum(g).
    SoftmaxBackward { log: bool },
    /// Backward of `RmsNorm`: (x [..., n], weight [n], g [..., n]) -> (dx [..., n], dweight [n]).
    RmsNormBackward { eps: f64 },
    /// Backward of `LayerNorm`: (x [..., n], weight [n], g [..., n])
    /// -> (dx [..., n], dweight [n], dbias [n]).
    LayerNormBackward { eps: f64 },
    /// Backward of `Attention`: (q, k, v, g [b, hq, lq, dv]) -> (dq, dk, dv) shaped as q, k, v.
    AttentionBackward { causal: bool, scale: f64 },
    /// () -> every element `value`.
    Fill { value: f64 },
    /// () -> element i is start + i * step.
    Arange { start: f64, step: f64 },
    /// () -> uniform in [low, high): element i from Philox4x32-10 with key `seed`, counter i.
    RandUniform { seed: u64, low: f64, high: f64 },
    /// () -> normal(mean, std): element i from Philox counter i (Box–Muller on two words).
    RandNormal { seed: u64, mean: f64, std: f64 },
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Cmp(c) => c.name(),
            Op::Where => "where",
            Op::Reduce { op, .. } => op.name(),
            Op::Matmul => "matmul",
            Op::Cast(_) => "cast",
            Op::Copy => "contiguous",
            Op::IndexSelect { .. } => "index_select",
            Op::Gather { .. } => "gather",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::Cat { .. } => "cat",
            Op::Cumsum { .. } => "cumsum",
            Op::Sort { .. } => "sort",
            Op::Softmax => "softmax",
            Op::LogSoftmax => "log_softmax",
            Op::LayerNorm { .. } => "layer_norm",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Rope { .. } => "rope",
            Op::Attention { .. } => "attention",
            Op::CrossEntropy { .. } => "cross_entropy",
            Op::CrossEntropyBackward { .. } => "cross_entropy_backward",
            Op::SoftmaxBackward { log: false } => "softmax_backward",
            Op::SoftmaxBackward { log: true } => "log_softmax_backward",
            Op::RmsNormBackward { .. } => "rms_norm_backward",
            Op::LayerNormBackward { .. } => "layer_norm_backward",
            Op::AttentionBackward { .. } => "attention_backward",
            Op::Fill { .. } => "full",
            Op::Arange { .. } => "arange",
            Op::RandUniform { .. } => "rand_uniform",
            Op::RandNormal { .. } => "rand_normal",
        }
    }
}
