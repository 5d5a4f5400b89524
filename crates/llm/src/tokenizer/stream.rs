//! Streaming detokenization that never emits half a UTF-8 character.

/// Buffers token bytes and hands out only complete UTF-8 text.
///
/// Contract: `push` returns the longest prefix of everything pushed so far (and not yet
/// returned) that is complete UTF-8; an incomplete sequence at the end waits for more bytes.
/// Bytes that can never become valid UTF-8 are returned as U+FFFD. `finish` drops what is
/// left: only ever the start of a char that generation cut off, which a reader must not see
/// as U+FFFD.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds `bytes` (e.g. `Tokenizer::token_bytes(id)`) and returns the text now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // valid_up_to marks a valid prefix, so this conversion cannot fail.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // An incomplete char at the end: keep it for the next push.
                        None => {
                            rest = after;
                            break;
                        }
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// Bytes held back, waiting for the rest of a char.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the stream: the held-back start of an unfinished char is dropped (so a reply cut
    /// by a token limit never ends in U+FFFD); returns the text still to show (always empty:
    /// `push` hands out everything else at once) and resets.
    pub fn finish(&mut self) -> String {
        // `push` leaves only an incomplete sequence here, never a complete char.
        self.pending.clear();
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_partial_chars() {
        let mut d = StreamDecoder::new();
        let llama = "🦙".as_bytes();
        assert_eq!(d.push(b"a"), "a");
        assert_eq!(d.push(&llama[..1]), "");
        assert_eq!(d.push(&llama[1..3]), "");
        assert_eq!(d.push(&llama[3..]), "🦙");
        assert_eq!(d.push("é".as_bytes()), "é");
        assert!(d.pending().is_empty());
    }

    #[test]
    fn invalid_bytes_become_replacement_chars() {
        let mut d = StreamDecoder::new();
        assert_eq!(d.push(&[b'x', 0xFF, b'y']), "x\u{FFFD}y");
        assert_eq!(d.push(&[0xE6, 0x97]), "");
        // A char cut at the end of the stream is dropped, not shown as U+FFFD.
        assert_eq!(d.finish(), "");
        assert_eq!(d.push(b"z"), "z");
        assert_eq!(d.push(&[0xF0, 0x9F, 0xA6]), "");
        assert_eq!(d.finish(), "");
        assert!(d.pending().is_empty());
    }
}
