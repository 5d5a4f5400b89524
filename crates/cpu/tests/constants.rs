//! `Tensor::constant`: one shared read-only tensor per (device, dtype, value, shape), never
//! written in place.

use ferrite_core::optim::{fused_update, FusedUpdate, UpdateClip, UpdateRule};
use ferrite_core::{DType, Tensor};
use ferrite_cpu::cpu;

#[test]
fn constants_are_shared_per_value_dtype_and_shape() {
    let dev = cpu();
    let a = Tensor::constant(0.25, [3, 2], DType::F32, &dev).unwrap();
    let b = Tensor::constant(0.25, [3, 2], DType::F32, &dev).unwrap();
    assert!(a.shares_storage(&b) && a.is_constant());
    assert_eq!(a.to_vec::<f32>().unwrap(), [0.25; 6]);
    for other in [
        Tensor::constant(0.5, [3, 2], DType::F32, &dev).unwrap(),
        Tensor::constant(0.25, [6], DType::F32, &dev).unwrap(),
        Tensor::constant(0.25, [3, 2], DType::F64, &dev).unwrap(),
        Tensor::constant(-0.0, [3, 2], DType::F32, &dev).unwrap(),
    ] {
        assert!(!other.shares_storage(&a) && other.is_constant());
    }
    assert_eq!(
        Tensor::constant(-3.0, (), DType::I64, &dev)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        [-3]
    );
    // scalar_like hands out the shared 0-d constant; full makes a tensor of its own.
    let x = Tensor::ones([4], DType::F32, &dev).unwrap();
    assert!(x
        .scalar_like(7.0)
        .unwrap()
        .shares_storage(&x.scalar_like(7.0).unwrap()));
    let own = Tensor::full(0.25, [3, 2], DType::F32, &dev).unwrap();
    assert!(!own.is_constant() && !own.shares_storage(&a));
}

#[test]
fn constants_are_never_written() {
    let dev = cpu();
    let c = Tensor::constant(2.0, [2], DType::F32, &dev).unwrap();
    let src = Tensor::from_vec(vec![5.0f32, 6.0], [2], &dev).unwrap();
    let e = c.copy_(&src).unwrap_err().to_string();
    assert!(e.contains("copy_") && e.contains("shared constant"), "{e}");
    assert_eq!(c.to_vec::<f32>().unwrap(), [2.0, 2.0]);

    // A constant as a parameter of the fused optimizer step: refused, the value unchanged.
    let g = Tensor::ones([2], DType::F32, &dev).unwrap();
    let scalar = |v: f64| Tensor::full(v, (), DType::F64, &dev).unwrap();
    let (lr, step, sq) = (scalar(0.1), scalar(1.0), scalar(0.0));
    let e = fused_update(&FusedUpdate {
        rule: UpdateRule::Sgd {
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        },
        params: std::slice::from_ref(&c),
        grads: std::slice::from_ref(&g),
        states: &[vec![]],
        first: &[true],
        lr: &lr,
        step: &step,
        grad_sq: &sq,
        grad_scale: None,
        clip: UpdateClip::None,
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("fused_update") && e.contains("shared constant"),
        "{e}"
    );
    assert_eq!(c.to_vec::<f32>().unwrap(), [2.0, 2.0]);
}
