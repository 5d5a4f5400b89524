//! `Embedding(num_embeddings, embedding_dim, padding_idx=None)`: weight `[num, dim]` drawn
//! from N(0, 1), the padding row zeroed; the padding row gets no gradient.

use crate::{init, Members, MembersMut, Module, Parameter};
use ferrite_core::{DType, Device, Error, Result, Tensor};

pub struct Embedding {
    pub weight: Parameter,
    padding_idx: Option<usize>,
}

impl Embedding {
    /// `padding_idx` may be negative (counted from the end), as in PyTorch.
    pub fn new(
        num_embeddings: usize,
        embedding_dim: usize,
        padding_idx: Option<isize>,
        dtype: DType,
        dev: &Device,
    ) -> Result<Embedding> {
        let w = init::normal([num_embeddings, embedding_dim], 0.0, 1.0, dtype, dev)?;
        let e = Embedding::from_tensor(&w, padding_idx)?;
        if let Some(p) = e.padding_idx {
            zero_row(&e.weight, p)?;
        }
        Ok(e)
    }

    /// An embedding over a given table `[num, dim]` (the padding row is left as given, as
    /// PyTorch's `from_pretrained` does).
    pub fn from_tensor(weight: &Tensor, padding_idx: Option<isize>) -> Result<Embedding> {
        if weight.rank() != 2 || weight.elem_count() == 0 {
            return Err(Error::module(
                "Embedding",
                format!(
                    "weight must be a non-empty [num, dim], got {}",
                    weight.shape()
                ),
            ));
        }
        let num = weight.dims()[0];
        let padding_idx = match padding_idx {
            None => None,
            Some(p) => {
                let q = if p < 0 { p + num as isize } else { p };
                if q < 0 || q >= num as isize {
                    return Err(Error::module(
                        "Embedding",
                        format!("padding_idx {p} out of range for {num} embeddings"),
                    ));
                }
                Some(q as usize)
            }
        };
        Ok(Embedding {
            weight: Parameter::new(weight)?,
            padding_idx,
        })
    }

    pub fn padding_idx(&self) -> Option<usize> {
        self.padding_idx
    }
}

fn zero_row(w: &Parameter, row: usize) -> Result<()> {
    let t = w.tensor().detach();
    let mask = Tensor::arange(0.0, t.dims()[0] as f64, 1.0, DType::I64, t.device())?
        .ne(&Tensor::full(row as f64, (), DType::I64, t.device())?)?
        .cast(t.dtype())?
        .unsqueeze(1)?;
    w.copy_(&t.mul(&mask)?)
}

impl Module for Embedding {
    fn type_name(&self) -> &'static str {
        "Embedding"
    }

    /// ids: integer tensor of any shape -> ids' shape + [dim].
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        if !ids.dtype().is_int() {
            return Err(Error::module(
                "Embedding",
                format!(
                    "expected integer ids, got {} input {}",
                    ids.dtype(),
                    ids.shape()
                ),
            ));
        }
        let w = self.weight.tensor();
        let out =
            Tensor::embedding(&w, ids).map_err(|e| Error::module("Embedding", e.to_string()))?;
        match self.padding_idx {
            Some(p) if w.requires_grad() => {
                // Positions holding the padding id read a detached table: no gradient reaches
                // that row, while its value is still what the table holds.
                let frozen = Tensor::embedding(&w.detach(), ids)?;
                let pad = ids
                    .eq(&Tensor::full(p as f64, (), ids.dtype(), ids.device())?)?
                    .unsqueeze(-1)?;
                Tensor::where_cond(&pad, &frozen, &out)
            }
            _ => Ok(out),
        }
    }

    fn members(&self) -> Members<'_> {
        Members {
            params: vec![("weight".to_string(), &self.weight)],
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        MembersMut {
            params: vec![("weight".to_string(), &mut self.weight)],
            ..MembersMut::default()
        }
    }
}
