//! `RNN` (tanh or relu), `LSTM` and `GRU` as in PyTorch: multi-layer, bidirectional,
//! `batch_first`, dropout between layers (training only), PyTorch's gate orders (LSTM i, f, g,
//! o; GRU r, z, n with n = tanh(W_in x + b_in + r (W_hn h + b_hn))), parameter names
//! (`weight_ih_l0`, `weight_hh_l0_reverse`, `bias_ih_l1`, ...) and initialization
//! U(-1/√hidden, 1/√hidden). Steps are compositions of matmuls and elementwise ops (the input
//! projection of a whole sequence is one matmul per layer and direction); autodiff
//! differentiates them.

use crate::layers::dropout::dropout;
use crate::{init, Members, MembersMut, Module, Parameter};
use ferrite_core::{DType, Device, Error, Result, Tensor};
use std::sync::atomic::{AtomicU64, Ordering};

/// Which recurrence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RnnMode {
    Tanh,
    Relu,
    Lstm,
    Gru,
}

impl RnnMode {
    fn gates(self) -> usize {
        match self {
            RnnMode::Tanh | RnnMode::Relu => 1,
            RnnMode::Lstm => 4,
            RnnMode::Gru => 3,
        }
    }
    fn name(self) -> &'static str {
        match self {
            RnnMode::Tanh | RnnMode::Relu => "RNN",
            RnnMode::Lstm => "LSTM",
            RnnMode::Gru => "GRU",
        }
    }
}

/// Hyperparameters (PyTorch's names and defaults but `input_size`/`hidden_size`).
#[derive(Clone, Copy, Debug)]
pub struct RnnConfig {
    pub input_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub bias: bool,
    pub batch_first: bool,
    pub dropout: f64,
    pub bidirectional: bool,
}

impl RnnConfig {
    pub fn new(input_size: usize, hidden_size: usize) -> RnnConfig {
        RnnConfig {
            input_size,
            hidden_size,
            num_layers: 1,
            bias: true,
            batch_first: false,
            dropout: 0.0,
            bidirectional: false,
        }
    }
}

struct Cell {
    w_ih: Parameter,
    w_hh: Parameter,
    b_ih: Option<Parameter>,
    b_hh: Option<Parameter>,
    suffix: String,
}

/// The recurrent layer behind `RNN`, `LSTM` and `GRU`.
pub struct Recurrent {
    mode: RnnMode,
    cfg: RnnConfig,
    cells: Vec<Cell>,
    training: bool,
    seed: u64,
    calls: AtomicU64,
}

/// `RNN(nonlinearity="tanh" | "relu")`.
pub type RNN = Recurrent;
/// `LSTM`.
pub type LSTM = Recurrent;
/// `GRU`.
pub type GRU = Recurrent;

impl Recurrent {
    pub fn new(mode: RnnMode, cfg: RnnConfig, dtype: DType, dev: &Device) -> Result<Recurrent> {
        let name = mode.name();
        if cfg.input_size == 0 || cfg.hidden_size == 0 || cfg.num_layers == 0 {
            return Err(Error::module(
                name,
                format!(
                    "input_size ({}), hidden_size ({}) and num_layers ({}) must be positive",
                    cfg.input_size, cfg.hidden_size, cfg.num_layers
                ),
            ));
        }
        if !(0.0..1.0).contains(&cfg.dropout) {
            return Err(Error::module(
                name,
                format!("dropout must be in [0, 1), got {}", cfg.dropout),
            ));
        }
        let h = cfg.hidden_size;
        let g = mode.gates() * h;
        let dirs = if cfg.bidirectional { 2 } else { 1 };
        let k = 1.0 / (h as f64).sqrt();
        let u = |shape: Vec<usize>| -> Result<Parameter> {
            Parameter::new(&init::uniform(shape, -k, k, dtype, dev)?)
        };
        let mut cells = Vec::new();
        for l in 0..cfg.num_layers {
            let in_l = if l == 0 { cfg.input_size } else { h * dirs };
            for d in 0..dirs {
                cells.push(Cell {
                    w_ih: u(vec![g, in_l])?,
                    w_hh: u(vec![g, h])?,
                    b_ih: if cfg.bias { Some(u(vec![g])?) } else { None },
                    b_hh: if cfg.bias { Some(u(vec![g])?) } else { None },
                    suffix: format!("l{l}{}", if d == 1 { "_reverse" } else { "" }),
                });
            }
        }
        Ok(Recurrent {
            mode,
            cfg,
            cells,
            training: true,
            seed: init::next_seed(),
            calls: AtomicU64::new(0),
        })
    }

    pub fn rnn(cfg: RnnConfig, relu: bool, dtype: DType, dev: &Device) -> Result<Recurrent> {
        let mode = if relu { RnnMode::Relu } else { RnnMode::Tanh };
        Recurrent::new(mode, cfg, dtype, dev)
    }
    pub fn lstm(cfg: RnnConfig, dtype: DType, dev: &Device) -> Result<Recurrent> {
        Recurrent::new(RnnMode::Lstm, cfg, dtype, dev)
    }
    pub fn gru(cfg: RnnConfig, dtype: DType, dev: &Device) -> Result<Recurrent> {
        Recurrent::new(RnnMode::Gru, cfg, dtype, dev)
    }

    /// One direction of one layer over `x` [T, B, in] from state (h, c) [B, H]; returns the
    /// outputs [T, B, H] and the final state.
    fn run_cell(
        &self,
        cell: &Cell,
        x: &Tensor,
        reverse: bool,
        mut h: Tensor,
        mut c: Option<Tensor>,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let (t_len, hs) = (x.dims()[0], self.cfg.hidden_size);
        let mut xw = x.matmul(&cell.w_ih.tensor().t()?)?;
        if let Some(b) = &cell.b_ih {
            xw = xw.add(&b.tensor())?;
        }
        let w_hh_t = cell.w_hh.tensor().t()?;
        let b_hh = cell.b_hh.as_ref().map(|b| b.tensor());
        let mut outs = vec![None; t_len];
        for s in 0..t_len {
            let t = if reverse { t_len - 1 - s } else { s };
            let xi = xw.narrow(0, t, 1)?.squeeze(0)?;
            let mut hw = h.matmul(&w_hh_t)?;
            if let Some(b) = &b_hh {
                hw = hw.add(b)?;
            }
            let gate = |a: &Tensor, k: usize| a.narrow(-1, k * hs, hs);
            match self.mode {
                RnnMode::Tanh => h = xi.add(&hw)?.tanh()?,
                RnnMode::Relu => h = xi.add(&hw)?.relu()?,
                RnnMode::Lstm => {
                    let z = xi.add(&hw)?;
                    let i = gate(&z, 0)?.sigmoid()?;
                    let f = gate(&z, 1)?.sigmoid()?;
                    let g = gate(&z, 2)?.tanh()?;
                    let o = gate(&z, 3)?.sigmoid()?;
                    let c_prev = c
                        .take()
                        .ok_or_else(|| Error::module("LSTM", "missing cell state"))?;
                    let c_new = f.mul(&c_prev)?.add(&i.mul(&g)?)?;
                    h = o.mul(&c_new.tanh()?)?;
                    c = Some(c_new);
                }
                RnnMode::Gru => {
                    let r = gate(&xi, 0)?.add(&gate(&hw, 0)?)?.sigmoid()?;
                    let z = gate(&xi, 1)?.add(&gate(&hw, 1)?)?.sigmoid()?;
                    let n = gate(&xi, 2)?.add(&r.mul(&gate(&hw, 2)?)?)?.tanh()?;
                    // h' = (1 - z) n + z h
                    h = n.add(&z.mul(&h.sub(&n)?)?)?;
                }
            }
            outs[t] = Some(h.clone());
        }
        let outs: Vec<Tensor> = outs.into_iter().flatten().collect();
        let refs: Vec<&Tensor> = outs.iter().collect();
        Ok((Tensor::stack(&refs, 0)?, h, c))
    }

    /// Runs the layer: `x` [T, B, in] ([B, T, in] with batch_first; unbatched [T, in]) and an
    /// optional initial state (h0 [L*D, B, H], and c0 for LSTM; zeros when absent). Returns
    /// (output [T, B, D*H], h_n [L*D, B, H], c_n for LSTM).
    pub fn forward_with_state(
        &self,
        x: &Tensor,
        h0: Option<&Tensor>,
        c0: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let name = self.mode.name();
        let cfg = &self.cfg;
        let unbatched = x.rank() == 2;
        if !(x.rank() == 3 || unbatched) || x.dims()[x.rank() - 1] != cfg.input_size {
            return Err(Error::module(
                name,
                format!(
                    "expected input [T, B, {0}] (batch_first: [B, T, {0}]; unbatched [T, {0}]), got {1}",
                    cfg.input_size,
                    x.shape()
                ),
            ));
        }
        let mut seq = if unbatched {
            x.unsqueeze(1)?
        } else if cfg.batch_first {
            x.transpose(0, 1)?
        } else {
            x.clone()
        };
        let (b, hs) = (seq.dims()[1], cfg.hidden_size);
        let dirs = if cfg.bidirectional { 2 } else { 1 };
        let n_state = cfg.num_layers * dirs;
        let state = |s: Option<&Tensor>, what: &str| -> Result<Vec<Tensor>> {
            match s {
                None => (0..n_state)
                    .map(|_| Tensor::zeros([b, hs], x.dtype(), x.device()))
                    .collect(),
                Some(s) => {
                    let s = if unbatched {
                        s.unsqueeze(1)?
                    } else {
                        s.clone()
                    };
                    if s.dims() != [n_state, b, hs] {
                        return Err(Error::module(
                            name,
                            format!("expected {what} [{n_state}, {b}, {hs}], got {}", s.shape()),
                        ));
                    }
                    (0..n_state)
                        .map(|i| s.narrow(0, i, 1)?.squeeze(0))
                        .collect()
                }
            }
        };
        let h_init = state(h0, "h0")?;
        let c_init = match self.mode {
            RnnMode::Lstm => Some(state(c0, "c0")?),
            _ => None,
        };
        let (mut hn, mut cn) = (Vec::new(), Vec::new());
        for l in 0..cfg.num_layers {
            let mut outs = Vec::new();
            for d in 0..dirs {
                let i = l * dirs + d;
                let c = c_init.as_ref().map(|c| c[i].clone());
                let (o, h, c) =
                    self.run_cell(&self.cells[i], &seq, d == 1, h_init[i].clone(), c)?;
                outs.push(o);
                hn.push(h);
                if let Some(c) = c {
                    cn.push(c);
                }
            }
            let refs: Vec<&Tensor> = outs.iter().collect();
            seq = Tensor::cat(&refs, -1)?;
            if self.training && cfg.dropout > 0.0 && l + 1 < cfg.num_layers {
                let k = self.calls.fetch_add(1, Ordering::Relaxed);
                seq = dropout(
                    &seq,
                    cfg.dropout,
                    true,
                    self.seed
                        .wrapping_add(k.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                )?;
            }
        }
        let stack = |v: &[Tensor]| -> Result<Tensor> {
            let refs: Vec<&Tensor> = v.iter().collect();
            let s = Tensor::stack(&refs, 0)?;
            if unbatched {
                s.squeeze(1)
            } else {
                Ok(s)
            }
        };
        let out = if unbatched {
            seq.squeeze(1)?
        } else if cfg.batch_first {
            seq.transpose(0, 1)?
        } else {
            seq
        };
        let c = if cn.is_empty() {
            None
        } else {
            Some(stack(&cn)?)
        };
        Ok((out, stack(&hn)?, c))
    }
}

impl Module for Recurrent {
    fn type_name(&self) -> &'static str {
        self.mode.name()
    }

    /// The output sequence from zero initial state (`forward_with_state` for the rest).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.forward_with_state(x, None, None)?.0)
    }

    fn members(&self) -> Members<'_> {
        let mut params = Vec::new();
        for c in &self.cells {
            params.push((format!("weight_ih_{}", c.suffix), &c.w_ih));
            params.push((format!("weight_hh_{}", c.suffix), &c.w_hh));
            if let (Some(bi), Some(bh)) = (&c.b_ih, &c.b_hh) {
                params.push((format!("bias_ih_{}", c.suffix), bi));
                params.push((format!("bias_hh_{}", c.suffix), bh));
            }
        }
        Members {
            params,
            training: Some(self.training),
            rng_calls: Some(&self.calls),
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        let mut params = Vec::new();
        for c in &mut self.cells {
            params.push((format!("weight_ih_{}", c.suffix), &mut c.w_ih));
            params.push((format!("weight_hh_{}", c.suffix), &mut c.w_hh));
            if let (Some(bi), Some(bh)) = (&mut c.b_ih, &mut c.b_hh) {
                params.push((format!("bias_ih_{}", c.suffix), bi));
                params.push((format!("bias_hh_{}", c.suffix), bh));
            }
        }
        MembersMut {
            params,
            training: Some(&mut self.training),
            ..MembersMut::default()
        }
    }
}
