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

/// Elementwise binary ops (a, b broadcast). The `*Backward` ops are the activations'
/// derivatives in one pass, (x, g) -> g · f'(x), for the activations whose derivative would
/// otherwise take many elementwise passes; float dtypes only, like `Pow`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
    /// g · (Φ(x) + x φ(x)): exact GELU's derivative (Φ, φ: the normal cdf and pdf).
    GeluBackward,
    /// g · (½(1 + t) + ½ x (1 - t²) c (1 + 3k x²)), t = tanh(c (x + k x³)), c = √(2/π),
    /// k = 0.044715: the tanh GELU's derivative.
    GeluTanhBackward,
    /// g · s (1 + x (1 - s)), s = sigmoid(x): SiLU's derivative.
    SiluBackward,
    /// g where x > 0, else 0 (also where x is NaN): ReLU's derivative.
    ReluBackward,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 11] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::GeluBackward,
        BinaryOp::GeluTanhBackward,
        BinaryOp::SiluBackward,
        BinaryOp::ReluBackward,
    ];

    /// Whether the op is defined on float dtypes only.
    pub fn float_only(self) -> bool {
        matches!(
            self,
            BinaryOp::Pow
                | BinaryOp::GeluBackward
                | BinaryOp::GeluTanhBackward
                | BinaryOp::SiluBackward
                | BinaryOp::ReluBackward
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::GeluBackward => "gelu_backward",
            BinaryOp::GeluTanhBackward => "gelu_tanh_backward",
            BinaryOp::SiluBackward => "silu_backward",
            BinaryOp::ReluBackward => "relu_backward",
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
            BinaryOp::GeluBackward => {
                let cdf = 0.5 * (1.0 + libm::erf(a / std::f64::consts::SQRT_2));
                let pdf = (-0.5 * a * a).exp() / (2.0 * std::f64::consts::PI).sqrt();
                b * (cdf + a * pdf)
            }
            BinaryOp::GeluTanhBackward => {
                let (c, k) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715);
                let t = (c * (a + k * a * a * a)).tanh();
                b * (0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * c * (1.0 + 3.0 * k * a * a))
            }
            BinaryOp::SiluBackward => {
                let s = 1.0 / (1.0 + (-a).exp());
                b * s * (1.0 + a * (1.0 - s))
            }
            BinaryOp::ReluBackward => {
                if a > 0.0 {
                    b
                } else {
                    0.0
                }
            }
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

/// Geometry of a 2-d convolution (PyTorch's semantics; padding is zeros on both sides).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dParams {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

impl Conv2dParams {
    /// Output length along axis `a` (0: height, 1: width) of a convolution over `len` input
    /// elements with a kernel of `k`; `None` when the dilated kernel exceeds the padded input.
    pub fn out_len(&self, a: usize, len: usize, k: usize) -> Option<usize> {
        let span = self.dilation[a] * (k.max(1) - 1) + 1;
        let padded = len + 2 * self.padding[a];
        (padded >= span && self.stride[a] > 0).then(|| (padded - span) / self.stride[a] + 1)
    }
}

/// Geometry of a 2-d max pooling window (PyTorch's `max_pool2d`; padding is -inf).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pool2dParams {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub ceil_mode: bool,
}

impl Pool2dParams {
    /// Output length along axis `a` for `len` input elements: PyTorch's formula, where in ceil
    /// mode the last window must start inside the input or its left padding.
    pub fn out_len(&self, a: usize, len: usize) -> Option<usize> {
        let (k, s, p, d) = (
            self.kernel[a],
            self.stride[a],
            self.padding[a],
            self.dilation[a],
        );
        let span = d * (k.max(1) - 1) + 1;
        let padded = len + 2 * p;
        if k == 0 || s == 0 || padded < span {
            return None;
        }
        let num = padded - span;
        let mut out = if self.ceil_mode {
            num.div_ceil(s) + 1
        } else {
            num / s + 1
        };
        if self.ceil_mode && (out - 1) * s >= len + p {
            out -= 1;
        }
        Some(out)
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
    /// dtypes -> [..., m, n] in a's dtype, or in f32 when a and b are f16/bf16 and the output
    /// spec says f32 (f32 accumulation, one rounding: what autocast's products return).
    Matmul,
    /// (a [m, k], b [k, n], bias [n] in the output dtype[, acc in the output dtype])
    /// -> a b + bias (+ acc), the bias (and acc) added before the one rounding to the output
    /// dtype; dtypes as `Matmul`. `acc` holds m n elements, the output's in row-major order,
    /// in any shape (the unflattened [.., n] of a layer's input rows). A `Linear` layer's
    /// forward in one op, with `acc` the residual stream it adds to (a fused epilogue where
    /// the backend has one).
    MatmulBias { acc: bool },
    /// (a [m, k], b [k, n], bias [n] in the output dtype) -> (gelu_tanh(p), p) with
    /// p = a b + bias, dtypes as `Matmul`: p accumulated in f32 (f64 for f64), each output
    /// rounded once from it (the GELU of the unrounded p). A `Linear` layer and the tanh
    /// GELU after it in one op (cuBLASLt's GELU_AUX_BIAS epilogue: p is the auxiliary
    /// output the backward reads). Recorded as `MatmulBias` giving p and `GeluTanh` of p,
    /// so the op itself is never differentiated.
    MatmulBiasGelu,
    /// (g [m, k], b [k, n], x [m, n]) -> gelu_tanh'(x) (g b) in x's dtype, g and b in it
    /// too: `GeluTanhBackward(x, g b)` with the product accumulated in f32 (f64 for f64)
    /// and the derivative applied before the one rounding (cuBLASLt's DGELU epilogue). The
    /// gradient a product hands to the tanh GELU feeding it, passed straight through the
    /// GELU (`ferrite-autodiff`'s engine). Not differentiated.
    MatmulGeluBackward,
    /// (x) -> x converted to the dtype: floats to ints truncate toward zero and saturate; NaN
    /// becomes 0; nonzero becomes true; true becomes 1.
    Cast(DType),
    /// (x [m, n] float) -> (x converted to the float dtype as `Cast`, x summed over its rows:
    /// [n] in x's dtype, accumulated in f32 or wider). A Linear's output gradient made the
    /// products' operand and summed into its bias gradient in one pass. Not differentiated.
    CastColSums(DType),
    /// (x_0, ..., x_{k-1}: float tensors of one dtype) -> each converted to the float dtype
    /// as `Cast`, in one op (one multi-tensor launch where the backend has one): autocast's
    /// copies of a forward pass's parameters (`autocast::prefetch`). Recorded as k `Cast`
    /// nodes, one an output, so the op itself is never differentiated.
    CastEach(DType),
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
    /// (x [..., n], weight [n], bias [n]) -> (x - mean) / sqrt(var + eps) * weight + bias, in
    /// x's dtype or, for f32 x, f16/bf16 (the output spec; computed in f32, rounded once).
    LayerNorm { eps: f64 },
    /// (x [..., n], weight [n]) -> x / sqrt(mean(x²) + eps) * weight.
    RmsNorm { eps: f64 },
    /// (x [..., l, d], cos [l, d/2], sin [l, d/2]) -> x rotated. Pairs are (2i, 2i+1) when
    /// `interleaved`, else (i, i + d/2) (the "split halves" / NeoX layout).
    Rope { interleaved: bool },
    /// (q [b, hq, lq, d], k [b, hkv, lk, d], v [b, hkv, lk, dv][, mask [b, lk] bool])
    /// -> o[b, h, i] = softmax(q k^T scale over the keys query i may see) v, stored
    /// [b, lq, hq, dv] (the output spec: a query's heads side by side, as an output
    /// projection reads them; `Tensor::attention*` return the [b, hq, lq, dv] view), float
    /// q, k, v of one dtype; hq % hkv == 0, query head h reads kv head h / (hq / hkv).
    /// With `causal`, query i sees keys j ≤ max(0, i + lk - lq) (aligned to the last key).
    /// With `key_mask`, a 4th input `mask` (PyTorch's `key_padding_mask`: true = padding)
    /// hides key j from every query and head of batch row b where mask[b, j]: its probability
    /// is 0. The two combine: query i sees the causally visible keys that are not masked.
    /// A query that sees no key (every visible key masked, or lk == 0) gets a NaN row, as
    /// the softmax of an empty set (as softmax over all -inf scores gives); its gradient
    /// (`AttentionBackward`) is zero in dq and it adds nothing to dk and dv.
    /// With two output specs, a second output lse f32 [b, hq, lq]: per query, the natural
    /// log of the sum of exp(score) over the keys it sees (+inf where it sees none), what the
    /// backward needs to rebuild the probabilities without recomputing the forward.
    Attention {
        causal: bool,
        scale: f64,
        key_mask: bool,
    },
    /// Fused log-softmax + NLL over class indices, never materializing probabilities:
    /// (logits [n, c] float, target [n] int, weight [c] logits' dtype) -> [n, 3] in the
    /// logits' accumulator dtype (f32 for f16/bf16 logits, which compute in f32: the loss and
    /// lse keep f32 precision), per row (loss, lse, w[t]) with lse = logsumexp(x) and,
    /// ε = `label_smoothing`,
    /// loss = (1 - ε) w[t] (lse - x[t]) + (ε / c) Σ_j w[j] (lse - x[j]); rows whose target is
    /// `ignore_index` give (0, lse, 0) (column 2 summed is a mean's denominator); any other
    /// target outside [0, c) is an error.
    CrossEntropy {
        ignore_index: i64,
        label_smoothing: f64,
    },
    /// Backward of `CrossEntropy`: (logits, target, weight, out [n, 3] (its output), g [n, 3],
    /// both in the forward's output dtype) -> dlogits [n, c] in the logits' dtype
    /// = g[i, 0] ((1 - ε) w[t] (p - onehot(t)) + (ε / c) (p Σ_j w[j] - w)),
    /// p = exp(x - lse); zero on ignored rows. Only column 0 of g is read (lse and w[t] carry
    /// no gradient).
    CrossEntropyBackward {
        ignore_index: i64,
        label_smoothing: f64,
    },
    /// Backward of softmax over the last axis: (y = softmax(x), g = dL/dy) -> dL/dx
    /// = y (g - sum(g y)); with `log`, y = log_softmax(x) and dL/dx = g - exp(y) sum(g).
    SoftmaxBackward { log: bool },
    /// Backward of `RmsNorm`: (x [..., n], weight [n], g [..., n][, acc [..., n]]) -> (dx
    /// [..., n], dweight [n]). With `acc`, dx is `acc + dx` (dx rounded to x's dtype first,
    /// as a separate add would see it): the gradient x has gathered from its other uses,
    /// summed in the same pass.
    RmsNormBackward { eps: f64, acc: bool },
    /// Backward of `LayerNorm`: (x [..., n], weight [n], g [..., n] in x's dtype or, for f32
    /// x, f16/bf16[, acc [..., n] in x's dtype]) -> (dx [..., n], dweight [n], dbias [n]) in
    /// x's dtype; `acc` as in `RmsNormBackward`.
    LayerNormBackward { eps: f64, acc: bool },
    /// Backward of `Attention`: (q, k, v[, mask], g [b, hq, lq, dv][, o, lse]) -> (dq, dk,
    /// dv) stored token-major as the forward's output: [b, lq, hq, d], [b, lk, hkv, d],
    /// [b, lk, hkv, dv] (`Tensor::attention_backward*` return their [b, h, l, d] views, so
    /// the gradient of heads viewed from [b, l, h * d] rows reaches those rows without a
    /// copy); `mask` as in `Attention` (it carries no gradient). With
    /// `saved`, the forward's two outputs (o [b, hq, lq, dv] viewing its [b, lq, hq, dv]
    /// storage, lse f32 [b, hq, lq] contiguous) follow g, and a backend may rebuild the probabilities from them instead of
    /// recomputing the forward (the result is the same up to rounding). A query that sees no
    /// key has dq = 0 and contributes nothing to dk and dv.
    AttentionBackward {
        causal: bool,
        scale: f64,
        key_mask: bool,
        saved: bool,
        packed: bool,
    },
    /// (x [n, c, h, w], w [o, c/groups, kh, kw]) -> y [n, o, oh, ow] with
    /// y[n, o, i, j] = sum over (c', di, dj) of w[o, c', di, dj] x[n, g c/groups + c',
    /// i stride - pad + di dil, j stride - pad + dj dil] (zero outside), g = o / (o/groups).
    Conv2d(Conv2dParams),
    /// The adjoint of `Conv2d` in its input: (x [n, o, oh, ow], w [o, c/groups, kh, kw]) ->
    /// [n, c, h, w], h and w from the output spec (they fix what integer division lost).
    /// It is `conv_transpose2d` and the input gradient of `Conv2d`.
    ConvTranspose2d(Conv2dParams),
    /// The weight gradient of `Conv2d`: (x [n, c, h, w], g [n, o, oh, ow])
    /// -> dw [o, c/groups, kh, kw] (kernel size from the output spec).
    Conv2dBackwardWeight(Conv2dParams),
    /// (x [n, c, h, w]) -> (values [n, c, oh, ow], indices: u32 [n, c, oh, ow]): the max of each
    /// window (padding never wins) and its first position as `row * w + col` in its plane.
    /// NaN counts as the maximum.
    MaxPool2d(Pool2dParams),
    /// (x [n, c, h, w], indices) like `MaxPool2d` over PyTorch's adaptive windows: output
    /// (i, j) of `[n, c, oh, ow]` (sizes from the output spec) covers rows
    /// floor(i h / oh) .. ceil((i + 1) h / oh) and likewise columns.
    AdaptiveMaxPool2d,
    /// Batch norm with batch statistics: (x [n, c, ...], weight [c], bias [c]) ->
    /// (y, mean [c], var [c]) over every axis but 1; var is biased (divides by n * ...), as
    /// used to normalize. Only y carries a gradient.
    BatchNorm { eps: f64 },
    /// Backward of `BatchNorm`'s y: (x, weight, g) -> (dx, dweight [c], dbias [c]).
    BatchNormBackward { eps: f64 },
    /// Group norm: (x [n, c, ...], weight [c], bias [c]) -> y, normalized over each
    /// (sample, group of c / groups channels), then scaled and shifted per channel.
    GroupNorm { groups: usize, eps: f64 },
    /// Backward of `GroupNorm`: (x, weight, g) -> (dx, dweight [c], dbias [c]).
    GroupNormBackward { groups: usize, eps: f64 },
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
            Op::MatmulBias { .. } => "matmul_bias",
            Op::MatmulBiasGelu => "matmul_bias_gelu",
            Op::MatmulGeluBackward => "matmul_gelu_backward",
            Op::Cast(_) => "cast",
            Op::CastColSums(_) => "cast_col_sums",
            Op::CastEach(_) => "cast_each",
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
            Op::Conv2d(_) => "conv2d",
            Op::ConvTranspose2d(_) => "conv_transpose2d",
            Op::Conv2dBackwardWeight(_) => "conv2d_backward_weight",
            Op::MaxPool2d(_) => "max_pool2d",
            Op::AdaptiveMaxPool2d => "adaptive_max_pool2d",
            Op::BatchNorm { .. } => "batch_norm",
            Op::BatchNormBackward { .. } => "batch_norm_backward",
            Op::GroupNorm { .. } => "group_norm",
            Op::GroupNormBackward { .. } => "group_norm_backward",
            Op::Fill { .. } => "full",
            Op::Arange { .. } => "arange",
            Op::RandUniform { .. } => "rand_uniform",
            Op::RandNormal { .. } => "rand_normal",
        }
    }
}
