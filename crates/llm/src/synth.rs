//! Synthetic llama GGUF files: the tensor names, shapes, types and metadata of a real model,
//! random weights, and a synthetic byte-level BPE vocabulary. For speed work on machines
//! without the real weights (`ferrite synth`).
//!
//! Weights: every quantized block is drawn (seeded, uniformly) from a pool of
//! [`POOL_BLOCKS`] blocks that `ferrite_gguf::quant::quantize` made from normal-ish values of
//! standard deviation [`WEIGHT_STD`]. Quantizing every weight instead would take ~2 minutes for
//! the 8B shapes in Q4_K on 2 cores (the K-quant reference costs ~33 ns a weight); drawing
//! runs at memory speed, and a kernel's speed does not depend on which valid blocks it reads.
//! Norm weights are f32 near 1, as llama.cpp stores norms. Output is the same bytes for the
//! same seed on any machine and thread count.

use std::path::Path;

use ferrite_gguf::{quant, Array, GgmlType, GgufWriter, TensorSink, Value};
use rayon::prelude::*;

use crate::error::{Error, Result};

/// Standard deviation of the random weights: the usual initialization scale, which keeps
/// activations finite over 32 layers.
pub const WEIGHT_STD: f32 = 0.02;
/// Distinct blocks per weight type that weights are drawn from.
pub const POOL_BLOCKS: usize = 1 << 16;

/// Which synthetic vocabulary and chat template a preset gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabStyle {
    /// SmolLM2's layout: `<|endoftext|>`, `<|im_start|>` (BOS), `<|im_end|>` (EOS) first,
    /// no BOS added, ChatML template, `smollm` pre-tokenizer.
    SmolLm2,
    /// Llama 3's layout: `<|begin_of_text|>` (BOS, added), `<|end_of_text|>` (EOS),
    /// header and `<|eot_id|>` tokens last, Llama 3's template, `llama-bpe` pre-tokenizer.
    Llama3,
}

/// Shapes and hyperparameters of a synthetic llama model.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthConfig {
    pub preset: &'static str,
    pub n_layer: usize,
    pub d_model: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub n_ff: usize,
    pub vocab: usize,
    pub ctx: usize,
    pub rope_base: f32,
    pub eps: f32,
    /// Output projection shares `token_embd.weight` (no `output.weight` tensor).
    pub tied_output: bool,
    pub vocab_style: VocabStyle,
}

/// Preset names, for messages.
pub const PRESETS: [&str; 2] = ["smollm2-135m", "llama3-8b"];

impl SynthConfig {
    /// `smollm2-135m`: SmolLM2-135M exactly. `llama3-8b`: Llama-3-8B's shapes with a 49152-token
    /// vocabulary (the anchor benchmark's; the real one has 128256) and Llama-3.1's context
    /// length, 131072 (same weight shapes as Llama-3's 8192; long-context runs need it).
    pub fn preset(name: &str) -> Result<SynthConfig> {
        match name {
            "smollm2-135m" => Ok(SynthConfig {
                preset: "smollm2-135m",
                n_layer: 30,
                d_model: 576,
                n_head: 9,
                n_kv_head: 3,
                n_ff: 1536,
                vocab: 49152,
                ctx: 8192,
                rope_base: 100_000.0,
                eps: 1e-5,
                tied_output: true,
                vocab_style: VocabStyle::SmolLm2,
            }),
            "llama3-8b" => Ok(SynthConfig {
                preset: "llama3-8b",
                n_layer: 32,
                d_model: 4096,
                n_head: 32,
                n_kv_head: 8,
                n_ff: 14336,
                vocab: 49152,
                ctx: 131072,
                rope_base: 500_000.0,
                eps: 1e-5,
                tied_output: false,
                vocab_style: VocabStyle::Llama3,
            }),
            other => Err(synth_err(format!(
                "unknown preset {other:?} (supported: {})",
                PRESETS.join(", ")
            ))),
        }
    }

    /// Sets the layer count (1..=4096, the loader's bound).
    pub fn with_layers(mut self, n: usize) -> Result<SynthConfig> {
        if !(1..=4096).contains(&n) {
            return Err(synth_err(format!(
                "--layers {n}: expected a whole number from 1 to 4096"
            )));
        }
        self.n_layer = n;
        Ok(self)
    }

    /// Sets the vocabulary size: at least the 256 byte tokens plus the control tokens.
    pub fn with_vocab(mut self, n: usize) -> Result<SynthConfig> {
        let min = 256 + specials(self.vocab_style).len();
        if !(min..=MAX_VOCAB).contains(&n) {
            return Err(synth_err(format!(
                "--vocab {n}: expected a whole number from {min} to {MAX_VOCAB} (256 byte tokens and {} control tokens at least)",
                min - 256
            )));
        }
        self.vocab = n;
        Ok(self)
    }

    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_head
    }
}

const MAX_VOCAB: usize = 1 << 20;

fn synth_err(s: String) -> Error {
    Error::Other(format!("synth: {s}"))
}

/// Weight types `ferrite synth` writes, by their lowercase names.
pub const QUANTS: [GgmlType; 13] = {
    use GgmlType::*;
    [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
    ]
};

/// The weight type named `name` (`q4_0`, `Q4_K`, `f16`, ...), if `ferrite synth` writes it.
pub fn parse_quant(name: &str) -> Result<GgmlType> {
    GgmlType::from_name(name)
        .filter(|t| QUANTS.contains(t))
        .ok_or_else(|| {
            let names: Vec<String> = QUANTS.iter().map(|t| t.name().to_lowercase()).collect();
            synth_err(format!(
                "unknown quant type {name:?} (supported: {})",
                names.join(", ")
            ))
        })
}

/// The type a weight with rows of `row` elements gets: `quant`, or where `row` is not a
/// whole number of its blocks, the fallback of llama.cpp's quantizer (K-quants need rows of
/// 256: SmolLM2's 576-wide weights are Q5_0 in a "Q4_K" file, as llama.cpp writes them).
pub fn weight_type(quant: GgmlType, row: usize) -> GgmlType {
    if row.is_multiple_of(quant.block_size()) {
        return quant;
    }
    match quant {
        GgmlType::Q2_K | GgmlType::Q3_K => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        _ => GgmlType::F16,
    }
}

/// llama.cpp's `general.file_type` (`llama_ftype`) for a file of mostly `quant`.
fn file_type(quant: GgmlType) -> u32 {
    use GgmlType::*;
    match quant {
        F32 => 0,
        F16 => 1,
        Q4_0 => 2,
        Q4_1 => 3,
        Q8_0 => 7,
        Q5_0 => 8,
        Q5_1 => 9,
        Q2_K => 10,
        Q3_K => 11, // Q3_K_S
        Q4_K => 14, // Q4_K_S
        Q5_K => 16, // Q5_K_S
        Q6_K => 18,
        BF16 => 32,
        _ => 0,
    }
}

/// One tensor of the file: name, type, dims in GGUF order (dims[0] contiguous).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorPlan {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
}

/// The tensors of a llama file, in llama.cpp's order: embeddings, each block (norm, q, k, v,
/// output, norm, gate, up, down), output norm, output.
pub fn tensor_plan(cfg: &SynthConfig, quant: GgmlType) -> Vec<TensorPlan> {
    let (d, ff, v) = (cfg.d_model, cfg.n_ff, cfg.vocab);
    let (q_dim, kv_dim) = (cfg.n_head * cfg.head_dim(), cfg.n_kv_head * cfg.head_dim());
    let mut out = Vec::new();
    let mut add = |name: String, dims: [usize; 2]| {
        let ty = if dims[1] == 1 {
            GgmlType::F32
        } else {
            weight_type(quant, dims[0])
        };
        let dims = if dims[1] == 1 {
            vec![dims[0] as u64]
        } else {
            dims.iter().map(|&x| x as u64).collect()
        };
        out.push(TensorPlan { name, ty, dims });
    };
    add("token_embd.weight".into(), [d, v]);
    for il in 0..cfg.n_layer {
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        add(n("attn_norm"), [d, 1]);
        add(n("attn_q"), [d, q_dim]);
        add(n("attn_k"), [d, kv_dim]);
        add(n("attn_v"), [d, kv_dim]);
        add(n("attn_output"), [q_dim, d]);
        add(n("ffn_norm"), [d, 1]);
        add(n("ffn_gate"), [d, ff]);
        add(n("ffn_up"), [d, ff]);
        add(n("ffn_down"), [ff, d]);
    }
    add("output_norm.weight".into(), [d, 1]);
    if !cfg.tied_output {
        add("output.weight".into(), [d, v]);
    }
    out
}

/// What was written.
#[derive(Clone, Debug)]
pub struct SynthSummary {
    pub n_tensors: usize,
    /// Bytes of tensor data per type, in first-use order.
    pub bytes_by_type: Vec<(GgmlType, u64)>,
    /// Size of the file.
    pub file_bytes: u64,
}

/// Writes a synthetic model to `path`, streaming: memory stays at the header plus a few tens
/// of MB whatever the model size. `progress(done, total)` is called after each tensor with
/// tensor-data bytes. On error the partial file is removed.
pub fn write_synthetic(
    cfg: &SynthConfig,
    quant: GgmlType,
    seed: u64,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthSummary> {
    if !QUANTS.contains(&quant) {
        return Err(synth_err(format!("cannot write {quant} weights")));
    }
    if cfg.n_head == 0 || cfg.n_kv_head == 0 || !cfg.n_head.is_multiple_of(cfg.n_kv_head) {
        return Err(synth_err(format!(
            "{} query heads is not a multiple of {} key/value heads",
            cfg.n_head, cfg.n_kv_head
        )));
    }
    if !cfg.d_model.is_multiple_of(cfg.n_head) || !cfg.head_dim().is_multiple_of(2) {
        return Err(synth_err(format!(
            "embedding length {} / {} heads is not an even head size",
            cfg.d_model, cfg.n_head
        )));
    }
    let plan = tensor_plan(cfg, quant);
    let mut w = GgufWriter::new();
    set_metadata(&mut w, cfg, quant, seed)?;
    let mut bytes_by_type: Vec<(GgmlType, u64)> = Vec::new();
    let mut total = 0u64;
    for t in &plan {
        w.declare_tensor(&t.name, t.ty, &t.dims)?;
        let n: u64 = t.dims.iter().product();
        let b = t.ty.bytes_for(n).unwrap_or(0);
        total += b;
        match bytes_by_type.iter_mut().find(|(ty, _)| *ty == t.ty) {
            Some((_, x)) => *x += b,
            None => bytes_by_type.push((t.ty, b)),
        }
    }
    let mut pools: Vec<(GgmlType, Vec<u8>)> = Vec::new();
    let mut done = 0u64;
    // Created here rather than by the writer, so that a file that could not be opened (an
    // existing read-only file, say) is never removed below.
    let file = std::fs::File::create(path)
        .map_err(|e| synth_err(format!("cannot create the file: {e}")))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let result = w.write_to_streaming(&mut out, |sink: &mut TensorSink<'_>| -> Result<()> {
        let ty = sink.ty();
        if sink.dims().len() == 1 {
            write_norm(sink, seed)?;
        } else {
            if !pools.iter().any(|(t, _)| *t == ty) {
                pools.push((ty, block_pool(ty, seed)?));
            }
            let pool = &pools
                .iter()
                .find(|(t, _)| *t == ty)
                .expect("pushed above")
                .1;
            write_drawn(sink, pool, seed)?;
        }
        done += sink.n_bytes();
        progress(done, total);
        Ok(())
    });
    let result = result.and_then(|()| {
        use std::io::Write as _;
        out.flush().map_err(|e| synth_err(e.to_string()))
    });
    if let Err(e) = result {
        drop(out);
        // Only a regular file: `-o /dev/full` must not remove the device.
        if std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
            let _ = std::fs::remove_file(path);
        }
        return Err(e);
    }
    let file_bytes = std::fs::metadata(path)
        .map_err(|e| synth_err(format!("{}: {e}", path.display())))?
        .len();
    Ok(SynthSummary {
        n_tensors: plan.len(),
        bytes_by_type,
        file_bytes,
    })
}

fn set_metadata(w: &mut GgufWriter, cfg: &SynthConfig, quant: GgmlType, seed: u64) -> Result<()> {
    let s = |x: &str| Value::String(x.to_string());
    let u = |x: usize| Value::U32(x as u32);
    let quant_name = quant.name().to_lowercase();
    w.set("general.architecture", s("llama"))?;
    w.set("general.type", s("model"))?;
    w.set(
        "general.name",
        s(&format!("synthetic {} {quant_name}", cfg.preset)),
    )?;
    w.set(
        "general.description",
        s(&format!(
            "random weights (ferrite synth --preset {} --quant {quant_name} --seed {seed}); not a trained model",
            cfg.preset
        )),
    )?;
    w.set("llama.block_count", u(cfg.n_layer))?;
    w.set("llama.context_length", u(cfg.ctx))?;
    w.set("llama.embedding_length", u(cfg.d_model))?;
    w.set("llama.feed_forward_length", u(cfg.n_ff))?;
    w.set("llama.attention.head_count", u(cfg.n_head))?;
    w.set("llama.attention.head_count_kv", u(cfg.n_kv_head))?;
    w.set("llama.rope.freq_base", Value::F32(cfg.rope_base))?;
    w.set(
        "llama.attention.layer_norm_rms_epsilon",
        Value::F32(cfg.eps),
    )?;
    w.set("general.file_type", Value::U32(file_type(quant)))?;
    w.set("llama.vocab_size", u(cfg.vocab))?;
    w.set("llama.rope.dimension_count", u(cfg.head_dim()))?;

    let v = synthetic_vocab(cfg.vocab_style, cfg.vocab);
    w.set("tokenizer.ggml.model", s("gpt2"))?;
    w.set("tokenizer.ggml.pre", s(v.pre))?;
    w.set(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(v.tokens.into())),
    )?;
    w.set(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(v.types)),
    )?;
    w.set(
        "tokenizer.ggml.merges",
        Value::Array(Array::String(v.merges.into())),
    )?;
    w.set("tokenizer.ggml.bos_token_id", u(v.bos))?;
    w.set("tokenizer.ggml.eos_token_id", u(v.eos))?;
    if let Some(unk) = v.unk {
        w.set("tokenizer.ggml.unknown_token_id", u(unk))?;
    }
    if let Some(pad) = v.pad {
        w.set("tokenizer.ggml.padding_token_id", u(pad))?;
    }
    w.set("tokenizer.ggml.add_bos_token", Value::Bool(v.add_bos))?;
    w.set("tokenizer.chat_template", s(v.template))?;
    w.set("general.quantization_version", Value::U32(2))?;
    Ok(())
}

/// A synthetic byte-level BPE vocabulary.
struct Vocab {
    tokens: Vec<String>,
    types: Vec<i32>,
    merges: Vec<String>,
    bos: usize,
    eos: usize,
    unk: Option<usize>,
    pad: Option<usize>,
    add_bos: bool,
    pre: &'static str,
    template: &'static str,
}

/// SmolLM2-135M-Instruct's template, as its GGUF stores it.
const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Meta-Llama-3-8B-Instruct's template.
const LLAMA3_TEMPLATE: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

fn specials(style: VocabStyle) -> &'static [&'static str] {
    match style {
        VocabStyle::SmolLm2 => &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        VocabStyle::Llama3 => &[
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ],
    }
}

/// GPT-2's `bytes_to_unicode` (as the tokenizer's `pretok::byte_to_char`): printable bytes
/// spell themselves, the other 68 map to U+0100.. in byte order.
fn byte_chars() -> Vec<char> {
    let mut extra = 0u32;
    (0..256u32)
        .map(|b| {
            let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
            let cp = if printable {
                b
            } else {
                extra += 1;
                255 + extra
            };
            char::from_u32(cp).unwrap_or('\u{fffd}')
        })
        .collect()
}

/// `n` tokens: the control tokens, the 256 byte tokens, then merged tokens: every
/// (space or letter) + letter, then those + letter, and so on (breadth first, so each merge's
/// parts exist before it), until `n`. Each merged token has its merge, in creation order.
fn synthetic_vocab(style: VocabStyle, n: usize) -> Vocab {
    let sp = specials(style);
    let n_normal = n - sp.len();
    let mut tokens: Vec<String> = byte_chars().iter().map(|c| c.to_string()).collect();
    let mut merges = Vec::new();
    let letters: Vec<char> = ('a'..='z').collect();
    let mut frontier: Vec<String> = std::iter::once('Ġ')
        .chain(letters.iter().copied())
        .map(String::from)
        .collect();
    'grow: while tokens.len() < n_normal {
        let mut next = Vec::with_capacity(frontier.len() * letters.len());
        for left in &frontier {
            for &c in &letters {
                if tokens.len() >= n_normal {
                    break 'grow;
                }
                let merged = format!("{left}{c}");
                merges.push(format!("{left} {c}"));
                tokens.push(merged.clone());
                next.push(merged);
            }
        }
        frontier = next;
    }
    let mut types = vec![1i32; tokens.len()];
    let special_at = match style {
        VocabStyle::SmolLm2 => 0,
        VocabStyle::Llama3 => tokens.len(),
    };
    tokens.splice(special_at..special_at, sp.iter().map(|s| s.to_string()));
    types.splice(special_at..special_at, sp.iter().map(|_| 3)); // control
    match style {
        VocabStyle::SmolLm2 => Vocab {
            tokens,
            types,
            merges,
            bos: 1,
            eos: 2,
            unk: Some(0),
            pad: Some(2),
            add_bos: false,
            pre: "smollm",
            template: SMOLLM2_TEMPLATE,
        },
        VocabStyle::Llama3 => Vocab {
            tokens,
            types,
            merges,
            bos: special_at,
            eos: special_at + 1,
            unk: None,
            pad: None,
            add_bos: true,
            pre: "llama-bpe",
            template: LLAMA3_TEMPLATE,
        },
    }
}

/// SplitMix64: tiny, fast, and good enough to pick blocks.
struct SplitMix(u64);

impl SplitMix {
    fn new(parts: &[u64]) -> SplitMix {
        let mut s = SplitMix(0x5eed_f00d_cafe_d00d);
        for &p in parts {
            s.0 ^= p;
            s.0 = s.next();
        }
        s
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Mean 0, standard deviation 1, within ±sqrt(12): the sum of four uniform 16-bit draws.
    fn normalish(&mut self) -> f32 {
        let r = self.next();
        let sum: u64 = (0..4).map(|i| (r >> (16 * i)) & 0xffff).sum();
        // Each draw is uniform on [0, 65536): mean 32767.5, variance (65536^2 - 1) / 12.
        ((sum as f32 - 4.0 * 32767.5) / 65536.0) * 3f32.sqrt()
    }
}

/// `POOL_BLOCKS` blocks of `ty` quantized from normal-ish values of std `WEIGHT_STD`.
fn block_pool(ty: GgmlType, seed: u64) -> Result<Vec<u8>> {
    const PARTS: usize = 64;
    let per_part = POOL_BLOCKS / PARTS * ty.block_size();
    let parts: Vec<Vec<u8>> = (0..PARTS)
        .into_par_iter()
        .map(|p| {
            let mut rng = SplitMix::new(&[seed, u64::from(ty.id()), 0x9001, p as u64]);
            let x: Vec<f32> = (0..per_part)
                .map(|_| rng.normalish() * WEIGHT_STD)
                .collect();
            quant::quantize_to_vec(ty, &x)
        })
        .collect::<ferrite_gguf::Result<_>>()?;
    Ok(parts.concat())
}

/// Norm weights: 1 + normal-ish noise of std 0.02, f32.
fn write_norm(sink: &mut TensorSink<'_>, seed: u64) -> Result<()> {
    let n = sink.n_bytes() as usize / 4;
    let mut rng = SplitMix::new(&[seed, sink.index() as u64, 0x404]);
    let bytes: Vec<u8> = (0..n)
        .flat_map(|_| (1.0 + 0.02 * rng.normalish()).to_le_bytes())
        .collect();
    Ok(sink.write(&bytes)?)
}

/// Fills a weight with blocks drawn from `pool`, in chunks of a fixed block count (so the
/// bytes do not depend on the thread count), 16 chunks generated in parallel at a time.
fn write_drawn(sink: &mut TensorSink<'_>, pool: &[u8], seed: u64) -> Result<()> {
    const CHUNK_BYTES: usize = 4 << 20;
    const BATCH: usize = 16;
    let ts = sink.ty().type_size();
    let n_blocks = sink.n_bytes() as usize / ts;
    let chunk_blocks = (CHUNK_BYTES / ts).max(1);
    let n_chunks = n_blocks.div_ceil(chunk_blocks);
    let index = sink.index() as u64;
    for batch in (0..n_chunks).step_by(BATCH) {
        let chunks: Vec<Vec<u8>> = (batch..(batch + BATCH).min(n_chunks))
            .into_par_iter()
            .map(|c| {
                let blocks = chunk_blocks.min(n_blocks - c * chunk_blocks);
                let mut rng = SplitMix::new(&[seed, index, c as u64]);
                let mut out = Vec::with_capacity(blocks * ts);
                let mut r = 0u64;
                for i in 0..blocks {
                    if i % 4 == 0 {
                        r = rng.next();
                    }
                    let k = ((r >> (16 * (i % 4))) & 0xffff) as usize % POOL_BLOCKS;
                    out.extend_from_slice(&pool[k * ts..(k + 1) * ts]);
                }
                out
            })
            .collect();
        for c in &chunks {
            sink.write(c)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalish_has_unit_variance() {
        let mut rng = SplitMix::new(&[1]);
        let n = 200_000;
        let xs: Vec<f32> = (0..n).map(|_| rng.normalish()).collect();
        let mean = xs.iter().sum::<f32>() / n as f32;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / n as f32;
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((var - 1.0).abs() < 0.02, "{var}");
    }

    #[test]
    fn vocab_merges_name_earlier_tokens() {
        for (style, n) in [(VocabStyle::SmolLm2, 2000), (VocabStyle::Llama3, 261)] {
            let v = synthetic_vocab(style, n);
            assert_eq!(v.tokens.len(), n);
            assert_eq!(v.types.len(), n);
            assert_eq!(v.merges.len(), n - 256 - specials(style).len());
            let pos = |t: &str| v.tokens.iter().position(|x| x == t).unwrap();
            for m in &v.merges {
                let (l, r) = m.split_once(' ').unwrap();
                let merged = pos(&format!("{l}{r}"));
                assert!(pos(l) < merged && pos(r) < merged, "{m}");
            }
        }
    }

    #[test]
    fn k_quants_fall_back_where_rows_are_not_whole_blocks() {
        assert_eq!(weight_type(GgmlType::Q4_K, 576), GgmlType::Q5_0);
        assert_eq!(weight_type(GgmlType::Q4_K, 1536), GgmlType::Q4_K);
        assert_eq!(weight_type(GgmlType::Q4_0, 576), GgmlType::Q4_0);
    }
}
