//! `ferrite perplexity -m FILE -f TEXT --ctx N`: perplexity over one window of the first N
//! tokens of the text (BOS added only if the model's metadata asks for it), scoring tokens
//! 2..N each from the tokens before it (activations: `--precision`, default q8x2). With `--device cuda` the logits come from the GPU's batched prefill.

use std::path::PathBuf;

use anyhow::Context;
use ferrite_llm::generate::mean_nll;
use ferrite_llm::Session;

use super::llm_args::{DeviceArgs, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Text file to score.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let loaded = args.model.load()?;
    let (model, tok) = (&loaded.model, &loaded.tok);
    let ctx = args.model.ctx(model)?;
    let mut ids = tok.encode(&text, true)?;
    let n_text = ids.len();
    ids.truncate(ctx);
    if ids.len() < 2 {
        anyhow::bail!(
            "{} has {} tokens; perplexity needs at least 2",
            args.file.display(),
            ids.len()
        );
    }
    if n_text < ctx {
        eprintln!(
            "note: the text has only {n_text} tokens, fewer than --ctx {ctx}; scoring all of them"
        );
    }
    let cuda = args.device.cuda()?;
    let t0 = std::time::Instant::now();
    let (nll, n) = match &cuda {
        // All-position logits from the batched prefill (f16 products, f32 accumulation).
        Some(dev) => {
            let gm = ferrite_llm::gpu::GpuModel::load(model, dev, ids.len())?;
            let mut session = ferrite_llm::gpu::GpuSession::new(&gm)?;
            ferrite_llm::gpu::mean_nll(&mut session, &ids)?
        }
        None => {
            let mut session = Session::new(model, ids.len())?;
            mean_nll(&mut session, &ids)?
        }
    };
    let secs = t0.elapsed().as_secs_f64();
    let precision = match &cuda {
        Some(_) => "cuda".to_string(),
        None => model.precision().to_string(),
    };
    let ppl = nll.exp();
    if args.json {
        println!(
            "{}",
            serde_json::json!({"model": loaded.path, "ctx": ids.len(), "scored": n, "mean_nll": nll, "ppl": ppl, "seconds": secs, "precision": precision})
        );
    } else {
        println!(
            "perplexity: {ppl:.4} (mean NLL {nll:.5} nats over {n} tokens, window of {} tokens)",
            ids.len()
        );
        eprintln!("{:.1} tok/s", ids.len() as f64 / secs);
    }
    Ok(())
}
