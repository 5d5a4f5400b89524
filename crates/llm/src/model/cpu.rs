//! The CPU kernel set of the model definition ([`super::step`]): f32 activations, quantized
//! products on the GGUF blocks ([`ferrite_cpu::quant::matmul`]: every weight row is read once for
//! all rows of the step), f32 KV blocks ([`CpuKvStore`]).

use super::config::Config;
use super::step::{Batch, Buf, Glu, Kernels, Mat, Norm};
use super::{rms_norm_in_place, rms_norm_rows, rope_inv_freq, Model, Product};
use crate::error::Result;
use crate::kv_cache::{BlockId, CpuKvStore};
use ferrite_cpu::llm::attention::{paged_attention, SeqRows};
use ferrite_cpu::llm::rope::{rope, rope_table};
use ferrite_cpu::quant::{self, Acts, MatOut};

const N_BUFS: usize = 8;

fn idx(b: Buf) -> usize {
    b as usize
}

/// Scratch and the current batch's layout; grown on demand, never shrunk.
pub struct CpuKernels<'m> {
    m: &'m Model,
    bufs: [Vec<f32>; N_BUFS],
    /// Normalized activations, and the gathered final rows.
    xb: Vec<f32>,
    acts: Acts,
    tokens: Vec<u32>,
    seqs: Vec<SeqRows>,
    blocks: Vec<BlockId>,
    out_rows: Vec<usize>,
    /// RoPE angles `[row][rope_dim/2]` for global and (gemma3) local layers.
    cos: Vec<f32>,
    sin: Vec<f32>,
    cos_local: Vec<f32>,
    sin_local: Vec<f32>,
    inv_freq: Vec<f32>,
    inv_freq_local: Vec<f32>,
    scores: Vec<f32>,
    logits: Vec<f32>,
}

impl<'m> CpuKernels<'m> {
    pub fn new(m: &'m Model) -> CpuKernels<'m> {
        let c = &m.cfg;
        let factors = m.rope_freq_factors.as_deref();
        CpuKernels {
            m,
            bufs: Default::default(),
            xb: Vec::new(),
            acts: Acts::default(),
            tokens: Vec::new(),
            seqs: Vec::new(),
            blocks: Vec::new(),
            out_rows: Vec::new(),
            cos: Vec::new(),
            sin: Vec::new(),
            cos_local: Vec::new(),
            sin_local: Vec::new(),
            inv_freq: rope_inv_freq(c.rope_dim, c.rope_base, factors),
            inv_freq_local: rope_inv_freq(c.rope_dim, c.rope_base_local, factors),
            scores: Vec::new(),
            logits: Vec::new(),
        }
    }

    pub fn model(&self) -> &'m Model {
        self.m
    }

    /// Logits of the last step, `[out rows][vocab]` (see [`Batch::out_rows`]).
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    pub fn logits_mut(&mut self) -> &mut [f32] {
        &mut self.logits
    }

    fn width(&self, b: Buf) -> usize {
        let c = &self.m.cfg;
        match b {
            Buf::X | Buf::Tmp => c.d_model,
            Buf::Q | Buf::Att => c.n_head * c.head_dim,
            Buf::K | Buf::V => c.n_kv_head * c.head_dim,
            Buf::Gate | Buf::Up => c.n_ff,
        }
    }

    fn rows(&self) -> usize {
        self.tokens.len()
    }

    fn norm_w(&self, n: Norm) -> &'m [f32] {
        let ls = &self.m.layers;
        let v = match n {
            Norm::Attn(il) => Some(&ls[il].attn_norm),
            Norm::Ffn(il) => Some(&ls[il].ffn_norm),
            Norm::PostAttn(il) => ls[il].post_attn_norm.as_ref(),
            Norm::PostFfn(il) => ls[il].post_ffn_norm.as_ref(),
            Norm::QHead(il) => ls[il].q_norm.as_ref(),
            Norm::KHead(il) => ls[il].k_norm.as_ref(),
        };
        // The definition asks only for norms its architecture has, checked at load.
        v.map_or(&[], |v| v.as_slice())
    }

    fn mat(&self, w: Mat) -> (quant::QMat<'m>, Option<&'m [f32]>) {
        let m = self.m;
        let ls = &m.layers;
        let (w, b) = match w {
            Mat::Q(il) => (&ls[il].wq, ls[il].bq.as_deref()),
            Mat::K(il) => (&ls[il].wk, ls[il].bk.as_deref()),
            Mat::V(il) => (&ls[il].wv, ls[il].bv.as_deref()),
            Mat::O(il) => (&ls[il].wo, None),
            Mat::Gate(il) => (&ls[il].w_gate, None),
            Mat::Up(il) => (&ls[il].w_up, None),
            Mat::Down(il) => (&ls[il].w_down, None),
        };
        (m.product_mat(w), b)
    }
}

impl Kernels for CpuKernels<'_> {
    type Kv = CpuKvStore;

    fn begin(&mut self, batch: &Batch) -> Result<()> {
        let c: &Config = &self.m.cfg;
        let t = batch.rows();
        self.tokens.clear();
        self.tokens.extend_from_slice(&batch.tokens);
        self.blocks.clear();
        self.blocks.extend_from_slice(&batch.blocks);
        self.seqs.clear();
        self.seqs.extend(batch.seqs.iter().map(|s| SeqRows {
            r0: s.rows.start,
            n: s.rows.len(),
            pos: s.pos,
            blocks: s.blocks.clone(),
        }));
        self.out_rows.clear();
        self.out_rows.extend(batch.out_row_ids());
        for b in [
            Buf::X,
            Buf::Q,
            Buf::K,
            Buf::V,
            Buf::Att,
            Buf::Tmp,
            Buf::Gate,
            Buf::Up,
        ] {
            let n = t * self.width(b);
            self.bufs[idx(b)].resize(n, 0.0);
        }
        self.xb.resize(t * c.d_model, 0.0);
        let scale = 1.0 / c.rope_scale;
        let positions = || {
            batch
                .seqs
                .iter()
                .flat_map(|s| (0..s.rows.len()).map(move |i| s.pos + i))
        };
        rope_table(
            &self.inv_freq,
            positions(),
            scale,
            &mut self.cos,
            &mut self.sin,
        );
        if c.sliding_window > 0 {
            rope_table(
                &self.inv_freq_local,
                positions(),
                1.0,
                &mut self.cos_local,
                &mut self.sin_local,
            );
        }
        let n_out = batch.out_rows();
        self.logits.resize(n_out * c.vocab, 0.0);
        Ok(())
    }

    fn embed(&mut self, out: Buf) -> Result<()> {
        let d = self.m.cfg.d_model;
        let x = &mut self.bufs[idx(out)];
        for (row, &tok) in x.chunks_exact_mut(d).zip(&self.tokens) {
            self.m.embed(tok, row)?;
        }
        Ok(())
    }

    fn norm_matmul(&mut self, x: Buf, norm: Option<Norm>, outs: &[(Mat, Buf)]) -> Result<()> {
        let (t, cols) = (self.rows(), self.width(x));
        let m = self.m;
        let src: &[f32] = match norm {
            Some(n) => {
                let w = self.norm_w(n);
                rms_norm_rows(
                    &self.bufs[idx(x)],
                    &mut self.xb[..t * cols],
                    w,
                    cols,
                    m.cfg.eps,
                );
                &self.xb[..t * cols]
            }
            None => &self.bufs[idx(x)],
        };
        let mats: Vec<_> = outs.iter().map(|&(w, _)| self.mat(w)).collect();
        let qs: Vec<&quant::QMat<'_>> = mats.iter().map(|(q, _)| q).collect();
        // The precision plan's activation format for this product (all matrices of one
        // launch belong to the same product).
        let fmt = match outs.first().map(|&(w, _)| w) {
            Some(Mat::Q(il) | Mat::K(il) | Mat::V(il)) => {
                m.plan().layers[il][Product::Qkv as usize]
            }
            Some(Mat::O(il)) => m.plan().layers[il][Product::AttnOut as usize],
            Some(Mat::Gate(il) | Mat::Up(il)) => m.plan().layers[il][Product::GateUp as usize],
            Some(Mat::Down(il)) => m.plan().layers[il][Product::Down as usize],
            None => m.plan().output,
        };
        self.acts.quantize(src, t, cols, &m.formats(&qs, fmt));
        // Take the output buffers out so that each product borrows its own.
        let mut taken: Vec<Vec<f32>> = outs
            .iter()
            .map(|&(_, b)| std::mem::take(&mut self.bufs[idx(b)]))
            .collect();
        {
            let mut ops: Vec<MatOut<'_, '_>> = mats
                .iter()
                .zip(taken.iter_mut())
                .map(|((w, _), out)| MatOut { w: *w, out })
                .collect();
            quant::matmul(m.isa, &self.acts, &mut ops);
        }
        for (((_, b), (_, bias)), buf) in outs.iter().zip(&mats).zip(taken) {
            let mut buf = buf;
            if let Some(bias) = bias {
                for row in buf.chunks_exact_mut(bias.len()) {
                    row.iter_mut().zip(*bias).for_each(|(a, b)| *a += b);
                }
            }
            self.bufs[idx(*b)] = buf;
        }
        Ok(())
    }

    fn head_norm(&mut self, x: Buf, norm: Norm) -> Result<()> {
        let w = self.norm_w(norm);
        let c = &self.m.cfg;
        rms_norm_in_place(&mut self.bufs[idx(x)], w, c.head_dim, c.eps);
        Ok(())
    }

    fn rope_attention(
        &mut self,
        kv: &mut CpuKvStore,
        il: usize,
        q: Buf,
        k: Buf,
        v: Buf,
        out: Buf,
    ) -> Result<()> {
        let c = &self.m.cfg;
        let (hd, nh, nkv) = (c.head_dim, c.n_head, c.n_kv_head);
        let local = c.is_local(il);
        let (cos, sin) = if local {
            (&self.cos_local, &self.sin_local)
        } else {
            (&self.cos, &self.sin)
        };
        let mut qb = std::mem::take(&mut self.bufs[idx(q)]);
        let mut kb = std::mem::take(&mut self.bufs[idx(k)]);
        rope(&mut qb, nh, hd, c.rope_dim, c.rope_neox, cos, sin);
        rope(&mut kb, nkv, hd, c.rope_dim, c.rope_neox, cos, sin);
        let bs = kv.block_size();
        let kvw = nkv * hd;
        {
            let vb = &self.bufs[idx(v)];
            for s in &self.seqs {
                let table = &self.blocks[s.blocks.clone()];
                for i in 0..s.n {
                    let (p, r) = (s.pos + i, s.r0 + i);
                    kv.store(
                        table[p / bs],
                        il,
                        p % bs,
                        &kb[r * kvw..(r + 1) * kvw],
                        &vb[r * kvw..(r + 1) * kvw],
                    );
                }
            }
        }
        let window = if local { c.sliding_window } else { 0 };
        let mut ob = std::mem::take(&mut self.bufs[idx(out)]);
        paged_attention(
            self.m.isa,
            kv,
            il,
            &self.seqs,
            &self.blocks,
            &qb,
            &mut ob,
            &mut self.scores,
            (nh, nkv, hd),
            c.attn_scale,
            window,
        );
        self.bufs[idx(q)] = qb;
        self.bufs[idx(k)] = kb;
        self.bufs[idx(out)] = ob;
        Ok(())
    }

    fn norm_glu(
        &mut self,
        x: Buf,
        norm: Norm,
        gate: Mat,
        up: Mat,
        out: Buf,
        act: Glu,
    ) -> Result<()> {
        self.norm_matmul(x, Some(norm), &[(gate, out), (up, Buf::Up)])?;
        self.glu(out, Buf::Up, act);
        Ok(())
    }

    fn matmul_residual(&mut self, x: Buf, w: Mat, y: Buf, post_norm: Option<Norm>) -> Result<()> {
        self.norm_matmul(x, None, &[(w, Buf::Tmp)])?;
        self.residual(y, Buf::Tmp, post_norm);
        Ok(())
    }

    fn logits(&mut self, x: Buf) -> Result<()> {
        self.final_logits(x);
        Ok(())
    }
}

impl CpuKernels<'_> {
    /// `gate = act(gate) * up`.
    fn glu(&mut self, gate: Buf, up: Buf, act: Glu) {
        let ub = std::mem::take(&mut self.bufs[idx(up)]);
        let g = &mut self.bufs[idx(gate)];
        quant::exp::glu_mul(self.m.isa, act == Glu::GeluTanh, g, &ub);
        self.bufs[idx(up)] = ub;
    }

    /// `x += post_norm(y)` (or `x += y`).
    fn residual(&mut self, x: Buf, y: Buf, post_norm: Option<Norm>) {
        let mut yb = std::mem::take(&mut self.bufs[idx(y)]);
        if let Some(n) = post_norm {
            let c = &self.m.cfg;
            rms_norm_in_place(&mut yb, self.norm_w(n), c.d_model, c.eps);
        }
        self.bufs[idx(x)]
            .iter_mut()
            .zip(&yb)
            .for_each(|(a, b)| *a += b);
        self.bufs[idx(y)] = yb;
    }

    fn final_logits(&mut self, x: Buf) {
        let m = self.m;
        let d = m.cfg.d_model;
        let n = self.out_rows.len();
        if n == 0 {
            return;
        }
        // `Tmp` is free once the layers are done: the final rows are gathered into it.
        let mut gathered = std::mem::take(&mut self.bufs[idx(Buf::Tmp)]);
        gathered.clear();
        let xs = &self.bufs[idx(x)];
        for &r in &self.out_rows {
            gathered.extend_from_slice(&xs[r * d..(r + 1) * d]);
        }
        let xo = &mut self.xb[..n * d];
        rms_norm_rows(&gathered, xo, &m.output_norm, d, m.cfg.eps);
        let wout = m.product_mat(&m.output);
        self.acts
            .quantize(xo, n, d, &m.formats(&[&wout], m.plan().output));
        quant::matmul(
            m.isa,
            &self.acts,
            &mut [MatOut {
                w: wout,
                out: &mut self.logits[..n * m.cfg.vocab],
            }],
        );
        self.bufs[idx(Buf::Tmp)] = gathered;
    }
}

#[cfg(test)]
mod tests {
    use super::super::step::Out;
    use super::*;

    #[test]
    fn out_is_listed_per_sequence() {
        let mut b = Batch::default();
        b.push(&[1, 2, 3], 0, &[0], Out::Last);
        b.push(&[4], 9, &[1], Out::None);
        b.push(&[5, 6], 2, &[2], Out::All);
        assert_eq!(b.out_rows(), 3);
        assert_eq!(b.out_row_ids().collect::<Vec<_>>(), vec![2, 4, 5]);
    }
}
