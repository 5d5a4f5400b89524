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

/// A sequence whose every key is padding: its outputs are NaN (the softmax of an empty set, as
/// the fused op documents), the other sequence's outputs equal those of running it alone, and
/// under bf16 autocast the mask passes uncast (the products run in bf16, close to f32).
#[test]
fn mha_fully_padded_sequence_is_nan_and_leaves_the_others_alone() {
    use ferrite_core::Tensor;
    use ferrite_nn::MultiheadAttention;
    let dev = cpu();
    let mha = MultiheadAttention::new(8, 2, true, true, DType::F32, &dev).unwrap();
    let x = Tensor::rand_uniform([2, 5, 8], -1.0, 1.0, 3, DType::F32, &dev).unwrap();
    let mut m = vec![false; 10];
    m[3] = true;
    m[5..].fill(true);
    let mask = Tensor::from_vec(m, [2, 5], &dev).unwrap();
    for causal in [false, true] {
        let y = mha.attend(&x, &x, &x, Some(&mask), causal).unwrap();
        let v = y.to_vec_f64().unwrap();
        assert!(v[40..].iter().all(|a| a.is_nan()), "sequence 1 is padding");
        let x0 = x.narrow(0, 0, 1).unwrap();
        let m0 = mask.narrow(0, 0, 1).unwrap();
        let alone = mha.attend(&x0, &x0, &x0, Some(&m0), causal).unwrap();
        let a = alone.to_vec_f64().unwrap();
        let worst = a
            .iter()
            .zip(&v[..40])
            .map(|(p, q)| (p - q).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-6, "sequence 0 alone vs in the batch: {worst}");
        let low =
            ferrite_core::autocast(DType::BF16, || mha.attend(&x0, &x0, &x0, Some(&m0), causal))
                .unwrap()
                .unwrap();
        assert_eq!(low.dtype(), DType::F32);
        let worst = low
            .to_vec_f64()
            .unwrap()
            .iter()
            .zip(&a)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0, f64::max);
        assert!(worst > 0.0 && worst < 0.05, "bf16 autocast vs f32: {worst}");
    }
}
