//! `ferrite run [PROMPT | -p TEXT | -f FILE | < stdin] [-m FILE] [-n N] [sampling flags]`:
//! streams a continuation of the prompt to stdout (or prints one JSON object with `--json`);
//! prompt and generation speed go to stderr. Flags follow llama.cpp's `llama-cli` where they
//! overlap (`-p`, `-f`, `-sys`, `-c`, `-s -1`, `-n -1`, `--ignore-eos`, `-t`, `-ngl`).

use std::io::{IsTerminal, Read};
use std::path::PathBuf;

use anyhow::Context;
use ferrite_llm::chat::Message;
use ferrite_llm::generate::{generate, StopReason};
use ferrite_llm::Session;

use super::llm_args::{print_flush, DeviceArgs, ModelArgs, SamplingArgs};

#[derive(clap::Args)]
pub struct Args {
    /// Text to continue (or `-p`, `-f`, or standard input when piped). Without any, generation
    /// starts from the BOS token.
    #[arg(conflicts_with_all = ["prompt_flag", "file"])]
    pub prompt: Option<String>,
    /// Text to continue (as the positional PROMPT).
    #[arg(
        short = 'p',
        long = "prompt",
        id = "prompt_flag",
        value_name = "TEXT",
        conflicts_with = "file"
    )]
    pub prompt_flag: Option<String>,
    /// Read the prompt from FILE (`-` for standard input).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// System message, through the model's chat template (implies --chat). Also `-sys`.
    #[arg(long = "system")]
    pub system: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Tokens to generate at most; -1 = until end of text or the context is full.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128, allow_hyphen_values = true,
          value_parser = parse_n_predict)]
    pub n: i64,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Stop when the output contains this text (repeatable); the text is not printed.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Wrap the prompt as one user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Let the prompt's text spell control tokens (`<|im_end|>`, `<start_of_turn>`); by
    /// default such text is tokenized as plain text.
    #[arg(long)]
    pub special: bool,
    /// Print one JSON object (text, token ids, counts, timings, stop reason) instead of
    /// streaming the text.
    #[arg(long)]
    pub json: bool,
}

fn parse_n_predict(s: &str) -> Result<i64, String> {
    match s.parse::<i64>() {
        Ok(n) if n >= -1 => Ok(n),
        _ => Err(format!(
            "expected a token count >= 0, or -1 for no limit, got {s:?}"
        )),
    }
}

/// The prompt text from the positional argument, `-p`, `-f` (`-` = stdin) or piped stdin.
/// Text read from a file or a pipe loses one final line break (as llama.cpp's `-f`): `echo`
/// and editors end files with one, and it would change the prompt.
fn prompt_text(args: &Args) -> anyhow::Result<Option<String>> {
    let read = read_prompt(args)?;
    Ok(
        match (read, args.prompt.is_some() || args.prompt_flag.is_some()) {
            (Some(mut s), false) => {
                if s.ends_with('\n') {
                    s.pop();
                    if s.ends_with('\r') {
                        s.pop();
                    }
                }
                Some(s)
            }
            (r, _) => r,
        },
    )
}

fn read_prompt(args: &Args) -> anyhow::Result<Option<String>> {
    if let Some(p) = args.prompt.as_ref().or(args.prompt_flag.as_ref()) {
        return Ok(Some(p.clone()));
    }
    let read_stdin = || -> anyhow::Result<String> {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the prompt from standard input")?;
        Ok(s)
    };
    match &args.file {
        Some(f) if f.as_os_str() == "-" => Ok(Some(read_stdin()?)),
        Some(f) => {
            let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            let s = String::from_utf8(bytes)
                .map_err(|_| anyhow::anyhow!("{} is not UTF-8 text", f.display()))?;
            Ok(Some(s))
        }
        None if !std::io::stdin().is_terminal() => {
            let s = read_stdin()?;
            // An empty pipe (e.g. `< /dev/null`) is no prompt.
            Ok(if s.is_empty() { None } else { Some(s) })
        }
        None => Ok(None),
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let prompt = prompt_text(&args)?;
    if args.n == 0 && prompt.is_none() {
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
    let wgpu = args.device.wgpu()?;
    let cuda = match wgpu {
        Some(_) => None,
        None => args.device.cuda()?,
    };
    let mut sampler = args.sampling.sampler()?;
    sampler.set_ignore_eos(args.sampling.ignore_eos);
    let loaded = args.model.load()?;
    let (model, tok) = (&loaded.model, &loaded.tok);
    let ctx = args.model.ctx(model)?;
    let chat = args.chat || args.system.is_some();
    let mut ids = if chat {
        let tmpl = super::llm_args::chat_template(model, tok)?;
        let mut msgs = Vec::new();
        if let Some(s) = &args.system {
            msgs.push(Message::system(s.as_str()));
        }
        msgs.push(Message::user(prompt.clone().unwrap_or_default()));
        super::llm_args::encode_chat(&tmpl, tok, &msgs, args.special)?
    } else {
        match &prompt {
            Some(p) => tok.encode_with(p, true, args.special)?,
            None => Vec::new(),
        }
    };
    if ids.is_empty() {
        let bos = tok
            .bos()
            .context("empty prompt and the model has no BOS token to start from")?;
        ids.push(bos);
    }
    // -n -1: as many as the context holds after the prompt.
    let unlimited = args.n < 0;
    let max_new = if unlimited {
        ctx.saturating_sub(ids.len())
    } else {
        args.n as usize
    };
    if unlimited && max_new == 0 {
        anyhow::bail!(
            "the prompt ({}) fills the context size {ctx}; raise --ctx-size",
            super::llm_args::tokens(ids.len())
        );
    }
    let json = args.json;
    let mut on_text = |s: &str| {
        if !json {
            print_flush(s)
        }
    };
    let (stops, out) = (&args.stop, &mut on_text);
    // One sequence through the model definition on the chosen kernel set.
    let gen = match (&cuda, &wgpu) {
        (_, Some(dev)) => {
            let wm = ferrite_llm::model::WgpuModel::new(model, dev)?;
            let mut session = Session::wgpu(&wm, ctx)?;
            generate(&mut session, tok, &mut sampler, &ids, max_new, stops, out)?
        }
        (Some(dev), None) => {
            let gm = ferrite_llm::gpu::GpuModel::load(model, dev, ctx)?;
            let mut session = Session::cuda(&gm, ctx)?;
            generate(&mut session, tok, &mut sampler, &ids, max_new, stops, out)?
        }
        (None, None) => {
            let mut session = Session::new(model, ctx)?;
            generate(&mut session, tok, &mut sampler, &ids, max_new, stops, out)?
        }
    };
    let stop = if unlimited && gen.stop == StopReason::MaxTokens {
        "context full".to_string()
    } else {
        gen.stop.to_string()
    };
    if json {
        let out = serde_json::json!({
            "text": gen.text,
            "tokens": gen.tokens,
            "prompt_tokens": gen.prompt_tokens,
            "generated_tokens": gen.tokens.len(),
            "stop": stop,
            "prefill_seconds": gen.prefill_secs,
            "decode_seconds": gen.decode_secs,
            "prefill_tok_s": gen.prefill_tok_s(),
            "decode_tok_s": gen.decode_tok_s(),
            "model": loaded.path,
            "device": match (&cuda, &wgpu) {
                (_, Some(d)) => format!("wgpu:{} ({}, {})", d.index(), d.name(), d.backend_name()),
                (Some(_), None) => "cuda".to_string(),
                (None, None) => "cpu".to_string(),
            },
            "precision": model.precision().name(),
        });
        println!("{out}");
        return Ok(());
    }
    print_flush("\n");
    eprintln!(
        "prompt: {}, {:.1} tok/s | generated: {}, {:.1} tok/s | stop: {stop}",
        super::llm_args::tokens(gen.prompt_tokens),
        gen.prefill_tok_s(),
        super::llm_args::tokens(gen.tokens.len()),
        gen.decode_tok_s(),
    );
    Ok(())
}
