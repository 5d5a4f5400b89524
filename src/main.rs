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
    /// List the devices ferrite can use: CPU, CUDA devices and wgpu adapters (Vulkan, Metal,
    /// DX12) with their backend, limits and features.
    Devices(cmd::devices::Args),
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
    /// Serve a model over OpenAI's HTTP API with continuous batching (docs/serve.md).
    Serve(cmd::serve::Args),
    /// Load-test an OpenAI-compatible server with concurrent streaming clients.
    BenchServe(cmd::bench_serve::Args),
    /// Train a model from a recipe (mnist-mlp, csv); logs and checkpoints go to --out.
    Train(cmd::train::Args),
}

/// llama.cpp's multi-letter short flags, which clap cannot declare, as their long forms.
fn llama_style_args(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    args.map(|a| match a.to_str() {
        Some("-sys") => "--system".into(),
        Some("-ngl") => "--n-gpu-layers".into(),
        _ => a,
    })
    .collect()
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse_from(llama_style_args(std::env::args_os()));
    // Environment variables are checked like flags, before any work.
    if let Err(e) = ferrite_llm::env::check() {
        eprintln!("error: {e}");
        return std::process::ExitCode::FAILURE;
    }
    // A closed standard output (`ferrite run ... | head`) ends the process quietly, as it does
    // other command-line tools, instead of a panic in println!. The server and its load
    // tester keep Rust's default (SIGPIPE ignored): a client that goes away must not end them.
    #[cfg(unix)]
    if !matches!(cli.command, Command::Serve(_) | Command::BenchServe(_)) {
        // SAFETY: sets the signal's disposition; no other thread runs yet.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result = match cli.command {
        Command::Demo(args) => cmd::demo::run(args),
        Command::Devices(args) => cmd::devices::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Run(args) => cmd::run::run(args),
        Command::Chat(args) => cmd::chat::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Perplexity(args) => cmd::perplexity::run(args),
        Command::Synth(args) => cmd::synth::run(args),
        Command::Train(args) => cmd::train::run(args),
        Command::Serve(args) => cmd::serve::run(args),
        Command::BenchServe(args) => cmd::bench_serve::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// `--help` describes every flag and argument of every subcommand.
    #[test]
    fn every_flag_has_help() {
        let cli = super::Cli::command();
        let mut missing = Vec::new();
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{} {id}", sub.get_name()));
                }
            }
        }
        assert!(missing.is_empty(), "flags without help: {missing:?}");
    }

    #[test]
    fn llama_cpp_multi_letter_flags_become_long_flags() {
        let args = ["ferrite", "run", "-sys", "x", "-ngl", "99", "-s", "-1"].map(Into::into);
        let out: Vec<std::ffi::OsString> = super::llama_style_args(args.into_iter());
        assert_eq!(
            out,
            [
                "ferrite",
                "run",
                "--system",
                "x",
                "--n-gpu-layers",
                "99",
                "-s",
                "-1"
            ]
            .map(std::ffi::OsString::from)
        );
    }
}
