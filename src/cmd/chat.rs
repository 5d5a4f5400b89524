//! `ferrite chat [-m FILE] [--system TEXT]`: an interactive conversation through the model's
//! chat template. Each turn re-renders the whole history; tokens already in the KV cache
//! (the common prefix) are not recomputed. `/reset` clears the history, `/exit` or end of
//! input quits. `--device cpu|cuda[:N]` as `run` (the GPU prefills each turn's new tokens in
//! batches).

use std::io::BufRead;

use ferrite_llm::chat::Message;
use ferrite_llm::generate::generate;
use ferrite_llm::Session;

use super::llm_args::{print_flush, DeviceArgs, ModelArgs, SamplingArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// System message that opens the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Tokens to generate at most per reply.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub n: u32,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Let typed text spell control tokens (`<|im_end|>`, `<start_of_turn>`); by default
    /// such text is plain text.
    #[arg(long)]
    pub special: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut sampler = args.sampling.sampler()?;
    let loaded = args.model.load()?;
    let (model, tok) = (&loaded.model, &loaded.tok);
    let ctx = args.model.ctx(model)?;
    let tmpl = super::llm_args::chat_template(model, tok)?;
    let cuda = args.device.cuda()?;
    let gm = match &cuda {
        Some(dev) => Some(ferrite_llm::gpu::GpuModel::load(model, dev, ctx)?),
        None => None,
    };
    let mut session = match &gm {
        Some(gm) => Sess::Gpu(ferrite_llm::gpu::GpuSession::new(gm)?),
        None => Sess::Cpu(Session::new(model, ctx)?),
    };
    // Token ids currently in the KV cache, in order.
    let mut cached: Vec<u32> = Vec::new();
    let initial: Vec<Message> = args
        .system
        .iter()
        .map(|s| Message::system(s.as_str()))
        .collect();
    let mut history = initial.clone();
    eprintln!("chat: type a message; /reset clears the history, /exit or Ctrl-D quits (context {ctx} tokens)");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        print_flush("> ");
        let Some(line) = lines.next() else { break };
        let line = line?;
        let msg = line.trim();
        match msg {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history = initial.clone();
                session.truncate(0);
                cached.clear();
                eprintln!("(history cleared)");
                continue;
            }
            _ => {}
        }
        history.push(Message::user(msg));
        let ids = super::llm_args::encode_chat(&tmpl, tok, &history, args.special)?;
        let common = cached.iter().zip(&ids).take_while(|(a, b)| a == b).count();
        // Keep at least one token to run, so the reply starts from fresh logits.
        let keep = common.min(ids.len().saturating_sub(1));
        session.truncate(keep);
        cached.truncate(keep);
        let room = ctx.saturating_sub(ids.len());
        if room == 0 {
            history.pop();
            eprintln!(
                "error: the conversation ({} tokens) fills the context size {ctx}; /reset to start over or raise --ctx",
                ids.len()
            );
            continue;
        }
        let max_new = (args.n as usize).min(room);
        let prompt = &ids[keep..];
        let gen = match &mut session {
            Sess::Cpu(s) => generate(s, tok, &mut sampler, prompt, max_new, &[], &mut |t| {
                print_flush(t)
            })?,
            Sess::Gpu(s) => {
                ferrite_llm::gpu::generate(s, tok, &mut sampler, prompt, max_new, &[], &mut |t| {
                    print_flush(t)
                })?
            }
        };
        print_flush("\n");
        eprintln!(
            "[{} tokens, {:.1} tok/s]",
            gen.tokens.len(),
            gen.decode_tok_s()
        );
        cached.extend_from_slice(&ids[keep..]);
        // The generated tokens the session ran (all but possibly the last).
        let ran = session
            .pos()
            .saturating_sub(cached.len())
            .min(gen.tokens.len());
        cached.extend_from_slice(&gen.tokens[..ran]);
        history.push(Message::assistant(gen.text.trim()));
    }
    Ok(())
}

/// The conversation's session on the CPU or on a CUDA device (`--device`).
enum Sess<'m> {
    Cpu(Session<'m>),
    Gpu(ferrite_llm::gpu::GpuSession<'m>),
}

impl Sess<'_> {
    fn truncate(&mut self, pos: usize) {
        match self {
            Sess::Cpu(s) => s.truncate(pos),
            Sess::Gpu(s) => s.truncate(pos),
        }
    }

    fn pos(&self) -> usize {
        match self {
            Sess::Cpu(s) => s.pos(),
            Sess::Gpu(s) => s.pos(),
        }
    }
}
