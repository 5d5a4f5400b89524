//! ferrite-nn on CUDA. A plain binary (harness = false): without a CUDA device each test is
//! reported skipped by name; with one, each runs and the binary exits non-zero on a failure.
//! `scripts/gpu/build.sh` stages it as `.device/bin/nn-gpu-tests`; `scripts/gpu/run.sh` runs it
//! from the repository root (the fixtures are read from crates/nn/tests/fixtures).
//!
//! Usage: `cargo test -p ferrite-nn --test gpu [-- FILTER]`.

#[path = "support/models.rs"]
mod models;
#[path = "support/torch_cases.rs"]
mod torch_cases;

use ferrite_autodiff::{backward, Var};
use ferrite_core::{DType, Device, HostBuffer, Tensor};
use ferrite_cuda::CudaDevice;
use ferrite_nn::loss::{cross_entropy, CrossEntropyOptions, Reduction};
use ferrite_nn::{Dropout, Linear, Module, ModuleExt};
use ferrite_testing::ce_cases::max_rel;
use ferrite_testing::runner::Runner;

type TestFn = fn(&CudaDevice);

fn tests() -> Vec<(&'static str, TestFn)> {
    vec![
        ("nn_layers_and_losses_match_pytorch_f64", torch_f64),
        ("nn_layers_and_losses_match_pytorch_f32", torch_f32),
        ("nn_pytorch_state_dict_loads_on_cuda", torch_state_dict),
        (
            "nn_cross_entropy_matches_cpu_every_dtype_and_width",
            ce_matches_cpu,
        ),
        ("nn_cross_entropy_bad_target_is_an_error", ce_bad_target),
        (
            "nn_cross_entropy_nonfinite_rows_match_cpu",
            ce_nonfinite_rows,
        ),
        (
            "nn_parameter_update_in_a_graph_keeps_addresses",
            param_graph,
        ),
        ("nn_init_and_dropout_match_cpu", init_dropout_match_cpu),
        (
            "nn_masked_mha_bf16_autocast_matches_cpu",
            masked_mha_bf16_matches_cpu,
        ),
        (
            "nn_resnet18_and_encoder_match_pytorch_f64_f32",
            models_match_pytorch,
        ),
        (
            "nn_resnet18_and_encoder_match_pytorch_with_conv_on_im2col",
            models_match_pytorch_im2col,
        ),
    ]
}

fn main() {
    let mut r = Runner::from_args();
    let dev = if ferrite_cuda::is_available() {
        match CudaDevice::new(0) {
            Ok(d) => Some(d),
            Err(e) => {
                println!("CUDA device 0 failed to start: {e}");
                None
            }
        }
    } else {
        None
    };
    for (name, f) in tests() {
        match &dev {
            Some(d) => r.run(name, || {
                f(d);
                None
            }),
            None => r.skip(name, "no CUDA device"),
        }
    }
    r.finish("nn gpu tests");
}

fn torch_f64(d: &CudaDevice) {
    let fails = torch_cases::run_all(&d.device(), DType::F64, 1e-10, 1e-9);
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

fn torch_f32(d: &CudaDevice) {
    let fails = torch_cases::run_all(&d.device(), DType::F32, 1e-5, 1e-4);
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

fn torch_state_dict(d: &CudaDevice) {
    let fails = torch_cases::torch_state_dict(&d.device());
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

/// The fused cross-entropy (loss, lse, w[t]) and its dlogits on `dev` for (x, t, w, g) copied there.
fn ce_fwd_bwd(dev: &Device, [x, t, w, g]: [&Tensor; 4], ignore: i64, eps: f64) -> (Tensor, Tensor) {
    let [x, t, w, g] = [x, t, w, g].map(|a| a.to_device(dev).unwrap());
    let out = Tensor::cross_entropy_rows(&x, &t, &w, ignore, eps).unwrap();
    let dx = Tensor::cross_entropy_backward(&x, &t, &w, &out, &g, ignore, eps).unwrap();
    (out, dx)
}

/// Rows holding NaN, +inf and -inf logits: the CUDA kernels' online max and sum give the
/// CPU's loss, logsumexp and gradient (NaN where the CPU has NaN, the same infinities).
fn ce_nonfinite_rows(d: &CudaDevice) {
    let (cuda, cpu) = (d.device(), ferrite_cpu::cpu());
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    for c in [8usize, 64, 50304] {
        // Row r: 0 finite, 1 a NaN, 2 a +inf, 3 all -inf, 4 some -inf, 5 +inf and NaN,
        // 6 two +inf.
        let mut x: Vec<f32> = (0..7 * c)
            .map(|i| ((i * 37) % 23) as f32 * 0.25 - 2.0)
            .collect();
        x[c + c / 2] = nan;
        x[2 * c + 3] = inf;
        x[3 * c..4 * c].fill(-inf);
        x[4 * c + 1] = -inf;
        x[4 * c + c - 1] = -inf;
        x[5 * c + 2] = inf;
        x[5 * c + c - 2] = nan;
        x[6 * c] = inf;
        x[6 * c + c - 1] = inf;
        let t: Vec<i64> = (0..7).map(|r| ((r * 5 + 1) % c) as i64).collect();
        for (dt, tol) in [(DType::F32, 1e-5), (DType::BF16, 3e-2), (DType::F16, 4e-3)] {
            let x = Tensor::from_vec(x.clone(), [7, c], &cpu)
                .unwrap()
                .cast(dt)
                .unwrap();
            let t = Tensor::from_vec(t.clone(), [7], &cpu).unwrap();
            let w = Tensor::ones([c], dt, &cpu).unwrap();
            let g = Tensor::full(0.5, [7, 3], dt.accumulator(), &cpu).unwrap();
            let run = |dev: &Device| ce_fwd_bwd(dev, [&x, &t, &w, &g], -100, 0.0);
            let ((o1, d1), (o0, d0)) = (run(&cuda), run(&cpu));
            let (eo, ed) = (max_rel(&o1, &o0), max_rel(&d1, &d0));
            assert!(
                eo <= tol && ed <= tol,
                "{dt} width {c}: out {eo:e} ({:?} vs {:?}), dx {ed:e}",
                o1.to_vec_f64().unwrap(),
                o0.to_vec_f64().unwrap()
            );
        }
    }
}

/// The fused op and its backward on CUDA against the CPU: widths that take the 16-byte path
/// and widths that do not, with weights, smoothing and ignored rows, every float dtype.
fn ce_matches_cpu(d: &CudaDevice) {
    let cuda = d.device();
    let cpu = ferrite_cpu::cpu();
    let dtypes = [
        (DType::F64, 1e-12),
        (DType::F32, 1e-5),
        (DType::F16, 4e-3),
        (DType::BF16, 3e-2),
    ];
    let shapes = [(7, 1), (33, 65), (16, 4096), (5, 50304), (64, 1000)];
    let n = ferrite_testing::ce_cases::cross_entropy_matches(&cuda, &cpu, &dtypes, &shapes);
    println!("  {n} cross-entropy cases match the CPU");
    // Through the loss API with autodiff, [N, C, d] input, against the CPU.
    let x = Tensor::rand_normal([4, 6, 3], 0.0, 1.0, 9, DType::F64, &cpu).unwrap();
    let t = Tensor::from_vec(
        (0..12).map(|i| (i % 6) as i64).collect::<Vec<_>>(),
        [4, 3],
        &cpu,
    )
    .unwrap();
    let grads: Vec<Tensor> = [&cpu, &cuda]
        .iter()
        .map(|dev| {
            let v = Var::new(&x.to_device(dev).unwrap()).unwrap();
            let o = CrossEntropyOptions {
                label_smoothing: 0.1,
                ..Default::default()
            };
            let l = cross_entropy(v.tensor(), &t.to_device(dev).unwrap(), &o).unwrap();
            backward(&l).unwrap();
            v.grad().unwrap()
        })
        .collect();
    assert!(max_rel(&grads[1], &grads[0]) < 1e-12);
}

fn ce_bad_target(d: &CudaDevice) {
    let dev = d.device();
    let x = Tensor::zeros([2, 5], DType::F32, &dev).unwrap();
    let w = Tensor::ones([5], DType::F32, &dev).unwrap();
    let t = Tensor::from_vec(vec![1i64, 7], [2], &dev).unwrap();
    let e = Tensor::cross_entropy_rows(&x, &t, &w, -100, 0.0)
        .and_then(|o| o.to_vec::<f32>())
        .unwrap_err()
        .to_string();
    assert!(e.contains("cross_entropy") && e.contains("target 7"), "{e}");
    // The device is usable afterwards.
    let t = Tensor::from_vec(vec![1i64, 4], [2], &dev).unwrap();
    let o = Tensor::cross_entropy_rows(&x, &t, &w, -100, 0.0).unwrap();
    let v = o.to_vec::<f32>().unwrap();
    assert!((v[0] - 5f32.ln()).abs() < 1e-6, "{v:?}");
}

fn cuda_addr(t: &Tensor) -> u64 {
    t.storage()
        .as_any()
        .downcast_ref::<ferrite_cuda::CudaStorage>()
        .unwrap()
        .device_ptr()
}

/// Forward, loss, backward and an SGD update of a Linear layer captured as one graph and
/// replayed: parameters keep their addresses and the loss falls as on the CPU.
fn param_graph(d: &CudaDevice) {
    let dev = d.device();
    let cpu = ferrite_cpu::cpu();
    let make = |dev: &Device| {
        ferrite_nn::init::manual_seed(7);
        Linear::new(16, 4, true, DType::F32, dev).unwrap()
    };
    let (m_gpu, m_cpu) = (make(&dev), make(&cpu));
    let x = Tensor::rand_normal([32, 16], 0.0, 1.0, 1, DType::F32, &cpu).unwrap();
    let y = Tensor::rand_normal([32, 4], 0.0, 1.0, 2, DType::F32, &cpu).unwrap();
    let step = |m: &Linear, x: &Tensor, y: &Tensor| -> ferrite_core::Result<Tensor> {
        m.zero_grad();
        let loss = m.forward(x)?.sub(y)?.square()?.mean(&[], false)?;
        backward(&loss)?;
        ferrite_core::no_grad(|| -> ferrite_core::Result<()> {
            for p in m.parameters() {
                let g = p
                    .grad()
                    .ok_or_else(|| ferrite_core::Error::backend("sgd", "no grad"))?;
                p.copy_(&p.tensor().sub(&g.mul_scalar(0.1)?)?)?;
            }
            Ok(())
        })?;
        Ok(loss)
    };
    let addrs: Vec<u64> = m_gpu
        .parameters()
        .iter()
        .map(|p| cuda_addr(&p.tensor()))
        .collect();
    let (xg, yg) = (x.to_device(&dev).unwrap(), y.to_device(&dev).unwrap());
    // Warm up once eagerly (kernels compiled, gradient slots allocated), as CUDA graphs need.
    step(&m_gpu, &xg, &yg).unwrap();
    step(&m_cpu, &x, &y).unwrap();
    let mg = &m_gpu;
    let g = d.capture(|| Ok(vec![step(mg, &xg, &yg)?])).unwrap();
    for i in 0..5 {
        g.replay().unwrap();
        let lg = g.outputs()[0].to_vec::<f32>().unwrap()[0];
        let lc = step(&m_cpu, &x, &y).unwrap().to_vec::<f32>().unwrap()[0];
        assert!(
            (lg - lc).abs() <= 1e-4 * (1.0 + lc.abs()),
            "step {i}: {lg} vs {lc}"
        );
    }
    let after: Vec<u64> = m_gpu
        .parameters()
        .iter()
        .map(|p| cuda_addr(&p.tensor()))
        .collect();
    assert_eq!(addrs, after);
}

fn init_dropout_match_cpu(d: &CudaDevice) {
    let dev = d.device();
    let cpu = ferrite_cpu::cpu();
    let w = |dev: &Device| {
        ferrite_nn::init::manual_seed(11);
        let a = ferrite_nn::init::kaiming_uniform(
            [8, 4, 3],
            ferrite_nn::init::FanMode::FanIn,
            ferrite_nn::init::Nonlinearity::Relu,
            DType::F32,
            dev,
        )
        .unwrap();
        let b = ferrite_nn::init::xavier_normal([5, 6], 1.0, DType::F32, dev).unwrap();
        let mut drop = Dropout::new(0.3).unwrap();
        let x = Tensor::ones([1000], DType::F32, dev).unwrap();
        let y = drop.forward(&x).unwrap();
        drop.eval();
        let z = drop.forward(&x).unwrap();
        (a, b, y, z)
    };
    let (a0, b0, y0, z0) = w(&cpu);
    let (a1, b1, y1, z1) = w(&dev);
    assert_eq!(a0.to_vec::<f32>().unwrap(), a1.to_vec::<f32>().unwrap());
    // Normal draws go through the device's logf/sqrtf/cosf (rng.rs, create.cu): equal to the
    // CPU's within a few ulp, not bit for bit (seen on an H100: at most 1 ulp).
    for (x, y) in b0
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .zip(b1.to_vec::<f32>().unwrap())
    {
        assert!(
            (x - y).abs() <= 5e-7 * x.abs().max(1e-3),
            "xavier_normal: cpu {x}, cuda {y}"
        );
    }
    assert_eq!(y0.to_vec::<f32>().unwrap(), y1.to_vec::<f32>().unwrap());
    assert_eq!(z1.to_vec::<f32>().unwrap(), vec![1.0; 1000]);
    assert_eq!(z0.to_vec::<f32>().unwrap(), vec![1.0; 1000]);
    let _ = HostBuffer::F32(vec![]);
    let _ = Reduction::Mean;
}

/// The narrow ResNet-18 and the 2-layer TransformerEncoder against PyTorch on CUDA (the
/// device's default convolution path: cuDNN where it loads), f64 and f32.
fn models_match_pytorch(d: &CudaDevice) {
    for (dt, tol) in [(DType::F64, 1e-8), (DType::F32, 2e-3)] {
        let (checked, failures) = models::check_all(&d.device(), dt, tol);
        println!("  {checked} tensors match PyTorch ({dt}, tolerance {tol:e})");
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}

/// The same with convolutions forced onto the im2col path.
fn models_match_pytorch_im2col(d: &CudaDevice) {
    d.set_conv_impl(ferrite_cuda::ConvImpl::Im2col);
    let r = models::check_all(&d.device(), DType::F32, 2e-3);
    d.set_conv_impl(ferrite_cuda::ConvImpl::Auto);
    let (checked, failures) = r;
    println!("  {checked} tensors match PyTorch (f32, im2col)");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Causal self-attention with a key-padding mask under bf16 autocast (head size 64: the fused
/// op's tensor-core forward and tiled backward on CUDA), output and the gradients of the input
/// and every parameter against the same module on the CPU.
fn masked_mha_bf16_matches_cpu(d: &CudaDevice) {
    use ferrite_nn::MultiheadAttention;
    let (cuda, cpu) = (d.device(), ferrite_cpu::cpu());
    let (b, l, e) = (3usize, 100usize, 256usize);
    let mut mha = MultiheadAttention::new(e, 4, true, true, DType::F32, &cpu).unwrap();
    let x = Tensor::rand_uniform([b, l, e], -1.0, 1.0, 11, DType::F32, &cpu).unwrap();
    let r = Tensor::rand_uniform([b, l, e], -1.0, 1.0, 12, DType::F32, &cpu).unwrap();
    // Sequence 0 unpadded, 1 padded from position 60 on, 2 every fourth position.
    let pad: Vec<bool> = (0..b * l)
        .map(|i| {
            let (s, j) = (i / l, i % l);
            (s == 1 && j >= 60) || (s == 2 && j % 4 == 3)
        })
        .collect();
    let mask = Tensor::from_vec(pad, [b, l], &cpu).unwrap();
    let run = |mha: &MultiheadAttention, dev: &Device| -> Vec<(String, Vec<f64>)> {
        let xv = Var::new(&x.to_device(dev).unwrap()).unwrap();
        let (m, r) = (mask.to_device(dev).unwrap(), r.to_device(dev).unwrap());
        let xt = xv.tensor();
        let y = ferrite_core::autocast(DType::BF16, || mha.attend(xt, xt, xt, Some(&m), true))
            .unwrap()
            .unwrap();
        mha.zero_grad();
        backward(&y.mul(&r).unwrap().sum_all().unwrap()).unwrap();
        let mut out = vec![
            ("y".to_string(), y.to_vec_f64().unwrap()),
            (
                "x.grad".to_string(),
                xv.grad().unwrap().to_vec_f64().unwrap(),
            ),
        ];
        for (n, g) in mha.named_grads() {
            out.push((n, g.to_vec_f64().unwrap()));
        }
        out
    };
    let want = run(&mha, &cpu);
    mha.to_device(&cuda).unwrap();
    let got = run(&mha, &cuda);
    assert_eq!(got.len(), want.len());
    for ((name, g), (_, w)) in got.iter().zip(&want) {
        let scale = w.iter().fold(0f64, |a, v| a.max(v.abs())).max(1e-6);
        let worst = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs() / scale)
            .fold(
                0f64,
                |a, v| if v.is_nan() { f64::INFINITY } else { a.max(v) },
            );
        assert!(
            worst < 3e-2,
            "{name}: CUDA vs CPU (bf16) differ by {worst} of its max"
        );
    }
}
