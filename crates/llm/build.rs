//! Embeds the GPU kernels compiled ahead of time where NVRTC and an architecture are
//! available at build time (see ../cuda/build/aot.rs); otherwise they compile at first use.

#[path = "../cuda/build/aot.rs"]
mod aot;
#[path = "../cuda/src/kernel_key.rs"]
mod kernel_key;

/// Each kernel source of `gpu` (`gpu::sources`): its name and its files in `src/gpu`
/// (`quant.cuh`, the block formats, is ferrite-cuda's), in the order its `KernelSource`
/// concatenates them.
const SOURCES: [(&str, &[&str]); 4] = [
    ("llm_decode", &["quant.cuh", "decode.cu"]),
    ("llm_prefill", &["quant.cuh", "decode.cu", "prefill.cu"]),
    ("llm_sample", &["quant.cuh", "sample.cu"]),
    ("llm_paged", &["quant.cuh", "decode.cu", "paged.cu"]),
];

fn main() {
    let dir = std::path::Path::new("src/gpu");
    let common_path = std::path::Path::new("../cuda/src/common.cuh");
    let quant_path = std::path::Path::new("../cuda/src/quant.cuh");
    let read = |p: &std::path::Path| std::fs::read_to_string(p).expect("reading a kernel source");
    let part = |f: &str| match f {
        "quant.cuh" => quant_path.to_path_buf(),
        _ => dir.join(f),
    };
    let mut files = vec![
        common_path.to_path_buf(),
        quant_path.to_path_buf(),
        "../cuda/build/aot.rs".into(),
        "../cuda/src/kernel_key.rs".into(),
    ];
    let sources: Vec<aot::Source> = SOURCES
        .iter()
        .map(|&(name, parts)| aot::Source {
            name,
            src: parts.iter().map(|f| read(&part(f))).collect(),
        })
        .collect();
    for f in ["decode.cu", "prefill.cu", "sample.cu", "paged.cu"] {
        files.push(dir.join(f));
    }
    aot::rerun_on(&files);
    aot::build(&read(common_path), &sources, "ferrite_cuda::Prebuilt");
}
