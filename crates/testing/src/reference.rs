//! Plain float64 references: direct loops over coordinates, written for clarity, sharing no
//! code with any backend.

use crate::Ref;
use ferrite_core::{BinaryOp, CmpOp, DType, HostBuffer, UnaryOp};

pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for k in (0..shape.len()).rev() {
        c[k] = i % shape[k].max(1);
        i /= shape[k].max(1);
    }
    c
}

fn ravel(c: &[usize], shape: &[usize]) -> usize {
    c.iter().zip(strides(shape)).map(|(a, b)| a * b).sum()
}

pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = if i + a.len() >= r {
                a[i + a.len() - r]
            } else {
                1
            };
            let db = if i + b.len() >= r {
                b[i + b.len() - r]
            } else {
                1
            };
            if da == 1 {
                db
            } else {
                da
            }
        })
        .collect()
}

/// Value of `x` at output coordinate `c` under broadcasting.
fn bget(x: &Ref, c: &[usize]) -> f64 {
    let off = c.len() - x.shape.len();
    let xc: Vec<usize> = x
        .shape
        .iter()
        .enumerate()
        .map(|(k, &d)| if d == 1 { 0 } else { c[off + k] })
        .collect();
    x.data[ravel(&xc, &x.shape)]
}

pub fn map(x: &Ref, f: impl Fn(f64) -> f64) -> Ref {
    Ref::new(x.shape.clone(), x.data.iter().map(|&v| f(v)).collect())
}

pub fn zip(a: &Ref, b: &Ref, f: impl Fn(f64, f64) -> f64) -> Ref {
    let shape = broadcast_shape(&a.shape, &b.shape);
    let n: usize = shape.iter().product();
    let data = (0..n).map(|i| {
        let c = unravel(i, &shape);
        f(bget(a, &c), bget(b, &c))
    });
    Ref::new(shape.clone(), data.collect())
}

pub fn unary(op: UnaryOp, x: &Ref) -> Ref {
    map(x, |v| op.eval_f64(v))
}

pub fn binary(op: BinaryOp, a: &Ref, b: &Ref) -> Ref {
    zip(a, b, |x, y| op.eval_f64(x, y))
}

pub fn cmp(op: CmpOp, a: &Ref, b: &Ref) -> Ref {
    zip(a, b, |x, y| op.eval(x, y) as u8 as f64)
}

pub fn where_cond(c: &Ref, a: &Ref, b: &Ref) -> Ref {
    let shape = broadcast_shape(&broadcast_shape(&c.shape, &a.shape), &b.shape);
    let n: usize = shape.iter().product();
    let data = (0..n).map(|i| {
        let co = unravel(i, &shape);
        if bget(c, &co) != 0.0 {
            bget(a, &co)
        } else {
            bget(b, &co)
        }
    });
    Ref::new(shape.clone(), data.collect())
}

/// Reduces `axes` with `f(values of one output element)`.
pub fn reduce(x: &Ref, axes: &[usize], keepdim: bool, f: impl Fn(&[f64]) -> f64) -> Ref {
    let kept_shape: Vec<usize> = x
        .shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let n: usize = kept_shape.iter().product();
    let mut groups = vec![Vec::new(); n];
    for (i, &v) in x.data.iter().enumerate() {
        let mut c = unravel(i, &x.shape);
        for &a in axes {
            c[a] = 0;
        }
        groups[ravel(&c, &kept_shape)].push(v);
    }
    let shape = if keepdim {
        kept_shape
    } else {
        x.shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect()
    };
    Ref::new(shape, groups.iter().map(|g| f(g)).collect())
}

pub fn sum(v: &[f64]) -> f64 {
    v.iter().sum()
}
pub fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}
pub fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}
pub fn argmax(v: &[f64]) -> f64 {
    let mut b = 0;
    for i in 0..v.len() {
        if v[i] > v[b] {
            b = i;
        }
    }
    b as f64
}
pub fn argmin(v: &[f64]) -> f64 {
    let mut b = 0;
    for i in 0..v.len() {
        if v[i] < v[b] {
            b = i;
        }
    }
    b as f64
}
pub fn mean(v: &[f64]) -> f64 {
    sum(v) / v.len() as f64
}
pub fn var(v: &[f64], unbiased: bool) -> f64 {
    let m = mean(v);
    v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - unbiased as usize) as f64
}
pub fn logsumexp(v: &[f64]) -> f64 {
    let m = max(v);
    m + v.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// NumPy matmul for rank >= 1 operands.
pub fn matmul(a: &Ref, b: &Ref) -> Ref {
    let a2 = if a.shape.len() == 1 {
        Ref::new(vec![1, a.shape[0]], a.data.clone())
    } else {
        a.clone()
    };
    let b2 = if b.shape.len() == 1 {
        Ref::new(vec![b.shape[0], 1], b.data.clone())
    } else {
        b.clone()
    };
    let (ra, rb) = (a2.shape.len(), b2.shape.len());
    let (m, k, n) = (a2.shape[ra - 2], a2.shape[ra - 1], b2.shape[rb - 1]);
    let batch = broadcast_shape(&a2.shape[..ra - 2], &b2.shape[..rb - 2]);
    let mut shape = batch.clone();
    shape.extend([m, n]);
    let total: usize = shape.iter().product();
    let mut data = vec![0.0; total];
    for (o, d) in data.iter_mut().enumerate() {
        let c = unravel(o, &shape);
        let bc = &c[..batch.len()];
        let (i, j) = (c[batch.len()], c[batch.len() + 1]);
        let mut acc = 0.0;
        for p in 0..k {
            let mut ca = bc.to_vec();
            ca.extend([i, p]);
            let mut cb = bc.to_vec();
            cb.extend([p, j]);
            acc += bget(&a2, &ca) * bget(&b2, &cb);
        }
        *d = acc;
    }
    let mut r = Ref::new(shape, data);
    if a.shape.len() == 1 {
        r.shape.remove(r.shape.len() - 2);
    }
    if b.shape.len() == 1 {
        r.shape.pop();
    }
    r
}

/// Values converted to `dtype` by the documented cast rules, read back as f64.
pub fn cast(x: &Ref, dtype: DType) -> Ref {
    Ref::new(
        x.shape.clone(),
        HostBuffer::from_f64_slice(dtype, &x.data).to_f64_vec(),
    )
}

/// Applies `f` to every 1-D line along `axis` (a line in, a line of the same length out).
pub fn along(x: &Ref, axis: usize, f: impl Fn(&[f64]) -> Vec<f64>) -> Ref {
    let mut out = x.data.clone();
    let len = x.shape[axis];
    let st = strides(&x.shape)[axis];
    for i in 0..x.data.len() {
        if unravel(i, &x.shape)[axis] != 0 {
            continue;
        }
        let line: Vec<f64> = (0..len).map(|j| x.data[i + j * st]).collect();
        for (j, v) in f(&line).into_iter().enumerate() {
            out[i + j * st] = v;
        }
    }
    Ref::new(x.shape.clone(), out)
}

pub fn softmax(v: &[f64]) -> Vec<f64> {
    let m = max(v);
    let e: Vec<f64> = v.iter().map(|x| (x - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

pub fn log_softmax(v: &[f64]) -> Vec<f64> {
    let l = logsumexp(v);
    v.iter().map(|x| x - l).collect()
}

pub fn cumsum(v: &[f64]) -> Vec<f64> {
    v.iter()
        .scan(0.0, |s, &x| {
            *s += x;
            Some(*s)
        })
        .collect()
}

/// Stable argsort, ascending or descending.
pub fn argsort(v: &[f64], descending: bool) -> Vec<usize> {
    let mut p: Vec<usize> = (0..v.len()).collect();
    p.sort_by(|&i, &j| {
        let o = v[i].partial_cmp(&v[j]).unwrap_or(std::cmp::Ordering::Equal);
        if descending {
            o.reverse()
        } else {
            o
        }
    });
    p
}

pub fn index_select(x: &Ref, idx: &[usize], axis: usize) -> Ref {
    let mut shape = x.shape.clone();
    shape[axis] = idx.len();
    let n: usize = shape.iter().product();
    let data = (0..n).map(|o| {
        let mut c = unravel(o, &shape);
        c[axis] = idx[c[axis]];
        x.data[ravel(&c, &x.shape)]
    });
    Ref::new(shape.clone(), data.collect())
}

pub fn gather(x: &Ref, idx: &Ref, axis: usize) -> Ref {
    let data = (0..idx.data.len()).map(|o| {
        let mut c = unravel(o, &idx.shape);
        c[axis] = idx.data[o] as usize;
        x.data[ravel(&c, &x.shape)]
    });
    Ref::new(idx.shape.clone(), data.collect())
}

pub fn scatter_add(base: &Ref, idx: &Ref, src: &Ref, axis: usize) -> Ref {
    let mut out = base.clone();
    for o in 0..idx.data.len() {
        let mut c = unravel(o, &idx.shape);
        c[axis] = idx.data[o] as usize;
        out.data[ravel(&c, &base.shape)] += src.data[o];
    }
    out
}

pub fn cat(xs: &[&Ref], axis: usize) -> Ref {
    let mut shape = xs[0].shape.clone();
    shape[axis] = xs.iter().map(|x| x.shape[axis]).sum();
    let n: usize = shape.iter().product();
    let data = (0..n).map(|o| {
        let mut c = unravel(o, &shape);
        let mut k = 0;
        while c[axis] >= xs[k].shape[axis] {
            c[axis] -= xs[k].shape[axis];
            k += 1;
        }
        xs[k].data[ravel(&c, &xs[k].shape)]
    });
    Ref::new(shape.clone(), data.collect())
}

/// Rows of the last axis normalized: (x - mean) / sqrt(var + eps) * w + b.
pub fn layer_norm(x: &Ref, w: &Ref, b: &Ref, eps: f64) -> Ref {
    let last = x.shape.len() - 1;
    along(x, last, |v| {
        let m = mean(v);
        let s = (var(v, false) + eps).sqrt();
        v.iter()
            .enumerate()
            .map(|(i, x)| (x - m) / s * w.data[i] + b.data[i])
            .collect()
    })
}

pub fn rms_norm(x: &Ref, w: &Ref, eps: f64) -> Ref {
    let last = x.shape.len() - 1;
    along(x, last, |v| {
        let r = (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64 + eps).sqrt();
        v.iter()
            .enumerate()
            .map(|(i, x)| x / r * w.data[i])
            .collect()
    })
}

pub fn rope(x: &Ref, cos: &Ref, sin: &Ref, interleaved: bool) -> Ref {
    let r = x.shape.len();
    let (l, d) = (x.shape[r - 2], x.shape[r - 1]);
    let h = d / 2;
    let mut out = x.data.clone();
    for row in 0..x.data.len() / d.max(1) {
        let p = row % l;
        for i in 0..h {
            let (ia, ib) = if interleaved {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + h)
            };
            let (a, b) = (x.data[row * d + ia], x.data[row * d + ib]);
            let (c, s) = (cos.data[p * h + i], sin.data[p * h + i]);
            out[row * d + ia] = a * c - b * s;
            out[row * d + ib] = a * s + b * c;
        }
    }
    Ref::new(x.shape.clone(), out)
}

pub fn attention(q: &Ref, k: &Ref, v: &Ref, causal: bool, scale: f64) -> Ref {
    let (b, hq, lq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let (hkv, lk, dv) = (k.shape[1], k.shape[2], v.shape[3]);
    let mut out = vec![0.0; b * hq * lq * dv];
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / (hq / hkv);
            for i in 0..lq {
                let mut s: Vec<f64> = Vec::new();
                for j in 0..lk {
                    if causal && j + lq > i + lk {
                        continue;
                    }
                    let dot: f64 = (0..d)
                        .map(|t| {
                            q.data[((bi * hq + h) * lq + i) * d + t]
                                * k.data[((bi * hkv + kh) * lk + j) * d + t]
                        })
                        .sum();
                    s.push(dot * scale);
                }
                let p = softmax(&s);
                for t in 0..dv {
                    out[((bi * hq + h) * lq + i) * dv + t] = p
                        .iter()
                        .enumerate()
                        .map(|(j, pj)| pj * v.data[((bi * hkv + kh) * lk + j) * dv + t])
                        .sum();
                }
            }
        }
    }
    Ref::new(vec![b, hq, lq, dv], out)
}
