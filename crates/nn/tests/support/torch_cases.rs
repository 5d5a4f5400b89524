//! Runs the PyTorch fixture cases of `scripts/nn_fixtures.py` on any device: builds each layer
//! or loss from its config, loads PyTorch's parameters by their state-dict names, and compares
//! the output and the gradients of loss = sum(out * r) for every float input and parameter.
//! Shared by the CPU test (`torch_cases.rs`) and the GPU test binary (`gpu.rs`).

use ferrite_autodiff::{backward, Var};
use ferrite_core::{DType, Device, Result, Tensor};
use ferrite_nn::loss::{self, CrossEntropyOptions, KlReduction, Reduction};
use ferrite_nn::safetensors::SafetensorsFile;
use ferrite_nn::*;
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;

/// The fixture folder: under the crate where it was built, else relative to the repository
/// root (staged GPU binaries run from a copy of the repository elsewhere).
pub fn fixtures() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    match built.exists() {
        true => built,
        false => PathBuf::from("crates/nn/tests/fixtures"),
    }
}

fn red(cfg: &Value) -> Reduction {
    match cfg["reduction"].as_str() {
        Some("sum") => Reduction::Sum,
        Some("none") => Reduction::None,
        _ => Reduction::Mean,
    }
}

fn f(cfg: &Value, k: &str) -> f64 {
    cfg[k].as_f64().unwrap_or_else(|| panic!("config {k}"))
}

fn dims(cfg: &Value, k: &str) -> Vec<usize> {
    cfg[k]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect()
}

/// The layer of a case, its parameters still at their defaults.
fn layer(kind: &str, cfg: &Value, dt: DType, dev: &Device) -> Result<Option<Box<dyn Module>>> {
    let b = |k: &str| cfg[k].as_bool().unwrap_or(false);
    let u = |k: &str| cfg[k].as_u64().unwrap() as usize;
    Ok(Some(match kind {
        "Linear" => Box::new(Linear::new(u("in"), u("out"), b("bias"), dt, dev)?),
        "LayerNorm" => Box::new(LayerNorm::new(
            &dims(cfg, "shape"),
            f(cfg, "eps"),
            b("affine"),
            b("bias"),
            dt,
            dev,
        )?),
        "RMSNorm" => Box::new(RMSNorm::new(
            &dims(cfg, "shape"),
            cfg["eps"].as_f64(),
            b("affine"),
            dt,
            dev,
        )?),
        "Embedding" => Box::new(Embedding::new(
            u("num"),
            u("dim"),
            cfg["padding_idx"].as_i64().map(|p| p as isize),
            dt,
            dev,
        )?),
        "ReLU" => Box::new(ReLU),
        "LeakyReLU" => Box::new(LeakyReLU {
            negative_slope: f(cfg, "slope"),
        }),
        "ELU" => Box::new(ELU {
            alpha: f(cfg, "alpha"),
        }),
        "GELU" => Box::new(GELU { tanh: b("tanh") }),
        "SiLU" => Box::new(SiLU),
        "Mish" => Box::new(Mish),
        "Softplus" => Box::new(Softplus::new(f(cfg, "beta"), f(cfg, "threshold"))?),
        "Softsign" => Box::new(Softsign),
        "Hardsigmoid" => Box::new(Hardsigmoid),
        "Hardswish" => Box::new(Hardswish),
        "Tanh" => Box::new(Tanh),
        "Sigmoid" => Box::new(Sigmoid),
        "Softmax" => Box::new(Softmax {
            dim: cfg["dim"].as_i64().unwrap() as isize,
        }),
        "LogSoftmax" => Box::new(LogSoftmax {
            dim: cfg["dim"].as_i64().unwrap() as isize,
        }),
        _ => return Ok(None),
    }))
}

fn run_loss(kind: &str, cfg: &Value, t: &HashMap<String, Tensor>) -> Result<Tensor> {
    let g = |k: &str| t.get(k).unwrap_or_else(|| panic!("input {k}"));
    let o = |k: &str| t.get(k);
    let r = red(cfg);
    match kind {
        "cross_entropy" => loss::cross_entropy(
            g("input"),
            g("target"),
            &CrossEntropyOptions {
                weight: o("weight").cloned(),
                ignore_index: cfg["ignore_index"].as_i64().unwrap_or(-100),
                label_smoothing: cfg["label_smoothing"].as_f64().unwrap_or(0.0),
                reduction: r,
            },
        ),
        "nll_loss" => loss::nll_loss(
            g("input"),
            g("target"),
            o("weight"),
            cfg["ignore_index"].as_i64().unwrap_or(-100),
            r,
        ),
        "binary_cross_entropy" => {
            loss::binary_cross_entropy(g("input"), g("target"), o("weight"), r)
        }
        "binary_cross_entropy_with_logits" => loss::binary_cross_entropy_with_logits(
            g("input"),
            g("target"),
            o("weight"),
            o("pos_weight"),
            r,
        ),
        "sigmoid_focal_loss" => {
            loss::sigmoid_focal_loss(g("input"), g("target"), f(cfg, "alpha"), f(cfg, "gamma"), r)
        }
        "hinge_embedding_loss" => {
            loss::hinge_embedding_loss(g("input"), g("target"), f(cfg, "margin"), r)
        }
        "multi_margin_loss" => loss::multi_margin_loss(
            g("input"),
            g("target"),
            cfg["p"].as_u64().unwrap() as u32,
            f(cfg, "margin"),
            o("weight"),
            r,
        ),
        "mse_loss" => loss::mse_loss(g("input"), g("target"), r),
        "l1_loss" => loss::l1_loss(g("input"), g("target"), r),
        "huber_loss" => loss::huber_loss(g("input"), g("target"), f(cfg, "delta"), r),
        "smooth_l1_loss" => loss::smooth_l1_loss(g("input"), g("target"), f(cfg, "beta"), r),
        "kl_div" => {
            let kr = match cfg["reduction"].as_str() {
                Some("batchmean") => KlReduction::BatchMean,
                Some("sum") => KlReduction::Sum,
                Some("none") => KlReduction::None,
                _ => KlReduction::Mean,
            };
            loss::kl_div(
                g("input"),
                g("target"),
                kr,
                cfg["log_target"].as_bool().unwrap(),
            )
        }
        "cosine_embedding_loss" => {
            loss::cosine_embedding_loss(g("x1"), g("x2"), g("target"), f(cfg, "margin"), r)
        }
        "margin_ranking_loss" => {
            loss::margin_ranking_loss(g("x1"), g("x2"), g("target"), f(cfg, "margin"), r)
        }
        "triplet_margin_loss" => loss::triplet_margin_loss(
            g("anchor"),
            g("positive"),
            g("negative"),
            f(cfg, "margin"),
            f(cfg, "p"),
            1e-6,
            cfg["swap"].as_bool().unwrap(),
            r,
        ),
        k => panic!("unknown case kind {k}"),
    }
}

/// Largest |got - want| / (atol + rtol |want|); <= 1 passes.
fn excess(got: &Tensor, want: &Tensor, atol: f64, rtol: f64) -> std::result::Result<f64, String> {
    if got.dims() != want.dims() {
        return Err(format!("shape {:?} vs {:?}", got.dims(), want.dims()));
    }
    let g = got.to_vec_f64().map_err(|e| e.to_string())?;
    let w = want.to_vec_f64().map_err(|e| e.to_string())?;
    Ok(g.iter()
        .zip(&w)
        .map(|(a, b)| {
            if a.is_nan() != b.is_nan() {
                f64::INFINITY
            } else if a.is_nan() {
                0.0
            } else {
                (a - b).abs() / (atol + rtol * b.abs())
            }
        })
        .fold(0.0, f64::max))
}

/// Runs every case on `dev` in `dt` (float inputs and parameters cast to it); returns one line
/// per failure. Tolerances: |got - want| <= atol + rtol |want|.
pub fn run_all(dev: &Device, dt: DType, atol: f64, rtol: f64) -> Vec<String> {
    let dir = fixtures();
    let cases: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("nn_cases.json")).unwrap()).unwrap();
    let file = SafetensorsFile::open(dir.join("nn_tensors.safetensors")).unwrap();
    let load = |k: &str| -> Tensor {
        let t = file.tensor(k, dev).unwrap_or_else(|e| panic!("{e}"));
        if t.dtype().is_float() {
            t.cast(dt).unwrap()
        } else {
            t
        }
    };
    let has = |k: &str| file.entries().iter().any(|e| e.name == k);
    let mut failures = Vec::new();
    for case in cases["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let kind = case["kind"].as_str().unwrap();
        let cfg = &case["cfg"];
        let mut vars: Vec<(String, Var)> = Vec::new();
        let mut ins = HashMap::new();
        for i in case["inputs"].as_array().unwrap() {
            let i = i.as_str().unwrap();
            let t = load(&format!("{name}/in.{i}"));
            if has(&format!("{name}/grad.in.{i}")) {
                let v = Var::new(&t).unwrap();
                ins.insert(i.to_string(), v.tensor().clone());
                vars.push((i.to_string(), v));
            } else {
                ins.insert(i.to_string(), t);
            }
        }
        // PyTorch's hardsigmoid backward multiplies by a float32 1/6 even in float64
        // (relative error 3e-8), so its float64 gradients are only that exact.
        let rtol = if kind == "Hardsigmoid" {
            rtol.max(1e-7)
        } else {
            rtol
        };
        let check = |what: &str, got: &Tensor, want: &Tensor| match excess(got, want, atol, rtol) {
            Ok(e) if e <= 1.0 => None,
            Ok(e) => Some(format!(
                "{name} ({kind}): {what} off by {e:.2}x the tolerance"
            )),
            Err(m) => Some(format!("{name} ({kind}): {what}: {m}")),
        };
        let result = (|| -> Result<(Tensor, Option<Box<dyn Module>>)> {
            if matches!(kind, "RNN" | "LSTM" | "GRU") {
                let u = |k: &str| cfg[k].as_u64().unwrap() as usize;
                let bl = |k: &str| cfg[k].as_bool().unwrap();
                let rc = RnnConfig {
                    input_size: u("input"),
                    hidden_size: u("hidden"),
                    num_layers: u("layers"),
                    bias: bl("bias"),
                    batch_first: bl("batch_first"),
                    dropout: 0.0,
                    bidirectional: bl("bidirectional"),
                };
                let mode = match kind {
                    "LSTM" => RnnMode::Lstm,
                    "GRU" => RnnMode::Gru,
                    _ if bl("relu") => RnnMode::Relu,
                    _ => RnnMode::Tanh,
                };
                let m = Recurrent::new(mode, rc, dt, dev)?;
                let state: Vec<(String, Tensor)> = case["params"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| {
                        let p = p.as_str().unwrap();
                        (p.to_string(), load(&format!("{name}/param.{p}")))
                    })
                    .collect();
                load_state_dict(&m, &state, true)?;
                let out = m
                    .forward_with_state(&ins["x"], ins.get("h0"), ins.get("c0"))?
                    .0;
                return Ok((out, Some(Box::new(m))));
            }
            let load_params = |m: &dyn Module| -> Result<()> {
                let state: Vec<(String, Tensor)> = case["params"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| {
                        let p = p.as_str().unwrap();
                        (p.to_string(), load(&format!("{name}/param.{p}")))
                    })
                    .collect();
                load_state_dict(m, &state, true).map(|_| ())
            };
            let bl = |k: &str| cfg[k].as_bool().unwrap();
            let u = |k: &str| cfg[k].as_u64().unwrap() as usize;
            if kind == "MultiheadAttention" {
                let m = MultiheadAttention::new(
                    u("embed"),
                    u("heads"),
                    bl("bias"),
                    bl("batch_first"),
                    dt,
                    dev,
                )?;
                load_params(&m)?;
                let out = m.attend(
                    &ins["q"],
                    &ins["k"],
                    &ins["v"],
                    ins.get("mask"),
                    bl("causal"),
                )?;
                return Ok((out, Some(Box::new(m))));
            }
            if kind == "TransformerEncoderLayer" {
                let c = EncoderConfig {
                    dim_feedforward: u("ff"),
                    dropout: 0.0,
                    activation: match bl("gelu") {
                        true => ferrite_nn::Activation::Gelu,
                        false => ferrite_nn::Activation::Relu,
                    },
                    batch_first: bl("batch_first"),
                    norm_first: bl("norm_first"),
                    ..EncoderConfig::new(u("d_model"), u("nhead"))
                };
                let m = TransformerEncoderLayer::new(c, dt, dev)?;
                load_params(&m)?;
                let out = m.forward_masked(&ins["x"], ins.get("mask"), bl("causal"))?;
                return Ok((out, Some(Box::new(m))));
            }
            if kind == "TransformerDecoderLayer" {
                let c = DecoderConfig {
                    dim_feedforward: u("ff"),
                    dropout: 0.0,
                    activation: match bl("gelu") {
                        true => ferrite_nn::Activation::Gelu,
                        false => ferrite_nn::Activation::Relu,
                    },
                    batch_first: bl("batch_first"),
                    norm_first: bl("norm_first"),
                    ..DecoderConfig::new(u("d_model"), u("nhead"))
                };
                let m = TransformerDecoderLayer::new(c, dt, dev)?;
                load_params(&m)?;
                let out = m.forward_decoder(
                    &ins["tgt"],
                    &ins["memory"],
                    bl("causal"),
                    None,
                    ins.get("mask"),
                )?;
                return Ok((out, Some(Box::new(m))));
            }
            if kind == "Bilinear" {
                let u = |k: &str| cfg[k].as_u64().unwrap() as usize;
                let m = Bilinear::new(
                    u("in1"),
                    u("in2"),
                    u("out"),
                    cfg["bias"].as_bool().unwrap(),
                    dt,
                    dev,
                )?;
                let state: Vec<(String, Tensor)> = case["params"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| {
                        let p = p.as_str().unwrap();
                        (p.to_string(), load(&format!("{name}/param.{p}")))
                    })
                    .collect();
                load_state_dict(&m, &state, true)?;
                let out = m.forward2(&ins["x1"], &ins["x2"])?;
                return Ok((out, Some(Box::new(m))));
            }
            match layer(kind, cfg, dt, dev)? {
                Some(m) => {
                    let state: Vec<(String, Tensor)> = case["params"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|p| {
                            let p = p.as_str().unwrap();
                            (p.to_string(), load(&format!("{name}/param.{p}")))
                        })
                        .collect();
                    load_state_dict(&*m, &state, true)?;
                    let x = ins.get("x").or_else(|| ins.get("ids")).unwrap();
                    Ok((m.forward(x)?, Some(m)))
                }
                None => Ok((run_loss(kind, cfg, &ins)?, None)),
            }
        })();
        let (out, module) = match result {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{name} ({kind}): {e}"));
                continue;
            }
        };
        failures.extend(check("output", &out, &load(&format!("{name}/out"))));
        let r = load(&format!("{name}/r"));
        if let Err(e) = out
            .mul(&r)
            .and_then(|l| l.sum_all())
            .and_then(|l| backward(&l))
        {
            failures.push(format!("{name} ({kind}): backward: {e}"));
            continue;
        }
        for (i, v) in &vars {
            match v.grad() {
                Some(g) => failures.extend(check(
                    &format!("grad of {i}"),
                    &g,
                    &load(&format!("{name}/grad.in.{i}")),
                )),
                None => failures.push(format!("{name} ({kind}): no gradient for input {i}")),
            }
        }
        if let Some(m) = module {
            for (k, p) in m.named_parameters() {
                match p.grad() {
                    Some(g) => failures.extend(check(
                        &format!("grad of {k}"),
                        &g,
                        &load(&format!("{name}/grad.param.{k}")),
                    )),
                    None => {
                        failures.push(format!("{name} ({kind}): no gradient for parameter {k}"))
                    }
                }
            }
        }
    }
    failures
}

/// Loads the PyTorch-saved model into the equivalent ferrite model and checks its output;
/// then saves ferrite's state dict and checks PyTorch's names, shapes and values survive.
pub fn torch_state_dict(dev: &Device) -> Vec<String> {
    let dir = fixtures();
    let mut fails = Vec::new();
    let model = Sequential::new()
        .with(Linear::new(4, 8, true, DType::F32, dev).unwrap())
        .with(LayerNorm::new(&[8], 1e-5, true, true, DType::F32, dev).unwrap())
        .with(GELU::default())
        .with(Linear::new(8, 3, true, DType::F32, dev).unwrap());
    let r = load_state_dict_file(&model, dir.join("torch_model.safetensors"), true).unwrap();
    assert!(r.is_clean(), "{r}");
    let t = SafetensorsFile::open(dir.join("nn_tensors.safetensors")).unwrap();
    let x = t
        .tensor("model/in.x", dev)
        .unwrap()
        .cast(DType::F32)
        .unwrap();
    let want = t.tensor("model/out", dev).unwrap();
    let got = model.forward(&x).unwrap();
    match excess(&got, &want, 1e-5, 1e-4) {
        Ok(e) if e <= 1.0 => {}
        other => fails.push(format!("torch model output: {other:?}")),
    }
    let out = std::env::temp_dir().join(format!(
        "ferrite-nn-torch-{}.safetensors",
        std::process::id()
    ));
    save_state_dict(&model, &out).unwrap();
    let theirs = SafetensorsFile::open(dir.join("torch_model.safetensors")).unwrap();
    let ours = SafetensorsFile::open(&out).unwrap();
    for e in theirs.entries() {
        match ours.entries().iter().find(|o| o.name == e.name) {
            Some(o)
                if o.shape == e.shape && o.dtype == e.dtype && ours.bytes(o) == theirs.bytes(e) => {
            }
            other => fails.push(format!("saved state dict differs at {}: {other:?}", e.name)),
        }
    }
    if ours.entries().len() != theirs.entries().len() {
        fails.push("saved state dict has other keys".into());
    }
    fails
}
