//! GPU decode tests. A plain binary (harness = false): where there is no CUDA device (or no
//! NVRTC, or no model file) each test is reported skipped by name; on a machine with an
//! NVIDIA GPU each runs and the binary exits non-zero on any failure.
//!
//! Kernels are checked one at a time against CPU references (dequantize + f64 dot, norms,
//! RoPE and softmax attention in f64 over the same f16-rounded KV values); whole models
//! against the CPU model in its exact mode (f32 activations, which the GPU path also uses).
//!
//! Usage: `cargo test -p ferrite-llm --test gpu [-- FILTER] [--skip SUBSTRING]`.

mod sampler_support;

use std::collections::HashMap;
use std::path::PathBuf;

use ferrite_testing::runner::Runner;

use ferrite_cuda::llm::ops::{self, AttnShape, Mode, Seg};
use ferrite_cuda::llm::paged::{PagedAttnArgs, PagedLaunch, KV_BS, PAD_ROW};
use ferrite_gguf::{quant, GgmlType};
use ferrite_llm::engine::{Engine, EngineConfig, EngineKernels, Request, RequestId};
use ferrite_llm::gpu::{read_f32, upload_bytes, upload_f32, zeros, Buffer, CudaDevice};
use ferrite_llm::gpu::{GpuMatrix, GpuModel, Layout};
use ferrite_llm::kv_cache::BLOCK_SIZE;
use ferrite_llm::model::cuda::TENSOR_CORE_ROWS_F32;
use ferrite_llm::model::CudaKernels;
use ferrite_llm::sampler::{Sampler, SamplerConfig};
use ferrite_llm::synth::{write_synthetic, SynthConfig, VocabStyle, QUANTS};
use ferrite_llm::tokenizer::Tokenizer;
use ferrite_llm::{Logits, Model, Precision, Session};
use sampler_support::{check_draws, Rng};

/// A test returns None when it ran, or the reason it was skipped.
type TestFn = fn(&CudaDevice) -> Option<String>;

fn gpu_tests() -> Vec<(&'static str, TestFn)> {
    vec![
        ("matvec_every_format_matches_cpu", matvec_every_format),
        (
            "matvec_q8_every_format_matches_cpu_q8",
            matvec_q8_every_format,
        ),
        ("matvec_segments_bias_add_and_norm", matvec_segments),
        ("matvec_glu_silu_and_gelu", matvec_glu),
        ("matvec_argmax_lowest_index_on_ties", matvec_argmax),
        ("embed_every_format_matches_cpu", embed_every_format),
        (
            "prefill_dequant_every_format_matches_cpu",
            dequant_every_format,
        ),
        ("rms_norm_and_norm_add_match_cpu", rms_norms),
        ("paged_attention_stores_rotated_k_and_v", rope_kv),
        ("paged_attention_matches_cpu_gqa_splits_window", attention),
        ("session_errors_token_and_context", session_errors),
        ("model_that_does_not_fit_is_refused", does_not_fit),
        ("synthetic_models_every_quant_match_cpu", synthetic_models),
        ("synthetic_models_q8_match_cpu_q8", synthetic_models_q8),
        ("graph_replay_equals_eager_launches", graph_equals_eager),
        ("smollm2_logits_match_cpu_and_transformers", smollm2_logits),
        ("smollm2_greedy_32_tokens_match_cpu", smollm2_greedy),
        ("smollm2_q8_greedy_and_logits_match_cpu_q8", smollm2_q8),
        ("gemma3_logits_and_greedy_match_cpu", gemma3),
        (
            "default_precision_keeps_chat_answers_smollm2",
            default_precision_chat_smollm2,
        ),
        (
            "default_precision_keeps_chat_answers_gemma3",
            default_precision_chat_gemma3,
        ),
        ("prefill_synthetic_models_match_cpu", prefill_synthetic),
        ("prefill_chunk_boundaries_match_cpu", prefill_chunks),
        ("prefill_graph_buckets_replay_and_match_cpu", prefill_graphs),
        (
            "prefill_then_decode_equals_decode_only",
            prefill_then_decode,
        ),
        (
            "prefill_perplexity_synthetic_within_1pct",
            prefill_ppl_synthetic,
        ),
        ("prefill_smollm2_logits_greedy_perplexity", prefill_smollm2),
        (
            "sampler_distribution_matches_cpu_probabilities",
            sampler_distribution,
        ),
        ("sampler_same_seed_same_tokens", sampler_seed),
        (
            "sampled_generation_in_graph_reads_back_only_ids",
            sampled_generation,
        ),
        (
            "chained_decode_equals_one_token_at_a_time",
            chained_generation,
        ),
        (
            "engine_cuda_synthetic_every_format_batch_equals_alone_and_cpu",
            engine_synthetic,
        ),
        (
            "engine_cuda_synthetic_q8_batch_equals_alone_and_cpu_q8",
            engine_synthetic_q8,
        ),
        (
            "engine_cuda_smollm2_batch_equals_alone_and_cpu",
            engine_smollm2,
        ),
        (
            "engine_cuda_gemma3_batch_equals_alone_and_cpu",
            engine_gemma3,
        ),
        ("engine_cuda_graph_buckets_equal_eager", engine_graphs),
        (
            "matvec_rows_equal_one_row_launches",
            matvec_rows_equal_one_row_launches,
        ),
        ("engine_cuda_cancel_frees_blocks", engine_cancel),
        (
            "engine_cuda_samples_on_the_device_per_request",
            engine_device_sampling,
        ),
        (
            "engine_cuda_tensor_core_steps_match_cpu",
            engine_tensor_core,
        ),
        (
            "matvec_rows_int8_mma_match_register_kernels",
            matvec_rows_mma_match_register_kernels,
        ),
        (
            "matvec_rows_q8x2_mma_match_cpu_q8x2_and_exact",
            matvec_rows_q8x2_mma,
        ),
        (
            "matvec_rows_q8x2_split_sums_quantize_the_next_input",
            q8x2_split_sums_quantize_next,
        ),
        (
            "matvec_rows_q8x2_quantize_f16_rows_as_their_f32_values",
            q8x2_half_input,
        ),
        (
            "matvec_rows_q8x2_glu_quantizes_the_next_input",
            q8x2_glu_quantizes_next,
        ),
        (
            "matvec_rows_q8x2_normed_quantization_matches_its_reference",
            q8x2_normed_rows,
        ),
    ]
}

fn main() {
    let mut r = Runner::from_args();
    let dev = if ferrite_llm::gpu::is_available() {
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
            Some(d) => r.run(name, || f(d)),
            None => r.skip(name, "no CUDA device"),
        }
    }
    if let Some(d) = &dev {
        println!(
            "device: {} (sm_{}{})",
            d.name(),
            d.compute_capability().0,
            d.compute_capability().1
        );
    }
    r.finish("llm gpu tests");
}

// ---- helpers ----

/// A random `rows x cols` matrix of `ty` on the device, and its dequantized values (the CPU
/// reference's weights).
fn rand_matrix(
    dev: &CudaDevice,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    seed: u64,
) -> (GpuMatrix, Vec<f32>) {
    rand_matrix_with(dev, ty, rows, cols, seed, false)
}

/// `rand_matrix`, in the split layout if `split`.
fn rand_matrix_with(
    dev: &CudaDevice,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    seed: u64,
    split: bool,
) -> (GpuMatrix, Vec<f32>) {
    let w = Rng(seed).vec(rows * cols);
    let bytes = quant::quantize_to_vec(ty, &w).unwrap();
    let deq = quant::dequantize_to_vec(ty, &bytes).unwrap();
    let m = GpuMatrix::upload_with(dev, "test", ty, rows, cols, &bytes, split).unwrap();
    assert_eq!(m.split, split);
    (m, deq)
}

/// The layouts a `ty` matrix of `cols` columns can take on the device: GGUF, and split rows
/// where the format has them.
fn layouts(ty: GgmlType, cols: usize) -> Vec<bool> {
    if GpuMatrix::splittable(ty, cols) {
        vec![false, true]
    } else {
        vec![false]
    }
}

/// `x` as the fast mode sees it: quantized to 8-bit units by the CPU's `quantize_q8`, then
/// scaled back.
fn q8_values(x: &[f32]) -> Vec<f32> {
    use ferrite_cpu::quant::q8::{quantize_q8, BlockQ8};
    let mut qb = vec![BlockQ8::default(); x.len() / 32];
    quantize_q8(x, &mut qb);
    qb.iter()
        .flat_map(|b| b.qs.iter().map(move |&q| b.d * q as f32))
        .collect()
}

/// `x` as the two-level mode sees it: the CPU's `quantize_q8x2` (8 bits, then the residual in
/// steps of 1/256 of the first), scaled back: `d * (hi + lo / 256)`.
fn q8x2_values(x: &[f32]) -> Vec<f32> {
    use ferrite_cpu::quant::q8::{quantize_q8x2, BlockQ8};
    let mut hi = vec![BlockQ8::default(); x.len() / 32];
    let mut lo = hi.clone();
    quantize_q8x2(x, &mut hi, &mut lo);
    hi.iter()
        .zip(&lo)
        .flat_map(|(h, l)| {
            h.qs.iter()
                .zip(&l.qs)
                .map(move |(&a, &b)| (h.d as f64 * (a as f64 + b as f64 / 256.0)) as f32)
        })
        .collect()
}

/// Whether the GPU stores `ty` converted to f16 (no kernel of its own).
fn converted(ty: GgmlType) -> bool {
    ferrite_llm::gpu::Fmt::of(ty).is_none()
}

/// (W[r] . x in f64, sum |W[r][i] x[i]|) for every row.
fn ref_matvec(w: &[f32], x: &[f32], rows: usize, cols: usize) -> Vec<(f64, f64)> {
    (0..rows)
        .map(|r| {
            let row = &w[r * cols..(r + 1) * cols];
            let mut s = 0f64;
            let mut a = 0f64;
            for (&wv, &xv) in row.iter().zip(x) {
                s += wv as f64 * xv as f64;
                a += (wv as f64 * xv as f64).abs();
            }
            (s, a)
        })
        .collect()
}

/// Relative bound of the f32 sums (chains of up to a few hundred products, then a tree),
/// plus f16 rounding of weights for formats the GPU converts.
fn tol(abs_sum: f64, ty: GgmlType) -> f64 {
    let rel = if converted(ty) { 1.2e-3 } else { 2e-5 };
    rel * abs_sum + 1e-5
}

fn rms_norm_ref(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    ferrite_llm::model::rms_norm_rows(x, &mut y, w, x.len(), eps);
    y
}

fn up(dev: &CudaDevice, v: &[f32]) -> Buffer {
    upload_f32(dev, v, "test").unwrap()
}

fn read(dev: &CudaDevice, b: &Buffer, n: usize) -> Vec<f32> {
    read_f32(dev, b, n).unwrap()
}

/// `FERRITE_CACHE`-or-home cache path of a reference model, if the file is there (no fetch:
/// the GPU machine has no network).
fn cached_model(file: &str, size: u64) -> Option<PathBuf> {
    let p = ferrite_gguf::fetch::cache_dir().ok()?.join(file);
    std::fs::metadata(&p)
        .ok()
        .filter(|m| m.len() == size)
        .map(|_| p)
}

fn smollm2_path() -> Option<PathBuf> {
    cached_model("SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432)
        .and_then(|_| ferrite_gguf::fetch::smollm2_135m_instruct_q4_1().ok())
}

fn gemma3_path() -> Option<PathBuf> {
    cached_model("gemma-3-270m-q4_k_m.gguf", 253_113_024)
        .and_then(|_| ferrite_gguf::fetch::gemma3_270m_q4_k_m().ok())
}

/// (max |a - b|, rms(a - b), std(b)).
fn diff_stats(a: &[f32], b: &[f32]) -> (f32, f32, f32) {
    assert_eq!(a.len(), b.len());
    let mut max = 0f32;
    let mut ss = 0f64;
    for (x, y) in a.iter().zip(b) {
        max = max.max((x - y).abs());
        ss += ((x - y) as f64).powi(2);
    }
    let n = b.len() as f64;
    let mean = b.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = b.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    (max, (ss / n).sqrt() as f32, var.sqrt() as f32)
}

fn argmax(v: &[f32]) -> u32 {
    ferrite_llm::generate::argmax(v)
}

/// Gap between the largest and second largest value.
fn top2_margin(v: &[f32]) -> f32 {
    let mut a = f32::NEG_INFINITY;
    let mut b = f32::NEG_INFINITY;
    for &x in v {
        if x > a {
            b = a;
            a = x;
        } else if x > b {
            b = x;
        }
    }
    a - b
}

// ---- kernels ----

const MATVEC_TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Every format against dequantize + f64 dot: odd row counts, rows of 1-56 K-blocks (the
/// longest take several staged chunks and more than 48 KiB of shared memory for the input),
/// and more row tiles than resident blocks (blocks take several tiles).
fn matvec_every_format(dev: &CudaDevice) -> Option<String> {
    for (i, ty) in MATVEC_TYPES.into_iter().enumerate() {
        for (rows, cols) in [
            (33usize, 768usize),
            (1, 256),
            (97, 2304),
            (7, 14336),
            (12001, 512),
            (33, 2048),
        ] {
            for split in layouts(ty, cols) {
                let seed = (i * 1000 + rows) as u64;
                let (m, w) = rand_matrix_with(dev, ty, rows, cols, seed, split);
                let x = Rng(seed + 7).vec(cols);
                let xb = up(dev, &x);
                let out = up(dev, &vec![f32::NAN; rows]);
                ops::matvec(
                    dev,
                    &[Seg {
                        w: &m,
                        bias: None,
                        out_off: 0,
                    }],
                    Mode::Store,
                    &xb,
                    None,
                    &out,
                )
                .unwrap();
                let got = read(dev, &out, rows);
                for (r, (want, abs)) in ref_matvec(&w, &x, rows, cols).into_iter().enumerate() {
                    let d = (got[r] as f64 - want).abs();
                    assert!(
                    d <= tol(abs, ty),
                    "{ty} {rows}x{cols} split {split} row {r}: gpu {} cpu {want} (|diff| {d}, sum |wx| {abs})",
                    got[r]
                );
                }
            }
        }
    }
    None
}

/// The formats with an 8-bit activation kernel (the CPU's Q8 mode takes 8-bit activations for
/// the same ones).
const Q8_TYPES: [GgmlType; 7] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// The fast mode's product against dequantized weights x the input quantized as the CPU's
/// `quantize_q8` (the GPU quantizes to the same bytes; integer sums are exact, so only the f32
/// scaling and summation differ): the same sizes as `matvec_every_format`. Formats without an
/// integer kernel are refused by `ops::matvec_q8`.
fn matvec_q8_every_format(dev: &CudaDevice) -> Option<String> {
    for (i, ty) in Q8_TYPES.into_iter().enumerate() {
        for (rows, cols) in [
            (33usize, 768usize),
            (1, 256),
            (97, 2304),
            (7, 14336),
            (12001, 512),
            (33, 2048),
        ] {
            for split in layouts(ty, cols) {
                let seed = (i * 1000 + rows) as u64 + 77;
                let (m, w) = rand_matrix_with(dev, ty, rows, cols, seed, split);
                // spread magnitudes across units, with a rounding tie (0.5 of a step) in unit 0
                let mut x: Vec<f32> = Rng(seed + 7)
                    .vec(cols)
                    .iter()
                    .enumerate()
                    .map(|(k, v)| v * (1.0 + (k / 32 % 5) as f32))
                    .collect();
                x[0] = 127.0;
                x[1] = 0.5;
                let xq = q8_values(&x);
                let xb = up(dev, &x);
                let out = up(dev, &vec![f32::NAN; rows]);
                let seg = [Seg {
                    w: &m,
                    bias: None,
                    out_off: 0,
                }];
                ops::matvec_q8(dev, &seg, Mode::Store, &xb, None, &out).unwrap();
                let got = read(dev, &out, rows);
                for (r, (want, abs)) in ref_matvec(&w, &xq, rows, cols).into_iter().enumerate() {
                    let d = (got[r] as f64 - want).abs();
                    assert!(
                    d <= 1e-5 * abs + 1e-5,
                    "q8 {ty} {rows}x{cols} split {split} row {r}: gpu {} cpu {want} (|diff| {d}, sum |wx| {abs})",
                    got[r]
                );
                }
            }
        }
    }
    for ty in [GgmlType::F16, GgmlType::Q5_K] {
        let (m, _) = rand_matrix(dev, ty, 4, 256, 1);
        let xb = up(dev, &vec![0.5; 256]);
        let out = up(dev, &[0.0; 4]);
        let seg = [Seg {
            w: &m,
            bias: None,
            out_off: 0,
        }];
        assert!(ops::matvec_q8(dev, &seg, Mode::Store, &xb, None, &out).is_err());
    }
    None
}

/// Three matrices of different formats sharing the (RMS-normed) input, with biases, into one
/// output at offsets (the fused QKV product); and the residual-add mode.
fn matvec_segments(dev: &CudaDevice) -> Option<String> {
    let mixed = [
        (GgmlType::Q4_0, 33),
        (GgmlType::Q6_K, 17),
        (GgmlType::Q8_0, 5),
    ];
    let split = [
        (GgmlType::Q4_0, 33),
        (GgmlType::Q4_0, 17),
        (GgmlType::Q4_0, 5),
    ];
    // Q4_K_M's Q/K/V: formats differ between the matrices of one launch
    let split_mixed = [
        (GgmlType::Q4_K, 33),
        (GgmlType::Q6_K, 17),
        (GgmlType::Q8_0, 5),
    ];
    for (specs, split, cols) in [
        (mixed, false, 768),
        (split, true, 768),
        (split_mixed, true, 2048),
    ] {
        for q8 in [false, true] {
            matvec_segments_case(dev, &specs, cols, split, q8);
        }
    }
    // Split rows and GGUF rows do not share a launch.
    let (a, _) = rand_matrix_with(dev, GgmlType::Q4_0, 8, 768, 1, true);
    let (b, _) = rand_matrix(dev, GgmlType::Q4_0, 8, 768, 2);
    let xb = up(dev, &vec![0.5; 768]);
    let out = up(dev, &[0.0; 16]);
    let segs = [
        Seg {
            w: &a,
            bias: None,
            out_off: 0,
        },
        Seg {
            w: &b,
            bias: None,
            out_off: 8,
        },
    ];
    let e = ops::matvec(dev, &segs, Mode::Store, &xb, None, &out).unwrap_err();
    assert!(e.to_string().contains("split rows"), "{e}");
    // Gate and up on split rows share a format.
    let (c, _) = rand_matrix_with(dev, GgmlType::Q8_0, 8, 768, 3, true);
    let glu = [
        Seg {
            w: &a,
            bias: None,
            out_off: 0,
        },
        Seg {
            w: &c,
            bias: None,
            out_off: 0,
        },
    ];
    let e = ops::matvec(dev, &glu, Mode::GluSilu, &xb, None, &out).unwrap_err();
    assert!(e.to_string().contains("share a format"), "{e}");

    // Residual add, no norm, each layout.
    for split in [false, true] {
        let (m, w) = rand_matrix_with(dev, GgmlType::Q4_1, 45, 1536, 400, split);
        let x2 = Rng(401).vec(1536);
        let res = Rng(402).vec(45);
        let (x2b, outb) = (up(dev, &x2), up(dev, &res));
        let seg = [Seg {
            w: &m,
            bias: None,
            out_off: 0,
        }];
        ops::matvec(dev, &seg, Mode::Add, &x2b, None, &outb).unwrap();
        let got = read(dev, &outb, 45);
        for (r, (want, abs)) in ref_matvec(&w, &x2, 45, 1536).into_iter().enumerate() {
            let want = want + res[r] as f64;
            assert!(
                (got[r] as f64 - want).abs() <= tol(abs, GgmlType::Q4_1) + 1e-6,
                "add split {split} row {r}: gpu {} cpu {want}",
                got[r]
            );
        }
    }
    None
}

/// Three matrices of one launch (`specs`: format and rows of each), with biases and the input
/// RMS-normed first; `q8`: the fast mode (checked against the input quantized as the CPU does).
fn matvec_segments_case(
    dev: &CudaDevice,
    specs: &[(GgmlType, usize); 3],
    cols: usize,
    split: bool,
    q8: bool,
) {
    let mats: Vec<(GpuMatrix, Vec<f32>)> = specs
        .iter()
        .enumerate()
        .map(|(i, &(ty, rows))| rand_matrix_with(dev, ty, rows, cols, 100 + i as u64, split))
        .collect();
    let biases: Vec<Vec<f32>> = specs
        .iter()
        .enumerate()
        .map(|(i, &(_, rows))| Rng(200 + i as u64).vec(rows))
        .collect();
    let bias_bufs: Vec<Buffer> = biases.iter().map(|b| up(dev, b)).collect();
    let x: Vec<f32> = Rng(300).vec(cols).iter().map(|v| v * 3.0).collect();
    let g: Vec<f32> = Rng(301).vec(cols).iter().map(|v| 1.0 + 0.5 * v).collect();
    let eps = 1e-5;
    let (xb, gb) = (up(dev, &x), up(dev, &g));
    let total: usize = specs.iter().map(|s| s.1).sum();
    let out = up(dev, &vec![f32::NAN; total]);
    let mut offs = Vec::new();
    let mut off = 0;
    for s in specs {
        offs.push(off);
        off += s.1;
    }
    let segs: Vec<Seg<'_>> = (0..3)
        .map(|i| Seg {
            w: &mats[i].0,
            bias: Some(&bias_bufs[i]),
            out_off: offs[i],
        })
        .collect();
    let mut xn = rms_norm_ref(&x, &g, eps);
    if q8 {
        ops::matvec_q8(dev, &segs, Mode::Store, &xb, Some((&gb, eps)), &out).unwrap();
        xn = q8_values(&xn);
    } else {
        ops::matvec(dev, &segs, Mode::Store, &xb, Some((&gb, eps)), &out).unwrap();
    }
    let got = read(dev, &out, total);
    for i in 0..3 {
        let (ty, rows) = specs[i];
        for (r, (want, abs)) in ref_matvec(&mats[i].1, &xn, rows, cols)
            .into_iter()
            .enumerate()
        {
            let want = want + biases[i][r] as f64;
            let v = got[offs[i] + r] as f64;
            // q8: the GPU's norm may round differently from the CPU's before quantizing
            let t = if q8 { 1e-3 * abs + 1e-4 } else { tol(abs, ty) };
            assert!(
                (v - want).abs() <= t + 1e-5 * want.abs(),
                "segment {i} ({ty}, split {split}, q8 {q8}) row {r}: gpu {v} cpu {want}"
            );
        }
    }
}

/// gate and up of different formats: out = act(gate . norm(x)) * (up . norm(x)).
fn matvec_glu(dev: &CudaDevice) -> Option<String> {
    for (cols, gty, uty, rows, split) in [
        (768, GgmlType::Q4_K, GgmlType::Q5_0, 45, false),
        (576, GgmlType::Q4_1, GgmlType::Q4_1, 3001, false),
        (4096, GgmlType::Q6_K, GgmlType::F16, 45, false),
        (768, GgmlType::Q4_0, GgmlType::Q4_0, 45, true),
        (1024, GgmlType::Q4_K, GgmlType::Q4_K, 77, true),
        (4096, GgmlType::Q6_K, GgmlType::Q6_K, 45, true),
        (1024, GgmlType::Q5_1, GgmlType::Q5_1, 3001, true),
    ] {
        let (gm, gw) = rand_matrix_with(dev, gty, rows, cols, 500 + cols as u64, split);
        let (um, uw) = rand_matrix_with(dev, uty, rows, cols, 600 + cols as u64, split);
        let x = Rng(700).vec(cols);
        let nw: Vec<f32> = Rng(701).vec(cols).iter().map(|v| 1.0 + 0.3 * v).collect();
        let eps = 1e-6;
        let (xb, nb) = (up(dev, &x), up(dev, &nw));
        let xn = rms_norm_ref(&x, &nw, eps);
        let rg = ref_matvec(&gw, &xn, rows, cols);
        let ru = ref_matvec(&uw, &xn, rows, cols);
        for mode in [Mode::GluSilu, Mode::GluGelu] {
            let out = up(dev, &vec![f32::NAN; rows]);
            let segs = [
                Seg {
                    w: &gm,
                    bias: None,
                    out_off: 0,
                },
                Seg {
                    w: &um,
                    bias: None,
                    out_off: 0,
                },
            ];
            ops::matvec(dev, &segs, mode, &xb, Some((&nb, eps)), &out).unwrap();
            let got = read(dev, &out, rows);
            for r in 0..rows {
                let (g, ga) = rg[r];
                let (u, ua) = ru[r];
                let act = |v: f64| match mode {
                    Mode::GluSilu => v / (1.0 + (-v).exp()),
                    _ => 0.5 * v * (1.0 + (0.797_884_6 * (v + 0.044715 * v * v * v)).tanh()),
                };
                let want = act(g) * u;
                // d act / dx <= 1.2 for both; errors of g and u propagate.
                let bound = 1.2 * tol(ga, gty) * u.abs()
                    + act(g).abs() * tol(ua, uty)
                    + 1e-5 * want.abs()
                    + 1e-6;
                assert!(
                    (got[r] as f64 - want).abs() <= bound,
                    "{mode:?} {gty}/{uty} cols {cols} split {split} row {r}: gpu {} cpu {want}",
                    got[r]
                );
            }
        }
    }
    None
}

/// The fused output product + argmax: the index of the largest logit, lowest on ties (two
/// equal best rows in different blocks).
fn matvec_argmax(dev: &CudaDevice) -> Option<String> {
    for (ty, cols, split) in [(GgmlType::F32, 576, false), (GgmlType::Q8_0, 512, true)] {
        let rows = 5000;
        let mut w = Rng(800).vec(rows * cols);
        let x = Rng(801).vec(cols);
        // Row 4321 and row 1234: the same, and the best by a clear margin.
        let best: Vec<f32> = x.iter().map(|v| v * 0.5).collect();
        w[1234 * cols..1235 * cols].copy_from_slice(&best);
        w[4321 * cols..4322 * cols].copy_from_slice(&best);
        let bytes = quant::quantize_to_vec(ty, &w).unwrap();
        let m = GpuMatrix::upload_with(dev, "test", ty, rows, cols, &bytes, split).unwrap();
        let xb = up(dev, &x);
        let logits = zeros(dev, rows * 4, "test").unwrap();
        let tok = zeros(dev, 4, "test").unwrap();
        ops::matvec_argmax(dev, &m, &xb, None, &logits, &tok).unwrap();
        let t = dev.read_bytes(&tok, 0, 4).unwrap();
        let t = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
        let got = read(dev, &logits, rows);
        assert_eq!(got[1234], got[4321], "{ty}: equal rows, equal logits");
        assert_eq!(t, 1234, "{ty}: lowest index of the two best");
        assert_eq!(t, argmax(&got));
        // Quantized, random: the argmax of the logits the kernel wrote.
        let (m, _) = rand_matrix_with(dev, GgmlType::Q8_0, 49152, cols, 802, split);
        let logits = zeros(dev, 49152 * 4, "test").unwrap();
        ops::matvec_argmax(dev, &m, &xb, None, &logits, &tok).unwrap();
        let t = dev.read_bytes(&tok, 0, 4).unwrap();
        let got = read(dev, &logits, 49152);
        assert_eq!(u32::from_le_bytes([t[0], t[1], t[2], t[3]]), argmax(&got));
    }
    None
}

fn embed_every_format(dev: &CudaDevice) -> Option<String> {
    for (i, ty) in MATVEC_TYPES.into_iter().enumerate() {
        let (rows, cols) = (37, 768);
        let (m, w) = rand_matrix(dev, ty, rows, cols, 900 + i as u64);
        for (tok, scale) in [(0u32, 1.0f32), (36, 1.0), (17, 24.0)] {
            let mut p = tok.to_le_bytes().to_vec();
            p.extend_from_slice(&5u32.to_le_bytes());
            let params = upload_bytes(dev, &p, "test").unwrap();
            let out = up(dev, &vec![f32::NAN; cols]);
            ops::embed(dev, &m, &params, &out, scale).unwrap();
            let got = read(dev, &out, cols);
            let row = &w[tok as usize * cols..(tok as usize + 1) * cols];
            for (e, (&g, &r)) in got.iter().zip(row).enumerate() {
                let want = if scale != 1.0 { r * scale } else { r };
                let t = if converted(ty) {
                    want.abs() * 1e-3 + 1e-6
                } else {
                    0.0
                };
                assert!(
                    (g - want).abs() <= t,
                    "{ty} token {tok} element {e}: gpu {g} cpu {want}"
                );
            }
        }
    }
    // The embedding kernels read the GGUF layout only.
    let (m, _) = rand_matrix_with(dev, GgmlType::Q4_0, 4, 256, 1, true);
    let params = upload_bytes(dev, &[0u8; 8], "test").unwrap();
    let out = up(dev, &[0.0; 256]);
    let e = ops::embed(dev, &m, &params, &out, 1.0).unwrap_err();
    assert!(e.to_string().contains("split"), "{e}");
    None
}

/// The batched prefill's weight operand (`pf_dequant`): every format, both layouts, f16 and
/// bf16, odd row counts and long rows, bit for bit against the CPU's dequantized values
/// rounded to nearest even (as `cvt.rn`). The tensor-core products take these operands
/// (cuBLASLt, tested in ferrite-cuda), so this and the synthetic-model prefill tests cover
/// the quantized matmul of every format.
fn dequant_every_format(dev: &CudaDevice) -> Option<String> {
    use half::{bf16, f16};
    for (i, ty) in MATVEC_TYPES.into_iter().enumerate() {
        for (rows, cols) in [
            (33usize, 768usize),
            (1, 256),
            (7, 14336),
            (97, 2304),
            (5, 2048),
        ] {
            for split in layouts(ty, cols) {
                let seed = (i * 100 + rows) as u64 + 3;
                let (m, w) = rand_matrix_with(dev, ty, rows, cols, seed, split);
                let out = zeros(dev, rows * cols * 2, "test").unwrap();
                for bf in [false, true] {
                    ops::dequant(dev, &m, &out, bf).unwrap();
                    let got = dev.read_bytes(&out, 0, rows * cols * 2).unwrap();
                    for (e, &v) in w.iter().enumerate() {
                        // what the device holds: converted formats as f16
                        let held = if converted(ty) {
                            f16::from_f32(v).to_f32()
                        } else {
                            v
                        };
                        let want = if bf {
                            bf16::from_f32(held).to_bits()
                        } else {
                            f16::from_f32(held).to_bits()
                        };
                        let g = u16::from_le_bytes([got[2 * e], got[2 * e + 1]]);
                        assert_eq!(
                            g, want,
                            "{ty} {rows}x{cols} split {split} bf16 {bf}: element {e} ({v})"
                        );
                    }
                }
            }
        }
    }
    // Too small an output is refused.
    let (m, _) = rand_matrix(dev, GgmlType::Q4_0, 4, 256, 1);
    let small = zeros(dev, 4 * 256, "test").unwrap();
    assert!(ops::dequant(dev, &m, &small, false).is_err());
    None
}

fn rms_norms(dev: &CudaDevice) -> Option<String> {
    for n in [32usize, 576, 640, 4096, 1000] {
        let x: Vec<f32> = Rng(n as u64).vec(n).iter().map(|v| v * 5.0).collect();
        let y = Rng(n as u64 + 1).vec(n);
        let w: Vec<f32> = Rng(n as u64 + 2).vec(n).iter().map(|v| 1.0 + v).collect();
        let eps = 1e-6;
        let (xb, yb, wb) = (up(dev, &x), up(dev, &y), up(dev, &w));
        let out = up(dev, &vec![f32::NAN; n]);
        ops::rms_norm(dev, &xb, &wb, &out, n, eps).unwrap();
        let got = read(dev, &out, n);
        let want = rms_norm_ref(&x, &w, eps);
        for i in 0..n {
            assert!(
                (got[i] - want[i]).abs() <= 2e-6 * (1.0 + want[i].abs()),
                "rms_norm n={n} [{i}]: {} vs {}",
                got[i],
                want[i]
            );
        }
        ops::rms_norm_add(dev, &xb, &yb, &wb, n, eps).unwrap();
        let got = read(dev, &xb, n);
        let yn = rms_norm_ref(&y, &w, eps);
        for i in 0..n {
            let want = x[i] + yn[i];
            assert!(
                (got[i] - want).abs() <= 2e-6 * (1.0 + want.abs()),
                "rms_norm_add n={n} [{i}]: {} vs {want}",
                got[i]
            );
        }
    }
    None
}

/// Rotation of `v` (one head) at `pos` as the CPU model does it, in f64 over the f32 angles.
fn rope_ref(v: &mut [f32], inv: &[f32], pos: usize, pos_scale: f32, rope_dim: usize, neox: bool) {
    let half = rope_dim / 2;
    let p = pos as f32 * pos_scale;
    let src = v.to_vec();
    for (i, &f) in inv.iter().enumerate().take(half) {
        let a = p * f;
        let (c, s) = ((a as f64).cos(), (a as f64).sin());
        let (ia, ib) = if neox {
            (i, i + half)
        } else {
            (2 * i, 2 * i + 1)
        };
        let (x0, x1) = (src[ia] as f64, src[ib] as f64);
        v[ia] = (x0 * c - x1 * s) as f32;
        v[ib] = (x0 * s + x1 * c) as f32;
    }
}

/// Per-head RMS norm (if `w`) then RoPE of one head, as the CPU model.
#[allow(clippy::too_many_arguments)]
fn norm_rope_ref(
    head: &[f32],
    w: Option<&[f32]>,
    eps: f32,
    inv: &[f32],
    pos: usize,
    pos_scale: f32,
    rope_dim: usize,
    neox: bool,
) -> Vec<f32> {
    let mut v = match w {
        Some(w) => rms_norm_ref(head, w, eps),
        None => head.to_vec(),
    };
    rope_ref(&mut v, inv, pos, pos_scale, rope_dim, neox);
    v
}

fn f16_round(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

fn read_f16(dev: &CudaDevice, b: &Buffer, off: usize, n: usize) -> Vec<f32> {
    dev.read_bytes(b, off, n * 2)
        .unwrap()
        .chunks_exact(2)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect()
}

/// One paged layer's test data: keys and values f16 `[block][PK_LAYERS][nkv][KV_BS][hd]` for
/// two sequences whose block tables are permutations of disjoint block ranges, so every
/// lookup goes through the table.
struct PagedKv {
    nkv: usize,
    hd: usize,
    kc: Buffer,
    vc: Buffer,
    tables: Vec<u32>,
    /// Blocks a sequence.
    nb: usize,
}

/// Layers of the test caches; the kernels read layer `PK_LAYER`.
const PK_LAYERS: usize = 2;
const PK_LAYER: usize = 1;

impl PagedKv {
    fn new(dev: &CudaDevice, nkv: usize, hd: usize, ctx: usize, seed: u64) -> PagedKv {
        let nb = ctx.div_ceil(KV_BS);
        let n = 2 * nb * PK_LAYERS * nkv * KV_BS * hd;
        let to_f16 = |v: Vec<f32>| -> Vec<u8> {
            v.iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect()
        };
        let kc = upload_bytes(dev, &to_f16(Rng(seed).vec(n)), "test").unwrap();
        let vc = upload_bytes(dev, &to_f16(Rng(seed + 1).vec(n)), "test").unwrap();
        // nb is a multiple of neither 7 nor 5 for the test sizes: both maps are permutations.
        let mut tables: Vec<u32> = (0..nb).map(|i| ((i * 7 + 3) % nb) as u32).collect();
        tables.extend((0..nb).map(|i| (nb + (i * 5 + 1) % nb) as u32));
        PagedKv {
            nkv,
            hd,
            kc,
            vc,
            tables,
            nb,
        }
    }

    /// Element index of sequence `seq`'s position `p`, KV head `g`, in layer `PK_LAYER`.
    fn at(&self, seq: usize, p: usize, g: usize) -> usize {
        let blk = self.tables[seq * self.nb + p / KV_BS] as usize;
        (((blk * PK_LAYERS + PK_LAYER) * self.nkv + g) * KV_BS + p % KV_BS) * self.hd
    }

    /// The keys (or values, `v`) of sequence `seq` at position `p`, KV head `g`, as stored now.
    fn read(&self, dev: &CudaDevice, v: bool, seq: usize, p: usize, g: usize) -> Vec<f32> {
        let b = if v { &self.vc } else { &self.kc };
        read_f16(dev, b, self.at(seq, p, g) * 2, self.hd)
    }

    /// All keys and all values as stored now (index with `at`).
    fn snapshot(&self, dev: &CudaDevice) -> (Vec<f32>, Vec<f32>) {
        let n = self.kc.bytes() / 2;
        (read_f16(dev, &self.kc, 0, n), read_f16(dev, &self.vc, 0, n))
    }
}

/// Rope settings of a paged attention test launch.
struct PagedRope<'a> {
    inv: &'a Buffer,
    rope_dim: usize,
    neox: bool,
    pos_scale: f32,
    /// q and k norm weights and epsilon (gemma3)
    qk_norm: Option<(&'a Buffer, &'a Buffer, f32)>,
}

/// `paged_attn` as a decode-only step runs it (fused: each row's q, k, v unrotated in `qkv`,
/// rows of (nh + 2 nkv) * hd): row r is sequence r of `kv` at `pos[r]` (`PAD_ROW`: skipped).
/// Split into at most `splits` blocks a head group (default: as the engine), of multiples of
/// `keys` keys. Returns the f32 [rows][nh * hd] output.
#[allow(clippy::too_many_arguments)]
fn paged_decode(
    dev: &CudaDevice,
    nh: usize,
    kv: &PagedKv,
    rope: &PagedRope<'_>,
    window: usize,
    scale: f32,
    qkv: &Buffer,
    pos: &[u32],
    splits: Option<usize>,
    keys: usize,
) -> Vec<f32> {
    let (nkv, hd) = (kv.nkv, kv.hd);
    let shape = AttnShape {
        n_head: nh,
        n_kv_head: nkv,
        head_dim: hd,
        ctx: kv.nb * KV_BS,
    };
    let (ngrp, auto) = shape.splits(dev.sm_count(), keys);
    let maxsplit = splits.unwrap_or(auto);
    let rows = pos.len();
    let meta: Vec<u32> = pos
        .iter()
        .enumerate()
        .flat_map(|(r, &p)| [p, (r * kv.nb) as u32])
        .collect();
    let rows_b = upload_bytes(dev, &bytemuck_u32(&meta), "test").unwrap();
    let tables_b = upload_bytes(dev, &bytemuck_u32(&kv.tables), "test").unwrap();
    let part = zeros(dev, rows * shape.part_bytes(maxsplit), "test").unwrap();
    let count = zeros(dev, rows * nkv * ngrp * 4, "test").unwrap();
    let out = up(dev, &vec![f32::NAN; rows * nh * hd]);
    let args = PagedAttnArgs {
        q: qkv.ptr(),
        kc: kv.kc.ptr(),
        vc: kv.vc.ptr(),
        rows: rows_b.ptr(),
        tables: tables_b.ptr(),
        part: part.ptr(),
        count: count.ptr(),
        out: out.ptr(),
        nh: nh as u32,
        nkv: nkv as u32,
        hd: hd as u32,
        layer: PK_LAYER as u32,
        n_layer: PK_LAYERS as u32,
        maxsplit: maxsplit as u32,
        window: window as u32,
        ngrp: ngrp as u32,
        q_stride: ((nh + 2 * nkv) * hd) as u32,
        scale,
        inv_freq: rope.inv.ptr(),
        rope_dim: rope.rope_dim as u32,
        neox: u32::from(rope.neox),
        pos_scale: rope.pos_scale,
        fused: 1,
        qnorm: rope.qk_norm.map_or(0, |(q, _, _)| q.ptr()),
        knorm: rope.qk_norm.map_or(0, |(_, k, _)| k.ptr()),
        eps: rope.qk_norm.map_or(0.0, |(_, _, e)| e),
        split_keys: keys as u32,
    };
    PagedLaunch::Attn {
        args,
        rows: rows as u32,
    }
    .enqueue(dev)
    .unwrap();
    let got = read(dev, &out, rows * nh * hd);
    // The counters are left zero for the next launch of the step.
    let c = dev.read_bytes(&count, 0, rows * nkv * ngrp * 4).unwrap();
    assert!(
        c.iter().all(|&b| b == 0),
        "paged_attn left a split counter set"
    );
    got
}

fn bytemuck_u32(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A decode step's attention stores each row's k (normed, rotated) and v at its position,
/// through its block table: interleaved and NeoX pairs, partial rotation, q/k norms, a
/// position scale; two rows of different sequences in one launch.
fn rope_kv(dev: &CudaDevice) -> Option<String> {
    for (nh, nkv, hd, rope_dim, neox, qk_norm, pos) in [
        (9usize, 3usize, 64usize, 64usize, false, false, 0usize),
        (9, 3, 64, 64, false, false, 1234),
        (14, 2, 64, 64, true, false, 77),
        (4, 1, 256, 256, true, true, 3000),
        (8, 8, 128, 64, false, false, 9),
    ] {
        let kv = PagedKv::new(dev, nkv, hd, 3008, 5);
        let w = (nh + 2 * nkv) * hd;
        let qkv: Vec<f32> = Rng(w as u64 + pos as u64).vec(2 * w);
        let inv: Vec<f32> = (0..rope_dim / 2)
            .map(|i| 1.0 / 10000f32.powf((2 * i) as f32 / rope_dim as f32))
            .collect();
        let pos_scale = if pos == 77 { 0.25 } else { 1.0 };
        let qn: Vec<f32> = Rng(11).vec(hd).iter().map(|v| 1.0 + 0.5 * v).collect();
        let kn: Vec<f32> = Rng(12).vec(hd).iter().map(|v| 1.0 + 0.5 * v).collect();
        let eps = 1e-6;
        let (qkvb, invb, qnb, knb) = (up(dev, &qkv), up(dev, &inv), up(dev, &qn), up(dev, &kn));
        let rope = PagedRope {
            inv: &invb,
            rope_dim,
            neox,
            pos_scale,
            qk_norm: qk_norm.then_some((&qnb, &knb, eps)),
        };
        let ps = [pos, pos / 3 + 5];
        let scale = 1.0 / (hd as f32).sqrt();
        let pu: Vec<u32> = ps.iter().map(|&p| p as u32).collect();
        paged_decode(dev, nh, &kv, &rope, 0, scale, &qkvb, &pu, None, 64);
        for (r, &p) in ps.iter().enumerate() {
            for g in 0..nkv {
                let row = &qkv[r * w..(r + 1) * w];
                let kh = &row[(nh + g) * hd..(nh + g + 1) * hd];
                let want = norm_rope_ref(
                    kh,
                    qk_norm.then_some(&kn[..]),
                    eps,
                    &inv,
                    p,
                    pos_scale,
                    rope_dim,
                    neox,
                );
                let got = kv.read(dev, false, r, p, g);
                for e in 0..hd {
                    let w = f16_round(want[e]);
                    assert!(
                        (got[e] - w).abs() <= 1e-3 * w.abs() + 1e-6,
                        "nh {nh} nkv {nkv} hd {hd} rope_dim {rope_dim} neox {neox} row {r} pos {p}: k head {g} [{e}] gpu {} cpu {w}",
                        got[e]
                    );
                }
                let got = kv.read(dev, true, r, p, g);
                let src = &row[(nh + nkv + g) * hd..(nh + nkv + g + 1) * hd];
                for e in 0..hd {
                    assert_eq!(got[e], f16_round(src[e]), "row {r} v head {g} [{e}]");
                }
            }
        }
    }
    None
}

/// A decode step's attention against softmax(q.k * scale) . v in f64 over the f16 cache
/// read through the block tables (with each row's k and v as the kernel stored them): GQA
/// groups of 1, 3 and 12 (two blocks per KV head), head sizes 64-256, lengths 1..3000 with
/// one and many splits of 16- and 64-key multiples, more keys a split than the block
/// offsets kept in shared memory, a sliding window, q/k norms; two rows of different
/// sequences in one launch, and a padding row that is skipped.
fn attention(dev: &CudaDevice) -> Option<String> {
    for (nh, nkv, hd, neox, qk_norm) in [
        (9usize, 3usize, 64usize, false, false),
        (4, 4, 128, true, false),
        (12, 1, 80, true, false),
        (4, 1, 256, true, true),
    ] {
        let kv = PagedKv::new(dev, nkv, hd, 3008, hd as u64);
        let w = (nh + 2 * nkv) * hd;
        let qkv: Vec<f32> = Rng(nh as u64 * 31)
            .vec(3 * w)
            .iter()
            .map(|v| v * 3.0)
            .collect();
        let qkvb = up(dev, &qkv);
        let inv: Vec<f32> = (0..hd / 2)
            .map(|i| 1.0 / 10000f32.powf((2 * i) as f32 / hd as f32))
            .collect();
        let qn: Vec<f32> = Rng(13).vec(hd).iter().map(|v| 1.0 + 0.5 * v).collect();
        let kn: Vec<f32> = Rng(14).vec(hd).iter().map(|v| 1.0 + 0.5 * v).collect();
        let (invb, qnb, knb) = (up(dev, &inv), up(dev, &qn), up(dev, &kn));
        let eps = 1e-6;
        let rope = PagedRope {
            inv: &invb,
            rope_dim: hd,
            neox,
            pos_scale: 1.0,
            qk_norm: qk_norm.then_some((&qnb, &knb, eps)),
        };
        let scale = 1.0 / (hd as f32).sqrt();
        for (pos, window, splits, keys) in [
            (0usize, 0usize, None, 64usize),
            (1, 0, Some(1), 64),
            (63, 0, None, 64),
            (64, 0, Some(4), 16),
            (200, 0, Some(64), 64),
            (200, 0, None, 16),
            (1000, 0, None, 64),
            (2999, 0, Some(1), 64),
            (2998, 0, None, 32),
            (1001, 50, None, 64),
            (30, 50, None, 16),
            (2997, 512, Some(3), 64),
        ] {
            // Row 1: the second sequence further back; row 2: padding.
            let ps = [pos, pos / 2 + 1];
            let pu = [ps[0] as u32, ps[1] as u32, PAD_ROW];
            let got = paged_decode(dev, nh, &kv, &rope, window, scale, &qkvb, &pu, splits, keys);
            assert!(
                got[2 * nh * hd..].iter().all(|v| v.is_nan()),
                "the padding row's output was written"
            );
            let (kall, vall) = kv.snapshot(dev);
            for (r, &p) in ps.iter().enumerate() {
                let lo = if window > 0 {
                    (p + 1).saturating_sub(window)
                } else {
                    0
                };
                for h in 0..nh {
                    let g = h / (nh / nkv);
                    let row = |all: &[f32], j: usize| {
                        let at = kv.at(r, j, g);
                        all[at..at + hd].to_vec()
                    };
                    let kr: Vec<f32> = (lo..=p).flat_map(|j| row(&kall, j)).collect();
                    let vr: Vec<f32> = (lo..=p).flat_map(|j| row(&vall, j)).collect();
                    let qh = norm_rope_ref(
                        &qkv[r * w + h * hd..r * w + (h + 1) * hd],
                        qk_norm.then_some(&qn[..]),
                        eps,
                        &inv,
                        p,
                        1.0,
                        hd,
                        neox,
                    );
                    let scores: Vec<f64> = kr
                        .chunks_exact(hd)
                        .map(|k| {
                            qh.iter()
                                .zip(k)
                                .map(|(&a, &b)| a as f64 * b as f64)
                                .sum::<f64>()
                                * scale as f64
                        })
                        .collect();
                    let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let ps: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                    let z: f64 = ps.iter().sum();
                    for d in 0..hd {
                        let want: f64 = ps
                            .iter()
                            .enumerate()
                            .map(|(i, p)| p * vr[i * hd + d] as f64)
                            .sum::<f64>()
                            / z;
                        let gv = got[(r * nh + h) * hd + d] as f64;
                        assert!(
                            (gv - want).abs() <= 3e-5 + 3e-5 * want.abs(),
                            "nh {nh} nkv {nkv} hd {hd} row {r} pos {p} window {window} splits {splits:?} keys {keys}: head {h} [{d}] gpu {gv} cpu {want}"
                        );
                    }
                }
            }
        }
    }
    None
}

// ---- models ----

/// A small llama GGUF with random weights of `quant` (2 layers; K-quant-sized rows).
fn synth_model(quant: GgmlType, dir: &std::path::Path, layers: usize, ctx: usize) -> Model {
    let cfg = SynthConfig {
        preset: "gpu-test",
        n_layer: layers,
        d_model: 512,
        n_head: 8,
        n_kv_head: 2,
        n_ff: 768,
        vocab: 1000,
        ctx,
        rope_base: 10000.0,
        eps: 1e-5,
        tied_output: quant != GgmlType::Q4_1,
        vocab_style: VocabStyle::SmolLm2,
    };
    let path = dir.join(format!("synth-{}-{layers}-{ctx}.gguf", quant.name()));
    write_synthetic(&cfg, quant, 7, &path, &mut |_, _| {}).unwrap();
    Model::load(&path).unwrap()
}

fn tmp_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferrite-gpu-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One sequence on the CUDA kernel set (`Session::cuda`), with the calls these tests make:
/// prompts in pieces of `chunk` tokens (1: token by token, the decode steps alone), every
/// step's greedy token (or device sampler's draw) read back.
struct Gs<'g> {
    s: Session<'g, CudaKernels<'g>>,
    chunk: usize,
}

impl<'g> Gs<'g> {
    fn new(gm: &'g GpuModel) -> ferrite_llm::Result<Gs<'g>> {
        Ok(Gs {
            s: Session::cuda(gm, gm.ctx())?,
            chunk: usize::MAX,
        })
    }

    fn pos(&self) -> usize {
        self.s.pos()
    }

    fn truncate(&mut self, pos: usize) {
        self.s.truncate(pos)
    }

    /// Prompts in pieces of `chunk` tokens.
    fn set_prefill_chunk(&mut self, chunk: usize) {
        self.chunk = chunk.max(1);
    }

    /// Graph replay (default) or every kernel launched.
    fn set_eager(&mut self, eager: bool) {
        self.s.kernels_mut().set_graphs(!eager)
    }

    fn forward_token(&mut self, t: u32) -> ferrite_llm::Result<u32> {
        self.forward_tokens(&[t])
    }

    /// Runs `tokens`; the next token as the device picks it.
    fn forward_tokens(&mut self, tokens: &[u32]) -> ferrite_llm::Result<u32> {
        let mut next = None;
        for piece in tokens.chunks(self.chunk.min(tokens.len().max(1))) {
            next = self.s.forward_pick(piece)?;
        }
        Ok(next.expect("the CUDA kernel set picks tokens"))
    }

    /// The last step's last logit row.
    fn logits(&mut self) -> ferrite_llm::Result<Vec<f32>> {
        let vocab = self.s.config().vocab;
        let l = self.s.logits()?;
        Ok(l[l.len() - vocab..].to_vec())
    }

    /// Every position's logits of `tokens`.
    fn forward_logits(&mut self, tokens: &[u32]) -> ferrite_llm::Result<Vec<f32>> {
        let mut out = Vec::new();
        for piece in tokens.chunks(self.chunk.min(tokens.len().max(1))) {
            out.extend_from_slice(self.s.forward(piece, Logits::All)?);
        }
        Ok(out)
    }

    fn greedy(&mut self, prompt: &[u32], n: usize) -> ferrite_llm::Result<Vec<u32>> {
        let mut out = Vec::with_capacity(n);
        if n == 0 {
            return Ok(out);
        }
        let mut next = self.forward_tokens(prompt)?;
        for i in 0..n {
            out.push(next);
            if i + 1 < n {
                next = self.forward_token(next)?;
            }
        }
        Ok(out)
    }

    /// Draws with a device sampler of `cfg` (penalty history `history`), or the greedy pick
    /// for plain greedy settings; returns whether a device sampler is set.
    fn set_sampler(&mut self, cfg: &SamplerConfig, history: &[u32]) -> ferrite_llm::Result<bool> {
        let cap = self.s.ctx();
        let cfg = (!cfg.is_plain_greedy()).then_some(cfg);
        self.s.set_sampler(cfg, history, cap)
    }
}

fn session_errors(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    let model = synth_model(GgmlType::Q8_0, &dir, 1, 256);
    let gm = GpuModel::load(&model, dev, 8).unwrap();
    let mut s = Gs::new(&gm).unwrap();
    let e = s.forward_token(1000).unwrap_err().to_string();
    assert!(e.contains("out of range"), "{e}");
    assert_eq!(s.pos(), 0);
    s.forward_tokens(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    let e = s.forward_token(9).unwrap_err().to_string();
    assert!(e.contains("context size is 8"), "{e}");
    s.truncate(3);
    assert_eq!(s.pos(), 3);
    s.forward_token(9).unwrap();
    let e = GpuModel::load(&model, dev, 257)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("context"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// A KV cache larger than any GPU: refused with the sizes, before anything is uploaded.
fn does_not_fit(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    let cfg = SynthConfig {
        preset: "gpu-test",
        n_layer: 12,
        d_model: 1024,
        n_head: 8,
        n_kv_head: 8,
        n_ff: 256,
        vocab: 300,
        ctx: 4_000_000,
        rope_base: 10000.0,
        eps: 1e-5,
        tied_output: true,
        vocab_style: VocabStyle::SmolLm2,
    };
    let path = dir.join("huge-ctx.gguf");
    write_synthetic(&cfg, GgmlType::Q8_0, 1, &path, &mut |_, _| {}).unwrap();
    let model = Model::load(&path).unwrap();
    let before = dev.memory_stats();
    let e = GpuModel::load(&model, dev, 4_000_000)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    eprintln!("{e}");
    assert!(e.contains("does not fit") && e.contains("KV cache"), "{e}");
    assert_eq!(dev.memory_stats().in_use, before.in_use, "nothing uploaded");
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// CPU (exact mode) vs GPU over `tokens`, one at a time: logits after each step within
/// `max_tol` (max) and `rms_tol` (rms); the GPU's greedy token equals the argmax of its own
/// logits, and the CPU's wherever the CPU's top-2 margin exceeds `margin`.
fn compare_model(
    label: &str,
    model: &mut Model,
    dev: &CudaDevice,
    tokens: &[u32],
    max_tol: f32,
    rms_tol: f32,
    margin: f32,
) {
    compare_model_at(
        label,
        model,
        Precision::Exact,
        dev,
        tokens,
        (max_tol, rms_tol),
        margin,
    );
}

/// `compare_model` with both the CPU and the GPU at `precision` (Q8: the GPU's fast mode).
fn compare_model_at(
    label: &str,
    model: &mut Model,
    precision: Precision,
    dev: &CudaDevice,
    tokens: &[u32],
    (max_tol, rms_tol): (f32, f32),
    margin: f32,
) {
    model.set_precision(precision);
    // Split rows wherever the format has them (for small models `load` keeps GGUF rows; the
    // greedy and prefill tests take that path)
    let gm = GpuModel::load_with(model, dev, 256, Layout::Split).unwrap();
    let mut gs = Gs::new(&gm).unwrap();
    let mut cs = Session::new(model, 256).unwrap();
    let mut worst = (0f32, 0f32);
    for (i, &t) in tokens.iter().enumerate() {
        let next = gs.forward_token(t).unwrap();
        let g = gs.logits().unwrap();
        let c = cs.forward(&[t], Logits::Last).unwrap().to_vec();
        let (max, rms, _) = diff_stats(&g, &c);
        worst = (worst.0.max(max), worst.1.max(rms));
        assert!(
            max <= max_tol && rms <= rms_tol,
            "{label} step {i}: logits max |diff| {max}, rms {rms} (tolerances {max_tol}, {rms_tol})"
        );
        assert_eq!(next, argmax(&g), "{label} step {i}: device argmax");
        if top2_margin(&c) > margin {
            assert_eq!(next, argmax(&c), "{label} step {i}: greedy token");
        }
    }
    eprintln!(
        "{label}: {} steps, logits vs CPU {precision:?}: max |diff| {:.2e}, rms {:.2e}",
        tokens.len(),
        worst.0,
        worst.1
    );
}

/// Every quant type `ferrite synth` writes (K-quants, Q2_K/Q3_K converted to f16, f32, bf16),
/// two layers, 24 steps: logits against the CPU's exact mode.
fn synthetic_models(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    for quant in QUANTS {
        let mut model = synth_model(quant, &dir, 2, 256);
        let tokens: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 1000).collect();
        // Random weights: logits of order 1; f16 KV rounding and f32 summation order (measured:
        // max 4-6e-4, rms 1-2e-4), and f16 rounding of the weights the GPU converts.
        let (max, rms) = if converted(quant) {
            (5e-3, 1e-3)
        } else {
            (2e-3, 5e-4)
        };
        compare_model(
            &format!("synthetic {quant}"),
            &mut model,
            dev,
            &tokens,
            max,
            rms,
            1e-2,
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// GPU logits of `tokens` (one decode step each) at `precision`.
fn gpu_logits(
    model: &mut Model,
    precision: Precision,
    dev: &CudaDevice,
    tokens: &[u32],
) -> Vec<Vec<f32>> {
    model.set_precision(precision);
    let gm = GpuModel::load(model, dev, 256).unwrap();
    assert_eq!(gm.precision(), precision);
    let mut s = Gs::new(&gm).unwrap();
    tokens
        .iter()
        .map(|&t| {
            s.forward_token(t).unwrap();
            s.logits().unwrap()
        })
        .collect()
}

/// The fast mode (8-bit activations) against the CPU's Q8 mode, which quantizes the same
/// way: synthetic models of the formats with an integer kernel, 24 steps; also prints the
/// fast mode's distance from the GPU's exact mode.
fn synthetic_models_q8(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    for quant in Q8_TYPES.into_iter().filter(|q| QUANTS.contains(q)) {
        let mut model = synth_model(quant, &dir, 2, 256);
        let tokens: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 1000).collect();
        // Not the same 8-bit inputs: the GPU's and the CPU's f32 differences in attention (f16
        // KV cache), norms and activations move some inputs across a rounding edge, and each
        // such flip moves a product by a whole step of 8-bit scale (measured on Q4_0: max
        // 0.021, rms 0.006 at step 0, against 5e-4 between the exact modes).
        compare_model_at(
            &format!("synthetic {quant} q8"),
            &mut model,
            Precision::Q8,
            dev,
            &tokens,
            (0.1, 0.025),
            0.2,
        );
        let e = gpu_logits(&mut model, Precision::Exact, dev, &tokens);
        let q = gpu_logits(&mut model, Precision::Q8, dev, &tokens);
        let (mut max, mut rms, mut sd) = (0f32, 0f32, 0f32);
        for (a, b) in q.iter().zip(&e) {
            let (m, r, s) = diff_stats(a, b);
            (max, rms, sd) = (max.max(m), rms.max(r), sd.max(s));
        }
        eprintln!("synthetic {quant}: GPU q8 vs GPU exact: max {max:.2e}, rms {rms:.2e} (logit std {sd:.3})");
    }
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// The same steps with the graph replayed and with kernels launched one by one: the same
/// bits (the kernels are deterministic).
fn graph_equals_eager(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    let model = synth_model(GgmlType::Q4_K, &dir, 2, 256);
    let gm = GpuModel::load(&model, dev, 64).unwrap();
    let tokens: Vec<u32> = (0..12).map(|i| (i * 91 + 3) % 1000).collect();
    let mut runs = Vec::new();
    for eager in [false, true] {
        let mut s = Gs::new(&gm).unwrap();
        s.set_eager(eager);
        let mut out = Vec::new();
        for &t in &tokens {
            let n = s.forward_token(t).unwrap();
            out.push((n, s.logits().unwrap()));
        }
        runs.push(out);
    }
    for (i, (a, b)) in runs[0].iter().zip(&runs[1]).enumerate() {
        assert_eq!(a.0, b.0, "step {i}: token");
        assert!(
            a.1.iter()
                .zip(&b.1)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "step {i}: logits differ between graph replay and eager launches"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    None
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// SmolLM2 over the transformers fixture prompt, one token at a time: the last logits against
/// the CPU's exact mode and against transformers (fp32), and every step against the CPU.
fn smollm2_logits(dev: &CudaDevice) -> Option<String> {
    let Some(path) = smollm2_path() else {
        return Some("SmolLM2-135M-Instruct.Q4_1.gguf is not in the model cache".into());
    };
    let mut model = Model::load(&path).unwrap();
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("smollm2.json")).unwrap()).unwrap();
    let prompt: Vec<u32> = fx["logits"]["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    // Measured tolerances are printed; these bound f16 KV rounding over 30 layers.
    compare_model("SmolLM2", &mut model, dev, &prompt, 0.1, 0.02, 0.2);
    let gm = GpuModel::load(&model, dev, 64).unwrap();
    let mut s = Gs::new(&gm).unwrap();
    s.set_prefill_chunk(1);
    s.forward_tokens(&prompt).unwrap();
    let got = s.logits().unwrap();
    let want: Vec<f32> = std::fs::read(fixture("smollm2_logits.bin"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let (max, rms, std) = diff_stats(&got, &want);
    eprintln!("SmolLM2 GPU vs transformers: max |diff| {max:.4}, rms {rms:.4}, std {std:.3}");
    assert!(max < 0.1 && rms < 0.02, "max {max} rms {rms}");
    None
}

fn smollm2_greedy(dev: &CudaDevice) -> Option<String> {
    let Some(path) = smollm2_path() else {
        return Some("SmolLM2-135M-Instruct.Q4_1.gguf is not in the model cache".into());
    };
    let mut model = Model::load(&path).unwrap();
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let ids = tok.encode("The capital of France is", true).unwrap();
    model.set_precision(Precision::Exact);
    let mut cs = Session::new(&model, 64).unwrap();
    let want = ferrite_llm::generate::greedy(&mut cs, &ids, 32).unwrap();
    let gm = GpuModel::load(&model, dev, 64).unwrap();
    let mut gs = Gs::new(&gm).unwrap();
    let got = gs.greedy(&ids, 32).unwrap();
    eprintln!("GPU greedy: {:?}", tok.decode(&got));
    assert_eq!(
        got,
        want,
        "GPU {:?} vs CPU {:?}",
        tok.decode(&got),
        tok.decode(&want)
    );
    assert!(
        tok.decode(&got).starts_with(" Paris."),
        "{}",
        tok.decode(&got)
    );
    None
}

/// SmolLM2 in the fast mode: greedy 32 tokens against the CPU's Q8 mode, and the
/// logits of every step of that sequence (teacher-forced) against the CPU's Q8 mode (greedy
/// tokens must agree wherever the CPU's top-2 margin is clear); the distance of the fast
/// mode's logits from the CPU's exact mode is printed.
fn smollm2_q8(dev: &CudaDevice) -> Option<String> {
    let Some(path) = smollm2_path() else {
        return Some("SmolLM2-135M-Instruct.Q4_1.gguf is not in the model cache".into());
    };
    let mut model = Model::load(&path).unwrap();
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let ids = tok.encode("The capital of France is", true).unwrap();
    // The exact path's greedy continuation is the sequence every mode is teacher-forced on.
    model.set_precision(Precision::Exact);
    let mut cs = Session::new(&model, 64).unwrap();
    let cont = ferrite_llm::generate::greedy(&mut cs, &ids, 32).unwrap();
    let mut seq = ids.clone();
    seq.extend(&cont);
    let per_step = |model: &Model| {
        let mut cs = Session::new(model, 64).unwrap();
        seq.iter()
            .map(|&t| cs.forward(&[t], Logits::Last).unwrap().to_vec())
            .collect::<Vec<_>>()
    };
    let exact = per_step(&model);
    model.set_precision(Precision::Q8);
    let cpu_q8 = per_step(&model);
    let gpu_q8 = gpu_logits(&mut model, Precision::Q8, dev, &seq);
    // 8-bit activations move logits (a rounding flip moves a product by a whole step): the
    // GPU's fast mode must stay as close to the exact logits as the CPU's own Q8 mode does.
    let (mut g_worst, mut c_worst) = ((0f32, 0f32), (0f32, 0f32));
    for (i, ((g, c), e)) in gpu_q8.iter().zip(&cpu_q8).zip(&exact).enumerate() {
        let (gm, gr, _) = diff_stats(g, e);
        let (cm, cr, _) = diff_stats(c, e);
        g_worst = (g_worst.0.max(gm), g_worst.1.max(gr));
        c_worst = (c_worst.0.max(cm), c_worst.1.max(cr));
        if top2_margin(e) > 2.0 {
            assert_eq!(
                argmax(g),
                argmax(e),
                "SmolLM2 q8 step {i}: greedy token (margin > 2)"
            );
        }
    }
    eprintln!(
        "SmolLM2 vs CPU exact over {} steps: GPU q8 max {:.3} rms {:.3}; CPU q8 max {:.3} rms {:.3}",
        seq.len(),
        g_worst.0,
        g_worst.1,
        c_worst.0,
        c_worst.1
    );
    assert!(
        g_worst.1 <= 1.5 * c_worst.1 + 0.05 && g_worst.0 <= 1.5 * c_worst.0 + 0.2,
        "GPU q8 strays further from the exact logits than the CPU's q8 mode: {g_worst:?} vs {c_worst:?}"
    );
    let mut gm = GpuModel::load(&model, dev, 64).unwrap();
    gm.set_precision(Precision::Q8);
    assert_eq!(gm.precision(), Precision::Q8);
    let mut gs = Gs::new(&gm).unwrap();
    let got = gs.greedy(&ids, 32).unwrap();
    eprintln!("SmolLM2 q8 greedy on the GPU: {:?}", tok.decode(&got));
    None
}

/// Gemma-3-270M (gemma3: embedding scale, q/k norms, post norms, GeGLU, sliding window with
/// its own RoPE base; Q4_K/Q5_0/Q6_K/Q8_0 weights).
fn gemma3(dev: &CudaDevice) -> Option<String> {
    let Some(path) = gemma3_path() else {
        return Some("gemma-3-270m-q4_k_m.gguf is not in the model cache".into());
    };
    let mut model = Model::load(&path).unwrap();
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let ids = tok.encode("The capital of France is", true).unwrap();
    compare_model("Gemma3", &mut model, dev, &ids, 0.15, 0.03, 0.3);
    let mut cs = Session::new(&model, 64).unwrap();
    let want = ferrite_llm::generate::greedy(&mut cs, &ids, 16).unwrap();
    let gm = GpuModel::load(&model, dev, 64).unwrap();
    let mut gs = Gs::new(&gm).unwrap();
    let got = gs.greedy(&ids, 16).unwrap();
    eprintln!("Gemma3 GPU greedy: {:?}", tok.decode(&got));
    assert_eq!(
        got,
        want,
        "{:?} vs {:?}",
        tok.decode(&got),
        tok.decode(&want)
    );
    None
}

/// GPU batched prefill (all-position logits, and the last position's through the decode
/// step's output launches) against the CPU's exact mode over `tokens` from an empty cache;
/// returns (max, rms) of the all-position difference.
fn prefill_vs_cpu(model: &mut Model, dev: &CudaDevice, tokens: &[u32], chunk: usize) -> (f32, f32) {
    prefill_vs_cpu_in(model, dev, tokens, chunk, Layout::Auto)
}

/// `prefill_vs_cpu` with the weights in `layout`.
fn prefill_vs_cpu_in(
    model: &mut Model,
    dev: &CudaDevice,
    tokens: &[u32],
    chunk: usize,
    layout: Layout,
) -> (f32, f32) {
    model.set_precision(Precision::Exact);
    let ctx = 256.max(tokens.len() + 8);
    let gm = GpuModel::load_with(model, dev, ctx, layout).unwrap();
    let mut cs = Session::new(model, ctx).unwrap();
    let want = cs.forward(tokens, Logits::All).unwrap().to_vec();
    let mut gs = Gs::new(&gm).unwrap();
    gs.set_prefill_chunk(chunk);
    let got = gs.forward_logits(tokens).unwrap();
    assert_eq!(gs.pos(), tokens.len());
    assert_eq!(got.len(), want.len());
    let (max, rms, _) = diff_stats(&got, &want);
    // The last position again by forward_tokens (greedy token and logits() of the decode
    // step's own output product).
    let mut gs = Gs::new(&gm).unwrap();
    gs.set_prefill_chunk(chunk);
    let next = gs.forward_tokens(tokens).unwrap();
    let last = gs.logits().unwrap();
    let vocab = model.cfg.vocab;
    let (lmax, _, _) = diff_stats(&last, &want[want.len() - vocab..]);
    assert_eq!(next, argmax(&last), "device argmax");
    assert!(
        lmax <= 2.0 * max.max(1e-3),
        "last logits {lmax} vs all-position {max}"
    );
    (max, rms)
}

/// Synthetic 2-layer models of several formats, a 40-token prompt in one chunk.
fn prefill_synthetic(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 1000).collect();
    for quant in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::F16,
    ] {
        let mut model = synth_model(quant, &dir, 2, 256);
        for layout in [Layout::Gguf, Layout::Split] {
            let (max, rms) = prefill_vs_cpu_in(&mut model, dev, &tokens, 512, layout);
            eprintln!("prefill synthetic {quant} {layout:?}: all-position logits vs CPU exact: max {max:.2e}, rms {rms:.2e}");
            // f16 operands of the products (11-bit significands) on logits of order 1.
            assert!(
                max < 3e-2 && rms < 5e-3,
                "{quant} {layout:?}: max {max} rms {rms}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// A prompt over several chunks (16 tokens each, 40 tokens: 16 + 16 + 8), so attention of a
/// later chunk reads keys written by earlier ones.
fn prefill_chunks(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    let tokens: Vec<u32> = (0..40).map(|i| (i * 53 + 11) % 1000).collect();
    let mut model = synth_model(GgmlType::Q4_K, &dir, 2, 256);
    for chunk in [16, 7, 40] {
        let (max, rms) = prefill_vs_cpu(&mut model, dev, &tokens, chunk);
        eprintln!("prefill chunks of {chunk}: max {max:.2e}, rms {rms:.2e}");
        assert!(
            max < 3e-2 && rms < 5e-3,
            "chunk {chunk}: max {max} rms {rms}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// Prompt chunks that start their sequence run as their bucket's graph (`prefill_bucket`
/// rows): one prompt three times (eager, captured, replayed) gives the same logits bit for
/// bit; a shorter prompt of the same bucket replays that graph; each matches the CPU's exact
/// path; decode steps after a replayed prompt match those after eager launches (the graph
/// wrote the same KV cache).
fn prefill_graphs(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    let mut model = synth_model(GgmlType::Q4_1, &dir, 2, 256);
    model.set_precision(Precision::Exact);
    let prompt =
        |n: u32, salt: u32| -> Vec<u32> { (0..n).map(|i| (i * 37 + salt) % 1000).collect() };
    let (a, b, c) = (prompt(40, 5), prompt(50, 11), prompt(100, 3));
    let cont: Vec<u32> = (0..6).map(|i| (i * 71 + 2) % 1000).collect();
    let vocab = model.cfg.vocab;
    let mut want = Vec::new();
    for t in [&a, &b, &c] {
        let mut cs = Session::new(&model, 256).unwrap();
        let l = cs.forward(t, Logits::All).unwrap();
        want.push(l[l.len() - vocab..].to_vec());
    }
    let gm = GpuModel::load(&model, dev, 256).unwrap();
    let close = |got: &[f32], want: &[f32], what: &str| {
        let (max, rms, _) = diff_stats(got, want);
        eprintln!("prefill graph, {what}: last logits vs CPU exact: max {max:.2e}, rms {rms:.2e}");
        assert!(max < 3e-2 && rms < 5e-3, "{what}: max {max} rms {rms}");
    };
    let mut gs = Gs::new(&gm).unwrap();
    let mut runs = Vec::new();
    for _ in 0..3 {
        gs.truncate(0);
        gs.forward_tokens(&a).unwrap();
        runs.push(gs.logits().unwrap());
    }
    assert_eq!(gs.s.kernels().graph_stats(), (1, 2), "graphs made, replays");
    assert!(
        runs[0] == runs[1] && runs[1] == runs[2],
        "eager, captured and replayed runs differ"
    );
    close(&runs[2], &want[0], "40 rows (bucket 64)");
    gs.truncate(0);
    gs.forward_tokens(&b).unwrap();
    assert_eq!(
        gs.s.kernels().graph_stats(),
        (1, 3),
        "50 rows replay bucket 64"
    );
    close(
        &gs.logits().unwrap(),
        &want[1],
        "50 rows (bucket 64, replayed)",
    );
    gs.truncate(0);
    gs.forward_tokens(&c).unwrap();
    close(
        &gs.logits().unwrap(),
        &want[2],
        "100 rows (bucket 128, eager)",
    );
    // decode after the replayed 50-row prompt vs after eager launches
    let mut e = Gs::new(&gm).unwrap();
    e.set_eager(true);
    e.forward_tokens(&b).unwrap();
    gs.truncate(0);
    gs.forward_tokens(&b).unwrap();
    assert_eq!(gs.s.kernels().graph_stats().1, 4);
    for (i, &t) in cont.iter().enumerate() {
        let (ng, ne) = (gs.forward_token(t).unwrap(), e.forward_token(t).unwrap());
        let (lg, le) = (gs.logits().unwrap(), e.logits().unwrap());
        let (max, _, _) = diff_stats(&lg, &le);
        assert!(max < 3e-2, "decode step {i} after the prompt: max {max}");
        if top2_margin(&le) > 1e-2 {
            assert_eq!(ng, ne, "decode step {i}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// Prefill then decode steps vs decode steps only, teacher-forced on the same tokens: logits
/// of every decode step after the prompt agree (the batched path left the same KV cache, up
/// to f16 rounding), and the greedy tokens agree wherever the margin is clear.
fn prefill_then_decode(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    let mut model = synth_model(GgmlType::Q4_0, &dir, 2, 256);
    model.set_precision(Precision::Exact);
    let gm = GpuModel::load(&model, dev, 128).unwrap();
    let prompt: Vec<u32> = (0..33).map(|i| (i * 29 + 7) % 1000).collect();
    let cont: Vec<u32> = (0..16).map(|i| (i * 71 + 2) % 1000).collect();
    let mut a = Gs::new(&gm).unwrap();
    let mut b = Gs::new(&gm).unwrap();
    b.set_prefill_chunk(1);
    a.set_prefill_chunk(16);
    let (ta, tb) = (
        a.forward_tokens(&prompt).unwrap(),
        b.forward_tokens(&prompt).unwrap(),
    );
    let mut worst = diff_stats(&a.logits().unwrap(), &b.logits().unwrap()).0;
    if top2_margin(&b.logits().unwrap()) > 1e-2 {
        assert_eq!(ta, tb, "first token");
    }
    for (i, &t) in cont.iter().enumerate() {
        let (na, nb) = (a.forward_token(t).unwrap(), b.forward_token(t).unwrap());
        let (la, lb) = (a.logits().unwrap(), b.logits().unwrap());
        let (max, _, _) = diff_stats(&la, &lb);
        worst = worst.max(max);
        assert!(max < 3e-2, "step {i}: max {max}");
        if top2_margin(&lb) > 1e-2 {
            assert_eq!(na, nb, "step {i}");
        }
    }
    eprintln!("prefill then decode vs decode only: max |diff| {worst:.2e}");
    let _ = std::fs::remove_dir_all(&dir);
    None
}

fn cpu_ppl(model: &mut Model, ids: &[u32]) -> f64 {
    model.set_precision(Precision::Exact);
    let mut cs = Session::new(model, ids.len()).unwrap();
    ferrite_llm::generate::mean_nll(&mut cs, ids)
        .unwrap()
        .0
        .exp()
}

fn gpu_ppl(model: &Model, dev: &CudaDevice, ids: &[u32], chunk: usize) -> f64 {
    let gm = GpuModel::load(model, dev, ids.len()).unwrap();
    let mut gs = Gs::new(&gm).unwrap();
    gs.set_prefill_chunk(chunk);
    let logits = gs.forward_logits(&ids[..ids.len() - 1]).unwrap();
    let nll = ferrite_llm::generate::chunk_nll(&logits, model.cfg.vocab, &ids[1..]);
    (nll / (ids.len() - 1) as f64).exp()
}

fn prefill_ppl_synthetic(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    let mut model = synth_model(GgmlType::Q4_1, &dir, 2, 256);
    let ids: Vec<u32> = (0..200).map(|i| (i * i * 7 + 3) % 1000).collect();
    let c = cpu_ppl(&mut model, &ids);
    let g = gpu_ppl(&model, dev, &ids, 64);
    eprintln!("synthetic Q4_1 perplexity: CPU {c:.4}, GPU {g:.4}");
    assert!((g / c - 1.0).abs() < 0.01, "CPU {c} GPU {g}");
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// SmolLM2: the fixture prompt's all-position logits vs the CPU (exact) and the last vs
/// transformers; greedy 32 tokens after a batched prompt equal the decode-only path's; the
/// perplexity of a text (two chunks) within 1% of the CPU's.
fn prefill_smollm2(dev: &CudaDevice) -> Option<String> {
    let Some(path) = smollm2_path() else {
        return Some("SmolLM2-135M-Instruct.Q4_1.gguf is not in the model cache".into());
    };
    let mut model = Model::load(&path).unwrap();
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("smollm2.json")).unwrap()).unwrap();
    let prompt: Vec<u32> = fx["logits"]["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let (max, rms) = prefill_vs_cpu(&mut model, dev, &prompt, 512);
    eprintln!("SmolLM2 prefill, all positions vs CPU exact: max {max:.4}, rms {rms:.4}");
    let gm = GpuModel::load(&model, dev, 512).unwrap();
    let mut s = Gs::new(&gm).unwrap();
    s.forward_tokens(&prompt).unwrap();
    let got = s.logits().unwrap();
    let want: Vec<f32> = std::fs::read(fixture("smollm2_logits.bin"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let (tmax, trms, std) = diff_stats(&got, &want);
    eprintln!(
        "SmolLM2 prefill last logits vs transformers: max {tmax:.4}, rms {trms:.4} (std {std:.3})"
    );
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let ids = tok.encode("The capital of France is", true).unwrap();
    let mut a = Gs::new(&gm).unwrap();
    let ga = a.greedy(&ids, 32).unwrap();
    let mut b = Gs::new(&gm).unwrap();
    b.set_prefill_chunk(1);
    let gb = b.greedy(&ids, 32).unwrap();
    eprintln!("SmolLM2 prefill+decode greedy: {:?}", tok.decode(&ga));
    let text = std::fs::read_to_string(fixture("genesis_1.txt")).unwrap();
    let mut pids = tok.encode(&text, true).unwrap();
    pids.truncate(400);
    let c = cpu_ppl(&mut model, &pids);
    let g = gpu_ppl(&model, dev, &pids, 256);
    eprintln!(
        "SmolLM2 perplexity over {} tokens: CPU exact {c:.4}, GPU prefill {g:.4}",
        pids.len()
    );
    assert_eq!(ga, gb, "{:?} vs {:?}", tok.decode(&ga), tok.decode(&gb));
    assert!((g / c - 1.0).abs() < 0.01, "CPU {c} GPU {g}");
    assert!(max < 0.3 && rms < 0.06, "vs CPU: max {max} rms {rms}");
    assert!(
        tmax < 0.3 && trms < 0.06,
        "vs transformers: max {tmax} rms {trms}"
    );
    None
}

// ---- device sampler ----

/// Draws `draws` tokens on the device and checks them against the CPU sampler's
/// probabilities within `tol` (`sampler_support::check_draws`). Returns the max abs
/// difference.
fn check_sampler(
    dev: &CudaDevice,
    name: &str,
    cfg: &SamplerConfig,
    logits: &[f32],
    history: &[u32],
    draws: usize,
    tol: f64,
) -> f64 {
    let ids = ferrite_llm::gpu::sample_many(dev, cfg, logits, history, draws).unwrap();
    check_draws("GPU", name, cfg, logits, history, &ids, tol)
}

fn sampler_distribution(dev: &CudaDevice) -> Option<String> {
    let mut rng = Rng(11);
    let vocab = 64;
    let logits: Vec<f32> = rng.vec(vocab).iter().map(|v| v * 3.0).collect();
    let raw_top = argmax(&logits);
    let base = SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        penalty_last_n: 64,
        seed: 5,
    };
    let history: Vec<u32> = vec![raw_top, 3, 9, raw_top, 17, 3, raw_top, 40];
    let sets: Vec<(&str, SamplerConfig)> = vec![
        (
            "full softmax t=0.8",
            SamplerConfig {
                temperature: 0.8,
                ..base.clone()
            },
        ),
        (
            "defaults (t 0.8, k 40, p 0.95, min-p 0.05)",
            SamplerConfig {
                seed: 5,
                ..SamplerConfig::default()
            },
        ),
        (
            "top-k 5, t 1.5",
            SamplerConfig {
                temperature: 1.5,
                top_k: 5,
                ..base.clone()
            },
        ),
        (
            "top-p 0.5",
            SamplerConfig {
                top_p: 0.5,
                ..base.clone()
            },
        ),
        (
            "min-p 0.2",
            SamplerConfig {
                min_p: 0.2,
                ..base.clone()
            },
        ),
        (
            "top-k 10 + top-p 0.8 + min-p 0.1",
            SamplerConfig {
                top_k: 10,
                top_p: 0.8,
                min_p: 0.1,
                ..base.clone()
            },
        ),
        (
            "penalties (repeat 1.5, presence 0.5, frequency 0.3, last 6), t 0.7",
            SamplerConfig {
                temperature: 0.7,
                repeat_penalty: 1.5,
                presence_penalty: 0.5,
                frequency_penalty: 0.3,
                penalty_last_n: 6,
                ..base.clone()
            },
        ),
    ];
    for (name, cfg) in &sets {
        check_sampler(dev, name, cfg, &logits, &history, 40_000, 0.01);
    }
    // top-k 1 is the argmax (lowest id on ties).
    let mut tied = logits.clone();
    tied[50] = tied[raw_top as usize];
    let lo = raw_top.min(50);
    let k1 = SamplerConfig {
        top_k: 1,
        ..base.clone()
    };
    let ids = ferrite_llm::gpu::sample_many(dev, &k1, &tied, &[], 200).unwrap();
    assert!(
        ids.iter().all(|&t| t == lo),
        "top-k 1: {ids:?} (argmax {lo})"
    );
    // Penalties that change the argmax, at temperature 0 (deterministic) and sampled.
    let pen = SamplerConfig {
        temperature: 0.0,
        repeat_penalty: 3.0,
        presence_penalty: 2.0,
        ..base.clone()
    };
    let want = Sampler::new(pen.clone())
        .unwrap()
        .sample(&mut logits.clone(), &history)
        .unwrap();
    assert_ne!(want, raw_top, "the penalties should move the argmax");
    let ids = ferrite_llm::gpu::sample_many(dev, &pen, &logits, &history, 50).unwrap();
    assert!(
        ids.iter().all(|&t| t == want),
        "greedy with penalties: {ids:?}, CPU {want}"
    );
    let pen_k1 = SamplerConfig {
        temperature: 1.0,
        top_k: 1,
        ..pen.clone()
    };
    let ids = ferrite_llm::gpu::sample_many(dev, &pen_k1, &logits, &history, 50).unwrap();
    assert!(
        ids.iter().all(|&t| t == want),
        "top-k 1 with penalties: {ids:?}, CPU {want}"
    );
    // A SmolLM2-sized vocabulary (radix passes over many keys, large kept sets).
    let big: Vec<f32> = rng.vec(49_152).iter().map(|v| v * 4.0).collect();
    let bh: Vec<u32> = (0..64).map(|i| (i * 769) % 49_152).collect();
    for (name, cfg) in [
        (
            "49152: defaults",
            SamplerConfig {
                seed: 9,
                ..SamplerConfig::default()
            },
        ),
        (
            "49152: top-p 0.9 alone (large kept set)",
            SamplerConfig {
                top_p: 0.9,
                ..base.clone()
            },
        ),
        (
            "49152: top-k 200, min-p 0.3, penalties",
            SamplerConfig {
                top_k: 200,
                min_p: 0.3,
                repeat_penalty: 1.3,
                frequency_penalty: 0.2,
                ..base.clone()
            },
        ),
    ] {
        check_sampler(dev, name, &cfg, &big, &bh, 4_000, 0.03);
    }
    None
}

fn sampler_seed(dev: &CudaDevice) -> Option<String> {
    let logits: Vec<f32> = Rng(3).vec(1000).iter().map(|v| v * 2.0).collect();
    let cfg = SamplerConfig {
        seed: 42,
        ..SamplerConfig::default()
    };
    let a = ferrite_llm::gpu::sample_many(dev, &cfg, &logits, &[1, 2, 3], 300).unwrap();
    let b = ferrite_llm::gpu::sample_many(dev, &cfg, &logits, &[1, 2, 3], 300).unwrap();
    assert_eq!(a, b, "same seed, different tokens");
    let c = ferrite_llm::gpu::sample_many(
        dev,
        &SamplerConfig { seed: 43, ..cfg },
        &logits,
        &[1, 2, 3],
        300,
    )
    .unwrap();
    assert_ne!(a, c, "another seed, the same 300 tokens");
    None
}

/// Sampling settings that spread the draws of a random-weight model: temperature 1.5, top-p
/// 0.98, seed 7.
fn hot_sampler() -> SamplerConfig {
    SamplerConfig {
        temperature: 1.5,
        top_k: 0,
        top_p: 0.98,
        min_p: 0.0,
        seed: 7,
        ..SamplerConfig::default()
    }
}

/// Sampled decoding on a synthetic model (`Session::cuda`, the device sampler's launch after
/// each replayed step): one host wait per token; graph and eager launches give the same tokens; the same
/// seed gives the same tokens; penalties keep recent tokens out.
fn sampled_generation(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    let model = synth_model(GgmlType::Q4_0, &dir, 2, 256);
    let gm = GpuModel::load(&model, dev, 160).unwrap();
    let prompt: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % 1000).collect();
    let cfg = hot_sampler();
    let n = 64;
    let run = |eager: bool, cfg: &SamplerConfig| -> (Vec<u32>, u64) {
        let mut s = Gs::new(&gm).unwrap();
        s.set_eager(eager);
        assert!(s.set_sampler(cfg, &prompt).unwrap());
        let mut out = vec![s.forward_tokens(&prompt).unwrap()];
        let w0 = dev.sync_stats().host_waits;
        for i in 0..n - 1 {
            let t = s.forward_token(out[i]).unwrap();
            out.push(t);
        }
        (out, dev.sync_stats().host_waits - w0)
    };
    let (a, waits) = run(false, &cfg);
    assert_eq!(
        waits,
        (n - 1) as u64,
        "host waits for {} sampled tokens",
        n - 1
    );
    let (b, _) = run(true, &cfg);
    assert_eq!(a, b, "graph replay vs eager launches");
    let (c, _) = run(false, &cfg);
    assert_eq!(a, c, "same seed");
    let distinct = a.iter().collect::<std::collections::BTreeSet<_>>().len();
    assert!(
        distinct > 8,
        "sampling at t 1.5 gave {distinct} distinct tokens: {a:?}"
    );
    // A strong presence penalty over the whole history: no token repeats a recent one.
    let pen = SamplerConfig {
        presence_penalty: 1e4,
        penalty_last_n: 256,
        ..cfg.clone()
    };
    let (d, _) = run(false, &pen);
    for (i, t) in d.iter().enumerate() {
        assert!(
            !prompt.contains(t) && !d[..i].contains(t),
            "token {i} ({t}) repeats: {d:?}"
        );
    }
    // Greedy restores the argmax: the same tokens as the session's greedy path.
    let mut s = Gs::new(&gm).unwrap();
    assert!(s.set_sampler(&cfg, &prompt).unwrap());
    assert!(!s.set_sampler(&SamplerConfig::greedy(), &[]).unwrap());
    let g1 = s.greedy(&prompt, 8).unwrap();
    let g2 = Gs::new(&gm).unwrap().greedy(&prompt, 8).unwrap();
    assert_eq!(g1, g2);
    eprintln!(
        "sampled generation: {n} tokens, {distinct} distinct, {waits} host waits for {} replays",
        n - 1
    );
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// `generate` on CUDA with the chained loop (one step queued ahead of the token read, its input
/// the previous pick left on the device) against the loop that waits for each token: the same
/// tokens, text, stop reason and session position, greedy and sampled (device sampler), at the
/// token limit, at a stop string (a queued step past the stop is dropped), and for a second
/// generation after the first (a chat's next turn); one host wait per token.
fn chained_generation(dev: &CudaDevice) -> Option<String> {
    use ferrite_llm::generate::{generate, Generation, StopReason};
    let dir = tmp_dir();
    let model = synth_model(GgmlType::Q4_0, &dir, 2, 256);
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let gm = GpuModel::load(&model, dev, 256).unwrap();
    let prompt: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % 1000).collect();
    let sampled = hot_sampler();
    let run = |chain: bool, cfg: &SamplerConfig, stops: &[String]| -> Vec<(Generation, usize)> {
        let mut s = Session::cuda(&gm, 256).unwrap();
        s.kernels_mut().set_chain(chain);
        assert_eq!(s.chains(), chain);
        let mut out = Vec::new();
        for turn in 0..2 {
            let mut sampler = Sampler::new(cfg.clone()).unwrap();
            let w0 = dev.sync_stats().host_waits;
            let p = &prompt[turn..];
            let g = generate(&mut s, &tok, &mut sampler, p, 40, stops, &mut |_| {}).unwrap();
            let waits = dev.sync_stats().host_waits - w0;
            if chain && g.stop == StopReason::MaxTokens {
                assert_eq!(waits, 40, "one host wait per token");
            }
            out.push((g, s.pos()));
        }
        out
    };
    let greedy = run(false, &SamplerConfig::greedy(), &[]);
    let text = &greedy[0].0.text;
    // a stop string from the middle of the greedy text: a later token ends the generation
    let stop: String = text
        .chars()
        .skip(text.chars().count() / 2)
        .take(3)
        .collect();
    for (cfg, stops) in [
        (SamplerConfig::greedy(), vec![]),
        (sampled.clone(), vec![]),
        (SamplerConfig::greedy(), vec![stop.clone()]),
    ] {
        let (a, b) = (run(false, &cfg, &stops), run(true, &cfg, &stops));
        for ((ga, pa), (gb, pb)) in a.iter().zip(&b) {
            assert_eq!(gb.tokens, ga.tokens, "tokens ({cfg:?}, stops {stops:?})");
            assert_eq!(gb.text, ga.text);
            assert_eq!(gb.stop, ga.stop);
            assert_eq!(pb, pa, "session position after the generation");
        }
        if !stops.is_empty() {
            assert_eq!(b[0].0.stop, StopReason::StopString, "{stop:?} in {text:?}");
        }
    }
    // More steps queued than the kernel set has mailbox slots: the oldest reads are taken
    // when their slots come round again, and every pick still arrives, in order.
    let mut s = Session::cuda(&gm, 256).unwrap();
    assert!(s.chains());
    s.forward_queue(&prompt).unwrap();
    for _ in 0..19 {
        s.forward_chained().unwrap();
    }
    let picks: Vec<u32> = (0..20).map(|_| s.take_pick().unwrap()).collect();
    let mut one = Session::cuda(&gm, 256).unwrap();
    one.kernels_mut().set_chain(false);
    let want = ferrite_llm::generate::greedy(&mut one, &prompt, 20).unwrap();
    assert_eq!(picks, want, "picks queued past the mailbox slots");
    let e = s.take_pick().expect_err("no pick left to read");
    assert!(e.to_string().contains("no queued token read"), "{e}");
    eprintln!(
        "chained decode: greedy {:?}, stop {stop:?}",
        greedy[0].0.text
    );
    let _ = std::fs::remove_dir_all(&dir);
    None
}

fn default_precision_chat_smollm2(dev: &CudaDevice) -> Option<String> {
    let Some(path) = smollm2_path() else {
        return Some("SmolLM2-135M-Instruct.Q4_1.gguf is not in the model cache".into());
    };
    default_precision_chat("SmolLM2", &path, dev);
    None
}

fn default_precision_chat_gemma3(dev: &CudaDevice) -> Option<String> {
    let Some(path) = gemma3_path() else {
        return Some("gemma-3-270m-q4_k_m.gguf is not in the model cache".into());
    };
    default_precision_chat("Gemma3", &path, dev);
    None
}

/// The GPU with its default precision (none chosen): the greedy answer to each question of
/// `fixtures/chat_questions.txt` equals the CPU exact path's over its first 12 tokens (the
/// twin of the CPU test `default_precision_keeps_chat_answers`).
fn default_precision_chat(label: &str, path: &std::path::Path, dev: &CudaDevice) {
    use ferrite_llm::chat::{encode_prompt, ChatTemplate, Message};
    let mut model = Model::load(path).unwrap();
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let tmpl = ChatTemplate::from_gguf(model.gguf(), &tok).unwrap();
    let questions = std::fs::read_to_string(fixture("chat_questions.txt")).unwrap();
    let gm = GpuModel::load(&model, dev, 256).unwrap();
    eprintln!("{label}: GPU default precision {}", gm.precision());
    model.set_precision(Precision::Exact);
    let cut = |mut g: Vec<u32>| {
        if let Some(e) = g.iter().position(|&t| tok.is_eog(t)) {
            g.truncate(e + 1);
        }
        g
    };
    for q in questions.lines().filter(|l| !l.trim().is_empty()) {
        let text = tmpl.render(&[Message::user(q)], true).unwrap();
        let ids = encode_prompt(&tok, &text).unwrap();
        let mut cs = Session::new(&model, ids.len() + 12).unwrap();
        let want = cut(ferrite_llm::generate::greedy(&mut cs, &ids, 12).unwrap());
        let mut gs = Gs::new(&gm).unwrap();
        let got = cut(gs.greedy(&ids, 12).unwrap());
        assert_eq!(
            got,
            want,
            "{label}: {q:?}: GPU {:?} vs CPU exact {:?}",
            tok.decode(&got),
            tok.decode(&want)
        );
    }
}

// ---- The engine on CUDA (model/cuda.rs: the CUDA kernel set of the one model definition) ----

/// A request's greedy tokens and the logits each was chosen from.
type Run = (Vec<u32>, Vec<Vec<f32>>);

fn engine_cfg() -> EngineConfig {
    EngineConfig {
        ctx: 96,
        kv_blocks: 64,
        max_seqs: 8,
        // Prompts arrive in chunks of at most 12 tokens per step, beside decode tokens.
        step_tokens: 12,
    }
}

fn prompt(n: usize, salt: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729 + 13) % (vocab - 1)) as u32)
        .collect()
}

/// The batch scenario's prompts, in order of arrival: (prompt, phase). Phase 0 arrives at
/// once; phase 1 once the first prompt has its first token (shares its first two full blocks,
/// and exactly its first block: copy-on-write); phase 2 after all ended (its blocks come from
/// the cache of finished prefixes).
fn scenario(vocab: usize) -> Vec<(Vec<u32>, usize)> {
    let bs = BLOCK_SIZE;
    let base = prompt(48, 1, vocab);
    let a = base[..2 * bs + 1].to_vec();
    let mut c = base[..2 * bs].to_vec();
    c.extend(prompt(3, 4, vocab));
    vec![
        (a.clone(), 0),
        (prompt(5, 2, vocab), 0),
        (prompt(bs + 4, 3, vocab), 0),
        (c, 1),
        (base[..bs].to_vec(), 1),
        (a, 2),
    ]
}

/// Runs the scenario (or, with `alone`, each prompt in an engine of its own) through engines
/// made by `make`; returns each request's run in scenario order.
fn run_scenario<K: EngineKernels>(
    make: &mut dyn FnMut() -> Engine<'static, K>,
    vocab: usize,
    n_new: usize,
    alone: bool,
) -> Vec<Run> {
    let sc = scenario(vocab);
    if alone {
        return sc
            .iter()
            .map(|(p, _)| {
                let mut e = make();
                e.set_keep_logits(true);
                let id = e.add_request(Request::greedy(p.clone(), n_new)).unwrap();
                let mut runs = HashMap::new();
                drain_engine(&mut e, &mut runs, None);
                runs.remove(&id).unwrap()
            })
            .collect();
    }
    let mut e = make();
    e.set_keep_logits(true);
    let mut ids = Vec::new();
    let mut runs: HashMap<RequestId, Run> = HashMap::new();
    for phase in 0..3 {
        // Prefix hits are counted when a request is admitted.
        let before = e.stats().kv.prefix_hit_positions;
        for (p, _) in sc.iter().filter(|(_, ph)| *ph == phase) {
            ids.push(e.add_request(Request::greedy(p.clone(), n_new)).unwrap());
        }
        let hits = e.stats().kv.prefix_hit_positions;
        match phase {
            0 => drain_engine(&mut e, &mut runs, Some(ids[0])),
            1 => {
                assert_eq!(hits, (3 * BLOCK_SIZE - 1) as u64, "shared prefixes");
                drain_engine(&mut e, &mut runs, None);
                assert_eq!(e.stats().kv.blocks_used, 0, "every block is released");
            }
            _ => {
                assert!(
                    hits >= before + 2 * BLOCK_SIZE as u64,
                    "a reuses its own cached blocks: {} new hit positions",
                    hits - before
                );
                drain_engine(&mut e, &mut runs, None);
            }
        }
    }
    ids.iter().map(|id| runs.remove(id).unwrap()).collect()
}

fn drain_engine<K: EngineKernels>(
    e: &mut Engine<'_, K>,
    runs: &mut HashMap<RequestId, Run>,
    until_first_of: Option<RequestId>,
) {
    while e.has_work() {
        let outs = e.step().unwrap();
        let mut stop = false;
        for o in outs {
            let r = runs.entry(o.id).or_default();
            r.1.push(e.last_logits(o.id).unwrap().to_vec());
            r.0.extend(o.token);
            stop |= Some(o.id) == until_first_of;
        }
        if stop {
            return;
        }
    }
}

/// The largest |a - b| over the steps where both runs had the same tokens so far, relative
/// to the largest |logit| of b; and how many steps that covered.
fn run_diff(a: &Run, b: &Run) -> (f32, usize) {
    let spread = b.1.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
    let mut worst = 0f32;
    let mut steps = 0;
    for i in 0..a.1.len().min(b.1.len()) {
        if a.0[..i] != b.0[..i] {
            break;
        }
        let d = a.1[i]
            .iter()
            .zip(&b.1[i])
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        worst = worst.max(d / spread);
        steps += 1;
    }
    (worst, steps)
}

/// Leaks `v` for the engines' `'static` borrows inside one test (a few models per run).
fn leak<T>(v: T) -> &'static T {
    Box::leak(Box::new(v))
}

/// The CUDA engine's scenario against the same prompts alone on CUDA (tokens equal, logits
/// equal bit for bit: every kernel computes a row independently) and against the CPU engine
/// (logits within `tol` of the largest |logit| while the tokens agree; greedy tokens must
/// agree on at least the first step of every request). Returns (worst CPU difference,
/// requests whose tokens all match the CPU's).
fn engine_vs(
    name: &str,
    model: &'static Model,
    dev: &CudaDevice,
    layout: Layout,
    n_new: usize,
    tol: f32,
) -> (f32, usize) {
    engine_vs_tc(name, model, dev, layout, n_new, tol, None, false)
}

/// `engine_vs` with the int8 tensor-core products for steps of 2 rows or more (then a
/// request's logits depend on its step in the last bits, so batched = alone is not checked).
fn engine_vs_mma(
    name: &str,
    model: &'static Model,
    dev: &CudaDevice,
    layout: Layout,
    n_new: usize,
    tol: f32,
) -> (f32, usize) {
    engine_vs_tc(name, model, dev, layout, n_new, tol, None, true)
}

/// `engine_vs`; with `tc` = (rows, flash rows), steps of at least that many rows take the
/// tensor-core products and their prompt chunks of at least flash rows the flash attention
/// op, with `mma` fast-mode products of 2 rows or more the int8 tensor-core kernels (then a
/// request's logits depend on its step, so batched = alone is not checked).
#[allow(clippy::too_many_arguments)]
fn engine_vs_tc(
    name: &str,
    model: &'static Model,
    dev: &CudaDevice,
    layout: Layout,
    n_new: usize,
    tol: f32,
    tc: Option<(usize, usize)>,
    mma: bool,
) -> (f32, usize) {
    let name = &format!("{name} ({layout:?} layout, tensor-core rows {tc:?}, int8 mma {mma})");
    let gm = leak(GpuModel::load_with(model, dev, engine_cfg().ctx, layout).unwrap());
    let vocab = model.cfg.vocab;
    let mut cuda = || {
        let mut e = Engine::cuda(gm, engine_cfg()).unwrap();
        e.kernels_mut()
            .set_tensor_core_rows(tc.map_or(usize::MAX, |t| t.0));
        e.kernels_mut()
            .set_flash_rows(tc.map_or(usize::MAX, |t| t.1));
        e.kernels_mut()
            .set_mma_rows(if mma { 2 } else { usize::MAX });
        e
    };
    let batched = run_scenario(&mut cuda, vocab, n_new, false);
    let alone = if tc.is_none() && !mma {
        run_scenario(&mut cuda, vocab, n_new, true)
    } else {
        Vec::new()
    };
    for (i, (b, a)) in batched.iter().zip(&alone).enumerate() {
        assert_eq!(
            b.0, a.0,
            "{name}: request {i}: batched tokens differ from alone"
        );
        let (d, _) = run_diff(b, a);
        assert!(
            d == 0.0,
            "{name}: request {i}: batched logits differ from alone by {d:.3e} of the range"
        );
    }
    let mut cpu = || Engine::new(model, engine_cfg()).unwrap();
    let cpu_runs = run_scenario(&mut cpu, vocab, n_new, false);
    let mut worst = 0f32;
    let mut same = 0;
    for (i, (g, c)) in batched.iter().zip(&cpu_runs).enumerate() {
        let (d, steps) = run_diff(g, c);
        // A different first token is allowed only where it is a near tie on the CPU: its CPU
        // logit within the stated tolerance (of the logit range) of the CPU's pick. 16-bit
        // operands (tensor-core runs) and 8-bit activations quantized on another device round
        // differently.
        let (gt, ct) = (g.0[0] as usize, c.0[0] as usize);
        let cl = &c.1[0];
        let range = cl.iter().fold(0f32, |m, v| m.max(v.abs()));
        let gap = (cl[ct] - cl[gt]) / range;
        assert!(
            steps >= 1 && (gt == ct || gap <= tol),
            "{name}: request {i}: first token {gt} vs CPU {ct} (CPU logit gap {gap:.3e} of the range)"
        );
        assert!(d <= tol, "{name}: request {i}: logits differ from the CPU engine by {d:.3e} of the range (tolerance {tol:.1e})");
        worst = worst.max(d);
        same += usize::from(g.0 == c.0);
    }
    eprintln!(
        "{name}: CUDA engine vs CPU engine: logits within {worst:.2e} of the range; {same}/{} requests with all tokens equal",
        batched.len()
    );
    (worst, same)
}

/// Exact mode (f32 activations) on both: synthetic 2-layer models of every format.
fn engine_synthetic(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    for quant in QUANTS {
        let mut model = synth_model(quant, &dir, 2, 256);
        model.set_precision(Precision::Exact);
        let model = leak(model);
        // f16 KV cache and summation order (the decode tests measure 4-6e-4 absolute on
        // logits of order 1), plus f16 rounding of formats the GPU converts.
        let tol = if converted(quant) { 5e-3 } else { 2e-3 };
        // GGUF rows (staged kernels) and split rows (register kernels) where the format has them
        for layout in [Layout::Gguf, Layout::Split] {
            let name = format!("synthetic {quant}");
            let (_, same) = engine_vs(&name, model, dev, layout, 6, tol);
            assert!(
                same >= 4,
                "{name}: only {same}/6 requests with all tokens as the CPU's"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// The fast mode (8-bit activations): batched equals alone bit for bit; against the CPU's
/// Q8 mode within the decode tests' q8 tolerance (max 0.1 absolute on logits of order 1).
fn engine_synthetic_q8(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    for quant in Q8_TYPES.into_iter().filter(|q| QUANTS.contains(q)) {
        let mut model = synth_model(quant, &dir, 2, 256);
        model.set_precision(Precision::Q8);
        let model = leak(model);
        let spread = 4.0; // |logit| reaches ~4 on these models
                          // split rows: the batched register kernels (8 rows a block, steps of up to 12 rows)
        for layout in [Layout::Gguf, Layout::Split] {
            let name = format!("synthetic {quant} q8");
            engine_vs(&name, model, dev, layout, 6, 0.1 / spread);
            engine_vs_mma(&name, model, dev, layout, 6, 0.1 / spread);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    None
}

fn engine_smollm2(dev: &CudaDevice) -> Option<String> {
    let Some(path) = smollm2_path() else {
        return Some("SmolLM2-135M-Instruct.Q4_1.gguf is not in the model cache".into());
    };
    let mut model = Model::load(&path).unwrap();
    model.set_precision(Precision::Exact);
    let model = leak(model);
    let (d, same) = engine_vs("SmolLM2 exact", model, dev, Layout::Auto, 12, 2e-2);
    assert!(
        same >= 5,
        "SmolLM2: {same}/6 requests with all tokens as the CPU's (max diff {d:.2e})"
    );
    // the default large steps (32 rows and more: the 48-token prompt): the int8 tensor-core
    // products with q8x2 inputs and the flash attention
    let tc = Some((TENSOR_CORE_ROWS_F32, 16));
    let (d, same) = engine_vs_tc(
        "SmolLM2 exact",
        model,
        dev,
        Layout::Auto,
        12,
        2e-2,
        tc,
        false,
    );
    assert!(
        same >= 5,
        "SmolLM2 large steps: {same}/6 requests with all tokens as the CPU's (max diff {d:.2e})"
    );
    let mut model = Model::load(&path).unwrap();
    model.set_precision(Precision::Q8);
    // The CPU docs put its own Q8 mode 0.4-0.5 rms from exact; the GPU's q8 inputs differ
    // from the CPU's by rounding flips, so only batched = alone is strict here.
    let model = leak(model);
    engine_vs("SmolLM2 q8", model, dev, Layout::Split, 12, 0.1);
    engine_vs_mma("SmolLM2 q8", model, dev, Layout::Split, 12, 0.1);
    None
}

fn engine_gemma3(dev: &CudaDevice) -> Option<String> {
    let Some(path) = gemma3_path() else {
        return Some("gemma-3-270m-q4_k_m.gguf is not in the model cache".into());
    };
    let mut model = Model::load(&path).unwrap();
    model.set_precision(Precision::Exact);
    // The decode test's tolerance (0.15 absolute on Gemma-3's large logits).
    let model = leak(model);
    engine_vs("Gemma3 exact", model, dev, Layout::Auto, 8, 2e-2);
    // the default large steps, as for SmolLM2
    let tc = Some((TENSOR_CORE_ROWS_F32, 16));
    engine_vs_tc("Gemma3 exact", model, dev, Layout::Auto, 8, 2e-2, tc, false);
    None
}

/// Decode-only steps replayed from the per-bucket graphs give the same tokens and logits
/// as eager launches, bit for bit; batch sizes 1..=5 visit buckets 1, 2, 4 and 8.
fn engine_graphs(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    let model = leak(synth_model(GgmlType::Q4_0, &dir, 2, 256));
    // split rows: the batched register kernels, q8 (the llama default precision)
    let gm = leak(GpuModel::load_with(model, dev, 96, Layout::Split).unwrap());
    let vocab = model.cfg.vocab;
    let go = |graphs: bool| {
        let mut e = Engine::cuda(gm, engine_cfg()).unwrap();
        e.kernels_mut().set_graphs(graphs);
        e.set_keep_logits(true);
        let mut runs = HashMap::new();
        let mut ids = Vec::new();
        for i in 0..5 {
            // staggered lengths: requests end one after another, so the batch shrinks
            let p = prompt(3 + i, 10 + i, vocab);
            ids.push(e.add_request(Request::greedy(p, 8 + 4 * i)).unwrap());
        }
        drain_engine(&mut e, &mut runs, None);
        let stats = e.kernels().graph_stats();
        (
            ids.iter()
                .map(|id| runs.remove(id).unwrap())
                .collect::<Vec<_>>(),
            stats,
        )
    };
    let (eager, s0) = go(false);
    let (graph, (captured, replays)) = go(true);
    assert_eq!(s0, (0, 0));
    assert!(
        captured >= 3 && replays >= 10,
        "graphs {captured}, replays {replays}"
    );
    for (i, (a, b)) in graph.iter().zip(&eager).enumerate() {
        assert_eq!(a.0, b.0, "request {i}: graph tokens differ from eager");
        assert!(a.1 == b.1, "request {i}: graph logits differ from eager");
    }
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// Cancelling frees a request's blocks at once; unknown or finished ids are a no-op; the
/// other requests go on with the tokens they have alone.
fn engine_cancel(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    let model = leak(synth_model(GgmlType::Q8_0, &dir, 2, 256));
    let gm = leak(GpuModel::load(model, dev, 96).unwrap());
    let vocab = model.cfg.vocab;
    let mut e = Engine::cuda(gm, engine_cfg()).unwrap();
    e.set_keep_logits(true);
    let long = e
        .add_request(Request::greedy(prompt(40, 5, vocab), 20))
        .unwrap();
    let short = e
        .add_request(Request::greedy(prompt(10, 6, vocab), 4))
        .unwrap();
    for _ in 0..6 {
        e.step().unwrap();
    }
    let used = e.stats().kv.blocks_used;
    assert!(e.cancel(long));
    assert!(
        e.stats().kv.blocks_used < used,
        "cancel frees the blocks at once"
    );
    assert!(!e.cancel(long));
    assert!(!e.cancel(RequestId(999)));
    let mut runs = HashMap::new();
    drain_engine(&mut e, &mut runs, None);
    assert_eq!(e.stats().kv.blocks_used, 0);
    let mut alone = Engine::cuda(gm, engine_cfg()).unwrap();
    let id = alone
        .add_request(Request::greedy(prompt(10, 6, vocab), 4))
        .unwrap();
    let want = alone.run_to_end().unwrap();
    assert_eq!(want[0].0, id);
    let got: Vec<u32> = runs.get(&short).map(|r| r.0.clone()).unwrap_or_default();
    // the short request's first tokens came out before the drain
    assert!(want[0].1.ends_with(&got), "{got:?} vs {:?}", want[0].1);
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// Passes the logits through unchanged: a request with it samples on the host.
struct HostSampling;

impl ferrite_llm::logits_processor::LogitsProcessor for HostSampling {
    fn process(&mut self, _logits: &mut [f32], _history: &[u32]) -> ferrite_llm::Result<()> {
        Ok(())
    }
    fn accept(&mut self, _token: u32) {}
}

/// Requests that sample (not greedy) draw their tokens on the device, every such row of a
/// step in one launch (`sample_rows`), beside greedy requests:
/// - each drawn token is the device sampler's for its row of the step's logits: `sample_once`
///   on the logits the engine kept (after the penalties, so drawn again without them), with
///   that request's seed and draw count;
/// - the penalties start from the prompt: the first step's penalized logits equal the host
///   sampler's on the same logits (the same request with a pass-through processor samples on
///   the host);
/// - the tokens do not depend on reading the logits to the host, and a request drawn in a
///   batch gets the tokens it gets alone (its logits are the same bits);
/// - cancelling a sampling request ends it like any other.
fn engine_device_sampling(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    let model = leak(synth_model(GgmlType::Q4_0, &dir, 2, 256));
    let gm = leak(GpuModel::load(model, dev, 96).unwrap());
    let vocab = model.cfg.vocab;
    let plain = SamplerConfig {
        temperature: 1.3,
        top_k: 50,
        top_p: 0.95,
        min_p: 0.0,
        repeat_penalty: 1.0,
        seed: 11,
        ..SamplerConfig::default()
    };
    let penal = SamplerConfig {
        temperature: 0.9,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.02,
        repeat_penalty: 1.3,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        penalty_last_n: 16,
        seed: 5,
    };
    let n_new = 24;
    let reqs = [
        (prompt(12, 1, vocab), SamplerConfig::greedy()),
        (prompt(30, 2, vocab), plain.clone()),
        (prompt(7, 3, vocab), penal.clone()),
        (prompt(7, 3, vocab), SamplerConfig::greedy()),
    ];
    let request = |k: usize| Request {
        sampling: reqs[k].1.clone(),
        ..Request::greedy(reqs[k].0.clone(), n_new)
    };
    // (requests to add, keep the logits, index of a request sampled on the host)
    let run = |which: &[usize], keep: bool, host: Option<usize>| -> Vec<Run> {
        let mut e = Engine::cuda(gm, engine_cfg()).unwrap();
        e.set_keep_logits(keep);
        let ids: Vec<RequestId> = which
            .iter()
            .map(|&k| {
                let p: Option<Box<dyn ferrite_llm::logits_processor::LogitsProcessor>> =
                    (host == Some(k)).then(|| Box::new(HostSampling) as _);
                e.add_request_with(request(k), p).unwrap()
            })
            .collect();
        let mut runs: HashMap<RequestId, Run> = HashMap::new();
        while e.has_work() {
            for o in e.step().unwrap() {
                let r = runs.entry(o.id).or_default();
                if keep {
                    r.1.push(e.last_logits(o.id).unwrap().to_vec());
                }
                r.0.extend(o.token);
            }
        }
        ids.iter().map(|id| runs.remove(id).unwrap()).collect()
    };
    let kept = run(&[0, 1, 2], true, None);
    let unread = run(&[0, 1, 2], false, None);
    for k in 0..3 {
        assert_eq!(
            kept[k].0.len(),
            n_new,
            "request {k}: {} tokens",
            kept[k].0.len()
        );
        assert_eq!(
            kept[k].0, unread[k].0,
            "request {k}: its tokens depend on reading the logits"
        );
    }
    for (i, (t, l)) in kept[0].0.iter().zip(&kept[0].1).enumerate() {
        assert_eq!(*t, argmax(l), "greedy request, token {i}");
    }
    for (k, cfg) in [(1usize, &plain), (2, &penal)] {
        let nopen = SamplerConfig {
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            ..cfg.clone()
        };
        for (i, (t, l)) in kept[k].0.iter().zip(&kept[k].1).enumerate() {
            let buf = up(dev, l);
            let want =
                ferrite_llm::gpu::sample_once(dev, &nopen, &buf, vocab, &[], i as u64).unwrap();
            assert_eq!(
                *t, want,
                "request {k}, token {i}: not the device sampler's draw"
            );
        }
        let distinct: std::collections::HashSet<_> = kept[k].0.iter().collect();
        assert!(distinct.len() > 3, "request {k} drew {:?}", kept[k].0);
    }
    // The penalized request's first logits, penalized on the device and on the host, and
    // unpenalized (request 3: its prompt, greedy; a row's logits do not depend on the batch).
    let host = run(&[0, 1, 2], true, Some(2));
    let raw = run(&[3], true, None);
    let (d, h, r) = (&kept[2].1[0], &host[2].1[0], &raw[0].1[0]);
    for (j, (a, b)) in d.iter().zip(h).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6 * b.abs().max(1.0),
            "logit {j}: device penalty {a}, host {b}"
        );
        let recent = reqs[2].0.contains(&(j as u32));
        assert_eq!(a != &r[j], recent, "logit {j}: penalized {a}, raw {}", r[j]);
    }
    let alone2 = run(&[2], false, None);
    assert_eq!(alone2[0].0, kept[2].0, "request 2 alone draws other tokens");
    let alone = run(&[1], false, None);
    assert_eq!(alone[0].0, kept[1].0, "request 1 alone draws other tokens");
    // Cancelling a request that samples on the device.
    let mut e = Engine::cuda(gm, engine_cfg()).unwrap();
    let a = e.add_request(request(1)).unwrap();
    let b = e.add_request(request(2)).unwrap();
    for _ in 0..5 {
        e.step().unwrap();
    }
    assert!(e.cancel(a));
    let rest = e.run_to_end().unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].0, b);
    assert_eq!(e.stats().kv.blocks_used, 0);
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// Steps of many rows through the tensor-core products (cuBLASLt): here every step of 8 rows
/// or more (prompt chunks beside decode rows), against the CPU engine. Exact mode takes f32
/// operands there (the decode steps' tolerance class: f16 KV cache and summation order); q8
/// mode 16-bit ones (f16 rounding of activations and weights: the old batched prefill's).
fn engine_tensor_core(dev: &CudaDevice) -> Option<String> {
    let dir = tmp_dir();
    for quant in [
        GgmlType::Q4_0,
        GgmlType::Q4_K,
        GgmlType::Q8_0,
        GgmlType::F16,
    ] {
        for precision in [Precision::Exact, Precision::Q8] {
            let mut model = synth_model(quant, &dir, 2, 256);
            model.set_precision(precision);
            // Prompt chunks attend on the flash op in exact mode, row by row in q8 mode.
            let flash = if precision == Precision::Exact {
                2
            } else {
                usize::MAX
            };
            let name = format!("synthetic {quant} {precision:?}, flash rows {flash}");
            let tol = match precision {
                Precision::Exact if converted(quant) => 5e-3,
                Precision::Exact => 2e-3,
                _ => 3e-2,
            };
            engine_vs_tc(
                &name,
                leak(model),
                dev,
                Layout::Auto,
                6,
                tol,
                Some((8, flash)),
                false,
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// The engine's batched product (`ops::matvec_rows`: a launch over R input rows, 8 rows per
/// block in the fast mode's register kernels) equals R one-row launches bit for bit, for
/// every mode (store, add, GLU), both weight layouts, f32 and q8 activations, with the RMS
/// norm and biases, at row counts around the 8-row groups.
fn matvec_rows_equal_one_row_launches(dev: &CudaDevice) -> Option<String> {
    for (i, ty) in Q8_TYPES.into_iter().chain([GgmlType::F16]).enumerate() {
        let (rows_w, cols) = (96usize, 512usize);
        for split in layouts(ty, cols) {
            let seed = 900 + i as u64;
            let (g, _) = rand_matrix_with(dev, ty, rows_w, cols, seed, split);
            let (u, _) = rand_matrix_with(dev, ty, rows_w, cols, seed + 1, split);
            let bias = up(dev, &Rng(seed + 2).vec(rows_w));
            let norm = up(dev, &Rng(seed + 3).vec(cols));
            let q8s: &[bool] = if ty == GgmlType::F16 {
                &[false]
            } else {
                &[false, true]
            };
            for &q8 in q8s {
                for n in [1usize, 3, 8, 9, 17] {
                    let x: Vec<f32> = Rng(seed + 4 + n as u64).vec(n * cols);
                    let xb = up(dev, &x);
                    for mode in [Mode::Store, Mode::Add, Mode::GluSilu] {
                        let glu = mode == Mode::GluSilu;
                        let segs: Vec<Seg<'_>> = if glu {
                            vec![
                                Seg {
                                    w: &g,
                                    bias: None,
                                    out_off: 0,
                                },
                                Seg {
                                    w: &u,
                                    bias: None,
                                    out_off: 0,
                                },
                            ]
                        } else {
                            vec![
                                Seg {
                                    w: &g,
                                    bias: Some(&bias),
                                    out_off: 0,
                                },
                                Seg {
                                    w: &u,
                                    bias: None,
                                    out_off: rows_w,
                                },
                            ]
                        };
                        let ostride = if glu { rows_w } else { 2 * rows_w } + 5;
                        let init: Vec<f32> = Rng(seed + 9).vec(n * ostride);
                        let batched = up(dev, &init);
                        let nb = Some((&norm, 1e-5f32));
                        ops::matvec_rows(dev, &segs, mode, &xb, nb, &batched, n, ostride, q8)
                            .unwrap();
                        let got = read(dev, &batched, n * ostride);
                        for r in 0..n {
                            let xr = up(dev, &x[r * cols..(r + 1) * cols]);
                            let one = up(dev, &init[r * ostride..(r + 1) * ostride]);
                            ops::matvec_rows(dev, &segs, mode, &xr, nb, &one, 1, ostride, q8)
                                .unwrap();
                            let want = read(dev, &one, ostride);
                            let row = &got[r * ostride..(r + 1) * ostride];
                            assert!(
                                row.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{ty} split {split} q8 {q8} {mode:?} rows {n}: row {r} differs from its one-row launch"
                            );
                        }
                    }
                }
            }
        }
    }
    None
}

/// The int8 tensor-core kernels (`ops::matvec_rows_mma`) against the batched register kernels
/// (`ops::matvec_rows` in the fast mode: the same 8-bit inputs and the same per-unit terms,
/// checked against the CPU's Q8 mode by `matvec_q8_every_format`): every split 32-element
/// format, every mode, row counts around the 8-row tiles and the 64-row block groups, weight
/// rows not a multiple of the 32-row warp tile (split rows hold a multiple of 8 units, so
/// always whole 4-unit stages).
/// Only the order of the f32 sums differs: within 2e-5 of the largest output.
fn matvec_rows_mma_match_register_kernels(dev: &CudaDevice) -> Option<String> {
    if dev.compute_capability().0 < 8 {
        return Some(format!(
            "the int8 tensor-core kernels need sm_80 or later; this device is sm_{}{}",
            dev.compute_capability().0,
            dev.compute_capability().1
        ));
    }
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ];
    for (i, ty) in types.into_iter().enumerate() {
        for (rows_w, cols) in [(96usize, 512usize), (200, 1792)] {
            let seed = 1300 + i as u64 + cols as u64;
            let (g, _) = rand_matrix_with(dev, ty, rows_w, cols, seed, true);
            let (u, _) = rand_matrix_with(dev, ty, rows_w, cols, seed + 1, true);
            let bias = up(dev, &Rng(seed + 2).vec(rows_w));
            let norm = up(dev, &Rng(seed + 3).vec(cols));
            for n in [2usize, 7, 8, 9, 17, 33, 64, 70] {
                let x: Vec<f32> = Rng(seed + 4 + n as u64).vec(n * cols);
                let xb = up(dev, &x);
                for mode in [Mode::Store, Mode::Add, Mode::GluSilu] {
                    let glu = mode == Mode::GluSilu;
                    let segs: Vec<Seg<'_>> = if glu {
                        vec![
                            Seg {
                                w: &g,
                                bias: None,
                                out_off: 0,
                            },
                            Seg {
                                w: &u,
                                bias: Some(&bias),
                                out_off: 0,
                            },
                        ]
                    } else {
                        vec![
                            Seg {
                                w: &g,
                                bias: Some(&bias),
                                out_off: 0,
                            },
                            Seg {
                                w: &u,
                                bias: None,
                                out_off: rows_w,
                            },
                        ]
                    };
                    let ostride = if glu { rows_w } else { 2 * rows_w } + 5;
                    let init: Vec<f32> = Rng(seed + 9).vec(n * ostride);
                    let nb = Some((&norm, 1e-5f32));
                    let b = up(dev, &init);
                    ops::matvec_rows(dev, &segs, mode, &xb, nb, &b, n, ostride, true).unwrap();
                    let want = read(dev, &b, n * ostride);
                    for split in [false, true] {
                        let a = up(dev, &init);
                        ops::matvec_rows_mma(dev, &segs, mode, &xb, nb, &a, n, ostride, split)
                            .unwrap();
                        let got = read(dev, &a, n * ostride);
                        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
                        let (worst, at) = got
                            .iter()
                            .zip(&want)
                            .enumerate()
                            .map(|(k, (a, b))| ((a - b).abs(), k))
                            .fold(
                                (0f32, 0),
                                |m, v| if v.0 > m.0 || v.0.is_nan() { v } else { m },
                            );
                        assert!(
                        worst <= 2e-5 * scale && got.iter().all(|v| v.is_finite()),
                        "{ty} {rows_w}x{cols} {mode:?} rows {n} split K {split}: int8 mma differs from the register kernels by {worst:.3e} (largest output {scale:.3e}) at element {at}: {} vs {}",
                        got[at], want[at]
                    );
                    }
                }
            }
        }
    }
    None
}

/// The prefill's products of models on f32 activations (`ops::matvec_rows_q8x2`: int8 tensor
/// cores, two-level inputs): every format they take (Q4_K and Q6_K through 32-element units),
/// split and GGUF rows, batches across the
/// 8-row tiles and block groups, Store / Add / GLU, against an f64 product of the CPU's q8x2
/// values (same quantization, so only summation order differs: 2e-5 of sum |w x|), and against
/// the exact f32 inputs (the q8x2 rounding: within 1e-4 of sum |w x|).
fn matvec_rows_q8x2_mma(dev: &CudaDevice) -> Option<String> {
    if dev.compute_capability().0 < 8 {
        return Some(format!(
            "the int8 tensor-core kernels need sm_80 or later; this device is sm_{}{}",
            dev.compute_capability().0,
            dev.compute_capability().1
        ));
    }
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ];
    for (i, ty) in types.into_iter().enumerate() {
        // 576 columns: 18 units (a partial stage), GGUF rows (copied into padded split rows);
        // Q4_K and Q6_K (converted to 32-element units) in rows of 256-element blocks
        let shapes = if matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
            [(96usize, 512usize, false), (200, 2048, true)]
        } else {
            [(96, 576, false), (200, 1792, true)]
        };
        for (rows_w, cols, split) in shapes {
            let seed = 2100 + i as u64 + cols as u64;
            let (g, wg) = rand_matrix_with(dev, ty, rows_w, cols, seed, split);
            let (u, wu) = rand_matrix_with(dev, ty, rows_w, cols, seed + 1, split);
            for n in [2usize, 9, 64, 70, 130] {
                // magnitudes spread across units; a rounding tie in row 0
                let mut x: Vec<f32> = Rng(seed + 4 + n as u64)
                    .vec(n * cols)
                    .iter()
                    .enumerate()
                    .map(|(k, v)| v * (1.0 + (k / 32 % 7) as f32))
                    .collect();
                x[0] = 127.0;
                x[1] = 0.5;
                let xq: Vec<f32> = x.chunks(cols).flat_map(q8x2_values).collect();
                let xb = up(dev, &x);
                for mode in [Mode::Store, Mode::Add, Mode::GluSilu] {
                    let glu = mode == Mode::GluSilu;
                    let segs = [
                        Seg {
                            w: &g,
                            bias: None,
                            out_off: 0,
                        },
                        Seg {
                            w: &u,
                            bias: None,
                            out_off: if glu { 0 } else { rows_w },
                        },
                    ];
                    let ostride = if glu { rows_w } else { 2 * rows_w } + 3;
                    let init: Vec<f32> = Rng(seed + 9).vec(n * ostride);
                    let out = up(dev, &init);
                    ops::matvec_rows_q8x2(dev, &segs, mode, &xb, None, &out, n, ostride).unwrap();
                    let got = read(dev, &out, n * ostride);
                    for r in 0..n {
                        let (xr, xe) = (&xq[r * cols..][..cols], &x[r * cols..][..cols]);
                        let (gq, ge) = (
                            ref_matvec(&wg, xr, rows_w, cols),
                            ref_matvec(&wg, xe, rows_w, cols),
                        );
                        let (uq, ue) = (
                            ref_matvec(&wu, xr, rows_w, cols),
                            ref_matvec(&wu, xe, rows_w, cols),
                        );
                        for o in 0..rows_w {
                            let silu = |v: f64| v / (1.0 + (-v).exp());
                            // (value from q8x2 inputs, from exact inputs, its scale, output index)
                            let mut checks = Vec::new();
                            if glu {
                                let scale = gq[o].1 * uq[o].0.abs().max(1.0)
                                    + uq[o].1 * silu(gq[o].0).abs();
                                checks.push((
                                    silu(gq[o].0) * uq[o].0,
                                    silu(ge[o].0) * ue[o].0,
                                    scale,
                                    o,
                                ));
                            } else {
                                let base = |k: usize| {
                                    if mode == Mode::Add {
                                        init[r * ostride + k] as f64
                                    } else {
                                        0.0
                                    }
                                };
                                checks.push((base(o) + gq[o].0, base(o) + ge[o].0, gq[o].1, o));
                                checks.push((
                                    base(rows_w + o) + uq[o].0,
                                    base(rows_w + o) + ue[o].0,
                                    uq[o].1,
                                    rows_w + o,
                                ));
                            }
                            for (want, exact, scale, k) in checks {
                                let v = got[r * ostride + k] as f64;
                                assert!(
                                    (v - want).abs() <= 2e-5 * scale + 1e-5 && (v - exact).abs() <= 1e-4 * scale + 1e-5,
                                    "{ty} {rows_w}x{cols} {mode:?} rows {n}: row {r} output {k}: gpu {v}, cpu q8x2 {want}, exact {exact} (scale {scale})"
                                );
                            }
                        }
                    }
                    // outputs past the rows (the row stride's padding) are untouched
                    let pad = if glu { rows_w } else { 2 * rows_w };
                    for r in 0..n {
                        for k in pad..ostride {
                            assert_eq!(got[r * ostride + k], init[r * ostride + k], "{ty} padding");
                        }
                    }
                }
            }
        }
    }
    None
}

/// A product whose split-K sums also quantize the next product's input
/// (`MvLaunch::quantizing_next`) gives the same output, the same two-level bytes as the next
/// product's own quantization (with and without its RMS norm) and so the same next output,
/// bit for bit, at SmolLM2's shapes (attention output -> q/k/v, down -> gate/up).
fn q8x2_split_sums_quantize_next(dev: &CudaDevice) -> Option<String> {
    if dev.compute_capability().0 < 8 {
        return Some("the int8 tensor-core kernels need sm_80 or later".into());
    }
    let mut fused = 0;
    // (format, a's outputs, a's columns, b's outputs, rows)
    let cases = [
        (GgmlType::Q4_1, 576, 576, 960, 512),
        (GgmlType::Q4_1, 576, 1536, 1536, 512),
        (GgmlType::Q4_0, 576, 576, 960, 64),
        (GgmlType::Q8_0, 256, 512, 256, 130),
    ];
    for (i, (ty, na, ca, nb, rows)) in cases.into_iter().enumerate() {
        let seed = 4200 + 10 * i as u64;
        // GGUF rows: the pair makes the split-row copies the prefill reads
        let (wa, _) = rand_matrix_with(dev, ty, na, ca, seed, false);
        let (wb, _) = rand_matrix_with(dev, ty, nb, na, seed + 1, false);
        let x = up(dev, &Rng(seed + 2).vec(rows * ca));
        let init = Rng(seed + 3).vec(rows * na);
        let g: Vec<f32> = Rng(seed + 4).vec(na).iter().map(|v| 1.0 + v).collect();
        let gb = up(dev, &g);
        let seg = |w| Seg {
            w,
            bias: None,
            out_off: 0,
        };
        for mode in [Mode::Add, Mode::Store] {
            for norm in [Some((&gb, 1e-5f32)), None] {
                let pair = ((&[seg(&wa)][..], mode), &seg(&wb));
                let [(f0, q0, a0, b0), (f1, q1, a1, b1)] =
                    q8x2_pair_unfused_and_fused(dev, pair, (&x, norm), &init, nb, rows);
                let what = format!(
                    "{ty} {na}x{ca} then {nb}, {rows} rows, {mode:?}, norm {}",
                    norm.is_some()
                );
                assert!(!f0, "{what}: fused without being asked");
                fused += usize::from(f1);
                assert!(a0 == a1, "{what}: the first product's output differs");
                assert!(q0 == q1, "{what}: the two-level input bytes differ");
                assert!(b0 == b1, "{what}: the second product's output differs");
            }
        }
    }
    eprintln!("split-K sums that quantized the next input: {fused} of 16 cases");
    // SmolLM2's shapes at 512 rows take split-K sums
    assert!(fused >= 8, "only {fused} of 16 cases took the fused launch");
    None
}

/// What `ops::matvec_rows_q8x2_pair` gives unfused, then fused: for each, whether it fused,
/// the two-level rows of the second product's input, the first product's outputs (started as
/// `init`, `rows` rows) and the second's (`nb` a row).
#[allow(clippy::type_complexity)]
fn q8x2_pair_unfused_and_fused(
    dev: &CudaDevice,
    (a, b): ((&[Seg<'_>], Mode), &Seg<'_>),
    (x, norm): (&Buffer, Option<(&Buffer, f32)>),
    init: &[f32],
    nb: usize,
    rows: usize,
) -> [(bool, Vec<u8>, Vec<f32>, Vec<f32>); 2] {
    [false, true].map(|fuse| {
        let (oa, ob) = (up(dev, init), up(dev, &vec![0.0; rows * nb]));
        let (f, q) =
            ops::matvec_rows_q8x2_pair(dev, a, b, x, norm, (&oa, &ob), rows, fuse).unwrap();
        (f, q, read(dev, &oa, init.len()), read(dev, &ob, rows * nb))
    })
}

/// A GLU product whose split-K sums also quantize the next product's input
/// (`MvLaunch::quantizing_next`, `mmq_reduce_q8x2`) gives the same two-level bytes as the next
/// product's own quantization of its f32 outputs (with and without its RMS norm), and so the
/// same next output, bit for bit, and writes no f32 outputs. SmolLM2's gate/up -> down at 128
/// and 64 rows, a Gemma-3-like GELU shape, 96 gate rows with biases and a partial input
/// group; at 512 rows (no splits) the GLU launch is left as it is.
fn q8x2_glu_quantizes_next(dev: &CudaDevice) -> Option<String> {
    if dev.compute_capability().0 < 8 {
        return Some("the int8 tensor-core kernels need sm_80 or later".into());
    }
    // (format, gate/up rows, their columns, rows, biases, split-K sums)
    let cases = [
        (GgmlType::Q4_1, 1536, 576, 128, false, true),
        (GgmlType::Q4_1, 1536, 576, 64, false, true),
        (GgmlType::Q8_0, 2048, 640, 96, false, true),
        (GgmlType::Q4_0, 96, 512, 130, true, true),
        (GgmlType::Q4_1, 1536, 576, 512, false, false),
    ];
    for (i, (ty, ff, cols, rows, biased, split)) in cases.into_iter().enumerate() {
        let seed = 5100 + 10 * i as u64;
        let (wg, _) = rand_matrix_with(dev, ty, ff, cols, seed, false);
        let (wu, _) = rand_matrix_with(dev, ty, ff, cols, seed + 1, false);
        let (wd, _) = rand_matrix_with(dev, ty, cols, ff, seed + 2, false);
        let x = up(dev, &Rng(seed + 3).vec(rows * cols));
        let init = Rng(seed + 4).vec(rows * ff);
        let norm: Vec<f32> = Rng(seed + 5).vec(ff).iter().map(|v| 1.0 + v).collect();
        let nb = up(dev, &norm);
        let (bg, bu) = (
            up(dev, &Rng(seed + 6).vec(ff)),
            up(dev, &Rng(seed + 7).vec(ff)),
        );
        let gu = [(&wg, &bg), (&wu, &bu)].map(|(w, b)| Seg {
            w,
            bias: biased.then_some(b),
            out_off: 0,
        });
        let down = Seg {
            w: &wd,
            bias: None,
            out_off: 0,
        };
        for mode in [Mode::GluSilu, Mode::GluGelu] {
            for norm in [None, Some((&nb, 1e-5f32))] {
                let pair = ((&gu[..], mode), &down);
                let [(f0, q0, a0, b0), (f1, q1, a1, b1)] =
                    q8x2_pair_unfused_and_fused(dev, pair, (&x, norm), &init, cols, rows);
                let what = format!(
                    "{ty} {ff}x{cols}, {rows} rows, {mode:?}, norm {}",
                    norm.is_some()
                );
                assert!(!f0, "{what}: fused without being asked");
                assert_eq!(f1, split, "{what}: fused");
                assert!(a0 != init, "{what}: the unfused GLU wrote no outputs");
                if f1 {
                    assert!(a1 == init, "{what}: the fused GLU wrote f32 outputs");
                } else {
                    assert!(a1 == a0, "{what}: the GLU outputs differ");
                }
                assert!(q0.iter().any(|&b| b != 0), "{what}: no two-level bytes");
                assert!(q0 == q1, "{what}: the two-level input bytes differ");
                assert!(b0 == b1, "{what}: the next product's output differs");
            }
        }
    }
    None
}

/// The two-level input quantization with an RMS norm (`quantize_q8x2` with a norm weight)
/// writes the bytes of its reference, `q8x2_normed_ref`, for rows of 576 values (a partial
/// chunk of 32 units) and 4,608 (past 4,096: more units than one shared array of 128).
fn q8x2_normed_rows(dev: &CudaDevice) -> Option<String> {
    if dev.compute_capability().0 < 8 {
        return Some("the int8 tensor-core kernels need sm_80 or later".into());
    }
    let ty = GgmlType::Q8_0;
    for (i, (n, cols, rows)) in [(576, 256, 5), (4608, 256, 3)].into_iter().enumerate() {
        let seed = 5600 + 10 * i as u64;
        let (wa, _) = rand_matrix_with(dev, ty, n, cols, seed, false);
        let (wb, _) = rand_matrix_with(dev, ty, 64, n, seed + 1, false);
        let x = up(dev, &Rng(seed + 2).vec(rows * cols));
        let g: Vec<f32> = Rng(seed + 3).vec(n).iter().map(|v| 1.0 + v).collect();
        let gb = up(dev, &g);
        let (oa, ob) = (
            up(dev, &vec![0.0; rows * n]),
            up(dev, &vec![0.0; rows * 64]),
        );
        let seg = |w| Seg {
            w,
            bias: None,
            out_off: 0,
        };
        let eps = 1e-5f32;
        let (_, q) = ops::matvec_rows_q8x2_pair(
            dev,
            (&[seg(&wa)], Mode::Store),
            &seg(&wb),
            &x,
            Some((&gb, eps)),
            (&oa, &ob),
            rows,
            false,
        )
        .unwrap();
        let a = read(dev, &oa, rows * n);
        for r in 0..rows {
            let want = q8x2_normed_ref(&a[r * n..][..n], &g, eps);
            let got = &q[r * n / 32 * 80..][..n / 32 * 80];
            for (u, (w, h)) in want.chunks(80).zip(got.chunks(80)).enumerate() {
                // bytes 40..48 of a unit are unused
                assert!(
                    w[..40] == h[..40] && w[48..] == h[48..],
                    "{n} values, row {r}, unit {u}: {:?} against {:?}",
                    &h[32..40],
                    &w[32..40]
                );
            }
        }
    }
    None
}

/// The two-level units (80 bytes: hi's qs, d, s = hi.s + lo.s, 8 unused bytes as zeros, lo's
/// qs) of `x` RMS-normed by `g` in the GPU's order: per 32-value unit, 8 lanes' rounded sums
/// of 4 squares added by a butterfly (xor 1, 2, 4); lane l of a warp adds units l, l + 32, ...;
/// the warp's butterfly (xor 16 .. 1); 1 / sqrt(sum / n + eps); x * inv * g; then the CPU's
/// `quantize_q8x2`.
fn q8x2_normed_ref(x: &[f32], g: &[f32], eps: f32) -> Vec<u8> {
    use ferrite_cpu::quant::q8::{quantize_q8x2, BlockQ8};
    let butterfly = |mut v: Vec<f32>, steps: &[usize]| {
        for &o in steps {
            v = (0..v.len()).map(|l| v[l] + v[l ^ o]).collect();
        }
        v[0]
    };
    let us: Vec<f32> = x
        .chunks(32)
        .map(|u| {
            let lanes = u
                .chunks(4)
                .map(|e| ((e[0] * e[0] + e[1] * e[1]) + e[2] * e[2]) + e[3] * e[3])
                .collect();
            butterfly(lanes, &[1, 2, 4])
        })
        .collect();
    let lanes = (0..32)
        .map(|l| us.iter().skip(l).step_by(32).fold(0.0f32, |a, &b| a + b))
        .collect();
    let inv = 1.0 / (butterfly(lanes, &[16, 8, 4, 2, 1]) / x.len() as f32 + eps).sqrt();
    let xn: Vec<f32> = x.iter().zip(g).map(|(&e, &w)| e * inv * w).collect();
    let mut hi = vec![BlockQ8::default(); x.len() / 32];
    let mut lo = hi.clone();
    quantize_q8x2(&xn, &mut hi, &mut lo);
    let mut out = Vec::with_capacity(hi.len() * 80);
    for (h, l) in hi.iter().zip(&lo) {
        out.extend(h.qs.iter().map(|&q| q as u8));
        out.extend(h.d.to_le_bytes());
        out.extend((h.s + l.s).to_le_bytes());
        out.extend([0u8; 8]);
        out.extend(l.qs.iter().map(|&q| q as u8));
    }
    out
}

/// The two-level product of the attention's f16 output rows quantizes them itself
/// (`MvLaunch::quantizing_half_input`): the same two-level bytes and output, bit for bit, as
/// quantizing f32 rows of the same values, at SmolLM2's attention-output shape and others.
fn q8x2_half_input(dev: &CudaDevice) -> Option<String> {
    if dev.compute_capability().0 < 8 {
        return Some("the int8 tensor-core kernels need sm_80 or later".into());
    }
    // (format, outputs, columns, rows)
    let cases = [
        (GgmlType::Q4_1, 576, 576, 512),
        (GgmlType::Q4_0, 256, 512, 64),
        (GgmlType::Q8_0, 128, 1024, 33),
    ];
    for (i, (ty, n, cols, rows)) in cases.into_iter().enumerate() {
        let seed = 4700 + 10 * i as u64;
        let (w, _) = rand_matrix_with(dev, ty, n, cols, seed, false);
        // values f16 holds exactly, a few units all zero, one at f16's largest magnitudes
        let mut x: Vec<f32> = Rng(seed + 1)
            .vec(rows * cols)
            .iter()
            .map(|v| half::f16::from_f32(4.0 * v).to_f32())
            .collect();
        x[..64].fill(0.0);
        x[64] = 65504.0;
        x[65] = -60000.0;
        let x16: Vec<u8> = x
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
            .collect();
        let (xb, xh) = (up(dev, &x), upload_bytes(dev, &x16, "test").unwrap());
        let out = up(dev, &vec![0.0; rows * n]);
        let seg = Seg {
            w: &w,
            bias: None,
            out_off: 0,
        };
        let [(q32, o32), (q16, o16)] =
            ops::matvec_rows_q8x2_half_input(dev, &seg, (&xb, &xh), &out, rows).unwrap();
        let what = format!("{ty} {n}x{cols}, {rows} rows");
        assert!(q32.iter().any(|&b| b != 0), "{what}: no two-level bytes");
        assert!(q32 == q16, "{what}: the two-level input bytes differ");
        assert!(o32 == o16, "{what}: the outputs differ");
    }
    None
}
