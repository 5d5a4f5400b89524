//! The vocabulary as a trie over token bytes, built once per tokenizer and shared by every
//! constrained request: a constraint walks it depth first, advancing its recognizer once per
//! trie edge, so a prefix shared by many tokens is walked once.

use super::ByteSet;
use crate::tokenizer::{TokenType, Tokenizer};

/// Tokens longer than this are left out of the trie (never allowed under a constraint).
pub const MAX_TOKEN_BYTES: usize = 1024;

#[derive(Clone, Copy, Debug)]
pub(crate) struct TrieNode {
    /// Children: `edges[edges_lo..edges_hi]`.
    pub edges_lo: u32,
    pub edges_hi: u32,
    /// Tokens ending here: `order[order_lo..ends_hi]`; the whole subtree (this node's tokens
    /// and every descendant's): `order[order_lo..order_hi]`.
    pub order_lo: u32,
    pub ends_hi: u32,
    pub order_hi: u32,
    /// Every byte on an edge below this node.
    pub below: ByteSet,
    /// The longest path below this node, in bytes.
    pub max_len: u32,
}

/// The token trie of one vocabulary (see the module docs).
#[derive(Debug)]
pub struct TokenTrie {
    /// Logit rows have this many entries (ids at or past the tokenizer's count are masked).
    vocab: usize,
    /// Token ids in the trie, sorted by their bytes (a subtree is a contiguous range).
    pub(crate) order: Vec<u32>,
    pub(crate) nodes: Vec<TrieNode>,
    pub(crate) edges: Vec<(u8, u32)>,
    /// Each id's bytes: `bytes[offs[id]..offs[id + 1]]`.
    bytes: Vec<u8>,
    offs: Vec<u32>,
    /// Whether each id is in the trie.
    included: Vec<bool>,
}

impl TokenTrie {
    /// The trie of `tokens` (each id's decoded bytes, `None` for a token a constraint must
    /// never allow), for logit rows of `vocab` entries. Empty tokens and tokens over
    /// [`MAX_TOKEN_BYTES`] are left out too.
    pub fn new(tokens: &[Option<&[u8]>], vocab: usize) -> TokenTrie {
        let n = tokens.len().min(vocab);
        let mut bytes = Vec::new();
        let mut offs = Vec::with_capacity(n + 1);
        let mut included = vec![false; n];
        let mut ids = Vec::new();
        for (id, t) in tokens.iter().take(n).enumerate() {
            offs.push(bytes.len() as u32);
            if let Some(t) = t {
                bytes.extend_from_slice(t);
                if !t.is_empty() && t.len() <= MAX_TOKEN_BYTES {
                    included[id] = true;
                    ids.push(id as u32);
                }
            }
        }
        offs.push(bytes.len() as u32);
        let get = |id: u32| &bytes[offs[id as usize] as usize..offs[id as usize + 1] as usize];
        ids.sort_by(|&a, &b| get(a).cmp(get(b)).then(a.cmp(&b)));
        let mut t = TokenTrie {
            vocab,
            order: Vec::new(),
            nodes: Vec::new(),
            edges: Vec::new(),
            bytes: Vec::new(),
            offs: Vec::new(),
            included,
        };
        {
            let toks: Vec<&[u8]> = ids.iter().map(|&id| get(id)).collect();
            t.build(&toks, 0, toks.len(), 0);
        }
        t.order = ids;
        t.bytes = bytes;
        t.offs = offs;
        t
    }

    /// The trie of a tokenizer's vocabulary: control and unused tokens (and end-of-generation
    /// tokens, and the unknown token) are left out; the others as [`Tokenizer::token_bytes`] decodes them.
    pub fn from_tokenizer(tok: &Tokenizer, vocab: usize) -> TokenTrie {
        let tokens: Vec<Option<&[u8]>> = (0..tok.vocab_size().min(vocab) as u32)
            .map(|id| {
                let ty = tok.token_type(id);
                let skip = matches!(
                    ty,
                    Some(TokenType::Control | TokenType::Unused | TokenType::Unknown)
                ) || tok.is_eog(id);
                (!skip).then(|| tok.token_bytes(id))
            })
            .collect();
        TokenTrie::new(&tokens, vocab)
    }

    /// Builds the node for tokens `toks[lo..hi]`, which share their first `depth` bytes
    /// (sorted, so the ones of exactly `depth` bytes come first); returns its index.
    /// Recursion depth is at most [`MAX_TOKEN_BYTES`].
    fn build(&mut self, toks: &[&[u8]], lo: usize, hi: usize, depth: usize) -> u32 {
        let me = self.nodes.len();
        let mut i = lo;
        while i < hi && toks[i].len() == depth {
            i += 1;
        }
        self.nodes.push(TrieNode {
            edges_lo: 0,
            edges_hi: 0,
            order_lo: lo as u32,
            ends_hi: i as u32,
            order_hi: hi as u32,
            below: ByteSet::EMPTY,
            max_len: 0,
        });
        let mut children = Vec::new();
        let (mut below, mut max_len) = (ByteSet::EMPTY, 0);
        while i < hi {
            let b = toks[i][depth];
            let mut j = i;
            while j < hi && toks[j][depth] == b {
                j += 1;
            }
            let c = self.build(toks, i, j, depth + 1);
            let cn = self.nodes[c as usize];
            below = below.union(&cn.below);
            below.insert(b);
            max_len = max_len.max(cn.max_len + 1);
            children.push((b, c));
            i = j;
        }
        let lo_e = self.edges.len() as u32;
        self.edges.extend(children);
        let node = &mut self.nodes[me];
        node.edges_lo = lo_e;
        node.edges_hi = self.edges.len() as u32;
        node.below = below;
        node.max_len = max_len;
        me as u32
    }

    /// Entries of a logit row.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// A token's bytes, None when it is not in the trie (never allowed).
    pub fn token(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        if !self.included.get(i).copied().unwrap_or(false) {
            return None;
        }
        Some(&self.bytes[self.offs[i] as usize..self.offs[i + 1] as usize])
    }

    /// Nodes in the trie (for reports).
    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtrees_are_ranges_of_the_sorted_order() {
        let v: Vec<Option<&[u8]>> = vec![
            Some(b"ab"),
            Some(b"a"),
            None,
            Some(b""),
            Some(b"b"),
            Some(b"abc"),
            Some(b"a"),
        ];
        let t = TokenTrie::new(&v, 8);
        assert_eq!(t.order, vec![1, 6, 0, 5, 4]);
        let root = t.nodes[0];
        assert_eq!((root.order_lo, root.ends_hi, root.order_hi), (0, 0, 5));
        assert_eq!(root.max_len, 3);
        assert_eq!(root.below, ByteSet::of(b"abc"));
        let (b, a) = t.edges[root.edges_lo as usize];
        assert_eq!(b, b'a');
        let a = t.nodes[a as usize];
        assert_eq!((a.order_lo, a.ends_hi, a.order_hi), (0, 2, 4));
        assert_eq!(t.token(5), Some(&b"abc"[..]));
        assert_eq!(t.token(2), None);
        assert_eq!(t.token(3), None);
        assert_eq!(t.token(7), None);
    }
}
