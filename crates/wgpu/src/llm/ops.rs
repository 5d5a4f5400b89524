//! `ops.wgsl`: the row-wise LLM kernels. RMS norms (rows into a buffer, optionally gathered
//! and added; heads in place) and greedy argmax take a workgroup of 256 threads per row or
//! head; the gated unit a thread per value. Buffers are f32 unless named otherwise.

use ferrite_core::Result;

use super::{word, Dispatch, Module};

/// The module's source.
pub const OPS: &str = include_str!("ops.wgsl");
/// Its entry points.
pub const ENTRIES: &[&str] = &["rms_norm", "rms_norm_inplace", "glu", "argmax"];

/// `rms_norm`: for each of `pieces` pieces of `n` values, `dst[i] = src_i / rms(src_i) * w`
/// (`add`: `dst[i] +=` that), `dst` and `w` packed (`[pieces][n]`, `[n]`). `src_i` is piece
/// i of `src` (`[pieces][n]`), or where `gather` is set row `sdata[sdata_at + i]` of `src`
/// (u32 `sdata`: the logit rows' batch rows).
pub struct RmsNorm {
    pub n: usize,
    pub pieces: usize,
    pub eps: f32,
    pub add: bool,
    pub gather: bool,
    pub sdata_at: usize,
}

impl RmsNorm {
    pub fn dispatch(
        &self,
        src: &wgpu::Buffer,
        dst: &wgpu::Buffer,
        w: &wgpu::Buffer,
        sdata: &wgpu::Buffer,
    ) -> Result<Dispatch> {
        const OP: &str = "rms_norm";
        Ok(Dispatch {
            module: Module::Ops,
            entry: OP,
            params: vec![
                word(OP, "norm width", self.n)?,
                word(OP, "norm rows", self.pieces)?,
                self.eps.to_bits(),
                u32::from(self.add),
                u32::from(self.gather),
                word(OP, "sdata offset", self.sdata_at)?,
            ],
            binds: vec![
                (1, src.clone()),
                (2, dst.clone()),
                (3, w.clone()),
                (4, sdata.clone()),
            ],
            groups: self.pieces,
        })
    }
}

/// `rms_norm_inplace`: every head of `head_dim` values of `rows` rows of `x`, normed in place
/// with weights `w` (`[head_dim]`): head h of row r is `x[r * stride + col0 + h * head_dim..]`
/// for h < `heads`.
pub struct HeadNorm {
    pub head_dim: usize,
    pub heads: usize,
    pub rows: usize,
    pub eps: f32,
    pub stride: usize,
    pub col0: usize,
}

impl HeadNorm {
    pub fn dispatch(&self, x: &wgpu::Buffer, w: &wgpu::Buffer) -> Result<Dispatch> {
        const OP: &str = "rms_norm_inplace";
        let pieces = self.rows * self.heads;
        Ok(Dispatch {
            module: Module::Ops,
            entry: OP,
            params: vec![
                word(OP, "head_dim", self.head_dim)?,
                word(OP, "heads", pieces)?,
                self.eps.to_bits(),
                word(OP, "heads per row", self.heads)?,
                word(OP, "row stride", self.stride)?,
                word(OP, "first column", self.col0)?,
            ],
            binds: vec![(2, x.clone()), (3, w.clone())],
            groups: pieces,
        })
    }
}

/// `glu`: `gate[i] = act(gate[i]) * up[i]` for i < `n`, act SiLU or (`gelu`) tanh-GELU.
pub fn glu(n: usize, gelu: bool, gate: &wgpu::Buffer, up: &wgpu::Buffer) -> Result<Dispatch> {
    const OP: &str = "glu";
    Ok(Dispatch {
        module: Module::Ops,
        entry: OP,
        params: vec![word(OP, "glu size", n)?, u32::from(gelu)],
        binds: vec![(1, up.clone()), (2, gate.clone())],
        groups: n.div_ceil(64),
    })
}

/// `argmax`: `toks[r]` (u32) = the index of the largest of row r of `logits` (`[rows][vocab]`;
/// the lowest index on ties, NaN never wins) for r < `rows`.
pub fn argmax(
    vocab: usize,
    rows: usize,
    logits: &wgpu::Buffer,
    toks: &wgpu::Buffer,
) -> Result<Dispatch> {
    const OP: &str = "argmax";
    Ok(Dispatch {
        module: Module::Ops,
        entry: OP,
        params: vec![word(OP, "vocab", vocab)?, word(OP, "logit rows", rows)?],
        binds: vec![(1, logits.clone()), (5, toks.clone())],
        groups: rows,
    })
}
