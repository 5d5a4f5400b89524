//! The LLM engine's fused kernels on wgpu, beside the backend's other kernels: `ops.wgsl`
//! (RMS norms, the gated unit, greedy argmax; [`ops`]), `paged.wgsl` (RoPE, the KV append and
//! causal attention over the paged cache in one kernel, split over workgroups for long rows;
//! [`paged`]) and `sample.wgsl` (the device sampler; [`sample`]). The products they run
//! between are [`crate::qmatrix`]'s.
//!
//! The LLM crate's kernel set records these kernels into its own steps (its buffers, its
//! command buffers): each kernel's function here takes the buffers it binds and returns a
//! [`Dispatch`] (module, entry point, parameter words for binding 0, the other bindings,
//! workgroups); [`compile`] makes a module's pipeline. The parameter words are the ones each
//! shader's header comment lists.

pub mod ops;
pub mod paged;
pub mod sample;

use ferrite_core::{Error, Result};

use crate::qmatrix::{self, word};
use crate::WgpuDevice;

/// A WGSL module of the LLM kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Module {
    /// `ops.wgsl`.
    Ops,
    /// `paged.wgsl`.
    Paged,
    /// `sample.wgsl` with this many threads a workgroup (one of [`sample::SAMPLE_THREADS`]).
    Sample(u32),
}

impl Module {
    /// The module's name in errors and labels.
    pub fn label(self) -> &'static str {
        match self {
            Module::Ops => "ops",
            Module::Paged => "paged",
            Module::Sample(_) => "sample",
        }
    }

    /// The module's full WGSL source.
    pub fn source(self) -> String {
        match self {
            Module::Ops => ops::OPS.to_string(),
            Module::Paged => paged::PAGED.to_string(),
            Module::Sample(threads) => sample::sample_source(threads),
        }
    }
}

/// One dispatch of an LLM kernel: entry point `entry` of `module`, `params` bound at binding
/// 0 (a range of a parameter buffer), each `(binding, buffer)` of `binds` bound whole, and
/// `groups` workgroups (spread over x and y by the caller where they exceed the adapter's
/// limit per dimension: every entry point takes its index as `x + y * num_workgroups.x` and
/// returns past its work).
pub struct Dispatch {
    pub module: Module,
    pub entry: &'static str,
    pub params: Vec<u32>,
    pub binds: Vec<(u32, wgpu::Buffer)>,
    pub groups: usize,
}

/// A compiled entry point and the layout of its bind group 0.
#[derive(Clone)]
pub struct Pipeline {
    pub pipe: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
}

/// Compiles entry point `entry` of WGSL source `src` (`label` names the module in errors);
/// validation errors fail it.
pub fn compile(
    dev: &wgpu::Device,
    label: &str,
    src: String,
    entry: &'static str,
) -> Result<Pipeline> {
    let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
    let sm = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(src.into()),
    });
    let pipe = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(entry),
        layout: None,
        module: &sm,
        entry_point: Some(entry),
        compilation_options: Default::default(),
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(Error::backend(
            "compile",
            format!("{label} entry {entry}: {e}"),
        ));
    }
    let layout = pipe.get_bind_group_layout(0);
    Ok(Pipeline { pipe, layout })
}

/// A storage buffer of `bytes` zero bytes (rounded up to whole words, at least one).
pub fn zeros(dev: &wgpu::Device, label: &str, bytes: usize) -> wgpu::Buffer {
    dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: (bytes.max(4).div_ceil(4) * 4) as u64,
        usage: qmatrix::storage_usage(),
        mapped_at_creation: false,
    })
}

/// Errors (naming `op`, `what`, the limit and the adapter) where a buffer of `bytes` bytes
/// exceeds `dev`'s largest storage binding.
pub fn check_binding(dev: &WgpuDevice, op: &'static str, what: &str, bytes: usize) -> Result<()> {
    let max = qmatrix::max_binding(dev.limits());
    if bytes as u64 > max {
        return Err(Error::backend(
            op,
            format!(
                "{what} needs {bytes} bytes, more than the adapter's largest storage binding \
                 ({max} bytes on {})",
                dev.name()
            ),
        ));
    }
    Ok(())
}

/// Maps `buf`'s first `bytes` bytes after submission `done` (and those before it; `None`:
/// all submitted work) and returns them as little-endian words; device errors before then
/// fail it, naming `op`. `buf` has `MAP_READ` usage and is unmapped on return.
pub fn map_words(
    dev: &WgpuDevice,
    op: &'static str,
    buf: &wgpu::Buffer,
    bytes: usize,
    done: Option<wgpu::SubmissionIndex>,
) -> Result<Vec<u32>> {
    if bytes == 0 {
        return Ok(Vec::new());
    }
    let (tx, rx) = std::sync::mpsc::channel();
    buf.map_async(wgpu::MapMode::Read, 0..bytes as u64, move |r| {
        let _ = tx.send(r);
    });
    dev.raw_device()
        .poll(wgpu::PollType::Wait {
            submission_index: done,
            timeout: None,
        })
        .map_err(|e| Error::backend(op, format!("waiting for the device: {e}")))?;
    dev.check_errors(op)?;
    match rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(Error::backend(op, format!("mapping: {e}"))),
        Err(_) => return Err(Error::backend(op, "the mapping never completed")),
    }
    let words = {
        let view = buf
            .get_mapped_range(0..bytes as u64)
            .map_err(|e| Error::backend(op, format!("mapping: {e}")))?;
        view.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    buf.unmap();
    Ok(words)
}

/// Every LLM module, as (name, entry points, source): what the naga test validates and
/// translates to Metal Shading Language and SPIR-V. `sample.wgsl` comes once per workgroup
/// size of [`sample::SAMPLE_THREADS`]; the 1024-thread one takes up to
/// [`sample::SAMPLE_1024_WORKGROUP_BYTES`] of workgroup memory, the others at most 16 KiB.
pub fn shader_sources() -> Vec<(String, &'static [&'static str], String)> {
    let mut out = vec![
        ("ops.wgsl".into(), ops::ENTRIES, ops::OPS.to_string()),
        (
            "paged.wgsl".into(),
            paged::ENTRIES,
            paged::PAGED.to_string(),
        ),
    ];
    for threads in sample::SAMPLE_THREADS {
        out.push((
            format!("sample.wgsl ({threads} threads)"),
            sample::ENTRIES,
            sample::sample_source(threads),
        ));
    }
    out
}
