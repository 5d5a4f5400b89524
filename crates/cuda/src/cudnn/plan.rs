//! One convolution through cuDNN's graph (backend) API: the problem becomes an operation
//! graph of one convolution node, cuDNN's heuristics (mode A) list engine configurations,
//! each that finalizes into an execution plan is a candidate, and the chosen plan is kept
//! per problem. A call then only builds a variant pack (the three device pointers and the
//! workspace) and executes the plan: a few microseconds of host work, where the legacy
//! `cudnnConvolution*` calls redo their setup per call (measured 0.1-0.3 ms of host time
//! per call on an H100 for ResNet-50's layers, more than the GPU work of most of them).
//!
//! Used for f16 and bf16 (tensor-core math, f32 accumulation: engines whose numerical notes
//! say they reduce in reduced precision are skipped). Tensors are packed NCHW, weights
//! `[o, c/g, kh, kw]` (cuDNN infers groups from the channel counts). The tensors' unique ids
//! are those of the forward problem: x = 1, w = 2, y = 3, whichever of them the direction
//! writes.

use super::{Dir, Key};
use cudarc::cudnn::sys;
use std::ffi::c_void;

type Ty = sys::cudnnBackendAttributeType_t;
type Attr = sys::cudnnBackendAttributeName_t;
type Kind = sys::cudnnBackendDescriptorType_t;

/// Every backend entry point this file calls (checked before the first use).
pub(super) const SYMBOLS: [&str; 6] = [
    "cudnnBackendCreateDescriptor",
    "cudnnBackendDestroyDescriptor",
    "cudnnBackendSetAttribute",
    "cudnnBackendGetAttribute",
    "cudnnBackendFinalize",
    "cudnnBackendExecute",
];

/// Candidates a new problem keeps (in heuristic order) and times when it may measure.
pub(super) const MAX_CANDIDATES: usize = 6;

/// A backend descriptor, destroyed on drop.
struct Desc(sys::cudnnBackendDescriptor_t);

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnBackendCreateDescriptor, destroyed once.
        unsafe {
            let _ = sys::cudnnBackendDestroyDescriptor(self.0);
        }
    }
}

fn ok(s: sys::cudnnStatus_t) -> Option<()> {
    (s == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS).then_some(())
}

impl Desc {
    fn new(kind: Kind) -> Option<Desc> {
        let mut d: sys::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: writes one descriptor handle into `d`.
        ok(unsafe { sys::cudnnBackendCreateDescriptor(kind, &mut d) })?;
        Some(Desc(d))
    }

    /// Sets attribute `name` to `vals`, elements of type `ty` (the Rust type of `T` must be
    /// the C type cuDNN reads for `ty`).
    fn set<T>(&self, name: Attr, ty: Ty, vals: &[T]) -> Option<()> {
        // SAFETY: `vals` holds vals.len() elements of the type `ty` names, read during the
        // call only.
        ok(unsafe {
            sys::cudnnBackendSetAttribute(
                self.0,
                name,
                ty,
                vals.len() as i64,
                vals.as_ptr() as *const c_void,
            )
        })
    }

    fn set_desc(&self, name: Attr, d: &[&Desc]) -> Option<()> {
        let raw: Vec<sys::cudnnBackendDescriptor_t> = d.iter().map(|d| d.0).collect();
        self.set(name, Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw)
    }

    fn finalize(self) -> Option<Desc> {
        // SAFETY: a live descriptor.
        ok(unsafe { sys::cudnnBackendFinalize(self.0) })?;
        Some(self)
    }
}

/// A finalized execution plan and the workspace it needs.
pub(super) struct Plan {
    plan: Desc,
    pub(super) workspace: usize,
}

// SAFETY: plans are used only under the device's cuDNN lock, with its context bound.
unsafe impl Send for Plan {}

fn tensor(uid: i64, dims: [usize; 4], dt: sys::cudnnDataType_t) -> Option<Desc> {
    let d: Vec<i64> = dims.iter().map(|&v| v as i64).collect();
    let strides = [d[1] * d[2] * d[3], d[2] * d[3], d[3], 1];
    let t = Desc::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    t.set(
        Attr::CUDNN_ATTR_TENSOR_DATA_TYPE,
        Ty::CUDNN_TYPE_DATA_TYPE,
        &[dt],
    )?;
    t.set(Attr::CUDNN_ATTR_TENSOR_DIMENSIONS, Ty::CUDNN_TYPE_INT64, &d)?;
    t.set(
        Attr::CUDNN_ATTR_TENSOR_STRIDES,
        Ty::CUDNN_TYPE_INT64,
        &strides,
    )?;
    t.set(
        Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID,
        Ty::CUDNN_TYPE_INT64,
        &[uid],
    )?;
    t.set(
        Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
        Ty::CUDNN_TYPE_INT64,
        &[16i64],
    )?;
    t.finalize()
}

/// The numerical notes of an engine configuration's engine, or `None` when cuDNN cannot
/// say (the configuration is then skipped).
fn notes(cfg: &Desc) -> Option<Vec<sys::cudnnBackendNumericalNote_t>> {
    let engine = Desc::new(Kind::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    let mut n = 0i64;
    let mut e = engine.0;
    // SAFETY: asks for one engine descriptor, written into the created `engine`.
    ok(unsafe {
        sys::cudnnBackendGetAttribute(
            cfg.0,
            Attr::CUDNN_ATTR_ENGINECFG_ENGINE,
            Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            1,
            &mut n,
            &mut e as *mut sys::cudnnBackendDescriptor_t as *mut c_void,
        )
    })?;
    const N: usize = 16;
    let mut raw = [sys::cudnnBackendNumericalNote_t::CUDNN_NUMERICAL_NOTE_TYPE_COUNT; N];
    let mut got = 0i64;
    // SAFETY: room for N notes.
    ok(unsafe {
        sys::cudnnBackendGetAttribute(
            engine.0,
            Attr::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
            Ty::CUDNN_TYPE_NUMERICAL_NOTE,
            N as i64,
            &mut got,
            raw.as_mut_ptr() as *mut c_void,
        )
    })?;
    Some(raw[..(got.max(0) as usize).min(N)].to_vec())
}

/// Up to [`MAX_CANDIDATES`] plans for `key` in cuDNN's heuristic order, each needing at most
/// `max_workspace` bytes; empty where the graph API cannot express or run the problem.
pub(super) fn candidates(
    handle: sys::cudnnHandle_t,
    key: &Key,
    dt: sys::cudnnDataType_t,
    max_workspace: usize,
) -> Vec<Plan> {
    build(handle, key, dt, max_workspace).unwrap_or_default()
}

fn build(
    handle: sys::cudnnHandle_t,
    key: &Key,
    dt: sys::cudnnDataType_t,
    max_workspace: usize,
) -> Option<Vec<Plan>> {
    let (x, w, y) = (
        tensor(1, key.x, dt)?,
        tensor(2, key.w, dt)?,
        tensor(3, key.y, dt)?,
    );
    let (stride, pad, dil, _groups) = key.p;
    let i64s = |v: [usize; 2]| [v[0] as i64, v[1] as i64];
    let conv = Desc::new(Kind::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    let f32dt = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
    conv.set(
        Attr::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
        Ty::CUDNN_TYPE_DATA_TYPE,
        &[f32dt],
    )?;
    conv.set(
        Attr::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
        Ty::CUDNN_TYPE_CONVOLUTION_MODE,
        &[sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
    )?;
    conv.set(
        Attr::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS,
        Ty::CUDNN_TYPE_INT64,
        &[2i64],
    )?;
    conv.set(
        Attr::CUDNN_ATTR_CONVOLUTION_DILATIONS,
        Ty::CUDNN_TYPE_INT64,
        &i64s(dil),
    )?;
    conv.set(
        Attr::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
        Ty::CUDNN_TYPE_INT64,
        &i64s(stride),
    )?;
    conv.set(
        Attr::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
        Ty::CUDNN_TYPE_INT64,
        &i64s(pad),
    )?;
    conv.set(
        Attr::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
        Ty::CUDNN_TYPE_INT64,
        &i64s(pad),
    )?;
    let conv = conv.finalize()?;
    let (one, zero) = ([1.0f32], [0.0f32]);
    let fl = Ty::CUDNN_TYPE_FLOAT;
    let op = match key.dir {
        Dir::Forward => {
            let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)?;
            op.set_desc(Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, &[&x])?;
            op.set_desc(Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, &[&w])?;
            op.set_desc(Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, &[&y])?;
            op.set_desc(
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                &[&conv],
            )?;
            op.set(
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                fl,
                &one,
            )?;
            op.set(
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                fl,
                &zero,
            )?;
            op
        }
        Dir::BackwardData => {
            let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR)?;
            op.set_desc(Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, &[&x])?;
            op.set_desc(Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, &[&w])?;
            op.set_desc(Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, &[&y])?;
            op.set_desc(
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                &[&conv],
            )?;
            op.set(
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                fl,
                &one,
            )?;
            op.set(
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                fl,
                &zero,
            )?;
            op
        }
        Dir::BackwardFilter => {
            let op =
                Desc::new(Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR)?;
            op.set_desc(Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, &[&x])?;
            op.set_desc(Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, &[&w])?;
            op.set_desc(Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, &[&y])?;
            op.set_desc(
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                &[&conv],
            )?;
            op.set(
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                fl,
                &one,
            )?;
            op.set(
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                fl,
                &zero,
            )?;
            op
        }
    };
    let op = op.finalize()?;
    let graph = Desc::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    graph.set_desc(Attr::CUDNN_ATTR_OPERATIONGRAPH_OPS, &[&op])?;
    graph.set(
        Attr::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
        Ty::CUDNN_TYPE_HANDLE,
        &[handle],
    )?;
    let graph = graph.finalize()?;
    let heur = Desc::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.set_desc(Attr::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&graph])?;
    heur.set(
        Attr::CUDNN_ATTR_ENGINEHEUR_MODE,
        Ty::CUDNN_TYPE_HEUR_MODE,
        &[sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A],
    )?;
    let heur = heur.finalize()?;
    let mut count = 0i64;
    // SAFETY: a count query (no elements requested).
    ok(unsafe {
        sys::cudnnBackendGetAttribute(
            heur.0,
            Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            0,
            &mut count,
            std::ptr::null_mut(),
        )
    })?;
    let count = (count.max(0) as usize).min(64);
    let cfgs: Vec<Desc> = (0..count)
        .map(|_| Desc::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<Option<_>>()?;
    let mut raw: Vec<sys::cudnnBackendDescriptor_t> = cfgs.iter().map(|d| d.0).collect();
    let mut got = 0i64;
    // SAFETY: `raw` holds `count` created engine-configuration descriptors to fill.
    ok(unsafe {
        sys::cudnnBackendGetAttribute(
            heur.0,
            Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            count as i64,
            &mut got,
            raw.as_mut_ptr() as *mut c_void,
        )
    })?;
    let mut plans = Vec::new();
    for cfg in cfgs.iter().take((got.max(0) as usize).min(count)) {
        let Some(notes) = notes(cfg) else { continue };
        if notes.contains(
            &sys::cudnnBackendNumericalNote_t::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION,
        ) {
            continue;
        }
        let Some(plan) = plan(handle, cfg) else {
            continue;
        };
        if plan.workspace <= max_workspace {
            plans.push(plan);
        }
        if plans.len() == MAX_CANDIDATES {
            break;
        }
    }
    Some(plans)
}

fn plan(handle: sys::cudnnHandle_t, cfg: &Desc) -> Option<Plan> {
    let p = Desc::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
    p.set(
        Attr::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
        Ty::CUDNN_TYPE_HANDLE,
        &[handle],
    )?;
    p.set_desc(Attr::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[cfg])?;
    let p = p.finalize()?;
    let (mut ws, mut n) = (0i64, 0i64);
    // SAFETY: one i64 out.
    ok(unsafe {
        sys::cudnnBackendGetAttribute(
            p.0,
            Attr::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
            Ty::CUDNN_TYPE_INT64,
            1,
            &mut n,
            &mut ws as *mut i64 as *mut c_void,
        )
    })?;
    Some(Plan {
        plan: p,
        workspace: usize::try_from(ws).ok()?,
    })
}

/// Queues `plan` on the handle's stream with x, w, y at the given device addresses (the
/// forward problem's roles) and `workspace` (at least `plan.workspace` bytes).
pub(super) fn execute(
    handle: sys::cudnnHandle_t,
    plan: &Plan,
    [x, w, y]: [u64; 3],
    workspace: u64,
) -> sys::cudnnStatus_t {
    let fail = sys::cudnnStatus_t::CUDNN_STATUS_INTERNAL_ERROR;
    let Some(vp) = Desc::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR) else {
        return fail;
    };
    let ptrs = [x as *mut c_void, w as *mut c_void, y as *mut c_void];
    let ws = [workspace as *mut c_void];
    let built = vp
        .set(
            Attr::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            Ty::CUDNN_TYPE_VOID_PTR,
            &ptrs,
        )
        .and_then(|_| {
            vp.set(
                Attr::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                Ty::CUDNN_TYPE_INT64,
                &[1i64, 2, 3],
            )
        })
        .and_then(|_| {
            vp.set(
                Attr::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                Ty::CUDNN_TYPE_VOID_PTR,
                &ws,
            )
        })
        .and_then(|_| vp.finalize());
    let Some(vp) = built else {
        return fail;
    };
    // SAFETY: a finalized plan of this handle and a finalized variant pack whose pointers
    // are live device buffers of the described sizes, ordered on the handle's stream.
    unsafe { sys::cudnnBackendExecute(handle, plan.plan.0, vp.0) }
}
