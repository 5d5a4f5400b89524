//! `Flatten(start_dim=1, end_dim=-1)` and `Unflatten(dim, sizes)`.

use crate::Module;
use ferrite_core::{Error, Result, Tensor};

fn axis(module: &'static str, d: isize, rank: usize, x: &Tensor) -> Result<usize> {
    let a = if d < 0 { d + rank as isize } else { d };
    if a < 0 || a >= rank.max(1) as isize {
        return Err(Error::module(
            module,
            format!("dim {d} out of range for input {}", x.shape()),
        ));
    }
    Ok(a as usize)
}

#[derive(Clone, Copy, Debug)]
pub struct Flatten {
    pub start_dim: isize,
    pub end_dim: isize,
}

impl Default for Flatten {
    fn default() -> Flatten {
        Flatten {
            start_dim: 1,
            end_dim: -1,
        }
    }
}

impl Module for Flatten {
    fn type_name(&self) -> &'static str {
        "Flatten"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() == 0 {
            return x.reshape([1]);
        }
        let s = axis("Flatten", self.start_dim, x.rank(), x)?;
        let e = axis("Flatten", self.end_dim, x.rank(), x)?;
        if s > e {
            return Err(Error::module(
                "Flatten",
                format!(
                    "start_dim {} is after end_dim {} for input {}",
                    self.start_dim,
                    self.end_dim,
                    x.shape()
                ),
            ));
        }
        let d = x.dims();
        let mut dims = d[..s].to_vec();
        dims.push(d[s..=e].iter().product());
        dims.extend_from_slice(&d[e + 1..]);
        x.reshape(dims)
    }
}

#[derive(Clone, Debug)]
pub struct Unflatten {
    dim: isize,
    sizes: Vec<usize>,
}

impl Unflatten {
    pub fn new(dim: isize, sizes: &[usize]) -> Result<Unflatten> {
        if sizes.is_empty() {
            return Err(Error::module("Unflatten", "sizes must be non-empty"));
        }
        Ok(Unflatten {
            dim,
            sizes: sizes.to_vec(),
        })
    }
}

impl Module for Unflatten {
    fn type_name(&self) -> &'static str {
        "Unflatten"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let a = axis("Unflatten", self.dim, x.rank(), x)?;
        let n: usize = self.sizes.iter().product();
        if x.rank() == 0 || x.dims()[a] != n {
            return Err(Error::module(
                "Unflatten",
                format!(
                    "sizes {:?} (product {n}) do not match dim {} of input {}",
                    self.sizes,
                    self.dim,
                    x.shape()
                ),
            ));
        }
        let d = x.dims();
        let mut dims = d[..a].to_vec();
        dims.extend_from_slice(&self.sizes);
        dims.extend_from_slice(&d[a + 1..]);
        x.reshape(dims)
    }
}
