//! Attention and its backward (`attention.wgsl`): a workgroup per query row with the row's
//! probabilities in a scratch buffer; the key / value gradients sum over each kv head's query
//! rows (grouped-query attention included). With a key-padding mask (`Op::Attention`'s
//! `key_mask`) the row kernels are compiled with `AM` and read it per key (probability 0 for
//! padding); the key-gradient kernel needs no mask (it reads the zero probabilities).

use crate::device::{Arg, Src, WgpuBackend};
use crate::shader::{self, kernel, Kernel, Variant};
use crate::util::{contig, fw, groups, uw};
use ferrite_core::{DType, Error, Layout, Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) static ATTENTION: Kernel = kernel!(
    "attention",
    &[
        "attention",
        "attention_backward_rows",
        "attention_backward_keys"
    ],
    &[("T", shader::FLOATS)],
    &[
        &["AF"],
        &["AF", "AM"],
        &["AF", "AL"],
        &["AF", "AM", "AL"],
        &["AB"],
        &["AB", "AM"],
        &["AK"]
    ]
);

/// [rows, hq, hkv, lq, lk, d, dv, causal, scale] for q, k, v.
fn head(
    op: &'static str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    scale: f64,
) -> Result<Vec<u32>> {
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    if qd.len() != 4 || kd.len() != 4 || vd.len() != 4 || kd[1] == 0 || qd[1] % kd[1] != 0 {
        return Err(Error::shape(
            op,
            format!("expected q [b, hq, lq, d], k and v [b, hkv, lk, _] with hq % hkv == 0, got {} {} {}", q.shape(), k.shape(), v.shape()),
        ));
    }
    Ok(vec![
        uw(op, qd[0] * qd[1] * qd[2])?,
        uw(op, qd[1])?,
        uw(op, kd[1])?,
        uw(op, qd[2])?,
        uw(op, kd[2])?,
        uw(op, qd[3])?,
        uw(op, vd[3])?,
        causal as u32,
        fw(scale),
    ])
}

fn float(op: &'static str, x: &Tensor) -> Result<DType> {
    if !x.dtype().is_float() {
        return Err(Error::dtype(op, x.dtype(), "needs a float dtype"));
    }
    Ok(x.dtype())
}

/// `Op::Attention`; with `with_lse` (variant `AL`), its second output, the f32 lse per row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    dev: &WgpuBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: f64,
    with_lse: bool,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = "attention";
    let dt = float(name, q)?;
    let mut p = head(name, q, k, v, causal, scale)?;
    let rows = p[0] as usize;
    let (lk, dv) = (k.dims()[2], v.dims()[3]);
    let out = dev.alloc(name, dt, rows * dv)?;
    let scratch = dev.alloc(name, DType::F32, rows * lk)?;
    let (qc, kc, vc) = (
        contig(dev, q, name)?,
        contig(dev, k, name)?,
        contig(dev, v, name)?,
    );
    let mc = mask.map(|m| contig(dev, m, name)).transpose()?;
    p.extend([qc.offset(), kc.offset(), vc.offset(), 0]);
    p.push(mc.as_ref().map_or(0, |m| m.offset()));
    let lse = match with_lse {
        true => Some(dev.alloc(name, DType::F32, rows)?),
        false => None,
    };
    // Bindings: the output and scratch, q, k, v, the mask (AM), the lse (AL).
    let mut args = vec![
        Arg::W(out.buffer()),
        Arg::W(scratch.buffer()),
        Arg::R(qc.buffer()),
        Arg::R(kc.buffer()),
        Arg::R(vc.buffer()),
    ];
    args.extend(mc.as_ref().map(|m| Arg::R(m.buffer())));
    args.extend(lse.as_ref().map(|l| Arg::W(l.buffer())));
    let mut defines = vec!["AF"];
    defines.extend(mc.is_some().then_some("AM"));
    defines.extend(with_lse.then_some("AL"));
    let var = Variant::new(&[("T", dt)], &defines);
    let mut written = vec![&out, &scratch];
    written.extend(lse.as_ref());
    let src = Src::Kernel(&ATTENTION, &var);
    dev.launch_args(name, &src, "attention", &p, &args, &written, rows)?;
    let mut outs: Vec<Arc<dyn Storage>> = vec![Arc::new(out)];
    outs.extend(lse.map(|l| Arc::new(l) as Arc<dyn Storage>));
    Ok(outs)
}

pub(crate) fn attention_backward(
    dev: &WgpuBackend,
    [q, k, v, g]: [&Tensor; 4],
    mask: Option<&Tensor>,
    causal: bool,
    scale: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = "attention_backward";
    let dt = float(name, q)?;
    let mut p = head(name, q, k, v, causal, scale)?;
    let rows = p[0] as usize;
    let (lk, d, dv) = (k.dims()[2], q.dims()[3], v.dims()[3]);
    let dq = dev.alloc(name, dt, q.elem_count())?;
    let dk = dev.alloc(name, dt, k.elem_count())?;
    let dvv = dev.alloc(name, dt, v.elem_count())?;
    let ps = dev.alloc(name, DType::F32, rows * lk)?;
    let ds = dev.alloc(name, DType::F32, rows * lk)?;
    let (qc, kc, vc, gc) = (
        contig(dev, q, name)?,
        contig(dev, k, name)?,
        contig(dev, v, name)?,
        contig(dev, g, name)?,
    );
    let mc = mask.map(|m| contig(dev, m, name)).transpose()?;
    p.extend([qc.offset(), kc.offset(), vc.offset(), gc.offset()]);
    p.push(mc.as_ref().map_or(0, |m| m.offset()));
    let mut ins = vec![qc.buffer(), kc.buffer(), vc.buffer(), gc.buffer()];
    ins.extend(mc.as_ref().map(|m| m.buffer()));
    let var = Variant::new(
        &[("T", dt)],
        if mc.is_some() { &["AB", "AM"] } else { &["AB"] },
    );
    dev.launch(
        name,
        &ATTENTION,
        "attention_backward_rows",
        &var,
        &p,
        &[&dq, &ps, &ds],
        &ins,
        false,
        rows,
    )?;
    let kv_rows = k.elem_count() / d.max(1);
    let threads = kv_rows * d.max(dv);
    let var = Variant::new(&[("T", dt)], &["AK"]);
    dev.launch(
        name,
        &ATTENTION,
        "attention_backward_keys",
        &var,
        &p,
        &[&dk, &dvv],
        &[qc.buffer(), ps.buffer(), ds.buffer(), gc.buffer()],
        false,
        groups(threads),
    )?;
    // Computed [b, h, l, d]; the op stores them [b, l, h, d].
    [(dq, q), (dk, k), (dvv, v)]
        .into_iter()
        .map(|(s, t)| {
            let l = Layout::contiguous(t.shape().clone()).permute(&[0, 2, 1, 3])?;
            let out: Arc<dyn Storage> = Arc::new(crate::elementwise::copy_layout(dev, &s, &l)?);
            Ok(out)
        })
        .collect()
}
