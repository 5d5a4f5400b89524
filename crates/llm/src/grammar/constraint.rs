//! [`GrammarConstraint`]: a [`LogitsProcessor`] that keeps a request's output a prefix of a
//! sentence of a grammar.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::pda::{Arena, State};
use super::{Grammar, TokenTrie};
use crate::error::{Error, Result};
use crate::logits_processor::LogitsProcessor;

/// Masks kept per request, keyed by recognizer state (states repeat: inside a string, after
/// each comma of an array, ...); the cache is emptied when it holds more.
const CACHE_STATES: usize = 256;

/// Before each sampling step, sets to -inf the logit of every token whose bytes would make
/// the output no longer a prefix of a sentence of the grammar; the stop tokens keep their
/// logits only where the output is a complete sentence, and are then the only tokens left
/// when nothing can follow (the request ends there). Tokens outside the trie (control,
/// empty) are always masked.
///
/// Cost per step: a depth-first walk of the token trie from the current state, pruned where
/// the state dies and cut short where one stack loops over every byte of a subtree (inside
/// a string); masks are cached by state.
pub struct GrammarConstraint {
    g: Arc<Grammar>,
    trie: Arc<TokenTrie>,
    stop: Vec<u32>,
    arena: Arena,
    state: State,
    /// A token was accepted that the grammar does not allow (only possible when every
    /// token was masked and a stop token was then refused, or through `accept` by hand).
    dead: bool,
    /// One state per trie depth during a walk.
    scratch: Vec<State>,
    cache: HashMap<Vec<u32>, Arc<Vec<u64>>>,
    key: Vec<u32>,
    /// Set while the output is a complete sentence (read by whoever ends the request).
    complete: Arc<AtomicBool>,
}

impl GrammarConstraint {
    /// A constraint at the start of the output. `stop` are the tokens that end the request
    /// (end of generation); the grammar must allow at least one sentence start.
    pub fn new(g: Arc<Grammar>, trie: Arc<TokenTrie>, stop: Vec<u32>) -> Result<Self> {
        let mut arena = Arena::default();
        let state = arena.start(&g);
        if !state.alive() {
            return Err(Error::Other(
                "grammar constraint: the grammar matches nothing".into(),
            ));
        }
        Ok(GrammarConstraint {
            g,
            trie,
            stop,
            arena,
            state,
            dead: false,
            scratch: Vec::new(),
            cache: HashMap::new(),
            key: Vec::new(),
            complete: Arc::new(AtomicBool::new(false)),
        })
    }

    /// A flag that follows [`GrammarConstraint::is_complete`] after each accepted token, for
    /// the owner of the request once the constraint has moved into the engine.
    pub fn completion_flag(&self) -> Arc<AtomicBool> {
        self.complete.clone()
    }

    /// Whether the output so far is a complete sentence.
    pub fn is_complete(&self) -> bool {
        !self.dead && self.state.complete
    }

    /// Whether the output so far is a complete sentence that nothing may extend.
    pub fn is_finished(&self) -> bool {
        self.is_complete() && self.state.stacks.is_empty()
    }

    /// Whether the output so far is a prefix of a sentence.
    pub fn is_alive(&self) -> bool {
        !self.dead && self.state.alive()
    }

    /// Advances over `bytes` (output not produced through tokens, or tests); returns
    /// whether the output is still a prefix of a sentence.
    pub fn advance_bytes(&mut self, bytes: &[u8]) -> bool {
        let mut next = State::default();
        for &b in bytes {
            if self.dead {
                break;
            }
            self.arena.advance(&self.g, &self.state, b, &mut next);
            std::mem::swap(&mut self.state, &mut next);
            if !self.state.alive() {
                self.dead = true;
            }
        }
        self.arena.compact(&mut self.state);
        self.complete.store(self.is_complete(), Ordering::Relaxed);
        !self.dead
    }

    /// Forgets the cached masks (to measure the walk itself).
    pub fn clear_cache(&mut self) {
        self.cache.clear();
    }

    /// The tokens allowed next (ignoring stop tokens), one bit per id (`id / 64`,
    /// `1 << id % 64`), for logit rows of `trie.vocab()` entries.
    pub fn allowed(&mut self) -> Arc<Vec<u64>> {
        let words = self.trie.vocab().div_ceil(64);
        if self.dead {
            return Arc::new(vec![0; words]);
        }
        self.key.clear();
        self.arena.key(&self.state, &mut self.key);
        if let Some(m) = self.cache.get(&self.key) {
            return m.clone();
        }
        let mut mask = vec![0u64; words];
        if self.scratch.is_empty() {
            self.scratch.push(State::default());
        }
        self.scratch[0].clone_from(&self.state);
        let base = self.arena.len();
        walk(
            &self.g,
            &self.trie,
            &mut self.arena,
            &mut self.scratch,
            0,
            0,
            &mut mask,
        );
        self.arena.truncate(base);
        let mask = Arc::new(mask);
        if self.cache.len() >= CACHE_STATES {
            self.cache.clear();
        }
        self.cache.insert(self.key.clone(), mask.clone());
        mask
    }
}

fn set(mask: &mut [u64], id: u32) {
    mask[(id / 64) as usize] |= 1 << (id % 64);
}

/// Marks every token at or below trie node `n` that keeps `scratch[d]` alive.
fn walk(
    g: &Grammar,
    trie: &TokenTrie,
    arena: &mut Arena,
    scratch: &mut Vec<State>,
    n: u32,
    d: usize,
    mask: &mut [u64],
) {
    let node = trie.nodes[n as usize];
    for &id in &trie.order[node.order_lo as usize..node.ends_hi as usize] {
        set(mask, id);
    }
    if node.edges_lo == node.edges_hi {
        return;
    }
    if arena.loops_over(g, &scratch[d], &node.below, node.max_len) {
        for &id in &trie.order[node.ends_hi as usize..node.order_hi as usize] {
            set(mask, id);
        }
        return;
    }
    let first = arena.first_bytes(g, &scratch[d]);
    if first.is_empty() {
        return;
    }
    if scratch.len() <= d + 1 {
        scratch.push(State::default());
    }
    let mark = arena.len();
    for e in node.edges_lo..node.edges_hi {
        let (b, child) = trie.edges[e as usize];
        if !first.contains(b) {
            continue;
        }
        let (cur, next) = scratch.split_at_mut(d + 1);
        arena.advance(g, &cur[d], b, &mut next[0]);
        if next[0].alive() {
            walk(g, trie, arena, scratch, child, d + 1, mask);
        }
        arena.truncate(mark);
    }
}

impl LogitsProcessor for GrammarConstraint {
    fn process(&mut self, logits: &mut [f32], _history: &[u32]) -> Result<()> {
        let stops: Vec<(usize, f32)> = self
            .stop
            .iter()
            .filter_map(|&s| logits.get(s as usize).map(|&l| (s as usize, l)))
            .collect();
        let mask = self.allowed();
        let mut any = false;
        for (i, l) in logits.iter_mut().enumerate() {
            let ok = mask.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1);
            if ok {
                any = true;
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        // Stop tokens: allowed where the output is complete; also where nothing else is
        // (a dead end the vocabulary cannot continue: end rather than emit a wrong token).
        let allow_stop = self.is_complete() || !any;
        for (i, l) in stops {
            logits[i] = if allow_stop { l } else { f32::NEG_INFINITY };
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) {
        if self.stop.contains(&token) || self.dead {
            return;
        }
        let trie = self.trie.clone();
        match trie.token(token) {
            Some(bytes) => {
                self.advance_bytes(bytes);
            }
            None => {
                self.dead = true;
                self.complete.store(false, Ordering::Relaxed);
            }
        }
    }
}
