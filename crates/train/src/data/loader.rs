//! The DataLoader: batches of a dataset in sampler order, built by worker threads up to
//! `prefetch` batches ahead and uploaded to the device in order.

use super::{epoch_order, stack, Collate, Dataset, DrawContext, HostTensor, Sampler};
use crate::{Error, Result};
use ferrite_core::{Device, Tensor};
use std::collections::BTreeMap;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How a [`DataLoader`] batches its dataset (PyTorch's arguments).
#[derive(Clone)]
pub struct DataLoaderConfig {
    pub batch_size: usize,
    pub sampler: Sampler,
    pub drop_last: bool,
    /// Threads that build batches; 0 builds them on the caller's thread.
    pub num_workers: usize,
    /// Batches built ahead of the one being consumed (at least 1 with workers).
    pub prefetch: usize,
    /// Seed of the shuffling and of random transforms.
    pub seed: u64,
    pub collate: Option<Collate>,
}

impl DataLoaderConfig {
    /// Sequential order, two workers, two batches ahead.
    pub fn new(batch_size: usize) -> DataLoaderConfig {
        DataLoaderConfig {
            batch_size,
            sampler: Sampler::Sequential,
            drop_last: false,
            num_workers: 2,
            prefetch: 2,
            seed: 0,
            collate: None,
        }
    }

    /// A fresh permutation each epoch (PyTorch's `shuffle=True`).
    pub fn shuffle(mut self, seed: u64) -> DataLoaderConfig {
        self.sampler = Sampler::Random {
            replacement: false,
            num_samples: None,
        };
        self.seed = seed;
        self
    }
}

/// Where a loader stands: saved in checkpoints so that a resumed run continues with the next
/// batch of the same epoch order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoaderState {
    pub epoch: u64,
    /// Batches of `epoch` already handed out.
    pub batch: usize,
}

/// One batch on the device: the stacked fields, in the dataset's field order.
#[derive(Clone, Debug)]
pub struct Batch {
    pub fields: Vec<Tensor>,
    /// Examples in the batch.
    pub size: usize,
}

/// A dataset with a batching policy and a position.
pub struct DataLoader {
    dataset: Arc<dyn Dataset>,
    cfg: DataLoaderConfig,
    state: LoaderState,
}

impl DataLoader {
    pub fn new(dataset: Arc<dyn Dataset>, cfg: DataLoaderConfig) -> Result<DataLoader> {
        let what = "DataLoader";
        if cfg.batch_size == 0 {
            return Err(Error::config(what, "batch_size must be at least 1, got 0"));
        }
        if cfg.num_workers > 256 {
            return Err(Error::config(
                what,
                format!("num_workers must be at most 256, got {}", cfg.num_workers),
            ));
        }
        if cfg.num_workers > 0 && !(1..=64).contains(&cfg.prefetch) {
            return Err(Error::config(
                what,
                format!(
                    "prefetch must be in 1..=64 with workers, got {}",
                    cfg.prefetch
                ),
            ));
        }
        if dataset.is_empty() {
            return Err(Error::data(what, "the dataset is empty"));
        }
        cfg.sampler.validate(dataset.len())?;
        Ok(DataLoader {
            dataset,
            cfg,
            state: LoaderState { epoch: 0, batch: 0 },
        })
    }

    pub fn config(&self) -> &DataLoaderConfig {
        &self.cfg
    }

    pub fn dataset(&self) -> &Arc<dyn Dataset> {
        &self.dataset
    }

    /// Examples per epoch (what the sampler draws).
    pub fn samples_per_epoch(&self) -> usize {
        match &self.cfg.sampler {
            Sampler::Sequential => self.dataset.len(),
            Sampler::Random { num_samples, .. } => num_samples.unwrap_or(self.dataset.len()),
            Sampler::Weighted { num_samples, .. } => *num_samples,
        }
    }

    /// Batches per epoch.
    pub fn len(&self) -> usize {
        let n = self.samples_per_epoch();
        let b = self.cfg.batch_size;
        if self.cfg.drop_last {
            n / b
        } else {
            n.div_ceil(b)
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn state(&self) -> LoaderState {
        self.state
    }

    /// Resumes at `state` (from a checkpoint of a loader over the same data and settings).
    pub fn load_state(&mut self, state: LoaderState) -> Result<()> {
        if state.batch > self.len() {
            return Err(Error::state(
                "DataLoader",
                format!(
                    "saved position is batch {} of epoch {}, an epoch here has {} batches",
                    state.batch,
                    state.epoch,
                    self.len()
                ),
            ));
        }
        self.state = state;
        Ok(())
    }

    /// The rest of the current epoch (all of it, unless resumed mid-epoch). The loader's
    /// position advances as batches are handed out; once the epoch is exhausted it moves to
    /// the next epoch.
    pub fn iter(&mut self, device: &Device) -> EpochIter<'_> {
        if self.state.batch >= self.len() {
            self.state = LoaderState {
                epoch: self.state.epoch + 1,
                batch: 0,
            };
        }
        let order = epoch_order(
            &self.cfg.sampler,
            self.dataset.len(),
            self.cfg.seed,
            self.state.epoch,
        );
        let b = self.cfg.batch_size;
        let mut batches: Vec<Vec<usize>> = order.chunks(b).map(<[usize]>::to_vec).collect();
        if self.cfg.drop_last && batches.last().is_some_and(|l| l.len() < b) {
            batches.pop();
        }
        let batches: Vec<Vec<usize>> = batches.split_off(self.state.batch.min(batches.len()));
        let ctx = DrawContext {
            seed: self.cfg.seed,
            epoch: self.state.epoch,
        };
        let collate = self.cfg.collate.clone();
        let workers = if self.cfg.num_workers == 0 || batches.is_empty() {
            None
        } else {
            Some(Workers::start(
                self.dataset.clone(),
                batches.clone(),
                ctx,
                collate.clone(),
                self.cfg.num_workers,
                self.cfg.prefetch,
            ))
        };
        EpochIter {
            loader: self,
            device: device.clone(),
            batches,
            next: 0,
            ctx,
            collate,
            workers,
            wait: Duration::ZERO,
        }
    }
}

fn build(
    dataset: &dyn Dataset,
    indices: &[usize],
    ctx: DrawContext,
    collate: &Option<Collate>,
) -> Result<Vec<HostTensor>> {
    let examples = indices
        .iter()
        .map(|&i| dataset.get(i, ctx))
        .collect::<Result<Vec<_>>>()?;
    match collate {
        Some(c) => c(examples),
        None => stack(examples),
    }
}

type Built = (usize, Result<Vec<HostTensor>>);

/// Worker threads: worker w builds batches w, w + W, ... and sends them, numbered, through a
/// bounded channel (the prefetch depth); they stop when the receiver is dropped.
struct Workers {
    rx: Receiver<Built>,
    pending: BTreeMap<usize, Result<Vec<HostTensor>>>,
    handles: Vec<JoinHandle<()>>,
}

impl Workers {
    fn start(
        dataset: Arc<dyn Dataset>,
        batches: Vec<Vec<usize>>,
        ctx: DrawContext,
        collate: Option<Collate>,
        n: usize,
        prefetch: usize,
    ) -> Workers {
        let (tx, rx) = sync_channel::<Built>(prefetch);
        let batches = Arc::new(batches);
        let n = n.min(batches.len());
        let handles = (0..n)
            .map(|w| {
                let (tx, dataset, batches, collate) = (
                    tx.clone(),
                    dataset.clone(),
                    batches.clone(),
                    collate.clone(),
                );
                std::thread::Builder::new()
                    .name(format!("ferrite-data-{w}"))
                    .spawn(move || {
                        for k in (w..batches.len()).step_by(n) {
                            let built = build(&*dataset, &batches[k], ctx, &collate);
                            if tx.send((k, built)).is_err() {
                                return;
                            }
                        }
                    })
            })
            .filter_map(std::result::Result::ok)
            .collect();
        Workers {
            rx,
            pending: BTreeMap::new(),
            handles,
        }
    }

    /// Batch `k`, waiting for the workers if it is not built yet.
    fn take(&mut self, k: usize) -> Result<Vec<HostTensor>> {
        loop {
            if let Some(b) = self.pending.remove(&k) {
                return b;
            }
            match self.rx.recv() {
                Ok((i, b)) => {
                    self.pending.insert(i, b);
                }
                Err(_) => {
                    return Err(Error::data(
                        "DataLoader",
                        format!("the worker building batch {k} stopped (a thread could not start or panicked)"),
                    ))
                }
            }
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // Unblock workers waiting on a full channel, then let them see the closed receiver.
        while self.rx.try_recv().is_ok() {}
        let (_, dead) = sync_channel::<Built>(1);
        drop(std::mem::replace(&mut self.rx, dead));
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// The batches of one epoch, in order, on the device.
pub struct EpochIter<'a> {
    loader: &'a mut DataLoader,
    device: Device,
    batches: Vec<Vec<usize>>,
    next: usize,
    ctx: DrawContext,
    collate: Option<Collate>,
    workers: Option<Workers>,
    wait: Duration,
}

impl EpochIter<'_> {
    /// Time the caller spent blocked waiting for batches (building them, with no workers).
    pub fn data_wait(&self) -> Duration {
        self.wait
    }

    /// Batches left in this epoch.
    pub fn remaining(&self) -> usize {
        self.batches.len() - self.next
    }
}

impl Iterator for EpochIter<'_> {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.next >= self.batches.len() {
            return None;
        }
        let k = self.next;
        let t = Instant::now();
        let built = match &mut self.workers {
            Some(w) => w.take(k),
            None => build(
                &*self.loader.dataset,
                &self.batches[k],
                self.ctx,
                &self.collate,
            ),
        };
        self.wait += t.elapsed();
        self.next += 1;
        self.loader.state.batch += 1;
        let size = self.batches[k].len();
        Some(built.and_then(|fields| {
            let fields = fields
                .into_iter()
                .map(|f| Tensor::from_host(f.data, f.shape, &self.device).map_err(Error::from))
                .collect::<Result<Vec<_>>>()?;
            Ok(Batch { fields, size })
        }))
    }
}
