//! The CPU's quantized products against the f64 reference (`ferrite_testing::quant_cases`),
//! and the errors `QTensor` gives for bad input.

use ferrite_core::quant::{ActFormat, QBytes, QTensor, QType};
use ferrite_core::{DType, Tensor};
use ferrite_cpu::cpu;
use ferrite_testing::quant_cases::{matrix_bytes, quant_cases};

#[test]
fn every_format_and_activation_format_matches_the_f64_reference() {
    let dev = cpu();
    let cases = quant_cases();
    assert!(cases.len() > 900, "{} cases", cases.len());
    let failures: Vec<String> = cases
        .iter()
        .enumerate()
        .filter_map(|(i, c)| ferrite_testing::check_case(c, &dev, 9000 + i as u64).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Bits do not depend on the rows a product is batched with (what the engine relies on).
#[test]
fn a_row_gives_the_same_bits_alone_and_in_a_batch() {
    let dev = cpu();
    for ty in [
        QType::Q4_0,
        QType::Q4_1,
        QType::Q8_0,
        QType::Q4_K,
        QType::Q6_K,
    ] {
        let cols = 256;
        let q = QTensor::new(
            &dev,
            ty,
            48,
            cols,
            QBytes::from_vec(matrix_bytes(ty, 48, cols, 5)),
        )
        .unwrap();
        let x = Tensor::rand_uniform([9, cols], -1.0, 1.0, 3, DType::F32, &dev).unwrap();
        for act in [ActFormat::Q8, ActFormat::Q8x2, ActFormat::F32] {
            let all = q.qmatmul(&x, act).unwrap().to_vec::<f32>().unwrap();
            for t in [0usize, 4, 8] {
                let row = x.narrow(0, t, 1).unwrap().squeeze(0).unwrap();
                let one = q.qmatvec(&row, act).unwrap().to_vec::<f32>().unwrap();
                assert_eq!(one, all[t * 48..(t + 1) * 48], "{ty} {act:?} row {t}");
            }
        }
    }
}

#[test]
fn bad_input_names_what_is_wrong() {
    let dev = cpu();
    let err = |r: ferrite_core::Result<QTensor>| r.unwrap_err().to_string();
    let bytes = QBytes::from_vec(matrix_bytes(QType::Q4_0, 2, 64, 1));
    assert_eq!(
        err(QTensor::new(&dev, QType::Q4_0, 3, 64, bytes.clone())),
        "QTensor::new: 3x64 Q4_0 needs 108 bytes, found 72"
    );
    assert_eq!(
        err(QTensor::new(&dev, QType::Q4_0, 2, 48, bytes.clone())),
        "QTensor::new: row length 48 is not a multiple of the Q4_0 block size 32"
    );
    assert_eq!(
        err(QTensor::new(&dev, QType::Q8_K, 2, 256, bytes.clone())),
        "QTensor::new: Q8_K is not a matrix format"
    );
    let q = QTensor::new(&dev, QType::Q4_0, 2, 64, bytes).unwrap();
    let x = Tensor::zeros([3, 32], DType::F32, &dev).unwrap();
    assert_eq!(
        q.qmatmul(&x, ActFormat::Q8).unwrap_err().to_string(),
        "qmatmul: input [3, 32] does not end in the matrix's 64 columns (2x64 Q4_0)"
    );
    let x = Tensor::zeros([64], DType::F16, &dev).unwrap();
    assert_eq!(
        q.qmatvec(&x, ActFormat::Q8).unwrap_err().to_string(),
        "qmatmul: dtype f16 not supported (activations must be f32)"
    );
    let x = Tensor::zeros([1, 64], DType::F32, &dev).unwrap();
    assert_eq!(
        q.qmatvec(&x, ActFormat::Q8).unwrap_err().to_string(),
        "qmatvec: input [1, 64] is not a vector"
    );
    // Zero rows of input: an empty result of the right shape.
    let x = Tensor::zeros([0, 64], DType::F32, &dev).unwrap();
    assert_eq!(q.qmatmul(&x, ActFormat::Q8).unwrap().dims(), &[0, 2]);
}
