//! Initializers (bounds, moments, orthogonality, seeding) and Dropout (mask statistics,
//! scaling, eval identity, invalid p).

use ferrite_core::{DType, Tensor};
use ferrite_cpu::cpu;
use ferrite_nn::init::{self, FanMode, Nonlinearity};
use ferrite_nn::{Dropout, Linear, Module, ModuleExt};

fn moments(t: &Tensor) -> (f64, f64, f64) {
    let v = t.to_vec_f64().unwrap();
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    let maxabs = v.iter().fold(0.0f64, |a, x| a.max(x.abs()));
    (mean, var.sqrt(), maxabs)
}

#[test]
fn initializers_have_pytorch_bounds_and_moments() {
    let dev = cpu();
    // kaiming_uniform(relu, fan_in): bound sqrt(2) sqrt(3 / fan_in); fan_in = 64 * 9.
    let w = init::kaiming_uniform(
        [128, 64, 3, 3],
        FanMode::FanIn,
        Nonlinearity::Relu,
        DType::F32,
        &dev,
    )
    .unwrap();
    let bound = 2f64.sqrt() * (3.0 / 576.0f64).sqrt();
    let (m, s, a) = moments(&w);
    assert!(a <= bound && a > 0.99 * bound, "{a} {bound}");
    assert!(
        m.abs() < 0.01 * bound && (s - bound / 3f64.sqrt()).abs() < 0.02 * bound,
        "{m} {s}"
    );
    let w = init::kaiming_normal(
        [256, 512],
        FanMode::FanOut,
        Nonlinearity::LeakyRelu(0.2),
        DType::F64,
        &dev,
    )
    .unwrap();
    let want = (2.0 / 1.04f64).sqrt() / 256f64.sqrt();
    let (_, s, _) = moments(&w);
    assert!((s - want).abs() < 0.02 * want, "{s} {want}");
    let w = init::xavier_uniform([300, 200], 1.0, DType::F32, &dev).unwrap();
    let (_, _, a) = moments(&w);
    assert!(a <= (6.0f64 / 500.0).sqrt());
    let w = init::xavier_normal([300, 200], 2.0, DType::F64, &dev).unwrap();
    let (_, s, _) = moments(&w);
    assert!((s - 2.0 * (2.0f64 / 500.0).sqrt()).abs() < 0.01);
    // Orthogonal: rows orthonormal (wide) and columns orthonormal (tall), times the gain.
    for (r, c) in [(4usize, 9usize), (9, 4)] {
        let q = init::orthogonal([r, c], 1.5, DType::F64, &dev).unwrap();
        let g = if r <= c {
            q.matmul(&q.t().unwrap())
        } else {
            q.t().unwrap().matmul(&q)
        }
        .unwrap();
        let k = r.min(c);
        let v = g.to_vec::<f64>().unwrap();
        for i in 0..k {
            for j in 0..k {
                let want = if i == j { 2.25 } else { 0.0 };
                assert!(
                    (v[i * k + j] - want).abs() < 1e-12,
                    "{r}x{c} [{i},{j}] {}",
                    v[i * k + j]
                );
            }
        }
    }
    assert!(init::fans(&[3].into()).is_err());
    assert!(init::uniform([2], 1.0, 0.0, DType::F32, &dev).is_err());
    // Seeded: the same seed gives the same layer; another seed another.
    let make = |s| {
        init::manual_seed(s);
        Linear::new(8, 8, true, DType::F32, &dev)
            .unwrap()
            .weight
            .tensor()
            .to_vec::<f32>()
            .unwrap()
    };
    assert_eq!(make(1), make(1));
    assert_ne!(make(1), make(2));
    // Linear's default: U(-1/sqrt(in), 1/sqrt(in)).
    init::manual_seed(3);
    let l = Linear::new(100, 50, true, DType::F32, &dev).unwrap();
    let (_, _, a) = moments(&l.weight.tensor());
    assert!(a <= 0.1 && a > 0.095);
}

#[test]
fn dropout_masks_scale_and_stop_in_eval() {
    let dev = cpu();
    init::manual_seed(5);
    let mut d = Dropout::new(0.25).unwrap();
    let x = Tensor::ones([20000], DType::F32, &dev).unwrap();
    let y1 = d.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let y2 = d.forward(&x).unwrap().to_vec::<f32>().unwrap();
    assert_ne!(y1, y2, "each call draws a new mask");
    let kept = y1.iter().filter(|&&v| v != 0.0).count() as f64 / 20000.0;
    assert!((kept - 0.75).abs() < 0.015, "{kept}");
    assert!(y1
        .iter()
        .all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
    d.eval();
    assert!(!d.is_training());
    assert_eq!(
        d.forward(&x).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0; 20000]
    );
    for p in [-0.1, 1.0, f64::NAN] {
        let e = Dropout::new(p).err().unwrap().to_string();
        assert!(
            e.starts_with("Dropout: dropout probability must be in [0, 1)"),
            "{e}"
        );
    }
}

/// The mask streams' state (`rng_states` + `init::rng_state`) round-trips: restoring it makes
/// the next masks those drawn after it was taken; an unknown path is an error.
#[test]
fn dropout_rng_state_restores_the_next_masks() {
    use ferrite_nn::{Dropout, Dropout2d, ModuleExt, Sequential};
    let dev = ferrite_cpu::cpu();
    ferrite_nn::init::manual_seed(5);
    let m = Sequential::new()
        .with(Dropout::new(0.5).unwrap())
        .with(Dropout2d::new(0.5).unwrap());
    let x = ferrite_core::Tensor::ones([2, 8, 3, 3], ferrite_core::DType::F32, &dev).unwrap();
    let run = || m.forward(&x).unwrap().to_vec::<f32>().unwrap();
    run();
    let (modules, init) = (m.rng_states(), ferrite_nn::init::rng_state());
    assert_eq!(modules, vec![("0".to_string(), 1)]);
    let next = run();
    assert_ne!(run(), next, "masks change from call to call");
    m.load_rng_states(&modules).unwrap();
    ferrite_nn::init::set_rng_state(init);
    assert_eq!(run(), next, "the restored state draws the same masks");
    let e = m
        .load_rng_states(&[("1".to_string(), 3)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("no module with a mask stream at [\"1\"]"), "{e}");
}
