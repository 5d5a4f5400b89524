//! The CUDA backend's tests. A plain binary (harness = false): where there is no CUDA device
//! each test is reported skipped by name; on a machine with an NVIDIA GPU each runs and the
//! binary exits non-zero on any failure. `scripts/gpu/run-tests.sh` runs it there.
//!
//! Usage: `cargo test -p ferrite-cuda --test cuda [-- FILTER]`.

use ferrite_core::{DType, HostBuffer, Tensor};
use ferrite_cuda::CudaDevice;
use ferrite_testing::runner::Runner;

type TestFn = fn(&CudaDevice);

/// Tests that need only NVRTC (no GPU): run wherever libnvrtc loads.
fn nvrtc_tests() -> Vec<(&'static str, fn())> {
    vec![(
        "every_kernel_source_compiles_for_sm_90_and_sm_90a",
        every_kernel_source_compiles,
    )]
}

fn gpu_tests() -> Vec<(&'static str, TestFn)> {
    vec![
        ("invalid_device_index_is_an_error", invalid_device_index),
        ("upload_download_roundtrip_every_dtype", roundtrip),
        ("op_cases_match_cpu_and_f64_reference", op_cases),
        (
            "quantized_products_match_cpu_and_f64_reference",
            quant_cases,
        ),
        ("thousand_op_chain_waits_once", thousand_ops_wait_once),
        ("allocator_reuses_splits_and_counts", allocator_counters),
        ("out_of_memory_is_an_error_with_counters", out_of_memory),
        ("rng_matches_cpu", rng_matches_cpu),
        ("graph_capture_replay_and_input_update", graph_replay),
        (
            "graph_capture_reuses_blocks_freed_while_capturing",
            graph_reuse,
        ),
        ("copy_writes_in_place_eager_and_in_a_graph", copy_in_place),
        (
            "constants_kept_eagerly_not_while_capturing",
            constants_and_capture,
        ),
        ("device_side_index_error_names_the_op", device_index_error),
        (
            "launch_failure_and_compile_error_name_the_op",
            launch_failure,
        ),
        ("matmul_large_and_views_match_cpu", matmul_large),
        ("gradients_match_cpu", gradients_match_cpu),
        (
            "attention_every_kernel_family_matches_cpu_with_and_without_key_mask",
            attention_masked,
        ),
        ("autodiff_memory_returns_to_baseline", autodiff_memory),
        ("mlp_and_attention_block_match_pytorch", torch_reference),
        ("sgd_trains_an_mlp_to_a_100x_lower_loss", sgd_trains),
        (
            "conv_layers_of_resnet_size_match_cpu_forward_and_backward",
            conv_resnet_sizes,
        ),
        ("conv_pool_norm_layers_match_pytorch", torch_layers),
        (
            "conv_weight_gradient_of_small_filters_matches_cpu",
            conv_small_filter_wgrad,
        ),
    ]
}

/// Tests that need cuDNN besides a GPU.
fn cudnn_tests() -> Vec<(&'static str, TestFn)> {
    vec![
        (
            "cudnn_conv_matches_im2col_and_cpu_f32_bf16_f16_f64",
            cudnn_vs_im2col,
        ),
        ("cudnn_conv_in_a_captured_graph_matches_eager", cudnn_graph),
        (
            "op_cases_match_cpu_with_conv_forced_to_im2col",
            op_cases_im2col,
        ),
    ]
}

fn main() {
    let mut r = Runner::from_args();
    if ferrite_cuda::driver_present() {
        r.skip(
            "without_a_driver_cuda_is_a_clear_error",
            "a CUDA driver is installed",
        );
    } else {
        r.run("without_a_driver_cuda_is_a_clear_error", || {
            let msg = ferrite_cuda::cuda(0)
                .map(|_| ())
                .expect_err("cuda(0) without a driver")
                .to_string();
            assert!(msg.contains("no CUDA device"), "{msg}");
            assert_eq!(ferrite_cuda::device_count(), 0);
            None
        });
    }
    r.run("conv_impl_env_is_validated", || {
        conv_impl_env();
        None
    });
    let nvrtc = ferrite_cuda::nvrtc_present();
    r.run(
        "prebuilt_kernels_match_their_sources",
        || match ferrite_cuda::check_prebuilt(&ferrite_cuda::all_sources()) {
            Ok(0) => Some("no kernels were compiled at build time (FERRITE_CUDA_ARCHS)".into()),
            Ok(_) => None,
            Err(e) => panic!("{e}"),
        },
    );
    for (name, f) in nvrtc_tests() {
        match nvrtc {
            true => r.run(name, || {
                f();
                None
            }),
            false => r.skip(name, "NVRTC (libnvrtc.so.13) is not installed"),
        }
    }
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
    for (name, f) in gpu_tests() {
        match &dev {
            Some(d) => r.run(name, || {
                f(d);
                None
            }),
            None => r.skip(name, "no CUDA device"),
        }
    }
    let cudnn = ferrite_cuda::cudnn_version();
    for (name, f) in cudnn_tests() {
        match (&dev, &cudnn) {
            (Some(d), Ok(_)) => r.run(name, || {
                f(d);
                None
            }),
            (None, _) => r.skip(name, "no CUDA device"),
            (Some(_), Err(why)) => r.skip(name, why),
        }
    }
    if let Some(d) = &dev {
        println!(
            "cuDNN: {}",
            match &cudnn {
                Ok(v) => format!("{v}"),
                Err(e) => e.clone(),
            }
        );
        println!(
            "device: {} (sm_{}{})",
            d.name(),
            d.compute_capability().0,
            d.compute_capability().1
        );
    }
    r.finish("cuda tests");
}

/// Every source for sm_90 and for sm_90a (what a 9.0 device compiles for: attention's wgmma
/// kernels exist only there).
fn every_kernel_source_compiles() {
    for arch in ["sm_90", "sm_90a"] {
        for src in ferrite_cuda::all_sources() {
            if let Err(e) = ferrite_cuda::compile_nvrtc(src, arch) {
                panic!("{arch}: {e}");
            }
        }
    }
}

fn invalid_device_index(_d: &CudaDevice) {
    let n = ferrite_cuda::device_count();
    let err = CudaDevice::new(n + 3)
        .map(|_| ())
        .expect_err("a device past the last one must fail");
    let msg = err.to_string();
    assert!(msg.contains("invalid device index"), "{msg}");
}

fn roundtrip(d: &CudaDevice) {
    let dev = d.device();
    for dt in DType::ALL {
        let vals: Vec<f64> = (0..1003).map(|i| ((i * 37) % 101) as f64 - 50.0).collect();
        let vals: Vec<f64> = if dt == DType::Bool || dt == DType::U8 || dt == DType::U32 {
            vals.iter().map(|v| v.abs()).collect()
        } else {
            vals
        };
        let h = HostBuffer::from_f64_slice(dt, &vals);
        let t = Tensor::from_host(h.clone(), [17, 59], &dev).unwrap();
        assert_eq!(t.to_host().unwrap(), h, "{dt}");
        // A strided view reads back through the copy kernel.
        let tt = t.t().unwrap();
        let cpu = Tensor::from_host(h, [17, 59], &ferrite_cpu::cpu())
            .unwrap()
            .t()
            .unwrap();
        assert_eq!(
            tt.to_host().unwrap(),
            cpu.to_host().unwrap(),
            "{dt} transposed"
        );
    }
}

fn op_cases(d: &CudaDevice) {
    let dev = d.device();
    let (passed, failures) = ferrite_testing::check_all_vs(&dev, &ferrite_cpu::cpu());
    let total = ferrite_testing::cases().len();
    println!("  {passed} of {total} op cases match");
    assert!(
        failures.is_empty(),
        "{} of {total} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(passed, total);
}

/// `QTensor::qmatmul` on CUDA (`ferrite_cuda::qmatmul`, the LLM decode products) for every
/// matrix format and activation format, against the f64 reference and the CPU's products.
/// Q2_K and Q3_K have no kernel on CUDA: it stores them as f16 (`GpuMatrix::upload`).
fn quant_cases(d: &CudaDevice) {
    use ferrite_core::QType;
    let dev = d.device();
    let cases = ferrite_testing::quant_cases::quant_cases_for(&[QType::Q2_K, QType::Q3_K]);
    let all: Vec<_> = cases.iter().collect();
    let cpu = ferrite_cpu::cpu();
    ferrite_testing::quant_cases::assert_cases(&all, &dev, &cpu, 9000, "quantized cases");
    // A CUDA matrix multiplies CUDA inputs only, and moves back to the CPU with its bytes.
    let q = ferrite_core::QTensor::new(
        &ferrite_cpu::cpu(),
        ferrite_core::QType::Q4_0,
        2,
        64,
        ferrite_core::QBytes::from_vec(ferrite_testing::quant_cases::matrix_bytes(
            ferrite_core::QType::Q4_0,
            2,
            64,
            1,
        )),
    )
    .unwrap();
    let g = q.to_device(&dev).unwrap();
    let x = Tensor::zeros([64], DType::F32, &ferrite_cpu::cpu()).unwrap();
    let msg = g
        .qmatvec(&x, ferrite_core::ActFormat::Q8)
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("qmatmul: tensors are on different devices"),
        "{msg}"
    );
    assert_eq!(g.host_bytes(), q.host_bytes());
}

fn thousand_ops_wait_once(d: &CudaDevice) {
    let dev = d.device();
    let mut x = Tensor::from_vec(vec![1.0f32; 4096], [4096], &dev).unwrap();
    let one = Tensor::from_vec(vec![1.0f32; 4096], [4096], &dev).unwrap();
    let before = d.sync_stats();
    for _ in 0..1000 {
        x = x.add(&one).unwrap();
    }
    let after_enqueue = d.sync_stats();
    let v = x.to_vec::<f32>().unwrap();
    let after = d.sync_stats();
    assert!(v.iter().all(|&e| e == 1001.0), "{}", v[0]);
    assert_eq!(
        after_enqueue.host_waits - before.host_waits,
        0,
        "enqueueing waited"
    );
    assert_eq!(
        after.host_waits - before.host_waits,
        1,
        "the read waited more than once"
    );
    assert_eq!(after.launches - before.launches, 1000);
}

fn allocator_counters(d: &CudaDevice) {
    let dev = d.device();
    d.synchronize().unwrap();
    let s0 = d.memory_stats();
    {
        let a = Tensor::zeros([1 << 20], DType::F32, &dev).unwrap(); // 4 MiB: large pool
        let s1 = d.memory_stats();
        assert!(s1.in_use >= s0.in_use + (4 << 20), "{s1:?}");
        assert!(s1.peak_in_use >= s1.in_use);
        drop(a);
    }
    let s2 = d.memory_stats();
    assert_eq!(s2.in_use, s0.in_use, "freed block still counted");
    // The same size again comes from the cache: no new device allocation.
    let b = Tensor::zeros([1 << 20], DType::F32, &dev).unwrap();
    let s3 = d.memory_stats();
    assert_eq!(s3.device_allocs, s2.device_allocs, "cache not reused");
    // A smaller request splits a cached large block.
    drop(b);
    let c = Tensor::zeros([600_000], DType::F32, &dev).unwrap(); // 2.4 MiB
    let d2 = Tensor::zeros([200_000], DType::F32, &dev).unwrap(); // small pool
    let s4 = d.memory_stats();
    assert!(s4.cache_hits > s3.cache_hits);
    assert_eq!(c.to_vec::<f32>().unwrap()[599_999], 0.0);
    drop((c, d2));
    d.empty_cache().unwrap();
    let s5 = d.memory_stats();
    assert!(
        s5.reserved < s4.reserved,
        "empty_cache released nothing: {s5:?}"
    );
    assert!(s5.device_frees > s4.device_frees);
}

fn out_of_memory(d: &CudaDevice) {
    let dev = d.device();
    let reserved = d.memory_stats().reserved;
    d.set_memory_limit(Some(reserved + (64 << 20)));
    let err = Tensor::zeros([1usize << 28], DType::F32, &dev).err();
    d.set_memory_limit(None);
    let msg = err
        .expect("1 GiB past a 64 MiB limit must fail")
        .to_string();
    assert!(msg.starts_with("full: out of memory"), "{msg}");
    assert!(
        msg.contains("in use") && msg.contains("reserved") && msg.contains("device allocations"),
        "{msg}"
    );
    // The device stays usable.
    let t = Tensor::ones([1000], DType::F32, &dev).unwrap();
    assert_eq!(t.sum_all().unwrap().to_vec::<f32>().unwrap(), vec![1000.0]);
    // A real out-of-memory from the driver (more than the card holds) also comes back as an error.
    let huge = Tensor::zeros([1usize << 40], DType::F32, &dev)
        .map(|_| ())
        .expect_err("4 TiB must fail");
    assert!(huge.to_string().contains("out of memory"), "{huge}");
    let t = Tensor::ones([10], DType::F32, &dev).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0; 10]);
}

fn rng_matches_cpu(d: &CudaDevice) {
    let dev = d.device();
    let cpu = ferrite_cpu::cpu();
    for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let a = Tensor::rand_uniform([100_003], -2.0, 3.0, 42, dt, &dev).unwrap();
        let b = Tensor::rand_uniform([100_003], -2.0, 3.0, 42, dt, &cpu).unwrap();
        assert_eq!(
            a.to_host().unwrap(),
            b.to_host().unwrap(),
            "uniform {dt}: bit-exact"
        );
        let a = Tensor::rand_normal([100_003], 1.0, 0.5, 7, dt, &dev)
            .unwrap()
            .to_vec_f64()
            .unwrap();
        let b = Tensor::rand_normal([100_003], 1.0, 0.5, 7, dt, &cpu)
            .unwrap()
            .to_vec_f64()
            .unwrap();
        let tol = if dt == DType::F32 || dt == DType::F64 {
            1e-5
        } else {
            1e-2
        };
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                (x - y).abs() <= tol * (1.0 + y.abs()),
                "normal {dt} [{i}]: {x} vs {y}"
            );
        }
    }
}

/// `Tensor::constant` keeps what it makes eagerly (a later capture reads its buffer) and
/// keeps nothing it makes while a graph is captured (that fill runs only on replay).
fn constants_and_capture(d: &CudaDevice) {
    let dev = d.device();
    let x = Tensor::ones([4], DType::F32, &dev).unwrap();
    let (xs, devc) = (x.clone(), dev.clone());
    let g = d
        .capture(move || {
            let c = Tensor::constant(12.5, [4], DType::F32, &devc)?;
            Ok(vec![xs.add(&c)?, c])
        })
        .unwrap();
    assert!(
        !g.outputs()[1].is_constant(),
        "a fill captured into a graph was kept"
    );
    let c = Tensor::constant(12.5, [4], DType::F32, &dev).unwrap();
    assert!(c.is_constant());
    assert_eq!(c.to_vec::<f32>().unwrap(), [12.5; 4]);
    g.replay().unwrap();
    assert_eq!(g.outputs()[0].to_vec::<f32>().unwrap(), [13.5; 4]);
    let (xs, devc) = (x.clone(), dev.clone());
    let g2 = d
        .capture(move || {
            let c = Tensor::constant(12.5, [4], DType::F32, &devc)?;
            assert!(c.is_constant());
            Ok(vec![xs.mul(&c)?])
        })
        .unwrap();
    g2.replay().unwrap();
    assert_eq!(g2.outputs()[0].to_vec::<f32>().unwrap(), [12.5; 4]);
}

fn graph_replay(d: &CudaDevice) {
    let dev = d.device();
    let x = Tensor::from_vec(vec![0.0f32; 1024], [1024], &dev).unwrap();
    let w = Tensor::rand_uniform([1024], -1.0, 1.0, 1, DType::F32, &dev).unwrap();
    let xs = x.clone();
    let g = d
        .capture(move || {
            let mut y = xs.clone();
            for _ in 0..1000 {
                y = y.mul(&w)?.add(&xs)?;
            }
            Ok(vec![y.sum_all()?])
        })
        .unwrap();
    assert!(g.node_count() >= 1000, "{} nodes", g.node_count());
    let wv = Tensor::rand_uniform([1024], -1.0, 1.0, 1, DType::F32, &ferrite_cpu::cpu())
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for step in 0..3 {
        let xv: Vec<f32> = (0..1024).map(|i| ((i + step) % 7) as f32 * 0.1).collect();
        d.write(&x, &HostBuffer::F32(xv.clone())).unwrap();
        g.replay().unwrap();
        let got = g.outputs()[0].to_vec::<f32>().unwrap()[0] as f64;
        let mut want = 0.0f64;
        for i in 0..1024 {
            let mut y = xv[i];
            for _ in 0..1000 {
                y = y * wv[i] + xv[i];
            }
            want += y as f64;
        }
        assert!(
            (got - want).abs() <= 1e-3 * (1.0 + want.abs()),
            "step {step}: {got} vs {want}"
        );
    }
    // Replay cost: 1,000 small ops in one launch.
    let ms = d
        .time_ms(|| {
            for _ in 0..10 {
                g.replay()?;
            }
            Ok(())
        })
        .unwrap();
    println!("  replay of {} nodes: {:.3} ms", g.node_count(), ms / 10.0);
}

/// A capture whose closure makes 40 temporaries of 16 MiB, each dropped two ops later, takes
/// a few blocks (freed ones serve its later requests), not 40; the graph keeps them, and the
/// closure's `w` (dropped with the closure after the capture, read on every replay): eager work
/// after the capture (which allocates and writes blocks of the same size) does not disturb
/// later replays, whose results follow the input written before each. A freed block larger
/// than a later request is split for it; freed neighbours merge for a larger one.
fn graph_reuse(d: &CudaDevice) {
    let dev = d.device();
    let cpu = ferrite_cpu::cpu();
    let n = 4 << 20;
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    let x = Tensor::zeros([n], DType::F32, &dev).unwrap();
    let w = Tensor::full(0.5, [n], DType::F32, &dev).unwrap();
    d.synchronize().unwrap();
    let before = d.memory_stats().in_use;
    let (xs, w1) = (x.clone(), w.clone());
    let g = d
        .capture(move || {
            let mut y = xs.clone();
            for _ in 0..20 {
                y = y.mul(&w1)?.add(&xs)?;
            }
            Ok(vec![y])
        })
        .unwrap();
    let held = d.memory_stats().in_use - before;
    assert!(
        held <= 4 * n * 4,
        "the capture holds {:.0} MiB for 16 MiB temporaries",
        mib(held)
    );
    for step in 0..3 {
        let xv: Vec<f32> = (0..n).map(|i| ((i + step) % 5) as f32).collect();
        d.write(&x, &HostBuffer::F32(xv.clone())).unwrap();
        // Eager work between replays, on blocks of the same size.
        let junk: Vec<Tensor> = (0..4)
            .map(|k| Tensor::full(k as f64 + 7.0, [n], DType::F32, &dev).unwrap())
            .collect();
        g.replay().unwrap();
        drop(junk);
        let got = g.outputs()[0]
            .to_device(&cpu)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        for i in [0usize, 1, 2, 3, 4, n / 2 + 1, n - 1] {
            let mut y = xv[i];
            for _ in 0..20 {
                y = y * 0.5 + xv[i];
            }
            assert_eq!(got[i], y, "step {step}, element {i}");
        }
    }
    println!(
        "  a capture of 40 16-MiB temporaries holds {:.0} MiB",
        mib(held)
    );
    // A freed block four times a later request's size serves it and the next, split.
    d.synchronize().unwrap();
    let before = d.memory_stats().in_use;
    let (xs, ws) = (x.clone(), w.clone());
    let g = d
        .capture(move || {
            let big = Tensor::cat(&[&xs, &xs, &xs, &xs], 0)?;
            drop(big);
            let a = xs.mul(&ws)?;
            Ok(vec![a.add(&xs)?])
        })
        .unwrap();
    // Whole blocks only would hold 96 MiB (64 + 16 + 16).
    let held = d.memory_stats().in_use - before;
    assert!(
        held < 5 * n * 4,
        "a capture of a 64-MiB temporary and two 16-MiB ones holds {:.0} MiB",
        mib(held)
    );
    let xv: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    d.write(&x, &HostBuffer::F32(xv.clone())).unwrap();
    g.replay().unwrap();
    let got = g.outputs()[0].to_vec::<f32>().unwrap();
    for i in [0usize, 1, 5, n / 3, n - 1] {
        assert_eq!(got[i], xv[i] * 0.5 + xv[i], "element {i}");
    }
    // Two freed neighbours (the halves of a freed 32-MiB block) merge and serve a 32-MiB
    // request whole.
    d.synchronize().unwrap();
    let before = d.memory_stats().in_use;
    let (xs, ws) = (x.clone(), w.clone());
    let g = d
        .capture(move || {
            drop(Tensor::cat(&[&xs, &xs], 0)?);
            let (a, b) = (xs.mul(&ws)?, xs.add(&ws)?);
            let s = a.add(&b)?;
            drop((a, b));
            Ok(vec![Tensor::cat(&[&s, &xs], 0)?, s])
        })
        .unwrap();
    // Merged: 32 (both cats, a and b) + 16 (s); without merging 80 (a second 32 for the
    // last cat).
    let held = d.memory_stats().in_use - before;
    assert!(
        held < 4 * n * 4,
        "a capture of two 32-MiB temporaries, the first freed, holds {:.0} MiB",
        mib(held)
    );
    let xv: Vec<f32> = (0..n).map(|i| (i % 11) as f32).collect();
    d.write(&x, &HostBuffer::F32(xv.clone())).unwrap();
    g.replay().unwrap();
    let got = g.outputs()[0].to_vec::<f32>().unwrap();
    for i in [0usize, 1, 5, n / 3, n - 1] {
        let s = xv[i] * 0.5 + (xv[i] + 0.5);
        assert_eq!(got[i], s, "element {i}");
        assert_eq!(got[n + i], xv[i], "element {}", n + i);
    }
}

fn cuda_addr(t: &Tensor) -> u64 {
    t.storage()
        .as_any()
        .downcast_ref::<ferrite_cuda::CudaStorage>()
        .expect("a CUDA tensor")
        .device_ptr()
}

/// `Tensor::copy_` keeps the buffer's address, host reads wait for the write (not only for
/// the producer), views see it, and a write captured in a graph updates on every replay.
fn copy_in_place(d: &CudaDevice) {
    let dev = d.device();
    let n = 1 << 20;
    let p = Tensor::zeros([n], DType::F32, &dev).unwrap();
    let before = cuda_addr(&p);
    let view = p.narrow(0, n - 2, 2).unwrap();
    for k in 1..4 {
        let src = Tensor::full(k as f64, [n], DType::F32, &dev).unwrap();
        p.copy_(&src).unwrap();
        assert_eq!(cuda_addr(&p), before);
        assert!(p.to_vec::<f32>().unwrap().iter().all(|&v| v == k as f32));
        assert_eq!(view.to_vec::<f32>().unwrap(), [k as f32; 2]);
    }
    // Uploaded (copy-stream) source and destination, strided source, dtype cast.
    let host: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let q = Tensor::from_vec(host.clone(), [2, 3], &dev).unwrap();
    let qa = cuda_addr(&q);
    let src = Tensor::from_vec(
        host.iter().map(|&v| v as f64 * 2.0).collect::<Vec<f64>>(),
        [3, 2],
        &dev,
    )
    .unwrap()
    .t()
    .unwrap();
    q.copy_(&src).unwrap();
    assert_eq!(cuda_addr(&q), qa);
    assert_eq!(q.to_vec::<f32>().unwrap(), [0., 4., 8., 2., 6., 10.]);
    // An SGD-like update captured once and replayed: the parameter moves each replay.
    let w = Tensor::full(1.0, [256], DType::F32, &dev).unwrap();
    let wa = cuda_addr(&w);
    let wc = w.clone();
    let g = d
        .capture(move || {
            wc.copy_(&wc.mul_scalar(0.5)?)?;
            Ok(vec![])
        })
        .unwrap();
    for step in 1..=3 {
        g.replay().unwrap();
        let v = w.to_vec::<f32>().unwrap();
        assert!(
            v.iter().all(|&x| x == 0.5f32.powi(step)),
            "step {step}: {}",
            v[0]
        );
    }
    assert_eq!(cuda_addr(&w), wa);
}

fn device_index_error(d: &CudaDevice) {
    let dev = d.device();
    let x = Tensor::from_vec((0..20).map(|i| i as f32).collect(), [5, 4], &dev).unwrap();
    let idx = Tensor::from_vec(vec![0u32, 7, 1], [3], &dev).unwrap();
    let r = x.index_select(&idx, 0).and_then(|y| y.to_vec::<f32>());
    let msg = r
        .map(|_| ())
        .expect_err("index 7 on an axis of 5 must fail")
        .to_string();
    assert!(
        msg.starts_with("index_select:") && msg.contains('7'),
        "{msg}"
    );
    // The device stays usable and the fault is cleared.
    let ok = Tensor::from_vec(vec![4u32, 0], [2], &dev).unwrap();
    let y = x.index_select(&ok, 0).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(y, vec![16.0, 17.0, 18.0, 19.0, 0.0, 1.0, 2.0, 3.0]);
}

fn matmul_large(d: &CudaDevice) {
    let dev = d.device();
    let cpu = ferrite_cpu::cpu();
    for (dt, tol) in [
        (DType::F32, 1e-4),
        (DType::F64, 1e-10),
        (DType::BF16, 3e-2),
        (DType::F16, 5e-3),
    ] {
        for (b, m, k, n, trans_a, trans_b) in [
            (1, 513, 257, 129, false, false),
            (3, 64, 96, 80, true, false),
            (2, 33, 65, 17, false, true),
            (4, 128, 128, 128, true, true),
        ] {
            let mk = |r: usize, c: usize, t: bool, seed: u64| {
                let shape = if t { [b, c, r] } else { [b, r, c] };
                let h = Tensor::rand_uniform(shape, -1.0, 1.0, seed, dt, &cpu).unwrap();
                let g = Tensor::from_host(h.to_host().unwrap(), shape, &dev).unwrap();
                if t {
                    (h.transpose(-1, -2).unwrap(), g.transpose(-1, -2).unwrap())
                } else {
                    (h, g)
                }
            };
            let (ha, ga) = mk(m, k, trans_a, 1);
            let (hb, gb) = mk(k, n, trans_b, 2);
            let want = ha.matmul(&hb).unwrap().to_vec_f64().unwrap();
            let got = ga.matmul(&gb).unwrap().to_vec_f64().unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= tol * (1.0 + w.abs()) * (k as f64).sqrt(),
                    "{dt} [{b},{m},{k},{n}] t=({trans_a},{trans_b}) [{i}]: {g} vs {w}"
                );
            }
        }
    }
}

fn gradients_match_cpu(d: &CudaDevice) {
    let dev = d.device();
    let (checked, failures) = ferrite_testing::grad_compare_all(&dev, &ferrite_cpu::cpu());
    println!("  {checked} gradient cases match the CPU");
    assert!(
        failures.is_empty(),
        "{} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked > 200, "only {checked} gradient cases ran");
}

/// Convolutions at ResNet sizes (3x3 stride 2, 1x1, 7x7 stem; grouped), forward and both
/// gradients, f32 and bf16, against the CPU: the im2col + cuBLASLt path beyond the small
/// harness shapes, where the GEMMs take tensor-core tiles.
fn conv_resnet_sizes(d: &CudaDevice) {
    use ferrite_autodiff::{backward_with, Var};
    use ferrite_core::{ConvArgs, Padding};
    let dev = d.device();
    let cpu = ferrite_cpu::cpu();
    // (x, w, stride, padding, groups)
    type Conv = ([usize; 4], [usize; 4], usize, usize, usize);
    let shapes: [Conv; 4] = [
        ([4, 64, 28, 28], [128, 64, 3, 3], 2, 1, 1),
        ([4, 256, 14, 14], [64, 256, 1, 1], 1, 0, 1),
        ([2, 3, 64, 64], [64, 3, 7, 7], 2, 3, 1),
        ([2, 128, 14, 14], [128, 4, 3, 3], 1, 1, 32),
    ];
    for dt in [DType::F32, DType::BF16] {
        for (xs, ws, stride, pad, groups) in shapes {
            let args = ConvArgs {
                stride: [stride; 2],
                padding: Padding::Zeros([pad; 2]),
                dilation: [1, 1],
                groups,
            };
            let run = |device: &ferrite_core::Device| -> Vec<Vec<f64>> {
                let x = Tensor::rand_normal(xs, 0.0, 1.0, 1, DType::F32, device)
                    .and_then(|t| t.cast(dt))
                    .unwrap();
                let w = Tensor::rand_normal(ws, 0.0, 0.1, 2, DType::F32, device)
                    .and_then(|t| t.cast(dt))
                    .unwrap();
                let (xv, wv) = (Var::new(&x).unwrap(), Var::new(&w).unwrap());
                let y = xv.tensor().conv2d(wv.tensor(), None, &args).unwrap();
                let g = Tensor::rand_normal(y.dims(), 0.0, 1.0, 3, DType::F32, device)
                    .and_then(|t| t.cast(dt))
                    .unwrap();
                backward_with(&y, &g).unwrap();
                [y, xv.grad().unwrap(), wv.grad().unwrap()]
                    .iter()
                    .map(|t| t.to_vec_f64().unwrap())
                    .collect()
            };
            let (got, want) = (run(&dev), run(&cpu));
            let tol = if dt == DType::BF16 { 3e-2 } else { 2e-3 };
            for (k, name) in ["y", "dx", "dw"].iter().enumerate() {
                let scale = want[k].iter().fold(0f64, |a, v| a.max(v.abs())).max(1e-6);
                let worst = got[k]
                    .iter()
                    .zip(&want[k])
                    .fold(0f64, |a, (g, w)| a.max((g - w).abs()));
                assert!(
                    worst <= tol * scale,
                    "{dt} x {xs:?} w {ws:?}: {name} differs by {worst} (scale {scale})"
                );
            }
        }
    }
    println!("  conv2d at ResNet sizes matches the CPU (f32, bf16)");
}

/// The nn layers over the convolution, pooling and channel-norm ops against PyTorch's
/// fixtures (outputs, input and parameter gradients, running statistics, eval outputs).
fn torch_layers(d: &CudaDevice) {
    let (checked, failures) = ferrite_testing::torch_layers::check_all(&d.device());
    println!("  {checked} layer cases match PyTorch");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn autodiff_memory(d: &CudaDevice) {
    use ferrite_autodiff::{backward, Var};
    let dev = d.device();
    let w1 =
        Var::new(&Tensor::rand_normal([64, 128], 0.0, 0.1, 1, DType::F32, &dev).unwrap()).unwrap();
    let w2 =
        Var::new(&Tensor::rand_normal([128, 10], 0.0, 0.1, 2, DType::F32, &dev).unwrap()).unwrap();
    let x = Tensor::rand_normal([32, 64], 0.0, 1.0, 3, DType::F32, &dev).unwrap();
    let step = || {
        let h = x.matmul(w1.tensor()).unwrap().relu().unwrap();
        let y = h.matmul(w2.tensor()).unwrap();
        let l = y.square().unwrap().sum_all().unwrap();
        backward(&l).unwrap();
        w1.zero_grad();
        w2.zero_grad();
    };
    step();
    d.synchronize().unwrap();
    let base = d.memory_stats().in_use;
    for _ in 0..1000 {
        step();
    }
    d.synchronize().unwrap();
    let end = d.memory_stats();
    assert_eq!(
        end.in_use, base,
        "device memory in use grew over 1,000 steps: {end:?}"
    );
    println!(
        "  in use {} B before and after 1,000 steps; peak {} B",
        base, end.peak_in_use
    );
}

fn torch_reference(d: &CudaDevice) {
    use ferrite_testing::torch_reference as tr;
    let dev = d.device();
    tr::mlp(&dev, DType::F64, 1e-12).unwrap();
    tr::mlp(&dev, DType::F32, 1e-5).unwrap();
    tr::attention(&dev, DType::F64, 1e-12).unwrap();
    tr::attention(&dev, DType::F32, 1e-5).unwrap();
}

fn sgd_trains(d: &CudaDevice) {
    let (first, last) = ferrite_testing::torch_reference::sgd_train(&d.device()).unwrap();
    println!("  loss {first} -> {last}");
    assert!(last < first / 100.0, "loss went from {first} to {last}");
}

static BAD_LAUNCH: ferrite_cuda::KernelSource = ferrite_cuda::KernelSource {
    name: "test_launch",
    src: "extern \"C\" __global__ void fill_one(float* y) { y[threadIdx.x] = 1.0f; }",
    prebuilt: &[],
};

static BAD_SOURCE: ferrite_cuda::KernelSource = ferrite_cuda::KernelSource {
    name: "test_bad_source",
    src: "extern \"C\" __global__ void broken(float* y) { y[0] = undefined_name; }",
    prebuilt: &[],
};

fn launch_failure(d: &CudaDevice) {
    use ferrite_cuda::{KernelArgs, LaunchConfig};
    let buf = d.alloc_bytes(4096, "test").unwrap();
    // 4,096 threads in a block is over the limit of 1,024: the launch itself fails.
    let err = d
        .launch(
            "my_op",
            &BAD_LAUNCH,
            "fill_one",
            LaunchConfig::new((1, 1, 1), (4096, 1, 1), 0),
            KernelArgs::new().arg(buf.ptr()),
        )
        .expect_err("a block of 4,096 threads must fail");
    let msg = err.to_string();
    assert!(
        msg.starts_with("my_op: kernel fill_one failed to launch"),
        "{msg}"
    );
    // A source that does not compile: the error names the source and carries NVRTC's log.
    let err = d
        .launch(
            "my_op",
            &BAD_SOURCE,
            "broken",
            LaunchConfig::new((1, 1, 1), (32, 1, 1), 0),
            KernelArgs::new().arg(buf.ptr()),
        )
        .expect_err("a broken source must fail");
    let msg = err.to_string();
    assert!(
        msg.contains("test_bad_source.cu failed to compile") && msg.contains("undefined_name"),
        "{msg}"
    );
    // The device stays usable.
    d.launch(
        "my_op",
        &BAD_LAUNCH,
        "fill_one",
        LaunchConfig::new((1, 1, 1), (1024, 1, 1), 0),
        KernelArgs::new().arg(buf.ptr()),
    )
    .unwrap();
    let t = d.tensor(&buf, 0, &[1024], DType::F32).unwrap();
    assert!(t.to_vec::<f32>().unwrap().iter().all(|&v| v == 1.0));
}

/// `FERRITE_CONV` accepts auto, cudnn and im2col, and refuses anything else by name.
fn conv_impl_env() {
    use ferrite_cuda::ConvImpl;
    assert_eq!(ConvImpl::parse("auto").unwrap(), ConvImpl::Auto);
    assert_eq!(ConvImpl::parse("").unwrap(), ConvImpl::Auto);
    assert_eq!(ConvImpl::parse("cudnn").unwrap(), ConvImpl::Cudnn);
    assert_eq!(ConvImpl::parse("im2col").unwrap(), ConvImpl::Im2col);
    for bad in ["CUDNN", "gemm", "im2col "] {
        let msg = ConvImpl::parse(bad).unwrap_err().to_string();
        assert!(
            msg.contains("FERRITE_CONV") && msg.contains("auto, cudnn or im2col"),
            "{msg}"
        );
    }
}

/// The convolution problems cuDNN and im2col are compared over: (x, w, stride, padding,
/// dilation, groups). Odd sizes, every parameter, depthwise, 1x1, the ResNet stem.
type ConvCase = ([usize; 4], [usize; 4], usize, usize, usize, usize);
const CUDNN_CASES: [ConvCase; 9] = [
    ([2, 3, 31, 33], [5, 3, 3, 3], 1, 1, 1, 1),
    ([1, 4, 17, 9], [6, 4, 3, 2], 2, 0, 1, 1),
    ([2, 8, 15, 15], [8, 2, 3, 3], 1, 2, 2, 4),
    ([3, 16, 12, 12], [16, 1, 3, 3], 1, 1, 1, 16),
    ([2, 32, 9, 9], [64, 32, 1, 1], 1, 0, 1, 1),
    ([2, 32, 9, 9], [16, 32, 1, 1], 2, 0, 1, 1),
    ([4, 64, 28, 28], [128, 64, 3, 3], 2, 1, 1, 1),
    ([2, 3, 64, 64], [64, 3, 7, 7], 2, 3, 1, 1),
    ([2, 128, 14, 14], [128, 4, 3, 3], 1, 1, 1, 32),
];

/// (y, dx, dw) of a convolution with its gradients for output gradient g, on `device`.
fn conv_fwd_bwd(case: &ConvCase, dt: DType, device: &ferrite_core::Device) -> [Vec<f64>; 3] {
    use ferrite_core::Conv2dParams;
    let (xs, ws, stride, pad, dil, groups) = *case;
    let p = Conv2dParams {
        stride: [stride; 2],
        padding: [pad; 2],
        dilation: [dil; 2],
        groups,
    };
    let mk = |dims: [usize; 4], std: f64, seed: u64| {
        Tensor::rand_normal(dims, 0.0, std, seed, DType::F32, device)
            .and_then(|t| t.cast(dt))
            .unwrap()
    };
    let x = mk(xs, 1.0, 11);
    let w = mk(ws, 0.2, 12);
    let y = x.conv2d_raw(&w, &p).unwrap();
    let g = mk(
        [y.dims()[0], y.dims()[1], y.dims()[2], y.dims()[3]],
        1.0,
        13,
    );
    let dx = Tensor::conv2d_backward_input(&g, &w, &p, x.dims()).unwrap();
    let dw = Tensor::conv2d_backward_weight(&x, &g, &p, w.dims()).unwrap();
    [y, dx, dw].map(|t| t.to_vec_f64().unwrap())
}

/// Largest |got - want| relative to want's largest magnitude.
fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |a, v| a.max(v.abs())).max(1e-12);
    got.iter()
        .zip(want)
        .fold(0f64, |a, (g, w)| a.max((g - w).abs()))
        / scale
}

/// conv2d, its input gradient and its weight gradient through cuDNN and through im2col,
/// each against the CPU (the f64 CPU result as the reference), in f32, bf16, f16 and f64;
/// checks that cuDNN really ran the cuDNN side (`conv_stats`).
fn cudnn_vs_im2col(d: &CudaDevice) {
    use ferrite_cuda::ConvImpl;
    let dev = d.device();
    let cpu = ferrite_cpu::cpu();
    let before = d.conv_stats();
    for dt in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        // cuDNN's f64 convolution rounds like f32 (7.2e-8 measured on an H100, cuDNN 9.14),
        // which is why `Auto` keeps f64 on im2col; forced here, it is held to f32's bound.
        let tol = match dt {
            DType::F64 => 1e-6,
            DType::F32 => 1e-5,
            _ => 2e-2,
        };
        for case in &CUDNN_CASES {
            let want = conv_fwd_bwd(case, dt, &cpu);
            d.set_conv_impl(ConvImpl::Cudnn);
            let s0 = d.conv_stats();
            let cudnn = conv_fwd_bwd(case, dt, &dev);
            let s1 = d.conv_stats();
            d.set_conv_impl(ConvImpl::Im2col);
            let im2col = conv_fwd_bwd(case, dt, &dev);
            let s2 = d.conv_stats();
            d.set_conv_impl(ConvImpl::Auto);
            assert_eq!(s1.cudnn - s0.cudnn, 3, "{dt} {case:?}: cuDNN did not run");
            assert_eq!(
                s1.im2col, s0.im2col,
                "{dt} {case:?}: im2col ran in cudnn mode"
            );
            assert_eq!(s2.im2col - s1.im2col, 3, "{dt} {case:?}");
            for (k, name) in ["y", "dx", "dw"].iter().enumerate() {
                for (path, got) in [("cudnn", &cudnn[k]), ("im2col", &im2col[k])] {
                    let e = rel_err(got, &want[k]);
                    assert!(
                        e <= tol,
                        "{dt} {case:?} {name}: {path} vs CPU {e:e} > {tol:e}"
                    );
                }
                let e = rel_err(&cudnn[k], &im2col[k]);
                assert!(
                    e <= 2.0 * tol,
                    "{dt} {case:?} {name}: cudnn vs im2col {e:e}"
                );
            }
        }
    }
    let after = d.conv_stats();
    println!(
        "  {} cuDNN and {} im2col convolution calls match the CPU",
        after.cudnn - before.cudnn,
        after.im2col - before.im2col
    );
}

/// The forward (`conv_small`) and weight gradient (`wgrad_small`) of small filters over long
/// reductions, taken in `Auto` mode, against the CPU in f64, f32, f16 and bf16: the seed CNN's layer, stride,
/// dilation and groups, a reduction that ends inside a staged tile, and a filter at the
/// per-thread limit (1,008 entries); and the shapes it must leave to cuDNN / im2col (a filter
/// over the limit, a short reduction, f64 staging over the shared-memory bound).
fn conv_small_filter_wgrad(d: &CudaDevice) {
    use ferrite_cuda::ConvImpl;
    let dev = d.device();
    let cpu = ferrite_cpu::cpu();
    d.set_conv_impl(ConvImpl::Auto);
    // (case, whether f32 takes the direct kernel)
    let cases: [(ConvCase, bool); 7] = [
        (([32, 3, 32, 32], [8, 3, 3, 3], 1, 1, 1, 1), true),
        (([8, 5, 29, 23], [6, 5, 3, 3], 2, 1, 2, 1), true),
        (([2, 8, 30, 30], [12, 2, 3, 3], 1, 1, 1, 4), true),
        (([1, 3, 33, 35], [4, 3, 5, 5], 1, 2, 1, 1), true),
        (([4, 16, 20, 20], [7, 16, 3, 3], 1, 1, 1, 1), true),
        (([4, 16, 20, 20], [8, 16, 3, 3], 1, 1, 1, 1), false),
        (([1, 3, 20, 20], [8, 3, 3, 3], 1, 1, 1, 1), false),
    ];
    let (mut direct, mut forward) = (0, 0);
    for dt in [DType::F64, DType::F32, DType::F16, DType::BF16] {
        let tol = match dt {
            DType::F64 => 1e-12,
            DType::F32 => 1e-5,
            _ => 2e-2,
        };
        for (case, small) in &cases {
            let (xs, ws, stride, pad, dil, groups) = *case;
            let p = ferrite_core::Conv2dParams {
                stride: [stride; 2],
                padding: [pad; 2],
                dilation: [dil; 2],
                groups,
            };
            // Inputs made on the CPU and copied, so both sides read the same values.
            let mk = |dims: Vec<usize>, seed: u64| {
                Tensor::rand_normal(dims, 0.0, 1.0, seed, DType::F32, &cpu)
                    .and_then(|t| t.cast(dt))
                    .unwrap()
            };
            let x = mk(xs.to_vec(), 31);
            let wt = mk(ws.to_vec(), 32);
            let y = x.conv2d_raw(&wt, &p).unwrap();
            // The forward: `conv_small` where the filter is small, of one group, over at
            // least 1,024 positions.
            let fwd_small = groups == 1
                && ws[0] <= 16
                && ws[1] * ws[2] * ws[3] <= 64
                && y.elem_count() / ws[0] >= 1024;
            let s0 = d.conv_stats();
            let yd = x
                .to_device(&dev)
                .unwrap()
                .conv2d_raw(&wt.to_device(&dev).unwrap(), &p)
                .unwrap();
            let ran = d.conv_stats().direct - s0.direct;
            assert_eq!(
                ran,
                u64::from(fwd_small),
                "{dt} {case:?}: direct forward runs"
            );
            forward += ran;
            let e = rel_err(&yd.to_vec_f64().unwrap(), &y.to_vec_f64().unwrap());
            assert!(e <= tol, "{dt} {case:?} y: {e:e} > {tol:e}");
            let g = mk(y.dims().to_vec(), 33);
            let want = Tensor::conv2d_backward_weight(&x, &g, &p, &ws).unwrap();
            let (xd, gd) = (x.to_device(&dev).unwrap(), g.to_device(&dev).unwrap());
            let s0 = d.conv_stats();
            let got = Tensor::conv2d_backward_weight(&xd, &gd, &p, &ws).unwrap();
            let ran = d.conv_stats().direct - s0.direct;
            // f64 stages twice the bytes: the 1,008-entry filter's 151 rows do not fit.
            let expect = *small && !(dt == DType::F64 && case.1 == [7, 16, 3, 3]);
            assert_eq!(ran, u64::from(expect), "{dt} {case:?}: direct kernel runs");
            direct += ran;
            let e = rel_err(&got.to_vec_f64().unwrap(), &want.to_vec_f64().unwrap());
            assert!(e <= tol, "{dt} {case:?} dw: {e:e} > {tol:e}");
        }
    }
    assert_eq!(direct, 19);
    assert_eq!(forward, 8);
    println!("  {direct} small-filter weight gradients and {forward} forwards match the CPU");
}

/// A conv2d forward and both gradients captured into a CUDA graph (cuDNN picks by
/// heuristic while capturing) replay to the eager results.
fn cudnn_graph(d: &CudaDevice) {
    use ferrite_core::Conv2dParams;
    use ferrite_cuda::ConvImpl;
    let dev = d.device();
    d.set_conv_impl(ConvImpl::Cudnn);
    let p = Conv2dParams {
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
        groups: 1,
    };
    // A shape no other test used, so the capture meets an uncached problem.
    let x = Tensor::rand_normal([3, 24, 13, 11], 0.0, 1.0, 21, DType::BF16, &dev).unwrap();
    let w = Tensor::rand_normal([40, 24, 3, 3], 0.0, 0.1, 22, DType::BF16, &dev).unwrap();
    let g = Tensor::rand_normal([3, 40, 13, 11], 0.0, 1.0, 23, DType::BF16, &dev).unwrap();
    let (xc, wc, gc) = (x.clone(), w.clone(), g.clone());
    let graph = d
        .capture(move || {
            let y = xc.conv2d_raw(&wc, &p)?;
            let dx = Tensor::conv2d_backward_input(&gc, &wc, &p, xc.dims())?;
            let dw = Tensor::conv2d_backward_weight(&xc, &gc, &p, wc.dims())?;
            Ok(vec![y, dx, dw])
        })
        .unwrap();
    let xv = Tensor::rand_normal(
        [3, 24, 13, 11],
        0.0,
        1.0,
        24,
        DType::BF16,
        &ferrite_cpu::cpu(),
    )
    .unwrap()
    .to_vec_f64()
    .unwrap();
    let xh = HostBuffer::from_f64_slice(DType::BF16, &xv);
    d.write(&x, &xh).unwrap();
    graph.replay().unwrap();
    let got: Vec<Vec<f64>> = graph
        .outputs()
        .iter()
        .map(|t| t.to_vec_f64().unwrap())
        .collect();
    let y = x.conv2d_raw(&w, &p).unwrap();
    let dx = Tensor::conv2d_backward_input(&g, &w, &p, x.dims()).unwrap();
    let dw = Tensor::conv2d_backward_weight(&x, &g, &p, w.dims()).unwrap();
    d.set_conv_impl(ConvImpl::Auto);
    for (k, want) in [y, dx, dw].iter().enumerate() {
        let e = rel_err(&got[k], &want.to_vec_f64().unwrap());
        assert!(e <= 2e-2, "output {k}: replay vs eager {e:e}");
    }
    println!("  a captured cuDNN conv2d + gradients replays to the eager results");
}

/// The op-case harness with convolutions on the im2col path (the default run uses cuDNN).
fn op_cases_im2col(d: &CudaDevice) {
    use ferrite_cuda::ConvImpl;
    d.set_conv_impl(ConvImpl::Im2col);
    let cpu = ferrite_cpu::cpu();
    let (checked, failures) = ferrite_testing::check_all_vs(&d.device(), &cpu);
    d.set_conv_impl(ConvImpl::Auto);
    println!("  {checked} op cases match with conv on im2col");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Attention with and without a key-padding mask, forward (alone and with its lse) and
/// backward (recomputing, and from the saved output and lse), on CUDA against the CPU with the same inputs, for shapes that reach each kernel family: the
/// tensor-core forward (f16/bf16, d == dv in {64, 96, 128, 256}, contiguous), the tiled CUDA-core
/// forward and backward (f32/f16/bf16, heads <= 256 forward, <= 128 backward), and the row
/// kernels (f64, wider heads); with grouped-query heads, causal + mask, a transposed mask view,
/// and a batch row whose every key is padding (NaN rows forward, zero gradients backward, in
/// the same places as the CPU).
fn attention_masked(d: &CudaDevice) {
    let dev = d.device();
    let cpu = ferrite_cpu::cpu();
    // (dtype, q, k, v, causal, last batch row fully masked)
    type Case = (DType, [usize; 4], [usize; 4], [usize; 4], bool, bool);
    let mut cases: Vec<Case> = Vec::new();
    for dt in [DType::F16, DType::BF16] {
        for hd in [64, 96, 128, 256] {
            cases.push((
                dt,
                [2, 4, 70, hd],
                [2, 2, 130, hd],
                [2, 2, 130, hd],
                true,
                false,
            ));
            cases.push((
                dt,
                [3, 2, 65, hd],
                [3, 1, 65, hd],
                [3, 1, 65, hd],
                false,
                true,
            ));
        }
    }
    for dt in [DType::F32, DType::F16, DType::BF16] {
        cases.push((
            dt,
            [2, 6, 67, 40],
            [2, 2, 131, 40],
            [2, 2, 131, 24],
            true,
            false,
        ));
        cases.push((
            dt,
            [3, 4, 33, 64],
            [3, 4, 70, 64],
            [3, 4, 70, 48],
            false,
            true,
        ));
        // Forward tiled (<= 256), backward by rows (> 128).
        cases.push((
            dt,
            [2, 2, 20, 160],
            [2, 1, 45, 160],
            [2, 1, 45, 160],
            true,
            true,
        ));
        // Both by rows (> 256).
        cases.push((
            dt,
            [2, 2, 9, 300],
            [2, 2, 37, 300],
            [2, 2, 37, 260],
            false,
            false,
        ));
    }
    cases.push((
        DType::F64,
        [2, 6, 33, 16],
        [2, 3, 40, 16],
        [2, 3, 40, 8],
        true,
        true,
    ));
    cases.push((
        DType::F64,
        [3, 2, 5, 8],
        [3, 2, 70, 8],
        [3, 2, 70, 8],
        false,
        false,
    ));
    for (n, &(dt, qs, ks, vs, causal, full)) in cases.iter().enumerate() {
        let (b, lk) = (qs[0], ks[2]);
        // Padding: every third key from key 1 in every row but the last; the last row either
        // fully masked or padded from lk / 2 on. Built transposed ([lk, b] storage).
        let mut mt = vec![false; lk * b];
        for j in 0..lk {
            for r in 0..b {
                mt[j * b + r] = if r + 1 == b {
                    full || j >= lk / 2
                } else {
                    j % 3 == 1
                };
            }
        }
        let seed = 100 * n as u64;
        let make = |device: &ferrite_core::Device| {
            let r = |shape: [usize; 4], s: u64| {
                Tensor::rand_uniform(shape, -1.0, 1.0, seed + s, DType::F32, &cpu)
                    .and_then(|t| t.cast(dt))
                    .and_then(|t| t.to_device(device))
                    .unwrap()
            };
            let m = Tensor::from_vec(mt.clone(), [lk, b], &cpu)
                .and_then(|t| t.to_device(device))
                .and_then(|t| t.t())
                .unwrap();
            let go = [qs[0], qs[1], qs[2], vs[3]];
            (r(qs, 1), r(ks, 2), r(vs, 3), m, r(go, 4))
        };
        // Without the mask too: the tensor-core kernels skip masking on the tiles that every
        // row of a warp sees whole.
        let run = |device: &ferrite_core::Device, masked: bool| -> Vec<Vec<f64>> {
            let (q, k, v, m, g) = make(device);
            let m = masked.then_some(&m);
            let o = Tensor::attention_masked(&q, &k, &v, m, causal, None).unwrap();
            let scale = 1.0 / (qs[3] as f64).sqrt();
            let (dq, dk, dv) =
                Tensor::attention_backward(&q, &k, &v, m, &g, causal, scale).unwrap();
            // The output with its lse, and the backward that reads them (what autodiff
            // records and runs).
            let (o2, lse) = Tensor::attention_lse(&q, &k, &v, m, causal, None).unwrap();
            let (dq2, dk2, dv2) =
                Tensor::attention_backward_saved(&q, &k, &v, m, &g, (&o2, &lse), causal, scale)
                    .unwrap();
            [o, dq, dk, dv, o2, lse, dq2, dk2, dv2]
                .iter()
                .map(|t| t.to_vec_f64().unwrap())
                .collect()
        };
        let tol = match dt {
            DType::F64 => 1e-10,
            DType::F32 => 1e-4,
            DType::F16 => 1e-2,
            _ => 5e-2,
        };
        let names = [
            "out",
            "dq",
            "dk",
            "dv",
            "out (with lse)",
            "lse",
            "dq (saved)",
            "dk (saved)",
            "dv (saved)",
        ];
        for masked in [true, false] {
            let (got, want) = (run(&dev, masked), run(&cpu, masked));
            let what = format!("{dt} {qs:?} {ks:?} causal {causal} masked {masked}");
            for (k, name) in names.iter().enumerate() {
                let scale = want[k]
                    .iter()
                    .filter(|x| x.is_finite())
                    .fold(0f64, |a, v| a.max(v.abs()))
                    .max(1e-6);
                for (i, (g, w)) in got[k].iter().zip(&want[k]).enumerate() {
                    let close = w.is_nan() || g == w || (g - w).abs() <= tol * scale;
                    assert!(
                        g.is_nan() == w.is_nan() && close,
                        "{what}: {name}[{i}] {g} on CUDA, {w} on the CPU"
                    );
                }
            }
            if masked && full {
                // The fully masked batch row: NaN outputs, lse +inf.
                let per = want[0].len() / b;
                assert!(want[0][per * (b - 1)..].iter().all(|x| x.is_nan()));
                let per = got[5].len() / b;
                assert!(got[5][per * (b - 1)..].iter().all(|&x| x == f64::INFINITY));
            }
        }
    }
    println!(
        "  {} attention cases, masked and unmasked, match the CPU",
        cases.len()
    );
}
