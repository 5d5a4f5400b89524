//! `ferrite train csv FILE --target COLUMN [--regression]`: a small MLP (two hidden layers of
//! 64) on any CSV/TSV table: standardized numeric features, a class (cross-entropy, accuracy
//! and macro F1) or numeric target (MSE, MAE, R²). Every fifth row is held out for validation.

use ferrite_core::{DType, Tensor};
use ferrite_nn::{Linear, ModuleExt, ReLU, Sequential};
use ferrite_train::data::{
    CsvDataset, CsvOptions, CsvTarget, DataLoader, DataLoaderConfig, Dataset, DrawContext,
    HostTensor,
};
use ferrite_train::metrics::{
    Accuracy, Average, Classification, Regression, RegressionScore, Score,
};
use ferrite_train::trainer::{EarlyStopping, LossFn, Mode, ModelCheckpoint, RunOptions, Trainer};
use std::sync::Arc;

/// Rows of a table whose index satisfies `keep` (a train/validation split).
struct Rows {
    table: Arc<CsvDataset>,
    idx: Vec<usize>,
}

impl Dataset for Rows {
    fn len(&self) -> usize {
        self.idx.len()
    }
    fn get(&self, i: usize, ctx: DrawContext) -> ferrite_train::Result<Vec<HostTensor>> {
        self.table.get(self.idx[i], ctx)
    }
}

pub fn recipe(o: &RunOptions) -> anyhow::Result<()> {
    let file = o.file.as_ref().ok_or_else(|| {
        anyhow::anyhow!("train csv: give the table: ferrite train csv FILE --target COLUMN")
    })?;
    let target = o
        .target
        .as_deref()
        .ok_or_else(|| anyhow::anyhow!("train csv: --target COLUMN names the column to predict"))?;
    let kind = if o.regression {
        CsvTarget::Regression
    } else {
        CsvTarget::Class
    };
    let mut table = CsvDataset::open(file, &CsvOptions::new(target, kind))?;
    let (mean, std) = table.feature_stats();
    table.standardize(&mean, &std)?;
    let (nfeat, classes) = (table.num_features(), table.classes.len());
    if !o.regression && classes < 2 {
        anyhow::bail!("train csv: the target column `{target}` has {classes} distinct value(s); classification needs at least 2 (or pass --regression)");
    }
    let table = Arc::new(table);
    let n = table.len();
    let split = |val: bool| Rows {
        table: table.clone(),
        idx: (0..n).filter(|i| (i % 5 == 4) == val).collect(),
    };
    let (train_rows, val_rows) = (split(false), split(true));
    if val_rows.is_empty() || train_rows.is_empty() {
        anyhow::bail!(
            "train csv: {n} rows are too few to hold out a validation set (need at least 5)"
        );
    }
    let cfg = DataLoaderConfig::new(o.batch_size).shuffle(o.seed);
    let mut train = DataLoader::new(Arc::new(train_rows), cfg.clone())?;
    let mut val = DataLoader::new(Arc::new(val_rows), DataLoaderConfig::new(o.batch_size))?;

    let dev = &o.device;
    ferrite_nn::init::manual_seed(o.seed);
    let out = if o.regression { 1 } else { classes };
    let model = Sequential::new()
        .with(Linear::new(nfeat, 64, true, DType::F32, dev)?)
        .with(ReLU)
        .with(Linear::new(64, 64, true, DType::F32, dev)?)
        .with(ReLU)
        .with(Linear::new(64, out, true, DType::F32, dev)?);
    let optimizer = o.make_optimizer(model.named_parameters())?;
    let loss: LossFn = if o.regression {
        Box::new(|p: &Tensor, y: &Tensor| p.sub(y)?.square()?.mean(&[], false))
    } else {
        Box::new(|logits: &Tensor, y: &Tensor| {
            let n = y.elem_count();
            logits
                .log_softmax(-1)?
                .gather(&y.reshape([n, 1])?, 1)?
                .mean(&[], false)?
                .neg()
        })
    };
    let mut t = Trainer::new(Box::new(model), optimizer, loss, dev, o.trainer_config())?;
    if o.regression {
        t.metrics
            .push(Box::new(|| Box::new(Regression::new(RegressionScore::Mae))));
        t.metrics
            .push(Box::new(|| Box::new(Regression::new(RegressionScore::R2))));
    } else {
        t.metrics.push(Box::new(|| Box::new(Accuracy::new())));
        t.metrics.push(Box::new(move || {
            Box::new(Classification::new(Score::F1, Average::Macro, classes))
        }));
    }
    t.callbacks.push(Box::new(EarlyStopping::new(
        "val_loss",
        Mode::Min,
        5,
        0.0,
        true,
    )?));
    t.callbacks.push(Box::new(ModelCheckpoint::new(
        "val_loss",
        Mode::Min,
        1,
        true,
    )));
    if let Some(dir) = &o.resume {
        t.resume(dir)?;
    }
    let outcome = t.fit(&mut train, Some(&mut val))?;
    let logs = t.evaluate(&mut val)?;
    let shown: Vec<String> = logs.iter().map(|(k, v)| format!("{k} {v:.4}")).collect();
    println!(
        "csv: {outcome:?}; validation {} ({} steps)",
        shown.join(", "),
        t.step()
    );
    Ok(())
}

#[allow(dead_code)]
fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (file, target) = match (args.next(), args.next()) {
        (Some(f), Some(t)) => (f, t),
        _ => anyhow::bail!("usage: csv_table FILE TARGET_COLUMN"),
    };
    recipe(&RunOptions {
        epochs: 50,
        batch_size: 32,
        lr: 1e-3,
        optimizer: "adam".into(),
        device: ferrite_cpu::cpu(),
        seed: 0,
        out: None,
        resume: None,
        file: Some(file.into()),
        target: Some(target),
        regression: false,
        max_steps: None,
        progress: true,
        plot: false,
        precision: Default::default(),
        cuda_graph: false,
    })
}
