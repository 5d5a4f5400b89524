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

/// `layer_norm`'s (dx, dw, db) for the output gradient g over rows of the last axis:
/// dx = r (g w - mean(g w) - xhat mean(g w xhat)), dw = sum g xhat, db = sum g over rows.
pub fn layer_norm_backward(x: &Ref, w: &Ref, g: &Ref, eps: f64) -> (Ref, Ref, Ref) {
    let n = *x.shape.last().unwrap_or(&1);
    let mut dx = vec![0.0; x.data.len()];
    let (mut dw, mut db) = (vec![0.0; n], vec![0.0; n]);
    for (r, row) in x.data.chunks(n.max(1)).enumerate() {
        let gr = &g.data[r * n..(r + 1) * n];
        let m = mean(row);
        let rs = 1.0 / (var(row, false) + eps).sqrt();
        let xhat: Vec<f64> = row.iter().map(|v| (v - m) * rs).collect();
        let gw: Vec<f64> = (0..n).map(|i| gr[i] * w.data[i]).collect();
        let m1 = gw.iter().sum::<f64>() / n as f64;
        let m2 = (0..n).map(|i| gw[i] * xhat[i]).sum::<f64>() / n as f64;
        for i in 0..n {
            dx[r * n + i] = rs * (gw[i] - m1 - xhat[i] * m2);
            dw[i] += gr[i] * xhat[i];
            db[i] += gr[i];
        }
    }
    (
        Ref::new(x.shape.clone(), dx),
        Ref::new(vec![n], dw),
        Ref::new(vec![n], db),
    )
}

/// `rms_norm`'s (dx, dw) for the output gradient g over rows of the last axis:
/// dx = r (g w - xhat mean(g w xhat)), dw = sum g xhat over rows, xhat = x r.
pub fn rms_norm_backward(x: &Ref, w: &Ref, g: &Ref, eps: f64) -> (Ref, Ref) {
    let n = *x.shape.last().unwrap_or(&1);
    let mut dx = vec![0.0; x.data.len()];
    let mut dw = vec![0.0; n];
    for (r, row) in x.data.chunks(n.max(1)).enumerate() {
        let gr = &g.data[r * n..(r + 1) * n];
        let rs = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / n as f64 + eps).sqrt();
        let xhat: Vec<f64> = row.iter().map(|v| v * rs).collect();
        let m = (0..n).map(|i| gr[i] * w.data[i] * xhat[i]).sum::<f64>() / n as f64;
        for i in 0..n {
            dx[r * n + i] = rs * (gr[i] * w.data[i] - xhat[i] * m);
            dw[i] += gr[i] * xhat[i];
        }
    }
    (Ref::new(x.shape.clone(), dx), Ref::new(vec![n], dw))
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
    attention_masked(q, k, v, None, causal, scale)
}

/// Attention with an optional key-padding mask [b, lk] (nonzero = padding): masked keys are
/// left out of the softmax; a query that sees no key gets a NaN row.
pub fn attention_masked(
    q: &Ref,
    k: &Ref,
    v: &Ref,
    mask: Option<&Ref>,
    causal: bool,
    scale: f64,
) -> Ref {
    attention_lse(q, k, v, mask, causal, scale).0
}

/// `attention_masked` and each query's lse [b, hq, lq]: ln of the sum of exp(score) over
/// the keys it sees, +inf where it sees none (`Op::Attention`'s second output).
pub fn attention_lse(
    q: &Ref,
    k: &Ref,
    v: &Ref,
    mask: Option<&Ref>,
    causal: bool,
    scale: f64,
) -> (Ref, Ref) {
    let (b, hq, lq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let (hkv, lk, dv) = (k.shape[1], k.shape[2], v.shape[3]);
    let mut out = vec![0.0; b * hq * lq * dv];
    let mut lse = vec![f64::INFINITY; b * hq * lq];
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / (hq / hkv);
            for i in 0..lq {
                let mut s: Vec<f64> = Vec::new();
                let mut keys: Vec<usize> = Vec::new();
                for j in 0..lk {
                    if causal && j + lq > i + lk {
                        continue;
                    }
                    if mask.is_some_and(|m| m.data[bi * lk + j] != 0.0) {
                        continue;
                    }
                    keys.push(j);
                    let dot: f64 = (0..d)
                        .map(|t| {
                            q.data[((bi * hq + h) * lq + i) * d + t]
                                * k.data[((bi * hkv + kh) * lk + j) * d + t]
                        })
                        .sum();
                    s.push(dot * scale);
                }
                let p = softmax(&s);
                if !keys.is_empty() {
                    lse[(bi * hq + h) * lq + i] = logsumexp(&s);
                }
                for t in 0..dv {
                    out[((bi * hq + h) * lq + i) * dv + t] = match keys.is_empty() {
                        true => f64::NAN,
                        false => p
                            .iter()
                            .zip(&keys)
                            .map(|(pj, &j)| pj * v.data[((bi * hkv + kh) * lk + j) * dv + t])
                            .sum(),
                    };
                }
            }
        }
    }
    (
        Ref::new(vec![b, hq, lq, dv], out),
        Ref::new(vec![b, hq, lq], lse),
    )
}

/// Convolution geometry for the references: stride, padding, dilation per axis, and groups.
#[derive(Clone, Copy, Debug)]
pub struct ConvRef {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

/// x coordinate read by output index `o` with tap `t` along axis `a`, if inside [0, len).
fn conv_src(p: &ConvRef, a: usize, o: usize, t: usize, len: usize) -> Option<usize> {
    let i = (o * p.stride[a] + t * p.dilation[a]) as isize - p.padding[a] as isize;
    (i >= 0 && (i as usize) < len).then_some(i as usize)
}

/// conv2d(x [n, c, h, w], w [o, c/g, kh, kw]) by its definition.
pub fn conv2d(x: &Ref, w: &Ref, p: &ConvRef) -> Ref {
    let [n, c, h, wd] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let [o, cg, kh, kw] = [w.shape[0], w.shape[1], w.shape[2], w.shape[3]];
    let og = o / p.groups;
    let out_len = |a: usize, len: usize, k: usize| {
        (len + 2 * p.padding[a] - p.dilation[a] * (k - 1) - 1) / p.stride[a] + 1
    };
    let (oh, ow) = (out_len(0, h, kh), out_len(1, wd, kw));
    let mut out = vec![0.0; n * o * oh * ow];
    for ni in 0..n {
        for oc in 0..o {
            let g = oc / og;
            for i in 0..oh {
                for j in 0..ow {
                    let mut s = 0.0;
                    for ci in 0..cg {
                        for a in 0..kh {
                            for b in 0..kw {
                                if let (Some(y), Some(z)) =
                                    (conv_src(p, 0, i, a, h), conv_src(p, 1, j, b, wd))
                                {
                                    s += w.data[((oc * cg + ci) * kh + a) * kw + b]
                                        * x.data[((ni * c + g * cg + ci) * h + y) * wd + z];
                                }
                            }
                        }
                    }
                    out[((ni * o + oc) * oh + i) * ow + j] = s;
                }
            }
        }
    }
    Ref::new(vec![n, o, oh, ow], out)
}

/// conv_transpose2d(x [n, cin, h, w], w [cin, cout/g, kh, kw]) by scattering every input
/// element through the kernel, PyTorch's definition.
pub fn conv_transpose2d(x: &Ref, w: &Ref, p: &ConvRef, output_padding: [usize; 2]) -> Ref {
    let [n, cin, h, wd] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let [_, cog, kh, kw] = [w.shape[0], w.shape[1], w.shape[2], w.shape[3]];
    let cig = cin / p.groups;
    let cout = cog * p.groups;
    let full = |a: usize, len: usize, k: usize| {
        (len - 1) * p.stride[a] + p.dilation[a] * (k - 1) + output_padding[a] + 1
    };
    let (oh, ow) = (
        full(0, h, kh) - 2 * p.padding[0],
        full(1, wd, kw) - 2 * p.padding[1],
    );
    let mut out = vec![0.0; n * cout * oh * ow];
    for ni in 0..n {
        for ci in 0..cin {
            let g = ci / cig;
            for i in 0..h {
                for j in 0..wd {
                    let v = x.data[((ni * cin + ci) * h + i) * wd + j];
                    for co in 0..cog {
                        for a in 0..kh {
                            for b in 0..kw {
                                let y = (i * p.stride[0] + a * p.dilation[0]) as isize
                                    - p.padding[0] as isize;
                                let z = (j * p.stride[1] + b * p.dilation[1]) as isize
                                    - p.padding[1] as isize;
                                if y < 0 || z < 0 || y as usize >= oh || z as usize >= ow {
                                    continue;
                                }
                                let oc = g * cog + co;
                                out[((ni * cout + oc) * oh + y as usize) * ow + z as usize] +=
                                    v * w.data[((ci * cog + co) * kh + a) * kw + b];
                            }
                        }
                    }
                }
            }
        }
    }
    Ref::new(vec![n, cout, oh, ow], out)
}

/// Pooling geometry for the references.
#[derive(Clone, Copy, Debug)]
pub struct PoolRef {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub ceil_mode: bool,
    pub count_include_pad: bool,
}

impl PoolRef {
    /// PyTorch's `pooling_output_shape`.
    pub fn out_len(&self, a: usize, len: usize) -> usize {
        let (k, s, p, d) = (
            self.kernel[a] as isize,
            self.stride[a] as isize,
            self.padding[a] as isize,
            self.dilation[a] as isize,
        );
        let num = len as isize + 2 * p - d * (k - 1) - 1 + if self.ceil_mode { s - 1 } else { 0 };
        let mut out = num.div_euclid(s) + 1;
        if self.ceil_mode && (out - 1) * s >= len as isize + p {
            out -= 1;
        }
        out as usize
    }
}

/// max_pool2d -> (values, indices as f64), first maximum wins, NaN counts as the maximum.
pub fn max_pool2d(x: &Ref, p: &PoolRef) -> (Ref, Ref) {
    let [n, c, h, w] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let (oh, ow) = (p.out_len(0, h), p.out_len(1, w));
    let (mut vals, mut idx) = (Vec::new(), Vec::new());
    for pl in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let mut best: Option<(f64, usize)> = None;
                for a in 0..p.kernel[0] {
                    for b in 0..p.kernel[1] {
                        let y =
                            (i * p.stride[0] + a * p.dilation[0]) as isize - p.padding[0] as isize;
                        let z =
                            (j * p.stride[1] + b * p.dilation[1]) as isize - p.padding[1] as isize;
                        if y < 0 || z < 0 || y as usize >= h || z as usize >= w {
                            continue;
                        }
                        let at = y as usize * w + z as usize;
                        let v = x.data[pl * h * w + at];
                        best = match best {
                            Some((bv, _)) if !(v > bv || (v.is_nan() && !bv.is_nan())) => best,
                            _ => Some((v, at)),
                        };
                    }
                }
                let (v, at) = best.unwrap_or((f64::NEG_INFINITY, 0));
                vals.push(v);
                idx.push(at as f64);
            }
        }
    }
    (
        Ref::new(vec![n, c, oh, ow], vals),
        Ref::new(vec![n, c, oh, ow], idx),
    )
}

/// avg_pool2d with PyTorch's divisor (dilation 1).
pub fn avg_pool2d(x: &Ref, p: &PoolRef) -> Ref {
    let [n, c, h, w] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let (oh, ow) = (p.out_len(0, h), p.out_len(1, w));
    let mut out = Vec::new();
    for pl in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let hs = (i * p.stride[0]) as isize - p.padding[0] as isize;
                let ws = (j * p.stride[1]) as isize - p.padding[1] as isize;
                let he = (hs + p.kernel[0] as isize).min((h + p.padding[0]) as isize);
                let we = (ws + p.kernel[1] as isize).min((w + p.padding[1]) as isize);
                let pool = (he - hs) * (we - ws);
                let (hs, ws) = (hs.max(0), ws.max(0));
                let (he, we) = (he.min(h as isize), we.min(w as isize));
                let mut s = 0.0;
                for y in hs..he {
                    for z in ws..we {
                        s += x.data[pl * h * w + y as usize * w + z as usize];
                    }
                }
                let div = if p.count_include_pad {
                    pool
                } else {
                    (he - hs) * (we - ws)
                };
                out.push(s / div as f64);
            }
        }
    }
    Ref::new(vec![n, c, oh, ow], out)
}

/// adaptive_avg_pool2d with PyTorch's windows [floor(i len / o), ceil((i + 1) len / o)).
pub fn adaptive_avg_pool2d(x: &Ref, oh: usize, ow: usize) -> Ref {
    let [n, c, h, w] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let mut out = Vec::new();
    for pl in 0..n * c {
        for i in 0..oh {
            let (hs, he) = (i * h / oh, ((i + 1) * h).div_ceil(oh));
            for j in 0..ow {
                let (ws, we) = (j * w / ow, ((j + 1) * w).div_ceil(ow));
                let mut s = 0.0;
                for y in hs..he {
                    for z in ws..we {
                        s += x.data[pl * h * w + y * w + z];
                    }
                }
                out.push(s / ((he - hs) * (we - ws)) as f64);
            }
        }
    }
    Ref::new(vec![n, c, oh, ow], out)
}

/// Batch norm with batch statistics over x [n, c, ...] -> (y, mean, biased var).
pub fn batch_norm(x: &Ref, w: &Ref, b: &Ref, eps: f64) -> (Ref, Ref, Ref) {
    let (n, c) = (x.shape[0], x.shape[1]);
    let s: usize = x.shape[2..].iter().product();
    let at = |ni: usize, ch: usize, j: usize| (ni * c + ch) * s + j;
    let mut y = vec![0.0; x.data.len()];
    let (mut means, mut vars) = (Vec::new(), Vec::new());
    for ch in 0..c {
        let vals: Vec<f64> = (0..n)
            .flat_map(|ni| (0..s).map(move |j| (ni, j)))
            .map(|(ni, j)| x.data[at(ni, ch, j)])
            .collect();
        let (m, v) = (mean(&vals), var(&vals, false));
        for ni in 0..n {
            for j in 0..s {
                let k = at(ni, ch, j);
                y[k] = (x.data[k] - m) / (v + eps).sqrt() * w.data[ch] + b.data[ch];
            }
        }
        means.push(m);
        vars.push(v);
    }
    (
        Ref::new(x.shape.clone(), y),
        Ref::new(vec![c], means),
        Ref::new(vec![c], vars),
    )
}

/// Group norm over x [n, c, ...] with per-channel affine parameters.
pub fn group_norm(x: &Ref, groups: usize, w: &Ref, b: &Ref, eps: f64) -> Ref {
    let (n, c) = (x.shape[0], x.shape[1]);
    let s: usize = x.shape[2..].iter().product();
    let cg = c / groups;
    let mut y = vec![0.0; x.data.len()];
    for ni in 0..n {
        for gi in 0..groups {
            let base = (ni * c + gi * cg) * s;
            let vals = &x.data[base..base + cg * s];
            let (m, v) = (mean(vals), var(vals, false));
            for (j, val) in vals.iter().enumerate() {
                let ch = gi * cg + j / s;
                y[base + j] = (val - m) / (v + eps).sqrt() * w.data[ch] + b.data[ch];
            }
        }
    }
    Ref::new(x.shape.clone(), y)
}

/// adaptive_max_pool2d -> (values, indices as f64), first maximum wins.
pub fn adaptive_max_pool2d(x: &Ref, oh: usize, ow: usize) -> (Ref, Ref) {
    let [n, c, h, w] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let (mut vals, mut idx) = (Vec::new(), Vec::new());
    for pl in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let mut best: Option<(f64, usize)> = None;
                for y in i * h / oh..((i + 1) * h).div_ceil(oh) {
                    for z in j * w / ow..((j + 1) * w).div_ceil(ow) {
                        let v = x.data[pl * h * w + y * w + z];
                        if best.is_none_or(|(bv, _)| v > bv) {
                            best = Some((v, y * w + z));
                        }
                    }
                }
                let (v, at) = best.unwrap_or((f64::NEG_INFINITY, 0));
                vals.push(v);
                idx.push(at as f64);
            }
        }
    }
    (
        Ref::new(vec![n, c, oh, ow], vals),
        Ref::new(vec![n, c, oh, ow], idx),
    )
}

/// Inverted dropout with the mask `uniform(seed, i) >= p` of element i of `mask_shape`
/// (broadcast over x), from the RNG's definition in `ferrite_core::rng`.
pub fn dropout(x: &Ref, p: f64, seed: u64, mask_shape: &[usize]) -> Ref {
    let data = (0..x.data.len())
        .map(|i| {
            let c = unravel(i, &x.shape);
            let mc: Vec<usize> = c
                .iter()
                .zip(mask_shape)
                .map(|(&ci, &m)| if m == 1 { 0 } else { ci })
                .collect();
            let u = ferrite_core::rng::uniform(seed, ravel(&mc, mask_shape) as u64, 0.0, 1.0);
            if u as f64 >= p as f32 as f64 {
                x.data[i] / (1.0 - p)
            } else {
                0.0
            }
        })
        .collect();
    Ref::new(x.shape.clone(), data)
}
