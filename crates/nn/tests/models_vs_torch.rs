//! Whole models against PyTorch on the CPU: a narrow ResNet-18 (torchvision's layout and
//! names) and a 2-layer TransformerEncoder load PyTorch's state dicts unchanged and match its
//! output, every parameter gradient, the running statistics after the step, and the eval
//! output (`scripts/nn_model_fixtures.py`; the same check runs on CUDA in tests/gpu.rs).

#[path = "support/models.rs"]
mod models;
#[path = "support/torch_cases.rs"]
#[allow(dead_code)]
mod torch_cases;

use ferrite_core::{DType, Tensor};
use ferrite_nn::models::{ResNet, ResNetConfig, TransformerEncoder};
use ferrite_nn::{EncoderConfig, Module, ModuleExt};

#[test]
fn resnet18_and_encoder_match_pytorch_f64() {
    let (checked, failures) = models::check_all(&ferrite_cpu::cpu(), DType::F64, 1e-9);
    println!("{checked} tensors match PyTorch (f64)");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked > 150, "only {checked} tensors checked");
}

#[test]
fn resnet18_and_encoder_match_pytorch_f32() {
    let (checked, failures) = models::check_all(&ferrite_cpu::cpu(), DType::F32, 1e-3);
    println!("{checked} tensors match PyTorch (f32)");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn full_width_resnet18_has_torchvision_names_and_size() {
    let m = ResNet::new(
        &ResNetConfig::resnet18(1000),
        DType::F32,
        &ferrite_cpu::cpu(),
    )
    .unwrap();
    // torchvision.models.resnet18(): 11,689,512 parameters, 122 state-dict entries.
    assert_eq!(m.num_parameters().1, 11_689_512);
    let sd = ferrite_nn::state_dict(&m);
    assert_eq!(sd.len(), 122);
    for k in [
        "conv1.weight",
        "bn1.running_var",
        "layer1.1.conv2.weight",
        "layer2.0.downsample.0.weight",
        "layer4.1.bn2.num_batches_tracked",
        "fc.bias",
    ] {
        assert!(sd.iter().any(|(n, _)| n == k), "{k} missing");
    }
}

#[test]
fn model_errors_name_the_module_path() {
    let dev = ferrite_cpu::cpu();
    let m = models::resnet18_narrow(DType::F32, &dev).unwrap();
    let x = Tensor::zeros([2, 1, 32, 32], DType::F32, &dev).unwrap();
    let e = m.forward(&x).unwrap_err().to_string();
    assert!(
        e.starts_with("conv1 (Conv2d): expected 3 input channels"),
        "{e}"
    );
    let bad = ResNetConfig {
        blocks: vec![2, 2],
        ..ResNetConfig::resnet18(10)
    };
    let e = ResNet::new(&bad, DType::F32, &dev)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("one positive block count per stage"), "{e}");
    let e = TransformerEncoder::new(EncoderConfig::new(30, 4), 2, true, DType::F32, &dev)
        .err()
        .unwrap()
        .to_string();
    assert!(e.starts_with("layers.0"), "{e}");
}
