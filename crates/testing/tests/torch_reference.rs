//! End-to-end against PyTorch on the CPU (the same checks run on CUDA in crates/cuda/tests).

use ferrite_core::DType;
use ferrite_testing::torch_reference as tr;

#[test]
fn mlp_loss_and_gradients_match_pytorch() {
    let dev = ferrite_cpu::cpu();
    tr::mlp(&dev, DType::F64, 1e-12).unwrap();
    tr::mlp(&dev, DType::F32, 1e-5).unwrap();
}

#[test]
fn attention_block_loss_and_gradients_match_pytorch() {
    let dev = ferrite_cpu::cpu();
    tr::attention(&dev, DType::F64, 1e-12).unwrap();
    tr::attention(&dev, DType::F32, 1e-5).unwrap();
}

#[test]
fn sgd_trains_an_mlp_to_a_100x_lower_loss() {
    let (first, last) = tr::sgd_train(&ferrite_cpu::cpu()).unwrap();
    assert!(last < first / 100.0, "loss went from {first} to {last}");
}

#[test]
fn a_wrong_gradient_is_caught() {
    // The f32 MLP cannot pass at a tolerance far below f32 precision.
    let err = tr::mlp(&ferrite_cpu::cpu(), DType::F32, 1e-14).unwrap_err();
    assert!(err.contains("ferrite") && err.contains("torch"), "{err}");
}
