//! The fused cross-entropy (`Tensor::cross_entropy_rows` and its backward) on a device
//! against an oracle device (the CPU), for every backend's tests.

use ferrite_core::{DType, Device, Tensor};

/// Largest relative difference `|a - b| / (1 + |b|)` (NaN where only one side is NaN: inf).
pub fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    assert_eq!(a.len(), b.len(), "ce_cases: lengths differ");
    a.iter()
        .zip(&b)
        .map(|(x, y)| match (x.is_nan(), y.is_nan()) {
            (true, true) => 0.0,
            (false, false) if x == y => 0.0,
            (false, false) => (x - y).abs() / (1.0 + y.abs()),
            _ => f64::INFINITY,
        })
        .fold(0.0, f64::max)
}

/// For each `(dtype, tolerance)` and `[n, c]` shape, without and with label smoothing 0.1 and
/// an ignored class (2): random logits (normal, std 2) and class weights (0.5 to 1.5) in the
/// dtype, targets spread over the classes, an upstream gradient in the accumulator dtype; the
/// (loss, lse, w[t]) rows and dlogits on `dev` must be within the tolerance of `oracle`'s, in the
/// accumulator dtype and the logits' dtype. Panics naming the case; returns the cases run.
pub fn cross_entropy_matches(
    dev: &Device,
    oracle: &Device,
    dtypes: &[(DType, f64)],
    shapes: &[(usize, usize)],
) -> usize {
    let mut ran = 0;
    for &(dt, tol) in dtypes {
        for &(n, c) in shapes {
            for (eps, ignore) in [(0.0, -100i64), (0.1, 2)] {
                let x = Tensor::rand_normal([n, c], 0.0, 2.0, 3, DType::F32, oracle)
                    .and_then(|x| x.cast(dt))
                    .unwrap();
                let t: Vec<i64> = (0..n).map(|i| ((i * 7919) % c) as i64).collect();
                let t = Tensor::from_vec(t, [n], oracle).unwrap();
                let w = Tensor::rand_uniform([c], 0.5, 1.5, 4, DType::F32, oracle)
                    .and_then(|w| w.cast(dt))
                    .unwrap();
                let g = Tensor::rand_uniform([n, 3], -1.0, 1.0, 5, DType::F32, oracle)
                    .and_then(|g| g.cast(dt.accumulator()))
                    .unwrap();
                let run = |on: &Device| {
                    let [x, t, w, g] = [&x, &t, &w, &g].map(|a| a.to_device(on).unwrap());
                    let o = Tensor::cross_entropy_rows(&x, &t, &w, ignore, eps).unwrap();
                    let dx =
                        Tensor::cross_entropy_backward(&x, &t, &w, &o, &g, ignore, eps).unwrap();
                    (o, dx)
                };
                let ((o1, d1), (o0, d0)) = (run(dev), run(oracle));
                assert_eq!((o1.dtype(), d1.dtype()), (dt.accumulator(), dt));
                let (eo, ed) = (max_rel(&o1, &o0), max_rel(&d1, &d0));
                assert!(
                    eo <= tol && ed <= tol,
                    "cross_entropy {dt} [{n}, {c}] eps {eps}: out {eo:e}, dx {ed:e}"
                );
                assert!(o0.to_vec_f64().unwrap().iter().any(|&v| v > 0.1));
                ran += 1;
            }
        }
    }
    ran
}
