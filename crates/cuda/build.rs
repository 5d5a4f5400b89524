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
    aot::rerun_on(&files);
    aot::build(&read("common.cuh"), &sources, "crate::Prebuilt");
}
