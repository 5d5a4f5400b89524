//! Fused multi-tensor optimizer updates and the multi-tensor sum of squares on CUDA (kernels in
//! optim.cu; the API is `ferrite_core::optim`).
//!
//! The tensor table of a launch (addresses, sizes, first-chunk indices of up to `MT_MAX`
//! tensors) travels in the kernel's parameters, as in PyTorch's `multi_tensor_apply`, not in
//! an uploaded device buffer: gradients get new addresses at every eager step (an upload per
//! step would be a host-to-device copy and an event), and uploads are refused during a graph
//! capture while kernel parameters are captured by value. Launches: one per `MT_MAX` tensors
//! of a group (two for LAMB, whose trust ratio needs each tensor's norms first); for the sum
//! of squares, one per `MT_MAX` tensors of a dtype and one finishing single-block kernel that
//! adds the per-chunk partial sums in a fixed order (deterministic, no atomics) and, in
//! `step_scalars`, computes the step's scalars. A few small gradients of one dtype take one
//! single-block launch for both (`step_scalars_small_*`).

use crate::device::{CudaBackend, Out};
use crate::kernels::{suffix, Args, Cfg, KernelSource};
use crate::storage::CudaStorage;
use ferrite_core::optim::{FusedUpdate, StepScalars, UpdateClip, UpdateRule};
use ferrite_core::{DType, Error, Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "optim",
    src: include_str!("optim.cu"),
    prebuilt: crate::prebuilt::OPTIM,
};

/// `MT_MAX`, `CHUNK` and `THREADS` of optim.cu.
const MT_MAX: usize = 48;
const CHUNK: usize = 16384;
const THREADS: u32 = 256;

/// `TensorList` of optim.cu (field order and types match).
#[repr(C)]
#[derive(Clone, Copy)]
struct TensorList {
    w: [u64; MT_MAX],
    g: [u64; MT_MAX],
    s: [[u64; MT_MAX]; 3],
    n: [u64; MT_MAX],
    first: u64,
    chunk0: [u32; MT_MAX + 1],
    count: u32,
    gchunk0: u32,
    pad: u32,
}

/// `Hyper` of optim.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct Hyper {
    h: [f64; 4],
    clip: f64,
    rule: u32,
    flags: u32,
    clip_kind: u32,
    pad: u32,
}

fn hyper(rule: UpdateRule, clip: UpdateClip) -> Hyper {
    let (rule_id, h, flags) = match rule {
        UpdateRule::Sgd {
            momentum,
            dampening,
            nesterov,
            weight_decay,
        } => (
            0,
            [momentum, dampening, weight_decay, 0.0],
            u32::from(nesterov),
        ),
        UpdateRule::Adam {
            beta1,
            beta2,
            eps,
            weight_decay,
            amsgrad,
            decoupled,
        } => (
            1,
            [beta1, beta2, eps, weight_decay],
            u32::from(amsgrad) | (u32::from(decoupled) << 1),
        ),
        UpdateRule::RmsProp {
            alpha,
            eps,
            weight_decay,
            momentum,
            centered,
        } => (2, [alpha, eps, weight_decay, momentum], u32::from(centered)),
        UpdateRule::Adagrad {
            lr_decay,
            weight_decay,
            eps,
        } => (3, [lr_decay, weight_decay, eps, 0.0], 0),
        UpdateRule::Lion {
            beta1,
            beta2,
            weight_decay,
        } => (4, [beta1, beta2, weight_decay, 0.0], 0),
        UpdateRule::Lamb {
            beta1,
            beta2,
            eps,
            weight_decay,
        } => (5, [beta1, beta2, eps, weight_decay], 0),
    };
    let (clip_kind, clip) = match clip {
        UpdateClip::None => (0, 0.0),
        UpdateClip::Norm(m) => (1, m),
        UpdateClip::Value(v) => (2, v),
    };
    Hyper {
        h,
        clip,
        rule: rule_id,
        flags,
        clip_kind,
        pad: 0,
    }
}

/// One tensor's entry: addresses (0 for absent state), elements, first-update flag.
struct Entry {
    w: u64,
    g: u64,
    s: [u64; 3],
    n: usize,
    first: bool,
}

/// Splits entries into launches of at most `MT_MAX` tensors (empty tensors left out); returns
/// each launch's table and chunk count, and the total number of chunks.
fn tables(op: &'static str, entries: &[Entry]) -> Result<(Vec<(TensorList, u32)>, usize)> {
    let mut out = Vec::new();
    let mut total = 0usize;
    let live: Vec<&Entry> = entries.iter().filter(|e| e.n > 0).collect();
    for group in live.chunks(MT_MAX) {
        let mut tl = TensorList {
            w: [0; MT_MAX],
            g: [0; MT_MAX],
            s: [[0; MT_MAX]; 3],
            n: [0; MT_MAX],
            first: 0,
            chunk0: [0; MT_MAX + 1],
            count: group.len() as u32,
            gchunk0: 0,
            pad: 0,
        };
        let mut chunks = 0usize;
        for (t, e) in group.iter().enumerate() {
            tl.w[t] = e.w;
            tl.g[t] = e.g;
            for j in 0..3 {
                tl.s[j][t] = e.s[j];
            }
            tl.n[t] = e.n as u64;
            if e.first {
                tl.first |= 1 << t;
            }
            tl.chunk0[t] = chunks as u32;
            chunks += e.n.div_ceil(CHUNK);
        }
        tl.chunk0[group.len()] = chunks as u32;
        if total + chunks > u32::MAX as usize / 2 {
            return Err(Error::backend(op, "too many chunks for one update"));
        }
        tl.gchunk0 = total as u32;
        total += chunks;
        out.push((tl, chunks as u32));
    }
    Ok((out, total))
}

fn cfg(chunks: u32) -> Cfg {
    Cfg::new((chunks, 1, 1), (THREADS, 1, 1), 0)
}

/// One `sum_squares_*` launch: its dtype, table and chunk count.
type SquareLaunch = (DType, TensorList, u32);

/// The multi-tensor tables of `tensors`' sum of squares, per dtype (each table's `gchunk0`
/// global), and the total chunk count.
fn square_tables(
    dev: &CudaBackend,
    tensors: &[Tensor],
    op: &'static str,
) -> Result<(Vec<SquareLaunch>, usize)> {
    let mut launches = Vec::new();
    let mut total = 0usize;
    for dt in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        let mut entries = Vec::new();
        for t in tensors.iter().filter(|t| t.dtype() == dt) {
            let s = dev.input(t, op)?;
            entries.push(Entry {
                w: CudaBackend::ptr(t, s),
                g: 0,
                s: [0; 3],
                n: t.elem_count(),
                first: false,
            });
        }
        let (tabs, chunks) = tables(op, &entries)?;
        for (mut tl, c) in tabs {
            tl.gchunk0 += total as u32;
            launches.push((dt, tl, c));
        }
        total += chunks;
    }
    Ok((launches, total))
}

/// Launches the tables' partial sums into a new buffer of `total` f64 (at least one).
fn square_partials(
    dev: &CudaBackend,
    launches: &[SquareLaunch],
    total: usize,
    op: &'static str,
) -> Result<Out> {
    let part = dev.alloc_out(total.max(1), DType::F64, op)?;
    for (dt, tl, c) in launches {
        let args = Args::new().arg(*tl).arg(part.ptr());
        let name = format!("sum_squares_{}", suffix(*dt));
        dev.launch(op, &SOURCE, &name, cfg(*c), args)?;
    }
    Ok(part)
}

pub(crate) fn sum_squares(dev: &CudaBackend, tensors: &[Tensor]) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "sum_squares";
    let out = dev.alloc_out(1, DType::F64, op)?;
    let (launches, total) = square_tables(dev, tensors, op)?;
    let part = square_partials(dev, &launches, total, op)?;
    let args = Args::new().arg(part.ptr()).arg(total as u64).arg(out.ptr());
    dev.launch(
        op,
        &SOURCE,
        "sum_squares_finish",
        Cfg::new((1, 1, 1), (1024, 1, 1), 0),
        args,
    )?;
    drop(part);
    dev.finish_one(out)
}

/// Group counters per `step_scalars` launch (`SS_GROUPS` in optim.cu), and its block size.
const SS_GROUPS: usize = 16;
const SS_THREADS: u32 = 1024;
/// Gradients of at most this many elements (one dtype, one table) get their sum of squares
/// and the scalars from one single-block launch (`step_scalars_small_*`); more take the
/// chunked partial sums first.
const SS_SMALL: usize = 65_536;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct StepScalarArgs {
    sq: u64,
    scale: u64,
    norm: u64,
    steps: u64,
    first: u64,
    finite: u64,
    groups: [u64; SS_GROUPS],
    ngroups: u32,
    groups_only: u32,
}

pub(crate) fn step_scalars(
    dev: &CudaBackend,
    s: &StepScalars<'_>,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "step_scalars";
    let finite = dev.alloc_out(1, DType::Bool, op)?;
    let mut written: Vec<&CudaStorage> = Vec::new();
    // The device address of scalar `t`, noted as written when `write`.
    fn ptr<'a>(
        dev: &CudaBackend,
        t: &'a Tensor,
        written: &mut Vec<&'a CudaStorage>,
        write: bool,
    ) -> Result<u64> {
        let st = dev.input(t, "step_scalars")?;
        if write {
            written.push(st);
        }
        Ok(CudaBackend::ptr(t, st))
    }
    let w = &mut written;
    let mut a = StepScalarArgs {
        sq: ptr(dev, s.grad_sq, w, true)?,
        scale: match s.grad_scale {
            Some(t) => ptr(dev, t, w, false)?,
            None => 0,
        },
        norm: ptr(dev, s.grad_norm, w, true)?,
        steps: ptr(dev, s.steps, w, true)?,
        first: match s.first_nonfinite {
            Some(t) => ptr(dev, t, w, true)?,
            None => 0,
        },
        finite: finite.ptr(),
        groups: [0; SS_GROUPS],
        ngroups: 0,
        groups_only: 0,
    };
    let (launches, total) = square_tables(dev, s.grads, op)?;
    let elems: usize = s.grads.iter().map(|t| t.elem_count()).sum();
    let small = match launches.as_slice() {
        [(dt, tl, _)] if elems <= SS_SMALL => Some((*dt, *tl)),
        _ => None,
    };
    let part = match small {
        Some(_) => None,
        None => Some(square_partials(dev, &launches, total, op)?),
    };
    let chunks: Vec<&[Tensor]> = match s.group_steps.is_empty() {
        true => vec![&[]],
        false => s.group_steps.chunks(SS_GROUPS).collect(),
    };
    let one_block = Cfg::new((1, 1, 1), (SS_THREADS, 1, 1), 0);
    for (i, chunk) in chunks.into_iter().enumerate() {
        a.groups = [0; SS_GROUPS];
        for (j, t) in chunk.iter().enumerate() {
            a.groups[j] = ptr(dev, t, &mut written, true)?;
        }
        a.ngroups = chunk.len() as u32;
        a.groups_only = u32::from(i > 0);
        match (i, small, &part) {
            (0, Some((dt, tl)), _) => {
                let name = format!("step_scalars_small_{}", suffix(dt));
                dev.launch(op, &SOURCE, &name, one_block, Args::new().arg(tl).arg(a))?;
            }
            (_, _, part) => {
                let (p, n) = match part {
                    Some(p) if i == 0 => (p.ptr(), total as u64),
                    _ => (finite.ptr(), 0u64),
                };
                let args = Args::new().arg(p).arg(n).arg(a);
                dev.launch(op, &SOURCE, "step_scalars", one_block, args)?;
            }
        }
    }
    drop(part);
    // The written scalars become valid after these launches (as after `write_into`).
    let ready = dev.ready_now()?;
    for st in written {
        st.rewritten(ready.clone());
    }
    dev.finish_one(finite)
}

pub(crate) fn fused_update(dev: &CudaBackend, u: &FusedUpdate<'_>) -> Result<()> {
    let op = "fused_update";
    let Some(p0) = u.params.first() else {
        return Ok(());
    };
    let dt = p0.dtype();
    let scalar = |t: &Tensor| -> Result<u64> { Ok(CudaBackend::ptr(t, dev.input(t, op)?)) };
    let (lr, step, sq) = (scalar(u.lr)?, scalar(u.step)?, scalar(u.grad_sq)?);
    // A null pointer: no gradient scale.
    let gs = match u.grad_scale {
        Some(t) => scalar(t)?,
        None => 0,
    };
    let mut written: Vec<&CudaStorage> = Vec::new();
    let mut entries = Vec::with_capacity(u.params.len());
    for (i, (p, g)) in u.params.iter().zip(u.grads).enumerate() {
        let ps = dev.input(p, op)?;
        let gs = dev.input(g, op)?;
        let mut s = [0u64; 3];
        for (j, st) in u.states[i].iter().enumerate().take(3) {
            let ss = dev.input(st, op)?;
            s[j] = CudaBackend::ptr(st, ss);
            written.push(ss);
        }
        written.push(ps);
        entries.push(Entry {
            w: CudaBackend::ptr(p, ps),
            g: CudaBackend::ptr(g, gs),
            s,
            n: p.elem_count(),
            first: u.first[i],
        });
    }
    let hp = hyper(u.rule, u.clip);
    let (tabs, total) = tables(op, &entries)?;
    let sfx = suffix(dt);
    if let UpdateRule::Lamb { .. } = u.rule {
        let part = dev.alloc_out(2 * total.max(1), DType::F64, op)?;
        for (tl, c) in &tabs {
            let args = Args::new()
                .arg(*tl)
                .arg(hp)
                .arg(lr)
                .arg(step)
                .arg(sq)
                .arg(gs)
                .arg(part.ptr());
            dev.launch(op, &SOURCE, &format!("lamb_moments_{sfx}"), cfg(*c), args)?;
        }
        for (tl, c) in &tabs {
            let args = Args::new()
                .arg(*tl)
                .arg(hp)
                .arg(lr)
                .arg(step)
                .arg(sq)
                .arg(gs)
                .arg(part.ptr());
            dev.launch(op, &SOURCE, &format!("lamb_apply_{sfx}"), cfg(*c), args)?;
        }
        drop(part);
    } else {
        for (tl, c) in &tabs {
            let args = Args::new()
                .arg(*tl)
                .arg(hp)
                .arg(lr)
                .arg(step)
                .arg(sq)
                .arg(gs);
            dev.launch(op, &SOURCE, &format!("fused_update_{sfx}"), cfg(*c), args)?;
        }
    }
    // The written buffers now become valid after these launches (as after `write_into`).
    let ready = dev.ready_now()?;
    for s in written {
        s.rewritten(ready.clone());
    }
    Ok(())
}
