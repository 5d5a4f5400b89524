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
                (got[2 * i] - want[i]).abs() < 1e-12,
                "row {i}: {} vs {}",
                got[2 * i],
                want[i]
            );
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
    assert!(o[2].is_nan() && o[3] == -inf, "{o:?}");
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
