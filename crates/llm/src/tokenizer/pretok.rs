//! Byte-level BPE helpers: GPT-2's byte <-> char spelling and the pre-tokenizer regexes that
//! `tokenizer.ggml.pre` names (the same table llama.cpp's `llm_tokenizer_bpe` uses).

use fancy_regex::Regex;

use super::TokenizerError;

/// GPT-2's `bytes_to_unicode`: printable bytes spell themselves, the other 68 bytes map to
/// U+0100.. in byte order. Vocab tokens of a byte-level BPE are written in these chars.
pub(crate) fn byte_to_char() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut extra = 0u32;
    for (b, slot) in out.iter_mut().enumerate() {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
        let cp = if printable {
            b as u32
        } else {
            extra += 1;
            255 + extra
        };
        // Every code point here is below U+0144, all valid chars.
        *slot = char::from_u32(cp).unwrap_or('\0');
    }
    out
}

/// GPT-2's original split (also MPT, OLMo, ...).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's split (tokenizer.json's original, with the case-insensitive contractions).
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split: like Llama 3's, but single digits.
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A pre-tokenizer: regexes applied in order, each splitting every piece the previous ones
/// left into its matches and the gaps between them (both kept, like `Split(.., "isolated")`).
pub(crate) struct PreTokenizer {
    regexes: Vec<Regex>,
    /// Llama-3 style: a piece that is itself a vocab token is emitted whole, merges skipped.
    pub ignore_merges: bool,
}

impl PreTokenizer {
    /// The pre-tokenizer for `tokenizer.ggml.pre` = `name` (None or "default": llama.cpp's
    /// default split). Unknown names are an error listing the supported ones.
    pub fn for_name(name: Option<&str>) -> Result<PreTokenizer, TokenizerError> {
        let (patterns, ignore_merges): (&[&str], bool) = match name.unwrap_or("default") {
            "default" => (
                &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
                false,
            ),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" => (&[LLAMA3], true),
            "dbrx" | "smaug-bpe" => (&[LLAMA3], false),
            "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "hunyuan" => (&[QWEN2], false),
            // Digits one at a time, then GPT-2's split.
            "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
                (&[r"\p{N}", GPT2], false)
            }
            // llama.cpp splits SmolLM's digits first too, but transformers (the reference the
            // tests hold ferrite to) uses GPT-2's split alone. SmolLM's vocabulary merges no
            // digits, so the two differ only for a whitespace run before a digit: "  1" is
            // [Ġ, Ġ, 1] here and in transformers, [ĠĠ, 1] in llama.cpp.
            "smollm" => (&[GPT2], false),
            "falcon" => (
                &[
                    r"[\p{P}\$\+<=>\^~\|`]+",
                    GPT2,
                    r"[0-9][0-9][0-9]",
                ],
                false,
            ),
            "deepseek-coder" => (
                &[
                    r"[\r\n]",
                    r"\s?\p{L}+",
                    r"\s?\p{P}+",
                    r"[一-龥ࠀ-一가-퟿]+",
                    r"\p{N}",
                ],
                false,
            ),
            // The character classes are llama.cpp's, written as \u{..} escapes for the regex.
            "deepseek-llm" => (
                &[
                    "[\\r\\n]",
                    "\\s?[A-Za-z\\u{b5}\\u{c0}-\\u{d6}\\u{d8}-\\u{f6}\\u{f8}-\\u{1ba}\\u{1bc}-\\u{1bf}\\u{1c4}-\\u{293}\\u{295}-\\u{2af}\\u{370}-\\u{373}\\u{376}\\u{377}\\u{37b}-\\u{37d}\\u{37f}\\u{386}\\u{388}-\\u{38a}\\u{38c}\\u{38e}-\\u{3a1}\\u{3a3}-\\u{3f5}\\u{3f7}-\\u{481}\\u{48a}-\\u{52f}\\u{531}-\\u{556}\\u{10a0}-\\u{10c5}\\u{13a0}-\\u{13f5}\\u{13f8}-\\u{13fd}\\u{1c90}-\\u{1cba}\\u{1cbd}-\\u{1cbf}\\u{1d00}-\\u{1d2b}\\u{1d6b}-\\u{1d77}\\u{1d79}-\\u{1d9a}\\u{1e00}-\\u{1f15}\\u{1f18}-\\u{1f1d}\\u{1f20}-\\u{1f45}\\u{1f48}-\\u{1f4d}\\u{1f50}-\\u{1f57}\\u{1f59}\\u{1f5b}\\u{1f5d}\\u{1f5f}-\\u{1f7d}\\u{1f80}-\\u{1fb4}\\u{1fb6}-\\u{1fbc}\\u{1fbe}\\u{1fc2}-\\u{1fc4}\\u{1fc6}-\\u{1fcc}\\u{1fd0}-\\u{1fd3}\\u{1fd6}-\\u{1fdb}\\u{1fe0}-\\u{1fec}\\u{1ff2}-\\u{1ff4}\\u{1ff6}-\\u{1ffc}\\u{2102}\\u{2107}\\u{210a}-\\u{2113}\\u{2115}\\u{2119}-\\u{211d}\\u{2124}\\u{2126}\\u{2128}\\u{212a}-\\u{212d}\\u{212f}-\\u{2134}\\u{2139}\\u{213c}-\\u{213f}\\u{2145}-\\u{2149}\\u{214e}\\u{2183}\\u{2184}\\u{2c00}-\\u{2c7b}\\u{2c7e}-\\u{2ce4}\\u{2ceb}-\\u{2cee}\\u{2cf2}\\u{2cf3}\\u{a640}-\\u{a66d}\\u{a680}-\\u{a69b}\\u{a722}-\\u{a76f}\\u{a771}-\\u{a787}\\u{a78b}-\\u{a78e}\\u{ab70}-\\u{abbf}\\u{fb00}-\\u{fb06}\\u{fb13}-\\u{fb17}\\u{ff21}-\\u{ff3a}\\u{ff41}-\\u{ff5a}\\u{10400}-\\u{1044f}\\u{104b0}-\\u{104d3}\\u{104d8}-\\u{104fb}\\u{10c80}-\\u{10cb2}\\u{10cc0}-\\u{10cf2}\\u{118a0}-\\u{118df}\\u{1e900}-\\u{1e943}]+",
                    "\\s?[!-/:-~\\u{ff01}-\\u{ff0f}\\u{ff1a}-\\u{ff5e}\\u{2018}-\\u{201f}\\u{3000}-\\u{3002}]+",
                    "\\s+$",
                    "[\\u{4e00}-\\u{9fa5}\\u{800}-\\u{4e00}\\u{ac00}-\\u{d7ff}]+",
                    "\\p{N}+",
                ],
                false,
            ),
            "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "trillion" | "roberta-bpe"
            | "jina-es" | "jina-de" | "jina-v1-en" | "jina-v2-es" | "jina-v2-de"
            | "jina-v2-code" | "gigachat" | "mellum" | "a.x-4.0" => (&[GPT2], false),
            other => {
                return Err(TokenizerError::Unsupported(format!(
                    "pre-tokenizer tokenizer.ggml.pre = '{other}' (supported: default, gpt-2, \
                     llama-bpe/llama3, qwen2, smollm, starcoder, falcon, deepseek-llm, \
                     deepseek-coder, dbrx, and their aliases)"
                )))
            }
        };
        let regexes = patterns
            .iter()
            .map(|p| {
                Regex::new(p).map_err(|e| {
                    TokenizerError::Unsupported(format!("pre-tokenizer regex {p:?}: {e}"))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(PreTokenizer {
            regexes,
            ignore_merges,
        })
    }

    /// Splits `text` into pieces (non-empty, in order, concatenating back to `text`).
    pub fn split<'a>(&self, text: &'a str) -> Result<Vec<&'a str>, TokenizerError> {
        let mut pieces = vec![text];
        for re in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                let mut last = 0;
                for m in re.find_iter(piece) {
                    let m = m.map_err(|e| {
                        TokenizerError::Encode(format!("pre-tokenizer regex failed: {e}"))
                    })?;
                    if m.start() > last {
                        next.push(&piece[last..m.start()]);
                    }
                    if m.end() > m.start() {
                        next.push(m.as_str());
                    }
                    last = m.end();
                }
                if last < piece.len() {
                    next.push(&piece[last..]);
                }
            }
            pieces = next;
        }
        Ok(pieces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_gpt2s() {
        let m = byte_to_char();
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
        assert_eq!(m[b'\t' as usize], 'ĉ');
        assert_eq!(m[b'A' as usize], 'A');
        assert_eq!(m[0xAD], 'Ń');
        let mut all: Vec<char> = m.to_vec();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn splits_keep_every_byte() {
        for name in ["default", "gpt-2", "llama-bpe", "qwen2", "smollm"] {
            let p = PreTokenizer::for_name(Some(name)).unwrap();
            let text = "Hello,  world!\t\n 12345 it's  \u{1F999} ÄÖ ";
            let pieces = p.split(text).unwrap();
            assert_eq!(pieces.concat(), text, "{name}");
        }
        let p = PreTokenizer::for_name(Some("starcoder")).unwrap();
        assert_eq!(p.split(" 2018").unwrap(), vec![" ", "2", "0", "1", "8"]);
        let p = PreTokenizer::for_name(Some("llama-bpe")).unwrap();
        assert_eq!(
            p.split("12345 IT'S").unwrap(),
            vec!["123", "45", " IT", "'S"]
        );
    }

    #[test]
    fn unknown_pre_is_an_error() {
        let e = PreTokenizer::for_name(Some("nonesuch")).err().unwrap();
        assert!(e.to_string().contains("nonesuch"), "{e}");
    }
}
