//! The paged KV cache: fixed-size blocks of positions, a block table per sequence, blocks
//! shared between sequences with a common prompt prefix (copy-on-write), and an LRU cache of
//! the full blocks of finished sequences that later requests reuse.
//!
//! [`PagedKv`] is the bookkeeping, the same for every backend: which block holds which
//! positions of which sequence. A backend stores the keys and values of each block
//! ([`CpuKvStore`] here) and copies a block when [`PagedKv::prepare`] asks it to
//! ([`KvStore::copy_block`]).
//!
//! Prefix sharing: a full block is identified by a hash of the whole token chain up to its
//! end (the hash of the previous block and this block's tokens), so two blocks with the same
//! hash hold the same keys and values. A 64-bit hash collision would make a request reuse the
//! wrong block; at 2^-64 per pair this is accepted (vLLM makes the same choice).

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::error::{Error, Result};

/// Positions per block unless a cache is built with another size.
pub const BLOCK_SIZE: usize = 16;

/// Index of a block in the cache's storage.
pub type BlockId = u32;

/// Counters for monitoring (a server's `/metrics`): every block is exactly one of used
/// (held by a sequence), cached (a finished prefix, reusable, evicted LRU-first) or free.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvStats {
    pub block_size: usize,
    pub blocks_total: usize,
    pub blocks_used: usize,
    pub blocks_cached: usize,
    pub blocks_free: usize,
    /// Positions whose keys and values were taken from shared or cached blocks instead of
    /// being computed, since the cache was made.
    pub prefix_hit_positions: u64,
}

/// What a backend's storage does for the bookkeeping: copy all layers of one block (a device
/// store queues the copy before the step that writes `dst`).
pub trait KvStore {
    fn copy_block(&mut self, src: BlockId, dst: BlockId) -> Result<()>;
}

/// One sequence's blocks.
#[derive(Debug, Default)]
struct SeqBlocks {
    table: Vec<BlockId>,
    /// Tokens whose keys and values are stored (positions 0..tokens.len()).
    tokens: Vec<u32>,
    /// Chain hash of each full block of `tokens`.
    hashes: Vec<u64>,
    /// Blocks this sequence took out of the free or cached ones (allocations, and cached
    /// blocks it revived); an admission policy bounds it (see [`PagedKv::blocks_needed`]).
    taken: usize,
}

/// Block bookkeeping over `n_blocks` blocks of `block_size` positions, for sequences named
/// by the caller's ids.
#[derive(Debug)]
pub struct PagedKv {
    block_size: usize,
    refs: Vec<u32>,
    /// The registered chain hash of a full block, if any.
    hash: Vec<Option<u64>>,
    /// When a block entered the LRU (its key in `lru`).
    lru_tick: Vec<u64>,
    by_hash: HashMap<u64, BlockId>,
    /// Blocks with no reference and no hash.
    free: Vec<BlockId>,
    /// Blocks with no reference but a hash (finished prefixes), oldest first.
    lru: BTreeMap<u64, BlockId>,
    tick: u64,
    seqs: HashMap<u64, SeqBlocks>,
    hits: u64,
}

fn chain_hash(prev: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    prev.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl PagedKv {
    /// `n_blocks` blocks (at most 2^32) of `block_size` (>= 1) positions, all free.
    pub fn new(n_blocks: usize, block_size: usize) -> Result<PagedKv> {
        if block_size == 0 || n_blocks == 0 || n_blocks > u32::MAX as usize {
            return Err(Error::Context(format!(
                "KV cache: {n_blocks} blocks of {block_size} positions is not a valid size"
            )));
        }
        Ok(PagedKv {
            block_size,
            refs: vec![0; n_blocks],
            hash: vec![None; n_blocks],
            lru_tick: vec![0; n_blocks],
            by_hash: HashMap::new(),
            free: (0..n_blocks as u32).rev().collect(),
            lru: BTreeMap::new(),
            tick: 0,
            seqs: HashMap::new(),
            hits: 0,
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn n_blocks(&self) -> usize {
        self.refs.len()
    }

    /// Blocks that can be handed out now (free, or cached and evictable).
    pub fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    pub fn stats(&self) -> KvStats {
        KvStats {
            block_size: self.block_size,
            blocks_total: self.n_blocks(),
            blocks_used: self.n_blocks() - self.available(),
            blocks_cached: self.lru.len(),
            blocks_free: self.free.len(),
            prefix_hit_positions: self.hits,
        }
    }

    /// Blocks a sequence of `positions` positions can take out of the pool over its life,
    /// at most: one per block of its table, plus one for a copy-on-write of a shared block.
    pub fn blocks_needed(&self, positions: usize) -> usize {
        positions.div_ceil(self.block_size) + 1
    }

    pub fn contains(&self, seq: u64) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// Positions stored for `seq` (0 for an unknown sequence).
    pub fn len(&self, seq: u64) -> usize {
        self.seqs.get(&seq).map_or(0, |s| s.tokens.len())
    }

    /// The block table of `seq`: block i holds positions i*block_size.. (empty if unknown).
    pub fn table(&self, seq: u64) -> &[BlockId] {
        self.seqs.get(&seq).map_or(&[], |s| &s.table)
    }

    /// Blocks `seq` has taken out of the pool so far (see [`PagedKv::blocks_needed`]).
    pub fn taken(&self, seq: u64) -> usize {
        self.seqs.get(&seq).map_or(0, |s| s.taken)
    }

    /// References to block `b` (sequences whose table holds it).
    pub fn refs(&self, b: BlockId) -> u32 {
        self.refs[b as usize]
    }

    fn take(&mut self) -> Result<BlockId> {
        if let Some(b) = self.free.pop() {
            self.refs[b as usize] = 1;
            return Ok(b);
        }
        if let Some((_, b)) = self.lru.pop_first() {
            if let Some(h) = self.hash[b as usize].take() {
                self.by_hash.remove(&h);
            }
            self.refs[b as usize] = 1;
            return Ok(b);
        }
        Err(Error::Context(format!(
            "KV cache: all {} blocks of {} positions are in use",
            self.n_blocks(),
            self.block_size
        )))
    }

    /// Adds a reference to `b`; true if it came out of the LRU (it was unreferenced).
    fn retain(&mut self, b: BlockId) -> bool {
        let r = &mut self.refs[b as usize];
        *r += 1;
        if *r == 1 {
            self.lru.remove(&self.lru_tick[b as usize]);
            true
        } else {
            false
        }
    }

    fn release(&mut self, b: BlockId) {
        let i = b as usize;
        self.refs[i] -= 1;
        if self.refs[i] == 0 {
            if self.hash[i].is_some() {
                self.tick += 1;
                self.lru_tick[i] = self.tick;
                self.lru.insert(self.tick, b);
            } else {
                self.free.push(b);
            }
        }
    }

    fn unregister(&mut self, b: BlockId) {
        if let Some(h) = self.hash[b as usize].take() {
            self.by_hash.remove(&h);
        }
    }

    /// Starts sequence `seq` whose first tokens will be `prompt`, sharing the longest run of
    /// full prompt blocks already stored (by running sequences or the cache of finished
    /// ones). Returns how many positions are already stored; at most `prompt.len() - 1`, so
    /// that the last prompt token is computed (its logits are needed). An id in use is an
    /// error.
    pub fn add_seq(&mut self, seq: u64, prompt: &[u32]) -> Result<usize> {
        if self.seqs.contains_key(&seq) {
            return Err(Error::Other(format!("KV cache: sequence {seq} exists")));
        }
        let bs = self.block_size;
        let mut s = SeqBlocks::default();
        let mut prev = 0u64;
        for chunk in prompt.chunks_exact(bs) {
            let h = chain_hash(prev, chunk);
            let Some(&b) = self.by_hash.get(&h) else {
                break;
            };
            if self.retain(b) {
                s.taken += 1;
            }
            s.table.push(b);
            s.hashes.push(h);
            s.tokens.extend_from_slice(chunk);
            prev = h;
        }
        let reused = s.tokens.len().min(prompt.len().saturating_sub(1));
        s.tokens.truncate(reused);
        s.hashes.truncate(reused / bs);
        self.hits += reused as u64;
        self.seqs.insert(seq, s);
        Ok(reused)
    }

    /// Makes room to write `n` positions after the stored ones of `seq`: the block they
    /// start in becomes the sequence's own (copied by `store` first if shared, its hash
    /// dropped if registered: its tail will change), and new blocks are allocated for the
    /// rest. On an error (no block left) the sequence keeps what it had and the blocks
    /// allocated so far.
    pub fn prepare(&mut self, seq: u64, n: usize, store: &mut dyn KvStore) -> Result<()> {
        let bs = self.block_size;
        let mut s = self
            .seqs
            .remove(&seq)
            .ok_or_else(|| Error::Other(format!("KV cache: no sequence {seq}")))?;
        let r = self.prepare_seq(&mut s, n, bs, store);
        self.seqs.insert(seq, s);
        r
    }

    fn prepare_seq(
        &mut self,
        s: &mut SeqBlocks,
        n: usize,
        bs: usize,
        store: &mut dyn KvStore,
    ) -> Result<()> {
        let len = s.tokens.len();
        if n == 0 {
            return Ok(());
        }
        let first = len / bs;
        if first < s.table.len() {
            let b = s.table[first];
            if self.refs[b as usize] > 1 {
                let nb = self.take()?;
                s.taken += 1;
                let copied = store.copy_block(b, nb);
                self.release(b);
                s.table[first] = nb;
                copied?;
            } else {
                self.unregister(b);
            }
        }
        let need = (len + n).div_ceil(bs);
        while s.table.len() < need {
            let b = self.take()?;
            s.taken += 1;
            s.table.push(b);
        }
        Ok(())
    }

    /// Records that `tokens` were written after the stored positions of `seq` (after a
    /// [`PagedKv::prepare`] for as many) and registers the blocks they filled for sharing.
    pub fn commit(&mut self, seq: u64, tokens: &[u32]) -> Result<()> {
        let bs = self.block_size;
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or_else(|| Error::Other(format!("KV cache: no sequence {seq}")))?;
        if s.table.len() * bs < s.tokens.len() + tokens.len() {
            return Err(Error::Other(format!(
                "KV cache: sequence {seq} commits {} positions after {} with {} blocks",
                tokens.len(),
                s.tokens.len(),
                s.table.len()
            )));
        }
        s.tokens.extend_from_slice(tokens);
        let mut new = Vec::new();
        while (s.hashes.len() + 1) * bs <= s.tokens.len() {
            let i = s.hashes.len();
            let prev = if i == 0 { 0 } else { s.hashes[i - 1] };
            let h = chain_hash(prev, &s.tokens[i * bs..(i + 1) * bs]);
            s.hashes.push(h);
            new.push((s.table[i], h));
        }
        for (b, h) in new {
            // The first block stored with a chain stays the one requests find.
            if self.hash[b as usize].is_none() && !self.by_hash.contains_key(&h) {
                self.hash[b as usize] = Some(h);
                self.by_hash.insert(h, b);
            }
        }
        Ok(())
    }

    /// Forgets the positions of `seq` from `pos` on (no-op if it holds fewer), releasing
    /// the blocks past the one that holds position `pos - 1`.
    pub fn truncate(&mut self, seq: u64, pos: usize) {
        let bs = self.block_size;
        let Some(mut s) = self.seqs.remove(&seq) else {
            return;
        };
        if pos < s.tokens.len() {
            s.tokens.truncate(pos);
            s.hashes.truncate(pos / bs);
            let keep = pos.div_ceil(bs);
            for b in s.table.drain(keep..).rev().collect::<Vec<_>>() {
                self.release(b);
            }
        }
        self.seqs.insert(seq, s);
    }

    /// Ends `seq`: its blocks are released (full ones stay cached for reuse, the last ones
    /// of the sequence evicted first). Unknown ids are a no-op.
    pub fn remove(&mut self, seq: u64) {
        if let Some(s) = self.seqs.remove(&seq) {
            for &b in s.table.iter().rev() {
                self.release(b);
            }
        }
    }
}

/// The CPU's keys and values of every block: ferrite-cpu's `KvBlocks` (f16, or f32 for the
/// exact mode; `[block][layer][kv_head][slot][head_dim]`).
pub use ferrite_cpu::llm::kv::{KvBlocks as CpuKvStore, KvRows};

impl KvStore for CpuKvStore {
    fn copy_block(&mut self, src: BlockId, dst: BlockId) -> Result<()> {
        self.copy(src, dst);
        Ok(())
    }
}

/// A store that records copies (bookkeeping tests).
#[cfg(test)]
#[derive(Default)]
struct Copies(Vec<(BlockId, BlockId)>);

#[cfg(test)]
impl KvStore for Copies {
    fn copy_block(&mut self, src: BlockId, dst: BlockId) -> Result<()> {
        self.0.push((src, dst));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 7 + salt).collect()
    }

    /// Prepares and commits `tokens` for `seq`.
    fn write(kv: &mut PagedKv, seq: u64, tokens: &[u32], c: &mut Copies) -> Result<()> {
        kv.prepare(seq, tokens.len(), c)?;
        kv.commit(seq, tokens)
    }

    fn check_counts(kv: &PagedKv) {
        let st = kv.stats();
        assert_eq!(
            st.blocks_used + st.blocks_cached + st.blocks_free,
            st.blocks_total
        );
        let referenced = kv.refs.iter().filter(|&&r| r > 0).count();
        assert_eq!(referenced, st.blocks_used);
        let mut held: HashMap<BlockId, u32> = HashMap::new();
        for s in kv.seqs.values() {
            for &b in &s.table {
                *held.entry(b).or_default() += 1;
            }
        }
        for (b, n) in held {
            assert_eq!(kv.refs(b), n, "refcount of block {b}");
        }
    }

    #[test]
    fn blocks_are_allocated_as_a_sequence_grows_across_boundaries() {
        let mut kv = PagedKv::new(8, 4).unwrap();
        let mut c = Copies::default();
        assert_eq!(kv.add_seq(1, &toks(10, 0)).unwrap(), 0);
        assert_eq!(kv.table(1).len(), 0);
        write(&mut kv, 1, &toks(3, 0), &mut c).unwrap();
        assert_eq!(kv.table(1).len(), 1);
        write(&mut kv, 1, &[100], &mut c).unwrap();
        assert_eq!(kv.table(1).len(), 1, "positions 0..4 fit one block");
        write(&mut kv, 1, &[101], &mut c).unwrap();
        assert_eq!(kv.table(1).len(), 2, "position 4 starts block 2");
        write(&mut kv, 1, &toks(6, 50), &mut c).unwrap();
        assert_eq!((kv.len(1), kv.table(1).len()), (11, 3));
        let t = kv.table(1).to_vec();
        let mut sorted = t.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 3, "distinct blocks: {t:?}");
        assert_eq!(kv.stats().blocks_used, 3);
        assert_eq!(kv.taken(1), 3);
        assert!(c.0.is_empty());
        check_counts(&kv);
    }

    #[test]
    fn ending_a_sequence_frees_partial_blocks_and_caches_full_ones() {
        let mut kv = PagedKv::new(8, 4).unwrap();
        let mut c = Copies::default();
        kv.add_seq(1, &[]).unwrap();
        write(&mut kv, 1, &toks(10, 0), &mut c).unwrap();
        assert_eq!(kv.stats().blocks_used, 3);
        kv.remove(1);
        let st = kv.stats();
        assert_eq!(
            (st.blocks_used, st.blocks_cached, st.blocks_free),
            (0, 2, 6)
        );
        kv.remove(1);
        kv.remove(42);
        assert_eq!(kv.stats(), st, "removing unknown ids changes nothing");
        check_counts(&kv);
    }

    #[test]
    fn a_finished_prefix_is_reused_and_its_last_block_copied_on_write() {
        let mut kv = PagedKv::new(8, 4).unwrap();
        let mut c = Copies::default();
        let prompt = toks(8, 3);
        kv.add_seq(1, &prompt).unwrap();
        write(&mut kv, 1, &prompt, &mut c).unwrap();
        write(&mut kv, 1, &[9, 9], &mut c).unwrap();
        let first = kv.table(1).to_vec();
        kv.remove(1);
        assert_eq!(kv.stats().blocks_cached, 2);

        // Same prompt: both full blocks found; the last prompt token is recomputed, which
        // writes into the shared second block (cached, now referenced once: no copy, but
        // its hash is dropped until it is full again).
        assert_eq!(kv.add_seq(2, &prompt).unwrap(), 7);
        assert_eq!(kv.table(2), &first[..2]);
        assert_eq!(
            kv.taken(2),
            2,
            "reviving cached blocks takes them from the pool"
        );
        assert_eq!(kv.stats().prefix_hit_positions, 7);
        // A third sequence shares the first block while 2 holds it.
        let mut p3 = prompt[..4].to_vec();
        p3.extend([77, 78, 79, 80, 81]);
        assert_eq!(kv.add_seq(3, &p3).unwrap(), 4);
        assert_eq!(kv.refs(first[0]), 2);
        assert_eq!(kv.taken(3), 0, "a block in use costs the pool nothing");
        write(&mut kv, 2, &prompt[7..], &mut c).unwrap();
        assert!(c.0.is_empty());
        assert_eq!(kv.table(2), &first[..2]);
        write(&mut kv, 3, &p3[4..], &mut c).unwrap();
        assert_eq!(kv.table(3)[0], first[0]);
        assert_ne!(kv.table(3)[1], first[1]);
        check_counts(&kv);
    }

    #[test]
    fn writing_into_a_block_shared_by_a_running_sequence_copies_it() {
        let mut kv = PagedKv::new(8, 4).unwrap();
        let mut c = Copies::default();
        let prompt = toks(8, 1);
        kv.add_seq(1, &prompt).unwrap();
        write(&mut kv, 1, &prompt, &mut c).unwrap();
        // Sequence 2 with the same 8 tokens shares both blocks; its recomputed last token
        // goes into a private copy of block 2, made before the write.
        assert_eq!(kv.add_seq(2, &prompt).unwrap(), 7);
        let shared = kv.table(1)[1];
        assert_eq!(kv.refs(shared), 2);
        kv.prepare(2, 1, &mut c).unwrap();
        let own = kv.table(2)[1];
        assert_eq!(c.0, vec![(shared, own)]);
        assert_ne!(own, shared);
        assert_eq!(kv.refs(shared), 1);
        assert_eq!(kv.table(2)[0], kv.table(1)[0]);
        kv.commit(2, &prompt[7..]).unwrap();
        // Diverging: sequence 2 continues in its own third block; sequence 1 is unchanged.
        write(&mut kv, 2, &[5, 5], &mut c).unwrap();
        write(&mut kv, 1, &[6], &mut c).unwrap();
        assert_eq!(kv.table(1)[1], shared);
        assert_ne!(kv.table(1)[2], kv.table(2)[2]);
        assert_eq!(kv.taken(2), 2, "one copy and one new block");
        assert!(kv.taken(2) <= kv.blocks_needed(10));
        check_counts(&kv);
    }

    #[test]
    fn a_different_prefix_shares_nothing_after_the_divergent_block() {
        let mut kv = PagedKv::new(16, 4).unwrap();
        let mut c = Copies::default();
        let a = toks(12, 0);
        kv.add_seq(1, &a).unwrap();
        write(&mut kv, 1, &a, &mut c).unwrap();
        let mut b = a.clone();
        b[5] = 999;
        assert_eq!(kv.add_seq(2, &b).unwrap(), 4, "only block 0 matches");
        // The chain hash: block 2 of b equals a's, but follows a different block 1.
        let mut d = a.clone();
        d[0] = 999;
        assert_eq!(kv.add_seq(3, &d).unwrap(), 0);
        check_counts(&kv);
    }

    #[test]
    fn the_least_recently_finished_prefix_is_evicted_first() {
        let mut kv = PagedKv::new(4, 4).unwrap();
        let mut c = Copies::default();
        let (a, b) = (toks(8, 0), toks(8, 1000));
        for (id, p) in [(1, &a), (2, &b)] {
            kv.add_seq(id, p).unwrap();
            write(&mut kv, id, p, &mut c).unwrap();
        }
        kv.remove(1);
        kv.remove(2);
        assert_eq!(kv.stats().blocks_cached, 4);
        assert_eq!(kv.stats().blocks_free, 0);
        // Allocating two blocks evicts a's (finished first), leaving b's findable.
        kv.add_seq(3, &[]).unwrap();
        write(&mut kv, 3, &toks(8, 500), &mut c).unwrap();
        assert_eq!(kv.add_seq(4, &a).unwrap(), 0, "a was evicted");
        assert_eq!(kv.add_seq(5, &b).unwrap(), 7, "b is still cached");
        check_counts(&kv);
    }

    #[test]
    fn a_full_cache_is_an_error_that_names_its_size() {
        let mut kv = PagedKv::new(2, 4).unwrap();
        let mut c = Copies::default();
        kv.add_seq(1, &[]).unwrap();
        write(&mut kv, 1, &toks(8, 0), &mut c).unwrap();
        kv.add_seq(2, &[]).unwrap();
        let e = kv.prepare(2, 1, &mut c).unwrap_err().to_string();
        assert!(e.contains("all 2 blocks of 4 positions are in use"), "{e}");
        let e = kv.prepare(1, 1, &mut c).unwrap_err().to_string();
        assert!(e.contains("in use"), "{e}");
        kv.remove(1);
        write(&mut kv, 2, &toks(5, 0), &mut c).unwrap();
        assert!(PagedKv::new(0, 4).is_err() && PagedKv::new(4, 0).is_err());
        check_counts(&kv);
    }

    #[test]
    fn truncation_releases_later_blocks_and_unshares_the_cut_one() {
        let mut kv = PagedKv::new(8, 4).unwrap();
        let mut c = Copies::default();
        kv.add_seq(1, &[]).unwrap();
        write(&mut kv, 1, &toks(12, 0), &mut c).unwrap();
        let t = kv.table(1).to_vec();
        kv.truncate(1, 6);
        assert_eq!(kv.table(1), &t[..2]);
        assert_eq!(kv.len(1), 6);
        assert_eq!(kv.stats().blocks_used, 2);
        assert_eq!(kv.stats().blocks_cached, 1, "block 3 was full: cached");
        // Rewriting positions 6.. with other tokens: block 1 keeps its place, but the
        // chain of the old tokens must no longer lead to it.
        write(&mut kv, 1, &[500, 501], &mut c).unwrap();
        assert_eq!(kv.add_seq(2, &toks(12, 0)).unwrap(), 4);
        kv.truncate(1, 100);
        assert_eq!(kv.len(1), 8);
        check_counts(&kv);
    }
}
