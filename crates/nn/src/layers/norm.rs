//! `LayerNorm` and `RMSNorm` over the trailing `normalized_shape` dims, through the fused
//! `layer_norm` / `rms_norm` ops (their backward kernels included).

use crate::{Members, MembersMut, Module, Parameter};
use ferrite_core::{DType, Device, Error, Result, Tensor};

fn check_shape(module: &'static str, shape: &[usize]) -> Result<usize> {
    let n: usize = shape.iter().product();
    if shape.is_empty() || n == 0 {
        return Err(Error::module(
            module,
            format!("normalized_shape must be non-empty with positive dims, got {shape:?}"),
        ));
    }
    Ok(n)
}

/// `x` with its trailing dims (which must equal `shape`) flattened into one.
fn flatten_trailing(module: &'static str, x: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let r = x.rank();
    if r < shape.len() || x.dims()[r - shape.len()..] != *shape {
        return Err(Error::module(
            module,
            format!(
                "expected input with trailing dims {shape:?}, got input {}",
                x.shape()
            ),
        ));
    }
    let mut dims = x.dims()[..r - shape.len()].to_vec();
    dims.push(shape.iter().product());
    x.reshape(dims)
}

/// `LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True, bias=True)`: weight ones,
/// bias zeros.
pub struct LayerNorm {
    pub weight: Option<Parameter>,
    pub bias: Option<Parameter>,
    shape: Vec<usize>,
    eps: f64,
}

impl LayerNorm {
    pub fn new(
        normalized_shape: &[usize],
        eps: f64,
        elementwise_affine: bool,
        bias: bool,
        dtype: DType,
        dev: &Device,
    ) -> Result<LayerNorm> {
        check_shape("LayerNorm", normalized_shape)?;
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(Error::module("LayerNorm", format!("invalid eps {eps}")));
        }
        let (weight, bias) = match elementwise_affine {
            true => (
                Some(Parameter::new(&Tensor::ones(
                    normalized_shape,
                    dtype,
                    dev,
                )?)?),
                match bias {
                    true => Some(Parameter::new(&Tensor::zeros(
                        normalized_shape,
                        dtype,
                        dev,
                    )?)?),
                    false => None,
                },
            ),
            false => (None, None),
        };
        Ok(LayerNorm {
            weight,
            bias,
            shape: normalized_shape.to_vec(),
            eps,
        })
    }
}

impl LayerNorm {
    /// `forward` with the output in the autocast dtype where autocast is on and `x` is f32
    /// (computed in f32, rounded once): for a norm whose output feeds a product that would
    /// cast it (a pre-norm transformer layer's attention and feed-forward), so no f32 copy is
    /// written and the gradient comes back in the low dtype. Else `forward`.
    pub fn forward_low(&self, x: &Tensor) -> Result<Tensor> {
        match ferrite_core::autocast::autocast_dtype() {
            Some(low) if x.dtype() == DType::F32 => self.forward_to(x, low),
            _ => self.forward(x),
        }
    }

    fn forward_to(&self, x: &Tensor, dtype: DType) -> Result<Tensor> {
        let flat = flatten_trailing("LayerNorm", x, &self.shape)?;
        let n: usize = self.shape.iter().product();
        let w = match &self.weight {
            Some(w) => w.tensor().reshape([n])?,
            None => Tensor::ones([n], x.dtype(), x.device())?,
        };
        let b = match &self.bias {
            Some(b) => b.tensor().reshape([n])?,
            None => Tensor::zeros([n], x.dtype(), x.device())?,
        };
        flat.layer_norm_to(&w, &b, self.eps, dtype)?
            .reshape(x.shape().clone())
    }
}

impl Module for LayerNorm {
    fn type_name(&self) -> &'static str {
        "LayerNorm"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_to(x, x.dtype())
    }

    fn members(&self) -> Members<'_> {
        let mut params = Vec::new();
        if let Some(w) = &self.weight {
            params.push(("weight".to_string(), w));
        }
        if let Some(b) = &self.bias {
            params.push(("bias".to_string(), b));
        }
        Members {
            params,
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        let mut params = Vec::new();
        if let Some(w) = &mut self.weight {
            params.push(("weight".to_string(), w));
        }
        if let Some(b) = &mut self.bias {
            params.push(("bias".to_string(), b));
        }
        MembersMut {
            params,
            ..MembersMut::default()
        }
    }
}

/// `RMSNorm(normalized_shape, eps=None, elementwise_affine=True)`: weight ones; `eps: None`
/// is the input dtype's machine epsilon, as in PyTorch.
pub struct RMSNorm {
    pub weight: Option<Parameter>,
    shape: Vec<usize>,
    eps: Option<f64>,
}

impl RMSNorm {
    pub fn new(
        normalized_shape: &[usize],
        eps: Option<f64>,
        elementwise_affine: bool,
        dtype: DType,
        dev: &Device,
    ) -> Result<RMSNorm> {
        check_shape("RMSNorm", normalized_shape)?;
        if let Some(e) = eps {
            if !(e.is_finite() && e >= 0.0) {
                return Err(Error::module("RMSNorm", format!("invalid eps {e}")));
            }
        }
        Ok(RMSNorm {
            weight: match elementwise_affine {
                true => Some(Parameter::new(&Tensor::ones(
                    normalized_shape,
                    dtype,
                    dev,
                )?)?),
                false => None,
            },
            shape: normalized_shape.to_vec(),
            eps,
        })
    }
}

/// Machine epsilon of a float dtype (`torch.finfo(dtype).eps`).
pub fn finfo_eps(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::EPSILON,
        DType::F16 => 0.0009765625,
        DType::BF16 => 0.0078125,
        _ => f32::EPSILON as f64,
    }
}

impl Module for RMSNorm {
    fn type_name(&self) -> &'static str {
        "RMSNorm"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let flat = flatten_trailing("RMSNorm", x, &self.shape)?;
        let n: usize = self.shape.iter().product();
        let w = match &self.weight {
            Some(w) => w.tensor().reshape([n])?,
            None => Tensor::ones([n], x.dtype(), x.device())?,
        };
        let eps = self.eps.unwrap_or_else(|| finfo_eps(x.dtype()));
        flat.rms_norm(&w, eps)?.reshape(x.shape().clone())
    }

    fn members(&self) -> Members<'_> {
        Members {
            params: self
                .weight
                .iter()
                .map(|w| ("weight".to_string(), w))
                .collect(),
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        MembersMut {
            params: self
                .weight
                .iter_mut()
                .map(|w| ("weight".to_string(), w))
                .collect(),
            ..MembersMut::default()
        }
    }
}
