//! Causal attention of the LLM kernels on the CPU, over the paged KV cache's blocks
//! ([`KvBlocks`]) through each sequence's block table.

use std::ops::Range;

use super::kv::{KvBlocks, KvRows};
use crate::quant::float::{axpy_rows, dot_rows};
use crate::quant::Isa;

/// One sequence of a step: its rows `r0..r0 + n` of the step's activations, at positions
/// `pos..pos + n`, its block table at `blocks` of the step's table list.
#[derive(Clone, Debug)]
pub struct SeqRows {
    pub r0: usize,
    pub n: usize,
    pub pos: usize,
    pub blocks: Range<usize>,
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: attention tasks write disjoint (sequence, head) slices of the buffer, which
// outlives them.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Causal attention of every sequence's rows over its cached positions (through its block
/// table) in layer `il`. q, out: `[rows][nh * hd]`; a row at position p sees keys 0..=p, or
/// (p - window, p] with `window > 0`. One task per (sequence, KV head): the query heads that
/// share a KV head read each block of keys and values while it is in cache; each head sees
/// the same operations in the same order as alone.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    isa: Isa,
    kv: &KvBlocks,
    il: usize,
    seqs: &[SeqRows],
    blocks: &[u32],
    q: &[f32],
    out: &mut [f32],
    scores: &mut Vec<f32>,
    (nh, nkv, hd): (usize, usize, usize),
    scale: f32,
    window: usize,
) {
    let bs = kv.block_size();
    let group = nh / nkv;
    let max_len = seqs.iter().map(|s| s.pos + s.n).max().unwrap_or(0);
    let n_tasks = seqs.len() * nkv;
    let per_task = group * max_len;
    if scores.len() < n_tasks * per_task {
        scores.resize(n_tasks * per_task, 0.0);
    }
    let outp = SendPtr(out.as_mut_ptr());
    let w = nh * hd;
    let work = |task: usize, sc: &mut [f32]| {
        let (s, g) = (&seqs[task / nkv], task % nkv);
        let table = &blocks[s.blocks.clone()];
        let mut max = vec![f32::NEG_INFINITY; group];
        for i in 0..s.n {
            let (p, r) = (s.pos + i, s.r0 + i);
            let lo = if window > 0 {
                (p + 1).saturating_sub(window)
            } else {
                0
            };
            let len = p + 1 - lo;
            // This task's query heads, side by side in the row.
            let qg = &q[r * w + g * group * hd..r * w + (g + 1) * group * hd];
            max.fill(f32::NEG_INFINITY);
            let mut j = lo;
            while j <= p {
                let (blk, slot0) = (table[j / bs], j % bs);
                let end = (p + 1).min((j / bs + 1) * bs);
                let keys = kv.keys(blk, il, g).slots(slot0..slot0 + end - j, hd);
                if end <= p {
                    kv.keys(table[end / bs], il, g).prefetch();
                } else {
                    kv.values(table[lo / bs], il, g).prefetch();
                }
                let sc = &mut sc[j - lo..];
                match keys {
                    KvRows::F16(keys) => dot_rows(isa, qg, keys, scale, sc, max_len, &mut max),
                    KvRows::F32(keys) => dot_rows(isa, qg, keys, scale, sc, max_len, &mut max),
                }
                j = end;
            }
            // SAFETY: this task alone writes heads `g * group..(g + 1) * group` of its
            // sequence's rows; that slice lies inside `out` (rows x nh*hd).
            let og = unsafe {
                std::slice::from_raw_parts_mut(outp.get().add(r * w + g * group * hd), group * hd)
            };
            og.fill(0.0);
            for (k, &m) in max.iter().enumerate() {
                let sc = &mut sc[k * max_len..k * max_len + len];
                let inv = 1.0 / crate::quant::exp::exp_sub_sum(isa, sc, m);
                for v in sc.iter_mut() {
                    *v *= inv;
                }
            }
            let mut j = lo;
            while j <= p {
                let (blk, slot0) = (table[j / bs], j % bs);
                let end = (p + 1).min((j / bs + 1) * bs);
                let vals = kv.values(blk, il, g).slots(slot0..slot0 + end - j, hd);
                if end <= p {
                    kv.values(table[end / bs], il, g).prefetch();
                }
                let sc = &sc[j - lo..];
                match vals {
                    KvRows::F16(v) => axpy_rows(isa, sc, max_len, v, og, group),
                    KvRows::F32(v) => axpy_rows(isa, sc, max_len, v, og, group),
                }
                j = end;
            }
        }
    };
    let work_size: usize = seqs.iter().map(|s| s.n * (s.pos + s.n)).sum::<usize>() * nh * hd;
    if work_size < 32 * 1024 || n_tasks == 1 {
        for (task, sc) in scores[..n_tasks * per_task]
            .chunks_mut(per_task.max(1))
            .enumerate()
        {
            work(task, sc);
        }
    } else {
        let sp = SendPtr(scores.as_mut_ptr());
        crate::spin_pool::Pool::global().run(n_tasks, &|task| {
            // SAFETY: task `task` alone uses scores[task * per_task..(task + 1) * per_task],
            // inside `scores` (resized above).
            let sc =
                unsafe { std::slice::from_raw_parts_mut(sp.get().add(task * per_task), per_task) };
            work(task, sc);
        });
    }
}
