//! The optimizer fixture (from `scripts/optimizer_fixtures.py`) replayed on any device: shared
//! by the CPU tests (`optim.rs`) and the GPU tests (`gpu.rs`).
#![allow(dead_code)]

use ferrite_core::{Device, Tensor};
use ferrite_nn::Parameter;
use ferrite_train::{Optimizer, ParamGroup, Rule};
use serde_json::Value;

const SHAPES: [&[usize]; 3] = [&[5, 4], &[4], &[3, 2, 2]];

/// |got - want| <= ATOL + RTOL |want|: the updates are composed from f32 ops in an order close
/// to, not equal to, PyTorch's; 100 steps (two of them 40x larger) compound the roundings.
const RTOL: f64 = 2e-5;
const ATOL: f64 = 2e-6;

pub fn fixture() -> Value {
    serde_json::from_str(include_str!("../fixtures/optim.json")).expect("fixture parses")
}

pub fn params(dev: &Device) -> Vec<(String, Parameter)> {
    let mut k = 0usize;
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let n: usize = s.iter().product();
            let v: Vec<f32> = (0..n)
                .map(|j| (0.5 * (1.7 * (k + j) as f64 + 0.3).sin()) as f32)
                .collect();
            k += n;
            let t = Tensor::from_vec(v, s.to_vec(), dev).expect("tensor");
            (format!("p{i}"), Parameter::new(&t).expect("param"))
        })
        .collect()
}

/// Sets each parameter's gradient to step t's (via backward of sum(p * g)).
pub fn set_grads(ps: &[(String, Parameter)], t: usize, dev: &Device) {
    let scale = if t == 13 || t == 14 { 40.0 } else { 1.0 };
    let mut k = 0usize;
    let mut loss: Option<Tensor> = None;
    for (_, p) in ps {
        p.zero_grad();
        let n = p.elem_count();
        let g: Vec<f32> = (0..n)
            .map(|j| {
                let x = (k + j) as f64;
                (scale * (0.37 * t as f64 + 0.71 * x).sin() * (1.0 + 0.5 * (0.13 * x).cos())) as f32
            })
            .collect();
        k += n;
        let gt = Tensor::from_vec(g, p.dims().to_vec(), dev).expect("grad");
        let term = p.tensor().mul(&gt).expect("mul").sum_all().expect("sum");
        loss = Some(match loss {
            Some(l) => l.add(&term).expect("add"),
            None => term,
        });
    }
    ferrite_autodiff::backward(&loss.expect("loss")).expect("backward");
}

pub fn rule_of(name: &str, hp: &Value) -> Rule {
    let f = |k: &str, d: f64| hp.get(k).and_then(Value::as_f64).unwrap_or(d);
    let b = |k: &str| hp.get(k).and_then(Value::as_bool).unwrap_or(false);
    let betas = |d: (f64, f64)| {
        hp.get("betas")
            .and_then(Value::as_array)
            .map(|a| (a[0].as_f64().expect("b1"), a[1].as_f64().expect("b2")))
            .unwrap_or(d)
    };
    match name {
        "sgd" => Rule::Sgd {
            momentum: f("momentum", 0.0),
            dampening: f("dampening", 0.0),
            nesterov: b("nesterov"),
            weight_decay: f("weight_decay", 0.0),
        },
        "adam" | "adamw" => Rule::Adam {
            betas: betas((0.9, 0.999)),
            eps: f("eps", 1e-8),
            weight_decay: f("weight_decay", if name == "adamw" { 0.01 } else { 0.0 }),
            amsgrad: b("amsgrad"),
            decoupled: name == "adamw",
        },
        "rmsprop" => Rule::RmsProp {
            alpha: f("alpha", 0.99),
            eps: f("eps", 1e-8),
            weight_decay: f("weight_decay", 0.0),
            momentum: f("momentum", 0.0),
            centered: b("centered"),
        },
        "adagrad" => Rule::Adagrad {
            lr_decay: f("lr_decay", 0.0),
            weight_decay: f("weight_decay", 0.0),
            initial_accumulator_value: f("initial_accumulator_value", 0.0),
            eps: f("eps", 1e-10),
        },
        "lion" => Rule::Lion {
            betas: betas((0.9, 0.99)),
            weight_decay: f("weight_decay", 0.0),
        },
        "lamb" => Rule::Lamb {
            betas: betas((0.9, 0.999)),
            eps: f("eps", 1e-6),
            weight_decay: f("weight_decay", 0.0),
        },
        other => panic!("unknown optimizer {other}"),
    }
}

pub fn flat(ps: &[(String, Parameter)]) -> Vec<f64> {
    ps.iter()
        .flat_map(|(_, p)| p.tensor().to_vec_f64().expect("read"))
        .collect()
}

/// Runs every fixture case on `dev`; returns the largest relative error seen.
pub fn check_all(dev: &Device) -> f64 {
    let fix = fixture();
    let mut worst: f64 = 0.0;
    for case in fix["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let hp = &case["hp"];
        let rule = rule_of(name, hp);
        let lr = hp["lr"].as_f64().expect("lr");
        let ps = params(dev);
        let mut opt = match case.get("groups") {
            None => Optimizer::new(ps.clone(), lr, rule).expect("optimizer"),
            Some(gs) => {
                let g1 = &gs[0];
                let mut hp1 = hp.clone();
                hp1["weight_decay"] = g1["weight_decay"].clone();
                Optimizer::with_groups(vec![
                    ParamGroup {
                        params: ps[..1].to_vec(),
                        lr,
                        rule,
                    },
                    ParamGroup {
                        params: ps[1..].to_vec(),
                        lr: g1["lr"].as_f64().expect("lr"),
                        rule: rule_of(name, &hp1),
                    },
                ])
                .expect("groups")
            }
        };
        let label = format!(
            "{name} {hp} {}",
            case.get("groups").map_or(String::new(), |g| g.to_string())
        );
        for t in 1..=100 {
            set_grads(&ps, t, dev);
            opt.step()
                .unwrap_or_else(|e| panic!("{label} step {t}: {e}"));
            if let Some(want) = case["trajectory"].get(t.to_string()) {
                let got = flat(&ps);
                for (k, (g, w)) in got.iter().zip(want.as_array().expect("values")).enumerate() {
                    let w = w.as_f64().expect("num");
                    let err = (g - w).abs();
                    assert!(
                        err <= ATOL + RTOL * w.abs(),
                        "{label}: step {t}, element {k}: got {g}, PyTorch {w}"
                    );
                    worst = worst.max(err / w.abs().max(1e-3));
                }
            }
        }
        opt.check_finite().expect("finite gradients");
    }
    worst
}
