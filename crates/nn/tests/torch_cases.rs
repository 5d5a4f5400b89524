//! Every layer and loss against PyTorch (fixtures from `scripts/nn_fixtures.py`): outputs and
//! the gradients of every float input and parameter, in float64 on the CPU.

#[path = "support/torch_cases.rs"]
mod torch_cases;

use ferrite_core::DType;
use ferrite_cpu::cpu;

#[test]
fn layers_and_losses_match_pytorch_in_f64() {
    let fails = torch_cases::run_all(&cpu(), DType::F64, 1e-10, 1e-9);
    assert!(
        fails.is_empty(),
        "{} failures:\n{}",
        fails.len(),
        fails.join("\n")
    );
}

#[test]
fn layers_and_losses_match_pytorch_in_f32() {
    let fails = torch_cases::run_all(&cpu(), DType::F32, 1e-5, 1e-4);
    assert!(
        fails.is_empty(),
        "{} failures:\n{}",
        fails.len(),
        fails.join("\n")
    );
}

#[test]
fn a_pytorch_state_dict_loads_and_saves_unchanged() {
    let fails = torch_cases::torch_state_dict(&cpu());
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}
