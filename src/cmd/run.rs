//! `ferrite run [PROMPT] [-m FILE] [-n N] [sampling flags]`: streams a continuation of the
//! prompt to stdout; prompt and generation speed go to stderr.

use anyhow::Context;
use ferrite_llm::chat::{ChatTemplate, Message};
use ferrite_llm::generate::generate;
use ferrite_llm::Session;

use super::llm_args::{print_flush, DeviceArgs, ModelArgs, SamplingArgs};

#[derive(clap::Args)]
pub struct Args {
    /// Text to continue. Without it, generation starts from the BOS token.
    pub prompt: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Stop when the output contains this text (repeatable); the text is not printed.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Wrap the prompt as one user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.n == 0 && args.prompt.is_none() {
        // A usage error, reported the way clap reports its own.
        use clap::CommandFactory;
        let mut cli = crate::Cli::command();
        let cmd = cli.find_subcommand_mut("run").expect("run is a subcommand");
        cmd.error(
            clap::error::ErrorKind::ArgumentConflict,
            "-n 0 with no prompt has nothing to do",
        )
        .exit();
    }
    let cuda = args.device.cuda()?;
    let sampler_args = args.sampling.clone();
    let mut sampler = sampler_args.sampler()?;
    let loaded = args.model.load()?;
    let (model, tok) = (&loaded.model, &loaded.tok);
    let ctx = args.model.ctx(model)?;
    let text = match (&args.prompt, args.chat) {
        (Some(p), true) => {
            let tmpl = ChatTemplate::from_gguf(model.gguf(), tok)?;
            tmpl.render(&[Message::user(p.as_str())], true)?
        }
        (Some(p), false) => p.clone(),
        (None, _) => String::new(),
    };
    let mut ids = if args.chat {
        tok.encode(&text, false)?
    } else {
        tok.encode(&text, true)?
    };
    if ids.is_empty() {
        let bos = tok
            .bos()
            .context("empty prompt and the model has no BOS token to start from")?;
        ids.push(bos);
    }
    let gen = match &cuda {
        Some(dev) => {
            let gm = ferrite_llm::gpu::GpuModel::load(model, dev, ctx)?;
            let mut session = ferrite_llm::gpu::GpuSession::new(&gm)?;
            ferrite_llm::gpu::generate(
                &mut session,
                tok,
                &mut sampler,
                &ids,
                args.n,
                &args.stop,
                &mut |s| print_flush(s),
            )?
        }
        None => {
            let mut session = Session::new(model, ctx)?;
            generate(
                &mut session,
                tok,
                &mut sampler,
                &ids,
                args.n,
                &args.stop,
                &mut |s| print_flush(s),
            )?
        }
    };
    let mut stderr_note = String::new();
    print_flush("\n");
    stderr_note.push_str(&format!(
        "prompt: {} tokens, {:.1} tok/s | generated: {} tokens, {:.1} tok/s | stop: {:?}",
        gen.prompt_tokens,
        gen.prefill_tok_s(),
        gen.tokens.len(),
        gen.decode_tok_s(),
        gen.stop
    ));
    eprintln!("{stderr_note}");
    Ok(())
}
