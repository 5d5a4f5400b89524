//! The fused cross-entropy op against its composition (log-softmax, gather, weights) in f64,
//! its gradient against finite differences, and its errors.

use ferrite_autodiff::{backward, Var};
use ferrite_core::{DType, Tensor};
use ferrite_cpu::cpu;
use ferrite_nn::loss::{cross_entropy, CrossEntropyOptions, Reduction};

/// loss_i = (1 - ε) w_t (lse - x_t) + ε / C Σ_j w_j (lse - x_j), in plain f64.
fn reference(x: &[f64], c: usize, t: &[i64], w: &[f64], eps: f64, ignore: i64) -> Vec<f64> {
    x.chunks(c)
        .zip(t)
        .map(|(row, &ti)| {
            if ti == ignore {
                return 0.0;
            }
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = row.iter().map(|v| (v - m).exp()).sum::<f64>().ln() + m;
            let ti = ti as usize;
            let s: f64 = row.iter().zip(w).map(|(v, wj)| wj * (lse - v)).sum();
            (1.0 - eps) * w[ti] * (lse - row[ti]) + eps / c as f64 * s
        })
        .collect()
}

#[test]
fn fused_rows_match_the_reference_and_finite_differences() {
    let dev = cpu();
    let (n, c) = (9, 13);
    let x = Tensor::rand_normal([n, c], 0.0, 3.0, 1, DType::F64, &dev).unwrap();
    let w = Tensor::rand_uniform([c], 0.5, 2.0, 2, DType::F64, &dev).unwrap();
    let tv: Vec<i64> = (0..n as i64)
        .map(|i| if i == 4 { -1 } else { (i * 5) % c as i64 })
        .collect();
    let t = Tensor::from_vec(tv.clone(), [n], &dev).unwrap();
    let xv = x.to_vec::<f64>().unwrap();
    let wv = w.to_vec::<f64>().unwrap();
    for eps in [0.0, 0.3] {
        let out = Tensor::cross_entropy_rows(&x, &t, &w, -1, eps).unwrap();
        let got = out.to_vec::<f64>().unwrap();
        let want = reference(&xv, c, &tv, &wv, eps, -1);
        for i in 0..n {
            assert!(
                (got[3 * i] - want[i]).abs() < 1e-12,
                "row {i}: {} vs {}",
                got[3 * i],
                want[i]
            );
            // Column 2: the target's class weight, 0 where the row is ignored.
            let wt = if tv[i] == -1 { 0.0 } else { wv[tv[i] as usize] };
            assert_eq!(got[3 * i + 2], wt, "row {i}'s weight");
        }
        // d(sum_i r_i loss_i)/dx by central differences.
        let r: Vec<f64> = (0..n).map(|i| 0.5 + i as f64 * 0.1).collect();
        let v = Var::new(&x).unwrap();
        let rows = Tensor::cross_entropy_rows(v.tensor(), &t, &w, -1, eps).unwrap();
        let l = rows
            .narrow(1, 0, 1)
            .unwrap()
            .reshape([n])
            .unwrap()
            .mul(&Tensor::from_vec(r.clone(), [n], &dev).unwrap())
            .unwrap()
            .sum_all()
            .unwrap();
        backward(&l).unwrap();
        let g = v.grad().unwrap().to_vec::<f64>().unwrap();
        let f = |xs: &[f64]| -> f64 {
            reference(xs, c, &tv, &wv, eps, -1)
                .iter()
                .zip(&r)
                .map(|(a, b)| a * b)
                .sum()
        };
        let h = 1e-6;
        for k in [0, 7, 4 * c + 2, n * c - 1] {
            let (mut a, mut b) = (xv.clone(), xv.clone());
            a[k] += h;
            b[k] -= h;
            let fd = (f(&a) - f(&b)) / (2.0 * h);
            assert!(
                (g[k] - fd).abs() < 1e-7,
                "eps {eps} x[{k}]: {} vs {fd}",
                g[k]
            );
        }
        // The ignored row gets no gradient.
        assert!(g[4 * c..5 * c].iter().all(|&v| v == 0.0));
    }
}

/// f16/bf16 logits compute in f32: the op's (loss, lse, w[t]) are f32 and equal the op on the
/// logits cast to f32; under autocast the loss (f32) and the logits' gradient (16-bit) equal
/// those of `cross_entropy(logits.cast(f32))`, PyTorch's `cross_entropy(logits.float())`, bit
/// for bit; outside autocast the loss has the logits' dtype.
#[test]
fn sixteen_bit_logits_compute_in_f32() {
    let dev = cpu();
    let (n, c) = (37, 301);
    let tv: Vec<i64> = (0..n as i64)
        .map(|i| if i == 5 { -7 } else { (i * 53) % c as i64 })
        .collect();
    let t = Tensor::from_vec(tv, [n], &dev).unwrap();
    for dt in [DType::BF16, DType::F16] {
        let x = Tensor::rand_normal([n, c], 0.0, 3.0, 11, DType::F32, &dev)
            .unwrap()
            .cast(dt)
            .unwrap();
        let w = Tensor::rand_uniform([c], 0.5, 2.0, 12, DType::F32, &dev)
            .unwrap()
            .cast(dt)
            .unwrap();
        let (xf, wf) = (x.cast(DType::F32).unwrap(), w.cast(DType::F32).unwrap());
        let out = Tensor::cross_entropy_rows(&x, &t, &w, -7, 0.1).unwrap();
        assert_eq!(out.dtype(), DType::F32, "{dt}");
        let want = Tensor::cross_entropy_rows(&xf, &t, &wf, -7, 0.1).unwrap();
        assert_eq!(
            out.to_vec::<f32>().unwrap(),
            want.to_vec::<f32>().unwrap(),
            "{dt}"
        );
        let opts = |w: &Tensor| CrossEntropyOptions {
            weight: Some(w.clone()),
            ignore_index: -7,
            label_smoothing: 0.1,
            ..Default::default()
        };
        // (loss, gradient) through autodiff, the loss taken from `f(logits)`.
        let run = |f: &dyn Fn(&Tensor) -> Tensor, w: &Tensor| {
            let v = Var::new(&x).unwrap();
            let l = ferrite_core::autocast::autocast(dt, || {
                cross_entropy(&f(v.tensor()), &t, &opts(w)).unwrap()
            })
            .unwrap();
            backward(&l).unwrap();
            let g = v.grad().unwrap();
            assert_eq!(g.dtype(), dt);
            (l, g.cast(DType::F32).unwrap().to_vec::<f32>().unwrap())
        };
        let (l16, g16) = run(&|x| x.clone(), &w);
        let (l32, g32) = run(&|x| x.cast(DType::F32).unwrap(), &wf);
        assert_eq!(l16.dtype(), DType::F32, "{dt}");
        assert_eq!(
            l16.item::<f32>().unwrap(),
            l32.item::<f32>().unwrap(),
            "{dt}"
        );
        assert!(
            l16.item::<f32>().unwrap() > 1.0,
            "{dt}: the loss is not trivial"
        );
        assert_eq!(g16, g32, "{dt}");
        assert!(g16.iter().any(|&g| g != 0.0));
        // Outside autocast: the logits' dtype.
        let plain = cross_entropy(&x, &t, &opts(&w)).unwrap();
        assert_eq!(plain.dtype(), dt);
        assert_eq!(
            plain.cast(DType::F32).unwrap().item::<f32>().unwrap(),
            l32.cast(dt)
                .unwrap()
                .cast(DType::F32)
                .unwrap()
                .item::<f32>()
                .unwrap()
        );
    }
}

#[test]
fn infinite_logits_follow_the_log_softmax_rules() {
    let dev = cpu();
    let inf = f64::INFINITY;
    let x = Tensor::from_vec(vec![-inf, 0.0, 1.0, -inf, -inf, -inf], [2, 3], &dev).unwrap();
    let t = Tensor::from_vec(vec![2i64, 0], [2], &dev).unwrap();
    let w = Tensor::ones([3], DType::F64, &dev).unwrap();
    let o = Tensor::cross_entropy_rows(&x, &t, &w, -100, 0.0)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    let want0 = (1.0f64 + 1f64.exp()).ln() - 1.0;
    assert!((o[0] - want0).abs() < 1e-12, "{o:?}");
    assert!(o[3].is_nan() && o[4] == -inf, "{o:?}");
    assert!(o[2] == 1.0 && o[5] == 1.0, "{o:?}");
}

#[test]
fn bad_targets_and_shapes_are_errors() {
    let dev = cpu();
    let x = Tensor::zeros([2, 5], DType::F32, &dev).unwrap();
    let t = Tensor::from_vec(vec![1i64, 5], [2], &dev).unwrap();
    let e = cross_entropy(&x, &t, &CrossEntropyOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("cross_entropy") && e.contains("index 5"), "{e}");
    let t = Tensor::from_vec(vec![1i64, 2, 3], [3], &dev).unwrap();
    let e = cross_entropy(&x, &t, &CrossEntropyOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("[2]") && e.contains("[3]"), "{e}");
    let o = CrossEntropyOptions {
        label_smoothing: 1.5,
        ..Default::default()
    };
    let t = Tensor::from_vec(vec![1i64, 2], [2], &dev).unwrap();
    assert!(cross_entropy(&x, &t, &o).is_err());
    let o = CrossEntropyOptions {
        weight: Some(Tensor::ones([4], DType::F32, &dev).unwrap()),
        ..Default::default()
    };
    assert!(cross_entropy(&x, &t, &o)
        .unwrap_err()
        .to_string()
        .contains("weight"));
    // Every row ignored: mean is 0/0 = NaN, as in PyTorch; sum is 0.
    let t = Tensor::from_vec(vec![-100i64, -100], [2], &dev).unwrap();
    let l = cross_entropy(&x, &t, &CrossEntropyOptions::default()).unwrap();
    assert!(l.item::<f32>().unwrap().is_nan());
    let o = CrossEntropyOptions {
        reduction: Reduction::Sum,
        ..Default::default()
    };
    assert_eq!(
        cross_entropy(&x, &t, &o).unwrap().item::<f32>().unwrap(),
        0.0
    );
}
