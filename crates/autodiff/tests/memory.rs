//! Saved tensors are released as soon as backward has used them: 1,000 forward/backward
//! iterations end with CPU memory in use back at its baseline. (Its own test binary, so no
//! other test allocates meanwhile.)

use ferrite_autodiff::{backward, Var};
use ferrite_core::{DType, Tensor};
use ferrite_cpu::{bytes_in_use, cpu};

#[test]
fn memory_returns_to_baseline_after_1000_iterations() {
    let dev = cpu();
    let w1 =
        Var::new(&Tensor::rand_normal([32, 64], 0.0, 0.2, 1, DType::F32, &dev).unwrap()).unwrap();
    let w2 =
        Var::new(&Tensor::rand_normal([64, 8], 0.0, 0.2, 2, DType::F32, &dev).unwrap()).unwrap();
    let x = Tensor::rand_normal([16, 32], 0.0, 1.0, 3, DType::F32, &dev).unwrap();
    let step = || {
        let h = x.matmul(w1.tensor()).unwrap().gelu().unwrap();
        let y = h.matmul(w2.tensor()).unwrap().softmax(-1).unwrap();
        let loss = y.square().unwrap().mean(&[], false).unwrap();
        backward(&loss).unwrap();
        assert!(w1.grad().is_some() && w2.grad().is_some());
    };
    // One iteration first: the shared constants it reads (the mean's divisor, the backward
    // seed: `Tensor::constant`) are made once and kept for the process.
    step();
    w1.zero_grad();
    w2.zero_grad();
    let baseline = bytes_in_use();
    let mut peak = 0;
    for _ in 0..1000 {
        step();
        peak = peak.max(bytes_in_use());
        w1.zero_grad();
        w2.zero_grad();
    }
    assert_eq!(
        bytes_in_use(),
        baseline,
        "memory in use did not return to its baseline"
    );
    // One iteration's activations and gradients, not 1,000 of them.
    assert!(
        peak - baseline < 64 << 10,
        "peak {} bytes above baseline",
        peak - baseline
    );
}
