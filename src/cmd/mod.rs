pub mod bench;
pub mod bench_serve;
pub mod chat;
pub mod demo;
pub mod devices;
pub mod inspect;
pub mod llm_args;
pub mod perplexity;
pub mod run;
pub mod serve;
pub mod synth;
pub mod train;
pub mod values;

/// `e`, a failure to open a GGUF file, under the command's `context` ("loading PATH"): an I/O
/// error's own text after it (gguf's `Io` error names the path too, and once is enough), any
/// other error as its cause.
pub fn gguf_open_error(context: String, e: ferrite_gguf::Error) -> anyhow::Error {
    match e {
        ferrite_gguf::Error::Io { io, .. } => anyhow::anyhow!("{context}: {io}"),
        e => anyhow::Error::new(e).context(context),
    }
}
