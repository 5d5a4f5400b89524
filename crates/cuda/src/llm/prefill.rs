//! The large steps' helpers (kernels in `prefill.cu`), used by the LLM crate's CUDA kernel set
//! for steps of many rows (prompt chunks):
//! - `dequant_rows`: a weight matrix dequantized from its GGUF blocks into f16, bf16 or f32
//!   operand rows for cuBLASLt (f32 accumulation);
//! - `attn_out`, `glu`: the flash attention op's output and the gated unit written straight
//!   into the next product's operand rows;
//! - `mmq_copy` and `mmq_launches`: for a model on f32 activations, products of Q4_0, Q4_1, Q5_0,
//!   Q5_1, Q8_0, Q4_K and Q6_K matrices on int8 tensor cores with two-level 8-bit inputs (the
//!   CPU's q8x2, ~16 bits), over copies of the matrices made once (split rows, 32-element
//!   units).

use crate::matvec::{self, Mode, Seg};
use crate::qmatrix::{split_fields, Fmt, GpuMatrix};
use crate::{Buffer, CudaDevice, KernelArgs, KernelSource, LaunchConfig};
use ferrite_core::{Error, Result};

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "llm_prefill",
    src: concat!(
        include_str!("../quant.cuh"),
        include_str!("decode.cu"),
        include_str!("prefill.cu")
    ),
    prebuilt: crate::prebuilt::LLM_PREFILL,
};

fn launch(dev: &CudaDevice, name: &str, cfg: LaunchConfig, args: KernelArgs) -> Result<()> {
    dev.launch("llm prefill", &SOURCE, name, cfg, args)
}

/// Rows [r0, r0 + rows) of `mat` dequantized into f16, bf16 or f32 values (`mode` 0, 1, 2),
/// row-major, at device address `out` (room for rows x mat.cols values).
pub fn dequant_rows(
    dev: &CudaDevice,
    mat: &GpuMatrix,
    r0: usize,
    rows: usize,
    out: u64,
    mode: u32,
) -> Result<()> {
    if r0 + rows > mat.rows {
        return Err(Error::backend(
            "pf_dequant",
            format!("rows {r0}..{} of a {}-row matrix", r0 + rows, mat.rows),
        ));
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
/// output at `o` (stored `[1, n, nh, hd]`; `pf_attn_out`).
pub fn attn_out(
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
pub fn glu(
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

/// The launches of one product of `rows` rows on the int8 tensor cores with two-level (q8x2)
/// inputs (`MvLaunch::with_q8x2_mma`): `segs` (matrices as `mmq_matrix` gives them) times
/// norm(x) (f32 rows of their columns) into `out` (f32 rows of `ostride` elements) by `mode`,
/// with `(q8, part, cc)` the two-level input scratch, the split-K partials and the device's
/// compute capability. Consecutive matrices of one format share a launch; the first
/// quantizes the input, the others reuse it. None where the kernels do not apply (one row,
/// GLU halves of two formats).
pub fn mmq_launches(
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
                Error::backend(
                    "prefill",
                    format!("no int8 tensor-core launch for {:?} matrices", g[0].w.fmt),
                )
            })?;
        ls.push(if i > 0 { l.reusing_input() } else { l });
    }
    Ok(Some(ls))
}

/// The copy of `w` the int8 tensor-core products read, made now: split rows for a matrix of a
/// 32-element format kept in GGUF blocks, `Q4_KU` / `Q6_KU` units for Q4_K / Q6_K; None where `w` is read as it
/// is (split already) or has no such kernel.
pub fn mmq_copy(dev: &CudaDevice, w: &GpuMatrix) -> Result<Option<GpuMatrix>> {
    if matches!(w.fmt, Fmt::Q4_K | Fmt::Q6_K) {
        let units = w.rows * w.cols / 32;
        let unit_bytes = if w.fmt == Fmt::Q4_K {
            Fmt::Q4_KU.block_bytes()
        } else {
            Fmt::Q6_KU.block_bytes()
        };
        let buf = dev.alloc_bytes(units * unit_bytes, "llm prefill K-quant units")?;
        let v = w
            .k_units_view(buf)
            .ok_or_else(|| Error::backend("prefill", "no K-quant unit view"))?;
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
    let buf = dev.alloc_bytes(w.rows * w.split_row_bytes(), "llm prefill split rows")?;
    let v = w
        .split_view(buf)
        .ok_or_else(|| Error::backend("prefill", format!("no split layout for {:?}", w.fmt)))?;
    split_into(dev, w, &v)?;
    Ok(Some(v))
}

/// `w`'s GGUF rows rearranged into `dst`'s buffer in the split layout (`pf_split`), rows
/// `dst.row_bytes` apart.
fn split_into(dev: &CudaDevice, w: &GpuMatrix, dst: &GpuMatrix) -> Result<()> {
    let [q, qh, h] = split_fields(w.fmt)
        .ok_or_else(|| Error::backend("prefill", format!("{:?} has no split layout", w.fmt)))?;
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
