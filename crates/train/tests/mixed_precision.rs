//! Mixed precision in the Trainer, on the CPU: bf16 autocast and fp16 with loss scaling follow
//! the f32 loss curve of a small transformer from the same initial weights; the fp16 scaler
//! skips a forced overflow (parameters untouched, scale halved) and training goes on; a
//! checkpoint keeps the scaler's state and resumes bit-exactly.

#[path = "common/amp.rs"]
mod amp;

use amp::{curve, max_rel, mean, trainer, Probe};
use ferrite_train::trainer::Precision;
use std::sync::{Arc, Mutex};

const STEPS: usize = 80;

#[test]
fn bf16_and_fp16_curves_follow_f32() {
    let dev = ferrite_cpu::cpu();
    let f32 = curve(&dev, Precision::F32, STEPS);
    let bf16 = curve(&dev, Precision::Bf16, STEPS);
    let fp16 = curve(&dev, Precision::Fp16, STEPS);
    let tail = |c: &[f64]| mean(c, STEPS - 10, STEPS);
    eprintln!(
        "f32 {:.4} -> {:.4}; bf16 max rel {:.2e}, tail {:.4}; fp16 max rel {:.2e}, tail {:.4}",
        f32[0],
        tail(&f32),
        max_rel(&bf16, &f32),
        tail(&bf16),
        max_rel(&fp16, &f32),
        tail(&fp16)
    );
    assert!(
        tail(&f32) < 0.75 * f32[0],
        "f32 training lowers the loss: {} -> {}",
        f32[0],
        tail(&f32)
    );
    // Same initial weights and batches: step 1 differs only by the forward's roundings.
    assert!(
        ((bf16[0] - f32[0]) / f32[0]).abs() < 5e-3,
        "{} {}",
        bf16[0],
        f32[0]
    );
    assert!(
        ((fp16[0] - f32[0]) / f32[0]).abs() < 1e-3,
        "{} {}",
        fp16[0],
        f32[0]
    );
    // Bounds: see docs/training.md ("Mixed precision", measured deltas).
    assert!(
        max_rel(&bf16, &f32) < BF16_STEP,
        "bf16 step-wise {}",
        max_rel(&bf16, &f32)
    );
    assert!(
        max_rel(&fp16, &f32) < FP16_STEP,
        "fp16 step-wise {}",
        max_rel(&fp16, &f32)
    );
    for (name, c) in [("bf16", &bf16), ("fp16", &fp16)] {
        let d = (tail(c) - tail(&f32)).abs() / tail(&f32);
        assert!(
            d < TAIL,
            "{name}: mean of the last 10 losses {} vs f32 {}",
            tail(c),
            tail(&f32)
        );
    }
    // And the low-precision runs really differ from f32 (autocast was on).
    assert_ne!(bf16, f32);
    assert_ne!(fp16, f32);
}

const BF16_STEP: f64 = 0.03;
const FP16_STEP: f64 = 0.01;
const TAIL: f64 = 0.02;

#[test]
fn fp16_scaler_skips_a_forced_overflow_and_training_goes_on() {
    let dev = ferrite_cpu::cpu();
    let probe = Arc::new(Mutex::new(Probe {
        overflow_at: Some(10),
        ..Probe::default()
    }));
    let mut t = trainer(&dev, Precision::Fp16, 30, None, Some(probe.clone()));
    t.fit(&mut amp::loader(), None).expect("fit");
    assert_eq!(
        t.step(),
        30,
        "the skipped step counts as a step; the run goes on"
    );
    let (scale, skipped) = t
        .scaler()
        .expect("an fp16 run has a scaler")
        .read()
        .expect("read");
    assert_eq!(skipped, 1, "exactly the forced step is skipped");
    assert_eq!(scale, 32768.0, "the scale is halved once, from 2^16");
    let p = probe.lock().expect("probe");
    // Snapshot k holds the parameters after k steps; step 11 (loss call 10) was skipped.
    assert_eq!(p.snapshots.len(), 30);
    assert_eq!(
        p.snapshots[11], p.snapshots[10],
        "the skipped step left the parameters"
    );
    assert_ne!(
        p.snapshots[10], p.snapshots[9],
        "a normal step changes them"
    );
    assert_ne!(
        p.snapshots[12], p.snapshots[11],
        "the step after the skip updates again"
    );
    let l: Vec<f64> = t.step_losses.iter().map(|(_, l)| *l).collect();
    assert!(
        l[10] > 1e29,
        "the forced step's loss is the scaled-up one: {}",
        l[10]
    );
    assert!(
        mean(&l, 25, 30) < 0.85 * mean(&l, 0, 5),
        "training continues after the skip: {:?}",
        l
    );
}

#[test]
fn fp16_checkpoint_keeps_the_scaler_and_resumes_bit_exactly() {
    let dev = ferrite_cpu::cpu();
    let probe = || {
        Some(Arc::new(Mutex::new(Probe {
            overflow_at: Some(4),
            ..Probe::default()
        })))
    };
    let mut a = trainer(&dev, Precision::Fp16, 20, None, probe());
    a.fit(&mut amp::loader(), None).expect("uninterrupted");

    let out = std::env::temp_dir().join(format!("ferrite-amp-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut b = trainer(&dev, Precision::Fp16, 10, Some(out.clone()), probe());
    b.fit(&mut amp::loader(), None).expect("first part");
    let saved = b.scaler().expect("scaler").read().expect("read");
    assert_eq!(saved, (32768.0, 1));

    let mut c = trainer(&dev, Precision::Fp16, 20, Some(out.clone()), None);
    c.resume(&out.join("checkpoints/last")).expect("resume");
    assert_eq!(c.scaler().expect("scaler").read().expect("read"), saved);
    c.fit(&mut amp::loader(), None).expect("rest");
    assert_eq!(
        c.step_losses, a.step_losses,
        "resumed fp16 losses equal the uninterrupted run's, bit for bit"
    );
    assert_eq!(
        c.scaler().expect("scaler").read().expect("read"),
        a.scaler().expect("scaler").read().expect("read")
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn precision_names_parse_and_bad_ones_list_the_choices() {
    assert_eq!(Precision::parse("f32").unwrap(), Precision::F32);
    assert_eq!(Precision::parse("bf16").unwrap(), Precision::Bf16);
    assert_eq!(Precision::parse("fp16").unwrap(), Precision::Fp16);
    let e = Precision::parse("fp8").unwrap_err().to_string();
    assert!(e.contains("fp8") && e.contains("f32, bf16, fp16"), "{e}");
}
