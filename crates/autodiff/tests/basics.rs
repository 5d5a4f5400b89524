//! The autodiff API on the CPU: leaves, accumulation, no_grad, detach, and bad use.

use ferrite_autodiff::{backward, backward_with, no_grad, Var};
use ferrite_core::{DType, Tensor};
use ferrite_cpu::cpu;

fn v(data: &[f64], shape: &[usize]) -> Var {
    Var::new(&Tensor::from_slice(data, shape, &cpu()).unwrap()).unwrap()
}

#[test]
fn gradient_of_a_small_expression() {
    // f(x, y) = sum(x * y + x^2) -> df/dx = y + 2x, df/dy = x.
    let x = v(&[1.0, 2.0, 3.0], &[3]);
    let y = v(&[4.0, 5.0, 6.0], &[3]);
    let f = x
        .tensor()
        .mul(y.tensor())
        .unwrap()
        .add(&x.tensor().square().unwrap())
        .unwrap()
        .sum_all()
        .unwrap();
    assert!(f.requires_grad());
    backward(&f).unwrap();
    assert_eq!(
        x.grad().unwrap().to_vec::<f64>().unwrap(),
        vec![6.0, 9.0, 12.0]
    );
    assert_eq!(
        y.grad().unwrap().to_vec::<f64>().unwrap(),
        vec![1.0, 2.0, 3.0]
    );
}

#[test]
fn cast_passes_the_gradient_through() {
    let x = v(&[1.5, -2.25], &[2]);
    let y = x
        .tensor()
        .cast(DType::F32)
        .unwrap()
        .mul_scalar(3.0)
        .unwrap()
        .cast(DType::F64)
        .unwrap()
        .sum_all()
        .unwrap();
    backward(&y).unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f64>().unwrap(), vec![3.0, 3.0]);
}

#[test]
fn gradients_accumulate_until_zeroed() {
    let x = v(&[2.0], &[1]);
    for _ in 0..3 {
        let y = x.tensor().square().unwrap().sum_all().unwrap();
        backward(&y).unwrap();
    }
    assert_eq!(x.grad().unwrap().to_vec::<f64>().unwrap(), vec![12.0]);
    x.zero_grad();
    assert!(x.grad().is_none());
}

#[test]
fn no_grad_and_detach_record_nothing() {
    let x = v(&[1.0, 2.0], &[2]);
    let y = no_grad(|| x.tensor().exp().unwrap());
    assert!(!y.requires_grad());
    assert!(!x.tensor().exp().unwrap().detach().requires_grad());
    // An op with no trainable input records nothing.
    let c = Tensor::ones([2], DType::F64, &cpu()).unwrap();
    assert!(!c.exp().unwrap().requires_grad());
    // Comparisons and argmax are not differentiable.
    assert!(!x.tensor().gt(&c).unwrap().requires_grad());
    assert!(!x.tensor().argmax(0, false).unwrap().requires_grad());
}

#[test]
fn explicit_upstream_gradient() {
    let x = v(&[1.0, 2.0, 3.0], &[3]);
    let y = x.tensor().square().unwrap();
    let up = Tensor::from_slice(&[1.0, 0.5, -1.0], [3], &cpu()).unwrap();
    backward_with(&y, &up).unwrap();
    assert_eq!(
        x.grad().unwrap().to_vec::<f64>().unwrap(),
        vec![2.0, 2.0, -6.0]
    );
}

#[test]
fn bad_use_is_a_clear_error() {
    let x = v(&[1.0, 2.0], &[2]);
    let y = x.tensor().square().unwrap();
    let e = backward(&y).unwrap_err().to_string();
    assert!(
        e.starts_with("backward: needs a one-element tensor (got [2])"),
        "{e}"
    );
    let c = Tensor::ones([1], DType::F64, &cpu()).unwrap();
    let e = backward(&c).unwrap_err().to_string();
    assert!(e.contains("does not require a gradient"), "{e}");
    let wrong = Tensor::ones([3], DType::F64, &cpu()).unwrap();
    assert!(backward_with(&y, &wrong)
        .unwrap_err()
        .to_string()
        .contains("does not match output"));
    let s = y.sum_all().unwrap();
    backward(&s).unwrap();
    let e = backward(&s).unwrap_err().to_string();
    assert!(e.contains("already released"), "{e}");
    assert!(Var::new(&Tensor::ones([1], DType::I32, &cpu()).unwrap()).is_err());
}

#[test]
fn rope_backward_with_constant_angles_matches_the_composition() {
    // With cos/sin constants, backward rotates by -θ; it must equal the gradient through the
    // composed form.
    let dev = cpu();
    let r = |shape: &[usize], seed| {
        Tensor::rand_uniform(shape, -1.0, 1.0, seed, DType::F64, &dev).unwrap()
    };
    let (x0, c, s, w) = (
        r(&[2, 3, 5, 8], 1),
        r(&[5, 4], 2),
        r(&[5, 4], 3),
        r(&[2, 3, 5, 8], 4),
    );
    for interleaved in [false, true] {
        let x = Var::new(&x0).unwrap();
        backward(
            &x.tensor()
                .rope(&c, &s, interleaved)
                .unwrap()
                .mul(&w)
                .unwrap()
                .sum_all()
                .unwrap(),
        )
        .unwrap();
        let y = Var::new(&x0).unwrap();
        let composed = ferrite_core::composed::rope(y.tensor(), &c, &s, interleaved).unwrap();
        backward(&composed.mul(&w).unwrap().sum_all().unwrap()).unwrap();
        let (a, b) = (
            x.grad().unwrap().to_vec::<f64>().unwrap(),
            y.grad().unwrap().to_vec::<f64>().unwrap(),
        );
        assert!(a.iter().zip(&b).all(|(p, q)| (p - q).abs() < 1e-12));
    }
}

#[test]
fn long_chains_drop_and_backward_without_deep_recursion() {
    // 100,000 recorded ops on a thread with a 256 KiB stack: dropping the graph, and a backward
    // pass through another one, must not recurse per op.
    std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(|| {
            let x = v(&[0.5], &[1]);
            let mut y = x.tensor().clone();
            for _ in 0..100_000 {
                y = y.mul_scalar(1.0).unwrap();
            }
            drop(y);
            // Inputs kept whole (square), by dims only (sum), as an output (tanh).
            for op in [
                |t: &Tensor| t.square(),
                |t: &Tensor| t.sum(&[0], true),
                |t: &Tensor| t.tanh(),
            ] {
                let mut y = x.tensor().clone();
                for _ in 0..100_000 {
                    y = op(&y).unwrap();
                }
                drop(y);
            }
            let mut y = x.tensor().clone();
            for _ in 0..100_000 {
                y = y.add_scalar(0.0).unwrap();
            }
            backward(&y.sum_all().unwrap()).unwrap();
            assert_eq!(x.grad().unwrap().to_vec::<f64>().unwrap(), vec![1.0]);
        })
        .unwrap()
        .join()
        .unwrap();
}

/// Gradients of narrowed views of one tensor: disjoint pieces (with a gap and touching both
/// ends or not) join with zeros in the gaps; overlapping pieces, a second axis, or a use of the
/// whole tensor add up as sums. Every case against the gradient worked out by hand.
#[test]
fn narrowed_views_gradients_join_and_add() {
    // x [2, 6]; loss = sum of w_i * piece_i with per-piece weights, so each element's gradient
    // is the sum of the weights of the pieces that contain it.
    let x = v(&(0..12).map(f64::from).collect::<Vec<_>>(), &[2, 6]);
    let t = x.tensor();
    let piece = |axis: isize, start: usize, len: usize, w: f64| {
        t.narrow(axis, start, len)
            .unwrap()
            .mul_scalar(w)
            .unwrap()
            .sum_all()
            .unwrap()
    };
    let run = |terms: Vec<Tensor>| -> Vec<f64> {
        let mut f = terms[0].clone();
        for t in &terms[1..] {
            f = f.add(t).unwrap();
        }
        backward(&f).unwrap();
        let g = x.grad().unwrap().to_vec::<f64>().unwrap();
        x.zero_grad();
        g
    };
    // Disjoint pieces along the last axis with a gap at column 3: [0, 2), [2, 3), [4, 6).
    let g = run(vec![
        piece(1, 0, 2, 1.0),
        piece(1, 2, 1, 2.0),
        piece(1, 4, 2, 3.0),
    ]);
    let row = [1.0, 1.0, 2.0, 0.0, 3.0, 3.0];
    assert_eq!(g, [row, row].concat());
    // Overlapping pieces: [1, 4) and [3, 5).
    let g = run(vec![piece(1, 1, 3, 1.0), piece(1, 3, 2, 10.0)]);
    let row = [0.0, 1.0, 1.0, 11.0, 10.0, 0.0];
    assert_eq!(g, [row, row].concat());
    // Pieces along both axes, and the whole tensor once more.
    let whole = t.mul_scalar(0.5).unwrap().sum_all().unwrap();
    let g = run(vec![piece(0, 1, 1, 1.0), piece(1, 5, 1, 2.0), whole]);
    assert_eq!(
        g,
        vec![0.5, 0.5, 0.5, 0.5, 0.5, 2.5, 1.5, 1.5, 1.5, 1.5, 1.5, 3.5]
    );
    // One piece covering everything is the gradient itself.
    let g = run(vec![piece(1, 0, 6, 4.0)]);
    assert_eq!(g, vec![4.0; 12]);
}

#[test]
fn a_16_bit_weight_copy_gets_its_product_gradient_in_f32() {
    // w f32 [3, 2] used through its bf16 copy: by a product (`x wᵀ`, whose rule writes the
    // copy's gradient in f32) and by a cast back (a bf16 gradient): the two add in f32.
    // Values exact in bf16, so the f32 result is exact: d/dw sum(x wᵀ) = colsum(x) per row of
    // w, plus 1 from the cast.
    let w32 = Tensor::from_slice(&[0.5, -1.0, 2.0, 0.25, 1.5, -0.75], [3, 2], &cpu())
        .unwrap()
        .cast(DType::F32)
        .unwrap();
    let w = Var::new(&w32).unwrap();
    let x = Tensor::from_slice(&[1.0, 2.0, -3.0, 0.5], [2, 2], &cpu())
        .unwrap()
        .cast(DType::BF16)
        .unwrap();
    let wl = w.tensor().cast(DType::BF16).unwrap();
    let y = x.matmul_out(&wl.t().unwrap(), DType::F32).unwrap();
    let f = y
        .sum_all()
        .unwrap()
        .add(&wl.cast(DType::F32).unwrap().sum_all().unwrap())
        .unwrap();
    backward(&f).unwrap();
    let g = w.grad().unwrap();
    assert_eq!(g.dtype(), DType::F32);
    assert_eq!(
        g.to_vec_f64().unwrap(),
        vec![-1.0, 3.5, -1.0, 3.5, -1.0, 3.5]
    );
}
