//! Hyperparameters from GGUF metadata (`{arch}.*` keys), validated.

use ferrite_gguf::GgufFile;

use crate::error::{Error, Result};

/// Model families with their own graph details.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// llama, Llama 2/3, Mistral, SmolLM2: pre-norm, SwiGLU, interleaved-pair RoPE.
    Llama,
    /// qwen2: llama plus q/k/v biases, half-split (NeoX) RoPE.
    Qwen2,
    /// gemma3: embedding scale, q/k RMS norms, post-attention/post-FFN norms, GeGLU,
    /// sliding-window layers with their own RoPE base, every 6th layer global.
    Gemma3,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Arch,
    pub arch_name: String,
    pub n_layer: usize,
    pub d_model: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub vocab: usize,
    /// Context length the model was trained with (`{arch}.context_length`).
    pub ctx_train: usize,
    pub eps: f32,
    pub rope_base: f32,
    /// RoPE base of sliding-window layers (gemma3: 10000).
    pub rope_base_local: f32,
    /// Leading dims of each head that RoPE rotates.
    pub rope_dim: usize,
    /// Pairs (i, i + rope_dim/2) when true, (2i, 2i+1) when false.
    pub rope_neox: bool,
    /// Linear RoPE scaling of global layers: positions are divided by this.
    pub rope_scale: f32,
    /// Keys within this distance of the query (exclusive) for sliding-window layers; 0: none.
    pub sliding_window: usize,
    /// Every `swa_pattern`-th layer (index % pattern == pattern - 1) is global; 0: all global.
    pub swa_pattern: usize,
    /// Multiplies q.k before the softmax.
    pub attn_scale: f32,
    /// Multiplies token embeddings (gemma3: sqrt(d_model)).
    pub embed_scale: f32,
}

fn model_err(s: String) -> Error {
    Error::Model(s)
}

impl Config {
    pub fn from_gguf(f: &GgufFile) -> Result<Config> {
        let arch_name = f.get_str("general.architecture")?.to_string();
        let arch = match arch_name.as_str() {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "gemma3" => Arch::Gemma3,
            other => {
                return Err(model_err(format!(
                    "unknown architecture {other:?} (general.architecture); supported: llama, mistral, qwen2, gemma3"
                )))
            }
        };
        let a = &arch_name;
        let key = |k: &str| format!("{a}.{k}");
        let n_layer = f.get_usize(&key("block_count"))?;
        let d_model = f.get_usize(&key("embedding_length"))?;
        let n_ff = per_layer_const(f, &key("feed_forward_length"))?;
        let n_head = per_layer_const(f, &key("attention.head_count"))?;
        let n_kv_head = if f.get(&key("attention.head_count_kv")).is_some() {
            per_layer_const(f, &key("attention.head_count_kv"))?
        } else {
            n_head
        };
        if n_head == 0 {
            return Err(model_err(format!(
                "{a}.attention.head_count = 0 is out of range (must be > 0)"
            )));
        }
        if n_kv_head == 0 || n_head % n_kv_head != 0 {
            return Err(model_err(format!(
                "inconsistent head counts: {n_head} query heads ({a}.attention.head_count) is not a positive multiple of {n_kv_head} key/value heads ({a}.attention.head_count_kv)"
            )));
        }
        let head_dim = match f.get(&key("attention.key_length")) {
            Some(_) => f.get_usize(&key("attention.key_length"))?,
            None => {
                if d_model % n_head != 0 {
                    return Err(model_err(format!(
                        "embedding length {d_model} is not a multiple of the head count {n_head}"
                    )));
                }
                d_model / n_head
            }
        };
        if head_dim == 0 {
            return Err(model_err(format!(
                "{a}.attention.key_length = 0 is out of range (must be > 0)"
            )));
        }
        if f.get(&key("attention.value_length")).is_some() {
            let v = f.get_usize(&key("attention.value_length"))?;
            if v != head_dim {
                return Err(model_err(format!(
                    "value head size {v} differs from key head size {head_dim}"
                )));
            }
        }
        let ctx_train = f.get_usize(&key("context_length"))?;
        let eps = f.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        let default_base = if arch == Arch::Gemma3 {
            1_000_000.0
        } else {
            10_000.0
        };
        let rope_base = opt_f32(f, &key("rope.freq_base"))?.unwrap_or(default_base);
        let rope_dim = match f.get(&key("rope.dimension_count")) {
            Some(_) => f.get_usize(&key("rope.dimension_count"))?,
            None => head_dim,
        };
        if rope_dim == 0 || rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(model_err(format!(
                "rope dimension {rope_dim} must be even and at most the head size {head_dim}"
            )));
        }
        let mut rope_scale = 1.0;
        if let Some(kind) = f.get(&key("rope.scaling.type")).and_then(|v| v.as_str()) {
            if kind == "linear" {
                rope_scale = opt_f32(f, &key("rope.scaling.factor"))?.unwrap_or(1.0);
            } else if kind != "none" {
                return Err(model_err(format!(
                    "unsupported rope scaling type {kind:?} ({a}.rope.scaling.type)"
                )));
            }
        } else if let Some(s) = opt_f32(f, &key("rope.scaling.factor"))? {
            if arch == Arch::Gemma3 {
                rope_scale = s;
            }
        }
        if !(rope_scale > 0.0 && rope_scale.is_finite()) {
            return Err(model_err(format!(
                "{a}.rope.scaling.factor = {rope_scale} is out of range (must be finite and > 0)"
            )));
        }
        if !(rope_base.is_finite() && rope_base > 1.0) {
            return Err(model_err(format!(
                "{a}.rope.freq_base = {rope_base} is out of range (must be finite and > 1)"
            )));
        }
        let (sliding_window, swa_pattern) = match arch {
            Arch::Gemma3 => match f.get(&key("attention.sliding_window")) {
                Some(_) => (f.get_usize(&key("attention.sliding_window"))?, 6),
                None => (0, 0),
            },
            _ => (0, 0),
        };
        let attn_scale = match arch {
            Arch::Gemma3 => 1.0 / (head_dim as f32).sqrt(),
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        let embed_scale = if arch == Arch::Gemma3 {
            (d_model as f32).sqrt()
        } else {
            1.0
        };
        let cfg = Config {
            arch,
            arch_name: arch_name.clone(),
            n_layer,
            d_model,
            n_ff,
            n_head,
            n_kv_head,
            head_dim,
            vocab: 0,
            ctx_train,
            eps,
            rope_base,
            rope_base_local: 10_000.0,
            rope_dim,
            rope_neox: arch != Arch::Llama,
            rope_scale,
            sliding_window,
            swa_pattern,
            attn_scale,
            embed_scale,
        };
        if n_layer == 0 || d_model == 0 || n_ff == 0 || ctx_train == 0 {
            return Err(model_err(format!(
                "zero-sized hyperparameter: block_count {n_layer}, embedding_length {d_model}, feed_forward_length {n_ff}, context_length {ctx_train}"
            )));
        }
        // Bounds far above any real model, checked before anything is sized by these values.
        let dims = [
            ("block_count", n_layer, 1 << 12),
            ("embedding_length", d_model, 1 << 20),
            ("feed_forward_length", n_ff, 1 << 22),
            ("attention.head_count", n_head, 1 << 12),
            ("head size", head_dim, 1 << 16),
            (
                "attention head count x head size",
                n_head.saturating_mul(head_dim),
                1 << 22,
            ),
            ("context_length", ctx_train, 1 << 31),
        ];
        for (what, v, max) in dims {
            if v > max {
                return Err(model_err(format!(
                    "{a}.{what} = {v} is out of range (at most {max})"
                )));
            }
        }
        if !(eps > 0.0 && eps < 1.0) {
            return Err(model_err(format!(
                "{a}.attention.layer_norm_rms_epsilon = {eps} is out of range (must be in (0, 1))"
            )));
        }
        Ok(cfg)
    }

    /// Whether layer `il` attends only within the sliding window.
    pub fn is_local(&self, il: usize) -> bool {
        self.sliding_window > 0
            && self.swa_pattern > 0
            && il % self.swa_pattern != self.swa_pattern - 1
    }
}

/// A value stored either as one integer or as a per-layer array whose entries are all equal.
fn per_layer_const(f: &GgufFile, key: &str) -> Result<usize> {
    match f.get(key) {
        Some(v) if v.as_array().is_some() => {
            let vals = f.get_int_array(key)?;
            let first = *vals
                .first()
                .ok_or_else(|| model_err(format!("{key} is an empty array")))?;
            if vals.iter().any(|&x| x != first) {
                return Err(model_err(format!(
                    "{key} differs between layers; not supported"
                )));
            }
            usize::try_from(first)
                .map_err(|_| model_err(format!("{key} = {first} is out of range")))
        }
        _ => Ok(f.get_usize(key)?),
    }
}

fn opt_f32(f: &GgufFile, key: &str) -> Result<Option<f32>> {
    match f.get(key) {
        Some(_) => Ok(Some(f.get_f32(key)?)),
        None => Ok(None),
    }
}
