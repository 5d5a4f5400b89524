//! The pair-merge loop shared by byte-level BPE and SentencePiece-style tokenization.
//!
//! A piece of text starts as a list of symbols (byte ranges of the piece). Repeatedly, the
//! adjacent pair with the best (lowest) priority key is merged, ties going to the leftmost pair,
//! until no adjacent pair may merge. A heap of candidates keeps this O(n log n) in the piece
//! length, so a long run of one character cannot make encoding quadratic.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

const NONE: usize = usize::MAX;

/// A symbol: bytes `start..end` of the piece, the token it spells (if any), list links.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sym {
    pub start: usize,
    pub end: usize,
    pub id: Option<u32>,
    prev: usize,
    next: usize,
}

/// Symbols from `(start, end, id)` ranges that tile the piece in order.
pub(crate) fn symbols(ranges: impl Iterator<Item = (usize, usize, Option<u32>)>) -> Vec<Sym> {
    let mut out: Vec<Sym> = ranges
        .map(|(start, end, id)| Sym {
            start,
            end,
            id,
            prev: NONE,
            next: NONE,
        })
        .collect();
    let n = out.len();
    for (i, s) in out.iter_mut().enumerate() {
        s.prev = if i == 0 { NONE } else { i - 1 };
        s.next = if i + 1 < n { i + 1 } else { NONE };
    }
    out
}

/// A merge candidate: (key, left start, left index, right index, right end at push time).
type Candidate = (i64, usize, usize, usize, usize);

/// Merges `syms` in place. `pair(left, right)` returns `(key, merged_token)` when the two
/// adjacent symbols may merge; lower keys merge first. Returns the surviving symbols in order.
pub(crate) fn merge(
    mut syms: Vec<Sym>,
    pair: impl Fn(&Sym, &Sym) -> Option<(i64, u32)>,
) -> Vec<Sym> {
    if syms.len() < 2 {
        return syms;
    }
    let mut heap: BinaryHeap<Reverse<Candidate>> = BinaryHeap::new();
    let push = |heap: &mut BinaryHeap<_>, syms: &[Sym], l: usize, r: usize| {
        if l == NONE || r == NONE {
            return;
        }
        if let Some((key, _)) = pair(&syms[l], &syms[r]) {
            heap.push(Reverse((key, syms[l].start, l, r, syms[r].end)));
        }
    };
    for i in 0..syms.len() - 1 {
        push(&mut heap, &syms, i, i + 1);
    }
    let mut alive = vec![true; syms.len()];
    while let Some(Reverse((_, _, l, r, r_end))) = heap.pop() {
        // A candidate is stale once either side merged with something else: a symbol's start
        // never moves, its end only grows, and a merged-away symbol is dead.
        if !alive[l] || !alive[r] || syms[l].next != r || syms[r].end != r_end {
            continue;
        }
        let Some((_, merged)) = pair(&syms[l], &syms[r]) else {
            continue;
        };
        syms[l].end = syms[r].end;
        syms[l].id = Some(merged);
        let after = syms[r].next;
        syms[l].next = after;
        if after != NONE {
            syms[after].prev = l;
        }
        alive[r] = false;
        let before = syms[l].prev;
        push(&mut heap, &syms, before, l);
        push(&mut heap, &syms, l, after);
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i != NONE {
        out.push(syms[i]);
        i = syms[i].next;
    }
    out
}

/// A key that orders f32 scores best-first (higher score = lower key), total over all floats.
pub(crate) fn score_key(score: f32) -> i64 {
    let bits = (-score).to_bits() as i32;
    // The transformation `f32::total_cmp` uses: flip the magnitude bits of negatives.
    i64::from(bits ^ ((((bits >> 31) as u32) >> 1) as i32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_key_orders_best_first() {
        let scores = [-1000.0f32, -3.5, -1.0, 0.0, 2.0, f32::INFINITY];
        for w in scores.windows(2) {
            assert!(score_key(w[1]) < score_key(w[0]), "{w:?}");
        }
    }

    #[test]
    fn merges_lowest_key_then_leftmost() {
        // "aaaa": pair "aa" always allowed with key 0 -> leftmost first: (aa)(aa), then none
        // (a pair of two "aa" has no key).
        let text = b"aaaa";
        let syms = symbols((0..4).map(|i| (i, i + 1, Some(0))));
        let out = merge(syms, |l, r| {
            let s = &text[l.start..r.end];
            (s == b"aa").then_some((0, 1))
        });
        let spans: Vec<_> = out.iter().map(|s| (s.start, s.end, s.id)).collect();
        assert_eq!(spans, vec![(0, 2, Some(1)), (2, 4, Some(1))]);
    }
}
