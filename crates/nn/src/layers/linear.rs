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
}

/// `x Wᵀ + b` over the last axis of `x` (PyTorch's `F.linear`).
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let y = x.matmul(&weight.t()?)?;
    match bias {
        Some(b) => y.add(b),
        None => Ok(y),
    }
}

impl Module for Linear {
    fn type_name(&self) -> &'static str {
        "Linear"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
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
