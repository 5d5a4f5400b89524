//! The recognizer: a nondeterministic pushdown automaton over a [`Grammar`], one byte at a
//! time. A [`State`] is a set of stacks (one per way the input so far can continue), each a
//! chain of frames in an [`Arena`] whose top frame stands at a byte-set element; plus whether
//! the input so far is a whole sentence. Stacks share their tails, so advancing by a byte
//! pushes a few frames and copies nothing.

use std::collections::HashMap;

use super::{ByteSet, Grammar, Sym, INF};

/// A position in a rule: alternative `alt` of rule `rule`, at element `idx`, which has
/// matched `count` times (for an unbounded element, counts above its `min` are stored as
/// `min`: they allow the same continuations, so equal states compare equal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub rule: u32,
    pub alt: u32,
    pub idx: u32,
    pub count: u32,
}

#[derive(Clone, Copy, Debug)]
struct Node {
    frame: Frame,
    /// The frame below (the element of the parent rule being matched), or [`NONE`].
    parent: u32,
    /// Frames in the stack up to and including this one.
    depth: u32,
}

const NONE: u32 = u32::MAX;

/// Deepest stack (rule nesting); deeper continuations are dropped, which bounds the
/// nesting of generated documents (JSON: about 120 levels, two frames per level).
pub const MAX_DEPTH: u32 = 256;
/// Most stacks one state keeps; further ones (only very ambiguous grammars reach this)
/// are dropped: what remains still only allows valid continuations.
pub const MAX_STACKS: usize = 512;
/// Most expansion steps (frames settled) per byte: a hostile grammar (anyOf nested in
/// anyOf ...) cannot make one byte cost more; continuations past it are dropped, which only
/// narrows what is allowed. Ordinary JSON grammars take tens per byte.
pub const SETTLE_BUDGET: u32 = 8192;

/// A set of stacks (indices of their top nodes in the arena) and whether the input so far
/// is a complete sentence.
#[derive(Clone, Debug, Default)]
pub struct State {
    pub stacks: Vec<u32>,
    pub complete: bool,
}

impl State {
    /// Whether the input so far is a prefix of some sentence.
    pub fn alive(&self) -> bool {
        self.complete || !self.stacks.is_empty()
    }
}

/// The frames of every stack of the states built from it.
#[derive(Clone, Debug, Default)]
pub struct Arena {
    nodes: Vec<Node>,
    /// Expansion steps left for the current byte.
    budget: u32,
}

impl Arena {
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Drops the nodes pushed after `len` (states built since then become invalid).
    pub fn truncate(&mut self, len: usize) {
        self.nodes.truncate(len);
    }

    /// The state before any input: the root rule's alternatives expanded.
    pub fn start(&mut self, g: &Grammar) -> State {
        let mut out = State::default();
        self.budget = SETTLE_BUDGET;
        for a in 0..g.alts(g.root()).len() as u32 {
            let f = Frame {
                rule: g.root(),
                alt: a,
                idx: 0,
                count: 0,
            };
            self.settle(g, f, NONE, 1, &mut out);
        }
        out
    }

    /// The bytes some stack of `st` accepts next.
    pub fn first_bytes(&self, g: &Grammar, st: &State) -> ByteSet {
        let mut s = ByteSet::EMPTY;
        for &top in &st.stacks {
            if let Sym::Bytes(b) = self.top_elem(g, top).0 {
                s = s.union(&b);
            }
        }
        s
    }

    fn top_elem(&self, g: &Grammar, top: u32) -> (Sym, u32, u32) {
        let f = self.nodes[top as usize].frame;
        match g.elem(f.rule, f.alt, f.idx) {
            Some(e) => (e.sym, e.max, f.count),
            None => (Sym::Bytes(ByteSet::EMPTY), 0, 0),
        }
    }

    /// Whether some stack of `st` stays alive on any string of up to `len` bytes from
    /// `bytes`: its top element is a byte set covering them with room for `len` more
    /// matches, or it is the only element of an alternative of a rule that its parent
    /// repeats with room for `len` more (a counted string's characters). Every token of a
    /// trie subtree with those bytes and depth is then allowed at once.
    pub fn loops_over(&self, g: &Grammar, st: &State, bytes: &ByteSet, len: u32) -> bool {
        st.stacks.iter().any(|&top| {
            let (Sym::Bytes(b), max, count) = self.top_elem(g, top) else {
                return false;
            };
            if !b.covers(bytes) {
                return false;
            }
            if max == INF || max.saturating_sub(count) >= len {
                return true;
            }
            let n = self.nodes[top as usize];
            let f = n.frame;
            if max != 1
                || count != 0
                || g.alts(f.rule)[f.alt as usize].len() != 1
                || n.parent == NONE
            {
                return false;
            }
            let p = self.nodes[n.parent as usize].frame;
            match g.elem(p.rule, p.alt, p.idx) {
                Some(e) if e.sym == Sym::Rule(f.rule) => {
                    e.max == INF || e.max.saturating_sub(p.count) >= len
                }
                _ => false,
            }
        })
    }

    /// `out` = `from` after byte `b` (`out` is cleared first).
    pub fn advance(&mut self, g: &Grammar, from: &State, b: u8, out: &mut State) {
        out.stacks.clear();
        out.complete = false;
        self.budget = SETTLE_BUDGET;
        for &top in &from.stacks {
            let n = self.nodes[top as usize];
            let Some(e) = g.elem(n.frame.rule, n.frame.alt, n.frame.idx) else {
                continue;
            };
            if let Sym::Bytes(set) = e.sym {
                if set.contains(b) {
                    let f = Frame {
                        count: n.frame.count + 1,
                        ..n.frame
                    };
                    self.settle(g, f, n.parent, n.depth, out);
                }
            }
        }
    }

    /// Adds to `out` every stack whose top is a byte-set element reachable from frame `f`
    /// (at stack depth `depth`, over `parent`) without input; marks `out` complete when the
    /// root rule can end here.
    fn settle(&mut self, g: &Grammar, f: Frame, parent: u32, depth: u32, out: &mut State) {
        if self.budget == 0 {
            return;
        }
        self.budget -= 1;
        let Some(&e) = g.elem(f.rule, f.alt, f.idx) else {
            // This alternative is done: one more match of the parent's element.
            if parent == NONE {
                out.complete = true;
                return;
            }
            let p = self.nodes[parent as usize];
            let pf = Frame {
                count: p.frame.count + 1,
                ..p.frame
            };
            self.settle(g, pf, p.parent, p.depth, out);
            return;
        };
        let c = f.count;
        if c < e.max {
            let stored = if e.max == INF { c.min(e.min) } else { c };
            let fr = Frame { count: stored, ..f };
            match e.sym {
                Sym::Bytes(_) => {
                    if out.stacks.len() < MAX_STACKS {
                        let n = self.push(fr, parent, depth);
                        if out.stacks.iter().any(|&s| self.same_stack(s, n)) {
                            self.nodes.pop();
                        } else {
                            out.stacks.push(n);
                        }
                    }
                }
                Sym::Rule(r) => {
                    // A last element matched once ends its alternative when the child ends:
                    // the child returns straight to the frame below (a tail call), so
                    // sequences of properties or list items do not deepen the stack.
                    let tail = e.max == 1 && g.elem(f.rule, f.alt, f.idx + 1).is_none();
                    let (n, d) = if tail {
                        (parent, depth)
                    } else {
                        (self.push(fr, parent, depth), depth + 1)
                    };
                    if d <= MAX_DEPTH {
                        for a in 0..g.alts(r).len() as u32 {
                            let child = Frame {
                                rule: r,
                                alt: a,
                                idx: 0,
                                count: 0,
                            };
                            self.settle(g, child, n, d, out);
                        }
                    } else if !tail {
                        self.nodes.pop();
                    }
                }
            }
        }
        if c >= e.min {
            let next = Frame {
                idx: f.idx + 1,
                count: 0,
                ..f
            };
            self.settle(g, next, parent, depth, out);
        }
    }

    fn push(&mut self, frame: Frame, parent: u32, depth: u32) -> u32 {
        self.nodes.push(Node {
            frame,
            parent,
            depth,
        });
        self.nodes.len() as u32 - 1
    }

    fn same_stack(&self, mut a: u32, mut b: u32) -> bool {
        loop {
            if a == b {
                return true;
            }
            if a == NONE || b == NONE {
                return false;
            }
            let (x, y) = (self.nodes[a as usize], self.nodes[b as usize]);
            if x.frame != y.frame || x.depth != y.depth {
                return false;
            }
            a = x.parent;
            b = y.parent;
        }
    }

    /// Appends a key identifying `st` (its stacks' frames, in order) to `out`.
    pub fn key(&self, st: &State, out: &mut Vec<u32>) {
        out.push(st.complete as u32);
        for &top in &st.stacks {
            let mut n = top;
            while n != NONE {
                let node = self.nodes[n as usize];
                let f = node.frame;
                out.extend([f.rule, f.alt, f.idx, f.count]);
                n = node.parent;
            }
            out.push(NONE);
        }
    }

    /// Rebuilds the arena with only the nodes `st` uses (rewriting `st`), so a long
    /// generation does not grow it without bound.
    pub fn compact(&mut self, st: &mut State) {
        let mut nodes: Vec<Node> = Vec::new();
        let mut map: HashMap<u32, u32> = HashMap::new();
        for top in st.stacks.iter_mut() {
            let mut chain = Vec::new();
            let mut n = *top;
            while n != NONE && !map.contains_key(&n) {
                chain.push(n);
                n = self.nodes[n as usize].parent;
            }
            let mut parent = if n == NONE { NONE } else { map[&n] };
            for &old in chain.iter().rev() {
                let mut node = self.nodes[old as usize];
                node.parent = parent;
                nodes.push(node);
                parent = nodes.len() as u32 - 1;
                map.insert(old, parent);
            }
            *top = parent;
        }
        self.nodes = nodes;
    }

    /// Whether the last `start` or `advance` ran out of [`SETTLE_BUDGET`].
    pub fn exhausted(&self) -> bool {
        self.budget == 0
    }
}

#[cfg(test)]
mod tests {
    use super::super::{lit, Builder, Elem};
    use super::*;

    fn accepts(g: &Grammar, s: &[u8]) -> (bool, bool) {
        let mut a = Arena::default();
        let mut st = a.start(g);
        let mut next = State::default();
        for &b in s {
            a.advance(g, &st, b, &mut next);
            std::mem::swap(&mut st, &mut next);
            a.compact(&mut st);
        }
        (st.alive(), st.complete)
    }

    #[test]
    fn counted_repetition_and_recursion() {
        // s ::= "(" s{0,2} ")" ; root ::= s "!"{1,3}
        let mut b = Builder::new();
        let s = b.reserve().unwrap();
        let mut alt = lit(b"(");
        alt.push(Elem::rule(s).rep(0, 2));
        alt.extend(lit(b")"));
        b.define(s, vec![alt]);
        let root = b
            .add(vec![vec![
                Elem::rule(s),
                Elem::bytes(ByteSet::one(b'!')).rep(1, 3),
            ]])
            .unwrap();
        let g = b.build(root).unwrap();
        assert_eq!(accepts(&g, b"(()())!"), (true, true));
        assert_eq!(accepts(&g, b"(()())!!!"), (true, true));
        assert_eq!(accepts(&g, b"(()())!!!!"), (false, false));
        assert_eq!(accepts(&g, b"(()()())!"), (false, false));
        assert_eq!(accepts(&g, b"((("), (true, false));
        assert_eq!(accepts(&g, b"()"), (true, false));
    }

    #[test]
    fn unbounded_counts_are_normalized() {
        let mut b = Builder::new();
        let root = b
            .add(vec![vec![Elem::bytes(ByteSet::one(b'a')).rep(2, INF)]])
            .unwrap();
        let g = b.build(root).unwrap();
        let mut a = Arena::default();
        let s0 = a.start(&g);
        let mut s = s0.clone();
        let mut keys = Vec::new();
        for _ in 0..5 {
            let mut n = State::default();
            a.advance(&g, &s, b'a', &mut n);
            s = n;
            let mut k = Vec::new();
            a.key(&s, &mut k);
            keys.push(k);
        }
        assert!(
            !keys[0].is_empty() && keys[0][0] == 0,
            "one a is not complete"
        );
        assert_eq!(keys[1][0], 1);
        assert_eq!(keys[2], keys[4], "counts past min compare equal");
    }
}
