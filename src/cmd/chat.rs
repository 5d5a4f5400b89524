//! `ferrite chat [-m FILE] [-sys TEXT]`: an interactive conversation through the model's chat
//! template, with line editing and history (rustyline). Each turn re-renders the whole
//! conversation; tokens already in the KV cache (the common prefix) are not recomputed. When
//! the conversation no longer fits the context, the oldest turns are dropped (the system
//! message stays). Ctrl-C stops a reply in progress; Ctrl-C or Ctrl-D at the prompt quits.
//! Commands: see `HELP`. `--device cpu|cuda[:N]` as `run`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use ferrite_llm::chat::{ChatTemplate, Message};
use ferrite_llm::generate::{generate, StopReason};
use ferrite_llm::tokenizer::Tokenizer;
use ferrite_llm::Session;
use rustyline::error::ReadlineError;

use super::llm_args::{print_flush, tokens, DeviceArgs, ModelArgs, SamplingArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// System message that opens the conversation (kept when old turns are dropped). Also
    /// `-sys`.
    #[arg(long)]
    pub system: Option<String>,
    /// Tokens to generate at most per reply.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512, value_parser = super::values::u32_positive, allow_negative_numbers = true)]
    pub n: u32,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Let typed text spell control tokens (`<|im_end|>`, `<start_of_turn>`); by default
    /// such text is plain text.
    #[arg(long)]
    pub special: bool,
}

const HELP: &str = "\
commands:
  /help           this list
  /reset          forget the conversation (keeps the system message)
  /system TEXT    set the system message and start over (/system alone removes it)
  /save FILE      write the conversation to FILE (JSON)
  /load FILE      continue a conversation saved with /save
  /exit, /quit    leave (as Ctrl-D, or Ctrl-C at the prompt)
a line ending in \\ continues on the next line; start a message with // to begin it with /.
Ctrl-C during a reply stops it.";

/// Largest conversation file `/load` reads.
const MAX_LOAD_BYTES: u64 = 16 << 20;

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut sampler = args.sampling.sampler()?;
    sampler.set_ignore_eos(args.sampling.ignore_eos);
    let loaded = args.model.load()?;
    let (model, tok) = (&loaded.model, &loaded.tok);
    let ctx = args.model.ctx(model)?;
    let tmpl = super::llm_args::chat_template(model, tok)?;
    let mut conv = Conversation {
        tmpl: &tmpl,
        tok,
        special: args.special,
        ctx,
        system: None,
        turns: Vec::new(),
    };
    if let Some(s) = &args.system {
        conv.set_system(Some(s.clone()))?;
    }
    let wgpu = args.device.wgpu()?;
    let cuda = match wgpu {
        Some(_) => None,
        None => args.device.cuda()?,
    };
    let gm = match &cuda {
        Some(dev) => Some(ferrite_llm::gpu::GpuModel::load(model, dev, ctx)?),
        None => None,
    };
    let wm = match &wgpu {
        Some(dev) => Some(ferrite_llm::model::WgpuModel::new(model, dev)?),
        None => None,
    };
    let mut session = match (&gm, &wm) {
        (_, Some(wm)) => Sess::Wgpu(Box::new(Session::wgpu(wm, ctx)?)),
        (Some(gm), None) => Sess::Gpu(Box::new(Session::cuda(gm, ctx)?)),
        (None, None) => Sess::Cpu(Box::new(Session::new(model, ctx)?)),
    };
    // Ctrl-C outside line editing (while a reply streams) sets this flag; the generation loop
    // stops before its next token. At the prompt rustyline reads Ctrl-C as a key.
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        ctrlc::set_handler(move || stop.store(true, Ordering::Relaxed))
            .context("installing the Ctrl-C handler")?;
    }
    sampler.set_cancel(Some(Arc::clone(&stop)));
    let mut rl = rustyline::DefaultEditor::new().context("starting the line editor")?;
    // Token ids currently in the KV cache, in order.
    let mut cached: Vec<u32> = Vec::new();
    eprintln!(
        "chat: type a message (/help lists commands; Ctrl-D quits; context {})",
        tokens(ctx)
    );
    while let Some(input) = read_message(&mut rl)? {
        let msg = input.trim();
        if msg.is_empty() {
            continue;
        }
        if let Some(cmd) = msg.strip_prefix('/').filter(|c| !c.starts_with('/')) {
            let (name, rest) = cmd.split_once(char::is_whitespace).unwrap_or((cmd, ""));
            let rest = rest.trim();
            match name {
                "exit" | "quit" => break,
                "help" => eprintln!("{HELP}"),
                "reset" => {
                    conv.turns.clear();
                    eprintln!("(conversation cleared)");
                }
                "system" => {
                    let s = (!rest.is_empty()).then(|| rest.to_string());
                    match conv.set_system(s) {
                        Ok(()) => eprintln!("(system message set; conversation cleared)"),
                        Err(e) => eprintln!("error: {e:#}"),
                    }
                }
                "save" if !rest.is_empty() => match conv.save(Path::new(rest)) {
                    Ok(()) => eprintln!("(saved {} messages to {rest})", conv.len()),
                    Err(e) => eprintln!("error: {e:#}"),
                },
                "load" if !rest.is_empty() => match conv.load(Path::new(rest)) {
                    Ok(()) => eprintln!("(loaded {} messages from {rest})", conv.len()),
                    Err(e) => eprintln!("error: {e:#}"),
                },
                "save" | "load" => eprintln!("error: /{name} needs a file name"),
                _ => eprintln!("error: unknown command /{name}; /help lists the commands"),
            }
            continue;
        }
        let text = msg.strip_prefix('/').unwrap_or(msg);
        conv.turns.push(Message::user(text));
        // Keep room for a reply: drop the oldest turns (never the system message) until the
        // conversation leaves at least min(-n, ctx / 4) positions free.
        let reserve = (args.n as usize).min(ctx / 4).max(1);
        let (ids, dropped) = match conv.fit(reserve) {
            Ok(x) => x,
            Err(e) => {
                conv.turns.pop();
                eprintln!("error: {e:#}");
                continue;
            }
        };
        if dropped > 0 {
            eprintln!(
                "(context full: dropped the oldest {dropped} message{})",
                if dropped == 1 { "" } else { "s" }
            );
        }
        let common = cached.iter().zip(&ids).take_while(|(a, b)| a == b).count();
        // Keep at least one token to run, so the reply starts from fresh logits.
        let keep = common.min(ids.len() - 1);
        session.truncate(keep);
        cached.truncate(keep);
        let room = ctx - ids.len();
        let max_new = (args.n as usize).min(room);
        let prompt = &ids[keep..];
        stop.store(false, Ordering::Relaxed);
        let mut out = |t: &str| print_flush(t);
        let gen = match &mut session {
            Sess::Cpu(s) => generate(&mut **s, tok, &mut sampler, prompt, max_new, &[], &mut out)?,
            Sess::Gpu(s) => generate(&mut **s, tok, &mut sampler, prompt, max_new, &[], &mut out)?,
            Sess::Wgpu(s) => generate(&mut **s, tok, &mut sampler, prompt, max_new, &[], &mut out)?,
        };
        print_flush("\n");
        match gen.stop {
            StopReason::Interrupted => eprintln!("(reply stopped)"),
            StopReason::MaxTokens if max_new < args.n as usize => eprintln!(
                "(reply cut: the context of {} is full; the oldest turns make room next time)",
                tokens(ctx)
            ),
            _ => {}
        }
        eprintln!(
            "[{}, {:.1} tok/s]",
            tokens(gen.tokens.len()),
            gen.decode_tok_s()
        );
        cached.extend_from_slice(&ids[keep..]);
        // The generated tokens the session ran (all but possibly the last).
        let ran = session
            .pos()
            .saturating_sub(cached.len())
            .min(gen.tokens.len());
        cached.extend_from_slice(&gen.tokens[..ran]);
        conv.turns.push(Message::assistant(gen.text.trim()));
    }
    Ok(())
}

/// Reads one message: lines ending in `\` continue it. None at Ctrl-D or Ctrl-C.
fn read_message(rl: &mut rustyline::DefaultEditor) -> anyhow::Result<Option<String>> {
    let mut msg = String::new();
    let mut prompt = "> ";
    loop {
        match rl.readline(prompt) {
            Ok(line) => {
                if let Some(head) = line.strip_suffix('\\') {
                    msg.push_str(head);
                    msg.push('\n');
                    prompt = "... ";
                    continue;
                }
                msg.push_str(&line);
                if !msg.trim().is_empty() {
                    let _ = rl.add_history_entry(msg.as_str());
                }
                return Ok(Some(msg));
            }
            Err(ReadlineError::Interrupted | ReadlineError::Eof) => return Ok(None),
            Err(e) => return Err(e).context("reading input"),
        }
    }
}

/// The conversation: an optional system message and the turns after it.
struct Conversation<'a> {
    tmpl: &'a ChatTemplate,
    tok: &'a Tokenizer,
    special: bool,
    ctx: usize,
    system: Option<String>,
    turns: Vec<Message>,
}

impl Conversation<'_> {
    fn messages(&self) -> Vec<Message> {
        self.system
            .iter()
            .map(|s| Message::system(s.as_str()))
            .chain(self.turns.iter().cloned())
            .collect()
    }

    fn len(&self) -> usize {
        self.system.is_some() as usize + self.turns.len()
    }

    fn encode(&self) -> anyhow::Result<Vec<u32>> {
        super::llm_args::encode_chat(self.tmpl, self.tok, &self.messages(), self.special)
    }

    /// Sets the system message and clears the turns; a system message that leaves no room
    /// for a message and a reply is an error (nothing changes).
    fn set_system(&mut self, system: Option<String>) -> anyhow::Result<()> {
        let old = (self.system.take(), std::mem::take(&mut self.turns));
        self.system = system;
        let n = self.encode()?.len();
        if self.system.is_some() && n + 2 > self.ctx {
            (self.system, self.turns) = old;
            anyhow::bail!(
                "the system message takes {} with the template, but the context size is {}; shorten it or raise --ctx-size",
                tokens(n),
                self.ctx
            );
        }
        Ok(())
    }

    /// Token ids of the conversation after dropping the oldest turns (never the system
    /// message, never the last message) until `reserve` positions stay free; returns them
    /// and how many messages were dropped. Errors when the last message alone does not fit.
    fn fit(&mut self, reserve: usize) -> anyhow::Result<(Vec<u32>, usize)> {
        let mut dropped = 0;
        loop {
            let ids = self.encode()?;
            if ids.len() + reserve <= self.ctx {
                return Ok((ids, dropped));
            }
            if self.turns.len() <= 1 {
                if ids.len() < self.ctx {
                    // No room for the full reserve, but some for a reply.
                    return Ok((ids, dropped));
                }
                anyhow::bail!(
                    "the message needs {} with the system message and template, but the context size is {}",
                    tokens(ids.len()),
                    self.ctx
                );
            }
            self.turns.remove(0);
            dropped += 1;
        }
    }

    fn save(&self, path: &Path) -> anyhow::Result<()> {
        // {"messages": [{"role": ..., "content": ...}, ...]}, the OpenAI message list.
        let saved = serde_json::json!({ "messages": self.messages() });
        let text = serde_json::to_string_pretty(&saved)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    }

    fn load(&mut self, path: &Path) -> anyhow::Result<()> {
        let size = std::fs::metadata(path)
            .with_context(|| format!("reading {}", path.display()))?
            .len();
        if size > MAX_LOAD_BYTES {
            anyhow::bail!(
                "{} is {size} bytes; a saved conversation is at most {MAX_LOAD_BYTES}",
                path.display()
            );
        }
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let not_saved =
            |why: &str| anyhow::anyhow!("{} is not a saved conversation ({why})", path.display());
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| not_saved(&e.to_string()))?;
        let list = v["messages"]
            .as_array()
            .ok_or_else(|| not_saved("no \"messages\" list"))?;
        let mut system = None;
        let mut turns = Vec::new();
        for (i, m) in list.iter().enumerate() {
            let (Some(role), Some(content)) = (m["role"].as_str(), m["content"].as_str()) else {
                return Err(not_saved(&format!(
                    "message {} lacks a text role or content",
                    i + 1
                )));
            };
            match role {
                "system" if i == 0 => system = Some(content.to_string()),
                "user" | "assistant" => turns.push(Message::new(role, content)),
                other => anyhow::bail!(
                    "{}: message {} has role \"{other}\"; expected user or assistant (system only first)",
                    path.display(),
                    i + 1
                ),
            }
        }
        let old = (
            std::mem::replace(&mut self.system, system),
            std::mem::replace(&mut self.turns, turns),
        );
        if let Err(e) = self.encode() {
            (self.system, self.turns) = old;
            return Err(e);
        }
        Ok(())
    }
}

/// The conversation's session on the CPU, a CUDA device or a wgpu device (`--device`).
// Boxed: a session holds its kernel set's scratch handles (hundreds of bytes).
enum Sess<'m> {
    Cpu(Box<Session<'m>>),
    Gpu(Box<Session<'m, ferrite_llm::model::CudaKernels<'m>>>),
    Wgpu(Box<Session<'m, ferrite_llm::model::WgpuKernels<'m>>>),
}

impl Sess<'_> {
    fn truncate(&mut self, pos: usize) {
        match self {
            Sess::Cpu(s) => s.truncate(pos),
            Sess::Gpu(s) => s.truncate(pos),
            Sess::Wgpu(s) => s.truncate(pos),
        }
    }

    fn pos(&self) -> usize {
        match self {
            Sess::Cpu(s) => s.pos(),
            Sess::Gpu(s) => s.pos(),
            Sess::Wgpu(s) => s.pos(),
        }
    }
}
