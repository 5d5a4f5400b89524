//! Autocast (`ferrite_core::autocast`) through the layers: the eligible products compute in
//! the low dtype and equal an explicit computation on the rounded operands (bit for bit, or
//! to the order of f32 sums where a bias joins the product's accumulator); norms, softmax
//! and losses stay f32; parameters receive f32 gradients; scopes nest and switch off.

use ferrite_autodiff::backward;
use ferrite_core::autocast::autocast_cache_len;
use ferrite_core::{autocast, autocast_dtype, autocast_off, ConvArgs, DType, Tensor};
use ferrite_cpu::cpu;
use ferrite_nn::loss::{cross_entropy, CrossEntropyOptions};
use ferrite_nn::{Conv2d, LayerNorm, Linear, Module, ModuleExt, MultiheadAttention};

fn randn(dims: &[usize], seed: u64) -> Tensor {
    let dev = cpu();
    let n: usize = dims.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
        })
        .collect();
    Tensor::from_vec(v, dims, &dev).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.cast(DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// Max |a - b| within `rel` of max |b|: results that differ only in the order of f32 sums
/// (a bias added to the product's accumulator against the product then the bias).
fn assert_close(a: &Tensor, b: &Tensor, rel: f64, what: &str) {
    let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    assert_eq!(a.len(), b.len(), "{what}");
    let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let worst = a
        .iter()
        .zip(&b)
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst <= rel * scale, "{what}: {worst} of {scale}");
}

fn grads(m: &(dyn Module + 'static)) -> Vec<(String, Tensor)> {
    m.named_grads()
}

/// A pre-norm, batch-first `TransformerEncoderLayer` of width `e` and `h` heads with GELU, a
/// 32-wide feed-forward block and no dropout, in f32 on the CPU.
fn gelu_pre_norm_layer(e: usize, h: usize) -> ferrite_nn::TransformerEncoderLayer {
    let mut cfg = ferrite_nn::EncoderConfig::new(e, h);
    cfg.dim_feedforward = 32;
    cfg.dropout = 0.0;
    cfg.activation = ferrite_nn::Activation::Gelu;
    cfg.batch_first = true;
    cfg.norm_first = true;
    ferrite_nn::TransformerEncoderLayer::new(cfg, DType::F32, &cpu()).unwrap()
}

#[test]
fn linear_matmul_runs_in_the_low_dtype_and_parameters_get_f32_grads() {
    for low in [DType::BF16, DType::F16] {
        let dev = cpu();
        let lin = Linear::new(24, 10, true, DType::F32, &dev).unwrap();
        let x = randn(&[3, 5, 24], 1);

        let y = autocast(low, || lin.forward(&x)).unwrap().unwrap();
        assert_eq!(y.dtype(), DType::F32, "{low}: the output comes back in f32");
        backward(&y.square().unwrap().mean(&[], false).unwrap()).unwrap();
        let auto_grads = grads(&lin);
        lin.zero_grad();

        // The same computation spelled out: inputs rounded to the low dtype, their product
        // accumulated in f32 and written in f32 with the f32 bias added (the product's f32
        // output: no rounding of it to the low dtype).
        // Autocast casts the weight in its own layout and takes the transposed view of that.
        let wide = |t: &Tensor| t.cast(low).unwrap().cast(DType::F32).unwrap();
        let wt = wide(&lin.weight.tensor()).t().unwrap();
        let b = lin.bias.as_ref().unwrap().tensor();
        let explicit = wide(&x).matmul(&wt).unwrap().add(&b).unwrap();
        assert_close(&y, &explicit, 1e-6, &format!("{low}: output"));
        // Gradients: the backward's products run in the low dtype (the output gradient
        // rounded to it), so they match the spelled-out f32 ones to the low dtype's precision.
        backward(&explicit.square().unwrap().mean(&[], false).unwrap()).unwrap();
        let explicit_grads = grads(&lin);
        assert_eq!(auto_grads.len(), 2);
        for ((n, a), (_, e)) in auto_grads.iter().zip(&explicit_grads) {
            assert_eq!(a.dtype(), DType::F32, "{low}: {n} gets an f32 gradient");
            let (a, e) = (a.to_vec_f64().unwrap(), e.to_vec_f64().unwrap());
            let scale = e.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let worst = a
                .iter()
                .zip(&e)
                .fold(0.0f64, |m, (a, e)| m.max((a - e).abs()));
            assert!(
                scale > 0.0 && worst <= 2e-2 * scale,
                "{low}: gradient of {n}: {worst} of {scale}"
            );
        }
        lin.zero_grad();

        // And it is not the f32 result: the product really ran in the low dtype.
        let exact = lin.forward(&x).unwrap();
        assert_ne!(bits(&y), bits(&exact), "{low}: autocast changed nothing");
        let (a, e) = (y.to_vec_f64().unwrap(), exact.to_vec_f64().unwrap());
        let worst = a
            .iter()
            .zip(&e)
            .map(|(a, e)| (a - e).abs())
            .fold(0.0, f64::max);
        assert!(worst < 0.05, "{low}: {worst}");
    }
}

#[test]
fn norms_softmax_and_losses_stay_f32_inside_the_scope() {
    let dev = cpu();
    let ln = LayerNorm::new(&[16], 1e-5, true, true, DType::F32, &dev).unwrap();
    let x = randn(&[4, 16], 2);
    let t = Tensor::from_vec(vec![1i64, 0, 15, 7], [4], &dev).unwrap();
    let run = || {
        let h = ln.forward(&x).unwrap();
        let s = h.softmax(-1).unwrap();
        let l = cross_entropy(&h, &t, &CrossEntropyOptions::default()).unwrap();
        let r = h.sum(&[-1], false).unwrap();
        (h, s, l, r)
    };
    let inside = autocast(DType::BF16, run).unwrap();
    let outside = run();
    for (a, b) in [
        (&inside.0, &outside.0),
        (&inside.1, &outside.1),
        (&inside.2, &outside.2),
        (&inside.3, &outside.3),
    ] {
        assert_eq!(a.dtype(), DType::F32);
        assert_eq!(bits(a), bits(b));
    }
}

#[test]
fn conv_and_attention_run_in_the_low_dtype() {
    let dev = cpu();
    let conv = Conv2d::new(3, 4, [3, 3], ConvArgs::default(), true, DType::F32, &dev).unwrap();
    let x = randn(&[2, 3, 7, 6], 3);
    let y = autocast(DType::F16, || conv.forward(&x)).unwrap().unwrap();
    let explicit = x
        .cast(DType::F16)
        .unwrap()
        .conv2d(
            &conv.weight.tensor().cast(DType::F16).unwrap(),
            None,
            &ConvArgs::default(),
        )
        .unwrap()
        .cast(DType::F32)
        .unwrap()
        .add(
            &conv
                .bias
                .as_ref()
                .unwrap()
                .tensor()
                .reshape([1, 4, 1, 1])
                .unwrap(),
        )
        .unwrap();
    assert_eq!(y.dtype(), DType::F32);
    assert_eq!(bits(&y), bits(&explicit), "conv2d under f16 autocast");

    let (q, k, v) = (
        randn(&[2, 2, 5, 8], 4),
        randn(&[2, 2, 5, 8], 5),
        randn(&[2, 2, 5, 8], 6),
    );
    let o = autocast(DType::BF16, || Tensor::attention(&q, &k, &v, true, None))
        .unwrap()
        .unwrap();
    let c = |t: &Tensor| t.cast(DType::BF16).unwrap();
    let explicit = Tensor::attention(&c(&q), &c(&k), &c(&v), true, None)
        .unwrap()
        .cast(DType::F32)
        .unwrap();
    assert_eq!(o.dtype(), DType::F32);
    assert_eq!(bits(&o), bits(&explicit), "attention under bf16 autocast");

    // A whole MultiheadAttention: every product in bf16, gradients f32, close to f32.
    let mha = MultiheadAttention::new(16, 4, true, true, DType::F32, &dev).unwrap();
    let x = randn(&[2, 6, 16], 7);
    let y = autocast(DType::BF16, || mha.attend(&x, &x, &x, None, true))
        .unwrap()
        .unwrap();
    let exact = mha.attend(&x, &x, &x, None, true).unwrap();
    let (a, e) = (y.to_vec_f64().unwrap(), exact.to_vec_f64().unwrap());
    let worst = a
        .iter()
        .zip(&e)
        .map(|(a, e)| (a - e).abs())
        .fold(0.0, f64::max);
    assert!(
        worst > 0.0 && worst < 0.05,
        "MultiheadAttention bf16 vs f32: {worst}"
    );
    backward(&y.sum_all().unwrap()).unwrap();
    for (n, g) in grads(&mha) {
        assert_eq!(g.dtype(), DType::F32, "{n}");
    }
}

#[test]
fn scopes_nest_switch_off_and_cache_parameter_casts() {
    let dev = cpu();
    let lin = Linear::new(8, 8, false, DType::F32, &dev).unwrap();
    let x = randn(&[2, 8], 8);
    assert_eq!(autocast_dtype(), None);
    autocast(DType::BF16, || {
        assert_eq!(autocast_dtype(), Some(DType::BF16));
        let a = lin.forward(&x).unwrap();
        // The weight's cast is made once and reused by the second forward.
        assert_eq!(autocast_cache_len(), 1);
        let b = lin.forward(&x).unwrap();
        assert_eq!(autocast_cache_len(), 1);
        assert_eq!(bits(&a), bits(&b));
        autocast(DType::F16, || {
            assert_eq!(autocast_dtype(), Some(DType::F16));
            let h = lin.forward(&x).unwrap();
            let wide = |t: &Tensor| t.cast(DType::F16).unwrap().cast(DType::F32).unwrap();
            let explicit = wide(&x)
                .matmul(&wide(&lin.weight.tensor()).t().unwrap())
                .unwrap();
            assert_eq!(bits(&h), bits(&explicit), "the inner f16 policy applies");
        })
        .unwrap();
        assert_eq!(
            autocast_dtype(),
            Some(DType::BF16),
            "the outer policy is back"
        );
        autocast_off(|| {
            assert_eq!(autocast_dtype(), None);
            let exact = lin.forward(&x).unwrap();
            let reference = x.matmul(&lin.weight.tensor().t().unwrap()).unwrap();
            assert_eq!(
                bits(&exact),
                bits(&reference),
                "autocast_off computes in f32"
            );
        });
        assert_eq!(autocast_dtype(), Some(DType::BF16));
    })
    .unwrap();
    assert_eq!(autocast_dtype(), None);
    assert_eq!(
        autocast_cache_len(),
        0,
        "the cache ends with the outermost scope"
    );

    // Activations are never cached (only trainable leaves and their views are).
    autocast(DType::BF16, || {
        let h = x.matmul(&x.t().unwrap()).unwrap();
        assert_eq!(h.dtype(), DType::F32);
        assert_eq!(autocast_cache_len(), 0);
    })
    .unwrap();

    // f64 is not eligible; bf16 inputs under a bf16 policy are left alone.
    let x64 = x.cast(DType::F64).unwrap();
    let y64 = autocast(DType::BF16, || x64.matmul(&x64.t().unwrap()))
        .unwrap()
        .unwrap();
    assert_eq!(y64.dtype(), DType::F64);
    assert_eq!(
        y64.to_vec_f64().unwrap(),
        x64.matmul(&x64.t().unwrap()).unwrap().to_vec_f64().unwrap()
    );
    let xb = x.cast(DType::BF16).unwrap();
    let yb = autocast(DType::BF16, || xb.matmul(&xb.t().unwrap()))
        .unwrap()
        .unwrap();
    assert_eq!(yb.dtype(), DType::BF16);

    let err = autocast(DType::F32, || ()).unwrap_err().to_string();
    assert!(
        err.contains("autocast") && err.contains("f16 or bf16"),
        "{err}"
    );
}

/// Inside a layer whose products feed each other, the intermediates stay in the low dtype:
/// `MultiheadAttention`'s projections (bias added in bf16) feed the fused attention uncast, and
/// only `out_proj` returns to f32; `TransformerEncoderLayer`'s first Linear, bias and
/// activation run in bf16 and only `linear2` returns to f32. Against the same computation
/// spelled out (to the order of f32 sums), and the gradients reach the f32 parameters.
#[test]
fn layers_keep_intermediates_in_the_low_dtype() {
    let dev = cpu();
    let low = DType::BF16;
    let c = |t: &Tensor| t.cast(low).unwrap();
    let (e, h, l) = (16, 4, 6);
    let mha = MultiheadAttention::new(e, h, true, true, DType::F32, &dev).unwrap();
    let x = randn(&[2, l, e], 9);
    let y = autocast(low, || mha.attend(&x, &x, &x, None, true))
        .unwrap()
        .unwrap();
    let (w, b) = (
        mha.in_proj_weight.tensor(),
        mha.in_proj_bias.as_ref().unwrap().tensor(),
    );
    let xl = c(&x);
    let proj = |i: usize| {
        let wi = c(&w.narrow(0, i * e, e).unwrap());
        let bi = c(&b.narrow(0, i * e, e).unwrap());
        xl.matmul_bias(&wi.t().unwrap(), Some(&bi))
            .unwrap()
            .reshape([2, l, h, e / h])
            .unwrap()
            .permute(&[0, 2, 1, 3])
            .unwrap()
    };
    let o = Tensor::attention(&proj(0), &proj(1), &proj(2), true, None).unwrap();
    assert_eq!(o.dtype(), low);
    let o = o
        .permute(&[0, 2, 1, 3])
        .unwrap()
        .reshape([2, l, e])
        .unwrap();
    let op = &mha.out_proj;
    let wide = |t: &Tensor| t.cast(DType::F32).unwrap();
    let explicit = wide(&o)
        .matmul(&wide(&c(&op.weight.tensor())).t().unwrap())
        .unwrap()
        .add(&op.bias.as_ref().unwrap().tensor())
        .unwrap();
    assert_eq!(y.dtype(), DType::F32);
    assert_close(
        &y,
        &explicit,
        1e-6,
        "MultiheadAttention under bf16 autocast",
    );
    backward(&y.sum_all().unwrap()).unwrap();
    let g = grads(&mha);
    assert_eq!(g.len(), 4);
    for (n, t) in &g {
        assert_eq!(t.dtype(), DType::F32, "{n}");
        assert!(
            t.to_vec_f64().unwrap().iter().any(|v| *v != 0.0),
            "{n} got no gradient"
        );
    }

    let layer = gelu_pre_norm_layer(e, h);
    let y = autocast(low, || layer.forward_masked(&x, None, true))
        .unwrap()
        .unwrap();
    // Spelled out: x + sa(norm1(x)), then + linear2(gelu(linear1(norm2(.))) in bf16).
    let sa = autocast(low, || {
        layer
            .self_attn
            .attend(
                &layer.norm1.forward(&x).unwrap(),
                &layer.norm1.forward(&x).unwrap(),
                &layer.norm1.forward(&x).unwrap(),
                None,
                true,
            )
            .unwrap()
    })
    .unwrap();
    let x1 = x.add(&sa).unwrap();
    let n2 = layer.norm2.forward(&x1).unwrap();
    let (l1, l2) = (&layer.linear1, &layer.linear2);
    let hid = c(&n2)
        .matmul_bias(
            &c(&l1.weight.tensor()).t().unwrap(),
            Some(&c(&l1.bias.as_ref().unwrap().tensor())),
        )
        .unwrap();
    let hid = ferrite_nn::functional::gelu(&hid, false).unwrap();
    assert_eq!(hid.dtype(), low);
    let ff = wide(&hid)
        .matmul(&wide(&c(&l2.weight.tensor())).t().unwrap())
        .unwrap()
        .add(&l2.bias.as_ref().unwrap().tensor())
        .unwrap();
    let explicit = x1.add(&ff).unwrap();
    assert_close(
        &y,
        &explicit,
        1e-6,
        "TransformerEncoderLayer under bf16 autocast",
    );
}

/// A pre-norm layer's norm under autocast writes the low dtype itself (`forward_low`): the
/// f32 result rounded once, bit for bit, and the same gradients as the f32 norm followed by a
/// cast; outside autocast it is `forward`.
#[test]
fn layer_norm_forward_low_writes_the_autocast_dtype() {
    let dev = cpu();
    let ln = LayerNorm::new(&[24], 1e-5, true, true, DType::F32, &dev).unwrap();
    let xv = ferrite_autodiff::Var::new(&randn(&[3, 5, 24], 4)).unwrap();
    let x = xv.tensor().clone();
    let run = |y: Tensor| -> Vec<Vec<u32>> {
        backward(
            &y.cast(DType::F32)
                .unwrap()
                .square()
                .unwrap()
                .sum_all()
                .unwrap(),
        )
        .unwrap();
        let mut g: Vec<Vec<u32>> = grads(&ln).iter().map(|(_, t)| bits(t)).collect();
        g.push(bits(&xv.grad().unwrap()));
        ln.zero_grad();
        xv.zero_grad();
        g
    };
    for low in [DType::BF16, DType::F16] {
        let y = autocast(low, || ln.forward_low(&x)).unwrap().unwrap();
        assert_eq!(y.dtype(), low);
        let want = ln.forward(&x).unwrap().cast(low).unwrap();
        assert_eq!(bits(&y), bits(&want), "{low}: output");
        let (got, spelled) = (run(y), run(want));
        assert_eq!(got.len(), 3);
        assert_eq!(got, spelled, "{low}: gradients of weight, bias and x");
    }
    let y = ln.forward_low(&x).unwrap();
    assert_eq!(y.dtype(), DType::F32);
    assert_eq!(bits(&y), bits(&ln.forward(&x).unwrap()));
}

/// `autocast::prefetch` at the start of a scope casts, in one op, the parameters that the
/// previous scope cast (and no others), and the forward pass finds them cached: a training
/// step of a transformer layer gives the same output and gradients, bit for bit, with and
/// without it.
#[test]
fn prefetch_casts_what_the_last_scope_cast() {
    use ferrite_core::autocast::prefetch;
    let layer = gelu_pre_norm_layer(16, 2);
    let params: Vec<Tensor> = layer.parameters().iter().map(|p| p.tensor()).collect();
    let x = randn(&[2, 5, 16], 11);
    let step = |pre: bool| {
        let (y, cached_before, cached_after) = autocast(DType::BF16, || {
            if pre {
                prefetch(&params).unwrap();
            }
            let before = autocast_cache_len();
            let y = layer.forward_masked(&x, None, true).unwrap();
            (y, before, autocast_cache_len())
        })
        .unwrap();
        backward(&y.square().unwrap().mean(&[], false).unwrap()).unwrap();
        let g = grads(&layer);
        layer.zero_grad();
        (y, g, cached_before, cached_after)
    };
    // Nothing to prefetch before a scope has cast anything.
    let (y0, g0, before, casts) = step(true);
    assert_eq!(before, 0);
    // The in-projection's weight and bias, out_proj's weight, linear1's weight and bias and
    // linear2's weight; not the norms' parameters nor the biases added in f32.
    assert_eq!(casts, 6);
    let (y1, g1, before, after) = step(true);
    assert_eq!(before, casts, "prefetch cast what the last scope cast");
    assert_eq!(after, casts, "the forward pass found every cast cached");
    assert_eq!(bits(&y0), bits(&y1));
    assert_eq!(g0.len(), g1.len());
    for ((n, a), (_, b)) in g0.iter().zip(&g1) {
        assert_eq!(bits(a), bits(b), "{n}");
        assert_eq!(b.dtype(), DType::F32, "{n}");
    }
    // Outside a scope it does nothing; a scope with no recording keys its casts apart.
    prefetch(&params).unwrap();
    assert_eq!(autocast_cache_len(), 0);
    let cached = ferrite_core::no_grad(|| {
        autocast(DType::BF16, || {
            prefetch(&params).unwrap();
            autocast_cache_len()
        })
    })
    .unwrap();
    assert_eq!(cached, 0, "the last scope recorded; this one does not");
}
