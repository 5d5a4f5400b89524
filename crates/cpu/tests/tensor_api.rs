//! The Tensor API on the CPU: views share storage, creation, RNG reproducibility, and errors
//! that name the op and the shapes/dtypes for bad input.

use ferrite_core::{rng, DType, Error, Tensor};
use ferrite_cpu::cpu;

fn t(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, &cpu()).unwrap()
}

#[test]
fn views_share_storage_and_copy_only_when_needed() {
    let x = Tensor::arange(0.0, 24.0, 1.0, DType::F32, &cpu())
        .unwrap()
        .reshape([2, 3, 4])
        .unwrap();
    let p = x.permute(&[2, 0, 1]).unwrap();
    assert!(p.shares_storage(&x));
    assert_eq!(p.dims(), &[4, 2, 3]);
    assert_eq!(p.to_vec::<f32>().unwrap()[..4], [0.0, 4.0, 8.0, 12.0]);
    let n = x.narrow(2, 1, 2).unwrap();
    assert!(n.shares_storage(&x));
    assert_eq!(
        n.to_vec::<f32>().unwrap(),
        vec![1., 2., 5., 6., 9., 10., 13., 14., 17., 18., 21., 22.]
    );
    // Reshape of a narrowed view splitting the outer dim: still a view.
    assert!(n.reshape([6, 2]).unwrap().shares_storage(&x));
    // Flattening a transposed view needs a copy.
    let tr = x.transpose(0, 2).unwrap();
    let f = tr.flatten().unwrap();
    assert!(!f.shares_storage(&x));
    assert_eq!(f.to_vec::<f32>().unwrap()[..3], [0.0, 12.0, 4.0]);
    // contiguous() of a contiguous tensor is the same storage.
    assert!(x.contiguous().unwrap().shares_storage(&x));
    assert!(!tr.contiguous().unwrap().shares_storage(&x));
    let b = t(&[1.0, 2.0, 3.0], &[3, 1]).broadcast_to([3, 4]).unwrap();
    assert_eq!(b.layout().strides(), &[1, 0]);
    assert_eq!(
        b.to_vec::<f32>().unwrap(),
        vec![1., 1., 1., 1., 2., 2., 2., 2., 3., 3., 3., 3.]
    );
    let e = t(&[1.0, 2.0, 3.0], &[3, 1]).expand(&[2, -1, 5]).unwrap();
    assert_eq!(e.dims(), &[2, 3, 5]);
    let s = x.unsqueeze(1).unwrap();
    assert_eq!(s.dims(), &[2, 1, 3, 4]);
    assert_eq!(s.squeeze(1).unwrap().dims(), &[2, 3, 4]);
    assert_eq!(x.reshape_infer(&[-1, 4]).unwrap().dims(), &[6, 4]);
}

#[test]
fn creation() {
    let dev = cpu();
    assert_eq!(
        Tensor::zeros([2, 2], DType::I32, &dev)
            .unwrap()
            .to_vec::<i32>()
            .unwrap(),
        vec![0; 4]
    );
    assert_eq!(
        Tensor::ones([3], DType::BF16, &dev)
            .unwrap()
            .to_vec_f64()
            .unwrap(),
        vec![1.0; 3]
    );
    assert_eq!(
        Tensor::full(2.5, [2], DType::F64, &dev)
            .unwrap()
            .to_vec::<f64>()
            .unwrap(),
        vec![2.5, 2.5]
    );
    assert_eq!(
        Tensor::arange(1.0, 2.0, 0.25, DType::F32, &dev)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![1.0, 1.25, 1.5, 1.75]
    );
    assert_eq!(
        Tensor::arange(5.0, 0.0, -2.0, DType::I64, &dev)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![5, 3, 1]
    );
    assert_eq!(Tensor::scalar(7u8, &dev).unwrap().item::<u8>().unwrap(), 7);
}

#[test]
fn random_tensors_are_reproducible_and_match_the_counter_formula() {
    let dev = cpu();
    let a = Tensor::rand_uniform([1000], -1.0, 1.0, 42, DType::F32, &dev)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let b = Tensor::rand_uniform([1000], -1.0, 1.0, 42, DType::F32, &dev)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let c = Tensor::rand_uniform([1000], -1.0, 1.0, 43, DType::F32, &dev)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    for (i, &v) in a.iter().enumerate() {
        assert_eq!(v, rng::uniform(42, i as u64, -1.0, 1.0));
    }
    let n = Tensor::rand_normal([100_000], 1.0, 2.0, 9, DType::F32, &dev).unwrap();
    let mean = n.mean(&[], false).unwrap().item::<f32>().unwrap();
    let std = n
        .var(&[], false, true)
        .unwrap()
        .sqrt()
        .unwrap()
        .item::<f32>()
        .unwrap();
    assert!((mean - 1.0).abs() < 0.03, "{mean}");
    assert!((std - 2.0).abs() < 0.03, "{std}");
    assert_eq!(n.to_vec::<f32>().unwrap()[17], rng::normal(9, 17, 1.0, 2.0));
    assert!(Tensor::rand_uniform([2], 0.0, 1.0, 1, DType::I32, &dev).is_err());
}

#[test]
fn display_shows_values_and_shape() {
    let x = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    assert_eq!(
        format!("{x}"),
        "[[1.0000, 2.0000], [3.0000, 4.0000]] (f32, [2, 2], cpu)"
    );
    let long = Tensor::arange(0.0, 20.0, 1.0, DType::I64, &cpu()).unwrap();
    assert_eq!(
        format!("{long}"),
        "[0, 1, 2, 3, ..., 16, 17, 18, 19] (i64, [20], cpu)"
    );
}

fn msg(e: Error) -> String {
    e.to_string()
}

#[test]
fn bad_input_errors_name_the_op_and_shapes() {
    let dev = cpu();
    let a = t(&[0.0; 12], &[4, 3]);
    let b = t(&[0.0; 10], &[5, 2]);
    assert_eq!(
        msg(a.matmul(&b).unwrap_err()),
        "matmul: inner dimensions differ: [4, 3] x [5, 2]"
    );
    assert_eq!(
        msg(a.reshape([5]).unwrap_err()),
        "reshape: cannot reshape [4, 3] (12 elements) to [5] (5 elements)"
    );
    let idx = Tensor::from_slice(&[0u32, 3], [2], &dev).unwrap();
    assert_eq!(
        msg(a
            .index_select(&idx, 0)
            .unwrap()
            .index_select(&idx, 1)
            .unwrap_err()),
        "index_select: index 3 out of range for axis 1 of size 3"
    );
    let neg = Tensor::from_slice(&[-1i64], [1], &dev).unwrap();
    assert!(msg(a.index_select(&neg, 0).unwrap_err()).contains("index -1 out of range"));
    assert!(msg(a
        .gather(&Tensor::from_slice(&[3i32; 4], [4, 1], &dev).unwrap(), 1)
        .unwrap_err())
    .starts_with("gather: index 3 out of range"));
    assert!(msg(a.add(&b).unwrap_err()).contains("add: shapes [4, 3] and [5, 2] do not broadcast"));
    let i = Tensor::zeros([4, 3], DType::I32, &dev).unwrap();
    assert_eq!(
        msg(a.add(&i).unwrap_err()),
        "add: dtypes differ: f32 and i32"
    );
    assert!(msg(i.exp().unwrap_err()).starts_with("exp: dtype i32 not supported"));
    assert!(msg(i.div(&i).unwrap_err()).contains("integer division by zero"));
    assert_eq!(
        msg(a.sum(&[2], false).unwrap_err()),
        "sum: axis 2 out of range for a tensor of rank 2"
    );
    assert!(msg(a.narrow(0, 3, 2).unwrap_err()).starts_with("narrow: range 3..5 out of bounds"));
    assert!(msg(a.permute(&[0, 0]).unwrap_err()).starts_with("permute:"));
    assert!(
        msg(Tensor::from_slice(&[1.0f32; 5], [2, 3], &dev).unwrap_err())
            .starts_with("from_vec: 5 elements")
    );
    assert!(msg(a.to_vec::<f64>().unwrap_err()).contains("to_vec: dtypes differ"));
    assert!(msg(a.squeeze(0).unwrap_err()).starts_with("squeeze:"));
    assert!(msg(Tensor::cat(&[&a, &b], 0).unwrap_err()).starts_with("cat: shapes differ"));
    assert!(msg(a.topk(4, 1, true).unwrap_err()).starts_with("topk: k = 4 exceeds"));
    let w = t(&[1.0; 4], &[4]);
    assert!(msg(a.rms_norm(&w, 1e-6).unwrap_err())
        .starts_with("rms_norm: parameter [4] does not match"));
    let q = t(&[0.0; 16], &[1, 2, 2, 4]);
    let k = t(&[0.0; 24], &[1, 3, 2, 4]);
    assert!(msg(Tensor::attention(&q, &k, &k, true, None).unwrap_err())
        .starts_with("attention: q, k, v must be"));
    assert!(
        msg(Tensor::zeros([usize::MAX, 4], DType::F32, &dev).unwrap_err()).contains("overflows")
    );
    assert!(
        msg(Tensor::arange(0.0, 1.0, 0.0, DType::F32, &dev).unwrap_err())
            .starts_with("arange: invalid range")
    );
}

#[test]
fn matmul_reads_transposed_views_in_place() {
    // A^T B with A stored [k, m]: the result must match the explicit copy.
    let a = Tensor::rand_uniform([65, 45], -1.0, 1.0, 1, DType::F32, &cpu()).unwrap();
    let b = Tensor::rand_uniform([65, 33], -1.0, 1.0, 2, DType::F32, &cpu()).unwrap();
    let view = a.t().unwrap().matmul(&b).unwrap().to_vec::<f32>().unwrap();
    let copy = a
        .t()
        .unwrap()
        .contiguous()
        .unwrap()
        .matmul(&b)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(view, copy);
}

#[test]
fn pooled_large_buffers_are_fully_overwritten() {
    // Outputs >= 4 MiB reuse buffers of dropped tensors; each reuse must hold only new values.
    let dev = cpu();
    let n = 3 << 20;
    let x = Tensor::rand_uniform([n], 0.0, 1.0, 5, DType::F32, &dev).unwrap();
    for round in 0..3 {
        let big = Tensor::full(1e9, [n], DType::F32, &dev).unwrap();
        drop(big);
        let y = x.add_scalar(round as f64).unwrap().sqrt().unwrap();
        let (xv, yv) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
        for i in (0..n).step_by(9973) {
            assert_eq!(yv[i], (xv[i] + round as f32).sqrt());
        }
        assert!(yv.iter().all(|&v| v < 2.5));
    }
}

#[test]
fn large_threaded_matmul_matches_a_naive_product() {
    // Sizes past gemm's blocking and threading thresholds, odd on every dim.
    let (m, k, n) = (301, 517, 263);
    let dev = cpu();
    let a = Tensor::rand_uniform([m, k], -1.0, 1.0, 11, DType::F32, &dev).unwrap();
    let b = Tensor::rand_uniform([n, k], -1.0, 1.0, 12, DType::F32, &dev)
        .unwrap()
        .t()
        .unwrap();
    let c = a.matmul(&b).unwrap().to_vec::<f32>().unwrap();
    let (av, bv) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    for i in (0..m).step_by(7) {
        for j in (0..n).step_by(5) {
            let want: f64 = (0..k).map(|p| av[i * k + p] * bv[p * n + j]).sum();
            assert!(
                (c[i * n + j] as f64 - want).abs() < 1e-4,
                "[{i}, {j}]: {} vs {want}",
                c[i * n + j]
            );
        }
    }
}

/// Convolution and pooling refuse bad shapes and geometry with errors naming the op and the
/// shapes involved.
#[test]
fn conv_and_pool_errors_name_the_op_and_shapes() {
    use ferrite_core::{ConvArgs, ConvTransposeArgs, Padding, PoolArgs};
    let dev = ferrite_cpu::cpu();
    let t = |s: &[usize]| Tensor::zeros(s, DType::F32, &dev).unwrap();
    let msg = |r: ferrite_core::Result<Tensor>| r.err().map(|e| e.to_string()).unwrap_or_default();

    let e = msg(t(&[8, 32, 56, 56]).conv2d(&t(&[64, 64, 3, 3]), None, &ConvArgs::default()));
    assert!(e.starts_with("conv2d: expected 64 input channels"), "{e}");
    assert!(e.contains("got 32 in input [8, 32, 56, 56]"), "{e}");

    let bad_groups = ConvArgs {
        groups: 3,
        ..ConvArgs::default()
    };
    let e = msg(t(&[1, 6, 5, 5]).conv2d(&t(&[4, 2, 3, 3]), None, &bad_groups));
    assert!(
        e.contains("groups 3 does not divide the 4 output channels"),
        "{e}"
    );

    let e = msg(t(&[1, 3, 4, 4]).conv2d(&t(&[2, 3, 5, 5]), None, &ConvArgs::default()));
    assert!(e.contains("larger than input [1, 3, 4, 4]"), "{e}");

    let strided_same = ConvArgs {
        stride: [2, 2],
        padding: Padding::Same,
        ..ConvArgs::default()
    };
    let e = msg(t(&[1, 3, 8, 8]).conv2d(&t(&[2, 3, 3, 3]), None, &strided_same));
    assert!(e.contains("'same' needs stride 1"), "{e}");

    let e = msg(t(&[1, 2, 4, 4]).conv2d(&t(&[3, 2, 3, 3]), Some(&t(&[4])), &ConvArgs::default()));
    assert!(e.contains("bias must be [3]"), "{e}");

    let op_pad = ConvTransposeArgs {
        stride: [2, 2],
        output_padding: [2, 0],
        ..ConvTransposeArgs::default()
    };
    let e = msg(t(&[1, 2, 4, 4]).conv_transpose2d(&t(&[2, 3, 3, 3]), None, &op_pad));
    assert!(
        e.starts_with("conv_transpose2d: output_padding [2, 0]"),
        "{e}"
    );

    let mut pool = PoolArgs::new([2, 2]);
    pool.padding = [2, 0];
    let e = msg(t(&[1, 1, 8, 8]).max_pool2d(&pool));
    assert!(
        e.contains("padding [2, 0] must be at most half of kernel [2, 2]"),
        "{e}"
    );
    let e = msg(t(&[1, 1, 2, 2]).avg_pool2d(&PoolArgs::new([3, 3])));
    assert!(e.starts_with("avg_pool2d: kernel [3, 3]"), "{e}");
    let e = msg(t(&[1, 2, 3]).conv2d(&t(&[1, 2, 1, 1]), None, &ConvArgs::default()));
    assert!(e.contains("expected input [n, c, h, w]"), "{e}");
}

/// 'same' padding keeps the size, with the odd extra element on the right as PyTorch does:
/// the result equals an explicit pad of (1 left, 2 right) through cat.
#[test]
fn conv2d_same_pads_the_extra_element_on_the_right() {
    use ferrite_core::{ConvArgs, Padding};
    let dev = ferrite_cpu::cpu();
    let x = Tensor::rand_uniform([1, 2, 6, 7], -1.0, 1.0, 1, DType::F64, &dev).unwrap();
    let w = Tensor::rand_uniform([3, 2, 4, 1], -1.0, 1.0, 2, DType::F64, &dev).unwrap();
    let same = ConvArgs {
        padding: Padding::Same,
        ..ConvArgs::default()
    };
    let y = x.conv2d(&w, None, &same).unwrap();
    assert_eq!(y.dims(), [1, 3, 6, 7]);
    let z = |n: usize| Tensor::zeros([1, 2, n, 7], DType::F64, &dev).unwrap();
    let xp = Tensor::cat(&[&z(1), &x, &z(2)], 2).unwrap();
    let want = xp.conv2d(&w, None, &ConvArgs::default()).unwrap();
    assert_eq!(y.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
}
