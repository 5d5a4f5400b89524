//! CUDA op benchmarks (a machine with an NVIDIA GPU): each figure next to its reference
//! from the same run. `cargo bench -p ferrite-cuda --bench cuda_ops`; prints a table.
//!
//! Timing: device events around `reps` launches after a warm-up, median of 5 such samples.
//! Bandwidth counts bytes read + written once each.

use ferrite_core::{DType, Tensor};
use ferrite_cuda::CudaDevice;
use std::time::Instant;

mod common;
use common::time;

fn main() {
    if !ferrite_cuda::is_available() {
        println!("cuda_ops: skipped: no CUDA device");
        return;
    }
    let d = CudaDevice::new(0).unwrap();
    let dev = d.device();
    println!(
        "device: {} (sm_{}{}, {} SMs)",
        d.name(),
        d.compute_capability().0,
        d.compute_capability().1,
        d.backend().sm_count
    );
    let mut rows: Vec<(String, String, String)> = Vec::new();
    let gbs = |bytes: f64, ms: f64| bytes / ms / 1e6;

    // Copy bandwidth (device to device, read + write): the reference for elementwise ops.
    let n = 64usize << 20;
    let a = Tensor::rand_uniform([n], -1.0, 1.0, 1, DType::F32, &dev).unwrap();
    let b = Tensor::rand_uniform([n], -1.0, 1.0, 2, DType::F32, &dev).unwrap();
    // A narrowed view is contiguous but smaller than its storage: `contiguous` copies it with
    // one cuMemcpyDtoDAsync.
    let an = a.narrow(0, 0, n - 1).unwrap();
    let copy_ms = time(&d, 20, || an.contiguous().map(|_| ()));
    let copy = gbs(2.0 * 4.0 * n as f64, copy_ms);
    rows.push((
        "copy 64M f32 (cuMemcpyDtoD)".into(),
        format!("{copy:.0} GB/s"),
        "reference".into(),
    ));
    let add_ms = time(&d, 20, || a.add(&b).map(|_| ()));
    let add = gbs(3.0 * 4.0 * n as f64, add_ms);
    rows.push((
        "add 64M f32".into(),
        format!("{add:.0} GB/s"),
        format!("{:.0}% of copy", 100.0 * add / copy),
    ));
    let sum_ms = time(&d, 20, || a.sum_all().map(|_| ()));
    let sum = gbs(4.0 * n as f64, sum_ms);
    rows.push((
        "sum 64M f32".into(),
        format!("{sum:.0} GB/s"),
        format!("{:.0}% of 3100 GB/s read", 100.0 * sum / 3100.0),
    ));
    let x = Tensor::rand_uniform([8192, 4096], -3.0, 3.0, 3, DType::F32, &dev).unwrap();
    let w = Tensor::rand_uniform([4096], 0.5, 1.5, 4, DType::F32, &dev).unwrap();
    let sm_ms = time(&d, 20, || x.softmax(-1).map(|_| ()));
    let sm = gbs(2.0 * 4.0 * 8192.0 * 4096.0, sm_ms);
    rows.push((
        "softmax 8192x4096 f32".into(),
        format!("{sm:.0} GB/s"),
        format!("{:.0}% of 3100 GB/s", 100.0 * sm / 3100.0),
    ));
    let rms_ms = time(&d, 20, || x.rms_norm(&w, 1e-5).map(|_| ()));
    let rms = gbs(2.0 * 4.0 * 8192.0 * 4096.0, rms_ms);
    rows.push((
        "rms_norm 8192x4096 f32".into(),
        format!("{rms:.0} GB/s"),
        format!("{:.0}% of 3100 GB/s", 100.0 * rms / 3100.0),
    ));
    drop((a, b, x));

    // bf16 matmul 8192^3 through the wrapper.
    let m = 8192usize;
    let p = Tensor::rand_uniform([m, m], -1.0, 1.0, 5, DType::BF16, &dev).unwrap();
    let q = Tensor::rand_uniform([m, m], -1.0, 1.0, 6, DType::BF16, &dev).unwrap();
    let mm_ms = time(&d, 5, || p.matmul(&q).map(|_| ()));
    let tflops = 2.0 * (m as f64).powi(3) / mm_ms / 1e9;
    rows.push((
        "matmul bf16 8192^3".into(),
        format!("{tflops:.0} TFLOP/s"),
        "see torch_ops.py".into(),
    ));
    drop((p, q));

    // Attention bf16 with a key-padding mask (the last quarter of every other sequence is
    // padding) beside the same call unmasked, forward (tensor cores) and backward (tiled), and
    // the masked composition that materializes the [b, h, l, l] scores.
    let (ab, ah, al, ad) = (4usize, 16usize, 1024usize, 128usize);
    let r = |seed: u64| {
        Tensor::rand_uniform([ab, ah, al, ad], -1.0, 1.0, seed, DType::BF16, &dev).unwrap()
    };
    let (aq, ak, av, ag) = (r(7), r(8), r(9), r(10));
    let pad: Vec<bool> = (0..ab * al)
        .map(|i| (i / al) % 2 == 1 && i % al >= 3 * al / 4)
        .collect();
    let mask = Tensor::from_vec(pad, [ab, al], &dev).unwrap();
    let flops = 4.0 * (ab * ah * al * al * ad) as f64;
    let scale = 1.0 / (ad as f64).sqrt();
    let fwd = |m: Option<&Tensor>| {
        time(&d, 10, || {
            Tensor::attention_masked(&aq, &ak, &av, m, false, None).map(|_| ())
        })
    };
    let (plain_ms, masked_ms) = (fwd(None), fwd(Some(&mask)));
    rows.push((
        format!("attention fwd bf16 b{ab} h{ah} l{al} d{ad}, key mask"),
        format!("{:.0} TFLOP/s", flops / masked_ms / 1e9),
        format!("unmasked {:.0} TFLOP/s", flops / plain_ms / 1e9),
    ));
    let bwd = |m: Option<&Tensor>| {
        time(&d, 5, || {
            Tensor::attention_backward(&aq, &ak, &av, m, &ag, false, scale).map(|_| ())
        })
    };
    let (plain_ms, masked_ms) = (bwd(None), bwd(Some(&mask)));
    rows.push((
        format!("attention bwd bf16 b{ab} h{ah} l{al} d{ad}, key mask"),
        format!("{masked_ms:.2} ms"),
        format!("unmasked {plain_ms:.2} ms"),
    ));
    let comp_ms = time(&d, 5, || {
        ferrite_core::composed::attention_masked(&aq, &ak, &av, Some(&mask), false, None)
            .map(|_| ())
    });
    rows.push((
        format!("masked attention composition bf16 b{ab} h{ah} l{al} d{ad} (fwd)"),
        format!("{comp_ms:.2} ms"),
        format!("fused {:.2} ms", fwd(Some(&mask))),
    ));
    drop((aq, ak, av, ag, mask));

    // Host cost per op: 1,000 small adds enqueued; then the same 1,000 ops as one graph.
    let s = Tensor::ones([256], DType::F32, &dev).unwrap();
    let one = Tensor::ones([256], DType::F32, &dev).unwrap();
    let mut best = f64::MAX;
    for _ in 0..5 {
        d.synchronize().unwrap();
        let t = Instant::now();
        let mut y = s.clone();
        for _ in 0..1000 {
            y = y.add(&one).unwrap();
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e6 / 1000.0);
        let v = y.to_vec::<f32>().unwrap();
        assert_eq!(v[0], 1001.0);
    }
    rows.push((
        "host cost per op (1,000 adds of 256)".into(),
        format!("{best:.2} us"),
        "target <= 5 us".into(),
    ));
    let s2 = s.clone();
    let g = d
        .capture(move || {
            let mut y = s2.clone();
            for _ in 0..1000 {
                y = y.add(&one)?;
            }
            Ok(vec![y])
        })
        .unwrap();
    let replay_ms = time(&d, 10, || g.replay());
    assert_eq!(g.outputs()[0].to_vec::<f32>().unwrap()[0], 1001.0);
    rows.push((
        "graph replay, 1,000 adds".into(),
        format!("{replay_ms:.3} ms"),
        "target <= 1.5 ms".into(),
    ));

    println!("\n| benchmark | ferrite | reference / ratio |\n|---|---|---|");
    for (a, b, c) in rows {
        println!("| {a} | {b} | {c} |");
    }
}
