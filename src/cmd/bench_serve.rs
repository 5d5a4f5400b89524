//! `ferrite bench-serve URL [-c CLIENTS] [-r REQUESTS] [--max-tokens N] [--prompt TEXT] [--temp T]`:
//! drives an OpenAI-compatible server (ferrite serve, llama-server) with concurrent streaming
//! completions and reports aggregate tokens/s, time to first token and inter-token latency
//! (p50/p90/p99).

use std::time::Duration;

use anyhow::Context;
use ferrite_serve::bench::{self, BenchConfig};

/// About 16 tokens with a llama-family tokenizer.
const DEFAULT_PROMPT: &str =
    "Write a long story about a lighthouse keeper who finds a message in a bottle.";

#[derive(clap::Args)]
pub struct Args {
    /// Server base URL, e.g. http://127.0.0.1:8080.
    pub url: String,
    /// Concurrent streaming clients.
    #[arg(short = 'c', long, default_value_t = 8, value_parser = super::values::usize_positive, allow_negative_numbers = true)]
    pub clients: usize,
    /// Requests in all (default: two per client).
    #[arg(short = 'r', long, value_parser = super::values::usize_positive, allow_negative_numbers = true)]
    pub requests: Option<usize>,
    /// Tokens generated per request (sent with ignore_eos).
    #[arg(long, default_value_t = 128, value_parser = super::values::usize_positive, allow_negative_numbers = true)]
    pub max_tokens: usize,
    /// Prompt text of every request.
    #[arg(long, default_value = DEFAULT_PROMPT)]
    pub prompt: String,
    /// `model` field of the requests.
    #[arg(long, default_value = "default")]
    pub model: String,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Seconds before one request counts as failed.
    #[arg(long, default_value_t = 600, value_parser = super::values::u64_positive, allow_negative_numbers = true)]
    pub timeout: u64,
    /// Sampling temperature of every request (0: greedy; OpenAI's default is 1).
    #[arg(long = "temp", default_value_t = 0.0, value_parser = parse_temp)]
    pub temp: f64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

fn parse_temp(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=2.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "expected a temperature from 0 to 2 (the API's range), got {s:?}"
        )),
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let cfg = BenchConfig {
        url: args.url.clone(),
        clients: args.clients,
        requests: args.requests.unwrap_or(args.clients * 2),
        max_tokens: args.max_tokens,
        prompt: args.prompt.clone(),
        model: args.model.clone(),
        api_key: args.api_key.clone(),
        timeout: Duration::from_secs(args.timeout),
        temperature: args.temp,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let r = rt
        .block_on(bench::run(cfg))
        .map_err(|e| anyhow::anyhow!(e))?;
    if args.json {
        println!("{}", r.to_json());
    } else {
        let ms = |s: f64| s * 1000.0;
        println!(
            "{} clients, {} requests ok, {} failed, {:.2} s: {} generated tokens, {:.1} tok/s",
            r.clients,
            r.requests_ok,
            r.requests_failed,
            r.wall_secs,
            r.completion_tokens,
            r.tokens_per_sec
        );
        println!(
            "time to first token  p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms",
            ms(r.ttft.p50),
            ms(r.ttft.p90),
            ms(r.ttft.p99)
        );
        println!(
            "inter-token latency  p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms",
            ms(r.itl.p50),
            ms(r.itl.p90),
            ms(r.itl.p99)
        );
        if let Some(e) = &r.first_error {
            println!("first error: {e}");
        }
    }
    if r.requests_ok == 0 {
        anyhow::bail!("bench-serve: every request failed");
    }
    Ok(())
}
