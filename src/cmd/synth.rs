//! `ferrite synth --preset NAME --quant TYPE -o FILE [--seed N] [--layers N] [--vocab N]`:
//! writes a llama GGUF with a real model's tensor names, shapes and metadata, random weights
//! and a synthetic vocabulary, so speed work needs no real weights (`ferrite_llm::synth`).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use ferrite_gguf::GgmlType;
use ferrite_llm::synth::{self, SynthConfig};

#[derive(clap::Args)]
pub struct Args {
    /// Shapes to copy: smollm2-135m (SmolLM2-135M) or llama3-8b (Llama-3-8B's shapes, vocab
    /// 49152).
    #[arg(long, value_parser = parse_preset)]
    pub preset: SynthConfig,
    /// Weight type: q4_0, q4_1, q8_0, q4_k, f16, f32 (also bf16, q5_0, q5_1, q2_k, q3_k, q5_k,
    /// q6_k). Norms are f32; K-quant weights whose rows are not whole blocks fall back as in
    /// llama.cpp (q4_k -> q5_0).
    #[arg(long, value_parser = parse_quant, default_value = "q4_0")]
    pub quant: GgmlType,
    /// Output file (overwritten).
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Random seed; the same seed writes the same bytes.
    #[arg(long, default_value_t = 0, value_parser = super::values::u64_any, allow_negative_numbers = true)]
    pub seed: u64,
    /// Number of layers instead of the preset's.
    #[arg(long, value_parser = super::values::usize_any, allow_negative_numbers = true)]
    pub layers: Option<usize>,
    /// Vocabulary size instead of the preset's (embedding rows and tokens).
    #[arg(long, value_parser = super::values::usize_any, allow_negative_numbers = true)]
    pub vocab: Option<usize>,
}

fn parse_preset(s: &str) -> Result<SynthConfig, String> {
    SynthConfig::preset(s).map_err(|e| e.to_string())
}

fn parse_quant(s: &str) -> Result<GgmlType, String> {
    synth::parse_quant(s).map_err(|e| e.to_string())
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut cfg = args.preset;
    if let Some(n) = args.layers {
        cfg = cfg.with_layers(n)?;
    }
    if let Some(n) = args.vocab {
        cfg = cfg.with_vocab(n)?;
    }
    let start = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut last_pct = u64::MAX;
    let mut progress = |done: u64, total: u64| {
        let pct = done * 100 / total.max(1);
        if tty && pct != last_pct {
            last_pct = pct;
            eprint!("\rwriting {}: {pct}%", args.output.display());
        }
    };
    let summary = synth::write_synthetic(&cfg, args.quant, args.seed, &args.output, &mut progress)
        .with_context(|| format!("writing {}", args.output.display()));
    if tty {
        eprint!("\r\x1b[K");
    }
    let summary = summary?;
    let types: Vec<String> = summary
        .bytes_by_type
        .iter()
        .map(|(ty, b)| format!("{ty} {:.1} MiB", mib(*b)))
        .collect();
    eprintln!(
        "wrote {}: {} with {} layers, vocab {}, {}: {} tensors ({}), {:.1} MiB in {:.1} s",
        args.output.display(),
        cfg.preset,
        cfg.n_layer,
        cfg.vocab,
        args.quant.name().to_lowercase(),
        summary.n_tensors,
        types.join(", "),
        mib(summary.file_bytes),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
