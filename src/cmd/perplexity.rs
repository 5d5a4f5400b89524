//! `ferrite perplexity -m FILE -f TEXT [--ctx-size N] [--stride S] [--chunks K]`: perplexity
//! of the whole text (BOS added only if the model's metadata asks for it), scored in windows
//! of N tokens that start every S tokens (default N/2). Each window runs from an empty cache;
//! it scores the tokens no earlier window scored, each predicted from the window's tokens
//! before it (the first window scores all but its first token), so every scored token after
//! the first window sees at least N - S tokens of context. Reports the tokens scored and the
//! perplexity with its standard error (delta method over the per-token NLLs, as
//! llama-perplexity). Activations: `--precision` (default q8x2). With `--device cuda` the
//! logits come from the GPU's batched prefill.

use std::path::PathBuf;

use anyhow::Context;
use ferrite_llm::generate::chunk_nll;
use ferrite_llm::{Logits, Session};

use super::llm_args::{tokens, DeviceArgs, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Text file to score (UTF-8).
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Tokens between the starts of consecutive windows, 1 to --ctx-size. Default: half the
    /// window.
    #[arg(long, value_parser = super::values::u32_positive, allow_negative_numbers = true)]
    pub stride: Option<u32>,
    /// Score at most this many windows (default: the whole file).
    #[arg(long, value_parser = super::values::u32_positive, allow_negative_numbers = true)]
    pub chunks: Option<u32>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One window: tokens `begin..end`, of which `first..end` are scored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window {
    begin: usize,
    end: usize,
    first: usize,
}

/// The windows over `n` tokens (n >= 2, ctx >= 2, 1 <= stride <= ctx).
fn windows(n: usize, ctx: usize, stride: usize) -> Vec<Window> {
    let mut out = Vec::new();
    let (mut begin, mut scored_to) = (0, 0);
    loop {
        let end = (begin + ctx).min(n);
        let first = scored_to.max(begin + 1);
        if first < end {
            out.push(Window { begin, end, first });
        }
        scored_to = end;
        if end == n {
            return out;
        }
        begin += stride;
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let bytes =
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("{} is not UTF-8 text", args.file.display()))?;
    let loaded = args.model.load()?;
    let (model, tok) = (&loaded.model, &loaded.tok);
    let ctx = args.model.ctx(model)?;
    if ctx < 2 {
        anyhow::bail!("--ctx-size {ctx}: a window needs at least 2 tokens to score one");
    }
    let stride = args.stride.map_or((ctx / 2).max(1), |s| s as usize);
    if stride > ctx {
        anyhow::bail!("--stride {stride} is larger than the window (--ctx-size {ctx})");
    }
    let ids = tok.encode(&text, true)?;
    if ids.len() < 2 {
        anyhow::bail!(
            "{} holds {} after tokenization; perplexity needs at least 2 tokens of text",
            args.file.display(),
            tokens(ids.len())
        );
    }
    let mut wins = windows(ids.len(), ctx, stride);
    if let Some(k) = args.chunks {
        wins.truncate(k as usize);
    }
    let vocab = model.cfg.vocab;
    let wgpu = args.device.wgpu()?;
    let cuda = match wgpu {
        Some(_) => None,
        None => args.device.cuda()?,
    };
    let t0 = std::time::Instant::now();
    let mut nlls: Vec<f64> = Vec::new();
    // Per-token NLLs of window `w` from `logits(tokens)`, the rows of every position.
    let mut score = |w: &Window, logits: &mut dyn FnMut(&[u32]) -> anyhow::Result<Vec<f32>>| {
        // Positions first-1..end-1 predict tokens first..end; run the window up to end - 1
        // in pieces of at most 8M logits (32 MB).
        let piece = (8 * 1024 * 1024 / vocab).max(1);
        let inputs = &ids[w.begin..w.end - 1];
        for (c, chunk) in inputs.chunks(piece).enumerate() {
            let rows = logits(chunk)?;
            for (r, row) in rows.chunks_exact(vocab).enumerate() {
                let pos = w.begin + c * piece + r; // predicts ids[pos + 1]
                if pos + 1 >= w.first {
                    nlls.push(chunk_nll(row, vocab, &ids[pos + 1..pos + 2]));
                }
            }
        }
        anyhow::Ok(())
    };
    match (&cuda, &wgpu) {
        (_, Some(dev)) => {
            let wm = ferrite_llm::model::WgpuModel::new(model, dev)?;
            let mut session = Session::wgpu(&wm, ctx)?;
            for w in &wins {
                session.truncate(0);
                score(w, &mut |t| Ok(session.forward(t, Logits::All)?.to_vec()))?;
            }
        }
        (Some(dev), None) => {
            let gm = ferrite_llm::gpu::GpuModel::load(model, dev, ctx)?;
            let mut session = Session::cuda(&gm, ctx)?;
            for w in &wins {
                session.truncate(0);
                score(w, &mut |t| Ok(session.forward(t, Logits::All)?.to_vec()))?;
            }
        }
        (None, None) => {
            let mut session = Session::new(model, ctx)?;
            for w in &wins {
                session.truncate(0);
                score(w, &mut |t| Ok(session.forward(t, Logits::All)?.to_vec()))?;
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let n = nlls.len();
    let mean = nlls.iter().sum::<f64>() / n as f64;
    let var = if n > 1 {
        nlls.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64
    } else {
        0.0
    };
    let ppl = mean.exp();
    // Standard error of exp(mean NLL): exp(mean) x sd / sqrt(n).
    let ppl_err = ppl * (var / n as f64).sqrt();
    let device = match (&cuda, &wgpu) {
        (_, Some(d)) => format!("wgpu:{} ({}, {})", d.index(), d.name(), d.backend_name()),
        (Some(_), None) => "cuda".to_string(),
        (None, None) => "cpu".to_string(),
    };
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "model": loaded.path, "text_tokens": ids.len(), "scored": n,
                "windows": wins.len(), "ctx": ctx, "stride": stride, "mean_nll": mean,
                "ppl": ppl, "ppl_uncertainty": ppl_err, "seconds": secs,
                "precision": model.precision().name(), "device": device,
            })
        );
    } else {
        println!(
            "perplexity: {ppl:.4} ± {ppl_err:.4} ({} scored of {}; {} window{} of up to {ctx}, stride {stride})",
            tokens(n),
            ids.len(),
            wins.len(),
            if wins.len() == 1 { "" } else { "s" }
        );
        eprintln!("{:.1} tok/s", nlls.len() as f64 / secs);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_score_every_token_once() {
        for (n, ctx, stride) in [
            (2, 2, 1),
            (10, 4, 2),
            (10, 4, 4),
            (300, 128, 64),
            (5, 128, 64),
            (17, 5, 3),
        ] {
            let ws = windows(n, ctx, stride);
            let mut scored = Vec::new();
            for w in &ws {
                assert!(
                    w.end - w.begin <= ctx && w.first > w.begin && w.first < w.end,
                    "{w:?}"
                );
                scored.extend(w.first..w.end);
            }
            // Tokens 1..n each once, except the first token of windows that start where the
            // previous one ended (stride == ctx), which has no context in its window.
            let mut want: Vec<usize> = (1..n).collect();
            if stride == ctx {
                want.retain(|i| i % ctx != 0);
            }
            assert_eq!(scored, want, "n {n} ctx {ctx} stride {stride}");
        }
    }
}
