//! `ferrite serve [-m FILE] [--host 127.0.0.1] [--port 8080] [--device cpu|cuda[:N]|wgpu[:N]|
//! vulkan|metal|dx12] [-ngl N] [--parallel N] [--ctx N] [--api-key KEY | --api-key-file F]`: an
//! OpenAI-compatible HTTP server over the batched engine (docs/serve.md), on the device asked
//! for, else on a CUDA device when one is present (as `run` chooses), else the CPU. It listens at once and loads the model in the background
//! (`/health` answers 503 until it is ready); SIGINT or SIGTERM shuts it down.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use ferrite_serve::{Loaded, ServeConfig, ServeDevice};

use super::llm_args::{DeviceArgs, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 = any free port; the one taken is printed).
    #[arg(long, default_value_t = 8080, value_parser = super::values::port, allow_negative_numbers = true)]
    pub port: u16,
    /// Sequences decoded together in one batch (llama-server's -np).
    #[arg(long, short = 'n', alias = "np", default_value_t = 4, value_parser = super::values::one_to_1024, allow_negative_numbers = true)]
    pub parallel: u32,
    /// Requests that may wait for room in the batch; more are answered 429.
    #[arg(long, default_value_t = 64, value_parser = super::values::usize_any, allow_negative_numbers = true)]
    pub max_queue: usize,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long, conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read the API key from the first line of FILE.
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Largest request body in bytes (413 above).
    #[arg(long, default_value_t = 1 << 20, value_parser = super::values::usize_positive, allow_negative_numbers = true)]
    pub body_limit: usize,
    /// Seconds a client has to send its whole request body (408 after).
    #[arg(long, default_value_t = 10, value_parser = super::values::u64_positive, allow_negative_numbers = true)]
    pub body_timeout: u64,
}

fn api_key(args: &Args) -> anyhow::Result<Option<String>> {
    let key = match (&args.api_key, &args.api_key_file) {
        (Some(k), _) => k.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading the API key from {}", f.display()))?
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_string(),
        (None, None) => return Ok(None),
    };
    if key.is_empty() {
        anyhow::bail!("the API key is empty");
    }
    Ok(Some(key))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // Resolved before listening, as `run` does: an unusable --device is an error at once.
    let device = match args.device.wgpu()? {
        Some(w) => ServeDevice::Wgpu(w),
        None => args.device.cuda()?.into(),
    };
    let where_ = device.name();
    let key = api_key(&args)?;
    let model_args = args.model.clone();
    let model_id = match &args.model.model {
        Some(p) => p
            .file_stem()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned()),
        None => "SmolLM2-135M-Instruct-Q4_1".to_string(),
    };
    let ctx = args.model.ctx.map(|c| c as usize);
    let mut cfg = ServeConfig::new(model_id);
    cfg.parallel = args.parallel as usize;
    cfg.ctx = ctx;
    cfg.max_queue = args.max_queue;
    cfg.api_key = key;
    cfg.body_limit = args.body_limit;
    cfg.body_timeout = Duration::from_secs(args.body_timeout);
    let load: ferrite_serve::Loader = Box::new(move || {
        let l = model_args.load().map_err(|e| format!("{e:#}"))?;
        Ok(Loaded {
            model: l.model,
            tok: l.tok,
            device,
        })
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("listening on {addr}"))?;
        let local = listener.local_addr().context("the listening address")?;
        eprintln!("serve: listening on http://{local} (loading the model on {where_})");
        ferrite_serve::serve(listener, cfg, load, shutdown_signal())
            .await
            .map_err(|e| anyhow::anyhow!(e))?;
        eprintln!("serve: stopped");
        Ok(())
    })
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let int = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = int => {}
        _ = term => {}
    }
    eprintln!("serve: shutting down");
}
