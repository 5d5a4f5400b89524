//! The `ferrite` command-line tool. Each subcommand lives in `src/cmd/<name>.rs` and exposes
//! an `Args` struct (clap) and `run(args) -> anyhow::Result<()>`.

use clap::{Parser, Subcommand};

mod cmd;

#[derive(Parser)]
#[command(name = "ferrite", version, about = "Run and train machine-learning models, on CPU and GPU")]
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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => cmd::demo::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
