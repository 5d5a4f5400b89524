//! The Trainer: `fit` (train and validation loaders, epochs or steps), `evaluate` and
//! `predict` over a model, a loss, an optimizer, an optional scheduler, metrics and callbacks.
//!
//! What a run shows and keeps (in `out_dir`, when set):
//! - a model summary, then a progress bar per epoch (step, loss, metrics, samples/s,
//!   data-wait share, ETA) and a Keras-style line per epoch;
//! - `log.jsonl`: one record per logged step and one per epoch;
//! - checkpoints `checkpoints/<name>/` (model and optimizer as safetensors, `trainer.json`
//!   with epoch, step, scheduler, loader position, callback states and history); resuming
//!   from one continues bit-exactly;
//! - Ctrl-C (after [`install_ctrl_c`]) writes the `last` checkpoint and returns
//!   [`FitOutcome::Interrupted`]; a non-finite loss stops the run naming the step and keeps
//!   the last good checkpoint.
//!
//! The loss is read back (one host wait) only at logging steps.

use crate::data::{Batch, DataLoader, LoaderState};
use crate::grad_scaler::{GradScaler, GradScalerConfig};
use crate::lr_scheduler::{LrScheduler, ParamGroups, ReduceLROnPlateau};
use crate::metrics::Metric;
use crate::optim::Optimizer;
use crate::{Error, Result};
use ferrite_core::{DType, Device, Tensor};
use ferrite_nn::{Module, ModuleExt};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Logged values by name (`loss`, `acc`, `val_loss`, `val_acc`, `lr`, ...).
pub type Logs = BTreeMap<String, f64>;

/// `(predictions, targets) -> scalar loss`.
pub type LossFn = Box<dyn Fn(&Tensor, &Tensor) -> ferrite_core::Result<Tensor> + Send>;

/// Makes a fresh metric (one set for training, one for validation).
pub type MetricFactory = Box<dyn Fn() -> Box<dyn Metric> + Send>;

static STOP: AtomicBool = AtomicBool::new(false);

/// Asks a running `fit` to checkpoint and return at the next step (what Ctrl-C does).
pub fn request_stop() {
    STOP.store(true, Ordering::SeqCst);
}

/// Makes Ctrl-C call [`request_stop`] (a second Ctrl-C exits at once).
pub fn install_ctrl_c() -> Result<()> {
    ctrlc::set_handler(|| {
        if STOP.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!("\ninterrupted: writing a checkpoint (Ctrl-C again to exit at once)");
    })
    .map_err(|e| Error::config("Trainer", format!("cannot install the Ctrl-C handler: {e}")))
}

/// When a scheduler steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interval {
    Step,
    Epoch,
}

/// A learning-rate schedule driven by the Trainer.
pub enum Schedule {
    Lr(LrScheduler, Interval),
    /// Fed `monitor` (e.g. `val_loss`) at the end of each epoch.
    Plateau(ReduceLROnPlateau, String),
}

/// What a callback asks of the Trainer at the end of an epoch.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Stop,
    /// Write checkpoint `name` (`checkpoints/<name>/`).
    Save(String),
    /// Delete checkpoint `name`.
    Remove(String),
    /// Remember the current weights (in device memory) as the best.
    KeepWeights,
    /// Load the remembered weights back.
    RestoreWeights,
}

/// Called at the end of every epoch with its logs.
pub trait Callback: Send {
    fn name(&self) -> &'static str;
    fn on_epoch_end(&mut self, epoch: usize, logs: &Logs) -> Result<Vec<Action>>;
    /// State kept in checkpoints.
    fn state(&self) -> Value;
    fn load_state(&mut self, v: &Value) -> Result<()>;
}

/// Whether lower or higher is better for a monitored value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Min,
    Max,
}

fn monitored(what: &'static str, logs: &Logs, key: &str) -> Result<f64> {
    logs.get(key).copied().ok_or_else(|| {
        Error::config(
            what,
            format!(
                "monitors `{key}`, which the epoch did not log (logged: {})",
                logs.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        )
    })
}

/// Stops when `monitor` has not improved by more than `min_delta` for `patience` epochs
/// (Keras' EarlyStopping); with `restore_best`, the best epoch's weights are loaded back.
pub struct EarlyStopping {
    pub monitor: String,
    pub mode: Mode,
    pub patience: usize,
    pub min_delta: f64,
    pub restore_best: bool,
    best: Option<f64>,
    wait: usize,
}

impl EarlyStopping {
    pub fn new(
        monitor: &str,
        mode: Mode,
        patience: usize,
        min_delta: f64,
        restore_best: bool,
    ) -> Result<EarlyStopping> {
        if !(min_delta.is_finite() && min_delta >= 0.0) {
            return Err(Error::config(
                "EarlyStopping",
                format!("min_delta must be finite and >= 0, got {min_delta}"),
            ));
        }
        Ok(EarlyStopping {
            monitor: monitor.into(),
            mode,
            patience,
            min_delta,
            restore_best,
            best: None,
            wait: 0,
        })
    }
}

impl Callback for EarlyStopping {
    fn name(&self) -> &'static str {
        "EarlyStopping"
    }

    fn on_epoch_end(&mut self, _epoch: usize, logs: &Logs) -> Result<Vec<Action>> {
        let v = monitored("EarlyStopping", logs, &self.monitor)?;
        let better = match (self.best, self.mode) {
            (None, _) => true,
            (Some(b), Mode::Min) => v < b - self.min_delta,
            (Some(b), Mode::Max) => v > b + self.min_delta,
        };
        if better {
            self.best = Some(v);
            self.wait = 0;
            return Ok(if self.restore_best {
                vec![Action::KeepWeights]
            } else {
                vec![]
            });
        }
        self.wait += 1;
        if self.wait >= self.patience {
            let mut a = vec![Action::Stop];
            if self.restore_best {
                a.push(Action::RestoreWeights);
            }
            return Ok(a);
        }
        Ok(vec![])
    }

    fn state(&self) -> Value {
        json!({"best": self.best, "wait": self.wait})
    }

    fn load_state(&mut self, v: &Value) -> Result<()> {
        self.best = v.get("best").and_then(Value::as_f64);
        self.wait = v.get("wait").and_then(Value::as_u64).unwrap_or(0) as usize;
        Ok(())
    }
}

/// Keeps the `top_k` best checkpoints by `monitor` (`best-epoch<N>`), and `last` when asked.
pub struct ModelCheckpoint {
    pub monitor: String,
    pub mode: Mode,
    pub top_k: usize,
    pub save_last: bool,
    kept: Vec<(f64, String)>,
}

impl ModelCheckpoint {
    pub fn new(monitor: &str, mode: Mode, top_k: usize, save_last: bool) -> ModelCheckpoint {
        ModelCheckpoint {
            monitor: monitor.into(),
            mode,
            top_k,
            save_last,
            kept: Vec::new(),
        }
    }

    /// Checkpoints kept, best first.
    pub fn kept(&self) -> Vec<String> {
        self.kept.iter().map(|(_, n)| n.clone()).collect()
    }
}

impl Callback for ModelCheckpoint {
    fn name(&self) -> &'static str {
        "ModelCheckpoint"
    }

    fn on_epoch_end(&mut self, epoch: usize, logs: &Logs) -> Result<Vec<Action>> {
        let mut actions = Vec::new();
        if self.top_k > 0 {
            let v = monitored("ModelCheckpoint", logs, &self.monitor)?;
            let name = format!("best-epoch{epoch}");
            self.kept.push((v, name.clone()));
            let mode = self.mode;
            self.kept.sort_by(|a, b| match mode {
                Mode::Min => a.0.total_cmp(&b.0),
                Mode::Max => b.0.total_cmp(&a.0),
            });
            if self
                .kept
                .iter()
                .position(|(_, n)| *n == name)
                .is_some_and(|i| i < self.top_k)
            {
                actions.push(Action::Save(name));
            }
            while self.kept.len() > self.top_k {
                if let Some((_, n)) = self.kept.pop() {
                    if n != format!("best-epoch{epoch}") {
                        actions.push(Action::Remove(n));
                    }
                }
            }
        }
        if self.save_last {
            actions.push(Action::Save("last".into()));
        }
        Ok(actions)
    }

    fn state(&self) -> Value {
        json!({"kept": self.kept})
    }

    fn load_state(&mut self, v: &Value) -> Result<()> {
        self.kept = v
            .get("kept")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|p| Some((p.get(0)?.as_f64()?, p.get(1)?.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        Ok(())
    }
}

/// The arithmetic of a training run. Parameters, gradients and optimizer state stay in the
/// parameters' dtype (f32 masters) in every mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// Everything in the parameters' dtype.
    #[default]
    F32,
    /// bf16 autocast of the forward pass (`ferrite_core::autocast`): matmul, convolution and
    /// attention in bf16, everything else in f32. No loss scaling (bf16 has f32's range).
    Bf16,
    /// f16 autocast of the forward pass plus dynamic loss scaling (`GradScaler`): the loss is
    /// scaled before backward, gradients are unscaled inside the optimizer's fused step
    /// (before clipping), and a step with inf/NaN gradients is skipped on the device while
    /// the scale backs off.
    Fp16,
}

impl Precision {
    /// The names `--precision` takes, in the order usage lists them.
    pub const NAMES: [&'static str; 3] = ["f32", "bf16", "fp16"];

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }

    /// `f32`, `bf16` or `fp16` (also `f16`); anything else is an error listing the choices.
    pub fn parse(s: &str) -> Result<Precision> {
        match s {
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            "fp16" | "f16" => Ok(Precision::Fp16),
            _ => Err(Error::config(
                "--precision",
                format!(
                    "unknown precision `{s}` (expected one of: {})",
                    Precision::NAMES.join(", ")
                ),
            )),
        }
    }

    /// The autocast dtype of the forward pass, if any.
    pub fn autocast_dtype(self) -> Option<DType> {
        match self {
            Precision::F32 => None,
            Precision::Bf16 => Some(DType::BF16),
            Precision::Fp16 => Some(DType::F16),
        }
    }

    /// Runs `f` (a forward pass) under this precision's autocast scope.
    pub fn run<R>(self, f: impl FnOnce() -> ferrite_core::Result<R>) -> ferrite_core::Result<R> {
        self.run_prefetched(&[], f)
    }

    /// `run` for a training step's forward pass over the model with parameters `params`:
    /// under autocast, the casts of those the previous forward pass cast are made first, in
    /// one op (`ferrite_core::autocast::prefetch`), rather than one a weight.
    pub fn run_prefetched<R>(
        self,
        params: &[Tensor],
        f: impl FnOnce() -> ferrite_core::Result<R>,
    ) -> ferrite_core::Result<R> {
        match self.autocast_dtype() {
            Some(d) => ferrite_core::autocast(d, || {
                ferrite_core::autocast::prefetch(params)?;
                f()
            })?,
            None => f(),
        }
    }
}

/// How long and how a run goes.
#[derive(Clone, Debug)]
pub struct TrainerConfig {
    pub epochs: usize,
    /// Stop after this many optimizer steps in all (across epochs).
    pub max_steps: Option<usize>,
    /// Read the loss back and log every this many steps.
    pub log_every: usize,
    /// Micro-batches per optimizer step (gradients accumulate; each loss is scaled by 1/k).
    pub grad_accum: usize,
    pub out_dir: Option<PathBuf>,
    /// Progress bars on standard error (hidden when it is not a terminal).
    pub progress: bool,
    /// Write `checkpoints/last` at the end of every epoch.
    pub checkpoint_every_epoch: bool,
    /// Rewrite PNG curves of every logged quantity in `<out_dir>/plots/` after each epoch
    /// (`plot.rs`).
    pub plot: bool,
    /// f32, or mixed precision: bf16 autocast, or f16 autocast with loss scaling.
    pub precision: Precision,
    /// The loss scaler's settings (used with `Precision::Fp16`).
    pub grad_scaler: GradScalerConfig,
    /// CUDA only: after `GRAPH_WARMUP` eager steps for a batch shape, capture the whole step
    /// (forward, loss, backward, clipping, optimizer and scaler update) as one CUDA graph
    /// and replay it for every batch of that shape; other shapes run eagerly. See the capture
    /// rules in docs/training.md.
    pub cuda_graph: bool,
}

/// Eager steps run for a batch shape before its step is captured (the optimizer's state is
/// created by the first; the allocator's pool and the kernels are warm after these).
pub const GRAPH_WARMUP: usize = 3;

/// Batch shapes whose step is kept captured (each graph keeps its step's memory); further
/// shapes run eagerly.
pub const MAX_GRAPHS: usize = 4;

/// A training step captured for one batch shape: the batch is copied into `x` and `y`, then
/// `graph` replays forward, backward and the update; its outputs are the loss and the
/// predictions.
struct CapturedStep {
    key: Vec<(Vec<usize>, DType)>,
    x: Tensor,
    y: Tensor,
    graph: ferrite_cuda::Graph,
}

fn batch_key(x: &Tensor, y: &Tensor) -> Vec<(Vec<usize>, DType)> {
    vec![
        (x.dims().to_vec(), x.dtype()),
        (y.dims().to_vec(), y.dtype()),
    ]
}

impl TrainerConfig {
    pub fn new(epochs: usize) -> TrainerConfig {
        TrainerConfig {
            epochs,
            max_steps: None,
            log_every: 50,
            grad_accum: 1,
            out_dir: None,
            progress: true,
            checkpoint_every_epoch: true,
            plot: false,
            precision: Precision::F32,
            grad_scaler: GradScalerConfig::default(),
            cuda_graph: false,
        }
    }
}

/// How `fit` ended.
#[derive(Clone, Debug, PartialEq)]
pub enum FitOutcome {
    /// Every epoch (or `max_steps`) ran.
    Completed,
    /// A callback stopped the run after this epoch.
    EarlyStopped(usize),
    /// Ctrl-C or `request_stop`: the `last` checkpoint holds the run.
    Interrupted,
}

/// A model with everything needed to train it.
pub struct Trainer {
    pub model: Box<dyn Module>,
    pub optimizer: Optimizer,
    pub schedule: Option<Schedule>,
    pub loss: LossFn,
    pub metrics: Vec<MetricFactory>,
    pub callbacks: Vec<Box<dyn Callback>>,
    pub cfg: TrainerConfig,
    /// The loss scaler of an fp16 run.
    scaler: Option<GradScaler>,
    /// The captured steps by batch shape (`cuda_graph`), and the eager steps run per shape.
    captured: Vec<CapturedStep>,
    warm: std::collections::HashMap<Vec<(Vec<usize>, DType)>, usize>,
    replays: usize,
    device: Device,
    epoch: usize,
    step: usize,
    /// Per logged step: (step, loss); per epoch: its logs.
    pub step_losses: Vec<(usize, f64)>,
    pub history: Vec<Logs>,
    best_weights: Option<Vec<(String, Tensor)>>,
    resume_loader: Option<LoaderState>,
}

fn summary(model: &(dyn Module + 'static)) -> String {
    let params = model.named_parameters();
    let total: usize = params.iter().map(|(_, p)| p.elem_count()).sum();
    let trainable: usize = params
        .iter()
        .filter(|(_, p)| p.requires_grad())
        .map(|(_, p)| p.elem_count())
        .sum();
    let mut s = format!(
        "{}: {} parameter tensors\n",
        model.type_name(),
        params.len()
    );
    for (name, p) in &params {
        s.push_str(&format!(
            "  {name:<40} {:<18} {:>12}\n",
            format!("{:?}", p.dims()),
            p.elem_count()
        ));
    }
    s.push_str(&format!("  trainable parameters: {trainable} of {total}\n"));
    s
}

fn fmt_logs(logs: &Logs) -> String {
    logs.iter()
        .filter(|(k, _)| k.as_str() != "epoch")
        .map(|(k, v)| format!("{k}: {v:.4}"))
        .collect::<Vec<_>>()
        .join(" - ")
}

impl Trainer {
    pub fn new(
        model: Box<dyn Module>,
        optimizer: Optimizer,
        loss: LossFn,
        device: &Device,
        cfg: TrainerConfig,
    ) -> Result<Trainer> {
        if cfg.log_every == 0 || cfg.grad_accum == 0 {
            return Err(Error::config(
                "Trainer",
                format!(
                    "log_every and grad_accum must be at least 1, got {} and {}",
                    cfg.log_every, cfg.grad_accum
                ),
            ));
        }
        if cfg.cuda_graph {
            if ferrite_cuda::CudaDevice::from_device(device).is_none() {
                return Err(Error::config(
                    "Trainer",
                    format!("cuda_graph captures the step on a CUDA device, got {device}"),
                ));
            }
            if cfg.grad_accum != 1 {
                return Err(Error::config(
                    "Trainer",
                    format!(
                        "cuda_graph captures one batch per step: grad_accum must be 1, got {}",
                        cfg.grad_accum
                    ),
                ));
            }
        }
        let scaler = match cfg.precision {
            Precision::Fp16 => Some(GradScaler::new(cfg.grad_scaler, device)?),
            _ => None,
        };
        Ok(Trainer {
            model,
            optimizer,
            schedule: None,
            loss,
            metrics: Vec::new(),
            callbacks: Vec::new(),
            cfg,
            scaler,
            captured: Vec::new(),
            warm: std::collections::HashMap::new(),
            replays: 0,
            device: device.clone(),
            epoch: 0,
            step: 0,
            step_losses: Vec::new(),
            history: Vec::new(),
            best_weights: None,
            resume_loader: None,
        })
    }

    /// Epochs completed.
    pub fn epoch(&self) -> usize {
        self.epoch
    }

    /// Optimizer steps taken (with fp16, skipped steps included, as PyTorch counts them).
    pub fn step(&self) -> usize {
        self.step
    }

    /// The loss scaler of an fp16 run.
    pub fn scaler(&self) -> Option<&GradScaler> {
        self.scaler.as_ref()
    }

    /// Steps run by replaying a captured graph (`cuda_graph`).
    pub fn graph_replays(&self) -> usize {
        self.replays
    }

    fn log_line(&self, record: Value) -> Result<()> {
        let Some(dir) = &self.cfg.out_dir else {
            return Ok(());
        };
        let path = dir.join("log.jsonl");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::data("Trainer", format!("cannot write {}: {e}", path.display())))?;
        writeln!(f, "{record}")
            .map_err(|e| Error::data("Trainer", format!("cannot write {}: {e}", path.display())))
    }

    /// Trains for the configured epochs (or steps), validating after each epoch.
    pub fn fit(
        &mut self,
        train: &mut DataLoader,
        mut val: Option<&mut DataLoader>,
    ) -> Result<FitOutcome> {
        if let Some(dir) = &self.cfg.out_dir {
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::data("Trainer", format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        if let Some(s) = self.resume_loader.take() {
            train.load_state(s)?;
        }
        if self.cfg.progress {
            eprint!("{}", summary(&*self.model));
        }
        STOP.store(false, Ordering::SeqCst);
        while self.epoch < self.cfg.epochs {
            if self.cfg.max_steps.is_some_and(|m| self.step >= m) {
                break;
            }
            let epoch = self.epoch;
            self.model.train();
            let mut train_metrics: Vec<Box<dyn Metric>> =
                self.metrics.iter().map(|f| f()).collect();
            let batches = train.len();
            let bar = self.progress_bar(batches, epoch);
            let started = Instant::now();
            let mut samples = 0usize;
            let mut loss_sum: Option<Tensor> = None;
            let mut loss_count = 0usize;
            let mut micro = 0usize;
            let mut last_log = (Instant::now(), 0usize);
            let mut it = train.iter(&self.device);
            let skip = batches - it.remaining();
            if let Some(b) = &bar {
                b.set_position(skip as u64);
            }
            let mut interrupted = false;
            while let Some(batch) = it.next() {
                let batch = batch?;
                let loss = match self.cfg.cuda_graph {
                    true => self.graph_step(&batch, &mut train_metrics)?,
                    false => self.train_batch(&batch, &mut train_metrics)?,
                };
                micro += 1;
                samples += batch.size;
                loss_count += 1;
                loss_sum = Some(match loss_sum {
                    Some(s) => s.add(&loss)?,
                    None => loss.clone(),
                });
                if micro.is_multiple_of(self.cfg.grad_accum) {
                    if !self.cfg.cuda_graph {
                        self.optimizer_step()?;
                    }
                    if self.step.is_multiple_of(self.cfg.log_every) {
                        let l = loss.to_vec_f64()?[0];
                        self.check_loss(l)?;
                        self.step_losses.push((self.step, l));
                        let dt = last_log.0.elapsed().as_secs_f64().max(1e-9);
                        let rate = (samples - last_log.1) as f64 / dt;
                        last_log = (Instant::now(), samples);
                        let wait = it.data_wait().as_secs_f64()
                            / started.elapsed().as_secs_f64().max(1e-9);
                        let mut record = json!({"kind": "step", "epoch": epoch, "step": self.step, "loss": l, "lr": self.optimizer.lr(0), "samples_per_s": rate, "data_wait": wait});
                        if let Some(s) = &self.scaler {
                            let (scale, skipped) = s.read()?;
                            record["loss_scale"] = json!(scale);
                            record["skipped_steps"] = json!(skipped);
                        }
                        self.log_line(record)?;
                        if let Some(b) = &bar {
                            b.set_message(format!(
                                "loss {l:.4} | {rate:.0} samples/s | data wait {:.0}%",
                                wait * 100.0
                            ));
                        }
                    }
                    if STOP.load(Ordering::SeqCst) {
                        interrupted = true;
                        break;
                    }
                    if self.cfg.max_steps.is_some_and(|m| self.step >= m) {
                        break;
                    }
                }
                if let Some(b) = &bar {
                    b.inc(1);
                }
            }
            let data_wait = it.data_wait();
            let finished_epoch = it.remaining() == 0;
            drop(it);
            if let Some(b) = &bar {
                b.finish_and_clear();
            }
            if interrupted {
                self.save_checkpoint("last", train.state())?;
                return Ok(FitOutcome::Interrupted);
            }
            if !finished_epoch {
                // max_steps ended the run inside the epoch.
                self.save_if_out("last", train.state())?;
                return Ok(FitOutcome::Completed);
            }
            let mut logs = Logs::new();
            if let Some(s) = loss_sum {
                let mean = s.to_vec_f64()?[0] / loss_count.max(1) as f64;
                self.check_loss(mean)?;
                logs.insert("loss".into(), mean);
            }
            for m in &train_metrics {
                logs.insert(m.name(), m.compute()?);
            }
            // Training time: up to the epoch's loss read back (the device has finished its
            // steps), before validation; throughput and data wait are shares of it.
            let secs = started.elapsed().as_secs_f64();
            let validated = Instant::now();
            if let Some(v) = val.as_deref_mut() {
                for (k, x) in self.evaluate(v)? {
                    logs.insert(format!("val_{k}"), x);
                }
            }
            let val_secs = validated.elapsed().as_secs_f64();
            logs.insert("lr".into(), self.optimizer.lr(0));
            logs.insert("samples_per_s".into(), samples as f64 / secs.max(1e-9));
            logs.insert("data_wait".into(), data_wait.as_secs_f64() / secs.max(1e-9));
            self.epoch += 1;
            self.after_epoch(&logs)?;
            if self.cfg.progress {
                eprintln!(
                    "epoch {}/{} - {:.1}s (+{:.1}s validation) - {}",
                    self.epoch,
                    self.cfg.epochs,
                    secs,
                    val_secs,
                    fmt_logs(&logs)
                );
            }
            let mut record = json!({"kind": "epoch", "epoch": epoch, "step": self.step});
            for (k, v) in &logs {
                record[k] = json!(v);
            }
            self.log_line(record)?;
            self.history.push(logs.clone());
            if let (true, Some(dir)) = (self.cfg.plot, &self.cfg.out_dir) {
                crate::plot::write_plots(&self.history, dir)?;
            }
            let mut stop = false;
            let mut actions = Vec::new();
            for cb in &mut self.callbacks {
                actions.extend(cb.on_epoch_end(epoch, &logs)?);
            }
            for a in actions {
                match a {
                    Action::Stop => stop = true,
                    Action::Save(name) => self.save_if_out(&name, train.state())?,
                    Action::Remove(name) => {
                        if let Some(d) = &self.cfg.out_dir {
                            let _ = std::fs::remove_dir_all(d.join("checkpoints").join(name));
                        }
                    }
                    Action::KeepWeights => {
                        self.best_weights = Some(
                            ferrite_nn::state_dict(&*self.model)
                                .into_iter()
                                .map(|(k, t)| Ok((k, t.copy()?)))
                                .collect::<ferrite_core::Result<_>>()?,
                        )
                    }
                    Action::RestoreWeights => {
                        if let Some(w) = &self.best_weights {
                            ferrite_nn::load_state_dict(&*self.model, w, true)?;
                        }
                    }
                }
            }
            if self.cfg.checkpoint_every_epoch {
                self.save_if_out("last", train.state())?;
            }
            if stop {
                return Ok(FitOutcome::EarlyStopped(epoch));
            }
        }
        Ok(FitOutcome::Completed)
    }

    fn progress_bar(&self, len: usize, epoch: usize) -> Option<indicatif::ProgressBar> {
        if !self.cfg.progress {
            return None;
        }
        let b = indicatif::ProgressBar::new(len as u64);
        let style = indicatif::ProgressStyle::with_template(
            "epoch {prefix} [{bar:30}] {pos}/{len} {msg} (eta {eta})",
        )
        .map(|s| s.progress_chars("=> "));
        if let Ok(s) = style {
            b.set_style(s);
        }
        b.set_prefix(format!("{}/{}", epoch + 1, self.cfg.epochs));
        Some(b)
    }

    /// Forward, loss and backward of one micro-batch; returns the (unscaled) loss.
    fn train_batch(&mut self, batch: &Batch, metrics: &mut [Box<dyn Metric>]) -> Result<Tensor> {
        let (x, y) = split(batch)?;
        let (model, loss_fn) = (&self.model, &self.loss);
        let params = autocast_params(self.cfg.precision, model.as_ref());
        let (preds, loss) = self.cfg.precision.run_prefetched(&params, || {
            let p = model.forward(x)?;
            let l = loss_fn(&p, y)?;
            Ok((p, l))
        })?;
        let mut scaled = if self.cfg.grad_accum > 1 {
            loss.mul_scalar(1.0 / self.cfg.grad_accum as f64)?
        } else {
            loss.clone()
        };
        if let Some(s) = &self.scaler {
            scaled = s.scale(&scaled)?;
        }
        ferrite_autodiff::backward(&scaled)?;
        let p = preds.detach();
        for m in metrics.iter_mut() {
            m.update(&p, y)?;
        }
        Ok(loss.detach())
    }

    fn optimizer_step(&mut self) -> Result<()> {
        match &mut self.scaler {
            Some(s) => s.step(&mut self.optimizer)?,
            None => self.optimizer.step()?,
        }
        self.optimizer.zero_grad();
        self.after_update()
    }

    /// Step count and per-step schedule, after an update (eager or replayed).
    fn after_update(&mut self) -> Result<()> {
        self.step += 1;
        if let Some(Schedule::Lr(s, Interval::Step)) = &mut self.schedule {
            s.step(&mut self.optimizer)?;
        }
        Ok(())
    }

    /// One whole step with `cuda_graph`: a replay of the step captured for this batch shape;
    /// else an eager step (the first `GRAPH_WARMUP` for a shape), then a capture and its first
    /// replay. Returns the (unscaled) loss, a device scalar.
    fn graph_step(&mut self, batch: &Batch, metrics: &mut [Box<dyn Metric>]) -> Result<Tensor> {
        let (x, y) = split(batch)?;
        let key = batch_key(x, y);
        if let Some(i) = self.captured.iter().position(|c| c.key == key) {
            return self.replay(i, x, y, metrics, false);
        }
        let warm = self.warm.entry(key.clone()).or_insert(0);
        if *warm < GRAPH_WARMUP || self.captured.len() >= MAX_GRAPHS {
            *warm += 1;
            let before = self.model.rng_states();
            let loss = self.train_batch(batch, metrics)?;
            self.optimizer_step()?;
            if self.model.rng_states() != before {
                return Err(Error::config(
                    "Trainer",
                    "cuda_graph: the model draws random numbers in training (dropout with p > 0), which a replayed step would repeat; train without cuda_graph or without dropout",
                ));
            }
            return Ok(loss);
        }
        let cuda = ferrite_cuda::CudaDevice::from_device(&self.device)
            .ok_or_else(|| Error::config("Trainer", "cuda_graph needs a CUDA device"))?;
        // The graph's inputs: buffers of its own, written with each batch before a replay.
        let (xs, ys) = (x.copy()?, y.copy()?);
        let Trainer {
            model,
            loss,
            optimizer,
            scaler,
            cfg,
            ..
        } = self;
        let precision = cfg.precision;
        let te = |e: Error| ferrite_core::Error::backend("Trainer step", e.to_string());
        let params = autocast_params(precision, model.as_ref());
        let graph = cuda.capture(|| {
            let (preds, l) = precision.run_prefetched(&params, || {
                let p = model.forward(&xs)?;
                let l = loss(&p, &ys)?;
                Ok((p, l))
            })?;
            let scaled = match scaler.as_ref() {
                Some(s) => s.scale(&l).map_err(te)?,
                None => l.clone(),
            };
            ferrite_autodiff::backward(&scaled)?;
            match scaler.as_mut() {
                Some(s) => s.step(optimizer).map_err(te)?,
                None => optimizer.step().map_err(te)?,
            }
            Ok(vec![l.detach(), preds.detach()])
        })?;
        // The captured backward left gradients in the slots (their blocks stay with the graph,
        // which rewrites them on every replay); eager steps start from empty slots.
        self.optimizer.zero_grad();
        self.captured.push(CapturedStep {
            key,
            x: xs,
            y: ys,
            graph,
        });
        // The capture's `Optimizer::step` counted this step on the host already.
        self.replay(self.captured.len() - 1, x, y, metrics, true)
    }

    /// Copies the batch into captured step `i`'s inputs and replays it.
    fn replay(
        &mut self,
        i: usize,
        x: &Tensor,
        y: &Tensor,
        metrics: &mut [Box<dyn Metric>],
        counted: bool,
    ) -> Result<Tensor> {
        let Some(c) = self.captured.get(i) else {
            return Err(Error::state("Trainer", "no captured step to replay"));
        };
        c.x.copy_(x)?;
        c.y.copy_(y)?;
        c.graph.replay()?;
        let (loss, preds) = match c.graph.outputs() {
            [l, p] => (l.copy()?, p.clone()),
            _ => {
                return Err(Error::state(
                    "Trainer",
                    "the captured step lost its outputs",
                ))
            }
        };
        for m in metrics.iter_mut() {
            m.update(&preds, y)?;
        }
        if !counted {
            self.optimizer.count_replayed_step();
        }
        self.replays += 1;
        self.after_update()?;
        Ok(loss)
    }

    fn after_epoch(&mut self, logs: &Logs) -> Result<()> {
        match &mut self.schedule {
            Some(Schedule::Lr(s, Interval::Epoch)) => s.step(&mut self.optimizer)?,
            Some(Schedule::Plateau(s, key)) => {
                let v = monitored("ReduceLROnPlateau", logs, key)?;
                s.step(v, &mut self.optimizer)?
            }
            _ => {}
        }
        Ok(())
    }

    fn check_loss(&self, l: f64) -> Result<()> {
        if l.is_finite() {
            self.optimizer.check_finite()
        } else {
            let kept = match &self.cfg.out_dir {
                Some(d) if d.join("checkpoints").join("last").exists() => {
                    format!(
                        "; the last good checkpoint is {}",
                        d.join("checkpoints").join("last").display()
                    )
                }
                _ => String::new(),
            };
            Err(Error::state(
                "Trainer",
                format!(
                    "the loss is {l} at step {}: training stopped{kept}",
                    self.step
                ),
            ))
        }
    }

    /// Mean loss and metrics over a loader, in eval mode, without recording gradients.
    pub fn evaluate(&mut self, loader: &mut DataLoader) -> Result<Logs> {
        self.model.eval();
        let mut metrics: Vec<Box<dyn Metric>> = self.metrics.iter().map(|f| f()).collect();
        let mut sum: Option<Tensor> = None;
        let mut n = 0usize;
        let loss_fn = &self.loss;
        let model = &self.model;
        let precision = self.cfg.precision;
        for batch in loader.iter(&self.device) {
            let batch = batch?;
            let (x, y) = split(&batch)?;
            let (preds, loss) = ferrite_core::no_grad(|| {
                precision.run(|| -> ferrite_core::Result<(Tensor, Tensor)> {
                    let p = model.forward(x)?;
                    let l = loss_fn(&p, y)?;
                    Ok((p, l))
                })
            })?;
            for m in metrics.iter_mut() {
                m.update(&preds, y)?;
            }
            sum = Some(match sum {
                Some(s) => s.add(&loss)?,
                None => loss,
            });
            n += 1;
        }
        self.model.train();
        let mut logs = Logs::new();
        if let Some(s) = sum {
            logs.insert("loss".into(), s.to_vec_f64()?[0] / n as f64);
        }
        for m in &metrics {
            logs.insert(m.name(), m.compute()?);
        }
        Ok(logs)
    }

    /// The model's outputs for every batch of a loader (eval mode, no gradients).
    pub fn predict(&mut self, loader: &mut DataLoader) -> Result<Vec<Tensor>> {
        self.model.eval();
        let mut out = Vec::new();
        for batch in loader.iter(&self.device) {
            let batch = batch?;
            let x = batch
                .fields
                .first()
                .ok_or_else(|| Error::data("Trainer", "a batch has no fields"))?;
            let (model, precision) = (&self.model, self.cfg.precision);
            out.push(ferrite_core::no_grad(|| {
                precision.run(|| model.forward(x))
            })?);
        }
        self.model.train();
        Ok(out)
    }

    fn save_if_out(&self, name: &str, loader: LoaderState) -> Result<()> {
        if self.cfg.out_dir.is_some() {
            self.save_checkpoint(name, loader)?;
        }
        Ok(())
    }

    /// Writes `out_dir/checkpoints/<name>/`: `model.safetensors`, `optimizer.safetensors` and
    /// `trainer.json`, into a temporary folder renamed into place (a crash never leaves half
    /// a checkpoint).
    pub fn save_checkpoint(&self, name: &str, loader: LoaderState) -> Result<PathBuf> {
        let Some(out) = &self.cfg.out_dir else {
            return Err(Error::config("Trainer", "save_checkpoint needs out_dir"));
        };
        let root = out.join("checkpoints");
        let dir = root.join(name);
        let tmp = root.join(format!(".{name}.tmp"));
        let io = |e: std::io::Error, p: &Path| {
            Error::data("Trainer", format!("checkpoint {}: {e}", p.display()))
        };
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| io(e, &tmp))?;
        ferrite_nn::save_state_dict(&*self.model, tmp.join("model.safetensors"))?;
        let (opt_tensors, opt_meta) = self.optimizer.state_dict()?;
        let opt_list: Vec<(String, Tensor)> = opt_tensors.into_iter().collect();
        ferrite_nn::safetensors::save(&opt_list, tmp.join("optimizer.safetensors"))?;
        let schedule = match &self.schedule {
            Some(Schedule::Lr(s, _)) => s.state_dict(),
            Some(Schedule::Plateau(s, _)) => s.state_dict(),
            None => Value::Null,
        };
        let state = json!({
            "format": "ferrite-checkpoint-1",
            "model": self.model.type_name(),
            "parameters": self.model.named_parameters().iter().map(|(n, p)| json!([n, p.dims()])).collect::<Vec<_>>(),
            "epoch": self.epoch,
            "step": self.step,
            "loader": {"epoch": loader.epoch, "batch": loader.batch},
            "optimizer": opt_meta,
            "schedule": schedule,
            "precision": self.cfg.precision.name(),
            "grad_scaler": match &self.scaler {
                Some(s) => s.state_dict()?,
                None => Value::Null,
            },
            "callbacks": self.callbacks.iter().map(|c| json!({"name": c.name(), "state": c.state()})).collect::<Vec<_>>(),
            "history": self.history,
            "step_losses": self.step_losses,
            "rng": {
                "init": ferrite_nn::init::rng_state(),
                "modules": self.model.rng_states(),
            },
        });
        let tj = tmp.join("trainer.json");
        std::fs::write(&tj, serde_json::to_vec_pretty(&state).unwrap_or_default())
            .map_err(|e| io(e, &tj))?;
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&tmp, &dir).map_err(|e| io(e, &dir))?;
        Ok(dir)
    }

    /// Loads a checkpoint written by `save_checkpoint` into this trainer (same model and
    /// settings); the next `fit` continues where it stopped. Every mismatch (parameters,
    /// optimizer state, schedule kind) is listed in the error.
    pub fn resume(&mut self, dir: &Path) -> Result<()> {
        let what = "Trainer::resume";
        let tj = dir.join("trainer.json");
        let text = std::fs::read(&tj)
            .map_err(|e| Error::data(what, format!("cannot read {}: {e}", tj.display())))?;
        let state: Value = serde_json::from_slice(&text).map_err(|e| {
            Error::data(what, format!("{}: not a trainer state: {e}", tj.display()))
        })?;
        if state.get("format").and_then(Value::as_str) != Some("ferrite-checkpoint-1") {
            return Err(Error::data(
                what,
                format!("{} is not a ferrite checkpoint", tj.display()),
            ));
        }
        let saved_model = state.get("model").and_then(Value::as_str).unwrap_or("?");
        if saved_model != self.model.type_name() {
            return Err(Error::state(
                what,
                format!(
                    "checkpoint holds a {saved_model}, this model is a {}",
                    self.model.type_name()
                ),
            ));
        }
        let report =
            ferrite_nn::load_state_dict_file(&*self.model, dir.join("model.safetensors"), false)?;
        if !report.is_clean() {
            return Err(Error::state(
                what,
                format!("the checkpoint's model differs: {report}"),
            ));
        }
        let f = ferrite_nn::safetensors::SafetensorsFile::open(dir.join("optimizer.safetensors"))?;
        let tensors: BTreeMap<String, Tensor> = f.load_all(&self.device)?.into_iter().collect();
        self.optimizer
            .load_state_dict(&tensors, &state["optimizer"])?;
        match (&mut self.schedule, &state["schedule"]) {
            (Some(Schedule::Lr(s, _)), v) if !v.is_null() => s.load_state_dict(v)?,
            (Some(Schedule::Plateau(s, _)), v) if !v.is_null() => s.load_state_dict(v)?,
            (None, Value::Null) => {}
            (Some(_), _) => {
                return Err(Error::state(
                    what,
                    "the checkpoint has no schedule state, this run has a schedule",
                ))
            }
            (None, _) => {
                return Err(Error::state(
                    what,
                    "the checkpoint has a schedule, this run has none",
                ))
            }
        }
        // A scaler's state resumes an fp16 run; a checkpoint of an f32 or bf16 run starts the
        // scaler afresh (as PyTorch does when a GradScaler has no saved state).
        if let Some(s) = &mut self.scaler {
            if let Some(v) = state.get("grad_scaler").filter(|v| !v.is_null()) {
                s.load_state_dict(v)?;
            }
        }
        let cbs = state
            .get("callbacks")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for (cb, saved) in self.callbacks.iter_mut().zip(&cbs) {
            if saved.get("name").and_then(Value::as_str) == Some(cb.name()) {
                cb.load_state(&saved["state"])?;
            }
        }
        let u = |k: &str| state.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
        self.epoch = u("epoch");
        self.step = u("step");
        self.resume_loader = Some(LoaderState {
            epoch: state["loader"]["epoch"].as_u64().unwrap_or(0),
            batch: state["loader"]["batch"].as_u64().unwrap_or(0) as usize,
        });
        self.history = serde_json::from_value(state["history"].clone()).unwrap_or_default();
        if let Some(rng) = state.get("rng").filter(|v| !v.is_null()) {
            let bad = |e: serde_json::Error| {
                Error::data(what, format!("{}: rng state: {e}", tj.display()))
            };
            let modules: Vec<(String, u64)> =
                serde_json::from_value(rng["modules"].clone()).map_err(bad)?;
            let init: (u64, u64) = serde_json::from_value(rng["init"].clone()).map_err(bad)?;
            self.model.load_rng_states(&modules)?;
            ferrite_nn::init::set_rng_state(init);
        }
        self.step_losses = serde_json::from_value(state["step_losses"].clone()).unwrap_or_default();
        Ok(())
    }
}

fn split(batch: &Batch) -> Result<(&Tensor, &Tensor)> {
    match batch.fields.as_slice() {
        [x, y, ..] => Ok((x, y)),
        _ => Err(Error::data(
            "Trainer",
            format!(
                "a batch needs (input, target) fields, got {}",
                batch.fields.len()
            ),
        )),
    }
}

/// The settings `ferrite train` passes to a recipe (`examples/*.rs`).
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub epochs: usize,
    pub batch_size: usize,
    pub lr: f64,
    /// sgd, momentum (SGD with 0.9), adam, adamw, rmsprop, adagrad, lion, lamb.
    pub optimizer: String,
    pub device: Device,
    pub seed: u64,
    pub out: Option<PathBuf>,
    /// A checkpoint folder to continue from (`<out>/checkpoints/last`).
    pub resume: Option<PathBuf>,
    /// Recipe-specific: the input file (csv) and target column.
    pub file: Option<PathBuf>,
    pub target: Option<String>,
    /// csv: regression instead of classification.
    pub regression: bool,
    /// Stop after this many optimizer steps (for quick runs and tests).
    pub max_steps: Option<usize>,
    /// Progress bars and epoch lines on standard error.
    pub progress: bool,
    /// PNG loss and metric curves in `<out>/plots/`, rewritten each epoch.
    pub plot: bool,
    /// f32, bf16 (autocast) or fp16 (autocast and loss scaling).
    pub precision: Precision,
    /// CUDA: replay each step as one captured CUDA graph (`TrainerConfig::cuda_graph`).
    pub cuda_graph: bool,
}

impl RunOptions {
    /// The optimizer named by `optimizer` over `params` at `lr`, with PyTorch's defaults.
    pub fn make_optimizer(
        &self,
        params: Vec<(String, ferrite_nn::Parameter)>,
    ) -> Result<Optimizer> {
        use crate::optim::Rule;
        let rule = match self.optimizer.as_str() {
            "sgd" => Rule::sgd(),
            "momentum" => Rule::Sgd { momentum: 0.9, dampening: 0.0, nesterov: false, weight_decay: 0.0 },
            "adam" => Rule::adam(),
            "adamw" => Rule::adamw(),
            "rmsprop" => Rule::rmsprop(),
            "adagrad" => Rule::adagrad(),
            "lion" => Rule::lion(),
            "lamb" => Rule::lamb(),
            other => {
                return Err(Error::config(
                    "--optimizer",
                    format!("unknown optimizer `{other}` (sgd, momentum, adam, adamw, rmsprop, adagrad, lion, lamb)"),
                ))
            }
        };
        Optimizer::new(params, self.lr, rule)
    }

    /// A trainer config from these options.
    pub fn trainer_config(&self) -> TrainerConfig {
        TrainerConfig {
            max_steps: self.max_steps,
            out_dir: self.out.clone(),
            progress: self.progress,
            plot: self.plot,
            precision: self.precision,
            cuda_graph: self.cuda_graph,
            ..TrainerConfig::new(self.epochs)
        }
    }
}

/// The model's parameters as tensors when `precision` autocasts (for `run_prefetched`).
fn autocast_params(precision: Precision, model: &(dyn Module + 'static)) -> Vec<Tensor> {
    match precision.autocast_dtype() {
        Some(_) => model.parameters().iter().map(|p| p.tensor()).collect(),
        None => Vec::new(),
    }
}
