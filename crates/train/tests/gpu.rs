//! The training layer on CUDA (harness = false: each test is reported skipped by name where
//! there is no CUDA device; `scripts/gpu/run.sh` runs it on a machine with an NVIDIA GPU):
//! optimizers against the PyTorch fixture, metrics and the data loader against the CPU;
//! mixed precision (autocast, the Trainer in bf16 and fp16) as on the CPU.

mod common;

#[path = "common/amp.rs"]
mod amp;

use ferrite_core::{DType, Device, Tensor};
use ferrite_testing::runner::Runner;
use ferrite_train::data::{DataLoader, DataLoaderConfig, Dataset, DrawContext, HostTensor};
use ferrite_train::metrics::{Accuracy, AucRoc, Average, Classification, Metric, Score};
use ferrite_train::{Clip, Implementation, Optimizer, ParamGroups, Rule};
use std::sync::Arc;

fn optimizers_follow_pytorch(dev: &Device) {
    for imp in [Implementation::Fused, Implementation::Composed] {
        let worst = common::check_all(dev, imp);
        println!("{imp:?}: largest relative difference from PyTorch on CUDA: {worst:e}");
    }
}

/// The fused multi-tensor kernels against the composed update on CUDA over 60 tensors (some
/// over several chunks, two launches of 48 tensors), every rule, with and without clipping.
/// Unclipped (LAMB apart) they agree to 1e-6 relative (the kernels round every operation
/// as the ops do, so expect 0).
fn fused_matches_composed(dev: &Device) {
    let worst = common::fused_matches_composed(dev, 1e-6);
    println!("largest relative difference fused vs composed on CUDA: {worst:e}");
}

/// The optimizer step captured once in a CUDA graph and replayed 49 times, against the same
/// step run eagerly, with the learning rate changed before every step (a scheduler's
/// `set_lr` writes the device scalar the graph reads): bit-identical parameters after 50
/// steps, for AdamW, LAMB (two-pass) and Nesterov SGD, clipping by norm, over 60 tensors.
fn captured_optimizer_step_matches_eager(dev: &Device) {
    let d = ferrite_cuda::CudaDevice::from_device(dev).expect("a CUDA device");
    let nesterov = Rule::Sgd {
        momentum: 0.9,
        dampening: 0.0,
        nesterov: true,
        weight_decay: 0.01,
    };
    for (rule, lr) in [
        (Rule::adamw(), 1e-3),
        (Rule::lamb(), 1e-3),
        (nesterov, 0.05),
    ] {
        let a = common::many_params(dev, 60);
        let b = common::many_params(dev, 60);
        common::set_grads(&a, 1, dev);
        common::set_grads(&b, 1, dev);
        let mut eager = Optimizer::new(a.clone(), lr, rule.clone()).expect("optimizer");
        let mut captured = Optimizer::new(b.clone(), lr, rule.clone()).expect("optimizer");
        for o in [&mut eager, &mut captured] {
            o.set_clip(Some(Clip::Norm(5.0))).expect("clip");
            o.step().expect("warm-up step");
        }
        let graph = d
            .capture(|| {
                captured
                    .step()
                    .map_err(|e| ferrite_core::Error::backend("optimizer step", e.to_string()))?;
                Ok(vec![])
            })
            .expect("capture");
        for t in 2..=50 {
            let lr_t = lr * (1.0 - t as f64 / 100.0);
            eager.set_lr(0, lr_t);
            captured.set_lr(0, lr_t);
            eager.step().expect("eager step");
            graph.replay().expect("replay");
        }
        assert!(
            common::flat(&a) == common::flat(&b),
            "{rule:?}: captured and eager parameters differ after 50 steps"
        );
        captured.check_finite().expect("finite");
    }
}

/// fp16 training through the dynamic loss scaler on CUDA (the scale and skip decided on the
/// device, a forced overflow skipped and recovered from), fused and composed.
fn grad_scaler_on_cuda(dev: &Device) {
    for imp in [Implementation::Fused, Implementation::Composed] {
        let l = common::loss_scaled_training(dev, imp);
        assert!(
            l[59] < 0.02 * l[0] && l[59] < l[18],
            "{imp:?}: losses {} -> {} -> {}",
            l[0],
            l[18],
            l[59]
        );
    }
}

/// bf16 parameters with fp32 master weights on CUDA (see `common::master_weights_check`).
fn master_weights_on_cuda(dev: &Device) {
    for imp in [Implementation::Fused, Implementation::Composed] {
        common::master_weights_check(dev, imp);
    }
}

fn metrics_match_cpu(dev: &Device) {
    let cpu = ferrite_cpu::cpu();
    let n = 1000;
    let c = 7;
    let logits = Tensor::rand_normal([n, c], 0.0, 1.0, 3, DType::F32, &cpu).expect("logits");
    let targets: Vec<i64> = (0..n).map(|i| ((i * 37 + 11) % c) as i64).collect();
    let t = Tensor::from_vec(targets, [n], &cpu).expect("targets");
    let mut on_cpu: Vec<Box<dyn Metric>> = vec![
        Box::new(Accuracy::top_k(3)),
        Box::new(Classification::new(Score::F1, Average::Macro, c)),
        Box::new(Classification::new(Score::MeanIoU, Average::Weighted, c)),
        Box::new(AucRoc::new()),
    ];
    let mut on_gpu: Vec<Box<dyn Metric>> = vec![
        Box::new(Accuracy::top_k(3)),
        Box::new(Classification::new(Score::F1, Average::Macro, c)),
        Box::new(Classification::new(Score::MeanIoU, Average::Weighted, c)),
        Box::new(AucRoc::new()),
    ];
    let probs = logits.softmax(-1).expect("softmax");
    let (lg, tg, pg) = (
        logits.to_device(dev).expect("up"),
        t.to_device(dev).expect("up"),
        probs.to_device(dev).expect("up"),
    );
    for (i, (a, b)) in on_cpu.iter_mut().zip(on_gpu.iter_mut()).enumerate() {
        let (pc, pgpu) = if i == 3 {
            (&probs, &pg)
        } else {
            (&logits, &lg)
        };
        a.update(pc, &t).expect("cpu update");
        b.update(pgpu, &tg).expect("gpu update");
        let (x, y) = (a.compute().expect("cpu"), b.compute().expect("gpu"));
        assert!(
            (x - y).abs() <= 1e-6 * x.abs().max(1.0),
            "{}: cpu {x}, cuda {y}",
            a.name()
        );
    }
}

struct Rows(usize);
impl Dataset for Rows {
    fn len(&self) -> usize {
        self.0
    }
    fn get(&self, i: usize, _: DrawContext) -> ferrite_train::Result<Vec<HostTensor>> {
        Ok(vec![HostTensor::new(
            ferrite_core::HostBuffer::F32(vec![i as f32; 64]),
            vec![64],
        )?])
    }
}

fn loader_uploads_in_order(dev: &Device) {
    let mut cfg = DataLoaderConfig::new(32).shuffle(5);
    cfg.num_workers = 4;
    let mut l = DataLoader::new(Arc::new(Rows(1000)), cfg.clone()).expect("loader");
    cfg.num_workers = 0;
    let mut r = DataLoader::new(Arc::new(Rows(1000)), cfg).expect("loader");
    let cpu = ferrite_cpu::cpu();
    for (a, b) in l.iter(dev).zip(r.iter(&cpu)) {
        let (a, b) = (a.expect("gpu batch"), b.expect("cpu batch"));
        assert_eq!(
            a.fields[0].to_vec::<f32>().expect("a"),
            b.fields[0].to_vec::<f32>().expect("b")
        );
    }
}

/// Under autocast on CUDA a Linear's and fused attention's products run in the low dtype
/// (a Linear's product of the rounded operands written in f32 with its bias; the attention
/// bit-identical to the same casts and ops spelled out), and the f32 parameters get f32
/// gradients, equal to the spelled-out ones.
fn autocast_runs_products_in_low_precision_on_cuda(dev: &Device) {
    use ferrite_nn::{Linear, Module, ModuleExt};
    let bits = |t: &Tensor| -> Vec<u32> {
        let v = t
            .cast(DType::F32)
            .expect("cast")
            .to_vec::<f32>()
            .expect("read");
        v.iter().map(|x| x.to_bits()).collect()
    };
    let wave = |dims: &[usize], k: f64| -> Tensor {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|i| (k * i as f64 + 0.3).sin() as f32).collect();
        Tensor::from_vec(v, dims.to_vec(), dev).expect("tensor")
    };
    for low in [DType::BF16, DType::F16] {
        let lin = Linear::new(64, 48, true, DType::F32, dev).expect("linear");
        let x = wave(&[4, 9, 64], 0.37);
        let y = ferrite_core::autocast(low, || lin.forward(&x))
            .expect("autocast")
            .expect("forward");
        assert_eq!(y.dtype(), DType::F32);
        ferrite_autodiff::backward(&y.square().expect("sq").mean(&[], false).expect("mean"))
            .expect("backward");
        let auto: Vec<Tensor> = lin.named_grads().into_iter().map(|(_, g)| g).collect();
        lin.zero_grad();
        // Spelled out: the operands rounded to the low dtype, their product accumulated and
        // written in f32 with the f32 bias added (no rounding of the output to the low dtype).
        // The same values up to the order of the f32 sums; far from the exact f32 product.
        let wide = |t: &Tensor| t.cast(low).and_then(|l| l.cast(DType::F32)).expect("cast");
        let explicit = wide(&x)
            .matmul(&wide(&lin.weight.tensor()).t().expect("t"))
            .and_then(|h| h.add(&lin.bias.as_ref().expect("bias").tensor()))
            .expect("explicit");
        let exact = lin.forward(&x).expect("f32 forward");
        let (yv, ev, xv) = (
            y.to_vec_f64().expect("y"),
            explicit.to_vec_f64().expect("explicit"),
            exact.to_vec_f64().expect("exact"),
        );
        let dist = |a: &[f64], b: &[f64]| {
            a.iter()
                .zip(b)
                .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()))
        };
        let scale = ev.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let (to_spelled, to_exact) = (dist(&yv, &ev), dist(&yv, &xv));
        assert!(
            to_spelled <= 1e-5 * scale,
            "{low}: Linear under autocast: {to_spelled} of {scale}"
        );
        assert!(
            to_exact > 10.0 * to_spelled.max(1e-7 * scale),
            "{low}: operands not rounded: {to_exact}"
        );
        ferrite_autodiff::backward(
            &explicit
                .square()
                .expect("sq")
                .mean(&[], false)
                .expect("mean"),
        )
        .expect("backward");
        let spelled: Vec<Tensor> = lin.named_grads().into_iter().map(|(_, g)| g).collect();
        lin.zero_grad();
        assert_eq!(auto.len(), 2);
        // The backward's products run in the low dtype (the output gradient rounded to it):
        // equal to the spelled-out f32 gradients to the low dtype's precision.
        for (a, b) in auto.iter().zip(&spelled) {
            assert_eq!(a.dtype(), DType::F32, "{low}: f32 gradients");
            let (av, bv) = (a.to_vec_f64().expect("a"), b.to_vec_f64().expect("b"));
            let scale = bv.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let worst = dist(&av, &bv);
            assert!(
                scale > 0.0 && worst <= 2e-2 * scale,
                "{low}: gradients: {worst} of {scale}"
            );
        }
        let (q, k, v) = (
            wave(&[2, 4, 33, 64], 0.11),
            wave(&[2, 4, 33, 64], 0.23),
            wave(&[2, 4, 33, 64], 0.31),
        );
        let o = ferrite_core::autocast(low, || Tensor::attention(&q, &k, &v, true, None))
            .expect("autocast")
            .expect("attention");
        let c = |t: &Tensor| t.cast(low).expect("cast");
        let want = Tensor::attention(&c(&q), &c(&k), &c(&v), true, None)
            .and_then(|o| o.cast(DType::F32))
            .expect("explicit attention");
        assert_eq!(bits(&o), bits(&want), "{low}: attention under autocast");
    }
}

/// The small transformer's bf16 and fp16 loss curves against f32 on CUDA, within the CPU
/// test's bounds (`amp::check_curves`).
fn mixed_precision_curves_on_cuda(dev: &Device) {
    amp::check_curves(dev);
}

/// A forced fp16 overflow inside a Trainer run on CUDA: skipped on the device, parameters
/// untouched, scale halved, training goes on; and a checkpoint resumes the scaler bit-exactly.
fn trainer_fp16_overflow_and_resume_on_cuda(dev: &Device) {
    amp::check_forced_overflow(dev);
    amp::check_resume(dev);
}

/// The Trainer's whole step captured as one CUDA graph (`cuda_graph`) against the eager
/// step, 50 steps of the small transformer with a per-step cosine schedule, in f32, bf16
/// autocast and fp16 with the scaler: bit-identical losses and parameters, 47 replays.
fn captured_trainer_step_matches_eager(dev: &Device) {
    use ferrite_train::trainer::Precision;
    for p in [Precision::F32, Precision::Bf16, Precision::Fp16] {
        amp::check_captured_step(dev, p, 50);
    }
}

/// Points in 2-D with a class each (for the dropout refusal below).
struct Labeled(usize);
impl Dataset for Labeled {
    fn len(&self) -> usize {
        self.0
    }
    fn get(&self, i: usize, _: DrawContext) -> ferrite_train::Result<Vec<HostTensor>> {
        let x = (i % 17) as f32 / 8.0 - 1.0;
        Ok(vec![
            HostTensor::new(ferrite_core::HostBuffer::F32(vec![x, -x]), vec![2])?,
            HostTensor::scalar(ferrite_core::HostBuffer::I64(vec![i64::from(x > 0.0)])),
        ])
    }
}

/// A model with Dropout (p > 0) draws a new mask per step, which a replay would repeat: the
/// Trainer refuses `cuda_graph` after its first warm-up step, naming dropout.
fn cuda_graph_refuses_dropout(dev: &Device) {
    use ferrite_nn::{Dropout, Linear, ModuleExt, Sequential};
    use ferrite_train::trainer::{Trainer, TrainerConfig};
    let model = Sequential::new()
        .with(Linear::new(2, 16, true, DType::F32, dev).expect("linear"))
        .with(Dropout::new(0.5).expect("dropout"))
        .with(Linear::new(16, 2, true, DType::F32, dev).expect("linear"));
    let opt = Optimizer::new(model.named_parameters(), 1e-3, Rule::adam()).expect("optimizer");
    let cfg = TrainerConfig {
        cuda_graph: true,
        progress: false,
        max_steps: Some(10),
        ..TrainerConfig::new(1)
    };
    let mut t = Trainer::new(
        Box::new(model),
        opt,
        Box::new(|p: &Tensor, y: &Tensor| {
            ferrite_nn::loss::cross_entropy(p, y, &Default::default())
        }),
        dev,
        cfg,
    )
    .expect("trainer");
    let mut loader =
        DataLoader::new(Arc::new(Labeled(64)), DataLoaderConfig::new(8)).expect("loader");
    let e = t.fit(&mut loader, None).expect_err("refused").to_string();
    assert!(e.contains("cuda_graph") && e.contains("dropout"), "{e}");
    assert_eq!(t.graph_replays(), 0);
}

/// `step_scalars` on CUDA in both of its forms (one single-block launch for up to 65,536
/// elements of one dtype; chunked partial sums then one finishing launch otherwise): the sum
/// of squares, the norm, the counters and the non-finite flag against the f64 values of the
/// same gradients, with and without a NaN.
fn step_scalars_both_forms_match_f64(dev: &Device) {
    use ferrite_core::optim::{step_scalars, StepScalars};
    let vals = |n: usize, seed: u64| -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u64 * 2654435761 + seed * 97) % 2001) as f32 - 1000.0) / 300.0)
            .collect()
    };
    let zero = || Tensor::zeros((), DType::F64, dev).expect("scalar");
    let read = |t: &Tensor| t.to_vec::<f64>().expect("read")[0];
    // (sizes, dtypes: true = bf16, a NaN in the first tensor)
    let sets: [(&[usize], bool, bool); 5] = [
        (&[216, 8, 16, 2], false, false),
        (&[216, 8, 16, 2], false, true),
        (&[40_000, 30_000, 7], false, false),
        (&[40_000, 30_000, 7], false, true),
        (&[300, 5_000, 77], true, false),
    ];
    for (sizes, bf16, nan) in sets {
        let mut grads = Vec::new();
        let mut want = 0.0f64;
        for (k, &n) in sizes.iter().enumerate() {
            let mut v = vals(n, k as u64);
            if nan && k == 0 {
                v[n / 2] = f32::NAN;
            }
            let t = Tensor::from_vec(v, [n], dev).expect("grad");
            // the mixed set: every other tensor in bf16 (its values rounded first)
            let t = if bf16 && k % 2 == 1 {
                t.cast(DType::BF16).expect("cast")
            } else {
                t
            };
            let h = t
                .cast(DType::F64)
                .expect("f64")
                .to_vec::<f64>()
                .expect("read");
            want += h.iter().map(|x| x * x).sum::<f64>();
            grads.push(t);
        }
        let (sq, norm, steps, first, group) = (zero(), zero(), zero(), zero(), zero());
        let finite = step_scalars(&StepScalars {
            grads: &grads,
            grad_sq: &sq,
            grad_scale: None,
            grad_norm: &norm,
            steps: &steps,
            first_nonfinite: Some(&first),
            group_steps: std::slice::from_ref(&group),
        })
        .expect("step_scalars");
        let what = format!("sizes {sizes:?}, bf16 {bf16}, NaN {nan}");
        let fin = finite.to_vec_f64().expect("finite")[0] != 0.0;
        assert_eq!(fin, !nan, "{what}: finite flag");
        assert_eq!(read(&steps), 1.0, "{what}: steps");
        if nan {
            assert!(read(&sq).is_nan(), "{what}: sum of squares {}", read(&sq));
            assert_eq!(read(&first), 1.0, "{what}: first non-finite step");
            assert_eq!(read(&group), 0.0, "{what}: group counter");
        } else {
            let got = read(&sq);
            assert!(
                (got - want).abs() <= 1e-12 * want,
                "{what}: sum of squares {got} against {want}"
            );
            assert!(
                (read(&norm) - want.sqrt()).abs() <= 1e-12 * want.sqrt(),
                "{what}: norm"
            );
            assert_eq!(read(&first), 0.0, "{what}: first non-finite step");
            assert_eq!(read(&group), 1.0, "{what}: group counter");
        }
    }
}

type GpuTest = fn(&Device);

fn main() {
    let mut r = Runner::from_args();
    let tests: [(&str, GpuTest); 13] = [
        (
            "step_scalars_both_launch_forms_match_f64",
            step_scalars_both_forms_match_f64,
        ),
        (
            "optimizers_follow_pytorch_for_100_steps_on_cuda",
            optimizers_follow_pytorch,
        ),
        (
            "fused_optimizers_match_composed_on_cuda",
            fused_matches_composed,
        ),
        (
            "captured_optimizer_step_matches_eager_bit_for_bit",
            captured_optimizer_step_matches_eager,
        ),
        (
            "grad_scaler_recovers_from_a_forced_overflow_on_cuda",
            grad_scaler_on_cuda,
        ),
        (
            "master_weights_keep_bf16_updates_on_cuda",
            master_weights_on_cuda,
        ),
        ("metrics_on_cuda_match_cpu", metrics_match_cpu),
        (
            "loader_uploads_batches_in_order_on_cuda",
            loader_uploads_in_order,
        ),
        (
            "autocast_runs_products_in_low_precision_on_cuda",
            autocast_runs_products_in_low_precision_on_cuda,
        ),
        (
            "mixed_precision_curves_follow_f32_on_cuda",
            mixed_precision_curves_on_cuda,
        ),
        (
            "trainer_fp16_skips_a_forced_overflow_and_resumes_on_cuda",
            trainer_fp16_overflow_and_resume_on_cuda,
        ),
        (
            "captured_trainer_step_matches_eager_bit_for_bit_on_cuda",
            captured_trainer_step_matches_eager,
        ),
        (
            "cuda_graph_refuses_dropout_on_cuda",
            cuda_graph_refuses_dropout,
        ),
    ];
    let dev = if ferrite_cuda::is_available() {
        ferrite_cuda::cuda(0).ok()
    } else {
        None
    };
    for (name, f) in tests {
        match &dev {
            Some(d) => r.run(name, || {
                f(d);
                None
            }),
            None => r.skip(name, "no CUDA device"),
        }
    }
    r.finish("train gpu tests");
}
