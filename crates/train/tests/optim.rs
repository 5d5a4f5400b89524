//! Optimizers against PyTorch over 100 steps of a fixed gradient sequence (fixture from
//! `scripts/optimizer_fixtures.py`, which documents the sequence), on the CPU; plus clipping,
//! non-finite gradients, state round trips and bad hyperparameters.

use ferrite_core::Tensor;
use ferrite_nn::Parameter;
use ferrite_train::{Clip, Implementation, Optimizer, Rule};

mod common;

use common::{check_all, flat, params, set_grads};

#[test]
fn optimizers_follow_pytorch_for_100_steps_on_cpu() {
    for imp in [Implementation::Fused, Implementation::Composed] {
        let worst = check_all(&ferrite_cpu::cpu(), imp);
        eprintln!("{imp:?}: largest relative difference from PyTorch: {worst:e}");
    }
}

#[test]
fn master_weights_keep_updates_that_bf16_rounds_away() {
    for imp in [Implementation::Fused, Implementation::Composed] {
        common::master_weights_check(&ferrite_cpu::cpu(), imp);
    }
}

#[test]
fn fused_updates_equal_composed_bit_for_bit_on_cpu() {
    let worst = common::fused_matches_composed(&ferrite_cpu::cpu(), 0.0);
    eprintln!("largest relative difference fused vs composed (clipped, LAMB): {worst:e}");
}

#[test]
fn clipping_by_norm_and_value_happens_on_the_device() {
    let dev = ferrite_cpu::cpu();
    let w = Parameter::new(&Tensor::from_vec(vec![0.0f32; 4], [4], &dev).expect("t")).expect("p");
    let g = Tensor::from_vec(vec![3.0f32, 4.0, 0.0, 0.0], [4], &dev).expect("g");
    let run = |clip: Option<Clip>| {
        w.copy_(&Tensor::zeros([4], ferrite_core::DType::F32, &dev).expect("z"))
            .expect("reset");
        let mut opt = Optimizer::new(vec![("w".into(), w.clone())], 1.0, Rule::sgd()).expect("sgd");
        opt.set_clip(clip).expect("clip");
        w.zero_grad();
        ferrite_autodiff::backward(&w.tensor().mul(&g).expect("m").sum_all().expect("s"))
            .expect("bw");
        opt.step().expect("step");
        assert!((opt.grad_norm().item::<f64>().expect("norm") - 5.0).abs() < 1e-6);
        w.tensor().to_vec::<f32>().expect("w")
    };
    assert_eq!(run(None), vec![-3.0, -4.0, 0.0, 0.0]);
    let n = run(Some(Clip::Norm(1.0)));
    assert!(
        (n[0] + 0.6).abs() < 1e-5 && (n[1] + 0.8).abs() < 1e-5,
        "{n:?}"
    );
    assert_eq!(run(Some(Clip::Value(3.5))), vec![-3.0, -3.5, 0.0, 0.0]);
}

#[test]
fn nonfinite_gradients_are_reported_with_the_step_and_skipped() {
    let dev = ferrite_cpu::cpu();
    let w = Parameter::new(&Tensor::from_vec(vec![1.0f32, 2.0], [2], &dev).expect("t")).expect("p");
    let mut opt = Optimizer::new(vec![("w".into(), w.clone())], 0.1, Rule::adam()).expect("adam");
    for (t, g) in [
        [1.0f32, 1.0],
        [f32::NAN, 1.0],
        [1.0, f32::INFINITY],
        [1.0, 1.0],
    ]
    .iter()
    .enumerate()
    {
        w.zero_grad();
        let gt = Tensor::from_vec(g.to_vec(), [2], &dev).expect("g");
        ferrite_autodiff::backward(&w.tensor().mul(&gt).expect("m").sum_all().expect("s"))
            .expect("bw");
        let before = w.tensor().to_vec::<f32>().expect("w");
        opt.step().expect("step");
        let after = w.tensor().to_vec::<f32>().expect("w");
        if t == 1 || t == 2 {
            assert_eq!(
                before,
                after,
                "step {} with a non-finite gradient changed nothing",
                t + 1
            );
        } else {
            assert!(after.iter().all(|v| v.is_finite()) && after != before);
        }
    }
    let err = opt.check_finite().expect_err("flagged").to_string();
    assert!(err.contains("step 2"), "{err}");
}

#[test]
fn state_dict_resumes_and_lists_mismatches() {
    let dev = ferrite_cpu::cpu();
    let rule = Rule::Adam {
        betas: (0.9, 0.999),
        eps: 1e-8,
        weight_decay: 0.01,
        amsgrad: true,
        decoupled: true,
    };
    let ps = params(&dev);
    let mut a = Optimizer::new(ps.clone(), 0.01, rule.clone()).expect("a");
    for t in 1..=5 {
        set_grads(&ps, t, &dev);
        a.step().expect("step");
    }
    // state_dict hands out the live state tensors (as PyTorch's does): copy them to keep a
    // snapshot, as saving to a file would.
    let (tensors, meta) = a.state_dict().expect("state");
    let tensors: std::collections::BTreeMap<String, Tensor> = tensors
        .iter()
        .map(|(k, v)| (k.clone(), v.copy().expect("copy")))
        .collect();
    let snapshot: Vec<Tensor> = ps
        .iter()
        .map(|(_, p)| p.tensor().copy().expect("copy"))
        .collect();
    for t in 6..=10 {
        set_grads(&ps, t, &dev);
        a.step().expect("step");
    }
    let uninterrupted = flat(&ps);
    // A fresh optimizer over parameters restored to step 5, loaded from the saved state.
    let qs = params(&dev);
    for ((_, q), s) in qs.iter().zip(&snapshot) {
        q.copy_(s).expect("restore");
    }
    let mut b = Optimizer::new(qs.clone(), 0.01, rule.clone()).expect("b");
    b.load_state_dict(&tensors, &meta).expect("load");
    for t in 6..=10 {
        set_grads(&qs, t, &dev);
        b.step().expect("step");
    }
    assert_eq!(
        flat(&qs),
        uninterrupted,
        "resumed trajectory is bit-identical"
    );
    // Another model's parameters: every mismatch listed at once.
    let other: Vec<(String, Parameter)> = vec![
        ("p0".into(), ps[0].1.clone()),
        (
            "extra".into(),
            Parameter::new(&Tensor::zeros([2], ferrite_core::DType::F32, &dev).expect("z"))
                .expect("p"),
        ),
    ];
    let mut c = Optimizer::new(other, 0.01, Rule::adam()).expect("c");
    let err = c
        .load_state_dict(&tensors, &meta)
        .expect_err("mismatch")
        .to_string();
    for want in [
        "unexpected parameter p1",
        "unexpected parameter p2",
        "missing parameter extra",
        "saved for",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
}

#[test]
fn bad_hyperparameters_name_the_value() {
    let dev = ferrite_cpu::cpu();
    let ps = params(&dev);
    let adam = |b1: f64, b2: f64, eps: f64| Rule::Adam {
        betas: (b1, b2),
        eps,
        weight_decay: 0.0,
        amsgrad: false,
        decoupled: false,
    };
    let cases = [
        (
            -0.1,
            Rule::sgd(),
            "learning rate must be finite and >= 0, got -0.1",
        ),
        (0.1, adam(1.0, 0.9, 1e-8), "beta1 must be in [0, 1), got 1"),
        (
            0.1,
            adam(0.9, -0.1, 1e-8),
            "beta2 must be in [0, 1), got -0.1",
        ),
        (
            0.1,
            adam(0.9, 0.99, 0.0),
            "eps must be finite and > 0, got 0",
        ),
        (
            0.1,
            Rule::Lamb {
                betas: (0.9, 0.999),
                eps: 1e-6,
                weight_decay: -1.0,
            },
            "weight_decay must be finite and >= 0, got -1",
        ),
        (
            0.1,
            Rule::Sgd {
                momentum: 0.0,
                dampening: 0.0,
                nesterov: true,
                weight_decay: 0.0,
            },
            "Nesterov",
        ),
        (
            0.1,
            Rule::RmsProp {
                alpha: 1.5,
                eps: 1e-8,
                weight_decay: 0.0,
                momentum: 0.0,
                centered: false,
            },
            "alpha must be in [0, 1], got 1.5",
        ),
        (f64::NAN, Rule::lion(), "learning rate"),
    ];
    for (lr, rule, want) in cases {
        let name = rule.name();
        let err = Optimizer::new(ps.clone(), lr, rule)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.starts_with(name) && err.contains(want), "{name}: {err}");
    }
    assert!(Optimizer::new(vec![], 0.1, Rule::sgd()).is_err());
}

#[test]
fn fused_update_rejects_bad_requests() {
    use ferrite_core::optim::{fused_update, sum_squares, FusedUpdate, UpdateClip, UpdateRule};
    use ferrite_core::DType;
    let dev = ferrite_cpu::cpu();
    let t = |n: usize, dt: DType| Tensor::zeros([n], dt, &dev).expect("t");
    let s64 = || Tensor::full(1.0, (), DType::F64, &dev).expect("s");
    let rule = UpdateRule::Adam {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        amsgrad: false,
        decoupled: false,
    };
    let (lr, step, sq) = (s64(), s64(), s64());
    let run = |params: Vec<Tensor>, grads: Vec<Tensor>, states: Vec<Vec<Tensor>>, lr: &Tensor| {
        let first = vec![false; params.len()];
        fused_update(&FusedUpdate {
            rule,
            params: &params,
            grads: &grads,
            states: &states,
            first: &first,
            lr,
            step: &step,
            grad_sq: &sq,
            grad_scale: None,
            clip: UpdateClip::None,
        })
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
    };
    let f = DType::F32;
    let p = t(4, f);
    let cases = [
        (
            run(vec![t(4, f)], vec![t(4, f)], vec![vec![t(4, f)]], &lr),
            "1 state tensors, the rule needs 2",
        ),
        (
            run(
                vec![t(4, f)],
                vec![t(3, f)],
                vec![vec![t(4, f), t(4, f)]],
                &lr,
            ),
            "gradient [3] must be contiguous and of the parameter's shape [4]",
        ),
        (
            run(
                vec![t(4, f)],
                vec![t(4, DType::F16)],
                vec![vec![t(4, f), t(4, f)]],
                &lr,
            ),
            "dtypes differ",
        ),
        (
            run(
                vec![p.clone()],
                vec![t(4, f)],
                vec![vec![p.clone(), t(4, f)]],
                &lr,
            ),
            "must be distinct storages",
        ),
        (
            run(
                vec![p.clone()],
                vec![p.clone()],
                vec![vec![t(4, f), t(4, f)]],
                &lr,
            ),
            "shares its storage",
        ),
        (
            run(
                vec![t(4, f)],
                vec![t(4, f)],
                vec![vec![t(4, f), t(4, f)]],
                &t(1, f),
            ),
            "the learning rate must be an f64 scalar",
        ),
        (
            run(vec![t(4, f), t(2, f)], vec![t(4, f)], vec![], &lr),
            "2 parameters but 1 gradients",
        ),
    ];
    for (err, want) in cases {
        assert!(
            err.starts_with("fused_update") && err.contains(want),
            "{want}: {err}"
        );
    }
    let ints = Tensor::zeros([3], DType::I32, &dev).expect("i");
    let err = sum_squares(&[ints], &dev)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("sum_squares") && err.contains("float"),
        "{err}"
    );
    let v = Tensor::from_vec(vec![3.0f32, 4.0], [2], &dev).expect("v");
    let h = Tensor::from_vec(vec![1.0f32, 2.0], [2], &dev)
        .and_then(|t| t.cast(DType::BF16))
        .expect("h");
    let s = sum_squares(&[v, h], &dev)
        .expect("sum")
        .item::<f64>()
        .expect("read");
    assert_eq!(s, 30.0);
}
