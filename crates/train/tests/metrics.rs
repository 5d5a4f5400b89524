//! Metrics against scikit-learn (fixture from `scripts/metric_fixtures.py`), fed in uneven
//! batches so accumulation across updates is exercised; plus bad shapes.

use ferrite_core::{Device, Tensor};
use ferrite_train::metrics::{
    Accuracy, AucRoc, Average, Classification, ConfusionMatrix, Metric, Perplexity, Regression,
    RegressionScore, Score,
};
use serde_json::Value;

fn fix() -> Value {
    serde_json::from_str(include_str!("fixtures/metrics.json")).expect("fixture parses")
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("num") as f32)
        .collect()
}

fn i64s(v: &Value) -> Vec<i64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_i64().expect("int"))
        .collect()
}

fn cpu() -> Device {
    ferrite_cpu::cpu()
}

/// Feeds rows [0, 100), [100, 101), [101, n) of (preds [n, c] or [n], targets [n]).
fn feed(m: &mut dyn Metric, preds: &[f32], cols: usize, targets: &[i64]) {
    let dev = cpu();
    let n = targets.len();
    for (a, b) in [(0, 100), (100, 101), (101, n)] {
        let p = if cols == 0 {
            Tensor::from_slice(&preds[a..b], [b - a], &dev)
        } else {
            Tensor::from_slice(&preds[a * cols..b * cols], [b - a, cols], &dev)
        }
        .expect("preds");
        let t = Tensor::from_slice(&targets[a..b], [b - a], &dev).expect("targets");
        m.update(&p, &t).expect("update");
    }
}

fn close(name: &str, got: f64, want: f64) {
    assert!(
        (got - want).abs() <= 1e-9 * want.abs().max(1.0),
        "{name}: got {got}, scikit-learn {want}"
    );
}

#[test]
fn classification_metrics_match_scikit_learn() {
    let f = fix();
    let c = f["classes"].as_u64().expect("classes") as usize;
    let logits = f32s(&f["logits"]);
    let targets = i64s(&f["targets"]);
    let mut acc = Accuracy::new();
    feed(&mut acc, &logits, c, &targets);
    close(
        "accuracy",
        acc.compute().expect("acc"),
        f["accuracy"].as_f64().expect("acc"),
    );
    assert!(
        acc.compute().expect("acc") > 0.3,
        "the fixture's predictions beat chance"
    );
    let mut top3 = Accuracy::top_k(3);
    feed(&mut top3, &logits, c, &targets);
    close(
        "top3",
        top3.compute().expect("top3"),
        f["top3_accuracy"].as_f64().expect("top3"),
    );
    assert_eq!(top3.name(), "top3_acc");

    let mut cm = ConfusionMatrix::new(c);
    let dev = cpu();
    let p = Tensor::from_slice(&logits, [targets.len(), c], &dev).expect("p");
    let t = Tensor::from_slice(&targets, [targets.len()], &dev).expect("t");
    cm.update(&p, &t).expect("cm");
    let want: Vec<Vec<f64>> = f["confusion"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            r.as_array()
                .expect("row")
                .iter()
                .map(|x| x.as_f64().expect("n"))
                .collect()
        })
        .collect();
    assert_eq!(cm.matrix().expect("matrix"), want);

    for (score, key) in [
        (Score::Precision, "precision"),
        (Score::Recall, "recall"),
        (Score::F1, "f1"),
        (Score::MeanIoU, "iou"),
    ] {
        for (avg, a) in [
            (Average::Micro, "micro"),
            (Average::Macro, "macro"),
            (Average::Weighted, "weighted"),
        ] {
            let mut m = Classification::new(score, avg, c);
            feed(&mut m, &logits, c, &targets);
            let name = format!("{key}_{a}");
            close(
                &name,
                m.compute().expect("compute"),
                f[&name].as_f64().expect("want"),
            );
            assert_eq!(m.name(), format!("{a}_{key}"));
            m.reset();
            assert_eq!(m.compute().expect("empty"), 0.0);
        }
    }
}

#[test]
fn auc_roc_matches_scikit_learn_with_ties_and_one_vs_rest() {
    let f = fix();
    let mut auc = AucRoc::new();
    feed(
        &mut auc,
        &f32s(&f["binary_scores"]),
        0,
        &i64s(&f["binary_targets"]),
    );
    close(
        "auc binary",
        auc.compute().expect("auc"),
        f["auc_binary"].as_f64().expect("auc"),
    );
    let mut ovr = AucRoc::new();
    feed(&mut ovr, &f32s(&f["probs"]), 5, &i64s(&f["targets"]));
    close(
        "auc ovr",
        ovr.compute().expect("auc"),
        f["auc_ovr_macro"].as_f64().expect("auc"),
    );
    // One class only: undefined, and said so.
    let dev = cpu();
    let mut one = AucRoc::new();
    one.update(
        &Tensor::from_slice(&[0.1f32, 0.7], [2], &dev).expect("p"),
        &Tensor::from_slice(&[1i64, 1], [2], &dev).expect("t"),
    )
    .expect("update");
    let err = one.compute().expect_err("one class").to_string();
    assert!(err.contains("both classes"), "{err}");
}

#[test]
fn regression_and_perplexity_match_references() {
    let f = fix();
    let y = f32s(&f["reg_targets"]);
    let p = f32s(&f["reg_preds"]);
    let dev = cpu();
    for (score, key) in [
        (RegressionScore::Mae, "mae"),
        (RegressionScore::Mse, "mse"),
        (RegressionScore::R2, "r2"),
    ] {
        let mut m = Regression::new(score);
        let n = y.len() / 2;
        for (a, b) in [(0, 7), (7, n)] {
            let pt = Tensor::from_slice(&p[a * 2..b * 2], [b - a, 2], &dev).expect("p");
            let yt = Tensor::from_slice(&y[a * 2..b * 2], [b - a, 2], &dev).expect("y");
            m.update(&pt, &yt).expect("update");
        }
        close(key, m.compute().expect(key), f[key].as_f64().expect(key));
    }
    let v = f["lm_vocab"].as_u64().expect("vocab") as usize;
    let logits = f32s(&f["lm_logits"]);
    let tok = i64s(&f["lm_tokens"]);
    let mut ppl = Perplexity::new();
    let t = tok.len();
    let lt = Tensor::from_slice(&logits, [2, t / 2, v], &dev).expect("logits");
    let tt = Tensor::from_slice(&tok, [2, t / 2], &dev).expect("tokens");
    ppl.update(&lt, &tt).expect("update");
    let want = f["perplexity"].as_f64().expect("ppl");
    let got = ppl.compute().expect("ppl");
    // log-softmax runs in f32 on the device.
    assert!(
        (got - want).abs() <= 1e-5 * want,
        "perplexity {got} vs {want}"
    );
}

#[test]
fn metrics_refuse_mismatched_shapes() {
    let dev = cpu();
    let p = Tensor::zeros([4, 3], ferrite_core::DType::F32, &dev).expect("p");
    let t_bad = Tensor::zeros([5], ferrite_core::DType::I64, &dev).expect("t");
    let t_float = Tensor::zeros([4], ferrite_core::DType::F32, &dev).expect("t");
    let err = Accuracy::new()
        .update(&p, &t_bad)
        .expect_err("shape")
        .to_string();
    assert!(err.starts_with("Accuracy") && err.contains("[4]"), "{err}");
    let err = Accuracy::new()
        .update(&p, &t_float)
        .expect_err("dtype")
        .to_string();
    assert!(err.contains("integer"), "{err}");
    let err = Accuracy::top_k(5)
        .update(
            &p,
            &Tensor::zeros([4], ferrite_core::DType::I64, &dev).expect("t"),
        )
        .expect_err("k")
        .to_string();
    assert!(err.contains("top-5") && err.contains("3 classes"), "{err}");
    let err = ConfusionMatrix::new(4)
        .update(&p, &t_bad)
        .expect_err("classes")
        .to_string();
    assert!(err.contains("4 classes"), "{err}");
    let err = Regression::new(RegressionScore::Mse)
        .update(&p, &t_float)
        .expect_err("shape")
        .to_string();
    assert!(err.contains("differ in shape"), "{err}");
    // A target outside 0..C is an error from the device (named), not a silent miscount.
    let t_oob = Tensor::from_slice(&[0i64, 1, 2, 7], [4], &dev).expect("t");
    let mut cm = ConfusionMatrix::new(3);
    let r = cm.update(&p, &t_oob).and_then(|_| cm.matrix().map(|_| ()));
    assert!(r.is_err(), "out-of-range target must fail");
}
