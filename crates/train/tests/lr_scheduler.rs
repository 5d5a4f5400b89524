//! Every scheduler against PyTorch's learning rates over 1,000 steps (fixture written by
//! `scripts/scheduler_fixtures.py`), checkpoint round trips, and bad hyperparameters.

use ferrite_train::lr_scheduler::{LrLambda, OneCycle};
use ferrite_train::{LrGroups, LrScheduler, ParamGroups, Plateau, ReduceLROnPlateau, Schedule};
use serde_json::Value;
use std::sync::Arc;

/// Recursive schedules repeat PyTorch's f64 operations in order, so on one machine the rates
/// are bit-identical (seen with glibc's libm on both sides); the tolerance leaves room for
/// another libm's last bit in cos/pow, compounded over 1,000 steps.
const RTOL: f64 = 1e-12;

fn fixture() -> Value {
    let text = include_str!("fixtures/lr_schedules.json");
    serde_json::from_str(text).expect("fixture parses")
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("count") as usize)
        .collect()
}

fn schedule_of(case: &Value) -> Schedule {
    let p = &case["params"];
    let f = |k: &str| p[k].as_f64().unwrap_or_else(|| panic!("param {k}"));
    let u = |k: &str| p[k].as_u64().unwrap_or_else(|| panic!("param {k}")) as usize;
    match case["name"].as_str().expect("name") {
        "StepLR" => Schedule::StepLR {
            step_size: u("step_size"),
            gamma: f("gamma"),
        },
        "MultiStepLR" => Schedule::MultiStepLR {
            milestones: usizes(&p["milestones"]),
            gamma: f("gamma"),
        },
        "ExponentialLR" => Schedule::ExponentialLR { gamma: f("gamma") },
        "CosineAnnealingLR" => Schedule::CosineAnnealingLR {
            t_max: u("T_max"),
            eta_min: f("eta_min"),
        },
        "CosineAnnealingWarmRestarts" => Schedule::CosineAnnealingWarmRestarts {
            t_0: u("T_0"),
            t_mult: u("T_mult"),
            eta_min: f("eta_min"),
        },
        "LinearLR" => Schedule::LinearLR {
            start_factor: f("start_factor"),
            end_factor: f("end_factor"),
            total_iters: u("total_iters"),
        },
        "OneCycleLR" => Schedule::OneCycleLR(OneCycle {
            pct_start: f("pct_start"),
            anneal_cos: p["anneal_strategy"] == "cos",
            three_phase: p["three_phase"].as_bool().expect("bool"),
            div_factor: f("div_factor"),
            final_div_factor: f("final_div_factor"),
            ..OneCycle::new(&f64s(&p["max_lr"]), u("total_steps"))
        }),
        "LambdaLR" => {
            let l: LrLambda = match p["lambda"].as_str().expect("lambda") {
                "0.97 ** (epoch // 10)" => Arc::new(|e| 0.97f64.powf((e / 10) as f64)),
                _ => Arc::new(|e| ((e + 1) as f64 / 100.0).min(10.0 / ((e + 1) as f64).sqrt())),
            };
            Schedule::LambdaLR(vec![l])
        }
        "SequentialLR" => {
            let names: Vec<&str> = p["schedulers"]
                .as_array()
                .expect("schedulers")
                .iter()
                .map(|s| s.as_str().expect("name"))
                .collect();
            let schedules = names
                .iter()
                .map(|n| match *n {
                    "LinearLR(0.1, 1.0, 50)" => Schedule::LinearLR {
                        start_factor: 0.1,
                        end_factor: 1.0,
                        total_iters: 50,
                    },
                    "CosineAnnealingLR(950, 0.0)" => Schedule::CosineAnnealingLR {
                        t_max: 950,
                        eta_min: 0.0,
                    },
                    "ExponentialLR(0.99)" => Schedule::ExponentialLR { gamma: 0.99 },
                    "StepLR(100, 0.5)" => Schedule::StepLR {
                        step_size: 100,
                        gamma: 0.5,
                    },
                    "ExponentialLR(0.999)" => Schedule::ExponentialLR { gamma: 0.999 },
                    other => panic!("unknown child schedule {other}"),
                })
                .collect();
            Schedule::SequentialLR {
                schedules,
                milestones: usizes(&p["milestones"]),
            }
        }
        other => panic!("no schedule for {other}"),
    }
}

fn assert_close(name: &str, step: usize, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{name} step {step}: group count");
    for (g, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= RTOL * b.abs() + 1e-300,
            "{name} step {step} group {g}: got {a:e}, PyTorch {b:e}"
        );
    }
}

fn groups(fix: &Value) -> LrGroups {
    LrGroups::with_momentum(
        &f64s(&fix["lrs"]),
        fix["momentum"].as_f64().expect("momentum"),
    )
}

#[test]
fn schedules_follow_pytorch_for_1000_steps() {
    let fix = fixture();
    let mut checked = 0;
    for case in fix["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        if name == "ReduceLROnPlateau" {
            continue;
        }
        let mut opt = groups(&fix);
        let mut s = LrScheduler::new(&mut opt, schedule_of(case)).expect(name);
        let want: Vec<Vec<f64>> = case["lrs"]
            .as_array()
            .expect("lrs")
            .iter()
            .map(f64s)
            .collect();
        let want_m: Option<Vec<Vec<f64>>> = case
            .get("momentum")
            .map(|m| m.as_array().expect("momentum").iter().map(f64s).collect());
        assert_eq!(want.len(), 1001);
        for (t, w) in want.iter().enumerate() {
            if t > 0 {
                s.step(&mut opt)
                    .unwrap_or_else(|e| panic!("{name} step {t}: {e}"));
            }
            assert_close(name, t, &opt.lr, w);
            assert_close(name, t, s.last_lr(), w);
            if let Some(m) = &want_m {
                let got: Vec<f64> = opt.momentum.iter().map(|m| m.expect("momentum")).collect();
                assert_close(&format!("{name} momentum"), t, &got, &m[t]);
            }
        }
        checked += 1;
    }
    assert_eq!(checked, 15, "every non-plateau case in the fixture ran");
}

#[test]
fn reduce_on_plateau_follows_pytorch() {
    let fix = fixture();
    let mut checked = 0;
    for case in fix["cases"].as_array().expect("cases") {
        if case["name"] != "ReduceLROnPlateau" {
            continue;
        }
        let p = &case["params"];
        let mut opt = groups(&fix);
        let mut s = ReduceLROnPlateau::with(
            &opt,
            if p["mode"] == "min" {
                Plateau::Min
            } else {
                Plateau::Max
            },
            p["factor"].as_f64().expect("factor"),
            p["patience"].as_u64().expect("patience") as usize,
            p["threshold"].as_f64().expect("threshold"),
            p["threshold_mode"] == "rel",
            p["cooldown"].as_u64().expect("cooldown") as usize,
            &f64s(&p["min_lr"]),
            p["eps"].as_f64().expect("eps"),
        )
        .expect("plateau");
        let want: Vec<Vec<f64>> = case["lrs"]
            .as_array()
            .expect("lrs")
            .iter()
            .map(f64s)
            .collect();
        let metrics = f64s(&case["metrics"]);
        assert_close("ReduceLROnPlateau", 0, &opt.lr, &want[0]);
        let mut reductions = 0;
        for (t, m) in metrics.iter().enumerate() {
            let before = opt.lr.clone();
            s.step(*m, &mut opt).expect("step");
            reductions += usize::from(opt.lr != before);
            assert_close("ReduceLROnPlateau", t + 1, &opt.lr, &want[t + 1]);
        }
        assert!(
            reductions >= 2,
            "the metric sequence must trigger reductions"
        );
        checked += 1;
    }
    assert_eq!(checked, 2);
}

#[test]
fn state_dict_resumes_exactly() {
    let fix = fixture();
    for case in fix["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        if name == "ReduceLROnPlateau" {
            continue;
        }
        // Run 300 steps, save, continue to 600; a fresh scheduler loaded from the save (over
        // groups restored to the saved rates) must give the same rates.
        let mut opt = groups(&fix);
        let mut s = LrScheduler::new(&mut opt, schedule_of(case)).expect(name);
        for _ in 0..300 {
            s.step(&mut opt).expect("step");
        }
        let saved = s.state_dict();
        let saved_opt = opt.clone();
        for _ in 0..300 {
            s.step(&mut opt).expect("step");
        }
        let mut fresh = groups(&fix);
        let mut r = LrScheduler::new(&mut fresh, schedule_of(case)).expect(name);
        let text = serde_json::to_string(&saved).expect("serializes");
        r.load_state_dict(&serde_json::from_str(&text).expect("parses"))
            .expect("loads");
        let mut resumed = saved_opt;
        for _ in 0..300 {
            r.step(&mut resumed).expect("step");
        }
        assert_eq!(resumed.lr, opt.lr, "{name}: resumed rates differ");
        assert_eq!(r.last_epoch(), s.last_epoch());
    }
}

#[test]
fn plateau_state_round_trips() {
    let mut opt = LrGroups::new(&[0.1]);
    let mut a = ReduceLROnPlateau::new(&opt, Plateau::Min).expect("plateau");
    for t in 0..15 {
        a.step(1.0 + 0.0 * t as f64, &mut opt).expect("step");
    }
    let saved = a.state_dict();
    let mut b = ReduceLROnPlateau::new(&opt, Plateau::Min).expect("plateau");
    b.load_state_dict(&saved).expect("loads");
    assert_eq!(b.best(), a.best());
    let mut o2 = opt.clone();
    for _ in 0..20 {
        a.step(1.0, &mut opt).expect("step");
        b.step(1.0, &mut o2).expect("step");
    }
    assert_eq!(opt.lr, o2.lr);
    assert!(
        opt.lr[0] < 0.1 * 0.1 * 1.0001,
        "two reductions happened: {:?}",
        opt.lr
    );
    // A state saved by another scheduler kind is refused, naming both.
    let mut opt = LrGroups::new(&[0.1]);
    let mut s = LrScheduler::new(&mut opt, Schedule::ExponentialLR { gamma: 0.9 }).expect("exp");
    let err = s.load_state_dict(&saved).expect_err("wrong kind");
    assert!(err.to_string().contains("ReduceLROnPlateau"), "{err}");
    let err = b.load_state_dict(&s.state_dict()).expect_err("wrong kind");
    assert!(err.to_string().contains("ExponentialLR"), "{err}");
}

#[test]
fn bad_hyperparameters_are_refused_naming_the_value() {
    let mut opt = LrGroups::new(&[0.1, 0.2]);
    let cases: Vec<(Schedule, &str)> = vec![
        (
            Schedule::StepLR {
                step_size: 0,
                gamma: 0.5,
            },
            "step_size",
        ),
        (
            Schedule::StepLR {
                step_size: 3,
                gamma: f64::NAN,
            },
            "gamma",
        ),
        (
            Schedule::CosineAnnealingLR {
                t_max: 0,
                eta_min: 0.0,
            },
            "T_max",
        ),
        (
            Schedule::CosineAnnealingWarmRestarts {
                t_0: 0,
                t_mult: 1,
                eta_min: 0.0,
            },
            "T_0",
        ),
        (
            Schedule::LinearLR {
                start_factor: 0.0,
                end_factor: 1.0,
                total_iters: 5,
            },
            "start_factor",
        ),
        (
            Schedule::LinearLR {
                start_factor: 0.5,
                end_factor: 1.5,
                total_iters: 5,
            },
            "end_factor",
        ),
        (
            Schedule::OneCycleLR(OneCycle::new(&[0.1, 0.2, 0.3], 10)),
            "max_lr",
        ),
        (
            Schedule::OneCycleLR(OneCycle {
                pct_start: 1.5,
                ..OneCycle::new(&[0.1], 10)
            }),
            "pct_start",
        ),
        (
            Schedule::LambdaLR((0..3).map(|_| -> LrLambda { Arc::new(|_| 1.0) }).collect()),
            "lr_lambdas",
        ),
        (
            Schedule::SequentialLR {
                schedules: vec![Schedule::ExponentialLR { gamma: 0.9 }],
                milestones: vec![5],
            },
            "milestones",
        ),
    ];
    for (s, word) in cases {
        let name = s.name();
        let err = LrScheduler::new(&mut opt, s).expect_err(name).to_string();
        assert!(err.starts_with(name) && err.contains(word), "{name}: {err}");
    }
    // OneCycleLR cycles momentum by default: an optimizer without one is refused.
    let err = LrScheduler::new(&mut opt, Schedule::OneCycleLR(OneCycle::new(&[0.1], 10)))
        .expect_err("no momentum")
        .to_string();
    assert!(err.contains("momentum"), "{err}");
    let err = ReduceLROnPlateau::with(&opt, Plateau::Min, 1.0, 10, 1e-4, true, 0, &[0.0], 1e-8)
        .expect_err("factor")
        .to_string();
    assert!(err.contains("factor"), "{err}");
    assert_eq!(
        opt.lr,
        vec![0.1, 0.2],
        "refused schedulers leave the rates alone"
    );
}

#[test]
fn one_cycle_refuses_steps_past_its_end() {
    let mut opt = LrGroups::with_momentum(&[0.1], 0.9);
    let mut s =
        LrScheduler::new(&mut opt, Schedule::OneCycleLR(OneCycle::new(&[1.0], 10))).expect("ok");
    for _ in 0..10 {
        s.step(&mut opt).expect("within the schedule");
    }
    let err = s.step(&mut opt).expect_err("past the end").to_string();
    assert!(
        err.contains("11") && err.contains("10 total steps"),
        "{err}"
    );
    assert_eq!(opt.num_groups(), 1);
}
