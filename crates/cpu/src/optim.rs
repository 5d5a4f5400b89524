//! Fused multi-tensor optimizer updates and the multi-tensor sum of squares on the CPU
//! (`ferrite_core::optim`): every tensor of a group is cut into chunks of `CHUNK` elements and
//! the chunks of all tensors run on rayon's pool, each a plain loop the compiler vectorizes.
//!
//! The arithmetic is the composed reference's (`ferrite-train`, `update`), op for op in the
//! same order and precision: f32 compute for f32/f16/bf16 storage (f64 for f64), so an f32
//! update equals the composed one bit for bit. Only LAMB's per-tensor norms differ (here
//! accumulated in f64 over fixed chunks, there summed by the reduction op).

use crate::storage::{self, CpuStorage, ReadGuard, WriteGuard};
use ferrite_core::optim::{FusedUpdate, StepScalars, UpdateClip, UpdateRule};
use ferrite_core::{bf16, f16, DType, Error, HostBuffer, Result, Storage, Tensor};
use num_traits::Float;
use rayon::prelude::*;
use std::sync::Arc;

/// Elements per work item.
const CHUNK: usize = 1 << 15;

/// A compute type (f32 or f64) with an exact conversion from f64 hyperparameters (rounded
/// once, as the composed ops' scalars are).
trait Compute: Float + Send + Sync + 'static {
    fn of(x: f64) -> Self;
    fn to64(self) -> f64;
}
impl Compute for f32 {
    fn of(x: f64) -> f32 {
        x as f32
    }
    fn to64(self) -> f64 {
        self as f64
    }
}
impl Compute for f64 {
    fn of(x: f64) -> f64 {
        x
    }
    fn to64(self) -> f64 {
        self
    }
}

/// A storage element and its compute type.
trait Elem: Copy + Send + Sync + 'static {
    type C: Compute;
    fn load(self) -> Self::C;
    fn store(c: Self::C) -> Self;
}
impl Elem for f32 {
    type C = f32;
    fn load(self) -> f32 {
        self
    }
    fn store(c: f32) -> f32 {
        c
    }
}
impl Elem for f64 {
    type C = f64;
    fn load(self) -> f64 {
        self
    }
    fn store(c: f64) -> f64 {
        c
    }
}
impl Elem for f16 {
    type C = f32;
    fn load(self) -> f32 {
        self.to_f32()
    }
    fn store(c: f32) -> f16 {
        f16::from_f32(c)
    }
}
impl Elem for bf16 {
    type C = f32;
    fn load(self) -> f32 {
        self.to_f32()
    }
    fn store(c: f32) -> bf16 {
        bf16::from_f32(c)
    }
}

fn cpu_storage<'a>(t: &'a Tensor, op: &'static str) -> Result<&'a CpuStorage> {
    t.storage()
        .as_any()
        .downcast_ref::<CpuStorage>()
        .ok_or_else(|| Error::backend(op, format!("tensor is on {}, not the CPU", t.device())))
}

/// Address of element 0 of a buffer (the caller knows its type).
fn buf_ptr(b: &mut HostBuffer) -> usize {
    match b {
        HostBuffer::F32(v) => v.as_mut_ptr() as usize,
        HostBuffer::F64(v) => v.as_mut_ptr() as usize,
        HostBuffer::F16(v) => v.as_mut_ptr() as usize,
        HostBuffer::BF16(v) => v.as_mut_ptr() as usize,
        HostBuffer::I32(v) => v.as_mut_ptr() as usize,
        HostBuffer::I64(v) => v.as_mut_ptr() as usize,
        HostBuffer::U32(v) => v.as_mut_ptr() as usize,
        HostBuffer::U8(v) => v.as_mut_ptr() as usize,
        HostBuffer::Bool(v) => v.as_mut_ptr() as usize,
    }
}

fn read_scalar(t: &Tensor, op: &'static str) -> Result<f64> {
    let _g = cpu_storage(t, op)?.read();
    let v = storage::raw::<f64>(t, op)?;
    v.get(t.layout().offset())
        .copied()
        .ok_or_else(|| Error::backend(op, "scalar outside its storage"))
}

/// Sum of squares of `x` in f64, over fixed chunks summed in order.
fn sum_sq<T: Elem>(x: &[T]) -> f64 {
    let parts: Vec<f64> = x
        .par_chunks(CHUNK)
        .map(|c| {
            c.iter()
                .map(|&v| {
                    let f = v.load().to64();
                    f * f
                })
                .sum::<f64>()
        })
        .collect();
    parts.iter().sum()
}

pub(crate) fn sum_squares(tensors: &[Tensor]) -> Result<Arc<dyn Storage>> {
    Ok(Arc::new(CpuStorage::new(HostBuffer::F64(vec![
        sum_squares_f64(tensors, "sum_squares")?,
    ]))))
}

fn sum_squares_f64(tensors: &[Tensor], op: &'static str) -> Result<f64> {
    let _g = storage::guards(&tensors.iter().collect::<Vec<_>>());
    let mut total = 0.0f64;
    for t in tensors {
        let (o, n) = (t.layout().offset(), t.elem_count());
        let s = match t.dtype() {
            DType::F32 => sum_sq(&storage::raw::<f32>(t, op)?[o..o + n]),
            DType::F64 => sum_sq(&storage::raw::<f64>(t, op)?[o..o + n]),
            DType::F16 => sum_sq(&storage::raw::<f16>(t, op)?[o..o + n]),
            DType::BF16 => sum_sq(&storage::raw::<bf16>(t, op)?[o..o + n]),
            dt => return Err(Error::dtype(op, dt, "needs a float dtype")),
        };
        total += s;
    }
    Ok(total)
}

fn write_scalar(t: &Tensor, v: f64, op: &'static str) -> Result<()> {
    let mut guard = cpu_storage(t, op)?.lock_write();
    let at = buf_ptr(guard.buffer()) + t.layout().offset() * 8;
    // SAFETY: `t` is a validated f64 scalar inside the storage held exclusively by `guard`.
    unsafe { *(at as *mut f64) = v };
    Ok(())
}

/// `ferrite_core::optim::StepScalars`, in the order its contract gives.
pub(crate) fn step_scalars(s: &StepScalars<'_>) -> Result<Arc<dyn Storage>> {
    let op = "step_scalars";
    let sq = sum_squares_f64(s.grads, op)?;
    write_scalar(s.grad_sq, sq, op)?;
    let mut norm = sq.sqrt();
    if let Some(t) = s.grad_scale {
        norm *= read_scalar(t, op)?;
    }
    write_scalar(s.grad_norm, norm, op)?;
    let finite = norm.is_finite();
    let steps = read_scalar(s.steps, op)? + 1.0;
    write_scalar(s.steps, steps, op)?;
    if let Some(t) = s.first_nonfinite {
        if !finite && read_scalar(t, op)? == 0.0 {
            write_scalar(t, steps, op)?;
        }
    }
    if finite {
        for t in s.group_steps {
            write_scalar(t, read_scalar(t, op)? + 1.0, op)?;
        }
    }
    Ok(Arc::new(CpuStorage::new(HostBuffer::Bool(vec![finite]))))
}

/// The per-tensor constants of one update, rounded to the compute type as the composed
/// reference rounds its scalars.
#[derive(Clone, Copy)]
struct K<C> {
    rule: UpdateRule,
    lr: C,
    wd: C,
    /// 1 - lr × weight_decay (decoupled decay), from f64.
    decay: C,
    /// beta1 / alpha / momentum and 1 - it; beta2 and 1 - it.
    a: C,
    oma: C,
    b: C,
    omb: C,
    mom: C,
    /// 1 - dampening.
    damp1: C,
    eps: C,
    /// Adam: lr / bias_correction1 and sqrt(bias_correction2); LAMB: the corrections.
    step_size: C,
    bc2_sqrt: C,
    bc1: C,
    bc2: C,
    /// Adagrad's lr / (1 + (step - 1) lr_decay).
    clr: C,
    /// The loss scaler's 1 / scale, applied to each gradient first.
    unscale: Option<C>,
    coef: Option<C>,
    clip_value: Option<C>,
}

fn consts<C: Compute>(
    rule: UpdateRule,
    lr: f64,
    step: f64,
    unscale: Option<f64>,
    coef: Option<f64>,
    clip: UpdateClip,
) -> K<C> {
    let z = C::zero();
    let mut k = K {
        rule,
        lr: C::of(lr),
        wd: z,
        decay: C::one(),
        a: z,
        oma: z,
        b: z,
        omb: z,
        mom: z,
        damp1: z,
        eps: z,
        step_size: z,
        bc2_sqrt: z,
        bc1: z,
        bc2: z,
        clr: z,
        unscale: unscale.map(C::of),
        coef: coef.map(C::of),
        clip_value: match clip {
            UpdateClip::Value(v) => Some(C::of(v)),
            _ => None,
        },
    };
    let decay = |wd: f64| C::of(lr * -wd + 1.0);
    match rule {
        UpdateRule::Sgd {
            momentum,
            dampening,
            weight_decay,
            ..
        } => {
            k.wd = C::of(weight_decay);
            k.mom = C::of(momentum);
            k.damp1 = C::of(1.0 - dampening);
        }
        UpdateRule::Adam {
            beta1,
            beta2,
            eps,
            weight_decay,
            ..
        } => {
            k.wd = C::of(weight_decay);
            k.decay = decay(weight_decay);
            k.oma = C::of(1.0 - beta1);
            k.b = C::of(beta2);
            k.omb = C::of(1.0 - beta2);
            k.eps = C::of(eps);
            let bc1 = -beta1.powf(step) + 1.0;
            let bc2 = -beta2.powf(step) + 1.0;
            k.step_size = C::of(lr / bc1);
            k.bc2_sqrt = C::of(bc2.sqrt());
        }
        UpdateRule::RmsProp {
            alpha,
            eps,
            weight_decay,
            momentum,
            ..
        } => {
            k.wd = C::of(weight_decay);
            k.a = C::of(alpha);
            k.oma = C::of(1.0 - alpha);
            k.eps = C::of(eps);
            k.mom = C::of(momentum);
        }
        UpdateRule::Adagrad {
            lr_decay,
            weight_decay,
            eps,
        } => {
            k.wd = C::of(weight_decay);
            k.eps = C::of(eps);
            k.clr = C::of(lr / ((step + -1.0) * lr_decay + 1.0));
        }
        UpdateRule::Lion {
            beta1,
            beta2,
            weight_decay,
        } => {
            k.decay = decay(weight_decay);
            k.a = C::of(beta1);
            k.oma = C::of(1.0 - beta1);
            k.b = C::of(beta2);
            k.omb = C::of(1.0 - beta2);
        }
        UpdateRule::Lamb {
            beta1,
            beta2,
            eps,
            weight_decay,
        } => {
            k.wd = C::of(weight_decay);
            k.a = C::of(beta1);
            k.oma = C::of(1.0 - beta1);
            k.b = C::of(beta2);
            k.omb = C::of(1.0 - beta2);
            k.eps = C::of(eps);
            k.bc1 = C::of(-beta1.powf(step) + 1.0);
            k.bc2 = C::of(-beta2.powf(step) + 1.0);
        }
    }
    k
}

/// The clipped gradient.
#[inline(always)]
fn clip_grad<C: Compute>(k: &K<C>, mut g: C) -> C {
    if let Some(u) = k.unscale {
        g = g * u;
    }
    if let Some(c) = k.coef {
        g = g * c;
    }
    if let Some(v) = k.clip_value {
        // maximum(g, -v) then minimum(., v), NaN-propagating like the ops.
        g = if g.is_nan() || g > -v { g } else { -v };
        g = if g.is_nan() || g < v { g } else { v };
    }
    g
}

/// The composed ops' `sign`.
#[inline(always)]
fn sign<C: Compute>(v: C) -> C {
    if v > C::zero() {
        C::one()
    } else if v < C::zero() {
        -C::one()
    } else {
        v * C::zero()
    }
}

/// LAMB's update direction r from the new moments.
#[inline(always)]
fn lamb_r<C: Compute>(k: &K<C>, w: C, m: C, v: C) -> C {
    let mut r = (m / k.bc1) / ((v / k.bc2).sqrt() + k.eps);
    if k.wd != C::zero() {
        r = r + w * k.wd;
    }
    r
}

/// One element's update (every rule but LAMB): returns the new parameter, updates `s`.
#[inline(always)]
fn elem<C: Compute>(k: &K<C>, w: C, g: C, s: &mut [C; 3], first: bool) -> C {
    let g = clip_grad(k, g);
    match k.rule {
        UpdateRule::Sgd {
            momentum, nesterov, ..
        } => {
            let mut d = g;
            if k.wd != C::zero() {
                d = d + w * k.wd;
            }
            if momentum != 0.0 {
                let buf = if first { d } else { s[0] * k.mom + d * k.damp1 };
                d = if nesterov { d + buf * k.mom } else { buf };
                s[0] = buf;
            }
            w - d * k.lr
        }
        UpdateRule::Adam {
            amsgrad, decoupled, ..
        } => {
            let (mut w0, mut g) = (w, g);
            if k.wd != C::zero() {
                if decoupled {
                    w0 = w * k.decay;
                } else {
                    g = g + w * k.wd;
                }
            }
            let m = s[0] + (g - s[0]) * k.oma;
            let v = s[1] * k.b + (g * g) * k.omb;
            let vmax = if amsgrad {
                let x = s[2];
                let mx = if x.is_nan() || x > v { x } else { v };
                s[2] = mx;
                mx
            } else {
                v
            };
            s[0] = m;
            s[1] = v;
            let denom = vmax.sqrt() / k.bc2_sqrt + k.eps;
            w0 - (m / denom) * k.step_size
        }
        UpdateRule::RmsProp {
            momentum, centered, ..
        } => {
            let mut g = g;
            if k.wd != C::zero() {
                g = g + w * k.wd;
            }
            let sq = s[0] * k.a + (g * g) * k.oma;
            s[0] = sq;
            let gi = if momentum > 0.0 { 2 } else { 1 };
            let avg = if centered {
                let ga = s[gi] + (g - s[gi]) * k.oma;
                s[gi] = ga;
                (sq - ga * ga).sqrt() + k.eps
            } else {
                sq.sqrt() + k.eps
            };
            let upd = g / avg;
            if momentum > 0.0 {
                let buf = s[1] * k.mom + upd;
                s[1] = buf;
                w - buf * k.lr
            } else {
                w - upd * k.lr
            }
        }
        UpdateRule::Adagrad { .. } => {
            let mut g = g;
            if k.wd != C::zero() {
                g = g + w * k.wd;
            }
            let sum = s[0] + g * g;
            s[0] = sum;
            let std = sum.sqrt() + k.eps;
            w - (g / std) * k.clr
        }
        UpdateRule::Lion { weight_decay, .. } => {
            let w0 = if weight_decay != 0.0 { w * k.decay } else { w };
            let m = s[0];
            let upd = sign(m * k.a + g * k.oma);
            s[0] = m * k.b + g * k.omb;
            w0 - upd * k.lr
        }
        UpdateRule::Lamb { .. } => {
            // Two passes (`lamb_moments`, `lamb_apply`); never reached through `elem`.
            w
        }
    }
}

/// Raw addresses of one tensor's buffers (valid while the update holds their guards).
#[derive(Clone, Copy)]
struct Ptrs {
    w: usize,
    g: usize,
    s: [usize; 3],
    ns: usize,
    n: usize,
    first: bool,
}

/// One work item: elements `lo..hi` of tensor `t`.
#[derive(Clone, Copy)]
struct Item {
    t: usize,
    lo: usize,
    hi: usize,
}

/// Runs `f(item, w, g, states)` over every chunk, in parallel. `f` sees the item's slices.
///
/// SAFETY (of the slices): items cover disjoint ranges of each tensor; every written buffer is
/// held by a write guard and every read one by a read guard for the whole call (the caller),
/// and the core validation made written buffers distinct from each other and from reads.
fn for_chunks<T: Elem, R: Send>(
    ptrs: &[Ptrs],
    f: impl Fn(Item, &mut [T], &[T], [&mut [T]; 3]) -> R + Sync + Send,
) -> Vec<R> {
    let items: Vec<Item> = ptrs
        .iter()
        .enumerate()
        .flat_map(|(t, p)| {
            (0..p.n.div_ceil(CHUNK)).map(move |c| Item {
                t,
                lo: c * CHUNK,
                hi: ((c + 1) * CHUNK).min(p.n),
            })
        })
        .collect();
    items
        .par_iter()
        .map(|&it| {
            let p = ptrs[it.t];
            let len = it.hi - it.lo;
            // SAFETY: see the function comment; each pointer addresses at least p.n elements
            // of T (validated shapes and dtypes), and lo + len <= n.
            unsafe {
                let w = std::slice::from_raw_parts_mut((p.w as *mut T).add(it.lo), len);
                let g = std::slice::from_raw_parts((p.g as *const T).add(it.lo), len);
                let st = |j: usize| -> &mut [T] {
                    if j < p.ns {
                        std::slice::from_raw_parts_mut((p.s[j] as *mut T).add(it.lo), len)
                    } else {
                        &mut []
                    }
                };
                f(it, w, g, [st(0), st(1), st(2)])
            }
        })
        .collect()
}

fn run<T: Elem>(
    u: &FusedUpdate<'_>,
    ptrs: &[Ptrs],
    (lr, step, unscale, coef): (f64, f64, Option<f64>, Option<f64>),
) {
    let k = consts::<T::C>(u.rule, lr, step, unscale, coef, u.clip);
    if let UpdateRule::Lamb { .. } = u.rule {
        // Pass 1: the moments, and each chunk's sums of w² and r² (f64).
        let parts = for_chunks::<T, (f64, f64)>(ptrs, |_, w, g, [m, v, _]| {
            let (mut ww, mut rr) = (0.0f64, 0.0f64);
            for i in 0..w.len() {
                let x = w[i].load();
                let gi = clip_grad(&k, g[i].load());
                let m1 = m[i].load() * k.a + gi * k.oma;
                let v1 = v[i].load() * k.b + (gi * gi) * k.omb;
                m[i] = T::store(m1);
                v[i] = T::store(v1);
                let r = lamb_r(&k, x, T::store(m1).load(), T::store(v1).load());
                ww += x.to64() * x.to64();
                rr += r.to64() * r.to64();
            }
            (ww, rr)
        });
        // Per tensor: its chunks' sums in order, then the trust ratio.
        let mut trust = vec![1.0f64; ptrs.len()];
        let mut at = 0;
        for (t, p) in ptrs.iter().enumerate() {
            let nc = p.n.div_ceil(CHUNK);
            let (ww, rr) = parts[at..at + nc]
                .iter()
                .fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
            at += nc;
            let (wn, rn) = (ww.sqrt(), rr.sqrt());
            if wn > 0.0 && rn > 0.0 {
                trust[t] = wn / rn;
            }
        }
        // Pass 2: w -= r × (trust × lr), r recomputed from the stored moments.
        for_chunks::<T, ()>(ptrs, |it, w, _, [m, v, _]| {
            let tl = T::C::of(trust[it.t]) * k.lr;
            for i in 0..w.len() {
                let x = w[i].load();
                let r = lamb_r(&k, x, m[i].load(), v[i].load());
                w[i] = T::store(x - r * tl);
            }
        });
        return;
    }
    for_chunks::<T, ()>(ptrs, |it, w, g, [s0, s1, s2]| {
        let first = ptrs[it.t].first;
        let ns = ptrs[it.t].ns;
        let z = T::C::of(0.0);
        for i in 0..w.len() {
            let mut s = [
                if ns > 0 { s0[i].load() } else { z },
                if ns > 1 { s1[i].load() } else { z },
                if ns > 2 { s2[i].load() } else { z },
            ];
            w[i] = T::store(elem(&k, w[i].load(), g[i].load(), &mut s, first));
            if ns > 0 {
                s0[i] = T::store(s[0]);
            }
            if ns > 1 {
                s1[i] = T::store(s[1]);
            }
            if ns > 2 {
                s2[i] = T::store(s[2]);
            }
        }
    });
}

pub(crate) fn fused_update(u: &FusedUpdate<'_>) -> Result<()> {
    let op = "fused_update";
    let Some(p0) = u.params.first() else {
        return Ok(());
    };
    let (lr, step, sq) = (
        read_scalar(u.lr, op)?,
        read_scalar(u.step, op)?,
        read_scalar(u.grad_sq, op)?,
    );
    let inv = match u.grad_scale {
        Some(t) => Some(read_scalar(t, op)?),
        None => None,
    };
    let norm = sq.sqrt() * inv.unwrap_or(1.0);
    if !norm.is_finite() {
        return Ok(());
    }
    let coef = match u.clip {
        UpdateClip::Norm(max) => Some((max / (norm + 1e-6)).min(1.0)),
        _ => None,
    };
    let scalars = (lr, step, inv, coef);
    // Hold every buffer for the whole update: gradients for reading, the rest exclusively.
    let grads: Vec<&Tensor> = u.grads.iter().collect();
    let _reads: Vec<ReadGuard<'_>> = storage::guards(&grads);
    let mut writes: Vec<WriteGuard<'_>> = Vec::new();
    let mut ptrs = Vec::with_capacity(u.params.len());
    let size = p0.dtype().size_in_bytes();
    for (i, (p, g)) in u.params.iter().zip(u.grads).enumerate() {
        let mut addrs = [0usize; 4];
        for (j, t) in std::iter::once(p).chain(&u.states[i]).enumerate().take(4) {
            let mut guard = cpu_storage(t, op)?.lock_write();
            addrs[j] = buf_ptr(guard.buffer()) + t.layout().offset() * size;
            writes.push(guard);
        }
        let (w, s) = (addrs[0], [addrs[1], addrs[2], addrs[3]]);
        let ga = cpu_storage(g, op)?.as_ptr() + g.layout().offset() * size;
        ptrs.push(Ptrs {
            w,
            g: ga,
            s,
            ns: u.states[i].len().min(3),
            n: p.elem_count(),
            first: u.first[i],
        });
    }
    match p0.dtype() {
        DType::F32 => run::<f32>(u, &ptrs, scalars),
        DType::F64 => run::<f64>(u, &ptrs, scalars),
        DType::F16 => run::<f16>(u, &ptrs, scalars),
        DType::BF16 => run::<bf16>(u, &ptrs, scalars),
        dt => return Err(Error::dtype(op, dt, "parameters need a float dtype")),
    }
    drop(writes);
    Ok(())
}
