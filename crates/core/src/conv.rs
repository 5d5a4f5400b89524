//! Convolution and pooling on `[n, c, (h,) w]` tensors, PyTorch's semantics and argument
//! names. Primitives: `Conv2d`, `ConvTranspose2d` (also conv2d's input gradient),
//! `Conv2dBackwardWeight`, `MaxPool2d`. The 1-d forms run the 2-d ops on a height-1 view;
//! average and adaptive average pooling are compositions over them and `matmul`.

use crate::error::fmt_shapes;
use crate::op::{Conv2dParams, Op, Pool2dParams};
use crate::{DType, Error, Result, Shape, Tensor};

/// Zero padding of a convolution: explicit per axis, or `Same` (stride 1 only; an odd total
/// puts the extra element on the right, as PyTorch does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding<const N: usize> {
    Zeros([usize; N]),
    Same,
}

/// Arguments of `conv1d` (`N = 1`) and `conv2d` (`N = 2`); `Default` is PyTorch's (stride 1,
/// no padding, dilation 1, one group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvArgs<const N: usize> {
    pub stride: [usize; N],
    pub padding: Padding<N>,
    pub dilation: [usize; N],
    pub groups: usize,
}

impl<const N: usize> Default for ConvArgs<N> {
    fn default() -> Self {
        ConvArgs {
            stride: [1; N],
            padding: Padding::Zeros([0; N]),
            dilation: [1; N],
            groups: 1,
        }
    }
}

/// Arguments of `conv_transpose2d`; `Default` is PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTransposeArgs<const N: usize> {
    pub stride: [usize; N],
    pub padding: [usize; N],
    pub output_padding: [usize; N],
    pub dilation: [usize; N],
    pub groups: usize,
}

impl<const N: usize> Default for ConvTransposeArgs<N> {
    fn default() -> Self {
        ConvTransposeArgs {
            stride: [1; N],
            padding: [0; N],
            output_padding: [0; N],
            dilation: [1; N],
            groups: 1,
        }
    }
}

/// Arguments of the pooling ops. `PoolArgs::new(kernel)` is PyTorch's default: stride equal
/// to the kernel, no padding, dilation 1 (max pooling only), floor mode, padding counted in
/// the average.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolArgs<const N: usize> {
    pub kernel: [usize; N],
    pub stride: [usize; N],
    pub padding: [usize; N],
    pub dilation: [usize; N],
    pub ceil_mode: bool,
    pub count_include_pad: bool,
}

impl<const N: usize> PoolArgs<N> {
    pub fn new(kernel: [usize; N]) -> Self {
        PoolArgs {
            kernel,
            stride: kernel,
            padding: [0; N],
            dilation: [1; N],
            ceil_mode: false,
            count_include_pad: true,
        }
    }
}

fn conv1_to_2<T: Copy>(v: [T; 1], one: T) -> [T; 2] {
    [one, v[0]]
}

fn pool1_to_2(a: &PoolArgs<1>) -> PoolArgs<2> {
    PoolArgs {
        kernel: conv1_to_2(a.kernel, 1),
        stride: conv1_to_2(a.stride, 1),
        padding: conv1_to_2(a.padding, 0),
        dilation: conv1_to_2(a.dilation, 1),
        ceil_mode: a.ceil_mode,
        count_include_pad: a.count_include_pad,
    }
}

fn check_float_pair(op: &'static str, x: &Tensor, w: &Tensor) -> Result<()> {
    if !x.dtype().is_float() {
        return Err(Error::dtype(op, x.dtype(), "needs a float dtype"));
    }
    if w.dtype() != x.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            lhs: x.dtype(),
            rhs: w.dtype(),
        });
    }
    Ok(())
}

fn check_geometry(op: &'static str, p: &Conv2dParams) -> Result<()> {
    if p.groups == 0 || p.stride.contains(&0) || p.dilation.contains(&0) {
        return Err(Error::shape(
            op,
            format!(
                "stride {:?}, dilation {:?} and groups {} must be positive",
                p.stride, p.dilation, p.groups
            ),
        ));
    }
    Ok(())
}

/// Output dims of conv2d(x, w) after checking ranks, channels and sizes.
fn conv2d_out(op: &'static str, x: &Tensor, w: &Tensor, p: &Conv2dParams) -> Result<Shape> {
    check_float_pair(op, x, w)?;
    check_geometry(op, p)?;
    if x.rank() != 4 || w.rank() != 4 {
        return Err(Error::shape(
            op,
            format!(
                "expected input [n, c, h, w] and weight [o, c/groups, kh, kw], got {}",
                fmt_shapes(&[x.shape(), w.shape()])
            ),
        ));
    }
    let (xd, wd) = (x.dims(), w.dims());
    let g = p.groups;
    if !wd[0].is_multiple_of(g) {
        return Err(Error::shape(
            op,
            format!(
                "groups {g} does not divide the {} output channels of weight {}",
                wd[0],
                w.shape()
            ),
        ));
    }
    if xd[1] != wd[1] * g {
        return Err(Error::shape(
            op,
            format!(
                "expected {} input channels (weight {} with groups {g}), got {} in input {}",
                wd[1] * g,
                w.shape(),
                xd[1],
                x.shape()
            ),
        ));
    }
    let mut out = [0; 2];
    for a in 0..2 {
        out[a] = p.out_len(a, xd[2 + a], wd[2 + a]).ok_or_else(|| {
            Error::shape(
                op,
                format!(
                    "kernel {:?} with dilation {:?} is larger than input {} padded by {:?}",
                    &wd[2..],
                    p.dilation,
                    x.shape(),
                    p.padding
                ),
            )
        })?;
    }
    Ok(Shape::new([xd[0], wd[0], out[0], out[1]]))
}

impl Tensor {
    /// 2-d convolution of `x [n, c, h, w]` with `weight [o, c/groups, kh, kw]` plus an
    /// optional `bias [o]` -> `[n, o, oh, ow]`.
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        args: &ConvArgs<2>,
    ) -> Result<Tensor> {
        let op = "conv2d";
        let (padding, trim) = match args.padding {
            Padding::Zeros(p) => (p, [false; 2]),
            Padding::Same => {
                if args.stride != [1, 1] {
                    return Err(Error::shape(
                        op,
                        format!("padding 'same' needs stride 1, got {:?}", args.stride),
                    ));
                }
                if weight.rank() != 4 {
                    return Err(Error::shape(
                        op,
                        format!(
                            "expected weight [o, c/groups, kh, kw], got {}",
                            weight.shape()
                        ),
                    ));
                }
                // Total padding d (k - 1); an odd total pads one more on both sides and
                // drops the first output, which equals one more on the right only.
                let mut p = [0; 2];
                let mut trim = [false; 2];
                for a in 0..2 {
                    let total = args.dilation[a] * weight.dims()[2 + a].saturating_sub(1);
                    p[a] = total.div_ceil(2);
                    trim[a] = total % 2 == 1;
                }
                (p, trim)
            }
        };
        let p = Conv2dParams {
            stride: args.stride,
            padding,
            dilation: args.dilation,
            groups: args.groups,
        };
        let out = conv2d_out(op, self, weight, &p)?;
        let mut y = crate::autocast::eligible(&[self, weight], |t, _| {
            t[0].run1(Op::Conv2d(p), t, out, t[0].dtype())
        })?;
        for (a, t) in trim.iter().enumerate() {
            if *t {
                let len = y.dims()[2 + a] - 1;
                y = y.narrow(2 + a as isize, 1, len)?;
            }
        }
        add_channel_bias(op, y, bias)
    }

    /// 1-d convolution of `x [n, c, l]` with `weight [o, c/groups, k]` plus an optional
    /// `bias [o]` -> `[n, o, ol]`.
    pub fn conv1d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        args: &ConvArgs<1>,
    ) -> Result<Tensor> {
        if self.rank() != 3 || weight.rank() != 3 {
            return Err(Error::shape(
                "conv1d",
                format!(
                    "expected input [n, c, l] and weight [o, c/groups, k], got {}",
                    fmt_shapes(&[self.shape(), weight.shape()])
                ),
            ));
        }
        let a2 = ConvArgs {
            stride: conv1_to_2(args.stride, 1),
            padding: match args.padding {
                Padding::Zeros(p) => Padding::Zeros(conv1_to_2(p, 0)),
                Padding::Same => Padding::Same,
            },
            dilation: conv1_to_2(args.dilation, 1),
            groups: args.groups,
        };
        self.unsqueeze(2)?
            .conv2d(&weight.unsqueeze(2)?, bias, &a2)?
            .squeeze(2)
    }

    /// Transposed 2-d convolution (the adjoint of conv2d) of `x [n, cin, h, w]` with
    /// `weight [cin, cout/groups, kh, kw]` plus an optional `bias [cout]` ->
    /// `[n, cout, (h - 1) stride - 2 pad + dil (kh - 1) + output_padding + 1, ...]`.
    pub fn conv_transpose2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        args: &ConvTransposeArgs<2>,
    ) -> Result<Tensor> {
        let op = "conv_transpose2d";
        check_float_pair(op, self, weight)?;
        let p = Conv2dParams {
            stride: args.stride,
            padding: args.padding,
            dilation: args.dilation,
            groups: args.groups,
        };
        check_geometry(op, &p)?;
        if self.rank() != 4 || weight.rank() != 4 {
            return Err(Error::shape(
                op,
                format!(
                    "expected input [n, cin, h, w] and weight [cin, cout/groups, kh, kw], got {}",
                    fmt_shapes(&[self.shape(), weight.shape()])
                ),
            ));
        }
        let (xd, wd) = (self.dims(), weight.dims());
        if xd[1] != wd[0] || !wd[0].is_multiple_of(p.groups) {
            return Err(Error::shape(
                op,
                format!(
                    "expected {} input channels divisible by groups {} (weight {}), got {} in input {}",
                    wd[0], p.groups, weight.shape(), xd[1], self.shape()
                ),
            ));
        }
        let mut hw = [0; 2];
        for a in 0..2 {
            let op_a = args.output_padding[a];
            if op_a >= args.stride[a].max(args.dilation[a]) {
                return Err(Error::shape(
                    op,
                    format!(
                        "output_padding {:?} must be smaller than stride {:?} or dilation {:?}",
                        args.output_padding, args.stride, args.dilation
                    ),
                ));
            }
            let full = (xd[2 + a].max(1) - 1) * args.stride[a]
                + args.dilation[a] * (wd[2 + a].max(1) - 1)
                + op_a
                + 1;
            hw[a] = full
                .checked_sub(2 * args.padding[a])
                .filter(|_| xd[2 + a] > 0 && wd[2 + a] > 0)
                .ok_or_else(|| {
                    Error::shape(
                        op,
                        format!(
                            "padding {:?} leaves no output for input {} and weight {}",
                            args.padding,
                            self.shape(),
                            weight.shape()
                        ),
                    )
                })?;
        }
        let out = Shape::new([xd[0], wd[1] * p.groups, hw[0], hw[1]]);
        let y = crate::autocast::eligible(&[self, weight], |t, _| {
            t[0].run1(Op::ConvTranspose2d(p), t, out, t[0].dtype())
        })?;
        add_channel_bias(op, y, bias)
    }

    /// Input gradient of `conv2d(x, w, p)` for upstream gradient `g`: `x_dims` is x's shape.
    pub fn conv2d_backward_input(
        g: &Tensor,
        w: &Tensor,
        p: &Conv2dParams,
        x_dims: &[usize],
    ) -> Result<Tensor> {
        let op = "conv2d_backward_input";
        check_float_pair(op, g, w)?;
        check_geometry(op, p)?;
        let probe = Shape::new(x_dims.to_vec());
        let ok = x_dims.len() == 4
            && g.rank() == 4
            && w.rank() == 4
            && x_dims[1] == w.dims()[1] * p.groups
            && g.dims()[0] == x_dims[0]
            && g.dims()[1] == w.dims()[0]
            && (0..2)
                .all(|a| p.out_len(a, x_dims[2 + a], w.dims()[2 + a]) == Some(g.dims()[2 + a]));
        if !ok {
            return Err(Error::shape(
                op,
                format!(
                    "gradient, weight and input shapes do not fit {p:?}: {}",
                    fmt_shapes(&[g.shape(), w.shape(), &probe])
                ),
            ));
        }
        g.run1(Op::ConvTranspose2d(*p), &[g, w], probe, g.dtype())
    }

    /// Weight gradient of `conv2d(x, w, p)` for upstream gradient `g`: `w_dims` is w's shape.
    pub fn conv2d_backward_weight(
        x: &Tensor,
        g: &Tensor,
        p: &Conv2dParams,
        w_dims: &[usize],
    ) -> Result<Tensor> {
        let op = "conv2d_backward_weight";
        check_float_pair(op, x, g)?;
        check_geometry(op, p)?;
        let probe = Shape::new(w_dims.to_vec());
        let ok = w_dims.len() == 4
            && x.rank() == 4
            && g.rank() == 4
            && x.dims()[1] == w_dims[1] * p.groups
            && w_dims[0].is_multiple_of(p.groups)
            && g.dims()[0] == x.dims()[0]
            && g.dims()[1] == w_dims[0]
            && (0..2)
                .all(|a| p.out_len(a, x.dims()[2 + a], w_dims[2 + a]) == Some(g.dims()[2 + a]));
        if !ok {
            return Err(Error::shape(
                op,
                format!(
                    "input, gradient and weight shapes do not fit {p:?}: {}",
                    fmt_shapes(&[x.shape(), g.shape(), &probe])
                ),
            ));
        }
        x.run1(Op::Conv2dBackwardWeight(*p), &[x, g], probe, x.dtype())
    }

    fn pool2d_params(
        &self,
        op: &'static str,
        a: &PoolArgs<2>,
    ) -> Result<(Pool2dParams, [usize; 2])> {
        if self.rank() != 4 {
            return Err(Error::shape(
                op,
                format!("expected input [n, c, h, w], got {}", self.shape()),
            ));
        }
        let p = Pool2dParams {
            kernel: a.kernel,
            stride: a.stride,
            padding: a.padding,
            dilation: a.dilation,
            ceil_mode: a.ceil_mode,
        };
        if a.kernel.contains(&0) || a.stride.contains(&0) || a.dilation.contains(&0) {
            return Err(Error::shape(
                op,
                format!(
                    "kernel {:?}, stride {:?} and dilation {:?} must be positive",
                    a.kernel, a.stride, a.dilation
                ),
            ));
        }
        if (0..2).any(|i| 2 * a.padding[i] > a.kernel[i]) {
            return Err(Error::shape(
                op,
                format!(
                    "padding {:?} must be at most half of kernel {:?}",
                    a.padding, a.kernel
                ),
            ));
        }
        let mut out = [0; 2];
        for (i, o) in out.iter_mut().enumerate() {
            *o = p.out_len(i, self.dims()[2 + i]).ok_or_else(|| {
                Error::shape(
                    op,
                    format!(
                        "kernel {:?} with dilation {:?} is larger than input {} padded by {:?}",
                        a.kernel,
                        a.dilation,
                        self.shape(),
                        a.padding
                    ),
                )
            })?;
        }
        Ok((p, out))
    }

    /// Max pooling of `x [n, c, h, w]` -> (values `[n, c, oh, ow]`, indices u32: each
    /// maximum's position `row * w + col` in its plane, as PyTorch's `return_indices`).
    pub fn max_pool2d_with_indices(&self, args: &PoolArgs<2>) -> Result<(Tensor, Tensor)> {
        let op = "max_pool2d";
        if !self.dtype().is_float() {
            return Err(Error::dtype(op, self.dtype(), "needs a float dtype"));
        }
        let (p, o) = self.pool2d_params(op, args)?;
        let d = self.dims();
        let shape = Shape::new([d[0], d[1], o[0], o[1]]);
        let mut outs = self.run(
            Op::MaxPool2d(p),
            &[self],
            vec![(shape.clone(), self.dtype()), (shape, DType::U32)],
        )?;
        match (outs.pop(), outs.pop()) {
            (Some(i), Some(v)) => Ok((v, i)),
            _ => Err(Error::backend(op, "backend returned too few outputs")),
        }
    }

    /// Max pooling of `x [n, c, h, w]` -> `[n, c, oh, ow]`.
    pub fn max_pool2d(&self, args: &PoolArgs<2>) -> Result<Tensor> {
        Ok(self.max_pool2d_with_indices(args)?.0)
    }

    /// Max pooling of `x [n, c, l]` -> (values `[n, c, ol]`, u32 indices into `l`).
    pub fn max_pool1d_with_indices(&self, args: &PoolArgs<1>) -> Result<(Tensor, Tensor)> {
        if self.rank() != 3 {
            return Err(Error::shape(
                "max_pool1d",
                format!("expected input [n, c, l], got {}", self.shape()),
            ));
        }
        let (v, i) = self
            .unsqueeze(2)?
            .max_pool2d_with_indices(&pool1_to_2(args))?;
        Ok((v.squeeze(2)?, i.squeeze(2)?))
    }

    pub fn max_pool1d(&self, args: &PoolArgs<1>) -> Result<Tensor> {
        Ok(self.max_pool1d_with_indices(args)?.0)
    }

    /// Average pooling of `x [n, c, h, w]` -> `[n, c, oh, ow]` (dilation must be 1): window
    /// sums by a depthwise convolution with ones, each divided by PyTorch's divisor (the
    /// window clipped to the padded input, or to the input without `count_include_pad`).
    pub fn avg_pool2d(&self, args: &PoolArgs<2>) -> Result<Tensor> {
        let op = "avg_pool2d";
        if !self.dtype().is_float() {
            return Err(Error::dtype(op, self.dtype(), "needs a float dtype"));
        }
        if args.dilation != [1, 1] {
            return Err(Error::shape(
                op,
                format!("has no dilation, got {:?}", args.dilation),
            ));
        }
        let (_, o) = self.pool2d_params(op, args)?;
        let (n, c) = (self.dims()[0], self.dims()[1]);
        // Zeros on the bottom/right where a ceil-mode window passes the padded input.
        let mut x = self.clone();
        let mut div: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for a in 0..2 {
            let (k, s, p, len) = (
                args.kernel[a],
                args.stride[a],
                args.padding[a],
                self.dims()[2 + a],
            );
            let extra = ((o[a] - 1) * s + k).saturating_sub(len + 2 * p);
            if extra > 0 {
                let mut d = x.dims().to_vec();
                d[2 + a] = extra;
                let z = Tensor::zeros(d, x.dtype(), x.device())?;
                x = Tensor::cat(&[&x, &z], 2 + a as isize)?;
            }
            div[a] = (0..o[a])
                .map(|i| {
                    let start = (i * s) as isize - p as isize;
                    let end = (start + k as isize).min((len + p) as isize);
                    let padded = end - start;
                    let (cs, ce) = (start.max(0), end.min(len as isize));
                    (if args.count_include_pad {
                        padded
                    } else {
                        ce - cs
                    }) as f64
                })
                .collect();
        }
        let ones = Tensor::ones(
            [c, 1, args.kernel[0], args.kernel[1]],
            x.dtype(),
            x.device(),
        )?;
        let sums = x.conv2d(
            &ones,
            None,
            &ConvArgs {
                stride: args.stride,
                padding: Padding::Zeros(args.padding),
                dilation: [1, 1],
                groups: c,
            },
        )?;
        let inv: Vec<f64> = div[0]
            .iter()
            .flat_map(|dh| div[1].iter().map(move |dw| 1.0 / (dh * dw)))
            .collect();
        // Built in x's dtype (one rounding, as a cast from f64 gives): backends without f64
        // run it.
        let inv = Tensor::from_host(
            crate::HostBuffer::from_f64_slice(x.dtype(), &inv),
            [o[0], o[1]],
            x.device(),
        )?;
        debug_assert_eq!(sums.dims(), [n, c, o[0], o[1]]);
        sums.mul(&inv.broadcast_to(sums.shape().clone())?)
    }

    /// Average pooling of `x [n, c, l]` -> `[n, c, ol]`.
    pub fn avg_pool1d(&self, args: &PoolArgs<1>) -> Result<Tensor> {
        if self.rank() != 3 {
            return Err(Error::shape(
                "avg_pool1d",
                format!("expected input [n, c, l], got {}", self.shape()),
            ));
        }
        self.unsqueeze(2)?.avg_pool2d(&pool1_to_2(args))?.squeeze(2)
    }

    /// Adaptive average pooling of `x [n, c, h, w]` -> `[n, c, oh, ow]`: output i averages
    /// input rows floor(i h / oh) .. ceil((i + 1) h / oh) (PyTorch's windows), computed as
    /// `A_h x A_wᵀ` with averaging matrices.
    pub fn adaptive_avg_pool2d(&self, out: [usize; 2]) -> Result<Tensor> {
        let op = "adaptive_avg_pool2d";
        if !self.dtype().is_float() {
            return Err(Error::dtype(op, self.dtype(), "needs a float dtype"));
        }
        if self.rank() != 4 || out.contains(&0) || self.dims()[2] == 0 || self.dims()[3] == 0 {
            return Err(Error::shape(
                op,
                format!(
                    "expected input [n, c, h, w] with h, w > 0 and an output size > 0, got input {} and output {:?}",
                    self.shape(),
                    out
                ),
            ));
        }
        let avg = |o: usize, len: usize| -> Result<Tensor> {
            let mut m = vec![0.0; o * len];
            for i in 0..o {
                let (s, e) = ((i * len) / o, ((i + 1) * len).div_ceil(o));
                for j in s..e {
                    m[i * len + j] = 1.0 / (e - s) as f64;
                }
            }
            // Built in the input's dtype (one rounding, as a cast from f64 would give), so
            // backends without f64 run it.
            Tensor::from_host(
                crate::HostBuffer::from_f64_slice(self.dtype(), &m),
                [o, len],
                self.device(),
            )
        };
        let (h, w) = (self.dims()[2], self.dims()[3]);
        let ah = avg(out[0], h)?;
        let awt = avg(out[1], w)?.t()?;
        ah.matmul_exact(&self.matmul_exact(&awt)?)
    }
}

impl Tensor {
    /// Adaptive max pooling of `x [n, c, h, w]` -> (values `[n, c, oh, ow]`, u32 indices in
    /// the plane), over the windows of `adaptive_avg_pool2d`.
    pub fn adaptive_max_pool2d_with_indices(&self, out: [usize; 2]) -> Result<(Tensor, Tensor)> {
        let op = "adaptive_max_pool2d";
        if !self.dtype().is_float() {
            return Err(Error::dtype(op, self.dtype(), "needs a float dtype"));
        }
        if self.rank() != 4 || out.contains(&0) || self.dims()[2] == 0 || self.dims()[3] == 0 {
            return Err(Error::shape(
                op,
                format!(
                    "expected input [n, c, h, w] with h, w > 0 and an output size > 0, got input {} and output {:?}",
                    self.shape(),
                    out
                ),
            ));
        }
        let d = self.dims();
        let shape = Shape::new([d[0], d[1], out[0], out[1]]);
        let mut o = self.run(
            Op::AdaptiveMaxPool2d,
            &[self],
            vec![(shape.clone(), self.dtype()), (shape, DType::U32)],
        )?;
        match (o.pop(), o.pop()) {
            (Some(i), Some(v)) => Ok((v, i)),
            _ => Err(Error::backend(op, "backend returned too few outputs")),
        }
    }

    pub fn adaptive_max_pool2d(&self, out: [usize; 2]) -> Result<Tensor> {
        Ok(self.adaptive_max_pool2d_with_indices(out)?.0)
    }
}

/// `y [n, o, ...] + bias [o]` broadcast over the other dims.
fn add_channel_bias(op: &'static str, y: Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let Some(b) = bias else { return Ok(y) };
    let o = y.dims()[1];
    if b.dims() != [o] || b.dtype() != y.dtype() {
        return Err(Error::shape(
            op,
            format!(
                "bias must be [{o}] {}, got {} {}",
                y.dtype(),
                b.shape(),
                b.dtype()
            ),
        ));
    }
    let mut d = vec![1; y.rank()];
    d[1] = o;
    y.add(&b.reshape(d)?.broadcast_to(y.shape().clone())?)
}

/// The primitives with geometry already resolved (for backward rules).
impl Tensor {
    /// `Conv2d` with params `p` as they are (no 'same' padding, no bias).
    pub fn conv2d_raw(&self, w: &Tensor, p: &Conv2dParams) -> Result<Tensor> {
        let out = conv2d_out("conv2d", self, w, p)?;
        self.run1(Op::Conv2d(*p), &[self, w], out, self.dtype())
    }

    /// `MaxPool2d` with params `p` as they are -> (values, indices).
    pub fn max_pool2d_raw(&self, p: &Pool2dParams) -> Result<(Tensor, Tensor)> {
        self.max_pool2d_with_indices(&PoolArgs {
            kernel: p.kernel,
            stride: p.stride,
            padding: p.padding,
            dilation: p.dilation,
            ceil_mode: p.ceil_mode,
            count_include_pad: true,
        })
    }
}

/// Sizes of one 2-d convolution as backends lay it out: x [n, c, h, w], w [o, c/g, kh, kw],
/// y [n, o, oh, ow], with the op's parameters. Shapes come validated from `Tensor::conv2d`.
#[derive(Clone, Copy, Debug)]
pub struct ConvGeometry {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    pub p: crate::Conv2dParams,
}

impl ConvGeometry {
    pub fn new(x: &[usize], w: &[usize], y: &[usize], p: crate::Conv2dParams) -> ConvGeometry {
        ConvGeometry {
            n: x[0],
            c: x[1],
            h: x[2],
            w: x[3],
            o: w[0],
            kh: w[2],
            kw: w[3],
            oh: y[2],
            ow: y[3],
            p,
        }
    }
    pub fn groups(&self) -> usize {
        self.p.groups
    }
    /// Input channels per group.
    pub fn cg(&self) -> usize {
        self.c / self.p.groups
    }
    /// Output channels per group.
    pub fn og(&self) -> usize {
        self.o / self.p.groups
    }
    /// Rows of the column (im2col) matrix.
    pub fn k(&self) -> usize {
        self.cg() * self.kh * self.kw
    }
    /// Output pixels per plane (columns of the column matrix).
    pub fn pix(&self) -> usize {
        self.oh * self.ow
    }
    /// Whether x[n, g] is its own column matrix (1x1, stride 1, no padding).
    pub fn direct(&self) -> bool {
        self.kh == 1
            && self.kw == 1
            && self.p.stride == [1, 1]
            && self.p.padding == [0, 0]
            && self.oh == self.h
            && self.ow == self.w
    }
}
