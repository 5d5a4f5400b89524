//! Text as fixed-length windows of token ids for next-token prediction: characters (a
//! vocabulary of the text's distinct characters) or the tokens of any tokenizer (e.g. a GGUF
//! model's, which `ferrite train` passes in).

use super::{Dataset, DrawContext, HostTensor};
use crate::{Error, Result};
use ferrite_core::HostBuffer;

const WHAT: &str = "TextWindows";

/// Windows `x = tokens[s .. s + ctx]`, `y = tokens[s + 1 .. s + ctx + 1]` at starts
/// `s = 0, stride, 2 stride, ...` (u32 ids; examples `[x [ctx], y [ctx]]`).
#[derive(Clone, Debug)]
pub struct TextWindows {
    tokens: Vec<u32>,
    ctx: usize,
    stride: usize,
    /// The characters of the vocabulary, in id order (character-level data only).
    pub chars: Vec<char>,
}

impl TextWindows {
    /// Character-level windows: ids index the sorted distinct characters of `text`.
    pub fn chars(text: &str, ctx: usize, stride: usize) -> Result<TextWindows> {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        let tokens = text
            .chars()
            .map(|c| chars.binary_search(&c).map_or(0, |i| i as u32))
            .collect();
        let mut w = TextWindows::tokens(tokens, ctx, stride)?;
        w.chars = chars;
        Ok(w)
    }

    /// Character-level windows over a fixed vocabulary (e.g. the training set's, for its
    /// validation text); a character outside it is an error naming it and its offset.
    pub fn chars_with_vocab(
        text: &str,
        chars: &[char],
        ctx: usize,
        stride: usize,
    ) -> Result<TextWindows> {
        let mut tokens = Vec::with_capacity(text.len());
        for (i, c) in text.chars().enumerate() {
            let id = chars.iter().position(|&v| v == c).ok_or_else(|| {
                Error::data(
                    WHAT,
                    format!("character {c:?} at offset {i} is not in the vocabulary"),
                )
            })?;
            tokens.push(id as u32);
        }
        let mut w = TextWindows::tokens(tokens, ctx, stride)?;
        w.chars = chars.to_vec();
        Ok(w)
    }

    pub fn tokens(tokens: Vec<u32>, ctx: usize, stride: usize) -> Result<TextWindows> {
        if ctx == 0 || stride == 0 {
            return Err(Error::config(
                WHAT,
                format!("context and stride must be at least 1, got {ctx} and {stride}"),
            ));
        }
        if tokens.len() < ctx + 1 {
            return Err(Error::data(
                WHAT,
                format!(
                    "{} tokens cannot fill one window of {ctx} (+1 for the targets)",
                    tokens.len()
                ),
            ));
        }
        Ok(TextWindows {
            tokens,
            ctx,
            stride,
            chars: Vec::new(),
        })
    }

    pub fn vocab_size(&self) -> usize {
        if self.chars.is_empty() {
            self.tokens.iter().max().map_or(0, |m| *m as usize + 1)
        } else {
            self.chars.len()
        }
    }

    /// Text of ids in a character vocabulary (`?` for an id outside it).
    pub fn decode(&self, ids: &[u32]) -> String {
        ids.iter()
            .map(|&i| self.chars.get(i as usize).copied().unwrap_or('?'))
            .collect()
    }

    pub fn context(&self) -> usize {
        self.ctx
    }
}

impl Dataset for TextWindows {
    fn len(&self) -> usize {
        (self.tokens.len() - self.ctx - 1) / self.stride + 1
    }

    fn get(&self, index: usize, _ctx: DrawContext) -> Result<Vec<HostTensor>> {
        if index >= self.len() {
            return Err(Error::data(
                WHAT,
                format!("window {index} out of range for {}", self.len()),
            ));
        }
        let s = index * self.stride;
        let x = self.tokens[s..s + self.ctx].to_vec();
        let y = self.tokens[s + 1..s + self.ctx + 1].to_vec();
        Ok(vec![
            HostTensor {
                data: HostBuffer::U32(x),
                shape: vec![self.ctx],
            },
            HostTensor {
                data: HostBuffer::U32(y),
                shape: vec![self.ctx],
            },
        ])
    }
}
