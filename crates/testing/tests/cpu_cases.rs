//! Every op case on the CPU backend against its float64 reference.

use std::collections::HashSet;

#[test]
fn every_op_case_matches_the_f64_reference_on_cpu() {
    let dev = ferrite_cpu::cpu();
    let (passed, failures) = ferrite_testing::check_all(&dev);
    let total = ferrite_testing::cases().len();
    assert!(
        failures.is_empty(),
        "{} of {total} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(passed, total);
    assert!(total > 1000, "the case list shrank to {total}");
}

#[test]
fn case_names_are_unique() {
    let cases = ferrite_testing::cases();
    let mut seen = HashSet::new();
    for c in &cases {
        assert!(
            seen.insert(c.name.clone()),
            "duplicate case name {}",
            c.name
        );
    }
}

#[test]
fn the_harness_rejects_a_wrong_result() {
    use ferrite_testing::{check_case, default_tol, Input, OpCase, Values, View};
    use std::sync::Arc;
    let case = OpCase {
        name: "exp_vs_wrong_reference".into(),
        inputs: vec![Input {
            shape: vec![31],
            dtype: ferrite_core::DType::F32,
            values: Values::Uniform(-1.0, 1.0),
            view: View::Narrowed,
        }],
        run: Arc::new(|x| Ok(vec![x[0].exp()?])),
        // exp(x) * (1 + 1e-3): a relative error 10x the f32 tolerance.
        reference: Arc::new(|x| vec![ferrite_testing::reference::map(&x[0], |v| v.exp() * 1.001)]),
        tol: vec![default_tol(ferrite_core::DType::F32)],
        differentiable: true,
    };
    let err = check_case(&case, &ferrite_cpu::cpu(), 1).unwrap_err();
    assert!(
        err.contains("exp_vs_wrong_reference: output 0 element"),
        "{err}"
    );
}

#[test]
fn case_list_covers_every_op_kind() {
    let names: Vec<String> = ferrite_testing::cases()
        .into_iter()
        .map(|c| c.name)
        .collect();
    for op in [
        "neg/",
        "gelu/",
        "gelu_tanh/",
        "round/",
        "add/",
        "pow/",
        "maximum/",
        "eq/",
        "ge/",
        "where/",
        "sum[",
        "max[",
        "argmax/",
        "argmin/",
        "mean[",
        "var[",
        "logsumexp[",
        "matmul/",
        "matmul_bias/",
        "autocast_bf16_matmul_bias/",
        "matmul_bias_add/",
        "autocast_bf16_matmul_bias_add/",
        "layer_norm_to_bf16/",
        "layer_norm_backward_gbf16/",
        "cast_to_bf16/",
        "cast_col_sums_to_bf16/",
        "index_select0/",
        "gather1/",
        "scatter_add0/",
        "cat1/",
        "stack0/",
        "split1/",
        "embedding/",
        "cumsum0/",
        "sort1asc/",
        "topk5/",
        "softmax-1/",
        "log_softmax0/",
        "layer_norm/",
        "rms_norm/",
        "rope_interleaved/",
        "rope_halves/",
        "attention_causal/",
        "attention_masked/",
        "attention_causal_masked/",
        "attention_causal_projection/",
        "conv2d/",
        "conv2d_strided/",
        "conv2d_groups/",
        "conv2d_depthwise/",
        "conv2d_1x1/",
        "conv2d_same/",
        "conv1d/",
        "conv_transpose2d/",
        "max_pool2d/",
        "max_pool1d/",
        "avg_pool2d/",
        "avg_pool1d/",
        "adaptive_avg_pool2d/",
        "adaptive_max_pool2d/",
        "batch_norm/",
        "batch_norm_eval/",
        "group_norm3/",
        "dropout/",
        "dropout2d/",
    ] {
        assert!(names.iter().any(|n| n.starts_with(op)), "no case for {op}");
    }
    // Zero-size and odd shapes are present.
    assert!(names.iter().any(|n| n.contains("[0]")));
    assert!(names.iter().any(|n| n.contains("[45,65]T")));
    println!("{} op cases", names.len());
}
