//! Tokenizers built from GGUF metadata (byte-level BPE and SentencePiece-style).
//!
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE. Text is cut by the pre-tokenizer that
//!   `tokenizer.ggml.pre` names, each piece is spelled in GPT-2's byte alphabet and merged by
//!   the rank of `tokenizer.ggml.merges`.
//! - `tokenizer.ggml.model = "llama"`: SentencePiece-style. Spaces become `▁` (plus one leading
//!   `▁` when `add_space_prefix`), adjacent symbols merge while their concatenation is a token,
//!   best score first; characters that are no token fall back to `<0xAB>` byte tokens. Gemma
//!   files merge by token position instead of score (their scores follow position for every
//!   normal token; `transformers` does the same), and their whitespace-only tokens stored with
//!   real spaces ("  ") are looked up as `▁▁`.
//!
//! Special tokens (control, type 3) in the text are matched whole when `parse_special` is on;
//! user-defined tokens (type 4) always are. Matching is leftmost-longest on the raw text.

mod merge;
mod pretok;
pub mod stream;

use std::collections::HashMap;

use ferrite_gguf::GgufFile;

use pretok::PreTokenizer;
pub use stream::StreamDecoder;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] ferrite_gguf::Error),
    /// Metadata that is missing, of the wrong shape, or inconsistent.
    #[error("tokenizer: metadata {key}: {what}")]
    Metadata { key: String, what: String },
    /// A tokenizer model or pre-tokenizer this crate does not implement.
    #[error("tokenizer: unsupported {0}")]
    Unsupported(String),
    #[error("tokenizer: token id {id} is out of range for a vocabulary of {vocab}")]
    TokenId { id: u32, vocab: usize },
    #[error("tokenizer: {0}")]
    Encode(String),
}

pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;

fn meta(key: &str, what: impl Into<String>) -> TokenizerError {
    TokenizerError::Metadata {
        key: key.to_string(),
        what: what.into(),
    }
}

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    fn from_code(code: i64) -> Option<TokenType> {
        Some(match code {
            0 | 1 => TokenType::Normal, // 0 = undefined, treated as normal (as llama.cpp does)
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }
}

/// Which algorithm turns a raw-text fragment into tokens.
enum Model {
    Bpe {
        pre: PreTokenizer,
        /// (left, right) -> (rank, merged token).
        merges: HashMap<(u32, u32), (u32, u32)>,
        /// The token of each byte's GPT-2 char, if the vocab has it.
        byte_token: [Option<u32>; 256],
    },
    Spm {
        /// Merge priority per token: lower merges first.
        priority: Vec<i64>,
        /// `<0xAB>` byte-fallback tokens.
        byte_token: [Option<u32>; 256],
        add_space_prefix: bool,
    },
}

/// A tokenizer read from a GGUF file's `tokenizer.*` metadata.
pub struct Tokenizer {
    model: Model,
    tokens: Vec<String>,
    types: Vec<TokenType>,
    /// Text -> id, for merging (SentencePiece: the `▁`-spelled text).
    lookup: HashMap<String, u32>,
    /// What each token decodes to.
    bytes: Vec<Vec<u8>>,
    /// Tokens matched whole in raw text.
    specials: Specials,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
}

/// Texts of end-of-generation tokens, as llama.cpp recognizes them (when marked control).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Upper bound on the vocabulary size read from a file (every id must fit an i32 for ggml).
const MAX_VOCAB: usize = 1 << 24;

impl Tokenizer {
    /// Builds the tokenizer that `file`'s metadata describes, validating it: array lengths
    /// agree, special-token ids are in range, every merge names known tokens.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        let model_name = file.get_str("tokenizer.ggml.model")?;
        let arch = file
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        let tokens: Vec<String> = file
            .get_str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_string)
            .collect();
        let n = tokens.len();
        if n == 0 || n > MAX_VOCAB {
            return Err(meta(
                "tokenizer.ggml.tokens",
                format!("{n} tokens (expected 1..={MAX_VOCAB})"),
            ));
        }
        let types: Vec<TokenType> = match file.get("tokenizer.ggml.token_type") {
            None => vec![TokenType::Normal; n],
            Some(_) => {
                let codes = file.get_int_array("tokenizer.ggml.token_type")?;
                if codes.len() != n {
                    return Err(meta(
                        "tokenizer.ggml.token_type",
                        format!("{} entries for {n} tokens", codes.len()),
                    ));
                }
                codes
                    .iter()
                    .enumerate()
                    .map(|(i, &c)| {
                        TokenType::from_code(c).ok_or_else(|| {
                            meta(
                                "tokenizer.ggml.token_type",
                                format!("token {i}: unknown type {c}"),
                            )
                        })
                    })
                    .collect::<Result<_>>()?
            }
        };
        let scores: Option<&[f32]> = match file.get("tokenizer.ggml.scores") {
            None => None,
            Some(_) => {
                let s = file.get_f32_array("tokenizer.ggml.scores")?;
                if s.len() != n {
                    return Err(meta(
                        "tokenizer.ggml.scores",
                        format!("{} entries for {n} tokens", s.len()),
                    ));
                }
                Some(s)
            }
        };
        let id_key = |key: &str| -> Result<Option<u32>> {
            match file.get(key) {
                None => Ok(None),
                Some(v) => {
                    let id = v.as_int().ok_or_else(|| {
                        meta(key, format!("expected an integer, found {}", v.type_desc()))
                    })?;
                    // Some converters write -1 for "none".
                    if id == -1 {
                        return Ok(None);
                    }
                    match u32::try_from(id) {
                        Ok(id) if (id as usize) < n => Ok(Some(id)),
                        _ => Err(meta(
                            key,
                            format!("token id {id} is out of range for a vocabulary of {n}"),
                        )),
                    }
                }
            }
        };
        let bos = id_key("tokenizer.ggml.bos_token_id")?;
        let eos = id_key("tokenizer.ggml.eos_token_id")?;
        let unk = id_key("tokenizer.ggml.unknown_token_id")?;
        let pad = id_key("tokenizer.ggml.padding_token_id")?;
        let eom = id_key("tokenizer.ggml.eom_token_id")?;
        id_key("tokenizer.ggml.seperator_token_id")?;
        let mut eot = id_key("tokenizer.ggml.eot_token_id")?;
        let flag = |key: &str| -> Result<Option<bool>> {
            match file.get(key) {
                None => Ok(None),
                Some(_) => Ok(Some(file.get_bool(key)?)),
            }
        };

        let is_gemma = arch.starts_with("gemma");
        let (model, lookup, add_bos_default) = match model_name {
            "gpt2" => {
                let pre = PreTokenizer::for_name(
                    file.get("tokenizer.ggml.pre").and_then(|v| v.as_str()),
                )?;
                let lookup = first_ids(tokens.iter().cloned());
                let merges = read_merges(file, &lookup)?;
                let chars = pretok::byte_to_char();
                let mut byte_token = [None; 256];
                for (b, slot) in byte_token.iter_mut().enumerate() {
                    *slot = lookup.get(chars[b].to_string().as_str()).copied();
                }
                (
                    Model::Bpe {
                        pre,
                        merges,
                        byte_token,
                    },
                    lookup,
                    false,
                )
            }
            "llama" => {
                let scores = scores.ok_or_else(|| {
                    meta(
                        "tokenizer.ggml.scores",
                        "missing (needed by a SentencePiece vocabulary)",
                    )
                })?;
                let priority: Vec<i64> = if is_gemma {
                    (0..n as i64).collect()
                } else {
                    scores.iter().map(|&s| merge::score_key(s)).collect()
                };
                // Gemma stores runs of spaces with real spaces; merging sees `▁`.
                let spelled = tokens.iter().map(|t| {
                    if is_gemma && t.contains(' ') && t.trim().is_empty() {
                        t.replace(' ', "▁")
                    } else {
                        t.clone()
                    }
                });
                let lookup = first_ids(spelled);
                let mut byte_token = [None; 256];
                for (id, t) in tokens.iter().enumerate() {
                    if let Some(b) = parse_byte_token(t) {
                        byte_token[b as usize].get_or_insert(id as u32);
                    }
                }
                let add_space_prefix = flag("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
                (
                    Model::Spm {
                        priority,
                        byte_token,
                        add_space_prefix,
                    },
                    lookup,
                    true,
                )
            }
            other => {
                return Err(TokenizerError::Unsupported(format!(
                    "tokenizer model tokenizer.ggml.model = '{other}' (supported: gpt2, llama)"
                )))
            }
        };

        let add_bos = flag("tokenizer.ggml.add_bos_token")?.unwrap_or(add_bos_default);
        let add_eos = flag("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        if add_bos && bos.is_none() {
            return Err(meta(
                "tokenizer.ggml.bos_token_id",
                "missing, but tokenizer.ggml.add_bos_token asks for a BOS token",
            ));
        }
        if add_eos && eos.is_none() {
            return Err(meta(
                "tokenizer.ggml.eos_token_id",
                "missing, but tokenizer.ggml.add_eos_token asks for an EOS token",
            ));
        }

        let byte_level = matches!(model, Model::Bpe { .. }).then(|| {
            let mut inv = HashMap::with_capacity(256);
            for (b, c) in pretok::byte_to_char().iter().enumerate() {
                inv.insert(*c, b as u8);
            }
            inv
        });
        let bytes: Vec<Vec<u8>> = tokens
            .iter()
            .zip(&types)
            .map(|(t, &ty)| token_to_bytes(t, ty, byte_level.as_ref()))
            .collect();

        let mut specials = Specials::default();
        for (id, (t, &ty)) in tokens.iter().zip(&types).enumerate() {
            let control = ty == TokenType::Control;
            if !(control || ty == TokenType::UserDefined) || t.is_empty() {
                continue;
            }
            // A respelled Gemma whitespace token is merged, not matched (as in transformers).
            if ty == TokenType::UserDefined && lookup.get(t.as_str()) != Some(&(id as u32)) {
                continue;
            }
            specials.insert(t.as_bytes(), id as u32, control);
        }

        let mut eog: Vec<u32> = [eos, eom].into_iter().flatten().collect();
        let control_with_text = |text: &str| -> Option<u32> {
            let id = *lookup.get(text)?;
            (types[id as usize] == TokenType::Control).then_some(id)
        };
        if eot.is_none() {
            eot = EOG_TEXTS.iter().find_map(|t| control_with_text(t));
        }
        eog.extend(eot);
        eog.extend(EOG_TEXTS.iter().filter_map(|t| control_with_text(t)));
        eog.sort_unstable();
        eog.dedup();

        Ok(Tokenizer {
            model,
            tokens,
            types,
            lookup,
            bytes,
            specials,
            bos,
            eos,
            eot,
            unk,
            pad,
            eog,
            add_bos,
            add_eos,
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }
    /// End of turn (`<|im_end|>`, `<end_of_turn>`, ...): from metadata, else found by text.
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }
    /// Whether `encode(.., add_special = true)` prepends BOS / appends EOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }
    /// End-of-generation tokens: EOS, EOT, EOM and control tokens named like them.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }
    /// A token's text as the file stores it (`Ġthe`, `▁the`, `<0x0A>`), None out of range.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }
    /// The id of a token by its stored text (`<|im_start|>`, `<start_of_turn>`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.lookup
            .get(text)
            .copied()
            .or_else(|| self.tokens.iter().position(|t| t == text).map(|i| i as u32))
    }
    /// The bytes a token decodes to; a piece of a UTF-8 char for byte tokens. Empty out of range.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// Encodes `text`: special tokens written in the text are matched (parse_special), and
    /// BOS/EOS are added as the metadata's `add_bos`/`add_eos` say when `add_special`.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        self.encode_with(text, add_special, true)
    }

    /// `encode` with control-token matching chosen separately: with `parse_special` off,
    /// `<|im_start|>` in the text is plain text (user-defined tokens still match whole).
    pub fn encode_with(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>> {
        self.encode_plain_ranges(text, add_special, parse_special, &[])
    }

    /// `encode_with` where control tokens are matched only outside the byte ranges `plain`
    /// (a rendered chat prompt: the template's own markup parses, the messages' text stays
    /// plain text even where it spells `<|im_end|>`). A control token that would start
    /// before a plain range and end inside it is not matched either.
    pub fn encode_plain_ranges(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        plain: &[std::ops::Range<usize>],
    ) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        // SentencePiece puts a space before text at the start and after each special token.
        let mut prev_special = true;
        for frag in self.partition(text, parse_special, plain) {
            match frag {
                Frag::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Frag::Text(s) => {
                    match &self.model {
                        Model::Bpe { .. } => self.encode_bpe(s, &mut out)?,
                        Model::Spm {
                            add_space_prefix, ..
                        } => self.encode_spm(s, *add_space_prefix && prev_special, &mut out),
                    }
                    prev_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        Ok(out)
    }

    /// Concatenated bytes of `ids`, decoded as UTF-8 (invalid sequences become U+FFFD). With
    /// `add_space_prefix`, the space the encoder put before the text is removed again.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut buf = Vec::new();
        for &id in ids {
            buf.extend_from_slice(self.token_bytes(id));
        }
        let strip = matches!(
            self.model,
            Model::Spm {
                add_space_prefix: true,
                ..
            }
        ) && ids
            .first()
            .is_some_and(|&id| self.token_type(id) != Some(TokenType::Control));
        let start = usize::from(strip && buf.first() == Some(&b' '));
        String::from_utf8_lossy(&buf[start..]).into_owned()
    }

    /// Checks that every id is in the vocabulary.
    pub fn check_ids(&self, ids: &[u32]) -> Result<()> {
        match ids.iter().find(|&&id| id as usize >= self.tokens.len()) {
            Some(&id) => Err(TokenizerError::TokenId {
                id,
                vocab: self.tokens.len(),
            }),
            None => Ok(()),
        }
    }

    /// Splits `text` into raw-text fragments and whole special tokens, leftmost-longest.
    fn partition<'a>(
        &self,
        text: &'a str,
        parse_special: bool,
        plain: &[std::ops::Range<usize>],
    ) -> Vec<Frag<'a>> {
        let mut out = Vec::new();
        let bytes = text.as_bytes();
        let mut start = 0;
        let mut i = 0;
        while i < bytes.len() {
            let ps = parse_special && !plain.iter().any(|r| r.contains(&i));
            let mut found = self.specials.longest_at(&bytes[i..], ps);
            if let Some((len, _)) = found {
                if ps && plain.iter().any(|r| i < r.start && i + len > r.start) {
                    found = self.specials.longest_at(&bytes[i..], false);
                }
            }
            match found {
                Some((len, id)) => {
                    if start < i {
                        out.push(Frag::Text(&text[start..i]));
                    }
                    out.push(Frag::Token(id));
                    i += len;
                    start = i;
                }
                None => i += 1,
            }
        }
        if start < bytes.len() {
            out.push(Frag::Text(&text[start..]));
        }
        out
    }

    fn encode_bpe(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let Model::Bpe {
            pre,
            merges,
            byte_token,
        } = &self.model
        else {
            return Ok(());
        };
        let chars = pretok::byte_to_char();
        for piece in pre.split(text)? {
            let pb = piece.as_bytes();
            if pre.ignore_merges {
                let spelled: String = pb.iter().map(|&b| chars[b as usize]).collect();
                if let Some(&id) = self.lookup.get(spelled.as_str()) {
                    out.push(id);
                    continue;
                }
            }
            let syms =
                merge::symbols((0..pb.len()).map(|i| (i, i + 1, byte_token[pb[i] as usize])));
            let syms = merge::merge(syms, |l, r| {
                let &(rank, merged) = merges.get(&(l.id?, r.id?))?;
                Some((i64::from(rank), merged))
            });
            for s in syms {
                match s.id {
                    Some(id) => out.push(id),
                    // Only a byte whose GPT-2 char the vocab lacks ends up here.
                    None => out.extend(self.unk),
                }
            }
        }
        Ok(())
    }

    fn encode_spm(&self, text: &str, space_prefix: bool, out: &mut Vec<u32>) {
        let Model::Spm {
            priority,
            byte_token,
            ..
        } = &self.model
        else {
            return;
        };
        let mut escaped = String::with_capacity(text.len() + 3);
        if space_prefix {
            escaped.push('▁');
        }
        for c in text.chars() {
            escaped.push(if c == ' ' { '▁' } else { c });
        }
        let s = escaped.as_str();
        let syms = merge::symbols(s.char_indices().map(|(i, c)| {
            let end = i + c.len_utf8();
            (i, end, self.lookup.get(&s[i..end]).copied())
        }));
        let syms = merge::merge(syms, |l, r| {
            let &id = self.lookup.get(&s[l.start..r.end])?;
            Some((priority[id as usize], id))
        });
        for sym in syms {
            match sym.id {
                Some(id) => out.push(id),
                None => {
                    for &b in &s.as_bytes()[sym.start..sym.end] {
                        out.extend(byte_token[b as usize].or(self.unk));
                    }
                }
            }
        }
    }
}

/// Special and user-defined tokens, found by text; candidates at a position are tried
/// longest first (one hash lookup per distinct length starting with that byte).
#[derive(Default)]
struct Specials {
    by_text: HashMap<Vec<u8>, (u32, bool)>,
    /// Per first byte: the distinct token lengths, longest first.
    lens: HashMap<u8, Vec<usize>>,
}

impl Specials {
    /// Adds a token; a text seen before keeps its first id.
    fn insert(&mut self, text: &[u8], id: u32, control: bool) {
        if self.by_text.contains_key(text) {
            return;
        }
        self.by_text.insert(text.to_vec(), (id, control));
        let lens = self.lens.entry(text[0]).or_default();
        if let Err(at) = lens.binary_search_by(|l| text.len().cmp(l)) {
            lens.insert(at, text.len());
        }
    }

    /// The longest token `rest` starts with, as (byte length, id); control tokens only
    /// when `parse_special`.
    fn longest_at(&self, rest: &[u8], parse_special: bool) -> Option<(usize, u32)> {
        let lens = self.lens.get(rest.first()?)?;
        lens.iter().filter(|&&l| l <= rest.len()).find_map(|&l| {
            let &(id, control) = self.by_text.get(&rest[..l])?;
            (parse_special || !control).then_some((l, id))
        })
    }
}

enum Frag<'a> {
    Text(&'a str),
    Token(u32),
}

/// Text -> first id with that text (later duplicates keep the first id, like llama.cpp).
fn first_ids(texts: impl Iterator<Item = String>) -> HashMap<String, u32> {
    let mut map = HashMap::new();
    for (id, t) in texts.enumerate() {
        map.entry(t).or_insert(id as u32);
    }
    map
}

/// `tokenizer.ggml.merges` ("left right", best first) as (left id, right id) -> (rank, merged).
fn read_merges(
    file: &GgufFile,
    lookup: &HashMap<String, u32>,
) -> Result<HashMap<(u32, u32), (u32, u32)>> {
    const KEY: &str = "tokenizer.ggml.merges";
    let list = file.get_str_array(KEY)?;
    let mut merges = HashMap::with_capacity(list.len());
    for (rank, m) in list.iter().enumerate() {
        // The separator is the first space after the first char (a token may start with ' ').
        let split = m
            .char_indices()
            .skip(1)
            .find(|&(_, c)| c == ' ')
            .map(|(i, _)| i)
            .ok_or_else(|| meta(KEY, format!("merge {rank} '{m}' has no 'left right' form")))?;
        let (l, r) = (&m[..split], &m[split + 1..]);
        let id = |t: &str| {
            lookup.get(t).copied().ok_or_else(|| {
                meta(
                    KEY,
                    format!("merge {rank} '{m}' refers to unknown token '{t}'"),
                )
            })
        };
        let key = (id(l)?, id(r)?);
        let merged = id(&format!("{l}{r}"))?;
        // A repeated pair keeps its first (best) rank.
        merges.entry(key).or_insert((rank as u32, merged));
    }
    Ok(merges)
}

/// `<0xAB>` -> 0xAB.
fn parse_byte_token(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// What a token decodes to. Byte-level: chars of GPT-2's alphabet map back to their bytes
/// (a token with other chars, e.g. a control token, is its own UTF-8). SentencePiece: `▁` is a
/// space and `<0xAB>` byte tokens are that byte.
/// `byte_level` is the inverse of GPT-2's byte alphabet for a byte-level vocabulary.
fn token_to_bytes(t: &str, ty: TokenType, byte_level: Option<&HashMap<char, u8>>) -> Vec<u8> {
    if let Some(inv) = byte_level {
        let mapped: Option<Vec<u8>> = t.chars().map(|c| inv.get(&c).copied()).collect();
        return mapped.unwrap_or_else(|| t.as_bytes().to_vec());
    }
    if ty == TokenType::Byte || ty == TokenType::Normal {
        if let Some(b) = parse_byte_token(t) {
            return vec![b];
        }
    }
    t.replace('▁', " ").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_gguf::{Array, GgufWriter, Value};

    /// A byte-level vocabulary: the 256 byte chars (id = byte), the merged tokens "Ġt", "he",
    /// "Ġthe" (256..=258), and two control tokens (259, 260).
    fn bpe_kv() -> Vec<(&'static str, Value)> {
        let chars = pretok::byte_to_char();
        let mut tokens: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
        tokens.extend(["Ġt", "he", "Ġthe", "<|end|>", "<|start|>"].map(String::from));
        let mut types = vec![1i32; 259];
        types.extend([3, 3]);
        vec![
            ("general.architecture", Value::String("llama".into())),
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            ("tokenizer.ggml.pre", Value::String("gpt-2".into())),
            (
                "tokenizer.ggml.tokens",
                Value::Array(Array::String(tokens.into())),
            ),
            ("tokenizer.ggml.token_type", Value::Array(Array::I32(types))),
            (
                "tokenizer.ggml.merges",
                Value::Array(Array::String(vec!["Ġ t", "h e", "Ġt he"].into())),
            ),
            ("tokenizer.ggml.eos_token_id", Value::U32(259)),
        ]
    }

    fn build(kv: &[(&str, Value)]) -> Result<Tokenizer> {
        let mut w = GgufWriter::new();
        for (k, v) in kv {
            w.set(k, v.clone()).unwrap();
        }
        let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        Tokenizer::from_gguf(&file)
    }

    fn with(key: &'static str, v: Value) -> Vec<(&'static str, Value)> {
        let mut kv: Vec<_> = bpe_kv().into_iter().filter(|(k, _)| *k != key).collect();
        kv.push((key, v));
        kv
    }

    fn err(kv: &[(&str, Value)]) -> String {
        match build(kv) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn tiny_bpe_encodes_and_decodes() {
        let tok = build(&bpe_kv()).unwrap();
        let the = tok.token_id("Ġthe").unwrap();
        assert_eq!(the, 258);
        // Token ids 0..256 are the bytes themselves here.
        let ids = tok.encode("a the<|end|>", false).unwrap();
        assert_eq!(ids, vec![u32::from(b'a'), the, 259]);
        assert_eq!(tok.decode(&ids), "a the<|end|>");
        // "<|end|>" is control and named like an end of turn: EOT by text.
        assert!(tok.is_eog(259) && tok.eot() == Some(259) && tok.eos() == Some(259));
        // Without parse_special the control token is spelled out in bytes.
        assert!(tok.encode_with("<|end|>", false, false).unwrap().len() > 1);
        // The longest special wins: "<|start|>" is not cut at "<|".
        assert_eq!(
            tok.encode("<|start|><|end|>", false).unwrap(),
            vec![260, 259]
        );
    }

    #[test]
    fn bad_metadata_is_a_clear_error() {
        let e = err(&with("tokenizer.ggml.eos_token_id", Value::U32(9999)));
        assert!(
            e.contains("eos_token_id") && e.contains("9999") && e.contains("261"),
            "{e}"
        );
        let e = err(&with(
            "tokenizer.ggml.merges",
            Value::Array(Array::String(vec!["Ġ t", "x yz"].into())),
        ));
        assert!(
            e.contains("merge 1 'x yz' refers to unknown token 'yz'"),
            "{e}"
        );
        let e = err(&with(
            "tokenizer.ggml.merges",
            Value::Array(Array::String(vec!["nospace"].into())),
        ));
        assert!(e.contains("merge 0"), "{e}");
        let e = err(&with(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![1; 3])),
        ));
        assert!(e.contains("3 entries for 261 tokens"), "{e}");
        let e = err(&with(
            "tokenizer.ggml.scores",
            Value::Array(Array::F32(vec![0.0; 5])),
        ));
        assert!(e.contains("5 entries for 261 tokens"), "{e}");
        let e = err(&with("tokenizer.ggml.model", Value::String("bert".into())));
        assert!(e.contains("'bert'"), "{e}");
        let e = err(&with("tokenizer.ggml.pre", Value::String("mystery".into())));
        assert!(e.contains("'mystery'"), "{e}");
        let e = err(&with("tokenizer.ggml.add_bos_token", Value::Bool(true)));
        assert!(e.contains("bos_token_id"), "{e}");
        let none: ferrite_gguf::StrArray = Vec::<String>::new().into();
        let e = err(&with(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(none)),
        ));
        assert!(e.contains("tokenizer.ggml.tokens"), "{e}");
        let e = err(&with(
            "tokenizer.ggml.bos_token_id",
            Value::String("1".into()),
        ));
        assert!(e.contains("bos_token_id"), "{e}");
    }
}
