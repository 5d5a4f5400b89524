//! Activations, each as a function (PyTorch's `torch.nn.functional`) and a module with
//! PyTorch's name and defaults. Functions without a primitive op are compositions whose
//! gradients come from autodiff; branches that are masked out by `where` are clamped so that
//! their (discarded) gradients stay finite.

use crate::Module;
use ferrite_core::{Error, Result, Tensor};

pub fn relu(x: &Tensor) -> Result<Tensor> {
    x.relu()
}

/// x if x > 0 else slope * x.
pub fn leaky_relu(x: &Tensor, negative_slope: f64) -> Result<Tensor> {
    Tensor::where_cond(
        &x.gt(&x.scalar_like(0.0)?)?,
        x,
        &x.mul_scalar(negative_slope)?,
    )
}

/// x if x > 0 else alpha (exp(x) - 1).
pub fn elu(x: &Tensor, alpha: f64) -> Result<Tensor> {
    let neg = x
        .minimum_scalar(0.0)?
        .exp()?
        .sub_scalar(1.0)?
        .mul_scalar(alpha)?;
    Tensor::where_cond(&x.gt(&x.scalar_like(0.0)?)?, x, &neg)
}

/// Exact (erf) GELU, or the tanh approximation (`approximate="tanh"`).
pub fn gelu(x: &Tensor, tanh_approximation: bool) -> Result<Tensor> {
    match tanh_approximation {
        true => x.gelu_tanh(),
        false => x.gelu(),
    }
}

pub fn silu(x: &Tensor) -> Result<Tensor> {
    x.silu()
}

/// log(1 + exp(beta x)) / beta, and x itself where beta x > threshold.
pub fn softplus(x: &Tensor, beta: f64, threshold: f64) -> Result<Tensor> {
    let bx = x.mul_scalar(beta)?;
    let soft = bx
        .minimum_scalar(threshold)?
        .exp()?
        .add_scalar(1.0)?
        .log()?
        .div_scalar(beta)?;
    Tensor::where_cond(&bx.gt(&bx.scalar_like(threshold)?)?, x, &soft)
}

/// x tanh(softplus(x)).
pub fn mish(x: &Tensor) -> Result<Tensor> {
    x.mul(&softplus(x, 1.0, 20.0)?.tanh()?)
}

/// x / (1 + |x|).
pub fn softsign(x: &Tensor) -> Result<Tensor> {
    x.div(&x.abs()?.add_scalar(1.0)?)
}

/// clamp(x / 6 + 1/2, 0, 1).
pub fn hardsigmoid(x: &Tensor) -> Result<Tensor> {
    x.div_scalar(6.0)?
        .add_scalar(0.5)?
        .maximum_scalar(0.0)?
        .minimum_scalar(1.0)
}

/// x hardsigmoid(x).
pub fn hardswish(x: &Tensor) -> Result<Tensor> {
    x.mul(&hardsigmoid(x)?)
}

pub fn tanh(x: &Tensor) -> Result<Tensor> {
    x.tanh()
}

pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    x.sigmoid()
}

pub fn softmax(x: &Tensor, dim: isize) -> Result<Tensor> {
    x.softmax(dim)
}

pub fn log_softmax(x: &Tensor, dim: isize) -> Result<Tensor> {
    x.log_softmax(dim)
}

macro_rules! stateless {
    ($(#[$doc:meta])* $name:ident, |$s:ident, $x:ident| $body:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default)]
        pub struct $name;
        impl Module for $name {
            fn type_name(&self) -> &'static str {
                stringify!($name)
            }
            fn forward(&self, $x: &Tensor) -> Result<Tensor> {
                let $s = self;
                let _ = $s;
                $body
            }
        }
    };
}

stateless!(ReLU, |_s, x| relu(x));
stateless!(SiLU, |_s, x| silu(x));
stateless!(
    /// SiLU under its other name (PyTorch has no `Swish`; `SiLU` is its module).
    Swish,
    |_s, x| silu(x)
);
stateless!(Mish, |_s, x| mish(x));
stateless!(Softsign, |_s, x| softsign(x));
stateless!(Hardsigmoid, |_s, x| hardsigmoid(x));
stateless!(Hardswish, |_s, x| hardswish(x));
stateless!(Tanh, |_s, x| tanh(x));
stateless!(Sigmoid, |_s, x| sigmoid(x));
stateless!(
    /// Passes its input through (PyTorch's `nn.Identity`).
    Identity,
    |_s, x| Ok(x.clone())
);

/// `LeakyReLU(negative_slope=0.01)`.
#[derive(Clone, Copy, Debug)]
pub struct LeakyReLU {
    pub negative_slope: f64,
}

impl Default for LeakyReLU {
    fn default() -> LeakyReLU {
        LeakyReLU {
            negative_slope: 0.01,
        }
    }
}

impl Module for LeakyReLU {
    fn type_name(&self) -> &'static str {
        "LeakyReLU"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        leaky_relu(x, self.negative_slope)
    }
}

/// `ELU(alpha=1.0)`.
#[derive(Clone, Copy, Debug)]
pub struct ELU {
    pub alpha: f64,
}

impl Default for ELU {
    fn default() -> ELU {
        ELU { alpha: 1.0 }
    }
}

impl Module for ELU {
    fn type_name(&self) -> &'static str {
        "ELU"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        elu(x, self.alpha)
    }
}

/// `GELU(approximate="none")`; `GELU { tanh: true }` is `approximate="tanh"`.
#[derive(Clone, Copy, Debug, Default)]
pub struct GELU {
    pub tanh: bool,
}

impl Module for GELU {
    fn type_name(&self) -> &'static str {
        "GELU"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        gelu(x, self.tanh)
    }
}

/// `Softplus(beta=1.0, threshold=20.0)`.
#[derive(Clone, Copy, Debug)]
pub struct Softplus {
    beta: f64,
    threshold: f64,
}

impl Default for Softplus {
    fn default() -> Softplus {
        Softplus {
            beta: 1.0,
            threshold: 20.0,
        }
    }
}

impl Softplus {
    /// beta must be positive and finite.
    pub fn new(beta: f64, threshold: f64) -> Result<Softplus> {
        if !(beta.is_finite() && beta > 0.0) || threshold.is_nan() {
            return Err(Error::module(
                "Softplus",
                format!("beta must be positive and finite and threshold a number, got beta {beta}, threshold {threshold}"),
            ));
        }
        Ok(Softplus { beta, threshold })
    }
}

impl Module for Softplus {
    fn type_name(&self) -> &'static str {
        "Softplus"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        softplus(x, self.beta, self.threshold)
    }
}

/// `Softmax(dim)`.
#[derive(Clone, Copy, Debug)]
pub struct Softmax {
    pub dim: isize,
}

impl Module for Softmax {
    fn type_name(&self) -> &'static str {
        "Softmax"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        softmax(x, self.dim).map_err(|e| Error::module("Softmax", e.to_string()))
    }
}

/// `LogSoftmax(dim)`.
#[derive(Clone, Copy, Debug)]
pub struct LogSoftmax {
    pub dim: isize,
}

impl Module for LogSoftmax {
    fn type_name(&self) -> &'static str {
        "LogSoftmax"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        log_softmax(x, self.dim).map_err(|e| Error::module("LogSoftmax", e.to_string()))
    }
}
