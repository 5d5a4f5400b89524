//! `paged.wgsl`: RoPE, the KV append and causal attention over the paged cache in one kernel
//! (`attention`), split over up to [`MAX_SPLITS`] workgroups per (row, head) for long rows and
//! merged by `attn_merge`.
//!
//! The cache: keys and values, f32 `[block][layer][kv_head][BLOCK_SLOTS][head_dim]` each. A
//! step's rows read their keys through their sequence's block table and write their own key
//! and value into it (see the shader's header for the step data: each row's position, table
//! and first position of its sequence in u32 `sdata`; cos and sin tables in f32 `trig`).

use ferrite_core::{Error, Result};

use super::{word, Dispatch, Module};

/// The module's source.
pub const PAGED: &str = include_str!("paged.wgsl");
/// Its entry points.
pub const ENTRIES: &[&str] = &["attention", "attn_merge"];

/// Largest head_dim the attention kernel takes (the size of `qs` in `paged.wgsl`).
pub const MAX_HEAD_DIM: usize = 256;
/// Positions per cache block (`BS` of `paged.wgsl`).
pub const BLOCK_SLOTS: usize = 16;
/// Keys per attention split (`SPLIT_KEYS` of `paged.wgsl`).
pub const ATTN_SPLIT_KEYS: usize = 256;
/// Most workgroups the attention of one (row, head) is split over (`MAX_SPLITS` of
/// `paged.wgsl`): a row of `len` keys takes min(ceil(len / ATTN_SPLIT_KEYS), MAX_SPLITS).
pub const MAX_SPLITS: usize = 8;

/// Attention splits of a row whose window holds `len` keys (as `splits_of` in `paged.wgsl`).
pub fn attn_splits(len: usize) -> usize {
    len.div_ceil(ATTN_SPLIT_KEYS).clamp(1, MAX_SPLITS)
}

/// Bytes of the partial results of `rows` rows of `n_head` heads over `splits` splits
/// (`part`: f32 `[row][head][splits][head_dim + 2]`).
pub fn part_bytes(rows: usize, n_head: usize, splits: usize, head_dim: usize) -> usize {
    rows * n_head * splits * (head_dim + 2) * 4
}

/// Errors where the kernel cannot take these heads: head_dim a multiple of 4 (the cache is
/// read as vec4s) and at most [`MAX_HEAD_DIM`], heads a whole multiple of the KV heads.
pub fn check_heads(head_dim: usize, n_head: usize, n_kv_head: usize) -> Result<()> {
    if head_dim > MAX_HEAD_DIM
        || !head_dim.is_multiple_of(4)
        || n_kv_head == 0
        || !n_head.is_multiple_of(n_kv_head)
    {
        return Err(Error::backend(
            "attention",
            format!(
                "head_dim {head_dim} (a multiple of 4, at most {MAX_HEAD_DIM}) with {n_head} \
                 heads over {n_kv_head} KV heads is not supported"
            ),
        ));
    }
    Ok(())
}

/// One layer's attention over a step's `rows` rows: q, k and v are columns `q_col`, `k_col`,
/// `v_col` of the rows of one buffer (`stride` floats a row); RoPE over the first `rope_dim`
/// dims of each head (`neox`: pairs (i, i + rope_dim / 2), else (2i, 2i + 1)) with the angles
/// at `cos_at`, `sin_at` of `trig` (`[rows][rope_dim / 2]` each); `rows_at`: each row's
/// (position, block table index in `sdata`, its sequence's first position in the step) at
/// `sdata[rows_at + 3r..]`; `window` 0 (none) or the keys in (pos - window, pos]; `splits`
/// per (row, head): [`attn_splits`] of the longest row's window.
pub struct Attention {
    pub rows: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub neox: bool,
    pub cos_at: usize,
    pub sin_at: usize,
    pub layer: usize,
    pub n_layer: usize,
    pub rows_at: usize,
    pub window: usize,
    pub scale: f32,
    pub stride: usize,
    pub q_col: usize,
    pub k_col: usize,
    pub v_col: usize,
    pub splits: usize,
}

/// The buffers of an [`Attention`]: `sdata` (u32) and `trig` the step data, `qkv` the q|k|v
/// rows, `kc` and `vc` the cache, `out` (`[rows][n_head * head_dim]`), `part` the partial
/// results ([`part_bytes`]; any buffer where `splits` is 1, never written then).
pub struct AttentionBuffers<'a> {
    pub sdata: &'a wgpu::Buffer,
    pub trig: &'a wgpu::Buffer,
    pub qkv: &'a wgpu::Buffer,
    pub kc: &'a wgpu::Buffer,
    pub vc: &'a wgpu::Buffer,
    pub out: &'a wgpu::Buffer,
    pub part: &'a wgpu::Buffer,
}

impl Attention {
    /// The `attention` dispatch, then, where rows are split, `attn_merge`'s.
    pub fn dispatches(&self, b: &AttentionBuffers) -> Result<Vec<Dispatch>> {
        const OP: &str = "attention";
        let params = vec![
            word(OP, "rows", self.rows)?,
            word(OP, "n_head", self.n_head)?,
            word(OP, "n_kv_head", self.n_kv_head)?,
            word(OP, "head_dim", self.head_dim)?,
            word(OP, "rope_dim", self.rope_dim)?,
            u32::from(self.neox),
            word(OP, "trig offset", self.cos_at)?,
            word(OP, "trig offset", self.sin_at)?,
            word(OP, "layer", self.layer)?,
            word(OP, "n_layer", self.n_layer)?,
            word(OP, "sdata offset", self.rows_at)?,
            word(OP, "window", self.window)?,
            self.scale.to_bits(),
            word(OP, "q|k|v row stride", self.stride)?,
            word(OP, "q column", self.q_col)?,
            word(OP, "k column", self.k_col)?,
            word(OP, "v column", self.v_col)?,
            word(OP, "attention splits", self.splits)?,
        ];
        let mut out = vec![Dispatch {
            module: Module::Paged,
            entry: "attention",
            params: params.clone(),
            binds: vec![
                (1, b.sdata.clone()),
                (2, b.trig.clone()),
                (3, b.qkv.clone()),
                (6, b.kc.clone()),
                (7, b.vc.clone()),
                (8, b.out.clone()),
                (9, b.part.clone()),
            ],
            groups: self.rows * self.n_head * self.splits,
        }];
        if self.splits > 1 {
            out.push(Dispatch {
                module: Module::Paged,
                entry: "attn_merge",
                params,
                binds: vec![
                    (1, b.sdata.clone()),
                    (8, b.out.clone()),
                    (9, b.part.clone()),
                ],
                groups: self.rows * self.n_head,
            });
        }
        Ok(out)
    }
}
