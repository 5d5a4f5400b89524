//! Convolution, pooling and channel-norm layers against PyTorch on the CPU (the fixture
//! check lives in `ferrite_testing::torch_layers`, which the CUDA tests run too), and their
//! construction and shape errors.

use ferrite_core::{ConvArgs, DType, Padding, PoolArgs, Tensor};
use ferrite_nn::*;

#[test]
fn layers_match_pytorch_on_cpu() {
    let (checked, failures) = ferrite_testing::torch_layers::check_all(&ferrite_cpu::cpu());
    println!("{checked} layer cases match PyTorch");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn bad_hyperparameters_are_errors_at_construction() {
    let dev = ferrite_cpu::cpu();
    let dt = DType::F32;
    let msg = |e: ferrite_core::Error| e.to_string();
    let groups = ConvArgs {
        groups: 3,
        ..ConvArgs::default()
    };
    let e = Conv2d::new(4, 6, [3, 3], groups, true, dt, &dev)
        .err()
        .map(msg);
    assert_eq!(
        e.as_deref(),
        Some("Conv2d: groups 3 must divide in_channels 4 and out_channels 6")
    );
    let same = ConvArgs {
        stride: [2],
        padding: Padding::Same,
        ..ConvArgs::default()
    };
    let e = Conv1d::new(4, 6, 3, same, true, dt, &dev).err().map(msg);
    assert!(e
        .unwrap_or_default()
        .contains("padding='same' needs stride 1"));
    let mut pool = PoolArgs::new([3, 3]);
    pool.padding = [2, 1];
    let e = MaxPool2d::new(pool).err().map(msg).unwrap_or_default();
    assert!(
        e.starts_with("MaxPool2d: padding [2, 1] must be at most half"),
        "{e}"
    );
    for p in [-0.1, 1.0, f64::NAN] {
        assert!(Dropout2d::new(p).is_err(), "p = {p}");
    }
    let e = GroupNorm::new(4, 6, 1e-5, true, dt, &dev).err().map(msg);
    assert_eq!(
        e.as_deref(),
        Some("GroupNorm: num_groups 4 must divide num_channels 6")
    );
    let e = BatchNorm::new_2d(3, 1e-5, Some(1.5), true, true, dt, &dev)
        .err()
        .map(msg);
    assert!(e.unwrap_or_default().contains("momentum must be in [0, 1]"));
}

#[test]
fn shape_errors_name_the_module_path_and_type() {
    let dev = ferrite_cpu::cpu();
    let dt = DType::F32;
    let conv = |cin, cout| -> Box<dyn Module> {
        let a = ConvArgs {
            padding: Padding::Zeros([1, 1]),
            ..ConvArgs::default()
        };
        Box::new(Conv2d::new(cin, cout, [3, 3], a, true, dt, &dev).unwrap())
    };
    let mut features = Sequential::new();
    features.push(conv(3, 8));
    features.push(Box::new(BatchNorm::default_2d(8, dt, &dev).unwrap()));
    features.push(Box::new(MaxPool2d::new(PoolArgs::new([2, 2])).unwrap()));
    features.push(conv(64, 64));
    let x = Tensor::zeros([8, 3, 16, 16], dt, &dev).unwrap();
    let e = features
        .forward(&x)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert_eq!(
        e,
        "3 (Conv2d): expected 64 input channels, got 8 in input [8, 8, 8, 8]"
    );
    // A kernel larger than the padded input: the op's message, under the module's name.
    let pool = MaxPool2d::new(PoolArgs::new([5, 5])).unwrap();
    let e = pool
        .forward(&Tensor::zeros([1, 1, 3, 3], dt, &dev).unwrap())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.starts_with("MaxPool2d: max_pool2d: kernel [5, 5]"), "{e}");
    // Batch norm needs more than one value per channel in training, not in eval.
    let mut bn = BatchNorm::default_1d(4, dt, &dev).unwrap();
    let one = Tensor::zeros([1, 4], dt, &dev).unwrap();
    assert!(bn.forward(&one).is_err());
    bn.eval();
    assert!(bn.forward(&one).is_ok());
}

#[test]
fn dropout2d_zeroes_whole_channels_in_training_only() {
    let dev = ferrite_cpu::cpu();
    let mut d = Dropout2d::new(0.5).unwrap();
    let x = Tensor::ones([4, 16, 3, 3], DType::F32, &dev).unwrap();
    let y = d.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let mut zeroed = 0;
    for plane in y.chunks(9) {
        assert!(
            plane.iter().all(|&v| v == plane[0]),
            "a plane is mixed: {plane:?}"
        );
        assert!(plane[0] == 0.0 || plane[0] == 2.0, "{}", plane[0]);
        zeroed += (plane[0] == 0.0) as usize;
    }
    assert!(
        (16..=48).contains(&zeroed),
        "{zeroed} of 64 planes zeroed at p = 0.5"
    );
    d.eval();
    assert_eq!(
        d.forward(&x).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0; 4 * 16 * 9]
    );
}
