//! The Trainer end to end on a tiny model: a run interrupted mid-epoch and resumed from its
//! checkpoint gives bit-identical losses to one never interrupted; callbacks; a non-finite
//! loss stops the run naming the step.

use ferrite_core::{DType, Device, HostBuffer, Tensor};
use ferrite_nn::{Linear, ModuleExt, ReLU, Sequential};
use ferrite_train::data::{DataLoader, DataLoaderConfig, Dataset, DrawContext, HostTensor};
use ferrite_train::metrics::Accuracy;
use ferrite_train::trainer::{
    EarlyStopping, FitOutcome, LossFn, Mode, ModelCheckpoint, Trainer, TrainerConfig,
};
use ferrite_train::{Optimizer, Rule};
use std::path::PathBuf;
use std::sync::Arc;

/// 2-D points, class 1 when x + 2y > 0.
struct Points(usize);
impl Dataset for Points {
    fn len(&self) -> usize {
        self.0
    }
    fn get(&self, i: usize, _: DrawContext) -> ferrite_train::Result<Vec<HostTensor>> {
        let x = ((i * 37 % 101) as f32 / 50.0) - 1.0;
        let y = ((i * 53 % 97) as f32 / 48.0) - 1.0;
        Ok(vec![
            HostTensor::new(HostBuffer::F32(vec![x, y]), vec![2])?,
            HostTensor::scalar(HostBuffer::I64(vec![i64::from(x + 2.0 * y > 0.0)])),
        ])
    }
}

fn ce() -> LossFn {
    Box::new(|logits: &Tensor, t: &Tensor| {
        let n = t.elem_count();
        logits
            .log_softmax(-1)?
            .gather(&t.reshape([n, 1])?, 1)?
            .mean(&[], false)?
            .neg()
    })
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferrite-trainer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn trainer(dev: &Device, out: Option<PathBuf>, max_steps: Option<usize>, lr: f64) -> Trainer {
    ferrite_nn::init::manual_seed(11);
    let model = Sequential::new()
        .with(Linear::new(2, 16, true, DType::F32, dev).expect("l1"))
        .with(ReLU)
        .with(Linear::new(16, 2, true, DType::F32, dev).expect("l2"));
    let rule = Rule::Sgd {
        momentum: 0.9,
        dampening: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    };
    let opt = Optimizer::new(model.named_parameters(), lr, rule).expect("opt");
    let cfg = TrainerConfig {
        log_every: 1,
        out_dir: out,
        max_steps,
        progress: false,
        ..TrainerConfig::new(4)
    };
    let mut t = Trainer::new(Box::new(model), opt, ce(), dev, cfg).expect("trainer");
    t.metrics.push(Box::new(|| Box::new(Accuracy::new())));
    t
}

fn loaders() -> (DataLoader, DataLoader) {
    let mut cfg = DataLoaderConfig::new(16).shuffle(3);
    cfg.num_workers = 1;
    let train = DataLoader::new(Arc::new(Points(200)), cfg).expect("train");
    let val = DataLoader::new(Arc::new(Points(50)), DataLoaderConfig::new(25)).expect("val");
    (train, val)
}

#[test]
fn interrupted_run_resumes_bit_exactly() {
    let dev = ferrite_cpu::cpu();
    let (mut tr, mut va) = loaders();
    let mut a = trainer(&dev, None, None, 0.1);
    assert_eq!(
        a.fit(&mut tr, Some(&mut va)).expect("fit"),
        FitOutcome::Completed
    );
    let want = a.step_losses.clone();
    assert_eq!(want.len(), 4 * 13, "13 batches of 16 per epoch, 4 epochs");
    let first = want[0].1;
    let last = want[want.len() - 1].1;
    assert!(
        last < first * 0.5,
        "training lowers the loss: {first} -> {last}"
    );
    assert!(
        a.history.last().expect("epoch logs")["val_acc"] > 0.85,
        "{:?}",
        a.history.last()
    );

    // Stop mid-epoch 1 (step 20), then resume in a fresh trainer from the checkpoint.
    let out = tmp("resume");
    let (mut tr, mut va) = loaders();
    let mut b = trainer(&dev, Some(out.clone()), Some(20), 0.1);
    b.fit(&mut tr, Some(&mut va)).expect("first part");
    assert_eq!(b.step(), 20);
    let (mut tr, mut va) = loaders();
    let mut c = trainer(&dev, Some(out.clone()), None, 0.1);
    c.resume(&out.join("checkpoints/last")).expect("resume");
    assert_eq!(
        c.fit(&mut tr, Some(&mut va)).expect("rest"),
        FitOutcome::Completed
    );
    assert_eq!(
        c.step_losses, want,
        "resumed losses equal the uninterrupted run's, bit for bit"
    );
    let log = std::fs::read_to_string(out.join("log.jsonl")).expect("log");
    assert!(log
        .lines()
        .any(|l| l.contains("\"kind\":\"epoch\"") && l.contains("val_acc")));
    // A checkpoint of another model is refused, listing what differs.
    let mut other = trainer(&dev, None, None, 0.1);
    other.model =
        Box::new(Sequential::new().with(Linear::new(2, 3, true, DType::F32, &dev).expect("l")));
    let err = other
        .resume(&out.join("checkpoints/last"))
        .expect_err("mismatch")
        .to_string();
    assert!(
        err.contains("differs") || err.contains("missing") || err.contains("misshapen"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn callbacks_stop_early_and_keep_the_best_checkpoints() {
    let dev = ferrite_cpu::cpu();
    let out = tmp("callbacks");
    let (mut tr, mut va) = loaders();
    let mut t = trainer(&dev, Some(out.clone()), None, 0.1);
    t.cfg.epochs = 30;
    // val_acc cannot improve by more than 1.0: stops after `patience` epochs.
    t.callbacks.push(Box::new(
        EarlyStopping::new("val_acc", Mode::Max, 2, 1.0, true).expect("es"),
    ));
    t.callbacks.push(Box::new(ModelCheckpoint::new(
        "val_loss",
        Mode::Min,
        2,
        true,
    )));
    assert_eq!(
        t.fit(&mut tr, Some(&mut va)).expect("fit"),
        FitOutcome::EarlyStopped(2)
    );
    let names: Vec<String> = std::fs::read_dir(out.join("checkpoints"))
        .expect("dir")
        .map(|e| e.expect("e").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.contains(&"last".to_string()), "{names:?}");
    assert_eq!(
        names.iter().filter(|n| n.starts_with("best-epoch")).count(),
        2,
        "{names:?}"
    );
    let mut bad = trainer(&dev, None, None, 0.1);
    bad.callbacks.push(Box::new(
        EarlyStopping::new("val_nope", Mode::Min, 1, 0.0, false).expect("es"),
    ));
    let (mut tr, mut va) = loaders();
    let err = bad
        .fit(&mut tr, Some(&mut va))
        .expect_err("unknown monitor")
        .to_string();
    assert!(
        err.contains("val_nope") && err.contains("val_loss"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn a_non_finite_loss_stops_training_naming_the_step() {
    let dev = ferrite_cpu::cpu();
    let (mut tr, mut va) = loaders();
    let mut t = trainer(&dev, None, None, 1e30);
    let err = t
        .fit(&mut tr, Some(&mut va))
        .expect_err("diverges")
        .to_string();
    assert!(
        err.contains("at step")
            && (err.contains("NaN") || err.contains("inf") || err.contains("not finite")),
        "{err}"
    );
}
