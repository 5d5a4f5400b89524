//! Wrappers of `decode.cu` (RMS norms of rows), and the attention's shape: its head checks,
//! its splits over the key length and their scratch size, which `paged_attn` launches take.

use crate::{Buffer, CudaDevice, KernelArgs, KernelSource, LaunchConfig};
use ferrite_core::{Error, Result};

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "llm_decode",
    src: concat!(include_str!("../quant.cuh"), include_str!("decode.cu")),
    prebuilt: crate::prebuilt::LLM_DECODE,
};

/// Largest head size the kernels take (`HD_MAX`).
pub const HD_MAX: usize = 512;
/// Query heads per attention block (`AT_GMAX`).
const AT_GMAX: usize = 8;
/// Most KV-length splits of one head group.
const MAX_SPLIT: usize = 64;

/// Errors (naming `op`) where the attention kernels cannot take these heads: head_dim a
/// multiple of 8 up to `HD_MAX`, query heads a multiple of KV heads.
pub fn check_heads(op: &'static str, nh: usize, nkv: usize, hd: usize) -> Result<()> {
    if nkv == 0 || !nh.is_multiple_of(nkv) || hd == 0 || !hd.is_multiple_of(8) || hd > HD_MAX {
        return Err(Error::backend(op, format!(
            "needs head_dim a multiple of 8 up to {HD_MAX} and query heads a multiple of KV heads; found {nh} heads, {nkv} KV heads, head_dim {hd}"
        )));
    }
    Ok(())
}

/// Head counts and sizes of one attention layer, and the KV cache capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Positions in the KV cache.
    pub ctx: usize,
}

impl AttnShape {
    pub fn check(&self) -> Result<()> {
        let (nh, nkv, hd) = (self.n_head, self.n_kv_head, self.head_dim);
        check_heads("attention", nh, nkv, hd)?;
        if self.ctx == 0 {
            return Err(Error::backend("attention", "a KV cache of 0 positions"));
        }
        if u32::try_from(nkv * self.ctx * hd).is_err() {
            return Err(Error::backend(
                "attention",
                format!(
                    "a KV cache of {} positions is too large for the kernels",
                    self.ctx
                ),
            ));
        }
        Ok(())
    }

    /// Bytes of one layer's keys (or values): f16 [n_kv_head][ctx][head_dim].
    pub fn kv_layer_bytes(&self) -> usize {
        self.n_kv_head * self.ctx * self.head_dim * 2
    }

    /// (blocks per KV head, KV-length splits) for a device with `sm_count` multiprocessors
    /// and splits of at least `keys` keys: about two blocks per multiprocessor once the
    /// context is long enough to split.
    pub fn splits(&self, sm_count: u32, keys: usize) -> (usize, usize) {
        let group = self.n_head / self.n_kv_head;
        let ngrp = group.div_ceil(AT_GMAX);
        let want = (2 * sm_count.max(1) as usize).div_ceil(self.n_kv_head * ngrp);
        let split = want
            .clamp(1, MAX_SPLIT)
            .min(self.ctx.div_ceil(keys.max(1)))
            .max(1);
        (ngrp, split)
    }

    /// Bytes of the partial results of attention with `maxsplit` splits.
    pub fn part_bytes(&self, maxsplit: usize) -> usize {
        self.n_head * maxsplit * (self.head_dim + 2) * 4
    }
}

fn check_len(buf: &Buffer, need: usize, what: &str) -> Result<()> {
    if buf.bytes() < need {
        return Err(Error::backend(
            "llm decode",
            format!("{what} holds {} bytes, needs {need}", buf.bytes()),
        ));
    }
    Ok(())
}

/// `y = x / rms(x) * w` (add: `x += y_in / rms(y_in) * w`) over n values.
#[derive(Clone, Copy, Debug)]
pub struct NormLaunch {
    a: u64,
    b: u64,
    w: u64,
    n: u32,
    eps: f32,
    add: bool,
    /// Rows of n values (one block each).
    rows: u32,
}

/// add = false: y = rms_norm(x) * w. add = true: x += rms_norm(y) * w.
pub fn plan_norm(
    x: &Buffer,
    y: &Buffer,
    w: &Buffer,
    n: usize,
    eps: f32,
    add: bool,
) -> Result<NormLaunch> {
    for (b, what) in [(x, "x"), (y, "y"), (w, "norm weight")] {
        check_len(b, n * 4, what)?;
    }
    let n = u32::try_from(n).map_err(|_| Error::backend("rms_norm", format!("{n} values")))?;
    Ok(NormLaunch {
        a: x.ptr(),
        b: y.ptr(),
        w: w.ptr(),
        n,
        eps,
        add,
        rows: 1,
    })
}

impl NormLaunch {
    /// The same norm over `rows` consecutive rows of n values of x and y (buffers checked by
    /// the caller).
    pub fn with_rows(mut self, rows: u32) -> NormLaunch {
        self.rows = rows.max(1);
        self
    }

    pub fn enqueue(&self, dev: &CudaDevice) -> Result<()> {
        let cfg = LaunchConfig::new((self.rows, 1, 1), (512, 1, 1), 0);
        if self.add {
            // rms_norm_add(x, y, w, n, eps)
            let args = KernelArgs::new()
                .arg(self.a)
                .arg(self.b)
                .arg(self.w)
                .arg(self.n)
                .arg(self.eps);
            super::launch(dev, "rms_norm_add", &SOURCE, "rms_norm_add", cfg, args)
        } else {
            // rms_norm(x, w, y, n, eps)
            let args = KernelArgs::new()
                .arg(self.a)
                .arg(self.w)
                .arg(self.b)
                .arg(self.n)
                .arg(self.eps);
            super::launch(dev, "rms_norm", &SOURCE, "rms_norm", cfg, args)
        }
    }
}
