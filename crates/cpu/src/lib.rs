//! ferrite-cpu: the CPU backend. Every primitive op, threaded with rayon and written so the
//! compiler vectorizes the inner loops; matmul through the `gemm` crate. It is also the oracle
//! other backends are tested against. Quantized matrices (`QTensor`, [`qmatmul`]) run the
//! LLM kernels of [`quant`] (SIMD products on GGUF blocks, per instruction set) on their own
//! low-latency thread pool ([`spin_pool`]); [`llm`] holds the LLM kernels around them
//! (attention over the paged KV cache's blocks, RoPE, RMS norms).

mod alloc;
mod attention;
mod cast;
mod channel_norm;
mod conv;
mod create;
mod cross_entropy;
mod elementwise;
pub mod env;
mod index;
pub mod llm;
mod machine;
mod matmul;
mod norm;
mod optim;
mod pool;
pub mod profile;
pub mod qmatmul;
pub mod quant;
mod reduce;
mod scan;
pub mod spin_pool;
mod storage;

use ferrite_core::{
    Backend, BinaryOp, DType, Device, DeviceKind, Error, HostBuffer, Layout, Op, ReduceOp, Result,
    Shape, Storage, Tensor,
};
use std::sync::{Arc, OnceLock};

pub use machine::{gemm_isa, machine_summary};
pub use storage::{bytes_in_use, peak_bytes_in_use, reset_peak, CpuStorage};

/// The CPU device (one per process).
pub fn cpu() -> Device {
    static DEVICE: OnceLock<Device> = OnceLock::new();
    DEVICE
        .get_or_init(|| Device::new(Arc::new(CpuBackend)))
        .clone()
}

pub struct CpuBackend;

impl Backend for CpuBackend {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn capturing(&self) -> bool {
        false
    }

    fn upload(&self, data: HostBuffer) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(CpuStorage::new(data)))
    }

    fn to_host(&self, storage: &dyn Storage, layout: &Layout) -> Result<HostBuffer> {
        let s = storage
            .as_any()
            .downcast_ref::<CpuStorage>()
            .ok_or_else(|| Error::backend("to_host", "storage is not on the CPU"))?;
        let _g = s.read();
        let buf = storage::host(storage, "to_host")?;
        Ok(elementwise::materialize(buf, layout))
    }

    fn write_into(&self, dst: &Tensor, src: &Tensor) -> Result<()> {
        let op = "copy_";
        let d = dst
            .storage()
            .as_any()
            .downcast_ref::<CpuStorage>()
            .ok_or_else(|| Error::backend(op, "destination is not on the CPU"))?;
        if dst.shares_storage(src) || !dst.is_contiguous() || dst.dtype() != src.dtype() {
            return Err(Error::backend(
                op,
                "source and destination must be distinct storages of one dtype, destination contiguous",
            ));
        }
        let data = {
            let _g = storage::guards(&[src]);
            elementwise::materialize(storage::host(src.storage(), op)?, src.layout())
        };
        let (off, n) = (dst.layout().offset(), dst.elem_count());
        if off + n > d.len() || data.len() != n {
            return Err(Error::backend(op, "destination range outside its storage"));
        }
        d.write(|buf| {
            macro_rules! put {
                ($($v:ident),*) => {
                    match (buf, &data) {
                        $((HostBuffer::$v(b), HostBuffer::$v(x)) => {
                            b[off..off + n].copy_from_slice(x);
                            Ok(())
                        })*
                        _ => Err(Error::backend(op, "dtypes differ")),
                    }
                };
            }
            put!(F32, F64, F16, BF16, I32, I64, U32, U8, Bool)
        })
    }

    fn sum_squares(&self, tensors: &[Tensor]) -> Result<Arc<dyn Storage>> {
        let shapes = || (vec![tensors.len()], vec![]);
        profile::time("sum_squares", shapes, || optim::sum_squares(tensors))
    }

    fn step_scalars(&self, s: &ferrite_core::optim::StepScalars<'_>) -> Result<Arc<dyn Storage>> {
        let shapes = || (vec![s.group_steps.len()], vec![]);
        profile::time("step_scalars", shapes, || optim::step_scalars(s))
    }

    fn fused_update(&self, update: &ferrite_core::optim::FusedUpdate<'_>) -> Result<()> {
        let shapes = || (vec![update.params.len()], vec![]);
        profile::time("fused_update", shapes, || optim::fused_update(update))
    }

    fn upload_quant(
        &self,
        ty: ferrite_core::QType,
        rows: usize,
        cols: usize,
        bytes: &ferrite_core::QBytes,
    ) -> Result<Arc<dyn ferrite_core::QStorage>> {
        Ok(Arc::new(qmatmul::CpuQMat::new(
            ty,
            rows,
            cols,
            bytes.clone(),
        )?))
    }

    fn qmatmul(
        &self,
        w: &ferrite_core::QTensor,
        x: &Tensor,
        act: ferrite_core::ActFormat,
    ) -> Result<Arc<dyn Storage>> {
        let shapes = || (vec![w.rows(), w.cols()], vec![x.elem_count()]);
        profile::time("qmatmul", shapes, || qmatmul::qmatmul(w, x, act))
    }

    fn exec(
        &self,
        op: &Op,
        inputs: &[&Tensor],
        outs: &[(Shape, DType)],
    ) -> Result<Vec<Arc<dyn Storage>>> {
        let shapes = || {
            let dims = |s: Option<&[usize]>| s.map(<[usize]>::to_vec).unwrap_or_default();
            (
                dims(inputs.first().map(|t| t.dims())),
                dims(outs.first().map(|o| o.0.dims())),
            )
        };
        profile::time(op.name(), shapes, || exec_op(op, inputs, outs))
    }
}

/// Runs one op (`Backend::exec`).
fn exec_op(op: &Op, inputs: &[&Tensor], outs: &[(Shape, DType)]) -> Result<Vec<Arc<dyn Storage>>> {
    let name = op.name();
    // Inputs are read under their storages' guards (in-place writes wait for them).
    let _guards = storage::guards(inputs);
    let out = |i: usize| {
        outs.get(i)
            .ok_or_else(|| Error::backend(name, "missing output spec"))
    };
    let input = |i: usize| {
        inputs
            .get(i)
            .copied()
            .ok_or_else(|| Error::backend(name, "missing input"))
    };
    let one =
        |b: HostBuffer| -> Result<Vec<Arc<dyn Storage>>> { Ok(vec![Arc::new(CpuStorage::new(b))]) };
    let many = |bs: Vec<HostBuffer>| -> Result<Vec<Arc<dyn Storage>>> {
        Ok(bs
            .into_iter()
            .map(|b| Arc::new(CpuStorage::new(b)) as Arc<dyn Storage>)
            .collect())
    };
    match op {
        Op::Unary(u) => one(elementwise::unary(*u, input(0)?)?),
        Op::Binary(b) => one(elementwise::binary(*b, input(0)?, input(1)?)?),
        Op::Cmp(c) => one(elementwise::cmp(*c, input(0)?, input(1)?)?),
        Op::Where => one(elementwise::where_cond(input(0)?, input(1)?, input(2)?)?),
        Op::Reduce { op, axes } => one(reduce::reduce(*op, input(0)?, axes)?),
        Op::Matmul => {
            let (shape, dt) = out(0)?;
            one(matmul::matmul(
                input(0)?,
                input(1)?,
                None,
                None,
                shape,
                *dt,
            )?)
        }
        Op::MatmulBias { acc } => {
            let (shape, dt) = out(0)?;
            one(matmul::matmul(
                input(0)?,
                input(1)?,
                Some(input(2)?),
                acc.then(|| input(3)).transpose()?,
                shape,
                *dt,
            )?)
        }
        Op::MatmulBiasGelu => {
            let (shape, dt) = out(0)?;
            many(matmul::matmul_bias_gelu(
                input(0)?,
                input(1)?,
                input(2)?,
                shape,
                *dt,
            )?)
        }
        Op::MatmulGeluBackward => one(matmul::matmul_gelu_backward(
            input(0)?,
            input(1)?,
            input(2)?,
            &out(0)?.0,
        )?),
        Op::Cast(dt) => one(cast::cast(input(0)?, *dt)?),
        Op::CastColSums(dt) => {
            let x = input(0)?;
            many(vec![
                cast::cast(x, *dt)?,
                reduce::reduce(ReduceOp::Sum, x, &[0])?,
            ])
        }
        Op::CastEach(dt) => many(
            inputs
                .iter()
                .map(|x| cast::cast(x, *dt))
                .collect::<Result<_>>()?,
        ),
        Op::Copy => {
            let x = input(0)?;
            one(elementwise::materialize(
                storage::host(x.storage(), name)?,
                x.layout(),
            ))
        }
        Op::IndexSelect { axis } => one(index::index_select(input(0)?, input(1)?, *axis)?),
        Op::Gather { axis } => one(index::gather(input(0)?, input(1)?, *axis)?),
        Op::ScatterAdd { axis } => one(index::scatter_add(input(0)?, input(1)?, input(2)?, *axis)?),
        Op::Cat { axis } => one(index::cat(inputs, *axis)?),
        Op::Cumsum { axis } => one(scan::cumsum(input(0)?, *axis)?),
        Op::Sort { axis, descending } => {
            let (v, i) = scan::sort(input(0)?, *axis, *descending)?;
            Ok(vec![
                Arc::new(CpuStorage::new(v)),
                Arc::new(CpuStorage::new(i)),
            ])
        }
        Op::Softmax => one(norm::softmax(input(0)?, false)?),
        Op::LogSoftmax => one(norm::softmax(input(0)?, true)?),
        Op::CrossEntropy {
            ignore_index,
            label_smoothing,
        } => one(cross_entropy::cross_entropy(
            input(0)?,
            input(1)?,
            input(2)?,
            *ignore_index,
            *label_smoothing,
        )?),
        Op::CrossEntropyBackward {
            ignore_index,
            label_smoothing,
        } => one(cross_entropy::cross_entropy_backward(
            [input(0)?, input(1)?, input(2)?, input(3)?, input(4)?],
            *ignore_index,
            *label_smoothing,
        )?),
        Op::LayerNorm { eps } => {
            let y = norm::layer_norm(input(0)?, input(1)?, input(2)?, *eps)?;
            // A 16-bit output of f32 x: the f32 result rounded once.
            let dt = out(0)?.1;
            match y.dtype() == dt {
                true => one(y),
                false => one(cast::cast(&host_tensor(y, &out(0)?.0, input(0)?), dt)?),
            }
        }
        Op::RmsNorm { eps } => one(norm::rms_norm(input(0)?, input(1)?, *eps)?),
        Op::Rope { interleaved } => one(norm::rope(input(0)?, input(1)?, input(2)?, *interleaved)?),
        Op::Attention {
            causal,
            scale,
            key_mask,
        } => many(attention::attention(
            input(0)?,
            input(1)?,
            input(2)?,
            key_mask.then(|| input(3)).transpose()?,
            *causal,
            *scale,
            outs.len() == 2,
        )?),
        Op::SoftmaxBackward { log } => one(norm::softmax_backward(input(0)?, input(1)?, *log)?),
        Op::RmsNormBackward { eps, acc } => {
            let (x, g) = (input(0)?, input(2)?);
            let o = norm::rms_norm_backward(x, input(1)?, g, *eps)?;
            many(add_to_first(o, acc.then(|| input(3)).transpose()?, x)?)
        }
        Op::LayerNormBackward { eps, acc } => {
            // A 16-bit g of f32 x (the gradient of a 16-bit output) is read widened.
            let (x, g) = (input(0)?, input(2)?);
            let wide;
            let g = match g.dtype() == x.dtype() {
                true => g,
                false => {
                    wide = host_tensor(cast::cast(g, x.dtype())?, g.shape(), g);
                    &wide
                }
            };
            let o = norm::layer_norm_backward(x, input(1)?, g, *eps)?;
            many(add_to_first(o, acc.then(|| input(3)).transpose()?, x)?)
        }
        // The saved output and lse (inputs after g) are not needed: the probabilities are
        // recomputed per row.
        Op::AttentionBackward {
            causal,
            scale,
            key_mask,
            saved: _,
            packed,
        } => {
            let q = input(0)?;
            let grads = attention::attention_backward(
                q,
                input(1)?,
                input(2)?,
                key_mask.then(|| input(3)).transpose()?,
                input(if *key_mask { 4 } else { 3 })?,
                *causal,
                *scale,
            )?;
            if !packed {
                return many(grads);
            }
            // [b, l, h, d] each -> one [b, l, 3, h, d].
            let d = q.dims();
            let rows = Shape::from(vec![d[0], d[2], 1, d[1] * d[3]]);
            let parts: Vec<Tensor> = grads
                .into_iter()
                .map(|g| host_tensor(g, &rows, q))
                .collect();
            one(index::cat(&parts.iter().collect::<Vec<_>>(), 2)?)
        }
        Op::Conv2d(p) => one(conv::conv2d(input(0)?, input(1)?, p, &out(0)?.0)?),
        Op::ConvTranspose2d(p) => one(conv::conv_transpose2d(input(0)?, input(1)?, p, &out(0)?.0)?),
        Op::Conv2dBackwardWeight(p) => one(conv::conv2d_backward_weight(
            input(0)?,
            input(1)?,
            p,
            &out(0)?.0,
        )?),
        Op::MaxPool2d(p) => many(pool::max_pool2d(input(0)?, Some(p), &out(0)?.0)?),
        Op::AdaptiveMaxPool2d => many(pool::max_pool2d(input(0)?, None, &out(0)?.0)?),
        Op::BatchNorm { eps } => many(channel_norm::batch_norm(
            input(0)?,
            input(1)?,
            input(2)?,
            *eps,
        )?),
        Op::BatchNormBackward { eps } => many(channel_norm::batch_norm_backward(
            input(0)?,
            input(1)?,
            input(2)?,
            *eps,
        )?),
        Op::GroupNorm { groups, eps } => many(channel_norm::group_norm(
            input(0)?,
            input(1)?,
            input(2)?,
            *groups,
            *eps,
        )?),
        Op::GroupNormBackward { groups, eps } => many(channel_norm::group_norm_backward(
            input(0)?,
            input(1)?,
            input(2)?,
            *groups,
            *eps,
        )?),
        Op::Fill { value } => one(create::fill(*value, out(0)?)),
        Op::Arange { start, step } => one(create::arange(*start, *step, out(0)?)),
        Op::RandUniform { seed, low, high } => {
            one(create::rand_uniform(*seed, *low, *high, out(0)?))
        }
        Op::RandNormal { seed, mean, std } => one(create::rand_normal(*seed, *mean, *std, out(0)?)),
    }
}

/// A norm backward's outputs with `acc` (x's shape and dtype) added to the first, dx.
fn add_to_first(
    mut outs: Vec<HostBuffer>,
    acc: Option<&Tensor>,
    x: &Tensor,
) -> Result<Vec<HostBuffer>> {
    if let (Some(acc), false) = (acc, outs.is_empty()) {
        let dx = host_tensor(outs.remove(0), x.shape(), x);
        outs.insert(0, elementwise::binary(BinaryOp::Add, acc, &dx)?);
    }
    Ok(outs)
}

/// A computed buffer as a contiguous tensor of `shape` on `like`'s device (an op that runs
/// another op on its intermediate result).
fn host_tensor(buf: HostBuffer, shape: &Shape, like: &Tensor) -> Tensor {
    Tensor::from_storage(
        Arc::new(CpuStorage::new(buf)),
        Layout::contiguous(shape.clone()),
        like.device().clone(),
    )
}
