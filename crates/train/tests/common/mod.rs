//! The optimizer fixture (from `scripts/optimizer_fixtures.py`) replayed on any device: shared
//! by the CPU tests (`optim.rs`) and the GPU tests (`gpu.rs`).
#![allow(dead_code)]

use ferrite_core::{DType, Device, Tensor};
use ferrite_nn::Parameter;
use ferrite_train::{
    Clip, GradScaler, GradScalerConfig, Implementation, Optimizer, ParamGroup, Rule,
};
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

/// Runs every fixture case on `dev` with `imp`; returns the largest relative error seen.
pub fn check_all(dev: &Device, imp: Implementation) -> f64 {
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
        opt.set_implementation(imp);
        let label = format!(
            "{imp:?} {name} {hp} {}",
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

/// `n` parameters of assorted sizes (odd ones, and some over several chunks of either
/// backend's multi-tensor kernels: CPU 32,768 and CUDA 16,384 elements per chunk, 48 tensors
/// per CUDA launch), with deterministic values.
pub fn many_params(dev: &Device, n: usize) -> Vec<(String, Parameter)> {
    (0..n)
        .map(|i| {
            let len = match i % 7 {
                0 => 1,
                1 => 31,
                2 => 33,
                3 => 45 * 65,
                4 => 40_001,
                5 => 16_384,
                _ => 513,
            };
            let v: Vec<f32> = (0..len)
                .map(|j| (0.5 * (0.37 * (i * 7919 + j) as f64 + 0.1).sin()) as f32)
                .collect();
            let t = Tensor::from_vec(v, [len], dev).expect("tensor");
            (format!("m{i}"), Parameter::new(&t).expect("param"))
        })
        .collect()
}

/// Every rule of the fixture (PyTorch's defaults and the variants with every option).
pub fn all_rules() -> Vec<(Rule, f64)> {
    let fix = fixture();
    fix["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| c.get("groups").is_none())
        .map(|c| {
            let hp = &c["hp"];
            (
                rule_of(c["name"].as_str().expect("name"), hp),
                hp["lr"].as_f64().expect("lr"),
            )
        })
        .collect()
}

/// Runs `steps` steps of `rule` over `many_params` with `imp` and `clip`; the final values.
pub fn trajectory(
    dev: &Device,
    rule: &Rule,
    lr: f64,
    imp: Implementation,
    clip: Option<Clip>,
    steps: usize,
) -> Vec<f64> {
    let ps = many_params(dev, 60);
    let mut opt = Optimizer::new(ps.clone(), lr, rule.clone()).expect("optimizer");
    opt.set_implementation(imp);
    opt.set_clip(clip).expect("clip");
    for t in 1..=steps {
        set_grads(&ps, t, dev);
        opt.step().expect("step");
    }
    opt.check_finite().expect("finite");
    flat(&ps)
}

/// Fused against composed over `many_params` for every rule, without clipping, clipping by
/// value, and by norm (a threshold never reached, then 5); returns the largest relative
/// difference. Apart from LAMB (whose per-tensor norms the fused kernels sum in f64) and the
/// clipping norm 5, the two agree to `exact_tol` relative (0 on the CPU). There the global
/// norm (f64 in the fused kernel, f32 partial sums in the composed one) gives the two clip
/// coefficients a relative difference near 1e-6, which centered RMSprop (√(E[g²] - E[g]²))
/// and Adam with L2 decay amplify: agreement to 1e-4 (1 + |w|) after 10 steps (lr 0.01).
pub fn fused_matches_composed(dev: &Device, exact_tol: f64) -> f64 {
    let mut worst: f64 = 0.0;
    for (rule, lr) in all_rules() {
        let clips = [
            None,
            Some(Clip::Value(0.5)),
            Some(Clip::Norm(1e9)),
            Some(Clip::Norm(5.0)),
        ];
        for clip in clips {
            let a = trajectory(dev, &rule, lr, Implementation::Fused, clip, 10);
            let b = trajectory(dev, &rule, lr, Implementation::Composed, clip, 10);
            let exact = clip != Some(Clip::Norm(5.0)) && !matches!(rule, Rule::Lamb { .. });
            for (k, (x, y)) in a.iter().zip(&b).enumerate() {
                let err = (x - y).abs();
                let ok = if exact {
                    err <= exact_tol * y.abs()
                } else {
                    err <= 1e-4 * (1.0 + y.abs())
                };
                assert!(
                    ok,
                    "{rule:?} clip {clip:?}: element {k}: fused {x}, composed {y}"
                );
                let rel = err / y.abs().max(1e-3);
                worst = worst.max(rel);
            }
        }
    }
    worst
}

/// Linear regression y = x · w* + 0.5 on 64 rows of 16 features, fp16 parameters and data,
/// the loss in f32, Adam through a `GradScaler` (growth interval 5) for 60 steps, the 20th
/// forced to overflow. Checks at every step, against a host model of the scaler fed the
/// skips the device reports, that a skipped step changed nothing and a finite one changed
/// the parameters, and that the device's scale is the model's. Returns the losses.
pub fn loss_scaled_training(dev: &Device, imp: Implementation) -> Vec<f64> {
    let dev = dev.clone();
    let (n, d) = (64usize, 16usize);
    let xs: Vec<f32> = (0..n * d)
        .map(|i| (0.7 * (i as f64 * 0.37).sin()) as f32)
        .collect();
    let w_true: Vec<f32> = (0..d).map(|j| 0.3 * ((j % 5) as f32 - 2.0)).collect();
    let ys: Vec<f32> = (0..n)
        .map(|r| (0..d).map(|j| xs[r * d + j] * w_true[j]).sum::<f32>() + 0.5)
        .collect();
    let x = Tensor::from_vec(xs, [n, d], &dev)
        .and_then(|t| t.cast(DType::F16))
        .expect("x");
    let y = Tensor::from_vec(ys, [n], &dev).expect("y");
    let w = Parameter::new(&Tensor::zeros([d], DType::F16, &dev).expect("w")).expect("w");
    let b = Parameter::new(&Tensor::zeros([1], DType::F16, &dev).expect("b")).expect("b");
    let ps = vec![("w".to_string(), w.clone()), ("b".to_string(), b.clone())];
    let mut opt = Optimizer::new(ps, 0.05, Rule::adam()).expect("adam");
    opt.set_implementation(imp);
    let cfg = GradScalerConfig {
        init_scale: 65536.0,
        growth_factor: 2.0,
        backoff_factor: 0.5,
        growth_interval: 5,
    };
    let mut scaler = GradScaler::new(cfg, &dev).expect("scaler");
    // The host model of the scale, fed the skips the device reports.
    let (mut scale, mut count, mut skipped) = (65536.0f64, 0u64, 0u64);
    let mut losses = Vec::new();
    let forced = 20;
    for step in 1..=60 {
        opt.zero_grad();
        let pred = x
            .mul(&w.tensor())
            .and_then(|t| t.sum(&[-1], false))
            .and_then(|t| t.add(&b.tensor()))
            .and_then(|t| t.cast(DType::F32))
            .expect("forward");
        let mut loss = pred
            .sub(&y)
            .and_then(|t| t.square())
            .and_then(|t| t.mean(&[0], false))
            .expect("loss");
        losses.push(loss.item::<f32>().expect("loss") as f64);
        if step == forced {
            // Gradients far beyond fp16's range: every one overflows to inf.
            loss = loss.mul_scalar(1e30).expect("force");
        }
        ferrite_autodiff::backward(&scaler.scale(&loss).expect("scale")).expect("backward");
        let before = (
            w.tensor().to_vec_f64().expect("w"),
            b.tensor().to_vec_f64().expect("b"),
        );
        scaler.step(&mut opt).expect("step");
        let after = (
            w.tensor().to_vec_f64().expect("w"),
            b.tensor().to_vec_f64().expect("b"),
        );
        let (dev_scale, dev_skipped) = scaler.read().expect("read");
        let skipped_now = dev_skipped > skipped;
        if step == forced {
            assert!(
                skipped_now,
                "{imp:?}: the forced overflow at step {step} was not found"
            );
        }
        if skipped_now {
            assert_eq!(
                before, after,
                "{imp:?}: step {step} overflowed but changed parameters"
            );
            scale *= 0.5;
            count = 0;
        } else {
            assert_ne!(
                before, after,
                "{imp:?}: step {step} was finite but changed nothing"
            );
            assert!(after.0.iter().all(|v| v.is_finite()));
            count += 1;
            if count == 5 {
                scale *= 2.0;
                count = 0;
            }
        }
        skipped = dev_skipped;
        assert_eq!(dev_scale, scale, "{imp:?}: scale after step {step}");
    }
    // Overflow is the scaler's business, not an error of the optimizer.
    opt.check_finite().expect("no non-finite report");
    losses
}

/// fp32 master weights: 16 bf16 parameters near 1 (where bf16's spacing is 2^-8 to 2^-7)
/// under Adam at lr 1e-4 for 100 steps, with gradients exactly representable in bf16, run
/// with master weights, without, and in f32. Checks that without master weights every update
/// rounds away (the parameters stay put), and that with them the f32 master copy equals the
/// f32 run bit for bit and the bf16 parameters are that copy rounded.
pub fn master_weights_check(dev: &Device, imp: Implementation) {
    let d = 16usize;
    let init: Vec<f32> = (0..d).map(|j| 1.0 - 0.125 * (j % 4) as f32).collect();
    let grads: Vec<f32> = (0..d).map(|j| 0.5 + 0.25 * (j % 5) as f32).collect();
    let run = |dt: DType, master: bool| -> (Vec<f64>, Option<Vec<f64>>) {
        let w0 = Tensor::from_vec(init.clone(), [d], dev)
            .and_then(|t| t.cast(dt))
            .expect("w");
        let g = Tensor::from_vec(grads.clone(), [d], dev)
            .and_then(|t| t.cast(dt))
            .expect("g");
        let w = Parameter::new(&w0).expect("w");
        let mut opt =
            Optimizer::new(vec![("w".into(), w.clone())], 1e-4, Rule::adam()).expect("adam");
        opt.set_implementation(imp);
        opt.set_master_weights(master);
        for _ in 0..100 {
            w.zero_grad();
            ferrite_autodiff::backward(&w.tensor().mul(&g).expect("m").sum_all().expect("s"))
                .expect("backward");
            opt.step().expect("step");
        }
        let (tensors, _) = opt.state_dict().expect("state");
        let m = tensors
            .get("w.master")
            .map(|t| t.to_vec_f64().expect("master"));
        (w.tensor().to_vec_f64().expect("w"), m)
    };
    let (plain, none) = run(DType::BF16, false);
    assert!(none.is_none());
    let start: Vec<f64> = init.iter().map(|&v| v as f64).collect();
    assert_eq!(plain, start, "{imp:?}: bf16 updates of 1e-4 round away");
    let (f32_run, _) = run(DType::F32, false);
    let (half, master) = run(DType::BF16, true);
    let master = master.expect("a master copy");
    assert_eq!(master, f32_run, "{imp:?}: the master copy is the f32 run");
    let rounded = Tensor::from_vec(
        f32_run.iter().map(|&v| v as f32).collect::<Vec<f32>>(),
        [d],
        dev,
    )
    .and_then(|t| t.cast(DType::BF16))
    .and_then(|t| t.to_vec_f64())
    .expect("round");
    assert_eq!(
        half, rounded,
        "{imp:?}: parameters are the master copy rounded"
    );
    assert!(half != start, "{imp:?}: the parameters moved");
}
