//! The list of op cases.

use crate::reference as r;
use crate::{default_tol, Input, OpCase, Ref, Tol, Values, View};
use ferrite_core::{BinaryOp, CmpOp, DType, Result, Tensor, UnaryOp};
use std::sync::Arc;

/// q, k, v shapes and causality of an attention case.
type AttentionShapes = ([usize; 4], [usize; 4], [usize; 4], bool);

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

fn inp(shape: &[usize], dtype: DType, values: Values, view: View) -> Input {
    Input {
        shape: shape.to_vec(),
        dtype,
        values,
        view,
    }
}

fn u(lo: f64, hi: f64) -> Values {
    Values::Uniform(lo, hi)
}

fn scaled(t: Tol, k: f64) -> Tol {
    Tol {
        atol: t.atol * k,
        rtol: t.rtol * k,
    }
}

fn name_of(op: &str, dtype: DType, inputs: &[Input]) -> String {
    let shapes: Vec<String> = inputs
        .iter()
        .map(|i| {
            let v = match i.view {
                View::Contiguous => "",
                View::Transposed => "T",
                View::Narrowed => "N",
            };
            format!("{:?}{v}", i.shape)
        })
        .collect();
    format!("{op}/{dtype}/{}", shapes.join("x")).replace(' ', "")
}

struct B {
    out: Vec<OpCase>,
}

impl B {
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        op: &str,
        dtype: DType,
        inputs: Vec<Input>,
        tol: Vec<Tol>,
        differentiable: bool,
        run: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'static,
        reference: impl Fn(&[Ref]) -> Vec<Ref> + Send + Sync + 'static,
    ) {
        let name = name_of(op, dtype, &inputs);
        self.out.push(OpCase {
            name,
            inputs,
            run: Arc::new(run),
            reference: Arc::new(reference),
            tol,
            differentiable,
        });
    }
}

/// Odd sizes, a zero-size shape, and non-contiguous views for elementwise ops.
fn elementwise_shapes() -> Vec<(Vec<usize>, View)> {
    vec![
        (vec![1], View::Contiguous),
        (vec![31], View::Contiguous),
        (vec![33], View::Narrowed),
        (vec![45, 65], View::Contiguous),
        (vec![45, 65], View::Transposed),
        (vec![2, 3, 33], View::Narrowed),
        (vec![0], View::Contiguous),
        (vec![3, 0, 5], View::Contiguous),
    ]
}

fn unary_domain(op: UnaryOp) -> Values {
    match op {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt => u(0.1, 4.0),
        UnaryOp::Recip => Values::AwayFromZero(0.25, 2.0),
        _ => u(-4.0, 4.0),
    }
}

fn unary_cases(b: &mut B) {
    for op in UnaryOp::ALL {
        for dt in FLOATS {
            for (shape, view) in elementwise_shapes() {
                let tol = default_tol(dt);
                b.add(
                    op.name(),
                    dt,
                    vec![inp(&shape, dt, unary_domain(op), view)],
                    vec![tol],
                    true,
                    move |x| Ok(vec![x[0].unary(op)?]),
                    move |x| vec![r::unary(op, &x[0])],
                );
            }
        }
        if op.supports_int() {
            for dt in [DType::I32, DType::I64, DType::U32, DType::U8] {
                let unsigned = matches!(dt, DType::U32 | DType::U8);
                if unsigned && op == UnaryOp::Neg {
                    continue;
                }
                let vals = if unsigned {
                    Values::Ints(0, 15)
                } else {
                    Values::Ints(-50, 50)
                };
                b.add(
                    op.name(),
                    dt,
                    vec![inp(&[45, 65], dt, vals, View::Transposed)],
                    vec![default_tol(dt)],
                    false,
                    move |x| Ok(vec![x[0].unary(op)?]),
                    move |x| vec![r::unary(op, &x[0])],
                );
            }
        }
    }
}

fn binary_shapes() -> Vec<(Vec<usize>, View, Vec<usize>, View)> {
    use View::*;
    vec![
        (vec![1], Contiguous, vec![1], Contiguous),
        (vec![31], Contiguous, vec![31], Narrowed),
        (vec![45, 65], Transposed, vec![45, 65], Contiguous),
        (vec![45, 1], Contiguous, vec![1, 65], Contiguous),
        (vec![2, 3, 33], Narrowed, vec![33], Contiguous),
        (vec![33], Contiguous, vec![2, 3, 33], Contiguous),
        (vec![45, 65], Contiguous, vec![], Contiguous),
        (vec![1], Contiguous, vec![2, 3, 33], Contiguous),
        (vec![0, 3], Contiguous, vec![3], Contiguous),
        // Per-channel values over [n, c, h, w] (a conv bias), either side, and per-row values.
        (vec![2, 3, 5, 8], Contiguous, vec![3, 1, 1], Contiguous),
        (vec![3, 1, 1], Contiguous, vec![2, 3, 5, 7], Contiguous),
        (vec![6, 40], Contiguous, vec![6, 1], Contiguous),
    ]
}

fn binary_cases(b: &mut B) {
    for op in BinaryOp::ALL {
        let (va, vb) = match op {
            BinaryOp::Div => (u(-4.0, 4.0), Values::AwayFromZero(0.25, 2.0)),
            BinaryOp::Pow => (u(0.5, 2.0), u(-2.0, 2.0)),
            _ => (u(-4.0, 4.0), u(-4.0, 4.0)),
        };
        for dt in FLOATS {
            for (sa, wa, sb, wb) in binary_shapes() {
                b.add(
                    op.name(),
                    dt,
                    vec![inp(&sa, dt, va, wa), inp(&sb, dt, vb, wb)],
                    vec![default_tol(dt)],
                    true,
                    move |x| Ok(vec![x[0].binary(op, &x[1])?]),
                    move |x| vec![r::binary(op, &x[0], &x[1])],
                );
            }
        }
        if op.float_only() {
            continue;
        }
        for dt in [DType::I32, DType::I64, DType::U32, DType::U8] {
            let unsigned = matches!(dt, DType::U32 | DType::U8);
            if unsigned && op == BinaryOp::Sub {
                continue;
            }
            let (va, vb) = match (op, unsigned) {
                (BinaryOp::Div, false) => (Values::Ints(-100, 100), Values::Ints(1, 9)),
                (BinaryOp::Div, true) => (Values::Ints(0, 200), Values::Ints(1, 9)),
                (_, true) => (Values::Ints(0, 15), Values::Ints(0, 15)),
                (_, false) => (Values::Ints(-100, 100), Values::Ints(-100, 100)),
            };
            b.add(
                op.name(),
                dt,
                vec![
                    inp(&[45, 65], dt, va, View::Transposed),
                    inp(&[65], dt, vb, View::Contiguous),
                ],
                vec![default_tol(dt)],
                false,
                move |x| Ok(vec![x[0].binary(op, &x[1])?]),
                move |x| {
                    let o = r::binary(op, &x[0], &x[1]);
                    // Integer division truncates toward zero.
                    if op == BinaryOp::Div {
                        vec![r::map(&o, f64::trunc)]
                    } else {
                        vec![o]
                    }
                },
            );
        }
    }
    for op in CmpOp::ALL {
        for dt in [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::F64,
            DType::I32,
            DType::U8,
            DType::Bool,
        ] {
            let vals = if dt == DType::Bool {
                Values::Bools
            } else {
                Values::Ints(0, 4)
            };
            for (sa, wa, sb, wb) in [
                (vec![45, 65], View::Transposed, vec![65], View::Contiguous),
                (vec![31], View::Contiguous, vec![31], View::Narrowed),
                // A broadcast scalar (ReLU's mask, `x > 0`).
                (vec![5, 33], View::Contiguous, vec![], View::Contiguous),
            ] {
                b.add(
                    op.name(),
                    dt,
                    vec![inp(&sa, dt, vals, wa), inp(&sb, dt, vals, wb)],
                    vec![default_tol(DType::Bool)],
                    false,
                    move |x| Ok(vec![x[0].cmp(op, &x[1])?]),
                    move |x| vec![r::cmp(op, &x[0], &x[1])],
                );
            }
        }
    }
    for dt in [DType::F32, DType::BF16, DType::I64, DType::Bool] {
        let vals = if dt == DType::Bool {
            Values::Bools
        } else {
            Values::Ints(-9, 9)
        };
        // Broadcast condition; broadcast scalars on either side (ReLU's backward masks with a
        // zero); a scalar on both.
        let shapes: [[(&[usize], View); 3]; 4] = [
            [
                (&[45, 1], View::Contiguous),
                (&[45, 65], View::Transposed),
                (&[65], View::Contiguous),
            ],
            [
                (&[5, 33], View::Contiguous),
                (&[5, 33], View::Contiguous),
                (&[], View::Contiguous),
            ],
            [
                (&[45, 65], View::Contiguous),
                (&[1], View::Contiguous),
                (&[45, 65], View::Transposed),
            ],
            [
                (&[2, 3, 33], View::Narrowed),
                (&[], View::Contiguous),
                (&[1], View::Contiguous),
            ],
        ];
        for [(sc, wc), (sa, wa), (sb, wb)] in shapes {
            b.add(
                "where",
                dt,
                vec![
                    inp(sc, DType::Bool, Values::Bools, wc),
                    inp(sa, dt, vals, wa),
                    inp(sb, dt, vals, wb),
                ],
                vec![default_tol(dt)],
                dt.is_float(),
                |x| Ok(vec![Tensor::where_cond(&x[0], &x[1], &x[2])?]),
                |x| vec![r::where_cond(&x[0], &x[1], &x[2])],
            );
        }
    }
}

fn reduce_cases(b: &mut B) {
    type RF = fn(&[f64]) -> f64;
    let axes_sets: Vec<(Vec<usize>, View, Vec<isize>)> = vec![
        (vec![31], View::Contiguous, vec![]),
        (vec![45, 65], View::Transposed, vec![0]),
        (vec![45, 65], View::Contiguous, vec![-1]),
        (vec![5, 31, 33], View::Narrowed, vec![0, 2]),
        // A conv bias gradient's reduction: n, h, w of [n, c, h, w].
        (vec![4, 3, 5, 7], View::Contiguous, vec![0, 2, 3]),
        (vec![5, 31, 33], View::Contiguous, vec![1]),
        (vec![1, 1], View::Contiguous, vec![0, 1]),
        (vec![3, 1000], View::Contiguous, vec![1]),
        // Bias gradients: rows summed into contiguous outputs (CUDA's 16-byte column
        // sums), one output block and a long run split over many blocks.
        (vec![300, 64], View::Contiguous, vec![0]),
        (vec![2, 2048, 24], View::Contiguous, vec![0, 1]),
    ];
    let ops: [(&str, RF); 3] = [("sum", r::sum), ("max", r::max), ("min", r::min)];
    for (name, f) in ops {
        for dt in [
            DType::F32,
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::I32,
            DType::I64,
        ] {
            for (shape, view, axes) in &axes_sets {
                for keepdim in [false, true] {
                    let axes2 = axes.clone();
                    let ax: Vec<usize> = if axes.is_empty() {
                        (0..shape.len()).collect()
                    } else {
                        axes.iter()
                            .map(|&a| {
                                if a < 0 {
                                    (a + shape.len() as isize) as usize
                                } else {
                                    a as usize
                                }
                            })
                            .collect()
                    };
                    let vals = if dt.is_float() {
                        u(-4.0, 4.0)
                    } else {
                        Values::Ints(-100, 100)
                    };
                    // Sums of many rounded terms: 4x the per-element tolerance.
                    let tol = if name == "sum" {
                        scaled(default_tol(dt), 4.0)
                    } else {
                        default_tol(dt)
                    };
                    b.add(
                        &format!("{name}{axes:?}k{}", keepdim as u8),
                        dt,
                        vec![inp(shape, dt, vals, *view)],
                        vec![tol],
                        dt.is_float(),
                        move |x| {
                            Ok(vec![match name {
                                "sum" => x[0].sum(&axes2, keepdim)?,
                                "max" => x[0].max(&axes2, keepdim)?,
                                _ => x[0].min(&axes2, keepdim)?,
                            }])
                        },
                        move |x| vec![r::reduce(&x[0], &ax, keepdim, f)],
                    );
                }
            }
        }
    }
    // Zero-size: summing an empty axis gives zeros.
    b.add(
        "sum[0]",
        DType::F32,
        vec![inp(&[0, 5], DType::F32, u(-1.0, 1.0), View::Contiguous)],
        vec![default_tol(DType::F32)],
        true,
        |x| Ok(vec![x[0].sum(&[0], false)?]),
        |x| vec![r::reduce(&x[0], &[0], false, r::sum)],
    );
    let args: [(&str, RF); 2] = [("argmax", r::argmax), ("argmin", r::argmin)];
    for (name, f) in args {
        for dt in [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::F64,
            DType::I32,
            DType::U8,
        ] {
            for (shape, view, axis) in [
                (vec![45, 65], View::Transposed, 0isize),
                (vec![5, 31, 33], View::Narrowed, -1),
                (vec![31], View::Contiguous, 0),
            ] {
                let vals = if dt.is_float() {
                    u(-4.0, 4.0)
                } else {
                    Values::Ints(0, 200)
                };
                let a = if axis < 0 {
                    shape.len() - 1
                } else {
                    axis as usize
                };
                b.add(
                    name,
                    dt,
                    vec![inp(&shape, dt, vals, view)],
                    vec![default_tol(DType::U32)],
                    false,
                    move |x| {
                        Ok(vec![if name == "argmax" {
                            x[0].argmax(axis, false)?
                        } else {
                            x[0].argmin(axis, false)?
                        }])
                    },
                    move |x| vec![r::reduce(&x[0], &[a], false, f)],
                );
            }
        }
    }
    for dt in FLOATS {
        let tol = scaled(default_tol(dt), 4.0);
        let x = || vec![inp(&[5, 31, 33], dt, u(-3.0, 3.0), View::Narrowed)];
        b.add(
            "mean[0,2]",
            dt,
            x(),
            vec![tol],
            true,
            |x| Ok(vec![x[0].mean(&[0, 2], false)?]),
            |x| vec![r::reduce(&x[0], &[0, 2], false, r::mean)],
        );
        b.add(
            "var[1]",
            dt,
            x(),
            vec![tol],
            true,
            |x| Ok(vec![x[0].var(&[1], true, true)?]),
            |x| vec![r::reduce(&x[0], &[1], true, |v| r::var(v, true))],
        );
        b.add(
            "var[]",
            dt,
            x(),
            vec![tol],
            true,
            |x| Ok(vec![x[0].var(&[], false, false)?]),
            |x| vec![r::reduce(&x[0], &[0, 1, 2], false, |v| r::var(v, false))],
        );
        b.add(
            "logsumexp[-1]",
            dt,
            x(),
            vec![tol],
            true,
            |x| Ok(vec![x[0].logsumexp(&[-1], false)?]),
            |x| vec![r::reduce(&x[0], &[2], false, r::logsumexp)],
        );
        b.add(
            "logsumexp[0,1]",
            dt,
            x(),
            vec![tol],
            true,
            |x| Ok(vec![x[0].logsumexp(&[0, 1], true)?]),
            |x| vec![r::reduce(&x[0], &[0, 1], true, r::logsumexp)],
        );
    }
}

fn matmul_cases(b: &mut B) {
    use View::*;
    let pairs: Vec<(Vec<usize>, View, Vec<usize>, View)> = vec![
        (vec![1, 1], Contiguous, vec![1, 1], Contiguous),
        (vec![31, 33], Contiguous, vec![33, 45], Contiguous),
        (vec![31, 33], Transposed, vec![33, 45], Transposed),
        (vec![45, 65], Narrowed, vec![65, 1], Contiguous),
        (vec![3, 31, 33], Contiguous, vec![33, 17], Transposed),
        (vec![3, 31, 33], Transposed, vec![33, 17], Contiguous),
        (vec![2, 3, 5, 7], Contiguous, vec![7], Contiguous),
        (vec![2, 1, 5, 7], Contiguous, vec![3, 7, 4], Contiguous),
        (vec![33], Contiguous, vec![33, 5], Contiguous),
        (vec![5, 33], Contiguous, vec![33], Contiguous),
        (vec![4, 0], Contiguous, vec![0, 3], Contiguous),
        (vec![128, 96], Contiguous, vec![96, 80], Transposed),
    ];
    for dt in FLOATS {
        for (sa, wa, sb, wb) in &pairs {
            let k = *sa.last().unwrap_or(&1) as f64;
            let tol = scaled(default_tol(dt), k.sqrt().max(1.0));
            b.add(
                "matmul",
                dt,
                vec![
                    inp(sa, dt, u(-1.0, 1.0), *wa),
                    inp(sb, dt, u(-1.0, 1.0), *wb),
                ],
                vec![tol],
                true,
                |x| Ok(vec![x[0].matmul(&x[1])?]),
                |x| vec![r::matmul(&x[0], &x[1])],
            );
        }
    }
}

/// An autocast product's output must be f32 (any other dtype fails the case).
fn f32_out(op: &'static str, y: &Tensor) -> Result<()> {
    match y.dtype() {
        DType::F32 => Ok(()),
        d => Err(ferrite_core::Error::dtype(
            op,
            d,
            "autocast must return f32 here",
        )),
    }
}

/// `a b + bias` over the last axis, from the f64 reference product.
fn matmul_bias_ref(x: &[Ref]) -> Vec<Ref> {
    let mut y = r::matmul(&x[0], &x[1]);
    let n = x[2].data.len();
    for (i, v) in y.data.iter_mut().enumerate() {
        *v += x[2].data[i % n];
    }
    vec![y]
}

fn matmul_bias_cases(b: &mut B) {
    use View::*;
    // (a, its view, weight [n, k] used transposed as b [k, n]): the Linear layer's product,
    // over plain rows, folded batch rows, a narrowed input, an empty depth and tile sizes.
    let shapes: Vec<(Vec<usize>, View, [usize; 2])> = vec![
        (vec![31, 33], Contiguous, [45, 33]),
        (vec![3, 31, 33], Contiguous, [17, 33]),
        (vec![45, 65], Narrowed, [7, 65]),
        (vec![4, 0], Contiguous, [3, 0]),
        (vec![128, 96], Contiguous, [80, 96]),
    ];
    for dt in FLOATS {
        for (sa, wa, [n, k]) in &shapes {
            let tol = scaled(default_tol(dt), (*k as f64).sqrt().max(1.0));
            b.add(
                "matmul_bias",
                dt,
                vec![
                    inp(sa, dt, u(-1.0, 1.0), *wa),
                    inp(&[*k, *n], dt, u(-1.0, 1.0), Transposed),
                    inp(&[*n], dt, u(-1.0, 1.0), Contiguous),
                ],
                vec![tol],
                true,
                |x| Ok(vec![x[0].matmul_bias(&x[1], Some(&x[2]))?]),
                matmul_bias_ref,
            );
        }
    }
    // The residual added by the product (`Op::MatmulBias { acc }`): a residual of the
    // output's shape (one op; a narrowed view is read through its strides) and one that
    // broadcasts (the product, then an add).
    for dt in FLOATS {
        for (sa, wa, [n, k]) in &shapes {
            let tol = scaled(default_tol(dt), (*k as f64).sqrt().max(1.0));
            let mut od = sa[..sa.len() - 1].to_vec();
            od.push(*n);
            for (acc_shape, acc_view) in [
                (od.clone(), Contiguous),
                (od.clone(), Narrowed),
                (vec![*n], Contiguous),
            ] {
                b.add(
                    "matmul_bias_add",
                    dt,
                    vec![
                        inp(sa, dt, u(-1.0, 1.0), *wa),
                        inp(&[*k, *n], dt, u(-1.0, 1.0), Transposed),
                        inp(&[*n], dt, u(-1.0, 1.0), Contiguous),
                        inp(&acc_shape, dt, u(-1.0, 1.0), acc_view),
                    ],
                    vec![tol],
                    true,
                    |x| Ok(vec![x[0].matmul_bias_add(&x[1], Some(&x[2]), &x[3])?]),
                    |x| {
                        let y = matmul_bias_ref(x).remove(0);
                        vec![r::binary(BinaryOp::Add, &y, &x[3])]
                    },
                );
            }
        }
    }
    // Under autocast: 16-bit operands, the f32 output written by the product with the f32
    // bias added before its one rounding (`Op::MatmulBias` with an f32 output spec), and the
    // plain product's f32 output (`Op::Matmul`).
    for low in [DType::BF16, DType::F16] {
        for (sa, wa, [n, k]) in &shapes {
            let tol = scaled(default_tol(low), (*k as f64).sqrt().max(1.0));
            b.add(
                &format!("autocast_{low}_matmul_bias"),
                DType::F32,
                vec![
                    inp(sa, DType::F32, u(-1.0, 1.0), *wa),
                    inp(&[*k, *n], DType::F32, u(-1.0, 1.0), Transposed),
                    inp(&[*n], DType::F32, u(-1.0, 1.0), Contiguous),
                ],
                vec![tol],
                false,
                move |x| {
                    let y = ferrite_core::autocast::autocast(low, || {
                        x[0].matmul_bias(&x[1], Some(&x[2]))
                    })??;
                    f32_out("matmul_bias", &y)?;
                    Ok(vec![y])
                },
                matmul_bias_ref,
            );
            let mut od = sa[..sa.len() - 1].to_vec();
            od.push(*n);
            b.add(
                &format!("autocast_{low}_matmul_bias_add"),
                DType::F32,
                vec![
                    inp(sa, DType::F32, u(-1.0, 1.0), *wa),
                    inp(&[*k, *n], DType::F32, u(-1.0, 1.0), Transposed),
                    inp(&[*n], DType::F32, u(-1.0, 1.0), Contiguous),
                    inp(&od, DType::F32, u(-1.0, 1.0), Contiguous),
                ],
                vec![tol],
                false,
                move |x| {
                    let y = ferrite_core::autocast::autocast(low, || {
                        x[0].matmul_bias_add(&x[1], Some(&x[2]), &x[3])
                    })??;
                    f32_out("matmul_bias_add", &y)?;
                    Ok(vec![y])
                },
                |x| {
                    let y = matmul_bias_ref(x).remove(0);
                    vec![r::binary(BinaryOp::Add, &y, &x[3])]
                },
            );
            b.add(
                &format!("autocast_{low}_matmul"),
                DType::F32,
                vec![
                    inp(sa, DType::F32, u(-1.0, 1.0), *wa),
                    inp(&[*k, *n], DType::F32, u(-1.0, 1.0), Transposed),
                ],
                vec![tol],
                false,
                move |x| {
                    let y = ferrite_core::autocast::autocast(low, || x[0].matmul(&x[1]))??;
                    f32_out("matmul", &y)?;
                    Ok(vec![y])
                },
                |x| vec![r::matmul(&x[0], &x[1])],
            );
        }
    }
}

/// `Tensor::matmul_bias_gelu` (a Linear and the tanh GELU after it in one op) alone and
/// feeding a second product (whose gradient then goes through the GELU in one op,
/// `Tensor::matmul_gelu_backward`), and that op itself: widths that are multiples of 8
/// (cuBLASLt's GELU epilogues) and widths that are not (the composed path), folded rows, a
/// narrowed input, an empty depth; under autocast too.
fn matmul_gelu_cases(b: &mut B) {
    use View::*;
    let shapes: Vec<(Vec<usize>, View, [usize; 2])> = vec![
        (vec![31, 33], Contiguous, [45, 33]),
        (vec![3, 31, 33], Contiguous, [16, 33]),
        (vec![45, 65], Narrowed, [7, 65]),
        (vec![4, 0], Contiguous, [3, 0]),
        (vec![128, 96], Contiguous, [80, 96]),
    ];
    let gelu_ref = |x: &[Ref]| vec![r::unary(UnaryOp::GeluTanh, &matmul_bias_ref(x)[0])];
    for dt in FLOATS {
        for (sa, wa, [n, k]) in &shapes {
            let tol = scaled(default_tol(dt), (*k as f64).sqrt().max(1.0));
            b.add(
                "matmul_bias_gelu",
                dt,
                vec![
                    inp(sa, dt, u(-1.0, 1.0), *wa),
                    inp(&[*k, *n], dt, u(-1.0, 1.0), Transposed),
                    inp(&[*n], dt, u(-1.0, 1.0), Contiguous),
                ],
                vec![tol],
                true,
                |x| Ok(vec![x[0].matmul_bias_gelu(&x[1], &x[2])?]),
                gelu_ref,
            );
            // Into a second product, with and without a bias: [.., n] -> [.., 24].
            for bias2 in [true, false] {
                let mut ins = vec![
                    inp(sa, dt, u(-1.0, 1.0), *wa),
                    inp(&[*k, *n], dt, u(-1.0, 1.0), Transposed),
                    inp(&[*n], dt, u(-1.0, 1.0), Contiguous),
                    inp(&[*n, 24], dt, u(-1.0, 1.0), Transposed),
                ];
                if bias2 {
                    ins.push(inp(&[24], dt, u(-1.0, 1.0), Contiguous));
                }
                let tol2 = scaled(tol, (*n as f64).sqrt().max(1.0));
                b.add(
                    &format!(
                        "matmul_bias_gelu_then_{}",
                        if bias2 { "linear" } else { "matmul" }
                    ),
                    dt,
                    ins,
                    vec![tol2],
                    true,
                    move |x| {
                        let h = x[0].matmul_bias_gelu(&x[1], &x[2])?;
                        Ok(vec![match bias2 {
                            true => h.matmul_bias(&x[3], Some(&x[4]))?,
                            false => {
                                let rows = h.elem_count() / h.dims()[h.rank() - 1].max(1);
                                h.reshape([rows, h.dims()[h.rank() - 1]])?.matmul(&x[3])?
                            }
                        }])
                    },
                    move |x| {
                        let h = r::unary(UnaryOp::GeluTanh, &matmul_bias_ref(x)[0]);
                        if bias2 {
                            return matmul_bias_ref(&[h, x[3].clone(), x[4].clone()]);
                        }
                        let n = h.shape[h.shape.len() - 1];
                        let rows = Ref::new(vec![h.data.len() / n.max(1), n], h.data);
                        vec![r::matmul(&rows, &x[3])]
                    },
                );
            }
            // The backward op: g [m, 24], b [24, n] (a transposed weight), x [m, n].
            let m: usize = sa[..sa.len() - 1].iter().product();
            b.add(
                "matmul_gelu_backward",
                dt,
                vec![
                    inp(&[m, 24], dt, u(-1.0, 1.0), Contiguous),
                    inp(&[24, *n], dt, u(-1.0, 1.0), Transposed),
                    inp(&[m, *n], dt, u(-3.0, 3.0), Contiguous),
                ],
                vec![scaled(default_tol(dt), 5.0)],
                false,
                |x| Ok(vec![x[0].matmul_gelu_backward(&x[1], &x[2])?]),
                |x| {
                    let q = r::matmul(&x[0], &x[1]);
                    vec![r::binary(BinaryOp::GeluTanhBackward, &x[2], &q)]
                },
            );
        }
    }
    for low in [DType::BF16, DType::F16] {
        for (sa, wa, [n, k]) in &shapes {
            let tol = scaled(default_tol(low), (*k as f64).sqrt().max(1.0));
            b.add(
                &format!("autocast_{low}_matmul_bias_gelu"),
                DType::F32,
                vec![
                    inp(sa, DType::F32, u(-1.0, 1.0), *wa),
                    inp(&[*k, *n], DType::F32, u(-1.0, 1.0), Transposed),
                    inp(&[*n], DType::F32, u(-1.0, 1.0), Contiguous),
                ],
                vec![tol],
                false,
                move |x| {
                    let y = ferrite_core::autocast::autocast(low, || {
                        x[0].matmul_bias_gelu(&x[1], &x[2])
                    })??;
                    f32_out("matmul_bias_gelu", &y)?;
                    Ok(vec![y])
                },
                gelu_ref,
            );
        }
    }
}

/// `Tensor::cast_col_sums` (a Linear's f32 output gradient as its products' 16-bit operand
/// and its bias gradient): every float pair; rows of whole 16-byte words (CUDA's one-pass
/// kernel, split over blocks or not), odd widths, and strided views.
fn cast_col_sums_cases(b: &mut B) {
    use View::*;
    let shapes = [
        (vec![300, 64], Contiguous),
        (vec![9, 8], Contiguous),
        (vec![1, 12], Contiguous),
        (vec![2000, 40], Contiguous),
        (vec![45, 7], Contiguous),
        (vec![33, 16], Narrowed),
        (vec![24, 20], Transposed),
    ];
    for from in FLOATS {
        for to in FLOATS {
            for (shape, view) in &shapes {
                let k = (shape[0] as f64).sqrt();
                b.add(
                    &format!("cast_col_sums_to_{to}"),
                    from,
                    vec![inp(shape, from, u(-1.0, 1.0), *view)],
                    vec![default_tol(to), scaled(default_tol(from), k)],
                    false,
                    move |x| {
                        let (c, s) = x[0].cast_col_sums(to)?;
                        if c.dtype() != to || s.dtype() != from {
                            return Err(ferrite_core::Error::dtype(
                                "cast_col_sums",
                                s.dtype(),
                                format!("expected {to} and {from} outputs, got {}", c.dtype()),
                            ));
                        }
                        Ok(vec![c, s])
                    },
                    move |x| vec![r::cast(&x[0], to), r::reduce(&x[0], &[0], false, r::sum)],
                );
            }
        }
    }
}

/// `Tensor::cast_each` (autocast's parameter copies in one op): every float pair over
/// tensors of several sizes (more than one of CUDA's blocks, a tail of odd length, a strided
/// view taking the one-by-one path), and 70 tensors (two of CUDA's launches).
fn cast_each_cases(b: &mut B) {
    use View::*;
    let mixed = [
        (vec![300, 64], Contiguous),
        (vec![9001], Contiguous),
        (vec![7], Contiguous),
        (vec![24, 20], Transposed),
        (vec![3, 5], Contiguous),
    ];
    for from in FLOATS {
        for to in FLOATS {
            let inputs = mixed
                .iter()
                .map(|(shape, view)| inp(shape, from, u(-3.0, 3.0), *view))
                .collect();
            b.add(
                &format!("cast_each_to_{to}"),
                from,
                inputs,
                vec![default_tol(to); mixed.len()],
                false,
                move |x| {
                    let refs: Vec<&Tensor> = x.iter().collect();
                    Tensor::cast_each(&refs, to)
                },
                move |x| x.iter().map(|t| r::cast(t, to)).collect(),
            );
        }
    }
    let many = (0..70)
        .map(|i| inp(&[1 + i % 9], DType::F32, u(-3.0, 3.0), Contiguous))
        .collect();
    b.add(
        "cast_each_70_to_bf16",
        DType::F32,
        many,
        vec![default_tol(DType::BF16); 70],
        false,
        |x| {
            let refs: Vec<&Tensor> = x.iter().collect();
            Tensor::cast_each(&refs, DType::BF16)
        },
        |x| x.iter().map(|t| r::cast(t, DType::BF16)).collect(),
    );
}

fn cast_cases(b: &mut B) {
    for from in DType::ALL {
        for to in DType::ALL {
            let vals = match from {
                DType::Bool => Values::Bools,
                DType::U8 => Values::Ints(0, 256),
                DType::U32 => Values::Ints(0, 100_000),
                d if d.is_int() => Values::Ints(-100_000, 100_000),
                _ => u(-300.0, 300.0),
            };
            let tol = if to.is_float() && from.is_float() {
                default_tol(to)
            } else {
                Tol {
                    atol: 0.0,
                    rtol: 0.0,
                }
            };
            b.add(
                &format!("cast_to_{to}"),
                from,
                vec![inp(&[45, 65], from, vals, View::Transposed)],
                vec![tol],
                // Rounding to a narrower float is not finite-difference checkable.
                from.is_float() && to == DType::F64,
                move |x| Ok(vec![x[0].cast(to)?]),
                move |x| {
                    // Ints and bools convert through i64 (wrapping into narrower ints), floats
                    // through f64 (truncating, saturating).
                    let through_int = !from.is_float();
                    vec![if through_int && to.is_int() {
                        let v = x[0]
                            .data
                            .iter()
                            .map(|&v| {
                                let i = v as i64;
                                match to {
                                    DType::I32 => i as i32 as f64,
                                    DType::U32 => i as u32 as f64,
                                    DType::U8 => i as u8 as f64,
                                    _ => i as f64,
                                }
                            })
                            .collect();
                        Ref::new(x[0].shape.clone(), v)
                    } else {
                        r::cast(&x[0], to)
                    }]
                },
            );
        }
    }
}

fn index_cases(b: &mut B) {
    for dt in [DType::F32, DType::BF16, DType::I64, DType::Bool] {
        let vals = if dt == DType::Bool {
            Values::Bools
        } else if dt.is_int() {
            Values::Ints(-50, 50)
        } else {
            u(-2.0, 2.0)
        };
        for (axis, n, idt) in [(0usize, 45i64, DType::U32), (1, 65, DType::I64)] {
            b.add(
                &format!("index_select{axis}"),
                dt,
                vec![
                    inp(&[45, 65], dt, vals, View::Transposed),
                    inp(&[37], idt, Values::Ints(0, n), View::Contiguous),
                ],
                vec![default_tol(dt)],
                dt.is_float(),
                move |x| Ok(vec![x[0].index_select(&x[1], axis as isize)?]),
                move |x| {
                    vec![r::index_select(
                        &x[0],
                        &x[1].data.iter().map(|&v| v as usize).collect::<Vec<_>>(),
                        axis,
                    )]
                },
            );
        }
        b.add(
            "gather1",
            dt,
            vec![
                inp(&[5, 7], dt, vals, View::Transposed),
                inp(&[5, 3], DType::I32, Values::Ints(0, 7), View::Contiguous),
            ],
            vec![default_tol(dt)],
            dt.is_float(),
            |x| Ok(vec![x[0].gather(&x[1], 1)?]),
            |x| vec![r::gather(&x[0], &x[1], 1)],
        );
        b.add(
            "gather0",
            dt,
            vec![
                inp(&[5, 7], dt, vals, View::Contiguous),
                inp(&[9, 6], DType::I64, Values::Ints(0, 5), View::Contiguous),
            ],
            vec![default_tol(dt)],
            dt.is_float(),
            |x| Ok(vec![x[0].gather(&x[1], 0)?]),
            |x| vec![r::gather(&x[0], &x[1], 0)],
        );
        b.add(
            "cat1",
            dt,
            vec![
                inp(&[2, 3, 4], dt, vals, View::Narrowed),
                inp(&[2, 5, 4], dt, vals, View::Contiguous),
                inp(&[2, 1, 4], dt, vals, View::Transposed),
            ],
            vec![default_tol(dt)],
            dt.is_float(),
            |x| Ok(vec![Tensor::cat(&[&x[0], &x[1], &x[2]], 1)?]),
            |x| vec![r::cat(&[&x[0], &x[1], &x[2]], 1)],
        );
        // More inputs than one launch takes (CAT_MAX = 8 on CUDA), rows that move as words.
        b.add(
            "cat10_rows",
            dt,
            (0..10)
                .map(|i| inp(&[1 + i % 3, 8], dt, vals, View::Contiguous))
                .collect(),
            vec![default_tol(dt)],
            dt.is_float(),
            |x| Ok(vec![Tensor::cat(&x.iter().collect::<Vec<_>>(), 0)?]),
            |x| vec![r::cat(&x.iter().collect::<Vec<_>>(), 0)],
        );
        b.add(
            "stack0",
            dt,
            vec![
                inp(&[31, 3], dt, vals, View::Contiguous),
                inp(&[31, 3], dt, vals, View::Narrowed),
            ],
            vec![default_tol(dt)],
            dt.is_float(),
            |x| Ok(vec![Tensor::stack(&[&x[0], &x[1]], 0)?]),
            |x| {
                let a = Ref::new(vec![1, 31, 3], x[0].data.clone());
                let c = Ref::new(vec![1, 31, 3], x[1].data.clone());
                vec![r::cat(&[&a, &c], 0)]
            },
        );
        b.add(
            "split1",
            dt,
            vec![inp(&[4, 9], dt, vals, View::Transposed)],
            vec![default_tol(dt); 2],
            dt.is_float(),
            |x| x[0].split(&[2, 7], 1),
            |x| {
                vec![
                    r::index_select(&x[0], &[0, 1], 1),
                    r::index_select(&x[0], &[2, 3, 4, 5, 6, 7, 8], 1),
                ]
            },
        );
    }
    for dt in [DType::F32, DType::F64, DType::I32] {
        let vals = if dt.is_int() {
            Values::Ints(-50, 50)
        } else {
            u(-2.0, 2.0)
        };
        b.add(
            "scatter_add1",
            dt,
            vec![
                inp(&[5, 7], dt, vals, View::Transposed),
                inp(&[5, 9], DType::I64, Values::Ints(0, 7), View::Contiguous),
                inp(&[5, 9], dt, vals, View::Contiguous),
            ],
            vec![default_tol(dt)],
            dt.is_float(),
            |x| Ok(vec![x[0].scatter_add(&x[1], &x[2], 1)?]),
            |x| vec![r::scatter_add(&x[0], &x[1], &x[2], 1)],
        );
        b.add(
            "scatter_add0",
            dt,
            vec![
                inp(&[5, 7], dt, vals, View::Contiguous),
                inp(&[12, 7], DType::U32, Values::Ints(0, 5), View::Contiguous),
                inp(&[12, 7], dt, vals, View::Contiguous),
            ],
            vec![default_tol(dt)],
            dt.is_float(),
            |x| Ok(vec![x[0].scatter_add(&x[1], &x[2], 0)?]),
            |x| vec![r::scatter_add(&x[0], &x[1], &x[2], 0)],
        );
    }
    b.add(
        "embedding",
        DType::F32,
        vec![
            inp(&[50, 16], DType::F32, u(-1.0, 1.0), View::Contiguous),
            inp(&[3, 5], DType::U32, Values::Ints(0, 50), View::Contiguous),
        ],
        vec![default_tol(DType::F32)],
        true,
        |x| Ok(vec![Tensor::embedding(&x[0], &x[1])?]),
        |x| {
            let mut o = r::index_select(
                &x[0],
                &x[1].data.iter().map(|&v| v as usize).collect::<Vec<_>>(),
                0,
            );
            o.shape = vec![3, 5, 16];
            vec![o]
        },
    );
}

fn scan_cases(b: &mut B) {
    for dt in [DType::F32, DType::F64, DType::F16, DType::I32, DType::I64] {
        let vals = if dt.is_int() {
            Values::Ints(-50, 50)
        } else {
            u(-2.0, 2.0)
        };
        for (axis, view) in [(0usize, View::Transposed), (1, View::Narrowed)] {
            let tol = scaled(default_tol(dt), 4.0);
            b.add(
                &format!("cumsum{axis}"),
                dt,
                vec![inp(&[45, 65], dt, vals, view)],
                vec![tol],
                dt.is_float(),
                move |x| Ok(vec![x[0].cumsum(axis as isize)?]),
                move |x| vec![r::along(&x[0], axis, r::cumsum)],
            );
        }
    }
    for dt in [DType::F32, DType::BF16, DType::I32, DType::U8] {
        let vals = if dt.is_int() {
            Values::Ints(0, 20)
        } else {
            u(-2.0, 2.0)
        };
        for (axis, desc, view) in [
            (1usize, false, View::Contiguous),
            (0, true, View::Transposed),
            (1, true, View::Narrowed),
        ] {
            let exact = Tol {
                atol: 0.0,
                rtol: 0.0,
            };
            b.add(
                &format!("sort{axis}{}", if desc { "desc" } else { "asc" }),
                dt,
                vec![inp(&[45, 65], dt, vals, view)],
                vec![exact, exact],
                false,
                move |x| {
                    let (v, i) = x[0].sort(axis as isize, desc)?;
                    Ok(vec![v, i])
                },
                move |x| {
                    let idx = r::along(&x[0], axis, |l| {
                        r::argsort(l, desc).iter().map(|&i| i as f64).collect()
                    });
                    let vals = r::along(&x[0], axis, |l| {
                        r::argsort(l, desc).iter().map(|&i| l[i]).collect()
                    });
                    vec![vals, idx]
                },
            );
        }
        let exact = Tol {
            atol: 0.0,
            rtol: 0.0,
        };
        b.add(
            "topk5",
            dt,
            vec![inp(&[7, 65], dt, vals, View::Transposed)],
            vec![exact, exact],
            false,
            |x| {
                let (v, i) = x[0].topk(5, -1, true)?;
                Ok(vec![v, i])
            },
            |x| {
                let idx = r::along(&x[0], 1, |l| {
                    r::argsort(l, true).iter().map(|&i| i as f64).collect()
                });
                let vals = r::along(&x[0], 1, |l| {
                    r::argsort(l, true).iter().map(|&i| l[i]).collect()
                });
                let keep: Vec<usize> = (0..5).collect();
                vec![
                    r::index_select(&vals, &keep, 1),
                    r::index_select(&idx, &keep, 1),
                ]
            },
        );
    }
}

fn fused_cases(b: &mut B) {
    for dt in FLOATS {
        let tol = scaled(default_tol(dt), 2.0);
        for (shape, view, axis) in [
            (vec![1, 1], View::Contiguous, -1isize),
            (vec![31, 33], View::Narrowed, -1),
            (vec![45, 65], View::Transposed, 0),
            (vec![2, 3, 1000], View::Contiguous, -1),
        ] {
            let a = if axis < 0 {
                shape.len() - 1
            } else {
                axis as usize
            };
            b.add(
                &format!("softmax{axis}"),
                dt,
                vec![inp(&shape, dt, u(-6.0, 6.0), view)],
                vec![tol],
                true,
                move |x| Ok(vec![x[0].softmax(axis)?]),
                move |x| vec![r::along(&x[0], a, r::softmax)],
            );
            b.add(
                &format!("log_softmax{axis}"),
                dt,
                vec![inp(&shape, dt, u(-6.0, 6.0), view)],
                vec![scaled(tol, 2.0)],
                true,
                move |x| Ok(vec![x[0].log_softmax(axis)?]),
                move |x| vec![r::along(&x[0], a, r::log_softmax)],
            );
        }
        // [5, 600]: f32 rows too wide for CUDA's warp-per-row kernels (its block-per-row
        // kernels, the norm backward's `acc` included). [67, 384] and [9, 1000]: CUDA's f32
        // layer norm backward with a warp per row of 129 to 1024 (`_r3`, several rows a warp;
        // `_r8`, the last chunks of a lane past the row).
        for (shape, view) in [
            (vec![1, 1], View::Contiguous),
            (vec![31, 33], View::Narrowed),
            (vec![2, 45, 65], View::Transposed),
            (vec![5, 600], View::Contiguous),
            (vec![67, 384], View::Contiguous),
            (vec![9, 1000], View::Contiguous),
        ] {
            let n = *shape.last().unwrap_or(&1);
            let ln_tol = scaled(default_tol(dt), 4.0);
            // x (in the loop's view), weight, bias, and an upstream gradient shaped as x.
            let x_in = || inp(&shape, dt, u(-3.0, 3.0), view);
            let w_in = || inp(&[n], dt, u(0.5, 1.5), View::Contiguous);
            let b_in = || inp(&[n], dt, u(-1.0, 1.0), View::Contiguous);
            let g_in = || inp(&shape, dt, u(-1.0, 1.0), View::Contiguous);
            b.add(
                "layer_norm",
                dt,
                vec![x_in(), w_in(), b_in()],
                vec![ln_tol],
                true,
                |x| Ok(vec![x[0].layer_norm(&x[1], &x[2], 1e-5)?]),
                |x| vec![r::layer_norm(&x[0], &x[1], &x[2], 1e-5)],
            );
            if dt == DType::F32 {
                // f32 rows with a 16-bit partner: the output written in bf16/f16 (an autocast
                // product's input), and the backward of such an output (a 16-bit gradient).
                for low in [DType::BF16, DType::F16] {
                    b.add(
                        &format!("layer_norm_to_{low}"),
                        dt,
                        vec![x_in(), w_in(), b_in()],
                        vec![scaled(default_tol(low), 4.0)],
                        false,
                        move |x| {
                            let y = x[0].layer_norm_to(&x[1], &x[2], 1e-5, low)?;
                            match y.dtype() == low {
                                true => Ok(vec![y]),
                                false => Err(ferrite_core::Error::dtype(
                                    "layer_norm_to",
                                    y.dtype(),
                                    "wrong output dtype",
                                )),
                            }
                        },
                        |x| vec![r::layer_norm(&x[0], &x[1], &x[2], 1e-5)],
                    );
                    // g is given in f32 and rounded to `low` by the case; the reference sees
                    // the f32 values: the tolerance covers that rounding.
                    let k = (n as f64).sqrt();
                    b.add(
                        &format!("layer_norm_backward_g{low}"),
                        dt,
                        vec![x_in(), w_in(), g_in()],
                        vec![
                            scaled(default_tol(low), 4.0),
                            scaled(default_tol(low), 4.0 * k),
                            scaled(default_tol(low), 4.0 * k),
                        ],
                        false,
                        move |x| {
                            let g = x[2].cast(low)?;
                            let (dx, dw, db) = Tensor::layer_norm_backward(&x[0], &x[1], &g, 1e-5)?;
                            Ok(vec![dx, dw, db])
                        },
                        |x| {
                            let n = *x[0].shape.last().unwrap_or(&1);
                            let rows = x[0].data.len() / n.max(1);
                            let flat = |t: &Ref| Ref::new(vec![rows, n], t.data.clone());
                            let (dx, dw, db) =
                                r::layer_norm_backward(&flat(&x[0]), &x[1], &flat(&x[2]), 1e-5);
                            vec![Ref::new(x[0].shape.clone(), dx.data), dw, db]
                        },
                    );
                }
            }
            b.add(
                "rms_norm",
                dt,
                vec![x_in(), w_in()],
                vec![ln_tol],
                true,
                |x| Ok(vec![x[0].rms_norm(&x[1], 1e-6)?]),
                |x| vec![r::rms_norm(&x[0], &x[1], 1e-6)],
            );
            // A norm of a residual stream: x's gradient has two terms, the norm's backward
            // adding the other use's (`adds_into_first` in ferrite-autodiff).
            b.add(
                "layer_norm_residual",
                dt,
                vec![x_in(), w_in(), b_in()],
                vec![ln_tol],
                true,
                |x| Ok(vec![x[0].add(&x[0].layer_norm(&x[1], &x[2], 1e-5)?)?]),
                |x| {
                    vec![r::binary(
                        BinaryOp::Add,
                        &x[0],
                        &r::layer_norm(&x[0], &x[1], &x[2], 1e-5),
                    )]
                },
            );
            b.add(
                "rms_norm_residual",
                dt,
                vec![x_in(), w_in()],
                vec![ln_tol],
                true,
                |x| Ok(vec![x[0].add(&x[0].rms_norm(&x[1], 1e-6)?)?]),
                |x| {
                    vec![r::binary(
                        BinaryOp::Add,
                        &x[0],
                        &r::rms_norm(&x[0], &x[1], 1e-6),
                    )]
                },
            );
            // The backward kernels with the gradient gathered so far (acc) added to dx.
            let k = (n as f64).sqrt();
            let flat = move |t: &Ref, like: &Ref| {
                let n = *like.shape.last().unwrap_or(&1);
                Ref::new(vec![like.data.len() / n.max(1), n], t.data.clone())
            };
            let plus = |a: Ref, b: &Ref| {
                let data = a.data.iter().zip(&b.data).map(|(p, q)| p + q).collect();
                Ref::new(b.shape.clone(), data)
            };
            b.add(
                "layer_norm_backward_acc",
                dt,
                vec![x_in(), w_in(), g_in(), inp(&shape, dt, u(-1.0, 1.0), view)],
                vec![ln_tol, scaled(ln_tol, k), scaled(ln_tol, k)],
                false,
                |x| {
                    let (dx, dw, db) =
                        Tensor::layer_norm_backward_acc(&x[0], &x[1], &x[2], 1e-5, Some(&x[3]))?;
                    Ok(vec![dx, dw, db])
                },
                move |x| {
                    let (dx, dw, db) = r::layer_norm_backward(
                        &flat(&x[0], &x[0]),
                        &x[1],
                        &flat(&x[2], &x[0]),
                        1e-5,
                    );
                    vec![plus(dx, &x[3]), dw, db]
                },
            );
            b.add(
                "rms_norm_backward_acc",
                dt,
                vec![x_in(), w_in(), g_in(), inp(&shape, dt, u(-1.0, 1.0), view)],
                vec![ln_tol, scaled(ln_tol, k)],
                false,
                |x| {
                    let (dx, dw) =
                        Tensor::rms_norm_backward_acc(&x[0], &x[1], &x[2], 1e-6, Some(&x[3]))?;
                    Ok(vec![dx, dw])
                },
                move |x| {
                    let (dx, dw) =
                        r::rms_norm_backward(&flat(&x[0], &x[0]), &x[1], &flat(&x[2], &x[0]), 1e-6);
                    vec![plus(dx, &x[3]), dw]
                },
            );
        }
        for interleaved in [false, true] {
            for (shape, view) in [
                (vec![2, 3, 5, 8], View::Contiguous),
                (vec![1, 31, 34], View::Narrowed),
            ] {
                let l = shape[shape.len() - 2];
                let h = shape[shape.len() - 1] / 2;
                b.add(
                    &format!(
                        "rope{}",
                        if interleaved {
                            "_interleaved"
                        } else {
                            "_halves"
                        }
                    ),
                    dt,
                    vec![
                        inp(&shape, dt, u(-2.0, 2.0), view),
                        inp(&[l, h], dt, u(-1.0, 1.0), View::Contiguous),
                        inp(&[l, h], dt, u(-1.0, 1.0), View::Contiguous),
                    ],
                    vec![scaled(default_tol(dt), 2.0)],
                    true,
                    move |x| Ok(vec![x[0].rope(&x[1], &x[2], interleaved)?]),
                    move |x| vec![r::rope(&x[0], &x[1], &x[2], interleaved)],
                );
            }
        }
        let shapes: [AttentionShapes; 5] = [
            ([2, 6, 5, 8], [2, 2, 7, 8], [2, 2, 7, 6], true),
            ([2, 6, 5, 8], [2, 2, 7, 8], [2, 2, 7, 6], false),
            ([1, 9, 1, 64], [1, 3, 33, 64], [1, 3, 33, 64], true),
            ([1, 4, 31, 33], [1, 4, 31, 33], [1, 4, 31, 33], true),
            ([1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], false),
        ];
        for (qs, ks, vs, causal) in shapes {
            let scale = 1.0 / (qs[3] as f64).sqrt();
            b.add(
                if causal {
                    "attention_causal"
                } else {
                    "attention"
                },
                dt,
                vec![
                    inp(&qs, dt, u(-1.0, 1.0), View::Contiguous),
                    inp(&ks, dt, u(-1.0, 1.0), View::Narrowed),
                    inp(&vs, dt, u(-1.0, 1.0), View::Transposed),
                ],
                vec![scaled(default_tol(dt), 4.0)],
                true,
                move |x| Ok(vec![Tensor::attention(&x[0], &x[1], &x[2], causal, None)?]),
                move |x| vec![r::attention(&x[0], &x[1], &x[2], causal, scale)],
            );
        }
        // Self-attention over one projection's rows [b, l, 3 h d]: q, k, v its thirds viewed as
        // heads (the layout whose gradients `attention_backward` writes into one buffer and
        // the autodiff joins without a copy), on the row, tiled and tensor-core kernels.
        for (b_, l, h, d, causal) in [
            (2, 5, 3, 8, true),
            (1, 4, 1, 16, false),
            (1, 33, 2, 64, true),
            (2, 70, 2, 64, false),
        ] {
            let scale = 1.0 / (d as f64).sqrt();
            let e = h * d;
            b.add(
                if causal {
                    "attention_causal_projection"
                } else {
                    "attention_projection"
                },
                dt,
                vec![inp(&[b_, l, 3 * e], dt, u(-1.0, 1.0), View::Contiguous)],
                vec![scaled(default_tol(dt), 4.0)],
                true,
                move |x| {
                    let third = |i: usize| {
                        x[0].narrow(-1, i * e, e)?
                            .reshape([b_, l, h, d])?
                            .permute(&[0, 2, 1, 3])
                    };
                    Ok(vec![Tensor::attention(
                        &third(0)?,
                        &third(1)?,
                        &third(2)?,
                        causal,
                        None,
                    )?])
                },
                move |x| {
                    // [b, l, 3, h, d] -> third i as [b, h, l, d].
                    let third = |i: usize| {
                        let mut v = Vec::with_capacity(b_ * h * l * d);
                        for bi in 0..b_ {
                            for hi in 0..h {
                                for li in 0..l {
                                    let row = (bi * l + li) * 3 * e + i * e + hi * d;
                                    v.extend_from_slice(&x[0].data[row..row + d]);
                                }
                            }
                        }
                        Ref::new(vec![b_, h, l, d], v)
                    };
                    vec![r::attention(&third(0), &third(1), &third(2), causal, scale)]
                },
            );
        }
        // With a key-padding mask [b, lk]: grouped-query heads, causal + mask, K/V views and
        // contiguous 64-wide heads (CUDA's tensor-core forward for f16/bf16), more than one
        // 64-key tile, a narrowed mask view, and (forward only: NaN rows have no gradient to
        // check by differences) a batch row whose every key is masked.
        let masked: [(AttentionShapes, View, View, bool); 6] = [
            (
                ([2, 6, 5, 8], [2, 2, 7, 8], [2, 2, 7, 6], true),
                View::Narrowed,
                View::Contiguous,
                false,
            ),
            (
                ([2, 4, 31, 33], [2, 4, 33, 33], [2, 4, 33, 33], false),
                View::Transposed,
                View::Narrowed,
                false,
            ),
            (
                ([2, 4, 70, 64], [2, 2, 70, 64], [2, 2, 70, 64], true),
                View::Contiguous,
                View::Contiguous,
                false,
            ),
            (
                ([2, 2, 3, 64], [2, 2, 67, 64], [2, 2, 67, 64], false),
                View::Contiguous,
                View::Contiguous,
                true,
            ),
            (
                ([3, 2, 4, 8], [3, 1, 6, 8], [3, 1, 6, 8], true),
                View::Narrowed,
                View::Narrowed,
                true,
            ),
            (
                ([1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], false),
                View::Contiguous,
                View::Contiguous,
                false,
            ),
        ];
        for ((qs, ks, vs, causal), kv_view, mask_view, full) in masked {
            let scale = 1.0 / (qs[3] as f64).sqrt();
            b.add(
                if causal {
                    "attention_causal_masked"
                } else {
                    "attention_masked"
                },
                dt,
                vec![
                    inp(&qs, dt, u(-1.0, 1.0), View::Contiguous),
                    inp(&ks, dt, u(-1.0, 1.0), kv_view),
                    inp(&vs, dt, u(-1.0, 1.0), kv_view),
                    inp(
                        &[qs[0], ks[2]],
                        DType::Bool,
                        Values::PaddingMask(full),
                        mask_view,
                    ),
                ],
                vec![scaled(default_tol(dt), 4.0)],
                !full,
                move |x| {
                    let m = Some(&x[3]);
                    Ok(vec![Tensor::attention_masked(
                        &x[0], &x[1], &x[2], m, causal, None,
                    )?])
                },
                move |x| {
                    vec![r::attention_masked(
                        &x[0],
                        &x[1],
                        &x[2],
                        Some(&x[3]),
                        causal,
                        scale,
                    )]
                },
            );
            // The output with its lse (what a recorded forward writes for the backward);
            // +inf where a query sees no key.
            b.add(
                "attention_lse",
                dt,
                vec![
                    inp(&qs, dt, u(-1.0, 1.0), View::Contiguous),
                    inp(&ks, dt, u(-1.0, 1.0), kv_view),
                    inp(&vs, dt, u(-1.0, 1.0), kv_view),
                    inp(
                        &[qs[0], ks[2]],
                        DType::Bool,
                        Values::PaddingMask(full),
                        mask_view,
                    ),
                ],
                vec![scaled(default_tol(dt), 4.0), default_tol(DType::F32)],
                false,
                move |x| {
                    let (o, lse) =
                        Tensor::attention_lse(&x[0], &x[1], &x[2], Some(&x[3]), causal, None)?;
                    Ok(vec![o, lse])
                },
                move |x| {
                    let (o, lse) =
                        r::attention_lse(&x[0], &x[1], &x[2], Some(&x[3]), causal, scale);
                    vec![o, lse]
                },
            );
        }
    }
}

fn conv_ref(
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
) -> r::ConvRef {
    r::ConvRef {
        stride,
        padding,
        dilation,
        groups,
    }
}

/// Adds bias [o] along dim 1 of a reference output.
fn ref_bias(y: Ref, b: &Ref) -> Ref {
    let o = b.data.len();
    let per = y.data.len() / y.shape[0].max(1) / o.max(1);
    let data = y
        .data
        .iter()
        .enumerate()
        .map(|(i, v)| v + b.data[(i / per) % o])
        .collect();
    Ref::new(y.shape, data)
}

/// conv1d's reference through conv2d's on a height-1 view.
fn ref_1d(x: &Ref) -> Ref {
    let mut s = x.shape.clone();
    s.insert(2, 1);
    Ref::new(s, x.data.clone())
}

fn ref_squeeze2(y: Ref) -> Ref {
    let mut s = y.shape.clone();
    s.remove(2);
    Ref::new(s, y.data)
}

/// conv2d / conv1d / conv_transpose2d over strides, padding (incl. 'same'), dilation, groups
/// (incl. depthwise), 1x1 kernels, bias, odd sizes and non-contiguous inputs.
fn conv_cases(b: &mut B) {
    use ferrite_core::{ConvArgs, ConvTransposeArgs, Padding};
    type Conv2 = (
        &'static str,
        [usize; 4],
        [usize; 4],
        View,
        [usize; 2],
        [usize; 2],
        [usize; 2],
        usize,
        bool,
    );
    // The CPU runs blocks of batch items (one item per block for large planes or small
    // batches, several side by side otherwise; the last block may be shorter): batches of 1
    // and 2 take one-item blocks, the batch-37 cases multi-item ones (3x3 stride 1 and 2 with
    // padding 1, with and without groups, and 1x1).
    let convs: [Conv2; 11] = [
        (
            "conv2d",
            [2, 3, 7, 9],
            [4, 3, 3, 3],
            View::Narrowed,
            [1, 1],
            [1, 1],
            [1, 1],
            1,
            true,
        ),
        (
            "conv2d_strided",
            [1, 4, 11, 13],
            [6, 4, 3, 2],
            View::Transposed,
            [2, 3],
            [1, 2],
            [2, 1],
            1,
            false,
        ),
        (
            "conv2d_groups",
            [2, 4, 6, 5],
            [6, 2, 3, 3],
            View::Contiguous,
            [2, 1],
            [0, 0],
            [1, 1],
            2,
            true,
        ),
        (
            "conv2d_depthwise",
            [1, 6, 8, 8],
            [6, 1, 3, 3],
            View::Narrowed,
            [1, 1],
            [1, 1],
            [1, 1],
            6,
            true,
        ),
        (
            "conv2d_1x1",
            [2, 33, 5, 4],
            [31, 33, 1, 1],
            View::Contiguous,
            [1, 1],
            [0, 0],
            [1, 1],
            1,
            false,
        ),
        (
            "conv2d_1x1_strided",
            [1, 5, 7, 6],
            [3, 5, 1, 1],
            View::Transposed,
            [2, 2],
            [0, 0],
            [1, 1],
            1,
            false,
        ),
        (
            "conv2d_large_plane",
            [2, 2, 17, 17],
            [3, 2, 3, 3],
            View::Narrowed,
            [1, 1],
            [1, 1],
            [1, 1],
            1,
            true,
        ),
        (
            "conv2d_batch_blocks",
            [37, 3, 6, 5],
            [4, 3, 3, 3],
            View::Contiguous,
            [1, 1],
            [1, 1],
            [1, 1],
            1,
            true,
        ),
        (
            "conv2d_batch_blocks_strided_groups",
            [37, 4, 7, 6],
            [6, 2, 3, 3],
            View::Narrowed,
            [2, 2],
            [1, 1],
            [1, 1],
            2,
            false,
        ),
        (
            "conv2d_batch_blocks_1x1",
            [37, 5, 4, 3],
            [3, 5, 1, 1],
            View::Transposed,
            [1, 1],
            [0, 0],
            [1, 1],
            1,
            false,
        ),
        (
            "conv2d_large_plane",
            [1, 4, 16, 20],
            [4, 2, 3, 3],
            View::Contiguous,
            [1, 1],
            [1, 1],
            [1, 1],
            2,
            false,
        ),
    ];
    for dt in FLOATS {
        let tol = scaled(default_tol(dt), 8.0);
        for (name, xs, ws, view, stride, padding, dilation, groups, bias) in convs {
            let mut ins = vec![
                inp(&xs, dt, u(-1.0, 1.0), view),
                inp(&ws, dt, u(-1.0, 1.0), View::Contiguous),
            ];
            if bias {
                ins.push(inp(&[ws[0]], dt, u(-1.0, 1.0), View::Contiguous));
            }
            let args = ConvArgs {
                stride,
                padding: Padding::Zeros(padding),
                dilation,
                groups,
            };
            let p = conv_ref(stride, padding, dilation, groups);
            b.add(
                name,
                dt,
                ins,
                vec![tol],
                true,
                move |x| Ok(vec![x[0].conv2d(&x[1], x.get(2), &args)?]),
                move |x| {
                    let y = r::conv2d(&x[0], &x[1], &p);
                    vec![match x.get(2) {
                        Some(bias) => ref_bias(y, bias),
                        None => y,
                    }]
                },
            );
        }
        // 'same' with an even kernel and an odd dilated extent: the extra pad goes right.
        b.add(
            "conv2d_same",
            dt,
            vec![
                inp(&[1, 2, 7, 6], dt, u(-1.0, 1.0), View::Contiguous),
                inp(&[3, 2, 4, 3], dt, u(-1.0, 1.0), View::Contiguous),
            ],
            vec![tol],
            true,
            |x| {
                let args = ConvArgs {
                    padding: Padding::Same,
                    dilation: [1, 3],
                    ..ConvArgs::default()
                };
                Ok(vec![x[0].conv2d(&x[1], None, &args)?])
            },
            |x| {
                // Total padding [3, 6]: [1 left + 2 right, 3 + 3]; pad the reference input.
                let [n, c, h, w] = [x[0].shape[0], x[0].shape[1], x[0].shape[2], x[0].shape[3]];
                let (hp, wp) = (h + 3, w + 6);
                let mut d = vec![0.0; n * c * hp * wp];
                for pl in 0..n * c {
                    for i in 0..h {
                        for j in 0..w {
                            d[(pl * hp + i + 1) * wp + j + 3] = x[0].data[(pl * h + i) * w + j];
                        }
                    }
                }
                let xp = Ref::new(vec![n, c, hp, wp], d);
                vec![r::conv2d(&xp, &x[1], &conv_ref([1, 1], [0, 0], [1, 3], 1))]
            },
        );
        b.add(
            "conv1d",
            dt,
            vec![
                inp(&[2, 3, 31], dt, u(-1.0, 1.0), View::Narrowed),
                inp(&[5, 3, 4], dt, u(-1.0, 1.0), View::Contiguous),
                inp(&[5], dt, u(-1.0, 1.0), View::Contiguous),
            ],
            vec![tol],
            true,
            |x| {
                let args = ConvArgs {
                    stride: [2],
                    padding: Padding::Zeros([1]),
                    dilation: [2],
                    groups: 1,
                };
                Ok(vec![x[0].conv1d(&x[1], Some(&x[2]), &args)?])
            },
            |x| {
                let p = conv_ref([1, 2], [0, 1], [1, 2], 1);
                vec![ref_bias(
                    ref_squeeze2(r::conv2d(&ref_1d(&x[0]), &ref_1d(&x[1]), &p)),
                    &x[2],
                )]
            },
        );
        type Tr = (
            [usize; 4],
            [usize; 4],
            View,
            [usize; 2],
            [usize; 2],
            [usize; 2],
            [usize; 2],
            usize,
            bool,
        );
        let trs: [Tr; 3] = [
            (
                [2, 4, 5, 6],
                [4, 3, 3, 3],
                View::Narrowed,
                [2, 2],
                [1, 1],
                [1, 1],
                [1, 1],
                1,
                true,
            ),
            (
                [1, 4, 4, 3],
                [4, 2, 2, 3],
                View::Transposed,
                [2, 3],
                [0, 1],
                [1, 2],
                [2, 1],
                2,
                false,
            ),
            (
                [1, 3, 1, 1],
                [3, 2, 1, 1],
                View::Contiguous,
                [1, 1],
                [0, 0],
                [0, 0],
                [1, 1],
                1,
                false,
            ),
        ];
        for (xs, ws, view, stride, padding, output_padding, dilation, groups, bias) in trs {
            let mut ins = vec![
                inp(&xs, dt, u(-1.0, 1.0), view),
                inp(&ws, dt, u(-1.0, 1.0), View::Contiguous),
            ];
            if bias {
                ins.push(inp(&[ws[1] * groups], dt, u(-1.0, 1.0), View::Contiguous));
            }
            let args = ConvTransposeArgs {
                stride,
                padding,
                output_padding,
                dilation,
                groups,
            };
            let p = conv_ref(stride, padding, dilation, groups);
            b.add(
                "conv_transpose2d",
                dt,
                ins,
                vec![tol],
                true,
                move |x| Ok(vec![x[0].conv_transpose2d(&x[1], x.get(2), &args)?]),
                move |x| {
                    let y = r::conv_transpose2d(&x[0], &x[1], &p, output_padding);
                    vec![match x.get(2) {
                        Some(bias) => ref_bias(y, bias),
                        None => y,
                    }]
                },
            );
        }
        // The CPU's direct 3x3 path (f32 and 16-bit, padding 1, one group, at least 8 channels
        // each side; stride 1, and stride 2 but for the input gradient): forward, input
        // gradient (conv_transpose2d of the same geometry) and weight gradient over odd and
        // even planes, channel counts around its blocks of 12 and 6 channels, one and many
        // items.
        // The weight gradient takes the direct path from 8 output vectors (e.g. 9x9 at stride 1,
        // 11x9 at stride 2) up.
        let direct: [([usize; 4], usize, usize); 13] = [
            ([1, 8, 1, 1], 8, 1),
            ([3, 9, 5, 7], 13, 1),
            ([2, 13, 3, 17], 8, 1),
            ([37, 8, 4, 4], 25, 1),
            ([3, 9, 11, 13], 13, 1),
            ([37, 8, 9, 9], 25, 1),
            ([1, 8, 28, 28], 9, 1),
            ([1, 8, 1, 1], 8, 2),
            ([3, 9, 5, 7], 13, 2),
            ([2, 13, 8, 17], 8, 2),
            ([37, 8, 6, 5], 25, 2),
            ([2, 13, 20, 17], 8, 2),
            ([37, 8, 22, 18], 25, 2),
        ];
        for (xs, o, st) in direct {
            let [n, c, h, w] = xs;
            let (oh, ow) = ((h - 1) / st + 1, (w - 1) / st + 1);
            let ws = [o, c, 3, 3];
            let p = conv_ref([st, st], [1, 1], [1, 1], 1);
            let args = ConvArgs {
                stride: [st, st],
                padding: Padding::Zeros([1, 1]),
                ..ConvArgs::default()
            };
            let (fwd, bwd) = match st {
                1 => ("conv2d_3x3", "conv2d_backward_weight_3x3"),
                _ => ("conv2d_3x3s2", "conv2d_backward_weight_3x3s2"),
            };
            b.add(
                fwd,
                dt,
                vec![
                    inp(&xs, dt, u(-1.0, 1.0), View::Narrowed),
                    inp(&ws, dt, u(-1.0, 1.0), View::Contiguous),
                ],
                vec![tol],
                true,
                move |x| Ok(vec![x[0].conv2d(&x[1], None, &args)?]),
                move |x| vec![r::conv2d(&x[0], &x[1], &p)],
            );
            if st == 1 {
                let targs = ConvTransposeArgs {
                    padding: [1, 1],
                    ..ConvTransposeArgs::default()
                };
                b.add(
                    "conv_transpose2d_3x3",
                    dt,
                    vec![
                        inp(&[n, o, h, w], dt, u(-1.0, 1.0), View::Contiguous),
                        inp(&ws, dt, u(-1.0, 1.0), View::Contiguous),
                    ],
                    vec![tol],
                    true,
                    move |x| Ok(vec![x[0].conv_transpose2d(&x[1], None, &targs)?]),
                    move |x| vec![r::conv_transpose2d(&x[0], &x[1], &p, [0, 0])],
                );
            }
            let params = ferrite_core::Conv2dParams {
                stride: [st, st],
                padding: [1, 1],
                dilation: [1, 1],
                groups: 1,
            };
            b.add(
                bwd,
                dt,
                vec![
                    inp(&xs, dt, u(-1.0, 1.0), View::Contiguous),
                    inp(&[n, o, oh, ow], dt, u(-1.0, 1.0), View::Narrowed),
                ],
                vec![tol],
                false,
                move |x| {
                    Ok(vec![ferrite_core::Tensor::conv2d_backward_weight(
                        &x[0], &x[1], &params, &ws,
                    )?])
                },
                move |x| {
                    // dw[o, c, a, b] = Σ gy[n, o, i, j] x[n, c, i st + a - 1, j st + b - 1].
                    let (xd, gd) = (&x[0].data, &x[1].data);
                    let mut dw = vec![0.0; o * c * 9];
                    for ni in 0..n {
                        for oc in 0..o {
                            for ci in 0..c {
                                for t in 0..9 {
                                    let (a, bb) = (t / 3, t % 3);
                                    let mut s = 0.0;
                                    for i in 0..oh {
                                        for j in 0..ow {
                                            let (y, z) = (i * st + a, j * st + bb);
                                            if y < 1 || z < 1 || y > h || z > w {
                                                continue;
                                            }
                                            s += gd[((ni * o + oc) * oh + i) * ow + j]
                                                * xd[((ni * c + ci) * h + y - 1) * w + z - 1];
                                        }
                                    }
                                    dw[(oc * c + ci) * 9 + t] += s;
                                }
                            }
                        }
                    }
                    vec![Ref::new(ws.to_vec(), dw)]
                },
            );
        }
    }
}

/// Max (with indices), average and adaptive average pooling, 2-d and 1-d.
fn pool_cases(b: &mut B) {
    use ferrite_core::PoolArgs;
    type P = (
        [usize; 4],
        View,
        [usize; 2],
        [usize; 2],
        [usize; 2],
        [usize; 2],
        bool,
        bool,
    );
    let pools: [P; 4] = [
        (
            [2, 3, 9, 10],
            View::Narrowed,
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1],
            false,
            true,
        ),
        (
            [1, 2, 31, 33],
            View::Contiguous,
            [2, 2],
            [2, 2],
            [0, 0],
            [1, 1],
            true,
            true,
        ),
        (
            [1, 2, 8, 7],
            View::Transposed,
            [3, 2],
            [2, 2],
            [1, 1],
            [2, 1],
            true,
            false,
        ),
        (
            [1, 1, 1, 1],
            View::Contiguous,
            [1, 1],
            [1, 1],
            [0, 0],
            [1, 1],
            false,
            true,
        ),
    ];
    for dt in FLOATS {
        let tol = scaled(default_tol(dt), 4.0);
        let exact = Tol {
            atol: 0.0,
            rtol: 0.0,
        };
        for (xs, view, kernel, stride, padding, dilation, ceil_mode, count_include_pad) in pools {
            let a = PoolArgs {
                kernel,
                stride,
                padding,
                dilation,
                ceil_mode,
                count_include_pad,
            };
            let p = r::PoolRef {
                kernel,
                stride,
                padding,
                dilation,
                ceil_mode,
                count_include_pad,
            };
            b.add(
                "max_pool2d",
                dt,
                vec![inp(&xs, dt, u(-2.0, 2.0), view)],
                vec![exact, exact],
                true,
                move |x| {
                    let (v, i) = x[0].max_pool2d_with_indices(&a)?;
                    Ok(vec![v, i])
                },
                move |x| {
                    let (v, i) = r::max_pool2d(&x[0], &p);
                    vec![v, i]
                },
            );
            if dilation == [1, 1] {
                b.add(
                    "avg_pool2d",
                    dt,
                    vec![inp(&xs, dt, u(-2.0, 2.0), view)],
                    vec![tol],
                    true,
                    move |x| Ok(vec![x[0].avg_pool2d(&a)?]),
                    move |x| vec![r::avg_pool2d(&x[0], &p)],
                );
            }
        }
        let mut a1 = PoolArgs::new([3]);
        a1.stride = [2];
        a1.padding = [1];
        a1.ceil_mode = true;
        a1.count_include_pad = false;
        let p1 = r::PoolRef {
            kernel: [1, 3],
            stride: [1, 2],
            padding: [0, 1],
            dilation: [1, 1],
            ceil_mode: true,
            count_include_pad: false,
        };
        b.add(
            "max_pool1d",
            dt,
            vec![inp(&[2, 3, 33], dt, u(-2.0, 2.0), View::Narrowed)],
            vec![exact],
            true,
            move |x| Ok(vec![x[0].max_pool1d(&a1)?]),
            move |x| vec![ref_squeeze2(r::max_pool2d(&ref_1d(&x[0]), &p1).0)],
        );
        b.add(
            "avg_pool1d",
            dt,
            vec![inp(&[2, 3, 33], dt, u(-2.0, 2.0), View::Narrowed)],
            vec![tol],
            true,
            move |x| Ok(vec![x[0].avg_pool1d(&a1)?]),
            move |x| vec![ref_squeeze2(r::avg_pool2d(&ref_1d(&x[0]), &p1))],
        );
        for (xs, o) in [
            ([1, 3, 7, 10], [3, 4]),
            ([2, 2, 5, 5], [1, 1]),
            ([1, 2, 3, 2], [5, 3]),
        ] {
            b.add(
                "adaptive_avg_pool2d",
                dt,
                vec![inp(&xs, dt, u(-2.0, 2.0), View::Contiguous)],
                vec![tol],
                true,
                move |x| Ok(vec![x[0].adaptive_avg_pool2d(o)?]),
                move |x| vec![r::adaptive_avg_pool2d(&x[0], o[0], o[1])],
            );
        }
    }
}

/// Batch norm (batch statistics, and given statistics), group norm, adaptive max pooling and
/// dropout masks.
fn channel_cases(b: &mut B) {
    for dt in FLOATS {
        let tol = scaled(default_tol(dt), 4.0);
        let exact = Tol {
            atol: 0.0,
            rtol: 0.0,
        };
        for (shape, view) in [
            (vec![4, 3, 5, 7], View::Narrowed),
            (vec![2, 33, 31], View::Contiguous),
            (vec![3, 2], View::Transposed),
        ] {
            let c = shape[1];
            let bn_inputs = || {
                vec![
                    inp(&shape, dt, u(-2.0, 3.0), view),
                    inp(&[c], dt, u(0.5, 1.5), View::Contiguous),
                    inp(&[c], dt, u(-1.0, 1.0), View::Contiguous),
                ]
            };
            // The statistics carry no gradient: the gradient mode sees y alone.
            b.add(
                "batch_norm",
                dt,
                bn_inputs(),
                vec![tol],
                true,
                |x| Ok(vec![x[0].batch_norm_train(&x[1], &x[2], 1e-5)?.0]),
                |x| vec![r::batch_norm(&x[0], &x[1], &x[2], 1e-5).0],
            );
            b.add(
                "batch_norm_stats",
                dt,
                bn_inputs(),
                vec![tol, tol, tol],
                false,
                |x| {
                    let (y, m, v) = x[0].batch_norm_train(&x[1], &x[2], 1e-5)?;
                    Ok(vec![y, m, v])
                },
                |x| {
                    let (y, m, v) = r::batch_norm(&x[0], &x[1], &x[2], 1e-5);
                    vec![y, m, v]
                },
            );
            b.add(
                "batch_norm_eval",
                dt,
                vec![
                    inp(&shape, dt, u(-2.0, 3.0), view),
                    inp(&[c], dt, u(-1.0, 1.0), View::Contiguous),
                    inp(&[c], dt, u(0.5, 2.0), View::Contiguous),
                    inp(&[c], dt, u(0.5, 1.5), View::Contiguous),
                    inp(&[c], dt, u(-1.0, 1.0), View::Contiguous),
                ],
                vec![tol],
                true,
                |x| {
                    Ok(vec![x[0].batch_norm_eval(
                        &x[1],
                        &x[2],
                        Some(&x[3]),
                        Some(&x[4]),
                        1e-5,
                    )?])
                },
                |x| {
                    let c = x[1].data.len();
                    let s = x[0].data.len() / x[0].shape[0] / c;
                    let data = x[0]
                        .data
                        .iter()
                        .enumerate()
                        .map(|(i, v)| {
                            let ch = (i / s) % c;
                            (v - x[1].data[ch]) / (x[2].data[ch] + 1e-5).sqrt() * x[3].data[ch]
                                + x[4].data[ch]
                        })
                        .collect();
                    vec![Ref::new(x[0].shape.clone(), data)]
                },
            );
        }
        for (shape, view, groups) in [
            (vec![2, 6, 5, 7], View::Narrowed, 3),
            (vec![1, 4, 33], View::Transposed, 4),
            (vec![3, 5, 2, 2], View::Contiguous, 1),
        ] {
            let c = shape[1];
            b.add(
                &format!("group_norm{groups}"),
                dt,
                vec![
                    inp(&shape, dt, u(-2.0, 3.0), view),
                    inp(&[c], dt, u(0.5, 1.5), View::Contiguous),
                    inp(&[c], dt, u(-1.0, 1.0), View::Contiguous),
                ],
                vec![tol],
                true,
                move |x| Ok(vec![x[0].group_norm(groups, &x[1], &x[2], 1e-5)?]),
                move |x| vec![r::group_norm(&x[0], groups, &x[1], &x[2], 1e-5)],
            );
        }
        for (shape, view, o) in [
            ([1, 3, 7, 10], View::Narrowed, [3, 4]),
            ([2, 2, 5, 5], View::Transposed, [1, 1]),
            ([1, 2, 3, 2], View::Contiguous, [5, 3]),
        ] {
            b.add(
                "adaptive_max_pool2d",
                dt,
                vec![inp(&shape, dt, u(-2.0, 2.0), view)],
                vec![exact, exact],
                true,
                move |x| {
                    let (v, i) = x[0].adaptive_max_pool2d_with_indices(o)?;
                    Ok(vec![v, i])
                },
                move |x| {
                    let (v, i) = r::adaptive_max_pool2d(&x[0], o[0], o[1]);
                    vec![v, i]
                },
            );
        }
        b.add(
            "dropout",
            dt,
            vec![inp(&[3, 33, 31], dt, u(-2.0, 2.0), View::Narrowed)],
            vec![tol],
            true,
            |x| Ok(vec![x[0].dropout(0.3, 7)?]),
            |x| vec![r::dropout(&x[0], 0.3, 7, &[3, 33, 31])],
        );
        b.add(
            "dropout2d",
            dt,
            vec![inp(&[4, 9, 5, 3], dt, u(-2.0, 2.0), View::Transposed)],
            vec![tol],
            true,
            |x| Ok(vec![x[0].dropout2d(0.5, 11)?]),
            |x| vec![r::dropout(&x[0], 0.5, 11, &[4, 9, 1, 1])],
        );
    }
}

/// Every op case. Names are unique.
pub fn cases() -> Vec<OpCase> {
    let mut b = B { out: Vec::new() };
    unary_cases(&mut b);
    binary_cases(&mut b);
    reduce_cases(&mut b);
    matmul_cases(&mut b);
    matmul_bias_cases(&mut b);
    matmul_gelu_cases(&mut b);
    cast_cases(&mut b);
    cast_col_sums_cases(&mut b);
    cast_each_cases(&mut b);
    index_cases(&mut b);
    scan_cases(&mut b);
    fused_cases(&mut b);
    conv_cases(&mut b);
    pool_cases(&mut b);
    channel_cases(&mut b);
    b.out
}
