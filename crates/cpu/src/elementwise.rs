//! Elementwise ops over strided inputs: unary, binary, comparisons, where, and strided copies.
//! Contiguous inputs take a flat parallel loop; strided ones walk rows of the last dim.

use crate::alloc::filled;
use crate::storage::{contig, raw};
use ferrite_core::{
    map_host_same, BinaryOp, CmpOp, DType, Error, HostBuffer, Layout, Result, Tensor, UnaryOp,
    WithDType,
};
use half::{bf16, f16};
use num_traits::Float;
use rayon::prelude::*;
use std::borrow::Cow;
use std::mem::MaybeUninit;

/// Below this many elements, loops stay on the calling thread.
pub(crate) const PAR_MIN: usize = 1 << 15;
/// Elements per rayon task in flat loops.
pub(crate) const PAR_CHUNK: usize = 1 << 14;

/// Storage offset of the first element of row `r` (rows = all dims but the last).
fn row_offset(mut r: usize, l: &Layout) -> usize {
    let (dims, strides) = (l.dims(), l.strides());
    let mut off = l.offset();
    for k in (0..dims.len().saturating_sub(1)).rev() {
        off += (r % dims[k]) * strides[k];
        r /= dims[k];
    }
    off
}

/// The elements a layout selects, row-major, as a new vector.
pub(crate) fn gather_strided<T: ferrite_core::WithDType>(data: &[T], l: &Layout) -> Vec<T> {
    let n = l.shape().elem_count();
    if n == 0 {
        return Vec::new();
    }
    if l.is_contiguous() {
        return data[l.offset()..l.offset() + n].to_vec();
    }
    let inner = *l.dims().last().unwrap_or(&1);
    let s_in = *l.strides().last().unwrap_or(&1);
    let mut out = crate::alloc::full(n, data[l.offset()]);
    let fill = |(r, dst): (usize, &mut [T])| {
        let base = row_offset(r, l);
        for (j, d) in dst.iter_mut().enumerate() {
            *d = data[base + j * s_in];
        }
    };
    if n >= PAR_MIN {
        out.par_chunks_mut(inner).enumerate().for_each(fill);
    } else {
        out.chunks_mut(inner).enumerate().for_each(fill);
    }
    out
}

pub(crate) fn materialize(buf: &HostBuffer, l: &Layout) -> HostBuffer {
    map_host_same!(buf, v => gather_strided(v, l))
}

pub(crate) fn map<
    T: Copy + Send + Sync,
    U: ferrite_core::WithDType,
    F: Fn(T) -> U + Sync + Send,
>(
    x: &[T],
    f: F,
) -> Vec<U> {
    filled(x.len(), |out| {
        let body = |(d, s): (&mut [MaybeUninit<U>], &[T])| {
            for (o, &v) in d.iter_mut().zip(s) {
                o.write(f(v));
            }
        };
        if x.len() >= PAR_MIN {
            out.par_chunks_mut(PAR_CHUNK)
                .zip(x.par_chunks(PAR_CHUNK))
                .for_each(body);
        } else {
            body((out, x));
        }
    })
}

/// `f(a, b)` elementwise over two equal-shaped, possibly strided (incl. stride-0) tensors.
pub(crate) fn zip_map<
    T: ferrite_core::WithDType,
    U: ferrite_core::WithDType,
    F: Fn(T, T) -> U + Sync + Send,
>(
    a: &Tensor,
    b: &Tensor,
    op: &'static str,
    f: F,
) -> Result<Vec<U>> {
    let (da, db) = (raw::<T>(a, op)?, raw::<T>(b, op)?);
    let (la, lb) = (a.layout(), b.layout());
    let n = a.elem_count();
    if la.is_contiguous() && lb.is_contiguous() {
        let (xa, xb) = (
            &da[la.offset()..la.offset() + n],
            &db[lb.offset()..lb.offset() + n],
        );
        return Ok(filled(n, |out| {
            // Chunk `c` of the output covers elements [c * PAR_CHUNK, ..) of both inputs.
            let body = |(c, d): (usize, &mut [MaybeUninit<U>])| {
                let (x, y) = (&xa[c * PAR_CHUNK..], &xb[c * PAR_CHUNK..]);
                for ((o, &p), &q) in d.iter_mut().zip(x).zip(y) {
                    o.write(f(p, q));
                }
            };
            if n >= PAR_MIN {
                out.par_chunks_mut(PAR_CHUNK).enumerate().for_each(body);
            } else {
                out.chunks_mut(PAR_CHUNK).enumerate().for_each(body);
            }
        }));
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    // One side contiguous, the other a single broadcast value (`x > 0`, `x * 2`).
    let splat = |l: &Layout| l.strides().iter().all(|&s| s == 0);
    if la.is_contiguous() && splat(lb) {
        let (xa, y) = (&da[la.offset()..la.offset() + n], db[lb.offset()]);
        return Ok(map(xa, |x| f(x, y)));
    }
    if splat(la) && lb.is_contiguous() {
        let (x, xb) = (da[la.offset()], &db[lb.offset()..lb.offset() + n]);
        return Ok(map(xb, |y| f(x, y)));
    }
    let inner = *a.dims().last().unwrap_or(&1);
    let (sa, sb) = (
        *la.strides().last().unwrap_or(&1),
        *lb.strides().last().unwrap_or(&1),
    );
    let mut out = crate::alloc::full(n, U::default());
    let row = |(r, dst): (usize, &mut [U])| {
        let (oa, ob) = (row_offset(r, la), row_offset(r, lb));
        match (sa, sb) {
            (1, 0) => {
                let y = db[ob];
                for (d, &x) in dst.iter_mut().zip(&da[oa..oa + inner]) {
                    *d = f(x, y);
                }
            }
            (0, 1) => {
                let x = da[oa];
                for (d, &y) in dst.iter_mut().zip(&db[ob..ob + inner]) {
                    *d = f(x, y);
                }
            }
            (1, 1) => {
                for ((d, &x), &y) in dst
                    .iter_mut()
                    .zip(&da[oa..oa + inner])
                    .zip(&db[ob..ob + inner])
                {
                    *d = f(x, y);
                }
            }
            _ => {
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = f(da[oa + j * sa], db[ob + j * sb]);
                }
            }
        }
    };
    if n >= PAR_MIN {
        out.par_chunks_mut(inner.max(1)).enumerate().for_each(row);
    } else {
        out.chunks_mut(inner.max(1)).enumerate().for_each(row);
    }
    Ok(out)
}

fn gelu_erf<F: Float>(x: F) -> F {
    let v = x.to_f64().unwrap_or(f64::NAN);
    F::from(0.5 * v * (1.0 + libm::erf(v * std::f64::consts::FRAC_1_SQRT_2))).unwrap_or(F::nan())
}

fn unary_float<F: Float + ferrite_core::WithDType>(op: UnaryOp, x: &[F]) -> Vec<F> {
    let one = F::one();
    let half = F::from(0.5).unwrap_or(one);
    match op {
        UnaryOp::Neg => map(x, |v| -v),
        UnaryOp::Abs => map(x, |v| v.abs()),
        UnaryOp::Sign => map(x, |v| {
            if v > F::zero() {
                one
            } else if v < F::zero() {
                -one
            } else {
                v * F::zero()
            }
        }),
        UnaryOp::Exp => map(x, |v| v.exp()),
        UnaryOp::Log => map(x, |v| v.ln()),
        UnaryOp::Sqrt => map(x, |v| v.sqrt()),
        UnaryOp::Rsqrt => map(x, |v| one / v.sqrt()),
        UnaryOp::Recip => map(x, |v| one / v),
        UnaryOp::Square => map(x, |v| v * v),
        UnaryOp::Sin => map(x, |v| v.sin()),
        UnaryOp::Cos => map(x, |v| v.cos()),
        UnaryOp::Tanh => map(x, |v| v.tanh()),
        UnaryOp::Sigmoid => map(x, |v| one / (one + (-v).exp())),
        UnaryOp::Relu => map(x, |v| if v > F::zero() { v } else { F::zero() }),
        UnaryOp::GeluErf => map(x, gelu_erf),
        UnaryOp::GeluTanh => {
            let c = F::from((2.0 / std::f64::consts::PI).sqrt()).unwrap_or(one);
            let k = F::from(0.044715).unwrap_or(F::zero());
            map(x, move |v| {
                half * v * (one + (c * (v + k * v * v * v)).tanh())
            })
        }
        UnaryOp::Silu => map(x, |v| v / (one + (-v).exp())),
        UnaryOp::Floor => map(x, |v| v.floor()),
        UnaryOp::Ceil => map(x, |v| v.ceil()),
        UnaryOp::Round => map(x, |v| v.round()),
    }
}

/// Integer element types: arithmetic wraps like two's complement hardware.
pub(crate) trait Int: Copy + Send + Sync + Default + PartialOrd + 'static {
    const ZERO: Self;
    const ONE: Self;
    fn wadd(self, o: Self) -> Self;
    fn wsub(self, o: Self) -> Self;
    fn wmul(self, o: Self) -> Self;
    fn wdiv(self, o: Self) -> Self;
    fn wneg(self) -> Self;
}

macro_rules! int_impl {
    ($t:ty) => {
        impl Int for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            fn wadd(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn wsub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            fn wmul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            fn wdiv(self, o: Self) -> Self {
                self.wrapping_div(o)
            }
            fn wneg(self) -> Self {
                self.wrapping_neg()
            }
        }
    };
}
int_impl!(i32);
int_impl!(i64);
int_impl!(u32);
int_impl!(u8);

fn unary_int<I: Int + ferrite_core::WithDType>(op: UnaryOp, x: &[I]) -> Result<Vec<I>> {
    Ok(match op {
        UnaryOp::Neg => map(x, |v| v.wneg()),
        UnaryOp::Abs => map(x, |v| if v < I::ZERO { v.wneg() } else { v }),
        UnaryOp::Sign => map(x, |v| {
            if v > I::ZERO {
                I::ONE
            } else if v < I::ZERO {
                I::ONE.wneg()
            } else {
                I::ZERO
            }
        }),
        UnaryOp::Square => map(x, |v| v.wmul(v)),
        UnaryOp::Relu => map(x, |v| if v > I::ZERO { v } else { I::ZERO }),
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => x.to_vec(),
        other => {
            return Err(Error::dtype(
                other.name(),
                DType::I64,
                "needs a float dtype",
            ))
        }
    })
}

pub(crate) fn unary(op: UnaryOp, x: &Tensor) -> Result<HostBuffer> {
    let name = op.name();
    Ok(match x.dtype() {
        DType::F32 => HostBuffer::F32(unary_float(op, &contig::<f32>(x, name)?)),
        DType::F64 => HostBuffer::F64(unary_float(op, &contig::<f64>(x, name)?)),
        DType::F16 => HostBuffer::F16(unary_float(op, &contig::<f16>(x, name)?)),
        DType::BF16 => HostBuffer::BF16(unary_float(op, &contig::<bf16>(x, name)?)),
        DType::I32 => HostBuffer::I32(unary_int(op, &contig::<i32>(x, name)?)?),
        DType::I64 => HostBuffer::I64(unary_int(op, &contig::<i64>(x, name)?)?),
        DType::U32 => HostBuffer::U32(unary_int(op, &contig::<u32>(x, name)?)?),
        DType::U8 => HostBuffer::U8(unary_int(op, &contig::<u8>(x, name)?)?),
        DType::Bool => return Err(Error::dtype(name, DType::Bool, "needs a numeric dtype")),
    })
}

fn binary_float<F: Float + ferrite_core::WithDType>(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
) -> Result<Vec<F>> {
    let n = op.name();
    // NaN-propagating max/min, as NumPy's maximum/minimum.
    match op {
        BinaryOp::Add => zip_map(a, b, n, |x: F, y: F| x + y),
        BinaryOp::Sub => zip_map(a, b, n, |x: F, y: F| x - y),
        BinaryOp::Mul => zip_map(a, b, n, |x: F, y: F| x * y),
        BinaryOp::Div => zip_map(a, b, n, |x: F, y: F| x / y),
        BinaryOp::Pow => zip_map(a, b, n, |x: F, y: F| x.powf(y)),
        BinaryOp::Maximum => zip_map(
            a,
            b,
            n,
            |x: F, y: F| if x.is_nan() || x > y { x } else { y },
        ),
        BinaryOp::Minimum => zip_map(
            a,
            b,
            n,
            |x: F, y: F| if x.is_nan() || x < y { x } else { y },
        ),
        // Computed in f64: 1 - t² and 1 - s cancel badly in f16/bf16.
        BinaryOp::GeluBackward | BinaryOp::GeluTanhBackward | BinaryOp::SiluBackward => {
            zip_map(a, b, n, move |x: F, g: F| {
                let (x, g) = (WithDType::to_f64(x), WithDType::to_f64(g));
                <F as WithDType>::from_f64(op.eval_f64(x, g))
            })
        }
        BinaryOp::ReluBackward => zip_map(
            a,
            b,
            n,
            |x: F, g: F| {
                if x > F::zero() {
                    g
                } else {
                    F::zero()
                }
            },
        ),
    }
}

fn binary_int<I: Int + ferrite_core::WithDType>(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
) -> Result<Vec<I>> {
    let n = op.name();
    match op {
        BinaryOp::Add => zip_map(a, b, n, |x: I, y: I| x.wadd(y)),
        BinaryOp::Sub => zip_map(a, b, n, |x: I, y: I| x.wsub(y)),
        BinaryOp::Mul => zip_map(a, b, n, |x: I, y: I| x.wmul(y)),
        BinaryOp::Div => {
            if a.elem_count() > 0 && contig::<I>(b, n)?.contains(&I::ZERO) {
                return Err(Error::backend("div", "integer division by zero"));
            }
            zip_map(a, b, n, |x: I, y: I| x.wdiv(y))
        }
        BinaryOp::Maximum => zip_map(a, b, n, |x: I, y: I| if x > y { x } else { y }),
        BinaryOp::Minimum => zip_map(a, b, n, |x: I, y: I| if x < y { x } else { y }),
        BinaryOp::Pow
        | BinaryOp::GeluBackward
        | BinaryOp::GeluTanhBackward
        | BinaryOp::SiluBackward
        | BinaryOp::ReluBackward => Err(Error::dtype(n, I::DTYPE, "needs a float dtype")),
    }
}

pub(crate) fn binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<HostBuffer> {
    Ok(match a.dtype() {
        DType::F32 => HostBuffer::F32(binary_float(op, a, b)?),
        DType::F64 => HostBuffer::F64(binary_float(op, a, b)?),
        DType::F16 => HostBuffer::F16(binary_float(op, a, b)?),
        DType::BF16 => HostBuffer::BF16(binary_float(op, a, b)?),
        DType::I32 => HostBuffer::I32(binary_int(op, a, b)?),
        DType::I64 => HostBuffer::I64(binary_int(op, a, b)?),
        DType::U32 => HostBuffer::U32(binary_int(op, a, b)?),
        DType::U8 => HostBuffer::U8(binary_int(op, a, b)?),
        DType::Bool => {
            return Err(Error::dtype(
                op.name(),
                DType::Bool,
                "needs a numeric dtype",
            ))
        }
    })
}

pub(crate) fn cmp(op: CmpOp, a: &Tensor, b: &Tensor) -> Result<HostBuffer> {
    // One closure per comparison, so each inner loop is branch-free and vectorizes.
    fn go<T: ferrite_core::WithDType>(op: CmpOp, a: &Tensor, b: &Tensor) -> Result<Vec<bool>> {
        let n = op.name();
        match op {
            CmpOp::Eq => zip_map(a, b, n, |x: T, y: T| x == y),
            CmpOp::Ne => zip_map(a, b, n, |x: T, y: T| x != y),
            CmpOp::Lt => zip_map(a, b, n, |x: T, y: T| x < y),
            CmpOp::Le => zip_map(a, b, n, |x: T, y: T| x <= y),
            CmpOp::Gt => zip_map(a, b, n, |x: T, y: T| x > y),
            CmpOp::Ge => zip_map(a, b, n, |x: T, y: T| x >= y),
        }
    }
    Ok(HostBuffer::Bool(match a.dtype() {
        DType::F32 => go::<f32>(op, a, b)?,
        DType::F64 => go::<f64>(op, a, b)?,
        DType::F16 => go::<f16>(op, a, b)?,
        DType::BF16 => go::<bf16>(op, a, b)?,
        DType::I32 => go::<i32>(op, a, b)?,
        DType::I64 => go::<i64>(op, a, b)?,
        DType::U32 => go::<u32>(op, a, b)?,
        DType::U8 => go::<u8>(op, a, b)?,
        DType::Bool => go::<bool>(op, a, b)?,
    }))
}

/// One operand of an elementwise kernel: its elements in row-major order, or one value
/// broadcast to every position (all strides 0).
enum Operand<'a, T: Clone> {
    Elems(Cow<'a, [T]>),
    Splat(T),
}

impl<'a, T: WithDType> Operand<'a, T> {
    fn of(t: &'a Tensor, op: &'static str) -> Result<Operand<'a, T>> {
        let l = t.layout();
        if t.elem_count() > 0 && l.strides().iter().all(|&s| s == 0) {
            return Ok(Operand::Splat(raw::<T>(t, op)?[l.offset()]));
        }
        Ok(Operand::Elems(contig::<T>(t, op)?))
    }
}

/// `cond ? a : b` elementwise; `a` and `b` are row-major slices or splats of `n` elements.
fn select<T: WithDType>(cond: &[bool], a: &Operand<T>, b: &Operand<T>) -> Vec<T> {
    filled(cond.len(), |out| {
        // Chunk `c` covers elements [c * PAR_CHUNK, ..) of every operand.
        let body = |(c, d): (usize, &mut [MaybeUninit<T>])| {
            let at = c * PAR_CHUNK;
            let m = &cond[at..at + d.len()];
            match (a, b) {
                (Operand::Elems(x), Operand::Elems(y)) => {
                    let it = m.iter().zip(&x[at..]).zip(&y[at..]);
                    for (o, ((&c, &x), &y)) in d.iter_mut().zip(it) {
                        o.write(if c { x } else { y });
                    }
                }
                (Operand::Elems(x), &Operand::Splat(y)) => {
                    for (o, (&c, &x)) in d.iter_mut().zip(m.iter().zip(&x[at..])) {
                        o.write(if c { x } else { y });
                    }
                }
                (&Operand::Splat(x), Operand::Elems(y)) => {
                    for (o, (&c, &y)) in d.iter_mut().zip(m.iter().zip(&y[at..])) {
                        o.write(if c { x } else { y });
                    }
                }
                (&Operand::Splat(x), &Operand::Splat(y)) => {
                    for (o, &c) in d.iter_mut().zip(m) {
                        o.write(if c { x } else { y });
                    }
                }
            }
        };
        if cond.len() >= PAR_MIN {
            out.par_chunks_mut(PAR_CHUNK).enumerate().for_each(body);
        } else {
            out.chunks_mut(PAR_CHUNK).enumerate().for_each(body);
        }
    })
}

pub(crate) fn where_cond(c: &Tensor, a: &Tensor, b: &Tensor) -> Result<HostBuffer> {
    let op = "where";
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            lhs: a.dtype(),
            rhs: b.dtype(),
        });
    }
    let cond = contig::<bool>(c, op)?;
    fn go<T: WithDType>(cond: &[bool], a: &Tensor, b: &Tensor) -> Result<Vec<T>> {
        Ok(select(
            cond,
            &Operand::<T>::of(a, "where")?,
            &Operand::<T>::of(b, "where")?,
        ))
    }
    Ok(match a.dtype() {
        DType::F32 => HostBuffer::F32(go(&cond, a, b)?),
        DType::F64 => HostBuffer::F64(go(&cond, a, b)?),
        DType::F16 => HostBuffer::F16(go(&cond, a, b)?),
        DType::BF16 => HostBuffer::BF16(go(&cond, a, b)?),
        DType::I32 => HostBuffer::I32(go(&cond, a, b)?),
        DType::I64 => HostBuffer::I64(go(&cond, a, b)?),
        DType::U32 => HostBuffer::U32(go(&cond, a, b)?),
        DType::U8 => HostBuffer::U8(go(&cond, a, b)?),
        DType::Bool => HostBuffer::Bool(go(&cond, a, b)?),
    })
}
