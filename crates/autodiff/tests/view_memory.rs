//! A recorded view (reshape, narrow, broadcast) keeps its input's dims, not its values: when
//! the op that reads the view keeps nothing (a cast, a sum), the input's storage is free as
//! soon as the caller drops it, as it would be without the view. (Its own test binary, so no
//! other test allocates meanwhile: it reads the process-wide `bytes_in_use`.)

use ferrite_autodiff::{backward, Var};
use ferrite_core::{DType, Tensor};
use ferrite_cpu::{bytes_in_use, cpu};

/// A view, by name.
type View = (&'static str, fn(&Tensor) -> Tensor);

#[test]
fn views_keep_dims_not_values() {
    let dev = cpu();
    let x = Var::new(&Tensor::ones([256, 256], DType::F32, &dev).unwrap()).unwrap();
    let views: [View; 3] = [
        ("reshape", |a| a.reshape([64, 1024]).unwrap()),
        ("narrow", |a| a.narrow(0, 16, 128).unwrap()),
        ("broadcast", |a| {
            a.reshape([1, 256, 256])
                .unwrap()
                .broadcast_to([2, 256, 256])
                .unwrap()
        }),
    ];
    for (name, view) in views {
        // Per view: the backward before it may have made shared constants (a narrow's zero
        // padding, `Tensor::constant`), kept for the process.
        let baseline = bytes_in_use();
        let loss = {
            // 256 KiB, read by the view only; the cast and the sum keep dims, not values.
            let a = x.tensor().mul_scalar(3.0).unwrap();
            view(&a).cast(DType::F16).unwrap().sum(&[], false).unwrap()
        };
        let held = bytes_in_use() - baseline;
        assert!(
            held < 4 << 10,
            "{name}: {held} bytes held after the forward; the view's input (262,144) must not be"
        );
        backward(&loss).unwrap();
        let g = x.grad().unwrap().to_vec_f64().unwrap();
        // d/dx of sum(view(3x)) = 3 times how often the view reads element x.
        let reads = |i: usize| match name {
            "narrow" => usize::from((16..144).contains(&(i / 256))),
            "broadcast" => 2,
            _ => 1,
        };
        for (i, v) in g.iter().enumerate() {
            assert_eq!(*v, 3.0 * reads(i) as f64, "{name}: gradient at {i}");
        }
        x.zero_grad();
    }
}
