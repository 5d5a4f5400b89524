//! The dedicated backward kernels of the fused ops against autodiff through their
//! compositions from primitives (`ferrite_core::composed`), f64 and f32, odd sizes.

use ferrite_autodiff::{backward_with, Var};
use ferrite_core::{composed, DType, Result, Tensor};
use ferrite_cpu::cpu;

fn rand(shape: &[usize], seed: u64, dt: DType) -> Tensor {
    Tensor::rand_uniform(shape, -1.0, 1.0, seed, dt, &cpu()).unwrap()
}

/// Gradients of every input of `f` for upstream `g`.
fn grads(inputs: &[Tensor], g: &Tensor, f: impl Fn(&[Tensor]) -> Result<Tensor>) -> Vec<Vec<f64>> {
    let vars: Vec<Var> = inputs.iter().map(|t| Var::new(t).unwrap()).collect();
    let ts: Vec<Tensor> = vars.iter().map(|v| v.tensor().clone()).collect();
    backward_with(&f(&ts).unwrap(), g).unwrap();
    vars.iter()
        .map(|v| v.grad().unwrap().to_vec_f64().unwrap())
        .collect()
}

fn assert_close(a: &[Vec<f64>], b: &[Vec<f64>], tol: f64) {
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        let worst = x
            .iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs() / (1.0 + q.abs()))
            .fold(0.0, f64::max);
        assert!(
            worst <= tol,
            "input {k}: dedicated vs composed gradient differ by {worst}"
        );
    }
}

#[test]
fn norms_backward() {
    for (dt, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
        let (x, w, b, g) = (
            rand(&[33, 45], 1, dt),
            rand(&[45], 2, dt),
            rand(&[45], 3, dt),
            rand(&[33, 45], 4, dt),
        );
        let fused = grads(&[x.clone(), w.clone(), b.clone()], &g, |t| {
            t[0].layer_norm(&t[1], &t[2], 1e-5)
        });
        let slow = grads(&[x.clone(), w.clone(), b.clone()], &g, |t| {
            composed::layer_norm(&t[0], &t[1], &t[2], 1e-5)
        });
        assert_close(&fused, &slow, tol);
        let fused = grads(&[x.clone(), w.clone()], &g, |t| t[0].rms_norm(&t[1], 1e-6));
        let slow = grads(&[x.clone(), w.clone()], &g, |t| {
            composed::rms_norm(&t[0], &t[1], 1e-6)
        });
        assert_close(&fused, &slow, tol);
    }
}

#[test]
fn softmax_backward() {
    for (dt, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
        let (x, g) = (
            rand(&[7, 1, 31], 5, dt).mul_scalar(3.0).unwrap(),
            rand(&[7, 1, 31], 6, dt),
        );
        assert_close(
            &grads(std::slice::from_ref(&x), &g, |t| t[0].softmax(-1)),
            &grads(std::slice::from_ref(&x), &g, |t| {
                composed::softmax(&t[0], -1)
            }),
            tol,
        );
        assert_close(
            &grads(std::slice::from_ref(&x), &g, |t| t[0].log_softmax(-1)),
            &grads(std::slice::from_ref(&x), &g, |t| {
                composed::log_softmax(&t[0], -1)
            }),
            tol,
        );
    }
}

#[test]
fn attention_backward_grouped_causal() {
    for (dt, tol) in [(DType::F64, 1e-12), (DType::F32, 5e-5)] {
        for (lq, lk, causal) in [(7, 7, true), (3, 11, true), (5, 9, false), (1, 33, true)] {
            let q = rand(&[2, 6, lq, 16], 7, dt);
            let k = rand(&[2, 2, lk, 16], 8, dt);
            let v = rand(&[2, 2, lk, 12], 9, dt);
            let g = rand(&[2, 6, lq, 12], 10, dt);
            let ins = [q, k, v];
            let fused = grads(&ins, &g, |t| {
                Tensor::attention(&t[0], &t[1], &t[2], causal, None)
            });
            let slow = grads(&ins, &g, |t| {
                composed::attention(&t[0], &t[1], &t[2], causal, None)
            });
            assert_close(&fused, &slow, tol);
        }
    }
}

#[test]
fn channel_norms_backward() {
    for (dt, tol) in [(DType::F64, 1e-12), (DType::F32, 5e-5)] {
        for shape in [[4usize, 6, 5, 7], [2, 6, 33, 1], [1, 6, 1, 1]] {
            let x = rand(&shape, 11, dt).mul_scalar(2.0).unwrap();
            let (w, b) = (rand(&[6], 12, dt), rand(&[6], 13, dt));
            let g = rand(&shape, 14, dt);
            let ins = [x, w, b];
            if shape[0] * shape[2] * shape[3] > 1 {
                let fused = grads(&ins, &g, |t| {
                    Ok(t[0].batch_norm_train(&t[1], &t[2], 1e-5)?.0)
                });
                let slow = grads(&ins, &g, |t| {
                    composed::batch_norm(&t[0], &t[1], &t[2], 1e-5)
                });
                assert_close(&fused, &slow, tol);
            }
            for groups in [1, 3, 6] {
                let fused = grads(&ins, &g, |t| t[0].group_norm(groups, &t[1], &t[2], 1e-5));
                let slow = grads(&ins, &g, |t| {
                    composed::group_norm(&t[0], groups, &t[1], &t[2], 1e-5)
                });
                assert_close(&fused, &slow, tol);
            }
        }
    }
}

/// Convolution gradients (conv_transpose2d for the input, the weight-gradient op) against
/// autodiff through im2col written with primitives: pad by cat, gather taps by narrow,
/// contract by matmul.
#[test]
fn conv2d_backward_matches_a_composition() {
    use ferrite_core::{ConvArgs, Padding};
    // A small plane (whole-batch GEMMs on the CPU) and one of >= 256 pixels (per item).
    let configs = [
        (
            2usize, 4usize, 9usize, 8usize, 6usize, 3usize, 2usize, 1usize,
        ),
        (2, 2, 17, 16, 3, 3, 1, 1),
    ];
    for (dt, tol) in [(DType::F64, 1e-12), (DType::F32, 5e-5)] {
        for (n, c, h, wd, o, k, s, p) in configs {
            let x = rand(&[n, c, h, wd], 15, dt);
            let w = rand(&[o, c, k, k], 16, dt);
            let args = ConvArgs {
                stride: [s, s],
                padding: Padding::Zeros([p, p]),
                ..ConvArgs::default()
            };
            let oh = (h + 2 * p - k) / s + 1;
            let ow = (wd + 2 * p - k) / s + 1;
            let g = rand(&[n, o, oh, ow], 17, dt);
            let ins = [x, w];
            let fused = grads(&ins, &g, |t| t[0].conv2d(&t[1], None, &args));
            let slow = grads(&ins, &g, |t| {
                let (x, w) = (&t[0], &t[1]);
                let zr = Tensor::zeros([n, c, p, wd], dt, x.device())?;
                let xp = Tensor::cat(&[&zr, x, &zr], 2)?;
                let zc = Tensor::zeros([n, c, h + 2 * p, p], dt, x.device())?;
                let xp = Tensor::cat(&[&zc, &xp, &zc], 3)?;
                let mut y: Option<Tensor> = None;
                for i in 0..k {
                    for j in 0..k {
                        // Taps (i, j) of every output: rows i, i + s, ... and likewise columns.
                        let mut rows = Vec::new();
                        for r in 0..oh {
                            let mut cols = Vec::new();
                            for q in 0..ow {
                                cols.push(xp.narrow(2, r * s + i, 1)?.narrow(3, q * s + j, 1)?);
                            }
                            let refs: Vec<&Tensor> = cols.iter().collect();
                            rows.push(Tensor::cat(&refs, 3)?);
                        }
                        let refs: Vec<&Tensor> = rows.iter().collect();
                        let taps = Tensor::cat(&refs, 2)?; // [n, c, oh, ow]
                        let wij = w.narrow(2, i, 1)?.narrow(3, j, 1)?.reshape([o, c])?;
                        let term = wij
                            .matmul(&taps.reshape([n, c, oh * ow])?)?
                            .reshape([n, o, oh, ow])?;
                        y = Some(match y {
                            Some(acc) => acc.add(&term)?,
                            None => term,
                        });
                    }
                }
                y.ok_or_else(|| ferrite_core::Error::backend("test", "no taps"))
            });
            assert_close(&fused, &slow, tol);
        }
    }
}

#[test]
fn backward_kernels_validate_their_inputs() {
    let x = rand(&[3, 4], 1, DType::F32);
    let e = Tensor::rms_norm_backward(&x, &rand(&[5], 2, DType::F32), &x, 1e-6)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("rms_norm_backward: parameter [5] does not match"),
        "{e}"
    );
    let e = Tensor::softmax_backward(&x, &rand(&[4, 3], 3, DType::F32), false)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("softmax_backward: shapes differ"), "{e}");
    let q = rand(&[1, 2, 3, 4], 4, DType::F32);
    let e = Tensor::attention_backward(
        &q,
        &q,
        &q,
        None,
        &rand(&[1, 2, 3, 5], 5, DType::F32),
        true,
        0.5,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("attention_backward: upstream gradient [1, 2, 3, 5]"),
        "{e}"
    );
}

/// A key-padding mask [2, lk]: batch row 0 pads keys 1 and lk - 1; batch row 1 every third
/// key from key 1, or every key with `full`.
fn padding_mask(lk: usize, full: bool) -> Tensor {
    let mut m = vec![false; 2 * lk];
    m[1] = true;
    m[lk - 1] = true;
    for j in 0..lk {
        m[lk + j] = full || j % 3 == 1;
    }
    Tensor::from_vec(m, [2, lk], &cpu()).unwrap()
}

#[test]
fn attention_backward_key_padding_mask() {
    for (dt, tol) in [(DType::F64, 1e-12), (DType::F32, 5e-5)] {
        for (lq, lk, causal) in [(7, 7, true), (3, 11, true), (5, 9, false), (1, 33, true)] {
            let q = rand(&[2, 6, lq, 16], 7, dt);
            let k = rand(&[2, 2, lk, 16], 8, dt);
            let v = rand(&[2, 2, lk, 12], 9, dt);
            let g = rand(&[2, 6, lq, 12], 10, dt);
            let m = padding_mask(lk, false);
            let ins = [q, k, v];
            let fused = grads(&ins, &g, |t| {
                Tensor::attention_masked(&t[0], &t[1], &t[2], Some(&m), causal, None)
            });
            let slow = grads(&ins, &g, |t| {
                composed::attention_masked(&t[0], &t[1], &t[2], Some(&m), causal, None)
            });
            assert_close(&fused, &slow, tol);
            // Padded keys get no gradient.
            let (dk, dv) = (&fused[1], &fused[2]);
            for (b, j) in [(0, 1), (0, lk - 1), (1, 1)] {
                for h in 0..2 {
                    let kr = (b * 2 + h) * lk + j;
                    assert!(dk[kr * 16..(kr + 1) * 16].iter().all(|&x| x == 0.0));
                    assert!(dv[kr * 12..(kr + 1) * 12].iter().all(|&x| x == 0.0));
                }
            }
        }
    }
}

/// A batch row whose every key is padding: NaN forward; backward its dq rows are zero and it
/// adds nothing to dk and dv (PyTorch's SDPA gives these zero gradients too), while the other
/// batch row's gradients equal the composition's.
#[test]
fn attention_backward_fully_masked_rows_are_zero() {
    for (dt, tol) in [(DType::F64, 1e-12), (DType::F32, 5e-5)] {
        for causal in [false, true] {
            let q = rand(&[2, 4, 5, 8], 1, dt);
            let k = rand(&[2, 2, 6, 8], 2, dt);
            let v = rand(&[2, 2, 6, 8], 3, dt);
            let g = rand(&[2, 4, 5, 8], 4, dt);
            let m = padding_mask(6, true);
            let ins = [q, k, v];
            let fused = grads(&ins, &g, |t| {
                Tensor::attention_masked(&t[0], &t[1], &t[2], Some(&m), causal, None)
            });
            let slow = grads(&ins, &g, |t| {
                composed::attention_masked(&t[0], &t[1], &t[2], Some(&m), causal, None)
            });
            for (f, s) in fused.iter().zip(&slow) {
                let half = f.len() / 2;
                assert!(f[half..].iter().all(|&x| x == 0.0), "batch row 1: zero");
                assert_close(&[f[..half].to_vec()], &[s[..half].to_vec()], tol);
            }
        }
    }
}
