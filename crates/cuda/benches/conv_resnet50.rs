//! conv2d forward and backward (input and weight gradients) over ResNet-50's 23 distinct
//! convolution shapes at batch 64, bf16, on CUDA, through both paths: cuDNN (algorithms found
//! once per shape, in the warm-up) and im2col/col2im kernels + cuBLASLt. Timed with CUDA
//! events around 10 repetitions after a warm-up, median of 5 (ms per call).
//! `scripts/gpu/torch_conv.py` prints the same table for PyTorch (cuDNN, benchmark mode).
//! Without cuDNN only the im2col columns are filled (`-` for cuDNN).
//!
//! Run: `cargo bench -p ferrite-cuda --bench conv_resnet50` (optional argument: batch size).

use ferrite_core::{Conv2dParams, DType, Result, Tensor};
use ferrite_cuda::{ConvImpl, CudaDevice};
use ferrite_testing::bench_shapes::RESNET50_CONVS;

fn main() -> Result<()> {
    if !ferrite_cuda::is_available() {
        println!("conv_resnet50: skipped: no CUDA device");
        return Ok(());
    }
    let batch: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(64);
    let d = CudaDevice::new(0)?;
    let dev = d.device();
    // (ms per call between device events, host ms per call to enqueue), medians of 5.
    // Where the host figure reaches the device one, the GPU waits for the host.
    let time = |f: &dyn Fn() -> Result<()>| -> Result<(f64, f64)> {
        f()?;
        let (mut s, mut h) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            let mut host = 0.0;
            let ms = d.time_ms(|| {
                let t0 = std::time::Instant::now();
                for _ in 0..10 {
                    f()?;
                }
                host = t0.elapsed().as_secs_f64() * 1e3;
                Ok(())
            })?;
            s.push(ms as f64 / 10.0);
            h.push(host / 10.0);
        }
        s.sort_by(f64::total_cmp);
        h.sort_by(f64::total_cmp);
        Ok((s[2], h[2]))
    };
    let cudnn = ferrite_cuda::cudnn_version();
    match &cudnn {
        Ok(v) => println!("cuDNN {v}"),
        Err(e) => println!("cuDNN not used: {e}"),
    }
    let paths: Vec<ConvImpl> = match cudnn {
        Ok(_) => vec![ConvImpl::Cudnn, ConvImpl::Im2col],
        Err(_) => vec![ConvImpl::Im2col],
    };
    println!("ferrite conv2d bf16, batch {batch}, median of 5 (ms)");
    println!(
        "| layer | cuDNN fwd | cuDNN bwd (input + weight) | cuDNN fwd + bwd | cuDNN host fwd / bwd \
         | im2col fwd | im2col bwd | im2col fwd + bwd | im2col host fwd / bwd |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut totals = [[0.0f64; 2]; 2];
    let mut best = [0.0f64; 2];
    for (i, s) in RESNET50_CONVS.iter().enumerate() {
        let p = Conv2dParams {
            stride: [s.stride; 2],
            padding: [s.pad; 2],
            dilation: [1, 1],
            groups: 1,
        };
        let seed = 3 * i as u64;
        let bf = DType::BF16;
        let x = Tensor::rand_normal([batch, s.cin, s.hw, s.hw], 0.0, 1.0, seed, bf, &dev)?;
        let w = Tensor::rand_normal([s.cout, s.cin, s.k, s.k], 0.0, 0.05, seed + 1, bf, &dev)?;
        let y = x.conv2d_raw(&w, &p)?;
        let g = Tensor::rand_normal(y.dims(), 0.0, 1.0, seed + 2, bf, &dev)?;
        let mut row = format!("| {} |", s.name);
        if paths.len() == 1 {
            row.push_str(" - | - | - | - |");
        }
        let mut layer_best = [f64::INFINITY; 2];
        for &path in &paths {
            d.set_conv_impl(path);
            let (f, fh) = time(&|| x.conv2d_raw(&w, &p).map(drop))?;
            let (b, bh) = time(&|| {
                Tensor::conv2d_backward_input(&g, &w, &p, x.dims())?;
                Tensor::conv2d_backward_weight(&x, &g, &p, w.dims()).map(drop)
            })?;
            let t = &mut totals[(path == ConvImpl::Im2col) as usize];
            t[0] += f;
            t[1] += b;
            layer_best = [layer_best[0].min(f), layer_best[1].min(b)];
            row.push_str(&format!(
                " {f:.3} | {b:.3} | {:.3} | {fh:.3} / {bh:.3} |",
                f + b
            ));
        }
        best[0] += layer_best[0];
        best[1] += layer_best[1];
        println!("{row}");
    }
    let total = |t: [f64; 2]| format!("{:.2} | {:.2} | {:.2} |", t[0], t[1], t[0] + t[1]);
    let cudnn_total = match paths.len() {
        2 => total(totals[0]),
        _ => "- | - | - |".into(),
    };
    println!("| total | {cudnn_total} | {} |", total(totals[1]));
    // The faster path per layer and direction, as `ConvImpl::Auto` picks it.
    println!(
        "| best per layer and direction | {:.2} | {:.2} | {:.2} | |",
        best[0],
        best[1],
        best[0] + best[1]
    );
    let stats = d.conv_stats();
    println!("calls: {} cuDNN, {} im2col", stats.cudnn, stats.im2col);
    Ok(())
}
