//! Grammar-constrained sampling: a byte-level context-free grammar ([`Grammar`]), a
//! pushdown recognizer over it ([`pda`]), a trie of the vocabulary's token bytes
//! ([`TokenTrie`]), and the [`GrammarConstraint`] logits processor that masks every token
//! whose bytes would leave the output no longer a prefix of a sentence of the grammar.
//! [`json`] compiles `json_object` and a JSON Schema subset to grammars.
//!
//! A grammar is a list of rules; a rule is a list of alternatives; an alternative is a
//! sequence of elements, each a byte set or a rule, repeated `min..=max` times. Repetition
//! is counted in the recognizer's stack frames (never unrolled), so `{0,15}` or
//! `maxItems: 1000` cost nothing to compile.

pub mod constraint;
pub mod json;
pub mod pda;
pub mod trie;

pub use constraint::GrammarConstraint;
pub use json::{
    json_object, json_schema, json_schema_ordered, json_schema_str, KeyOrder, OrderedValue,
    SchemaError,
};
pub use trie::TokenTrie;

/// Unbounded repetition (`max`).
pub const INF: u32 = u32::MAX;

/// A set of bytes (a 256-bit mask).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ByteSet(pub [u64; 4]);

impl ByteSet {
    pub const EMPTY: ByteSet = ByteSet([0; 4]);

    pub fn one(b: u8) -> ByteSet {
        let mut s = ByteSet::EMPTY;
        s.insert(b);
        s
    }

    /// Bytes `lo..=hi`.
    pub fn range(lo: u8, hi: u8) -> ByteSet {
        let mut s = ByteSet::EMPTY;
        for b in lo..=hi {
            s.insert(b);
        }
        s
    }

    pub fn of(bytes: &[u8]) -> ByteSet {
        let mut s = ByteSet::EMPTY;
        for &b in bytes {
            s.insert(b);
        }
        s
    }

    pub fn insert(&mut self, b: u8) {
        self.0[(b >> 6) as usize] |= 1 << (b & 63);
    }

    pub fn remove(&mut self, b: u8) {
        self.0[(b >> 6) as usize] &= !(1 << (b & 63));
    }

    pub fn contains(&self, b: u8) -> bool {
        self.0[(b >> 6) as usize] >> (b & 63) & 1 == 1
    }

    pub fn union(&self, o: &ByteSet) -> ByteSet {
        ByteSet(std::array::from_fn(|i| self.0[i] | o.0[i]))
    }

    /// Whether every byte of `o` is in `self`.
    pub fn covers(&self, o: &ByteSet) -> bool {
        (0..4).all(|i| o.0[i] & !self.0[i] == 0)
    }

    pub fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }
}

/// What an element matches once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sym {
    /// One byte from the set.
    Bytes(ByteSet),
    /// One sentence of the rule with this index.
    Rule(u32),
}

/// `sym` repeated `min..=max` times (`max` may be [`INF`]); `max >= 1`, `min <= max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Elem {
    pub sym: Sym,
    pub min: u32,
    pub max: u32,
}

impl Elem {
    pub fn bytes(set: ByteSet) -> Elem {
        Elem {
            sym: Sym::Bytes(set),
            min: 1,
            max: 1,
        }
    }

    pub fn rule(r: u32) -> Elem {
        Elem {
            sym: Sym::Rule(r),
            min: 1,
            max: 1,
        }
    }

    pub fn rep(self, min: u32, max: u32) -> Elem {
        Elem { min, max, ..self }
    }
}

/// One alternative: a sequence of elements (empty: matches the empty string).
pub type Alt = Vec<Elem>;

/// The elements matching the bytes of `s` literally.
pub fn lit(s: &[u8]) -> Alt {
    s.iter().map(|&b| Elem::bytes(ByteSet::one(b))).collect()
}

/// A checked grammar: every rule reference is in range, every repetition is well formed,
/// and no rule that can match the empty string is repeated without bound (which would let
/// the recognizer loop without consuming input).
#[derive(Clone, Debug)]
pub struct Grammar {
    rules: Vec<Vec<Alt>>,
    root: u32,
}

/// Builds a [`Grammar`]: reserve rule ids (for recursion), define them, then [`Builder::build`].
#[derive(Default)]
pub struct Builder {
    rules: Vec<Option<Vec<Alt>>>,
}

/// Most rules one grammar may hold (schemas are untrusted input).
pub const MAX_RULES: usize = 100_000;

impl Builder {
    pub fn new() -> Builder {
        Builder::default()
    }

    /// A rule id to define later with [`Builder::define`].
    pub fn reserve(&mut self) -> Result<u32, String> {
        if self.rules.len() >= MAX_RULES {
            return Err(format!("grammar: more than {MAX_RULES} rules"));
        }
        self.rules.push(None);
        Ok(self.rules.len() as u32 - 1)
    }

    pub fn define(&mut self, id: u32, alts: Vec<Alt>) {
        if let Some(r) = self.rules.get_mut(id as usize) {
            *r = Some(alts);
        }
    }

    /// A new rule with these alternatives.
    pub fn add(&mut self, alts: Vec<Alt>) -> Result<u32, String> {
        let id = self.reserve()?;
        self.define(id, alts);
        Ok(id)
    }

    /// Checks and finishes the grammar whose sentences are those of rule `root`.
    pub fn build(self, root: u32) -> Result<Grammar, String> {
        let mut rules = Vec::with_capacity(self.rules.len());
        for (i, r) in self.rules.into_iter().enumerate() {
            rules.push(r.ok_or_else(|| format!("grammar: rule {i} is reserved but not defined"))?);
        }
        if root as usize >= rules.len() {
            return Err(format!("grammar: root rule {root} does not exist"));
        }
        for (i, alts) in rules.iter().enumerate() {
            for e in alts.iter().flatten() {
                if e.max == 0 || e.min > e.max {
                    return Err(format!(
                        "grammar: rule {i}: repetition {{{}, {}}} is empty or inverted",
                        e.min, e.max
                    ));
                }
                if let Sym::Rule(r) = e.sym {
                    if r as usize >= rules.len() {
                        return Err(format!("grammar: rule {i} refers to missing rule {r}"));
                    }
                }
            }
        }
        let nullable = nullable(&rules);
        for (i, alts) in rules.iter().enumerate() {
            for e in alts.iter().flatten() {
                if let Sym::Rule(r) = e.sym {
                    if e.max == INF && nullable[r as usize] {
                        return Err(format!(
                            "grammar: rule {i} repeats rule {r}, which matches the empty string, without bound"
                        ));
                    }
                }
            }
        }
        if let Some(r) = left_cycle(&rules, &nullable) {
            return Err(format!(
                "grammar: rule {r} can reach itself without consuming input (left recursion)"
            ));
        }
        Ok(Grammar { rules, root })
    }
}

/// A rule that reaches itself through the left edges of its alternatives (the rules an
/// alternative can start with, past nullable elements), if any.
fn left_cycle(rules: &[Vec<Alt>], nullable: &[bool]) -> Option<usize> {
    let edges: Vec<Vec<u32>> = rules
        .iter()
        .map(|alts| {
            let mut out = Vec::new();
            for alt in alts {
                for e in alt {
                    let skip = match e.sym {
                        Sym::Bytes(_) => e.min == 0,
                        Sym::Rule(r) => {
                            out.push(r);
                            e.min == 0 || nullable[r as usize]
                        }
                    };
                    if !skip {
                        break;
                    }
                }
            }
            out
        })
        .collect();
    // Iterative depth-first search: 0 unseen, 1 on the path, 2 done.
    let mut color = vec![0u8; rules.len()];
    for start in 0..rules.len() {
        if color[start] != 0 {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        color[start] = 1;
        while let Some(&mut (r, ref mut i)) = path.last_mut() {
            if let Some(&next) = edges[r].get(*i) {
                *i += 1;
                let next = next as usize;
                match color[next] {
                    0 => {
                        color[next] = 1;
                        path.push((next, 0));
                    }
                    1 => return Some(next),
                    _ => {}
                }
            } else {
                color[r] = 2;
                path.pop();
            }
        }
    }
    None
}

/// Which rules match the empty string (a fixed point).
fn nullable(rules: &[Vec<Alt>]) -> Vec<bool> {
    let mut n = vec![false; rules.len()];
    loop {
        let mut changed = false;
        for (i, alts) in rules.iter().enumerate() {
            if n[i] {
                continue;
            }
            let empty = alts.iter().any(|alt| {
                alt.iter().all(|e| {
                    e.min == 0
                        || match e.sym {
                            Sym::Bytes(_) => false,
                            Sym::Rule(r) => n[r as usize],
                        }
                })
            });
            if empty {
                n[i] = true;
                changed = true;
            }
        }
        if !changed {
            return n;
        }
    }
}

impl Grammar {
    pub fn root(&self) -> u32 {
        self.root
    }

    pub fn n_rules(&self) -> usize {
        self.rules.len()
    }

    pub(crate) fn alts(&self, rule: u32) -> &[Alt] {
        &self.rules[rule as usize]
    }

    pub(crate) fn elem(&self, rule: u32, alt: u32, idx: u32) -> Option<&Elem> {
        self.rules[rule as usize][alt as usize].get(idx as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sets() {
        let s = ByteSet::range(b'a', b'c');
        assert!(s.contains(b'b') && !s.contains(b'd'));
        assert!(s.covers(&ByteSet::of(b"ab")) && !s.covers(&ByteSet::of(b"ad")));
        let mut t = ByteSet::range(0, 255);
        t.remove(0xff);
        assert!(!t.contains(0xff) && t.contains(0));
    }

    #[test]
    fn build_refuses_bad_grammars() {
        let mut b = Builder::new();
        let a = b.add(vec![vec![], lit(b"x")]).unwrap();
        b.add(vec![vec![Elem::rule(a).rep(0, INF)]]).unwrap();
        let e = b.build(1).unwrap_err();
        assert!(e.contains("empty string"), "{e}");
        let mut b = Builder::new();
        b.reserve().unwrap();
        assert!(b.build(0).unwrap_err().contains("not defined"));
        let mut b = Builder::new();
        b.add(vec![vec![Elem::rule(7)]]).unwrap();
        assert!(b.build(0).unwrap_err().contains("missing rule 7"));
        // a ::= b "x" | "y" ; b ::= "z"? a
        let mut b = Builder::new();
        let (ra, rb) = (b.reserve().unwrap(), b.reserve().unwrap());
        b.define(
            ra,
            vec![
                vec![Elem::rule(rb), Elem::bytes(ByteSet::one(b'x'))],
                lit(b"y"),
            ],
        );
        b.define(
            rb,
            vec![vec![
                Elem::bytes(ByteSet::one(b'z')).rep(0, 1),
                Elem::rule(ra),
            ]],
        );
        assert!(b.build(ra).unwrap_err().contains("left recursion"));
    }
}
