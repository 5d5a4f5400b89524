//! Embeds the kernels compiled ahead of time where NVRTC and an architecture are available
//! at build time (see build/aot.rs); otherwise they compile at first use.

#[path = "build/aot.rs"]
mod aot;
#[path = "src/kernel_key.rs"]
mod kernel_key;

/// Every kernel source of the crate (`kernels::all_sources`) but `matvec`: `src/<name>.cu`.
const SOURCES: [&str; 12] = [
    "elementwise",
    "cast",
    "create",
    "reduce",
    "index",
    "scan",
    "norm",
    "cross_entropy",
    "attention",
    "conv",
    "channel_norm",
    "optim",
];

/// Each fused LLM kernel source (`llm::sources`): its name and its files in `src/llm`.
const LLM_SOURCES: [(&str, &[&str]); 4] = [
    ("llm_decode", &["decode.cu"]),
    ("llm_prefill", &["decode.cu", "prefill.cu"]),
    ("llm_sample", &["sample.cu"]),
    ("llm_paged", &["paged.cu"]),
];

fn main() {
    let dir = std::path::Path::new("src");
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("reading a kernel source");
    let mut files = vec![
        dir.join("common.cuh"),
        "build/aot.rs".into(),
        dir.join("kernel_key.rs"),
    ];
    let mut sources: Vec<aot::Source> = SOURCES
        .iter()
        .map(|&name| {
            files.push(dir.join(format!("{name}.cu")));
            aot::Source {
                name,
                src: read(&format!("{name}.cu")),
            }
        })
        .collect();
    // The quantized products: the block formats (also read by ferrite-llm's kernels), then
    // the kernels (`matvec::SOURCE`).
    files.push(dir.join("quant.cuh"));
    files.push(dir.join("matvec.cu"));
    sources.push(aot::Source {
        name: "matvec",
        src: read("quant.cuh") + &read("matvec.cu"),
    });
    // The fused LLM kernels (`llm::sources`): the block formats, then each source's files in
    // `src/llm`, in the order its `KernelSource` concatenates them.
    for (name, parts) in LLM_SOURCES {
        let mut src = read("quant.cuh");
        for f in parts {
            let path = format!("llm/{f}");
            src += &read(&path);
            files.push(dir.join(path));
        }
        sources.push(aot::Source { name, src });
    }
    aot::rerun_on(&files);
    aot::build(&read("common.cuh"), &sources, "crate::Prebuilt");
}
