//! The wgpu backend's tests. A plain binary (harness = false): where wgpu finds no adapter each
//! test is reported skipped by name; with one (a GPU through Vulkan/Metal/DX12, or Mesa's
//! lavapipe on the CPU) each runs and the binary exits non-zero on any failure.
//!
//! Usage: `cargo test -p ferrite-wgpu --test wgpu [-- FILTER]`; `FERRITE_WGPU_ADAPTER=i`
//! picks an adapter (default: `default_adapter()`, a GPU before a CPU adapter).

use ferrite_core::{DType, HostBuffer, Tensor};
use ferrite_testing::runner::Runner;
use ferrite_wgpu::WgpuDevice;

type TestFn = fn(&WgpuDevice);

fn tests() -> Vec<(&'static str, TestFn)> {
    vec![
        ("adapter_limits_are_the_adapters_own", adapter_limits),
        (
            "invalid_adapter_index_is_an_error_listing_adapters",
            invalid_index,
        ),
        ("upload_download_roundtrip_every_dtype", roundtrip),
        ("f64_and_wide_i64_are_explicit_errors", unsupported_dtypes),
        ("op_cases_match_cpu_and_f64_reference", op_cases),
        ("thousand_op_chain_waits_once", thousand_ops_wait_once),
        ("pool_reuses_and_counts", pool_counters),
        ("out_of_memory_is_an_error_with_counters", out_of_memory),
        ("rng_matches_cpu", rng_matches_cpu),
        ("copy_writes_in_place", copy_in_place),
        (
            "fused_optimizer_kernels_are_an_explicit_error",
            fused_optimizer_error,
        ),
        (
            "quantized_products_match_cpu_and_f64_reference",
            quantized_products,
        ),
        ("device_side_errors_name_the_op", device_errors),
        ("matmul_large_and_views_match_cpu", matmul_large),
        ("gradients_match_cpu", gradients_match_cpu),
        ("cross_entropy_matches_cpu", cross_entropy_matches_cpu),
        (
            "contiguous_elementwise_vec4_edges_match_cpu",
            vec4_elementwise,
        ),
        (
            "reductions_with_and_without_subgroups_match_cpu",
            reductions_both_ways,
        ),
    ]
}

fn main() {
    let mut r = Runner::from_args();
    let adapters = ferrite_wgpu::adapters();
    if adapters.is_empty() {
        r.run("without_an_adapter_wgpu_is_a_clear_error", || {
            let msg = ferrite_wgpu::wgpu(0)
                .map(|_| ())
                .expect_err("wgpu(0) without an adapter")
                .to_string();
            assert!(msg.contains("no wgpu adapter"), "{msg}");
            None
        });
    } else {
        r.skip(
            "without_an_adapter_wgpu_is_a_clear_error",
            "a wgpu adapter exists",
        );
    }
    let pick = std::env::var("FERRITE_WGPU_ADAPTER")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .or_else(ferrite_wgpu::default_adapter);
    let dev = pick.and_then(|i| match WgpuDevice::new(i) {
        Ok(d) => Some(d),
        Err(e) => {
            println!("wgpu adapter {i} failed to open: {e}");
            None
        }
    });
    if let Some(d) = &dev {
        println!(
            "adapter: {} ({}); found: {}",
            d.name(),
            d.backend_name(),
            ferrite_wgpu::describe_adapters()
        );
    }
    for (name, f) in tests() {
        match &dev {
            Some(d) => r.run(name, || {
                f(d);
                None
            }),
            None => r.skip(name, "no wgpu adapter (no Vulkan, Metal or DX12 driver)"),
        }
    }
    r.finish("wgpu tests");
}

fn adapter_limits(d: &WgpuDevice) {
    let a = &ferrite_wgpu::adapters()[d.index()];
    let l = d.limits();
    assert_eq!(l.max_buffer_size, a.max_buffer_size);
    assert_eq!(l.max_storage_buffer_binding_size, a.max_storage_binding);
    assert_eq!(
        l.max_compute_workgroup_storage_size,
        a.max_workgroup_storage
    );
    // The adapter's own limits, not wgpu's defaults (128 MiB bindings).
    let defaults = wgpu_defaults();
    assert!(
        l.max_storage_buffer_binding_size >= defaults,
        "{} < {defaults}",
        l.max_storage_buffer_binding_size
    );
}

/// wgpu's default `max_storage_buffer_binding_size` (128 MiB).
fn wgpu_defaults() -> u64 {
    128 << 20
}

fn invalid_index(_d: &WgpuDevice) {
    let n = ferrite_wgpu::adapters().len();
    let msg = ferrite_wgpu::wgpu(n + 3)
        .map(|_| ())
        .expect_err("an adapter past the last must fail")
        .to_string();
    assert!(
        msg.contains("no wgpu adapter") && msg.contains("found: wgpu:0"),
        "{msg}"
    );
}

fn roundtrip(d: &WgpuDevice) {
    let dev = d.device();
    for dt in DType::ALL {
        if dt == DType::F64 {
            continue;
        }
        let vals: Vec<f64> = (0..1003).map(|i| ((i * 37) % 101) as f64 - 50.0).collect();
        let vals: Vec<f64> = if dt == DType::Bool || dt == DType::U8 || dt == DType::U32 {
            vals.iter().map(|v| v.abs()).collect()
        } else {
            vals
        };
        let h = HostBuffer::from_f64_slice(dt, &vals);
        let t = Tensor::from_host(h.clone(), [17, 59], &dev).unwrap();
        assert_eq!(t.to_host().unwrap(), h, "{dt}");
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

fn unsupported_dtypes(d: &WgpuDevice) {
    let dev = d.device();
    let msg = Tensor::from_vec(vec![1.0f64, 2.0], [2], &dev)
        .map(|_| ())
        .expect_err("f64 upload")
        .to_string();
    assert!(msg.starts_with("upload: dtype f64 not supported"), "{msg}");
    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2], &dev).unwrap();
    let msg = x
        .cast(DType::F64)
        .map(|_| ())
        .expect_err("cast to f64")
        .to_string();
    assert!(msg.starts_with("cast: dtype f64 not supported"), "{msg}");
    let msg = Tensor::zeros([3], DType::F64, &dev)
        .map(|_| ())
        .expect_err("f64 fill")
        .to_string();
    assert!(msg.starts_with("full: dtype f64 not supported"), "{msg}");
    let msg = Tensor::from_vec(vec![1i64, 1 << 40], [2], &dev)
        .map(|_| ())
        .expect_err("i64 beyond i32")
        .to_string();
    assert!(
        msg.contains("i64") && msg.contains("1099511627776"),
        "{msg}"
    );
    let ok = Tensor::from_vec(vec![-5i64, 1 << 30], [2], &dev).unwrap();
    assert_eq!(ok.to_vec::<i64>().unwrap(), vec![-5, 1 << 30]);
}

/// The op cases: every case must match, except that every f64 case must fail with the explicit
/// f64 error (f64 is the backend's one unsupported dtype).
fn op_cases(d: &WgpuDevice) {
    let dev = d.device();
    let cpu = ferrite_cpu::cpu();
    let cases = ferrite_testing::cases();
    let (mut passed, mut unsupported) = (0, 0);
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let is_f64 = case.inputs.iter().any(|x| x.dtype == DType::F64) || case.name.contains("f64");
        match ferrite_testing::check_case_vs(case, &dev, &cpu, 1000 + i as u64) {
            Ok(()) if !is_f64 => passed += 1,
            Ok(()) => failures.push(format!("{}: f64 ran on wgpu", case.name)),
            Err(e) if is_f64 && e.contains("dtype f64 not supported") => unsupported += 1,
            Err(e) => failures.push(e),
        }
    }
    println!(
        "  {passed} of {} op cases match; {unsupported} f64 cases rejected explicitly",
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    assert_eq!(passed + unsupported, cases.len());
}

fn thousand_ops_wait_once(d: &WgpuDevice) {
    let dev = d.device();
    let mut x = Tensor::from_vec(vec![1.0f32; 4096], [4096], &dev).unwrap();
    let one = Tensor::from_vec(vec![1.0f32; 4096], [4096], &dev).unwrap();
    // After a wait the device is idle: the first batch goes out after 8 dispatches, and each
    // later one holds half as many again, up to 256 (device.rs).
    d.synchronize().unwrap();
    let before = d.sync_stats();
    for i in 0..1000 {
        x = x.add(&one).unwrap();
        if i == 7 {
            let s = d.sync_stats();
            assert_eq!(
                s.submits - before.submits,
                1,
                "8 dispatches after a wait: {s:?}"
            );
        }
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
    // The chain's outputs take turns in two pooled buffers, and parameter buffers in a ring
    // of 4: bind groups are made once per (output, input, parameter buffer) and reused.
    let made = after.bind_groups - before.bind_groups;
    assert!((1..=8).contains(&made), "{made} bind groups for 1000 adds");
    // Batches of 8, 12, 18, 27, 40, 60, 90, 135, 202, 256 (848 dispatches); the read submits
    // the other 152.
    assert_eq!(
        after_enqueue.submits - before.submits,
        10,
        "{after_enqueue:?}"
    );
    assert_eq!(after.submits - before.submits, 11, "{after:?}");
}

fn pool_counters(d: &WgpuDevice) {
    let dev = d.device();
    d.synchronize().unwrap();
    let s0 = d.memory_stats();
    {
        let a = Tensor::zeros([1 << 20], DType::F32, &dev).unwrap();
        let s1 = d.memory_stats();
        assert!(s1.in_use >= s0.in_use + (4 << 20), "{s1:?}");
        assert!(s1.peak_in_use >= s1.in_use);
        drop(a);
    }
    let s2 = d.memory_stats();
    assert_eq!(s2.in_use, s0.in_use, "freed buffer still counted");
    let b = Tensor::zeros([1 << 20], DType::F32, &dev).unwrap();
    let s3 = d.memory_stats();
    assert_eq!(s3.device_allocs, s2.device_allocs, "cache not reused");
    assert!(s3.cache_hits > s2.cache_hits);
    assert_eq!(b.to_vec::<f32>().unwrap()[(1 << 20) - 1], 0.0);
    drop(b);
    d.empty_cache();
    let s4 = d.memory_stats();
    assert!(
        s4.reserved < s3.reserved,
        "empty_cache released nothing: {s4:?}"
    );
    assert!(s4.device_frees > s3.device_frees);
}

fn out_of_memory(d: &WgpuDevice) {
    let dev = d.device();
    let reserved = d.memory_stats().reserved;
    d.set_memory_limit(Some(reserved + (64 << 20)));
    let err = Tensor::zeros([1usize << 25], DType::F32, &dev).err();
    d.set_memory_limit(None);
    let msg = err
        .expect("128 MiB past a 64 MiB limit must fail")
        .to_string();
    assert!(msg.starts_with("full: out of device memory"), "{msg}");
    assert!(
        msg.contains("in use") && msg.contains("reserved") && msg.contains("device allocations"),
        "{msg}"
    );
    let t = Tensor::ones([1000], DType::F32, &dev).unwrap();
    assert_eq!(t.sum_all().unwrap().to_vec::<f32>().unwrap(), vec![1000.0]);
    // Past the adapter's buffer limits: an error naming the limit, before any allocation.
    let huge = Tensor::zeros([1usize << 31], DType::F32, &dev)
        .map(|_| ())
        .expect_err("8 GiB in one binding must fail")
        .to_string();
    assert!(huge.contains("exceeds the adapter's limit"), "{huge}");
    let huge = Tensor::zeros([1usize << 40], DType::F32, &dev)
        .map(|_| ())
        .expect_err("2^40 elements must fail")
        .to_string();
    assert!(huge.contains("exceed"), "{huge}");
}

fn rng_matches_cpu(d: &WgpuDevice) {
    let dev = d.device();
    let cpu = ferrite_cpu::cpu();
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let a = Tensor::rand_uniform([100_003], -2.0, 3.0, 42, dt, &dev).unwrap();
        let b = Tensor::rand_uniform([100_003], -2.0, 3.0, 42, dt, &cpu).unwrap();
        let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
        // The same Philox words; f32 arithmetic may differ by a rounding in low + (high-low) u.
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-6 * (1.0 + y.abs())
                    || (dt != DType::F32 && (x - y).abs() <= 2e-2),
                "uniform {dt} [{i}]: {x} vs {y}"
            );
        }
        let a = Tensor::rand_normal([100_003], 1.0, 0.5, 7, dt, &dev)
            .unwrap()
            .to_vec_f64()
            .unwrap();
        let b = Tensor::rand_normal([100_003], 1.0, 0.5, 7, dt, &cpu)
            .unwrap()
            .to_vec_f64()
            .unwrap();
        let tol = if dt == DType::F32 { 1e-5 } else { 1e-2 };
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                (x - y).abs() <= tol * (1.0 + y.abs()),
                "normal {dt} [{i}]: {x} vs {y}"
            );
        }
    }
}

/// `Tensor::copy_` writes in place; host reads wait for the write; views see it.
/// No fused optimizer kernels on wgpu: the request is refused naming the op (optimizers take
/// their composed implementation there).
fn fused_optimizer_error(d: &WgpuDevice) {
    let dev = d.device();
    let g = Tensor::full(2.0, [7], DType::F32, &dev).unwrap();
    let msg = ferrite_core::optim::sum_squares(&[g], &dev)
        .map(|_| ())
        .expect_err("sum_squares on wgpu")
        .to_string();
    assert!(
        msg.contains("sum_squares") && msg.contains("composed"),
        "{msg}"
    );
}

/// The wgpu backend has no `QTensor`s yet (its products run inside the LLM kernel set): a
/// matrix that moves there is refused naming the op and why.
/// Every `quant_cases` case (13 formats x q8 / q8x2 / f32 activations x 1, 33, 48 rows x
/// inputs of 1, 3, 9 and 2x5 rows) within its activation format's tolerance of the f64
/// product, beside the CPU's; then, where the adapter reads f16 fields with
/// `unpack2x16float`, the cases of 9 input rows again with the bit operations of adapters
/// without it.
fn quantized_products(d: &WgpuDevice) {
    use ferrite_core::{ActFormat, QBytes, QTensor, QType};
    let dev = d.device();
    let cpu = ferrite_cpu::cpu();
    let cases = ferrite_testing::quant_cases::quant_cases();
    let all: Vec<_> = cases.iter().collect();
    ferrite_testing::quant_cases::assert_cases(&all, &dev, &cpu, 9000, "quantized cases");
    if d.f16_in_f32() {
        d.use_f16_in_f32(false);
        let bits: Vec<_> = cases.iter().filter(|c| c.name.contains("/x[9,")).collect();
        assert!(!bits.is_empty());
        let what = "cases with f16 fields by bit operations";
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ferrite_testing::quant_cases::assert_cases(&bits, &dev, &cpu, 19000, what)
        }));
        d.use_f16_in_f32(true);
        if let Err(e) = r {
            std::panic::resume_unwind(e);
        }
    }
    // A wgpu matrix multiplies wgpu inputs only, and moves back to the CPU with its bytes.
    let bytes = ferrite_testing::quant_cases::matrix_bytes(QType::Q4_0, 2, 64, 1);
    let q = QTensor::new(&cpu, QType::Q4_0, 2, 64, QBytes::from_vec(bytes)).unwrap();
    let g = q.to_device(&dev).unwrap();
    let x = Tensor::zeros([64], DType::F32, &cpu).unwrap();
    let msg = g.qmatvec(&x, ActFormat::Q8).unwrap_err().to_string();
    assert!(
        msg.starts_with("qmatmul: tensors are on different devices"),
        "{msg}"
    );
    assert_eq!(g.host_bytes(), q.host_bytes());
    let back = g.to_device(&cpu).unwrap();
    let x = Tensor::from_vec(
        (0..64).map(|i| i as f32 / 64.0).collect::<Vec<_>>(),
        [64],
        &cpu,
    )
    .unwrap();
    let want = q
        .qmatvec(&x, ActFormat::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(
        back.qmatvec(&x, ActFormat::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        want
    );
    // Bad input is an error naming the op, not a panic.
    let wrong = Tensor::zeros([3, 32], DType::F32, &dev).unwrap();
    let msg = g.qmatmul(&wrong, ActFormat::F32).unwrap_err().to_string();
    assert!(msg.starts_with("qmatmul: "), "{msg}");
}

fn copy_in_place(d: &WgpuDevice) {
    let dev = d.device();
    let n = 1 << 16;
    let p = Tensor::zeros([n], DType::F32, &dev).unwrap();
    let view = p.narrow(0, n - 2, 2).unwrap();
    for k in 1..4 {
        let src = Tensor::full(k as f64, [n], DType::F32, &dev).unwrap();
        p.copy_(&src).unwrap();
        assert!(p.to_vec::<f32>().unwrap().iter().all(|&v| v == k as f32));
        assert_eq!(view.to_vec::<f32>().unwrap(), [k as f32; 2]);
    }
    let host: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let q = Tensor::from_vec(host.clone(), [2, 3], &dev).unwrap();
    let src = Tensor::from_vec(
        host.iter().map(|&v| v * 2.0).collect::<Vec<f32>>(),
        [3, 2],
        &dev,
    )
    .unwrap()
    .t()
    .unwrap();
    q.copy_(&src).unwrap();
    assert_eq!(q.to_vec::<f32>().unwrap(), [0., 4., 8., 2., 6., 10.]);
    // A read of a tensor written in an earlier batch does not wait for the open one.
    let w = Tensor::full(1.0, [256], DType::F32, &dev).unwrap();
    d.backend().flush();
    w.copy_(&w.mul_scalar(0.5).unwrap()).unwrap();
    assert!(w.to_vec::<f32>().unwrap().iter().all(|&x| x == 0.5));
}

fn device_errors(d: &WgpuDevice) {
    let dev = d.device();
    let x = Tensor::from_vec((0..20).map(|i| i as f32).collect(), [5, 4], &dev).unwrap();
    let idx = Tensor::from_vec(vec![0u32, 7, 1], [3], &dev).unwrap();
    let r = x.index_select(&idx, 0).and_then(|y| y.to_vec::<f32>());
    let msg = r
        .map(|_| ())
        .expect_err("index 7 on an axis of 5 must fail")
        .to_string();
    assert!(
        msg.starts_with("index_select:") && msg.contains("out of range"),
        "{msg}"
    );
    let ok = Tensor::from_vec(vec![4u32, 0], [2], &dev).unwrap();
    let y = x.index_select(&ok, 0).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(y, vec![16.0, 17.0, 18.0, 19.0, 0.0, 1.0, 2.0, 3.0]);
    let a = Tensor::from_vec(vec![6i32, 7, 8], [3], &dev).unwrap();
    let b = Tensor::from_vec(vec![2i32, 0, 4], [3], &dev).unwrap();
    let msg = a
        .div(&b)
        .and_then(|y| y.to_vec::<i32>())
        .map(|_| ())
        .expect_err("integer division by zero")
        .to_string();
    assert!(msg.starts_with("div: integer division by zero"), "{msg}");
    let b = Tensor::from_vec(vec![2i32, 7, 4], [3], &dev).unwrap();
    assert_eq!(a.div(&b).unwrap().to_vec::<i32>().unwrap(), vec![3, 1, 2]);
}

fn matmul_large(d: &WgpuDevice) {
    let dev = d.device();
    let cpu = ferrite_cpu::cpu();
    for (dt, tol) in [(DType::F32, 1e-4), (DType::BF16, 3e-2), (DType::F16, 5e-3)] {
        for &(b, m, k, n) in &[(1, 257, 300, 129), (3, 64, 64, 64), (2, 1, 513, 7)] {
            let a = Tensor::rand_uniform([b, m, k], -1.0, 1.0, 3, dt, &cpu).unwrap();
            let w = Tensor::rand_uniform([b, n, k], -1.0, 1.0, 4, dt, &cpu).unwrap();
            let want = a
                .cast(DType::F32)
                .unwrap()
                .matmul(&w.cast(DType::F32).unwrap().transpose(1, 2).unwrap())
                .unwrap()
                .to_vec_f64()
                .unwrap();
            let ga = a.to_device(&dev).unwrap();
            let gw = w.to_device(&dev).unwrap().transpose(1, 2).unwrap();
            let got = ga.matmul(&gw).unwrap().to_vec_f64().unwrap();
            for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (x - y).abs() <= tol * (k as f64).sqrt() * (1.0 + y.abs()),
                    "{dt} {b}x{m}x{k}x{n} [{i}]: {x} vs {y}"
                );
            }
        }
    }
}

/// Backward of every differentiable f32 op case (the CPU's f32 gradients as the oracle, within
/// 20x the case's forward tolerance: backward chains several roundings).
fn gradients_match_cpu(d: &WgpuDevice) {
    let dev = d.device();
    let cpu = ferrite_cpu::cpu();
    let mut compared = 0;
    let mut failures = Vec::new();
    for (i, case) in ferrite_testing::cases().iter().enumerate() {
        if !case.differentiable || !case.name.contains("/f32/") || case.name.contains("f64") {
            continue;
        }
        let t = case
            .tol
            .first()
            .copied()
            .unwrap_or(ferrite_testing::default_tol(DType::F32));
        let tol = ferrite_testing::Tol {
            atol: t.atol.max(1e-5) * 20.0,
            rtol: t.rtol.max(1e-4) * 20.0,
        };
        match ferrite_testing::grad_compare_case_tol(case, &dev, &cpu, 7000 + i as u64, tol) {
            Ok(true) => compared += 1,
            Ok(false) => {}
            Err(e) => failures.push(e),
        }
    }
    println!("  {compared} f32 gradient cases match the CPU");
    assert!(
        failures.is_empty(),
        "{} gradient cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(compared > 300, "only {compared} gradient cases compared");
}

/// Contiguous elementwise ops take the vec4 kernels when their first element sits at a
/// multiple of 4 (lengths that are not included); views at other offsets take the strided
/// ones. Every case against the CPU: exact except exp and div.
fn vec4_elementwise(d: &WgpuDevice) {
    let dev = d.device();
    let cpu = ferrite_cpu::cpu();
    let mut failures = Vec::new();
    for dt in [DType::F32, DType::F16, DType::BF16, DType::I32] {
        for n in [1usize, 3, 4, 5, 255, 1024, 1027] {
            for off in [0usize, 1, 4] {
                let base =
                    Tensor::rand_uniform([n + off + 8], -4.0, 4.0, n as u64, DType::F32, &cpu)
                        .unwrap()
                        .cast(dt)
                        .unwrap();
                let other = Tensor::rand_uniform([n + 8], -4.0, 4.0, 7, DType::F32, &cpu)
                    .unwrap()
                    .cast(dt)
                    .unwrap();
                let a_c = base.narrow(0, off, n).unwrap();
                let b_c = other.narrow(0, 4, n).unwrap();
                let a_g = base.to_device(&dev).unwrap().narrow(0, off, n).unwrap();
                let b_g = other.to_device(&dev).unwrap().narrow(0, 4, n).unwrap();
                let mut ops: Vec<(&str, Tensor, Tensor)> = vec![
                    ("add", a_c.add(&b_c).unwrap(), a_g.add(&b_g).unwrap()),
                    ("mul", a_c.mul(&b_c).unwrap(), a_g.mul(&b_g).unwrap()),
                    ("neg", a_c.neg().unwrap(), a_g.neg().unwrap()),
                    (
                        "max",
                        a_c.maximum(&b_c).unwrap(),
                        a_g.maximum(&b_g).unwrap(),
                    ),
                ];
                if dt.is_float() {
                    ops.push(("exp", a_c.exp().unwrap(), a_g.exp().unwrap()));
                    ops.push(("div", a_c.div(&b_c).unwrap(), a_g.div(&b_g).unwrap()));
                }
                for (op, want, got) in ops {
                    let (w, g) = (want.to_vec_f64().unwrap(), got.to_vec_f64().unwrap());
                    let exact = op != "exp" && op != "div";
                    let bad = w.iter().zip(&g).position(|(w, g)| {
                        let tol = if exact { 0.0 } else { 1e-5 * w.abs().max(1.0) };
                        !((w - g).abs() <= tol || (w.is_nan() && g.is_nan()))
                    });
                    if let Some(i) = bad {
                        failures.push(format!(
                            "{op} {dt:?} n={n} offset {off}: element {i}: wgpu {} cpu {}",
                            g[i], w[i]
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Sums, maxima and argmaxima of rows short and long (one and two passes), at word offsets
/// that are and are not multiples of 4, against the CPU; with subgroup sums where the adapter
/// has them and again with the workgroup-memory fallback.
fn reductions_both_ways(d: &WgpuDevice) {
    let dev = d.device();
    let cpu = ferrite_cpu::cpu();
    let mut failures = Vec::new();
    println!(
        "  subgroup operations: {}",
        if d.subgroups() {
            "yes"
        } else {
            "no (fallback only)"
        }
    );
    for subgroups in [true, false] {
        d.use_subgroups(subgroups);
        for dt in [DType::F32, DType::BF16, DType::I32] {
            for (rows, m) in [
                (1usize, 1usize),
                (3, 5),
                (4, 256),
                (2, 4100),
                (1, 100_003),
                (1, 65_536),
                (300, 64),
            ] {
                for off in [0usize, 1] {
                    let n = rows * m;
                    let scale = if dt == DType::I32 { 100.0 } else { 1.0 };
                    let base = Tensor::rand_uniform(
                        [n + off],
                        -scale,
                        scale,
                        (n + off) as u64,
                        DType::F32,
                        &cpu,
                    )
                    .unwrap()
                    .cast(dt)
                    .unwrap();
                    let x_c = base.narrow(0, off, n).unwrap().reshape([rows, m]).unwrap();
                    let x_g = base
                        .to_device(&dev)
                        .unwrap()
                        .narrow(0, off, n)
                        .unwrap()
                        .reshape([rows, m])
                        .unwrap();
                    let abs = x_c
                        .abs()
                        .unwrap()
                        .cast(DType::F32)
                        .unwrap()
                        .sum(&[-1], false)
                        .unwrap()
                        .to_vec_f64()
                        .unwrap();
                    let cases = [
                        (
                            "sum",
                            x_c.sum(&[-1], false).unwrap(),
                            x_g.sum(&[-1], false).unwrap(),
                        ),
                        (
                            "max",
                            x_c.max(&[-1], false).unwrap(),
                            x_g.max(&[-1], false).unwrap(),
                        ),
                        (
                            "argmax",
                            x_c.argmax(-1, false).unwrap(),
                            x_g.argmax(-1, false).unwrap(),
                        ),
                    ];
                    for (op, want, got) in cases {
                        let (w, g) = (want.to_vec_f64().unwrap(), got.to_vec_f64().unwrap());
                        let bad = w.iter().zip(&g).enumerate().position(|(r, (w, g))| {
                            let tol = match (op, dt) {
                                ("sum", DType::F32) => 1e-5 * abs[r].max(1.0),
                                // bf16 sums are rounded once, at the end, from f32 partials.
                                ("sum", DType::BF16) => 1e-2 * abs[r].max(1.0),
                                _ => 0.0,
                            };
                            (w - g).abs() > tol
                        });
                        if let Some(r) = bad {
                            failures.push(format!(
                                "{op} {dt:?} [{rows}, {m}] offset {off} subgroups {subgroups}: row {r}: wgpu {} cpu {}",
                                g[r], w[r]
                            ));
                        }
                    }
                }
            }
        }
    }
    d.use_subgroups(true);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The fused cross-entropy and its backward against the CPU, every float dtype: (loss, lse, w[t]) in
/// f32 (the accumulator of every wgpu float), dlogits in the logits' dtype; with class weights,
/// label smoothing and an ignored row.
fn cross_entropy_matches_cpu(d: &WgpuDevice) {
    let dtypes = [(DType::F32, 1e-5), (DType::F16, 4e-3), (DType::BF16, 3e-2)];
    let shapes = [(7, 1), (33, 65), (5, 4099)];
    let n = ferrite_testing::ce_cases::cross_entropy_matches(
        &d.device(),
        &ferrite_cpu::cpu(),
        &dtypes,
        &shapes,
    );
    println!("  {n} cross-entropy cases match the CPU");
}
