//! Metrics accumulated on the device: `update` enqueues a few ops per batch and never waits;
//! `compute` reads the accumulated state once (a handful of scalars, a C×C matrix, or for
//! AUC-ROC the sorted scores) — call it once per logging interval. Definitions follow
//! scikit-learn (checked against it on fixtures from `scripts/metric_fixtures.py`).

use crate::{Error, Result};
use ferrite_core::{DType, Tensor};

/// A metric the Trainer can update per batch and log.
pub trait Metric: Send {
    /// Name for logs (`acc`, `top5_acc`, `macro_f1`, ...).
    fn name(&self) -> String;
    /// Adds one batch of predictions and targets (shapes per metric).
    fn update(&mut self, preds: &Tensor, targets: &Tensor) -> Result<()>;
    /// The value over everything added since the last reset (one host read).
    fn compute(&self) -> Result<f64>;
    fn reset(&mut self);
}

/// How per-class scores are combined (scikit-learn's `average`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Average {
    /// Global counts: for single-label multi-class data, precision = recall = F1 = accuracy.
    Micro,
    /// Unweighted mean over the classes present in targets or predictions.
    Macro,
    /// Mean weighted by each class's support (true count).
    Weighted,
}

impl Average {
    fn name(self) -> &'static str {
        match self {
            Average::Micro => "micro",
            Average::Macro => "macro",
            Average::Weighted => "weighted",
        }
    }
}

/// `acc + x`, starting from nothing.
fn accumulate(acc: &mut Option<Tensor>, x: Tensor) -> Result<()> {
    *acc = Some(match acc.take() {
        Some(a) => a.add(&x)?,
        None => x,
    });
    Ok(())
}

fn read_scalar(acc: &Option<Tensor>) -> Result<f64> {
    match acc {
        Some(t) => Ok(t.to_vec_f64()?.first().copied().unwrap_or(0.0)),
        None => Ok(0.0),
    }
}

fn class_targets(what: &'static str, preds: &Tensor, targets: &Tensor) -> Result<(usize, usize)> {
    if preds.rank() != 2 {
        return Err(Error::data(
            what,
            format!("predictions must be [N, C] scores, got {}", preds.shape()),
        ));
    }
    let (n, c) = (preds.dims()[0], preds.dims()[1]);
    if targets.dims() != [n] || !targets.dtype().is_int() {
        return Err(Error::data(
            what,
            format!(
                "targets must be [{n}] class indices (an integer dtype), got {} {}",
                targets.dtype(),
                targets.shape()
            ),
        ));
    }
    Ok((n, c))
}

/// Fraction of examples whose target is among the `k` highest scores
/// (preds `[N, C]`, targets `[N]` integer).
pub struct Accuracy {
    k: usize,
    correct: Option<Tensor>,
    count: usize,
}

impl Accuracy {
    pub fn new() -> Accuracy {
        Accuracy::top_k(1)
    }

    pub fn top_k(k: usize) -> Accuracy {
        Accuracy {
            k: k.max(1),
            correct: None,
            count: 0,
        }
    }
}

impl Default for Accuracy {
    fn default() -> Self {
        Accuracy::new()
    }
}

impl Metric for Accuracy {
    fn name(&self) -> String {
        if self.k == 1 {
            "acc".into()
        } else {
            format!("top{}_acc", self.k)
        }
    }

    fn update(&mut self, preds: &Tensor, targets: &Tensor) -> Result<()> {
        let (n, c) = class_targets("Accuracy", preds, targets)?;
        if self.k > c {
            return Err(Error::data(
                "Accuracy",
                format!("top-{} accuracy over {c} classes", self.k),
            ));
        }
        let t = targets.cast(DType::U32)?;
        let hit = if self.k == 1 {
            preds.argmax(-1, false)?.eq(&t)?
        } else {
            let (_, idx) = preds.topk(self.k, -1, true)?;
            idx.eq(&t.unsqueeze(1)?.broadcast_to([n, self.k])?)?
        };
        accumulate(&mut self.correct, hit.cast(DType::F64)?.sum_all()?)?;
        self.count += n;
        Ok(())
    }

    fn compute(&self) -> Result<f64> {
        if self.count == 0 {
            return Ok(0.0);
        }
        Ok(read_scalar(&self.correct)? / self.count as f64)
    }

    fn reset(&mut self) {
        self.correct = None;
        self.count = 0;
    }
}

/// Counts `[true class, predicted class]` (preds `[N, C]` scores, argmax taken, or `[N]`
/// predicted classes; targets `[N]` integer in 0..C).
pub struct ConfusionMatrix {
    classes: usize,
    counts: Option<Tensor>,
}

impl ConfusionMatrix {
    pub fn new(classes: usize) -> ConfusionMatrix {
        ConfusionMatrix {
            classes,
            counts: None,
        }
    }

    pub fn num_classes(&self) -> usize {
        self.classes
    }

    pub fn update(&mut self, preds: &Tensor, targets: &Tensor) -> Result<()> {
        let what = "ConfusionMatrix";
        let c = self.classes;
        if c == 0 {
            return Err(Error::config(what, "needs at least one class"));
        }
        let pred = if preds.rank() == 2 {
            if preds.dims()[1] != c {
                return Err(Error::data(
                    what,
                    format!(
                        "{c} classes, predictions have {} scores per example",
                        preds.dims()[1]
                    ),
                ));
            }
            preds.argmax(-1, false)?
        } else {
            preds.clone()
        };
        if pred.rank() != 1 || targets.dims() != pred.dims() || !targets.dtype().is_int() {
            return Err(Error::data(
                what,
                format!(
                    "targets must be integer class indices shaped like the predictions' rows; got predictions {}, targets {} {}",
                    preds.shape(),
                    targets.dtype(),
                    targets.shape()
                ),
            ));
        }
        // Flat cell index t * C + p, in f64 (exact far beyond any class count), then i64.
        let cell = targets
            .cast(DType::F64)?
            .mul_scalar(c as f64)?
            .add(&pred.cast(DType::F64)?)?
            .cast(DType::I64)?;
        let ones = Tensor::ones(cell.dims(), DType::F64, cell.device())?;
        let zero = Tensor::zeros([c * c], DType::F64, cell.device())?;
        accumulate(&mut self.counts, zero.scatter_add(&cell, &ones, 0)?)
    }

    /// The matrix, row = true class, column = predicted class.
    pub fn matrix(&self) -> Result<Vec<Vec<f64>>> {
        let c = self.classes;
        let flat = match &self.counts {
            Some(t) => t.to_vec_f64()?,
            None => vec![0.0; c * c],
        };
        Ok(flat.chunks(c).map(<[f64]>::to_vec).collect())
    }

    pub fn reset(&mut self) {
        self.counts = None;
    }
}

/// Per-class true positives, false positives, false negatives and support, and which classes
/// take part in averages (those in the targets or the predictions, as scikit-learn's
/// `unique_labels`).
struct Counts {
    tp: Vec<f64>,
    fp: Vec<f64>,
    fnn: Vec<f64>,
    support: Vec<f64>,
    present: Vec<bool>,
}

fn counts(m: &[Vec<f64>]) -> Counts {
    let c = m.len();
    let mut k = Counts {
        tp: vec![0.0; c],
        fp: vec![0.0; c],
        fnn: vec![0.0; c],
        support: vec![0.0; c],
        present: vec![false; c],
    };
    for i in 0..c {
        let row: f64 = m[i].iter().sum();
        let col: f64 = m.iter().map(|r| r[i]).sum();
        k.tp[i] = m[i][i];
        k.fp[i] = col - m[i][i];
        k.fnn[i] = row - m[i][i];
        k.support[i] = row;
        k.present[i] = row > 0.0 || col > 0.0;
    }
    k
}

/// a / b, 0 where b is 0 (scikit-learn's `zero_division=0`).
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

fn average(k: &Counts, avg: Average, per_class: impl Fn(usize) -> f64, micro: f64) -> f64 {
    match avg {
        Average::Micro => micro,
        Average::Macro => {
            let v: Vec<f64> = (0..k.tp.len())
                .filter(|&i| k.present[i])
                .map(&per_class)
                .collect();
            if v.is_empty() {
                0.0
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            }
        }
        Average::Weighted => {
            let total: f64 = k.support.iter().sum();
            let s: f64 = (0..k.tp.len()).map(|i| per_class(i) * k.support[i]).sum();
            ratio(s, total)
        }
    }
}

/// Which of precision, recall and F1 a [`Classification`] metric reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Score {
    Precision,
    Recall,
    F1,
    /// Mean intersection over union (Jaccard), for segmentation or classification.
    MeanIoU,
}

/// Precision, recall, F1 or mean IoU from a confusion matrix on the device.
pub struct Classification {
    pub score: Score,
    pub average: Average,
    cm: ConfusionMatrix,
}

impl Classification {
    pub fn new(score: Score, average: Average, classes: usize) -> Classification {
        Classification {
            score,
            average,
            cm: ConfusionMatrix::new(classes),
        }
    }

    /// The value of `score` with `average` for a confusion matrix (rows true, columns predicted).
    pub fn from_matrix(score: Score, avg: Average, m: &[Vec<f64>]) -> f64 {
        let k = counts(m);
        let (tp, fp, fnn) = (
            k.tp.iter().sum::<f64>(),
            k.fp.iter().sum::<f64>(),
            k.fnn.iter().sum::<f64>(),
        );
        let prec = |i: usize| ratio(k.tp[i], k.tp[i] + k.fp[i]);
        let rec = |i: usize| ratio(k.tp[i], k.tp[i] + k.fnn[i]);
        match score {
            Score::Precision => average(&k, avg, prec, ratio(tp, tp + fp)),
            Score::Recall => average(&k, avg, rec, ratio(tp, tp + fnn)),
            Score::F1 => average(
                &k,
                avg,
                |i| ratio(2.0 * k.tp[i], 2.0 * k.tp[i] + k.fp[i] + k.fnn[i]),
                ratio(2.0 * tp, 2.0 * tp + fp + fnn),
            ),
            Score::MeanIoU => average(
                &k,
                avg,
                |i| ratio(k.tp[i], k.tp[i] + k.fp[i] + k.fnn[i]),
                ratio(tp, tp + fp + fnn),
            ),
        }
    }
}

impl Metric for Classification {
    fn name(&self) -> String {
        let s = match self.score {
            Score::Precision => "precision",
            Score::Recall => "recall",
            Score::F1 => "f1",
            Score::MeanIoU => "iou",
        };
        format!("{}_{s}", self.average.name())
    }

    /// Preds `[N, C]` scores or `[N]` classes; for segmentation flatten pixels into N.
    fn update(&mut self, preds: &Tensor, targets: &Tensor) -> Result<()> {
        self.cm.update(preds, targets)
    }

    fn compute(&self) -> Result<f64> {
        Ok(Classification::from_matrix(
            self.score,
            self.average,
            &self.cm.matrix()?,
        ))
    }

    fn reset(&mut self) {
        self.cm.reset();
    }
}

/// Area under the ROC curve: binary (preds `[N]` scores of the positive class, targets `[N]`
/// in {0, 1}) or one-vs-rest macro average (preds `[N, C]` probabilities, targets `[N]`).
/// Scores stay on the device until `compute`, which sorts them there and reads them once.
pub struct AucRoc {
    preds: Vec<Tensor>,
    targets: Vec<Tensor>,
}

impl AucRoc {
    pub fn new() -> AucRoc {
        AucRoc {
            preds: Vec::new(),
            targets: Vec::new(),
        }
    }
}

impl Default for AucRoc {
    fn default() -> Self {
        AucRoc::new()
    }
}

/// Binary AUC of scores sorted descending with their labels: trapezoids between distinct
/// thresholds (ties share one step, as scikit-learn's `roc_curve`). `None` without both
/// classes.
fn auc_sorted(scores: &[f64], positive: &[bool]) -> Option<f64> {
    let p = positive.iter().filter(|&&b| b).count() as f64;
    let n = positive.len() as f64 - p;
    if p == 0.0 || n == 0.0 {
        return None;
    }
    let (mut tp, mut fp, mut area) = (0.0, 0.0, 0.0);
    let mut i = 0;
    while i < scores.len() {
        let (tp0, fp0) = (tp, fp);
        let s = scores[i];
        while i < scores.len() && scores[i] == s {
            if positive[i] {
                tp += 1.0;
            } else {
                fp += 1.0;
            }
            i += 1;
        }
        area += (fp - fp0) * (tp + tp0) / 2.0;
    }
    Some(area / (p * n))
}

impl Metric for AucRoc {
    fn name(&self) -> String {
        "auc".into()
    }

    fn update(&mut self, preds: &Tensor, targets: &Tensor) -> Result<()> {
        let what = "AucRoc";
        let n = preds.dims().first().copied().unwrap_or(0);
        if !(preds.rank() == 1 || preds.rank() == 2)
            || targets.dims() != [n]
            || !targets.dtype().is_int()
        {
            return Err(Error::data(
                what,
                format!(
                    "predictions must be [N] or [N, C] scores and targets [N] class indices, got {} and {} {}",
                    preds.shape(),
                    targets.dtype(),
                    targets.shape()
                ),
            ));
        }
        if let Some(first) = self.preds.first() {
            if first.dims()[1..] != preds.dims()[1..] {
                return Err(Error::data(
                    what,
                    format!(
                        "predictions changed shape from {} to {}",
                        first.shape(),
                        preds.shape()
                    ),
                ));
            }
        }
        self.preds.push(preds.cast(DType::F64)?);
        self.targets.push(targets.cast(DType::I64)?);
        Ok(())
    }

    fn compute(&self) -> Result<f64> {
        let what = "AucRoc";
        if self.preds.is_empty() {
            return Err(Error::data(what, "no predictions were added"));
        }
        let p = Tensor::cat(&self.preds.iter().collect::<Vec<_>>(), 0)?;
        let t = Tensor::cat(&self.targets.iter().collect::<Vec<_>>(), 0)?;
        let cols: Vec<Tensor> = if p.rank() == 1 {
            vec![p]
        } else {
            (0..p.dims()[1])
                .map(|c| p.narrow(1, c, 1)?.squeeze(1))
                .collect::<ferrite_core::Result<_>>()?
        };
        let binary = cols.len() == 1;
        let mut aucs = Vec::new();
        for (c, col) in cols.iter().enumerate() {
            let (sorted, idx) = col.sort(0, true)?;
            let labels = t.index_select(&idx, 0)?.to_vec::<i64>()?;
            let scores = sorted.to_vec::<f64>()?;
            let pos: Vec<bool> = labels
                .iter()
                .map(|&l| if binary { l == 1 } else { l == c as i64 })
                .collect();
            match auc_sorted(&scores, &pos) {
                Some(a) => aucs.push(a),
                None if binary => {
                    return Err(Error::data(
                        what,
                        "needs both classes among the targets (ROC AUC is undefined otherwise)",
                    ))
                }
                None => {
                    return Err(Error::data(
                        what,
                        format!("class {c} never occurs (or always occurs) among the targets"),
                    ))
                }
            }
        }
        Ok(aucs.iter().sum::<f64>() / aucs.len() as f64)
    }

    fn reset(&mut self) {
        self.preds.clear();
        self.targets.clear();
    }
}

/// Which regression error a [`Regression`] metric reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegressionScore {
    Mae,
    Mse,
    R2,
}

/// MAE, MSE or R² over every element (preds and targets of one shape, float).
pub struct Regression {
    pub score: RegressionScore,
    /// Σ|e|, Σe², Σy, Σy² as a [4] f64 tensor.
    sums: Option<Tensor>,
    count: usize,
}

impl Regression {
    pub fn new(score: RegressionScore) -> Regression {
        Regression {
            score,
            sums: None,
            count: 0,
        }
    }
}

impl Metric for Regression {
    fn name(&self) -> String {
        match self.score {
            RegressionScore::Mae => "mae",
            RegressionScore::Mse => "mse",
            RegressionScore::R2 => "r2",
        }
        .into()
    }

    fn update(&mut self, preds: &Tensor, targets: &Tensor) -> Result<()> {
        if preds.dims() != targets.dims() {
            return Err(Error::data(
                "Regression",
                format!(
                    "predictions {} and targets {} differ in shape",
                    preds.shape(),
                    targets.shape()
                ),
            ));
        }
        let p = preds.cast(DType::F64)?;
        let y = targets.cast(DType::F64)?;
        let e = p.sub(&y)?;
        let parts = [
            e.abs()?.sum_all()?,
            e.square()?.sum_all()?,
            y.sum_all()?,
            y.square()?.sum_all()?,
        ];
        let sums = Tensor::stack(&parts.iter().collect::<Vec<_>>(), 0)?;
        accumulate(&mut self.sums, sums)?;
        self.count += preds.elem_count();
        Ok(())
    }

    fn compute(&self) -> Result<f64> {
        let Some(s) = &self.sums else { return Ok(0.0) };
        let s = s.to_vec_f64()?;
        let n = self.count as f64;
        Ok(match self.score {
            RegressionScore::Mae => s[0] / n,
            RegressionScore::Mse => s[1] / n,
            RegressionScore::R2 => {
                let sst = s[3] - s[2] * s[2] / n;
                if sst > 0.0 {
                    1.0 - s[1] / sst
                } else if s[1] == 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
        })
    }

    fn reset(&mut self) {
        self.sums = None;
        self.count = 0;
    }
}

/// exp(mean negative log-likelihood) of the targets under the predicted logits
/// (preds `[..., V]`, targets `[...]` integer token ids).
pub struct Perplexity {
    nll: Option<Tensor>,
    count: usize,
}

impl Perplexity {
    pub fn new() -> Perplexity {
        Perplexity {
            nll: None,
            count: 0,
        }
    }

    /// Adds a sum of negative log-likelihoods over `tokens` tokens (e.g. a summed loss).
    pub fn update_nll(&mut self, nll_sum: &Tensor, tokens: usize) -> Result<()> {
        accumulate(&mut self.nll, nll_sum.cast(DType::F64)?.sum_all()?)?;
        self.count += tokens;
        Ok(())
    }
}

impl Default for Perplexity {
    fn default() -> Self {
        Perplexity::new()
    }
}

impl Metric for Perplexity {
    fn name(&self) -> String {
        "ppl".into()
    }

    fn update(&mut self, preds: &Tensor, targets: &Tensor) -> Result<()> {
        let v = preds.dims().last().copied().unwrap_or(0);
        if preds.rank() < 2
            || targets.dims() != &preds.dims()[..preds.rank() - 1]
            || !targets.dtype().is_int()
        {
            return Err(Error::data(
                "Perplexity",
                format!(
                    "logits must be [..., V] and targets the leading dims as token ids, got {} and {} {}",
                    preds.shape(),
                    targets.dtype(),
                    targets.shape()
                ),
            ));
        }
        let n = targets.elem_count();
        let lp = preds.reshape([n, v])?.cast(DType::F32)?.log_softmax(-1)?;
        let picked = lp.gather(&targets.reshape([n, 1])?.cast(DType::I64)?, 1)?;
        self.update_nll(&picked.neg()?, n)
    }

    fn compute(&self) -> Result<f64> {
        if self.count == 0 {
            return Ok(f64::NAN);
        }
        Ok((read_scalar(&self.nll)? / self.count as f64).exp())
    }

    fn reset(&mut self) {
        self.nll = None;
        self.count = 0;
    }
}
