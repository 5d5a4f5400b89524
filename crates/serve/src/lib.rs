//! `ferrite serve`: an OpenAI-compatible HTTP server (axum + tokio) over the batched LLM
//! engine (docs/serve.md).
//!
//! The engine runs on a thread of its own ([`worker`]) that owns the model and the
//! [`ferrite_llm::engine::Engine`]; HTTP handlers ([`http`]) validate each request
//! completely ([`api`]) before submitting it through a channel, then receive its tokens on a
//! per-request channel. A handler that is dropped (its client went away) cancels its
//! generation, freeing the KV blocks at once. [`bench`] is the streaming load tool.

pub mod api;
pub mod bench;
pub mod error;
pub mod http;
pub mod metrics;
pub mod worker;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub use error::ApiError;
pub use worker::{Loaded, Loader, ServeDevice};

use metrics::Metrics;
use worker::{Cmd, Ready, WorkerConfig};

/// Context used when none is given: the model's, capped here (as `ferrite run`).
pub const DEFAULT_CTX_CAP: usize = 4096;

/// `system_fingerprint` of every response.
pub const FINGERPRINT: &str = concat!("ferrite-", env!("CARGO_PKG_VERSION"));

/// Server settings (the `ferrite serve` flags).
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Sequences decoded together in one batch.
    pub parallel: usize,
    /// Positions per sequence; None = the model's context, at most [`DEFAULT_CTX_CAP`].
    pub ctx: Option<usize>,
    /// Requests that may wait for room; one more is answered 429.
    pub max_queue: usize,
    /// Required as `Authorization: Bearer KEY` on every route but `/health`.
    pub api_key: Option<String>,
    /// Largest request body, in bytes (413 above).
    pub body_limit: usize,
    /// Time a client has to send its whole body (408 after).
    pub body_timeout: Duration,
    /// The model's name in `/v1/models` and in responses.
    pub model_id: String,
}

impl ServeConfig {
    pub fn new(model_id: impl Into<String>) -> ServeConfig {
        ServeConfig {
            parallel: 4,
            ctx: None,
            max_queue: 64,
            api_key: None,
            body_limit: 1 << 20,
            body_timeout: Duration::from_secs(10),
            model_id: model_id.into(),
        }
    }
}

pub(crate) enum Status {
    Loading,
    Ready(Arc<Ready>),
    Failed(String),
}

pub(crate) struct AppState {
    pub cfg: ServeConfig,
    pub status: RwLock<Status>,
    pub cmd: std::sync::mpsc::Sender<Cmd>,
    pub metrics: Arc<Metrics>,
    pub next_key: AtomicU64,
    /// Set on shutdown: new requests get 503.
    pub stopping: AtomicBool,
    pub created: u64,
}

/// Serves on `listener` until `shutdown` resolves (or the model fails to load: then the
/// error is returned). The model is loaded by `load` on the engine thread while the server
/// already answers (`/health` 503 until it is ready). On shutdown the server stops accepting,
/// running generations are cancelled (their clients get a 503 error), and it returns once
/// open connections are done.
pub async fn serve(
    listener: tokio::net::TcpListener,
    cfg: ServeConfig,
    load: Loader,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let metrics = Arc::new(Metrics::default());
    let state = Arc::new(AppState {
        cfg: cfg.clone(),
        status: RwLock::new(Status::Loading),
        cmd: tx,
        metrics: metrics.clone(),
        next_key: AtomicU64::new(0),
        stopping: AtomicBool::new(false),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    let failed = Arc::new(tokio::sync::Notify::new());
    let wcfg = WorkerConfig {
        ctx: cfg.ctx,
        parallel: cfg.parallel,
        max_queue: cfg.max_queue,
    };
    let (st_ok, st_err, notify) = (state.clone(), state.clone(), failed.clone());
    let engine_thread = std::thread::Builder::new()
        .name("ferrite-engine".into())
        .spawn(move || {
            worker::run(
                rx,
                wcfg,
                load,
                metrics,
                |r| *st_ok.status.write().unwrap_or_else(|p| p.into_inner()) = Status::Ready(r),
                |e| {
                    *st_err.status.write().unwrap_or_else(|p| p.into_inner()) = Status::Failed(e);
                    notify.notify_one();
                },
            )
        })
        .map_err(|e| format!("starting the engine thread: {e}"))?;
    let app = http::router(state.clone());
    let st = state.clone();
    let stop = async move {
        tokio::select! {
            _ = shutdown => {}
            _ = failed.notified() => {}
        }
        st.stopping
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = st.cmd.send(Cmd::Shutdown);
    };
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
        .map_err(|e| format!("serving: {e}"));
    let _ = state.cmd.send(Cmd::Shutdown);
    let _ = tokio::task::spawn_blocking(move || engine_thread.join()).await;
    served?;
    let status = state.status.read().unwrap_or_else(|p| p.into_inner());
    match &*status {
        Status::Failed(e) => Err(e.clone()),
        _ => Ok(()),
    }
}

/// A server on its own thread and tokio runtime (tests, embedding): listening on `addr`
/// (port 0 = any free port) at once, loading the model in the background.
pub struct RunningServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl RunningServer {
    pub fn start(addr: SocketAddr, cfg: ServeConfig, load: Loader) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("ferrite-serve".into())
            .spawn(move || {
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .map_err(|e| format!("listening: {e}"))?;
                    serve(listener, cfg, load, async move {
                        let _ = stopped.await;
                    })
                    .await
                })
            })?;
        Ok(RunningServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Shuts down (as on SIGTERM) and waits for the server to end.
    pub fn stop(mut self) -> Result<(), String> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), String> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| "the server thread panicked".to_string())?,
            None => Ok(()),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}
