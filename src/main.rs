//! The `ferrite` command-line tool. Each subcommand lives in `src/cmd/<name>.rs` and exposes
//! an `Args` struct (clap) and `run(args) -> anyhow::Result<()>`.

use clap::{Parser, Subcommand};

mod cmd;

#[derive(Parser)]
#[command(
    name = "ferrite",
    version,
    about = "Run and train machine-learning models, on CPU and GPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a tensor-library demo: a small computation on the CPU.
    Demo(cmd::demo::Args),
    /// Show a GGUF file's metadata, tensors and per-type totals (--json for machines).
    Inspect(cmd::inspect::Args),
    /// Generate text from a prompt with a GGUF model (default: SmolLM2-135M-Instruct).
    Run(cmd::run::Args),
    /// Chat interactively through the model's chat template.
    Chat(cmd::chat::Args),
    /// Measure prompt-processing and generation speed (like llama-bench).
    Bench(cmd::bench::Args),
    /// Perplexity of a model on the first --ctx tokens of a text file.
    Perplexity(cmd::perplexity::Args),
    /// Write a GGUF with random weights in a real model's shapes (for speed work).
    Synth(cmd::synth::Args),
    /// Train a model from a recipe (mnist-mlp, csv); logs and checkpoints go to --out.
    Train(cmd::train::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => cmd::demo::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Run(args) => cmd::run::run(args),
        Command::Chat(args) => cmd::chat::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Perplexity(args) => cmd::perplexity::run(args),
        Command::Synth(args) => cmd::synth::run(args),
        Command::Train(args) => cmd::train::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
