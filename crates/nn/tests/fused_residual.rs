//! A pre-norm encoder layer adds each residual connection in its branch's last product
//! (`MatmulBias { acc }`), its backward sums each residual stream's two gradients inside the
//! norms' backward kernels (`LayerNormBackward { acc }`): no separate add over the stream
//! either way; its attention's backward writes the q, k, v gradients as their projection's
//! rows (no `cat`); under autocast an f32 output gradient becomes its Linear's bf16 operand
//! and bias gradient in one `cast_col_sums`, and the parameters' gradients come out in f32.
//! In f32 and under bf16 autocast; the values: the op cases `matmul_bias_add`,
//! `layer_norm_residual`, `attention_causal_projection`, `cast_col_sums_to_bf16`. (Its own
//! test binary: it reads the CPU backend's process-wide op counters.)

use ferrite_autodiff::backward;
use ferrite_core::{autocast, DType, Tensor};
use ferrite_cpu::{cpu, profile};
use ferrite_nn::{EncoderConfig, ModuleExt, TransformerEncoderLayer};

#[test]
fn residuals_add_in_the_products_and_the_norm_backward() {
    let dev = cpu();
    let mut c = EncoderConfig::new(16, 2);
    c.dim_feedforward = 32;
    c.dropout = 0.0;
    c.norm_first = true;
    c.batch_first = true;
    c.activation = ferrite_nn::Activation::Gelu;
    let layer = TransformerEncoderLayer::new(c, DType::F32, &dev).unwrap();
    let x = Tensor::rand_normal([2, 5, 16], 0.0, 1.0, 7, DType::F32, &dev).unwrap();
    for low in [None, Some(DType::BF16)] {
        let run = || {
            let y = layer.forward_masked(&x, None, true)?;
            y.square()?.sum_all()
        };
        // Forward: each residual connection added by its branch's last product.
        profile::set_enabled(true);
        let loss = match low {
            Some(dt) => autocast(dt, run).and_then(|r| r),
            None => run(),
        }
        .unwrap();
        profile::set_enabled(false);
        let fwd = profile::take();
        let stream_adds: usize = fwd
            .iter()
            .filter(|o| o.op == "add" && o.output == [2, 5, 16])
            .map(|o| o.calls)
            .sum();
        assert_eq!(stream_adds, 0, "{low:?}: a residual added apart: {fwd:?}");
        layer.zero_grad();
        profile::set_enabled(true);
        backward(&loss).unwrap();
        profile::set_enabled(false);
        let ops = profile::take();
        let count = |name: &str| -> usize {
            ops.iter()
                .filter(|o| o.op == name && o.input == [2, 5, 16] && o.output == [2, 5, 16])
                .map(|o| o.calls)
                .sum()
        };
        assert_eq!(count("layer_norm_backward"), 2, "{low:?}: {ops:?}");
        assert_eq!(
            count("add"),
            0,
            "{low:?}: the residual gradients were added apart: {ops:?}"
        );
        // q, k and v's gradients written side by side by the attention's backward, as their
        // projection's rows: no cat joins them.
        let cats: usize = ops.iter().filter(|o| o.op == "cat").map(|o| o.calls).sum();
        assert_eq!(cats, 0, "{low:?}: {ops:?}");
        // Under autocast the two Linears with f32 outputs (out_proj, linear2) make their f32
        // gradient the products' bf16 operand and their bias gradient in one op.
        let fused: usize = ops
            .iter()
            .filter(|o| o.op == "cast_col_sums")
            .map(|o| o.calls)
            .sum();
        assert_eq!(fused, if low.is_some() { 2 } else { 0 }, "{low:?}: {ops:?}");
        // ... and the weights' and biases' gradients come out in f32 (the products' f32
        // output, a product with ones for a bf16 bias copy): no cast widens a bf16 gradient
        // of a parameter.
        let params: [&[usize]; 6] = [&[48, 16], &[16, 16], &[32, 16], &[16, 32], &[48], &[32]];
        let widened: Vec<_> = ops
            .iter()
            .filter(|o| o.op == "cast" && params.iter().any(|p| o.input == *p))
            .collect();
        assert!(widened.is_empty(), "{low:?}: {widened:?}");
    }
}
