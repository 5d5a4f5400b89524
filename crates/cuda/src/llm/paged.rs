//! Wrappers of `paged.cu`: the engine's batched kernels over the paged KV cache (RoPE + KV
//! append, attention through block tables, per-head norms, row gather, per-row argmax, block
//! copy). Each launch serves every row of a step; row metadata and block tables are device
//! buffers the host writes before the step, so a captured step replays for any positions.

use super::decode::check_heads;
use crate::{Buffer, CudaDevice, KernelArgs, KernelSource, LaunchConfig};
use ferrite_core::{Error, Result};

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "llm_paged",
    src: concat!(include_str!("../quant.cuh"), include_str!("paged.cu")),
    prebuilt: crate::prebuilt::LLM_PAGED,
};

/// Positions per KV block (`KV_BS`).
pub const KV_BS: usize = 16;
/// Row position of a padding row (`PAD_ROW`): the kernels skip it.
pub const PAD_ROW: u32 = u32::MAX;
/// Most slices `argmax_rows` splits a logit row into (one block each; 2,048 logits a slice).
pub const ARGMAX_SLICES: u32 = 64;
const AT_T: u32 = 128;
/// Query heads per attention block (`AT_GMAX`).
const AT_GMAX: usize = 8;
/// Default of [`split_keys`].
pub const SPLIT_KEYS: usize = 64;

/// The keys of one split of `paged_attn` are a multiple of this (`FERRITE_GPU_ATTN_KEYS`:
/// a power of two from 16 to 1,024; default [`SPLIT_KEYS`]). Fewer keys a split: more blocks
/// at short contexts, each with less to do, and a merge of their partials.
pub fn split_keys() -> usize {
    static K: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *K.get_or_init(|| {
        crate::step::int("FERRITE_GPU_ATTN_KEYS", KV_BS, 1024)
            .filter(|k| k.is_power_of_two())
            .unwrap_or(SPLIT_KEYS)
    })
}

/// `RopeStoreArgs` in paged.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RopeStoreArgs {
    pub qkv: u64,
    pub kc: u64,
    pub vc: u64,
    pub rows: u64,
    pub tables: u64,
    pub inv_freq: u64,
    pub nh: u32,
    pub nkv: u32,
    pub hd: u32,
    pub layer: u32,
    pub n_layer: u32,
    pub rope_dim: u32,
    pub neox: u32,
    pub qkv_w: u32,
    pub pos_scale: f32,
    pub eps: f32,
    pub qnorm: u64,
    pub knorm: u64,
    pub qh: u64,
    pub kh: u64,
    pub vh: u64,
    pub f0: u32,
    pub f1: u32,
    pub lk: u32,
    pub pad2: u32,
}

/// Bytes of dynamic shared memory `rope_store` takes: the row (q | k | v), the heads' RMS
/// factors (padded to an even count), and a (cos, sin) pair for each rotary pair.
pub fn rope_store_smem(nh: usize, nkv: usize, hd: usize, rope_dim: usize) -> usize {
    ((nh + 2 * nkv) * hd + (nh + nkv).next_multiple_of(2) + rope_dim) * 4
}

/// `PagedAttnArgs` in paged.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PagedAttnArgs {
    pub q: u64,
    pub kc: u64,
    pub vc: u64,
    pub rows: u64,
    pub tables: u64,
    pub part: u64,
    pub count: u64,
    pub out: u64,
    pub nh: u32,
    pub nkv: u32,
    pub hd: u32,
    pub layer: u32,
    pub n_layer: u32,
    pub maxsplit: u32,
    pub window: u32,
    pub ngrp: u32,
    pub q_stride: u32,
    pub scale: f32,
    pub inv_freq: u64,
    pub rope_dim: u32,
    pub neox: u32,
    pub pos_scale: f32,
    pub fused: u32,
    pub qnorm: u64,
    pub knorm: u64,
    pub eps: f32,
    /// A split's keys are a multiple of this: a power of two from 16 ([`split_keys`]).
    pub split_keys: u32,
}

const _: () = {
    assert!(std::mem::size_of::<RopeStoreArgs>() == 144);
    assert!(std::mem::size_of::<PagedAttnArgs>() == 152);
};

/// Head-group blocks per KV head of the attention (`ngrp`).
pub fn head_groups(n_head: usize, n_kv_head: usize) -> usize {
    (n_head / n_kv_head).div_ceil(AT_GMAX)
}

/// Checks the attention shape the kernels take.
pub fn check_shape(n_head: usize, n_kv_head: usize, hd: usize) -> Result<()> {
    check_heads("paged_attn", n_head, n_kv_head, hd)
}

/// One launch of the engine's batched kernels.
#[derive(Clone, Copy, Debug)]
pub enum PagedLaunch {
    /// Row blockIdx.x of `rows`; dynamic shared memory `smem`.
    RopeStore {
        args: RopeStoreArgs,
        rows: u32,
        smem: u32,
    },
    Attn {
        args: PagedAttnArgs,
        rows: u32,
    },
    HeadNorm {
        x: u64,
        w: u64,
        stride: u32,
        heads: u32,
        hd: u32,
        eps: f32,
        rows: u32,
    },
    Gather {
        src: u64,
        dst: u64,
        ids: u64,
        width: u32,
        rows: u32,
    },
    /// Greedy token of each of `rows` logit rows (`part`: `ARGMAX_SLICES * 8` bytes a row;
    /// `count`: u32 a row, zero).
    Argmax {
        logits: u64,
        n: u32,
        out: u64,
        part: u64,
        count: u64,
        /// Host memory the picks also go to (0: none): row r at u32 `slot * mail_stride + r`,
        /// `slot` the u32 at device address `mail_slot`.
        mail: u64,
        mail_slot: u64,
        mail_stride: u32,
        rows: u32,
    },
    /// Rows of f32 (optionally RMS-normed by `w`) into operand rows (`mode` 0 f16, 1 bf16,
    /// 2 f32).
    ToHalf {
        x: u64,
        w: u64,
        n: u32,
        eps: f32,
        out: u64,
        mode: u32,
        rows: u32,
    },
    /// `out[r * stride + off + j] += bias[j]`, j < n.
    Bias {
        out: u64,
        bias: u64,
        stride: u32,
        off: u32,
        n: u32,
        rows: u32,
    },
    /// Keys and values of positions `0..lk` of one sequence (block table at `table`) in
    /// `layer`, into f16 `[nkv][lk][hd]` rows.
    KvGather {
        kc: u64,
        vc: u64,
        table: u64,
        layer: u32,
        n_layer: u32,
        nkv: u32,
        hd: u32,
        lk: u32,
        kout: u64,
        vout: u64,
    },
    /// The attention op's f16 output (stored `[1, n, nh, hd]`) as operand rows of `nh * hd`
    /// (`mode`, as `ToHalf`).
    AttnRows {
        o: u64,
        nh: u32,
        n: u32,
        hd: u32,
        out: u64,
        mode: u32,
    },
    /// `out[i][j] = act(gu[i][j]) * gu[i][ff + j]` for the `n` rows (gate and up side by
    /// side in f32 rows of 2 * ff; out operand rows of `mode`, as `ToHalf`).
    GluPairs {
        gu: u64,
        out: u64,
        ff: u32,
        n: u32,
        gelu: u32,
        mode: u32,
    },
}

impl PagedLaunch {
    pub fn enqueue(&self, dev: &CudaDevice) -> Result<()> {
        match *self {
            PagedLaunch::RopeStore { args, rows, smem } => {
                let cfg = LaunchConfig::new((rows, 1, 1), (128, 1, 1), smem);
                super::launch(
                    dev,
                    "rope_store",
                    &SOURCE,
                    "rope_store",
                    cfg,
                    KernelArgs::new().arg(args),
                )
            }
            PagedLaunch::Attn { args, rows } => {
                let grid = (args.nkv * args.ngrp, args.maxsplit, rows);
                let cfg = LaunchConfig::new(grid, (AT_T, 1, 1), 0);
                super::launch(
                    dev,
                    "paged_attn",
                    &SOURCE,
                    "paged_attn",
                    cfg,
                    KernelArgs::new().arg(args),
                )
            }
            PagedLaunch::HeadNorm {
                x,
                w,
                stride,
                heads,
                hd,
                eps,
                rows,
            } => {
                let cfg = LaunchConfig::new((rows * heads, 1, 1), (32, 1, 1), 0);
                let a = KernelArgs::new()
                    .arg(x)
                    .arg(w)
                    .arg(stride)
                    .arg(heads)
                    .arg(hd)
                    .arg(eps);
                super::launch(dev, "head_norm", &SOURCE, "head_norm_rows", cfg, a)
            }
            PagedLaunch::Gather {
                src,
                dst,
                ids,
                width,
                rows,
            } => {
                let cfg = LaunchConfig::new((rows, 1, 1), (256, 1, 1), 0);
                let a = KernelArgs::new().arg(src).arg(dst).arg(ids).arg(width);
                super::launch(dev, "gather_rows", &SOURCE, "gather_rows", cfg, a)
            }
            PagedLaunch::Argmax {
                logits,
                n,
                out,
                part,
                count,
                mail,
                mail_slot,
                mail_stride,
                rows,
            } => {
                let slices = n.div_ceil(2048).clamp(1, ARGMAX_SLICES);
                let cfg = LaunchConfig::new((slices, rows, 1), (256, 1, 1), 0);
                let a = KernelArgs::new()
                    .arg(logits)
                    .arg(n)
                    .arg(out)
                    .arg(part)
                    .arg(count)
                    .arg(mail)
                    .arg(mail_slot)
                    .arg(mail_stride);
                super::launch(dev, "argmax_rows", &SOURCE, "argmax_rows", cfg, a)
            }
            PagedLaunch::ToHalf {
                x,
                w,
                n,
                eps,
                out,
                mode,
                rows,
            } => {
                let cfg = LaunchConfig::new((rows, 1, 1), (256, 1, 1), 0);
                let a = KernelArgs::new()
                    .arg(x)
                    .arg(w)
                    .arg(n)
                    .arg(eps)
                    .arg(out)
                    .arg(mode);
                super::launch(dev, "rows_to_h", &SOURCE, "rows_to_h", cfg, a)
            }
            PagedLaunch::Bias {
                out,
                bias,
                stride,
                off,
                n,
                rows,
            } => {
                let cfg = LaunchConfig::new((rows, 1, 1), (256, 1, 1), 0);
                let a = KernelArgs::new()
                    .arg(out)
                    .arg(bias)
                    .arg(stride)
                    .arg(off)
                    .arg(n);
                super::launch(dev, "bias_rows", &SOURCE, "bias_rows", cfg, a)
            }
            PagedLaunch::KvGather {
                kc,
                vc,
                table,
                layer,
                n_layer,
                nkv,
                hd,
                lk,
                kout,
                vout,
            } => {
                let n = nkv as u64 * lk as u64 * (hd / 8) as u64;
                let a = KernelArgs::new()
                    .arg(kc)
                    .arg(vc)
                    .arg(table)
                    .arg(layer)
                    .arg(n_layer)
                    .arg(nkv)
                    .arg(hd)
                    .arg(lk)
                    .arg(kout)
                    .arg(vout);
                super::launch(dev, "kv_gather", &SOURCE, "kv_gather", flat(dev, n), a)
            }
            PagedLaunch::AttnRows {
                o,
                nh,
                n,
                hd,
                out,
                mode,
            } => super::prefill::attn_out(dev, o, nh, n, hd, out, mode),
            PagedLaunch::GluPairs {
                gu,
                out,
                ff,
                n,
                gelu,
                mode,
            } => super::prefill::glu(dev, gu, n, ff, gelu != 0, out, mode),
        }
    }
}

/// A grid-stride launch over `n` items: 256 threads a block, at most 16 blocks per
/// multiprocessor.
fn flat(dev: &CudaDevice, n: u64) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 16 * dev.sm_count() as u64) as u32;
    LaunchConfig::new((blocks, 1, 1), (256, 1, 1), 0)
}

/// Copies block `src` onto block `dst` in the key and value buffers (`block_bytes` each, a
/// multiple of 16), ordered on the compute stream.
pub fn copy_block(
    dev: &CudaDevice,
    kc: &Buffer,
    vc: &Buffer,
    src: u32,
    dst: u32,
    block_bytes: usize,
) -> Result<()> {
    let end = (src.max(dst) as usize + 1) * block_bytes;
    if !block_bytes.is_multiple_of(16) || kc.bytes() < end || vc.bytes() < end {
        return Err(Error::backend(
            "kv_copy_block",
            format!(
                "blocks {src} -> {dst} of {block_bytes} bytes outside the cache of {} bytes",
                kc.bytes().min(vc.bytes())
            ),
        ));
    }
    let n16 = (block_bytes / 16) as u64;
    let blocks = n16.div_ceil(256).clamp(1, 1024) as u32;
    let cfg = LaunchConfig::new((blocks, 1, 1), (256, 1, 1), 0);
    let a = KernelArgs::new()
        .arg(kc.ptr())
        .arg(vc.ptr())
        .arg(src)
        .arg(dst)
        .arg(n16);
    super::launch(dev, "kv_copy_block", &SOURCE, "kv_copy_block", cfg, a)
}
