//! The large steps' helpers (kernels in `prefill.cu`), used by the CUDA kernel set
//! (`crate::model::cuda`) for steps of many rows (prompt chunks):
//! - `dequant_rows`: a weight matrix dequantized from its GGUF blocks into f16, bf16 or f32
//!   operand rows for cuBLASLt (f32 accumulation);
//! - `attn_out`, `glu`: the flash attention op's output and the gated unit written straight
//!   into the next product's operand rows;
//! - `mmq_copy`/`mmq_copies` and `mmq_launches`: for a model on f32 activations
//!   (`Precision::Exact`, the default up to 1 GiB of weights), products of Q4_0, Q4_1, Q5_0,
//!   Q5_1, Q8_0, Q4_K and Q6_K matrices on int8 tensor cores with two-level 8-bit inputs (the
//!   CPU's q8x2, ~16 bits), over copies of the matrices made once (split rows, 32-element
//!   units).

use ferrite_cuda::{Buffer, CudaDevice, KernelArgs, KernelSource, LaunchConfig};

use super::matvec::{self, Mode, Seg};
use super::weights::{gm, GpuModel};
use super::CudaResult;
use crate::error::{Error, Result};
use ferrite_cuda::qmatrix::{split_fields, Fmt, GpuMatrix};

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "llm_prefill",
    src: concat!(
        include_str!("../../../cuda/src/quant.cuh"),
        include_str!("decode.cu"),
        include_str!("prefill.cu")
    ),
    prebuilt: crate::prebuilt::LLM_PREFILL,
};

fn launch(dev: &CudaDevice, name: &str, cfg: LaunchConfig, args: KernelArgs) -> Result<()> {
    dev.launch("llm prefill", &SOURCE, name, cfg, args).gpu()
}

/// Rows [r0, r0 + rows) of `mat` dequantized into f16, bf16 or f32 values (`mode` 0, 1, 2),
/// row-major, at device address `out` (room for rows x mat.cols values).
pub(crate) fn dequant_rows(
    dev: &CudaDevice,
    mat: &GpuMatrix,
    r0: usize,
    rows: usize,
    out: u64,
    mode: u32,
) -> Result<()> {
    if r0 + rows > mat.rows {
        return Err(Error::Other(format!(
            "pf_dequant: rows {r0}..{} of a {}-row matrix",
            r0 + rows,
            mat.rows
        )));
    }
    let args = KernelArgs::new()
        .arg(mat.buffer().ptr() + (r0 * mat.row_bytes) as u64)
        .arg(mat.kernel_fmt())
        .arg(mat.row_bytes as u32)
        .arg(mat.cols as u32)
        .arg(rows as u32)
        .arg(out)
        .arg(mode);
    // PFD_T = 128 units per block and round
    let blocks = (rows * mat.cols / 32)
        .div_ceil(128)
        .clamp(1, dev.sm_count() as usize * 16);
    let cfg = LaunchConfig::new((blocks as u32, 1, 1), (128, 1, 1), 0);
    launch(dev, "pf_dequant", cfg, args)
}

/// `out` (rows of nh * hd: f16, bf16 or f32 by `mode` 0, 1, 2) = the attention op's f16
/// `[1, nh, n, hd]` output at `o` (`pf_attn_out`).
pub(crate) fn attn_out(
    dev: &CudaDevice,
    o: u64,
    nh: u32,
    n: u32,
    hd: u32,
    out: u64,
    mode: u32,
) -> Result<()> {
    let a = KernelArgs::new()
        .arg(o)
        .arg(nh)
        .arg(n)
        .arg(hd)
        .arg(out)
        .arg(mode);
    launch(dev, "pf_attn_out", flat(dev, (n * nh * hd) as usize), a)
}

/// `out` (rows of ff: f16, bf16 or f32 by `mode` 0, 1, 2) = act(gate) * up of `n` f32 rows
/// of `2 * ff` (gate | up side by side) at `gu`; tanh-GELU if `gelu`, else SiLU (`pf_glu`).
pub(crate) fn glu(
    dev: &CudaDevice,
    gu: u64,
    n: u32,
    ff: u32,
    gelu: bool,
    out: u64,
    mode: u32,
) -> Result<()> {
    let a = KernelArgs::new()
        .arg(gu)
        .arg(n)
        .arg(ff)
        .arg(gelu as u32)
        .arg(out)
        .arg(mode);
    launch(dev, "pf_glu", flat(dev, n as usize * ff as usize), a)
}

/// Grid for `n` independent items, 256 threads a block.
fn flat(dev: &CudaDevice, n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, dev.sm_count() as usize * 16);
    LaunchConfig::new((blocks as u32, 1, 1), (256, 1, 1), 0)
}

/// Per layer, per matrix (`SLOT_*`): the copy `mmq_copy` made of it (split rows or 32-element
/// units) for the int8 tensor-core products; None where the matrix is read as it is or has
/// no such kernel.
pub(crate) type MmqCopies = Vec<[Option<GpuMatrix>; 7]>;

/// The matrices of a layer by slot (`MmqCopies`).
pub(crate) const SLOT_Q: usize = 0;
pub(crate) const SLOT_K: usize = 1;
pub(crate) const SLOT_V: usize = 2;
pub(crate) const SLOT_O: usize = 3;
pub(crate) const SLOT_GATE: usize = 4;
pub(crate) const SLOT_UP: usize = 5;
pub(crate) const SLOT_DOWN: usize = 6;

/// The copies of every layer's matrices (`mmq_copy`).
pub(crate) fn mmq_copies(m: &GpuModel) -> Result<MmqCopies> {
    let mut copies = Vec::with_capacity(m.layers.len());
    for l in &m.layers {
        let mut c: [Option<GpuMatrix>; 7] = Default::default();
        for (slot, c) in c.iter_mut().enumerate() {
            *c = mmq_copy(&m.dev, layer_mat(l, slot))?;
        }
        copies.push(c);
    }
    Ok(copies)
}

/// The matrix the int8 tensor-core products read for `w` (layer `il`'s slot `slot`): its copy
/// in `copies`, or `w` itself where it is split already; None where it has no such kernel.
pub(crate) fn mmq_matrix<'a>(
    copies: &'a MmqCopies,
    il: usize,
    slot: usize,
    w: &'a GpuMatrix,
) -> Option<&'a GpuMatrix> {
    let m = copies.get(il).and_then(|c| c[slot].as_ref()).unwrap_or(w);
    (m.split && matvec::MMQ2_FMTS.contains(&m.fmt)).then_some(m)
}

/// The launches of one product of `rows` rows on the int8 tensor cores with two-level (q8x2)
/// inputs (`MvLaunch::with_q8x2_mma`): `segs` (matrices as `mmq_matrix` gives them) times
/// norm(x) (f32 rows of their columns) into `out` (f32 rows of `ostride` elements) by `mode`,
/// with `(q8, part, cc)` the two-level input scratch, the split-K partials and the device's
/// compute capability. Consecutive matrices of one format share a launch; the first
/// quantizes the input, the others reuse it. None where the kernels do not apply (one row,
/// GLU halves of two formats).
pub(crate) fn mmq_launches(
    dev: &CudaDevice,
    segs: &[Seg<'_>],
    mode: Mode,
    (x, norm): (&Buffer, Option<(&Buffer, f32)>),
    (out, ostride): (&Buffer, usize),
    rows: usize,
    (q8, part, cc): (&Buffer, &Buffer, (u32, u32)),
) -> Result<Option<Vec<matvec::MvLaunch>>> {
    let glu = matches!(mode, Mode::GluSilu | Mode::GluGelu);
    if rows < 2 || segs.is_empty() || (glu && segs[0].w.fmt != segs[1].w.fmt) {
        return Ok(None);
    }
    // launches: GLU is one; else runs of one format
    let mut groups: Vec<&[Seg<'_>]> = Vec::new();
    if glu {
        groups.push(segs);
    } else {
        let mut start = 0;
        for i in 1..=segs.len() {
            if i == segs.len() || segs[i].w.fmt != segs[start].w.fmt {
                groups.push(&segs[start..i]);
                start = i;
            }
        }
    }
    let cols = segs[0].w.cols;
    let mut ls = Vec::with_capacity(groups.len());
    for (i, g) in groups.iter().enumerate() {
        let l = matvec::plan(dev.sm_count(), g, mode, x, norm, out, None)?
            .with_rows(rows, cols * 4, ostride * 4)?
            .with_q8x2_mma(cc, dev.sm_count(), q8, Some(part))?
            .ok_or_else(|| {
                Error::Other(format!(
                    "prefill: no int8 tensor-core launch for {:?} matrices",
                    g[0].w.fmt
                ))
            })?;
        ls.push(if i > 0 { l.reusing_input() } else { l });
    }
    Ok(Some(ls))
}

/// The matrix of `l` in scratch slot `slot` (`SLOT_*`).
fn layer_mat(l: &super::weights::GpuLayer, slot: usize) -> &GpuMatrix {
    match slot {
        SLOT_Q => gm(&l.wq),
        SLOT_K => gm(&l.wk),
        SLOT_V => gm(&l.wv),
        SLOT_O => gm(&l.wo),
        SLOT_GATE => gm(&l.w_gate),
        SLOT_UP => gm(&l.w_up),
        _ => gm(&l.w_down),
    }
}

/// The copy of `w` the int8 tensor-core products read, made now: split rows for a matrix of a
/// 32-element format kept in GGUF blocks, `Q4_KU` / `Q6_KU` units for Q4_K / Q6_K; None where `w` is read as it
/// is (split already) or has no such kernel.
pub(crate) fn mmq_copy(dev: &CudaDevice, w: &GpuMatrix) -> Result<Option<GpuMatrix>> {
    if matches!(w.fmt, Fmt::Q4_K | Fmt::Q6_K) {
        let units = w.rows * w.cols / 32;
        let unit_bytes = if w.fmt == Fmt::Q4_K {
            Fmt::Q4_KU.block_bytes()
        } else {
            Fmt::Q6_KU.block_bytes()
        };
        let buf = dev
            .alloc_bytes(units * unit_bytes, "llm prefill K-quant units")
            .gpu()?;
        let v = w
            .k_units_view(buf)
            .ok_or_else(|| Error::Other("prefill: no K-quant unit view".into()))?;
        let mut args = KernelArgs::new()
            .arg(w.buffer().ptr())
            .arg(w.rows as u32)
            .arg((w.cols / 256) as u32);
        let name = if w.fmt == Fmt::Q4_K {
            "pf_q4k_units"
        } else {
            // Q6_K's split layout moves the d fields to the row's end
            args = args.arg(w.split as u32);
            "pf_q6k_units"
        };
        let args = args.arg(v.row_bytes as u32).arg(v.buffer().ptr());
        launch(
            dev,
            name,
            LaunchConfig::new((units.div_ceil(256) as u32, 1, 1), (256, 1, 1), 0),
            args,
        )?;
        return Ok(Some(v));
    }
    if w.split || !matvec::MMQ2_FMTS.contains(&w.fmt) {
        return Ok(None);
    }
    let buf = dev
        .alloc_bytes(w.rows * w.split_row_bytes(), "llm prefill split rows")
        .gpu()?;
    let v = w
        .split_view(buf)
        .ok_or_else(|| Error::Other(format!("prefill: no split layout for {:?}", w.fmt)))?;
    split_into(dev, w, &v)?;
    Ok(Some(v))
}

/// `w`'s GGUF rows rearranged into `dst`'s buffer in the split layout (`pf_split`), rows
/// `dst.row_bytes` apart.
fn split_into(dev: &CudaDevice, w: &GpuMatrix, dst: &GpuMatrix) -> Result<()> {
    let [q, qh, h] = split_fields(w.fmt)
        .ok_or_else(|| Error::Other(format!("prefill: {:?} has no split layout", w.fmt)))?;
    let nb = w.cols / w.fmt.block_elems();
    let total = w.rows * nb;
    let args = KernelArgs::new()
        .arg(w.buffer().ptr())
        .arg(w.rows as u32)
        .arg(nb as u32)
        .arg(w.fmt.block_bytes() as u32)
        .arg(q.start as u32)
        .arg(q.len() as u32)
        .arg(qh.start as u32)
        .arg(qh.len() as u32)
        .arg(h.start as u32)
        .arg(h.len() as u32)
        .arg(dst.row_bytes as u32)
        .arg(dst.buffer().ptr());
    launch(
        dev,
        "pf_split",
        LaunchConfig::new((total.div_ceil(256) as u32, 1, 1), (256, 1, 1), 0),
        args,
    )
}
