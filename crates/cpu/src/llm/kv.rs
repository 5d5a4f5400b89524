//! The keys and values of the LLM crate's paged KV cache on the CPU: a block of positions per
//! block id, the bookkeeping (block tables, sharing) being the LLM crate's.

use half::f16;
use half::slice::HalfFloatSliceExt;

use ferrite_core::{Error, Result};

/// Keys and values of every block on the CPU: f16 (as on CUDA: rounded to nearest when
/// stored, widened exactly when read; half the bytes a long context's attention reads), or
/// f32 for the exact mode. Layout: `[block][layer][kv_head][slot][head_dim]` for keys and
/// for values, so one head's keys of a block are contiguous and a block (all layers) is one
/// contiguous range to copy.
pub struct KvBlocks {
    n_layer: usize,
    n_kv_head: usize,
    head_dim: usize,
    block_size: usize,
    n_blocks: usize,
    data: KvData,
}

/// The keys and values of a [`KvBlocks`], in its element type.
enum KvData {
    F16 { k: Vec<f16>, v: Vec<f16> },
    F32 { k: Vec<f32>, v: Vec<f32> },
}

/// One head's keys or values of a block (`[block_size][head_dim]`), in the store's type.
#[derive(Clone, Copy)]
pub enum KvRows<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
}

impl<'a> KvRows<'a> {
    /// Asks for these rows in cache ahead of their use.
    pub fn prefetch(self) {
        match self {
            KvRows::F16(x) => crate::quant::float::prefetch(x),
            KvRows::F32(x) => crate::quant::float::prefetch(x),
        }
    }

    /// The rows of slots `slots` (each `head_dim` values).
    pub fn slots(self, slots: std::ops::Range<usize>, head_dim: usize) -> KvRows<'a> {
        let r = slots.start * head_dim..slots.end * head_dim;
        match self {
            KvRows::F16(x) => KvRows::F16(&x[r]),
            KvRows::F32(x) => KvRows::F32(&x[r]),
        }
    }
}

impl KvBlocks {
    /// Storage for `n_blocks` blocks (zeroed allocations: pages are touched as blocks fill),
    /// f16 where `half`, else f32.
    pub fn new(
        n_layer: usize,
        n_kv_head: usize,
        head_dim: usize,
        block_size: usize,
        n_blocks: usize,
        half: bool,
    ) -> Result<KvBlocks> {
        // An absurd size would abort the process even though zeroed pages are lazy.
        const MAX_BYTES: usize = 64 << 30;
        let n = n_layer
            .checked_mul(n_kv_head)
            .and_then(|x| x.checked_mul(head_dim))
            .and_then(|x| x.checked_mul(block_size))
            .and_then(|x| x.checked_mul(n_blocks))
            // Keys and values: 2 x 2 bytes per element in f16, 2 x 4 in f32.
            .filter(|&n| {
                n.checked_mul(if half { 4 } else { 8 })
                    .is_some_and(|b| b <= MAX_BYTES)
            })
            .ok_or_else(|| {
                Error::backend(
                    "kv cache",
                    format!("{n_blocks} blocks of {block_size} positions need more than 64 GiB; use fewer positions"),
                )
            })?;
        Ok(KvBlocks {
            n_layer,
            n_kv_head,
            head_dim,
            block_size,
            n_blocks,
            data: if half {
                KvData::F16 {
                    k: vec![f16::ZERO; n],
                    v: vec![f16::ZERO; n],
                }
            } else {
                KvData::F32 {
                    k: vec![0.0; n],
                    v: vec![0.0; n],
                }
            },
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Elements of one block (all layers and heads), keys or values.
    fn block_len(&self) -> usize {
        self.n_layer * self.n_kv_head * self.block_size * self.head_dim
    }

    /// Offset of block `b`, layer `il`, kv head `g`, slot 0.
    #[inline]
    pub fn base(&self, b: u32, il: usize, g: usize) -> usize {
        ((b as usize * self.n_layer + il) * self.n_kv_head + g) * self.block_size * self.head_dim
    }

    /// Keys of block `b`, layer `il`, kv head `g`: `[block_size][head_dim]`.
    #[inline]
    pub fn keys(&self, b: u32, il: usize, g: usize) -> KvRows<'_> {
        let r = self.base(b, il, g)..self.base(b, il, g) + self.block_size * self.head_dim;
        match &self.data {
            KvData::F16 { k, .. } => KvRows::F16(&k[r]),
            KvData::F32 { k, .. } => KvRows::F32(&k[r]),
        }
    }

    #[inline]
    pub fn values(&self, b: u32, il: usize, g: usize) -> KvRows<'_> {
        let r = self.base(b, il, g)..self.base(b, il, g) + self.block_size * self.head_dim;
        match &self.data {
            KvData::F16 { v, .. } => KvRows::F16(&v[r]),
            KvData::F32 { v, .. } => KvRows::F32(&v[r]),
        }
    }

    /// Stores one position's keys and values (`[n_kv_head * head_dim]` each) of layer `il`
    /// at slot `slot` of block `b`.
    pub fn store(&mut self, b: u32, il: usize, slot: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        for g in 0..self.n_kv_head {
            let o = self.base(b, il, g) + slot * hd;
            let (ks, vs) = (&k[g * hd..(g + 1) * hd], &v[g * hd..(g + 1) * hd]);
            match &mut self.data {
                KvData::F16 { k, v } => {
                    k[o..o + hd].convert_from_f32_slice(ks);
                    v[o..o + hd].convert_from_f32_slice(vs);
                }
                KvData::F32 { k, v } => {
                    k[o..o + hd].copy_from_slice(ks);
                    v[o..o + hd].copy_from_slice(vs);
                }
            }
        }
    }
    /// Copies block `src` onto block `dst`, keys and values (all layers).
    pub fn copy(&mut self, src: u32, dst: u32) {
        let n = self.block_len();
        let (s, d) = (src as usize * n, dst as usize * n);
        match &mut self.data {
            KvData::F16 { k, v } => {
                k.copy_within(s..s + n, d);
                v.copy_within(s..s + n, d);
            }
            KvData::F32 { k, v } => {
                k.copy_within(s..s + n, d);
                v.copy_within(s..s + n, d);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_copy_whole_and_address_slots() {
        let (nl, nkv, hd, bs) = (2, 2, 4, 3);
        for half in [true, false] {
            let mut s = KvBlocks::new(nl, nkv, hd, bs, 3, half).unwrap();
            // Small integers are exact in f16; 0.1 is rounded to nearest there.
            let mut k: Vec<f32> = (0..8).map(|i| i as f32).collect();
            k[7] = 0.1;
            let v: Vec<f32> = (0..8).map(|i| -(i as f32)).collect();
            s.store(1, 1, 2, &k, &v);
            let f = |r: KvRows<'_>| match r {
                KvRows::F16(x) => x.iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
                KvRows::F32(x) => x.to_vec(),
            };
            let mut want = k[4..8].to_vec();
            if half {
                want[3] = f16::from_f32(0.1).to_f32();
            }
            assert_eq!(f(s.keys(1, 1, 1))[2 * hd..3 * hd], want);
            assert_eq!(f(s.values(1, 1, 0))[2 * hd..3 * hd], v[0..4]);
            s.copy(1, 2);
            assert_eq!(f(s.keys(2, 1, 1)), f(s.keys(1, 1, 1)));
            assert_eq!(f(s.values(2, 1, 0)), f(s.values(1, 1, 0)));
            assert!(f(s.keys(0, 1, 1)).iter().all(|&x| x == 0.0));
            assert!(matches!(
                (half, s.keys(0, 0, 0)),
                (true, KvRows::F16(_)) | (false, KvRows::F32(_))
            ));
        }
        assert!(KvBlocks::new(1 << 20, 64, 128, 16, 1 << 20, true).is_err());
    }
}
