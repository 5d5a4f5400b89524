//! Model summary: rows, output shapes through nested Sequentials, counts, text, errors.

use ferrite_core::{DType, Tensor};
use ferrite_cpu::cpu;
use ferrite_nn::{summary, Flatten, LayerNorm, Linear, ReLU, Sequential};

#[test]
fn summary_lists_paths_shapes_and_counts() {
    let dev = cpu();
    let mut head = Linear::new(16, 10, true, DType::F32, &dev).unwrap();
    head.bias.as_mut().unwrap().set_requires_grad(false);
    let m = Sequential::new()
        .with(Flatten::default())
        .with(
            Sequential::new()
                .with(Linear::new(12, 16, true, DType::F32, &dev).unwrap())
                .with(ReLU)
                .with(LayerNorm::new(&[16], 1e-5, true, true, DType::F32, &dev).unwrap()),
        )
        .with(head);
    let x = Tensor::zeros([8, 3, 4], DType::F32, &dev).unwrap();
    let s = summary(&m, &x).unwrap();
    let rows: Vec<(&str, &str, Option<Vec<usize>>, usize)> = s
        .rows
        .iter()
        .map(|r| {
            (
                r.path.as_str(),
                r.type_name,
                r.output_shape.clone(),
                r.params,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("", "Sequential", Some(vec![8, 10]), 0),
            ("0", "Flatten", Some(vec![8, 12]), 0),
            ("1", "Sequential", Some(vec![8, 16]), 0),
            ("1.0", "Linear", Some(vec![8, 16]), 208),
            ("1.1", "ReLU", Some(vec![8, 16]), 0),
            ("1.2", "LayerNorm", Some(vec![8, 16]), 32),
            ("2", "Linear", Some(vec![8, 10]), 170),
        ]
    );
    assert_eq!((s.trainable, s.total), (400, 410));
    let text = s.to_string();
    assert!(
        text.contains("    0 (Linear)") && text.contains("[8, 16]"),
        "{text}"
    );
    assert!(
        text.ends_with("Total params: 410\nTrainable params: 400\nNon-trainable params: 10"),
        "{text}"
    );
    // A shape error names the path.
    let e = summary(&m, &Tensor::zeros([8, 5], DType::F32, &dev).unwrap()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "1.0 (Linear): expected 12 input features, got input [8, 5]"
    );
}
