//! The KV cache: f32 keys and values for every layer, preallocated to the context size.

use crate::error::{Error, Result};

/// Layout: `[layer][kv_head][position][head_dim]` for keys and for values, so one head's
/// keys are contiguous for the attention dot products. `len` positions are filled.
pub struct KvCache {
    n_layer: usize,
    n_kv_head: usize,
    head_dim: usize,
    cap: usize,
    len: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl KvCache {
    /// Allocates `cap` positions (zeroed pages are only touched as positions fill).
    pub fn new(n_layer: usize, n_kv_head: usize, head_dim: usize, cap: usize) -> Result<KvCache> {
        let n = n_layer
            .checked_mul(n_kv_head)
            .and_then(|x| x.checked_mul(head_dim))
            .and_then(|x| x.checked_mul(cap))
            .filter(|&n| n.checked_mul(8).is_some_and(|b| b <= isize::MAX as usize))
            .ok_or_else(|| Error::Context(format!("KV cache of {cap} positions is too large")))?;
        // Zeroed allocations are lazy, but an absurd size would still abort the process.
        const MAX_BYTES: usize = 64 << 30;
        if n * 8 > MAX_BYTES {
            return Err(Error::Context(format!(
                "KV cache of {cap} positions needs {} GiB (more than 64 GiB); lower --ctx",
                (n * 8) >> 30
            )));
        }
        Ok(KvCache {
            n_layer,
            n_kv_head,
            head_dim,
            cap,
            len: 0,
            k: vec![0.0; n],
            v: vec![0.0; n],
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Marks `t` more positions filled (after every layer stored them).
    pub fn advance(&mut self, t: usize) {
        self.len = (self.len + t).min(self.cap);
    }

    fn base(&self, il: usize, g: usize) -> usize {
        (il * self.n_kv_head + g) * self.cap * self.head_dim
    }

    /// Stores keys and values `[t][n_kv_head * head_dim]` of layer `il` at positions p0..p0+t.
    pub fn store(&mut self, il: usize, p0: usize, k: &[f32], v: &[f32]) {
        let (hd, nkv) = (self.head_dim, self.n_kv_head);
        debug_assert!(il < self.n_layer);
        let t = k.len() / (nkv * hd);
        assert!(
            p0 + t <= self.cap,
            "KvCache::store: positions {p0}..{} exceed {}",
            p0 + t,
            self.cap
        );
        for ti in 0..t {
            for g in 0..nkv {
                let dst = self.base(il, g) + (p0 + ti) * hd;
                let src = ti * nkv * hd + g * hd;
                self.k[dst..dst + hd].copy_from_slice(&k[src..src + hd]);
                self.v[dst..dst + hd].copy_from_slice(&v[src..src + hd]);
            }
        }
    }

    /// Keys of layer `il`, kv head `g`: `[cap][head_dim]`.
    pub fn keys(&self, il: usize, g: usize) -> &[f32] {
        let b = self.base(il, g);
        &self.k[b..b + self.cap * self.head_dim]
    }

    pub fn values(&self, il: usize, g: usize) -> &[f32] {
        let b = self.base(il, g);
        &self.v[b..b + self.cap * self.head_dim]
    }
}
