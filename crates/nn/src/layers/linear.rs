//! `Linear` (y = x Wᵀ + b, weight `[out, in]`) and `Bilinear` (y_k = x1ᵀ W_k x2 + b_k,
//! weight `[out, in1, in2]`), with PyTorch's default initialization: U(-1/√fan_in, 1/√fan_in)
//! for weight and bias (kaiming_uniform with a = √5).

use crate::{init, Members, MembersMut, Module, Parameter};
use ferrite_core::{DType, Device, Error, Result, Tensor};

pub struct Linear {
    pub weight: Parameter,
    pub bias: Option<Parameter>,
}

impl Linear {
    pub fn new(
        in_features: usize,
        out_features: usize,
        bias: bool,
        dtype: DType,
        dev: &Device,
    ) -> Result<Linear> {
        if in_features == 0 || out_features == 0 {
            return Err(Error::module(
                "Linear",
                format!("in_features ({in_features}) and out_features ({out_features}) must be positive"),
            ));
        }
        let bound = 1.0 / (in_features as f64).sqrt();
        let weight = init::uniform([out_features, in_features], -bound, bound, dtype, dev)?;
        let bias = match bias {
            true => Some(Parameter::new(&init::uniform(
                [out_features],
                -bound,
                bound,
                dtype,
                dev,
            )?)?),
            false => None,
        };
        Ok(Linear {
            weight: Parameter::new(&weight)?,
            bias,
        })
    }

    /// A layer over given values: weight `[out, in]`, bias `[out]`.
    pub fn from_tensors(weight: &Tensor, bias: Option<&Tensor>) -> Result<Linear> {
        if weight.rank() != 2 {
            return Err(Error::module(
                "Linear",
                format!("weight must be [out, in], got {}", weight.shape()),
            ));
        }
        if let Some(b) = bias {
            if b.dims() != [weight.dims()[0]] {
                return Err(Error::module(
                    "Linear",
                    format!(
                        "bias {} does not match weight {}",
                        b.shape(),
                        weight.shape()
                    ),
                ));
            }
        }
        Ok(Linear {
            weight: Parameter::new(weight)?,
            bias: bias.map(Parameter::new).transpose()?,
        })
    }

    pub fn in_features(&self) -> usize {
        self.weight.dims()[1]
    }
    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }

    fn check_input(&self, x: &Tensor) -> Result<()> {
        if x.rank() == 0 || x.dims()[x.rank() - 1] != self.in_features() {
            return Err(Error::module(
                "Linear",
                format!(
                    "expected {} input features, got input {}",
                    self.in_features(),
                    x.shape()
                ),
            ));
        }
        Ok(())
    }

    /// `forward`, with the output left in the autocast dtype where autocast applies (what
    /// PyTorch's autocast `F.linear` returns) instead of written in f32: for a layer whose
    /// output goes to an op that computes in f32 itself, as a language model's head feeding
    /// `cross_entropy` (16-bit logits, f32 loss), so that no f32 copy of the output is
    /// written. Outside autocast it is `forward`.
    pub fn forward_low(&self, x: &Tensor) -> Result<Tensor> {
        self.check_input(x)?;
        let b = self.bias.as_ref().map(|b| b.tensor());
        let w = self.weight.tensor();
        match linear_low(x, &w, b.as_ref(), false)? {
            Some(y) => Ok(y),
            None => linear(x, &w, b.as_ref()),
        }
    }

    /// `gelu_tanh(forward(x))`, one op where the layer has a bias
    /// (`Tensor::matmul_bias_gelu`: the GELU in the product's epilogue).
    pub fn forward_gelu_tanh(&self, x: &Tensor) -> Result<Tensor> {
        self.check_input(x)?;
        let w = self.weight.tensor().t()?;
        match self.bias.as_ref().map(|b| b.tensor()) {
            Some(b) => x.matmul_bias_gelu(&w, &b),
            None => x.matmul(&w)?.gelu_tanh(),
        }
    }

    /// `residual + forward(x)`: a residual connection whose branch ends in this layer, the
    /// sum in the product's epilogue (one op, `Tensor::matmul_bias_add`) where the layer has
    /// a bias and `residual` the output's shape and dtype, else the layer and an add.
    pub fn forward_add(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        self.check_input(x)?;
        let b = self.bias.as_ref().map(|b| b.tensor());
        x.matmul_bias_add(&self.weight.tensor().t()?, b.as_ref(), residual)
    }
}

/// `x Wᵀ + b` over the last axis of `x` (PyTorch's `F.linear`), one `matmul_bias` op (the
/// bias in the product's epilogue). Under autocast the product of the low-dtype operands is
/// written in f32 with the f32 bias added before its one rounding.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    x.matmul_bias(&weight.t()?, bias)
}

/// `x Wᵀ + b` computed and returned in the autocast dtype (the bias cast to it, added to the
/// f32 accumulator before the rounding, as cuBLASLt's bias epilogue in PyTorch's autocast
/// `addmm`) when autocast applies to `x` and `weight`; `None` otherwise. For
/// layers whose next op is another product or an activation (no cast back to f32 between).
/// With `gelu_tanh`, the tanh GELU of that (`Tensor::matmul_bias_gelu`: one op).
pub(crate) fn linear_low(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    gelu_tanh: bool,
) -> Result<Option<Tensor>> {
    use ferrite_core::autocast::to_low;
    let (Some(xl), Some(wl)) = (to_low(x)?, to_low(weight)?) else {
        return Ok(None);
    };
    let bl = match bias.map(to_low).transpose()? {
        Some(None) => return Ok(None),
        Some(Some(bl)) => Some(bl),
        None => None,
    };
    let y = match (gelu_tanh, bl.as_ref()) {
        (true, Some(bl)) => xl.matmul_bias_gelu(&wl.t()?, bl)?,
        (true, None) => xl.matmul(&wl.t()?)?.gelu_tanh()?,
        (false, bl) => xl.matmul_bias(&wl.t()?, bl)?,
    };
    Ok(Some(y))
}

impl Module for Linear {
    fn type_name(&self) -> &'static str {
        "Linear"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.check_input(x)?;
        let b = self.bias.as_ref().map(|b| b.tensor());
        linear(x, &self.weight.tensor(), b.as_ref())
    }

    fn members(&self) -> Members<'_> {
        let mut params = vec![("weight".to_string(), &self.weight)];
        if let Some(b) = &self.bias {
            params.push(("bias".to_string(), b));
        }
        Members {
            params,
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        let mut params = vec![("weight".to_string(), &mut self.weight)];
        if let Some(b) = &mut self.bias {
            params.push(("bias".to_string(), b));
        }
        MembersMut {
            params,
            ..MembersMut::default()
        }
    }
}

/// `Bilinear(in1_features, in2_features, out_features, bias=True)`: weight
/// `[out, in1, in2]`, bias `[out]`, both U(-1/√in1, 1/√in1). Takes two inputs: use
/// `forward2`.
pub struct Bilinear {
    pub weight: Parameter,
    pub bias: Option<Parameter>,
}

impl Bilinear {
    pub fn new(
        in1: usize,
        in2: usize,
        out: usize,
        bias: bool,
        dtype: DType,
        dev: &Device,
    ) -> Result<Bilinear> {
        if in1 == 0 || in2 == 0 || out == 0 {
            return Err(Error::module(
                "Bilinear",
                format!("feature counts must be positive, got in1 {in1}, in2 {in2}, out {out}"),
            ));
        }
        let bound = 1.0 / (in1 as f64).sqrt();
        Ok(Bilinear {
            weight: Parameter::new(&init::uniform([out, in1, in2], -bound, bound, dtype, dev)?)?,
            bias: match bias {
                true => Some(Parameter::new(&init::uniform(
                    [out],
                    -bound,
                    bound,
                    dtype,
                    dev,
                )?)?),
                false => None,
            },
        })
    }

    /// x1 `[..., in1]`, x2 `[..., in2]` with equal leading dims -> `[..., out]`.
    pub fn forward2(&self, x1: &Tensor, x2: &Tensor) -> Result<Tensor> {
        let (out, in1, in2) = match self.weight.dims() {
            [o, a, b] => (*o, *a, *b),
            d => {
                return Err(Error::module(
                    "Bilinear",
                    format!("weight must be [out, in1, in2], got {d:?}"),
                ))
            }
        };
        let r1 = x1.rank();
        let r2 = x2.rank();
        if r1 == 0
            || r2 == 0
            || x1.dims()[r1 - 1] != in1
            || x2.dims()[r2 - 1] != in2
            || x1.dims()[..r1 - 1] != x2.dims()[..r2 - 1]
        {
            return Err(Error::module(
                "Bilinear",
                format!(
                    "expected inputs [..., {in1}] and [..., {in2}] with equal leading dims, got {} and {}",
                    x1.shape(),
                    x2.shape()
                ),
            ));
        }
        let lead = x1.dims()[..r1 - 1].to_vec();
        let n: usize = lead.iter().product();
        let a = x1.reshape([n, in1])?;
        let b = x2.reshape([n, in2])?;
        // [in1, out * in2]: column (o, j) holds W[o, :, j].
        let w = self
            .weight
            .tensor()
            .permute(&[1, 0, 2])?
            .reshape([in1, out * in2])?;
        let y = a
            .matmul(&w)?
            .reshape([n, out, in2])?
            .mul(&b.unsqueeze(1)?)?
            .sum(&[-1], false)?;
        let y = match &self.bias {
            Some(bias) => y.add(&bias.tensor())?,
            None => y,
        };
        let mut dims = lead;
        dims.push(out);
        y.reshape(dims)
    }
}

impl Module for Bilinear {
    fn type_name(&self) -> &'static str {
        "Bilinear"
    }

    /// Bilinear takes two inputs: an error pointing to `forward2`.
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Err(Error::module(
            "Bilinear",
            "takes two inputs: call forward2(x1, x2)",
        ))
    }

    fn members(&self) -> Members<'_> {
        let mut params = vec![("weight".to_string(), &self.weight)];
        if let Some(b) = &self.bias {
            params.push(("bias".to_string(), b));
        }
        Members {
            params,
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        let mut params = vec![("weight".to_string(), &mut self.weight)];
        if let Some(b) = &mut self.bias {
            params.push(("bias".to_string(), b));
        }
        MembersMut {
            params,
            ..MembersMut::default()
        }
    }
}
