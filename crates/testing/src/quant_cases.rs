//! Op cases of the quantized products (`QTensor::qmatmul`, `qmatvec`): every matrix format
//! with every activation format, against the f64 product of the reference dequantization
//! (`ferrite_gguf::quant::dequantize`) and the input's values.
//!
//! The matrix is made inside `run` from seeded values quantized by `ferrite_gguf` (the same
//! bytes in the reference), so any device runs the same list. Tolerances bound the
//! activation rounding each format makes: 8-bit blocks of 32 round each value by at most
//! half a step of `amax / 127`; q8x2's residual steps are 1/256 of that; the error of a dot
//! product of `k` terms with weights of rms `w` is then about `sqrt(k) * w * step /
//! sqrt(12)`, and the tolerance is six times that (plus f32 summation for every format). A
//! backend that keeps some formats as f16 (CUDA: Q2_K and Q3_K, which have no kernel there)
//! names them ([`quant_cases_for`]): their tolerance adds the f16 rounding of each weight
//! (half an ulp, 2^-11 relative).

use std::sync::Arc;

use ferrite_core::quant::{ActFormat, QBytes, QTensor, QType};
use ferrite_core::{DType, Result, Tensor};

use crate::{Input, OpCase, Ref, SplitMix, Tol, Values, View};

/// The matrix formats a GGUF model's weights come in.
pub const QTYPES: [QType; 13] = [
    QType::Q4_0,
    QType::Q4_1,
    QType::Q5_0,
    QType::Q5_1,
    QType::Q8_0,
    QType::Q2_K,
    QType::Q3_K,
    QType::Q4_K,
    QType::Q5_K,
    QType::Q6_K,
    QType::F16,
    QType::BF16,
    QType::F32,
];

/// Weight values are uniform in [-1, 1): rms 1/sqrt(3).
const W_RMS: f64 = 0.578;

/// The seeded `rows x cols` matrix of `ty` a case multiplies by: its bytes.
pub fn matrix_bytes(ty: QType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix(seed);
    let vals: Vec<f32> = (0..rows * cols)
        .map(|_| (2.0 * rng.unit() - 1.0) as f32)
        .collect();
    // Cannot fail: finite values in whole blocks of a supported type.
    ferrite_gguf::quant::quantize_to_vec(ty, &vals)
        .unwrap_or_else(|e| unreachable!("quantizing test values: {e}"))
}

fn tol(act: ActFormat, ty: QType, k: usize, f16_weights: bool) -> Tol {
    let sk = (k as f64).sqrt();
    let step = match act.for_product(ty) {
        ActFormat::Q8 => 1.0 / 127.0,
        ActFormat::Q8x2 => 1.0 / (127.0 * 256.0),
        ActFormat::F32 => 0.0,
    };
    // Inputs are uniform in [-1, 1) too (rms 1/sqrt(3)); f16 rounds a weight by at most
    // 2^-11 of it, uniformly: rms 2^-11 / sqrt(3) of the weight.
    let f16 = match f16_weights {
        true => 6.0 * sk * W_RMS * W_RMS * W_RMS * 2f64.powi(-11) / 3f64.sqrt(),
        false => 0.0,
    };
    Tol {
        atol: 6.0 * sk * W_RMS * step / 12f64.sqrt() + 2e-6 * sk + f16,
        rtol: 1e-5,
    }
}

fn act_name(act: ActFormat) -> &'static str {
    match act {
        ActFormat::Q8 => "q8",
        ActFormat::Q8x2 => "q8x2",
        ActFormat::F32 => "f32",
    }
}

/// Every (format, activation format, shape) case: rows 1, 33 and 48 (three whole 16-row
/// groups), inputs of one vector (`qmatvec`), 3 and 9 rows and `[2, 5, cols]`.
pub fn quant_cases() -> Vec<OpCase> {
    quant_cases_for(&[])
}

/// Runs `cases` on `device` against the f64 reference and `oracle` (seeds from `seed0`),
/// prints how many match under `what` and panics listing every failure.
pub fn assert_cases(
    cases: &[&OpCase],
    device: &ferrite_core::Device,
    oracle: &ferrite_core::Device,
    seed0: u64,
    what: &str,
) {
    let failures: Vec<String> = cases
        .iter()
        .enumerate()
        .filter_map(|(i, c)| crate::check_case_vs(c, device, oracle, seed0 + i as u64).err())
        .collect();
    println!(
        "  {} of {} {what} match",
        cases.len() - failures.len(),
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} {what} failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// [`quant_cases`] for a backend that stores the formats `f16_stored` as f16.
pub fn quant_cases_for(f16_stored: &[QType]) -> Vec<OpCase> {
    let mut out = Vec::new();
    for (ti, &ty) in QTYPES.iter().enumerate() {
        let bs = ty.block_size();
        let cols_list: &[usize] = if bs == 256 { &[256, 512] } else { &[32, 96] };
        for &cols in cols_list {
            for rows in [1usize, 33, 48] {
                let inputs: [Vec<usize>; 4] =
                    [vec![cols], vec![3, cols], vec![9, cols], vec![2, 5, cols]];
                for x_shape in inputs {
                    for act in [ActFormat::Q8, ActFormat::Q8x2, ActFormat::F32] {
                        let seed = 77 + 1000 * ti as u64 + (rows * 7 + cols) as u64;
                        let f16 = f16_stored.contains(&ty);
                        out.push(case(ty, rows, cols, x_shape.clone(), act, seed, f16));
                    }
                }
            }
        }
    }
    out
}

fn case(
    ty: QType,
    rows: usize,
    cols: usize,
    x_shape: Vec<usize>,
    act: ActFormat,
    seed: u64,
    f16_weights: bool,
) -> OpCase {
    let vector = x_shape.len() == 1;
    let name = format!(
        "{}/{ty}/{}/{rows}x{cols}/x{:?}",
        if vector { "qmatvec" } else { "qmatmul" },
        act_name(act),
        x_shape
    );
    let bytes = Arc::new(matrix_bytes(ty, rows, cols, seed));
    let run_bytes = Arc::clone(&bytes);
    let run = move |x: &[Tensor]| -> Result<Vec<Tensor>> {
        let q = QTensor::new(
            x[0].device(),
            ty,
            rows,
            cols,
            QBytes::new(run_bytes.clone()),
        )?;
        Ok(vec![if vector {
            q.qmatvec(&x[0], act)?
        } else {
            q.qmatmul(&x[0], act)?
        }])
    };
    let reference = move |x: &[Ref]| -> Vec<Ref> {
        let mut w = vec![0f32; rows * cols];
        ferrite_gguf::quant::dequantize(ty, &bytes, &mut w)
            .unwrap_or_else(|e| unreachable!("dequantizing test bytes: {e}"));
        let t = x[0].data.len() / cols;
        let mut y = Vec::with_capacity(t * rows);
        for xr in x[0].data.chunks_exact(cols) {
            for wr in w.chunks_exact(cols) {
                y.push(wr.iter().zip(xr).map(|(&a, &b)| f64::from(a) * b).sum());
            }
        }
        let mut shape = x[0].shape.clone();
        if let Some(l) = shape.last_mut() {
            *l = rows;
        }
        vec![Ref::new(shape, y)]
    };
    OpCase {
        name,
        inputs: vec![Input {
            shape: x_shape,
            dtype: DType::F32,
            values: Values::Uniform(-1.0, 1.0),
            view: View::Contiguous,
        }],
        run: Arc::new(run),
        reference: Arc::new(reference),
        tol: vec![tol(act, ty, cols, f16_weights)],
        differentiable: false,
    }
}
