//! One wgpu device: its queue, the open command batch, the pipeline cache and the buffer pool.
//!
//! Execution model (the CUDA backend's, on one wgpu queue):
//! - Ops record compute passes into the device's open command encoder (the *batch*) and return
//!   at once. A batch is submitted when it holds its dispatch limit, when its parameter buffer
//!   is full, or when a host read needs its work. After the host waited for the device (which
//!   is then idle) the limit starts at `FIRST_DISPATCHES` and grows by half with each batch
//!   up to `BATCH_DISPATCHES`, so the device starts on the first ops while the host records
//!   the next ones, and long runs of ops still go in few submissions. Half, not double: the
//!   host must record the next batch before the device runs out of the one before, and it
//!   records a dispatch in about half the time the device takes for a small op's (~3.5
//!   against ~6 us, 4 MiB elementwise on an H200), so a batch twice the last would leave the
//!   device idle in between.
//! - Each storage remembers the batch that last wrote it. A host read submits that batch if it
//!   is still open, then a copy into a mappable buffer, and waits for exactly that copy's
//!   submission (which the queue orders after every write it needs); a storage written in an
//!   earlier batch is read without submitting the open one.
//! - Uploads go through a fresh staging buffer copied inside the batch, so they are ordered
//!   with the dispatches around them (a pooled buffer may still be read by earlier dispatches).
//! - Dispatch parameters (sizes, strides, scalars) are appended to the batch's parameter
//!   buffer, each at an aligned offset; it is written once, at submit. Parameter buffers are
//!   a ring of `PARAM_RING` buffers reused in turn (wgpu orders a write after the earlier
//!   submissions that read the buffer). Binding 0 is a window of `PARAM_WORDS_PER_DISPATCH`
//!   words at a dynamic offset, so a bind group does not depend on where a dispatch's
//!   parameters lie, and bind groups are cached by (layout, parameter buffer, buffers bound).
//!   The cache holds clones of the buffers it binds; it is cleared whenever the pool destroys
//!   buffers (`Pool::generation`) and when it grows past `BIND_GROUP_CACHE` entries.

use crate::pool::{MemoryStats, Pool};
use crate::shader::{self, Kernel, Variant};
use crate::storage::WgpuStorage;
use ferrite_core::{DType, Error, HostBuffer, Layout, Result, Storage};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Dispatches per submitted batch, at most.
const BATCH_DISPATCHES: u32 = 256;
/// Dispatches of the first batch after a host wait.
const FIRST_DISPATCHES: u32 = 8;
/// Parameter words a dispatch may have in the ring's window (binding 0's size); a dispatch
/// with more gets a buffer of its own. The ring's buffers hold this many words per dispatch of
/// a full batch.
const PARAM_WORDS_PER_DISPATCH: usize = 256;
/// Parameter buffers reused in turn, one per submitted batch.
const PARAM_RING: usize = 4;
/// Cached bind groups, at most (the cache is cleared past it).
const BIND_GROUP_CACHE: usize = 2048;

/// Host synchronization counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Times the host waited for the device.
    pub host_waits: u64,
    /// Compute dispatches recorded.
    pub launches: u64,
    /// Command buffers submitted.
    pub submits: u64,
    /// Bind groups created (dispatches with the same buffers reuse one).
    pub bind_groups: u64,
}

/// Where a dispatch's WGSL comes from: a kernel file instantiated as a variant, or a module
/// generated at run time (the quantized products' per-format modules), named by a key that
/// identifies its source and built only when the key is not compiled yet.
pub(crate) enum Src<'a> {
    Kernel(&'static Kernel, &'a Variant),
    Module {
        key: &'a str,
        build: &'a dyn Fn() -> String,
    },
}

/// A buffer bound to a dispatch: read-only or read-write.
pub(crate) enum Arg<'a> {
    R(&'a wgpu::Buffer),
    W(&'a wgpu::Buffer),
}

struct Batch {
    /// Sequence number of the open batch; storages written in it carry this id.
    id: u64,
    /// The open compute pass of `encoder`, holding the batch's dispatches since its last copy
    /// (wgpu orders the dispatches of a pass with barriers where one reads what another
    /// wrote). Ended before any copy is recorded and before the encoder is finished.
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    /// The parameters of the batch's dispatches, written into `ring[ring_at]` at submit.
    params: Vec<u32>,
    /// The parameter ring (created at first use), and the buffer of the open batch.
    ring: Vec<wgpu::Buffer>,
    ring_at: usize,
    /// Bind groups by (layout, parameter buffer, buffers bound), valid for pool generation
    /// `bind_gen`.
    binds: HashMap<BindKey, wgpu::BindGroup>,
    bind_gen: u64,
    dispatches: u32,
    /// Dispatches at which this batch is submitted (see the module's contract).
    limit: u32,
}

type LayoutKey = Vec<bool>;
/// A bind group's identity: its layout's address, the parameter buffer and the buffers bound.
type BindKey = (usize, wgpu::Buffer, Vec<wgpu::Buffer>);
/// A compiled pipeline: module (a kernel file, or a generated module's key), entry, variant
/// and its binding layout key.
type PipeKey = (Cow<'static, str>, &'static str, Variant, LayoutKey);
type Layouts = (wgpu::BindGroupLayout, wgpu::PipelineLayout);
type Pipeline = (Arc<wgpu::ComputePipeline>, Arc<Layouts>);

pub struct WgpuBackend {
    pub(crate) index: usize,
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: wgpu::AdapterInfo,
    pub(crate) limits: wgpu::Limits,
    pub(crate) pool: Arc<Pool>,
    batch: Mutex<Batch>,
    pipelines: Mutex<HashMap<PipeKey, Pipeline>>,
    layouts: Mutex<HashMap<LayoutKey, Arc<Layouts>>>,
    /// Whether variants with subgroup operations are used (the adapter has them, and tests
    /// may turn them off to run the fallback).
    subgroups: AtomicBool,
    /// The adapter's `DownlevelFlags::SHADER_F16_IN_F32` (`unpack2x16float` in shaders), and
    /// whether kernels use it (tests may turn it off to run the bit-operation fallback).
    pub(crate) f16_in_f32: bool,
    pub(crate) f16_unpack: AtomicBool,
    /// The first error wgpu reported outside an error scope (validation, out of memory).
    error: Arc<Mutex<Option<String>>>,
    host_waits: AtomicU64,
    launches: AtomicU64,
    submits: AtomicU64,
    bind_groups: AtomicU64,
    /// Parameter offsets must be multiples of this many words.
    param_align: usize,
    /// The device error word: kernels that meet bad data (an index out of range, an integer
    /// division by zero) `atomicMax` a code into it; host reads check it (`errors.rs`).
    pub(crate) err_buf: wgpu::Buffer,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl WgpuBackend {
    /// Opens `adapter` (number `index` in `crate::adapters()`), requesting its real limits.
    pub(crate) fn new(index: usize, adapter: &wgpu::Adapter) -> Result<WgpuBackend> {
        let info = adapter.get_info();
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("ferrite"),
            // Where the adapter has them: timestamps inside passes (the LLM kernel set's
            // per-dispatch profile, `FERRITE_WGPU_PROFILE`) and subgroup operations (sums).
            required_features: adapter.features()
                & (wgpu::Features::TIMESTAMP_QUERY
                    | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
                    | wgpu::Features::SUBGROUP),
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| {
            Error::backend(
                "wgpu",
                format!("adapter {index} ({}) refused a device: {e}", info.name),
            )
        })?;
        let error = Arc::new(Mutex::new(None::<String>));
        let sink = error.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut s = lock(&sink);
            if s.is_none() {
                *s = Some(e.to_string());
            }
        }));
        let pool = Arc::new(Pool::new(
            limits.max_buffer_size,
            limits.max_storage_buffer_binding_size,
        ));
        let param_align = (limits.min_storage_buffer_offset_alignment as usize / 4).max(1);
        let f16_in_f32 = adapter
            .get_downlevel_capabilities()
            .flags
            .contains(wgpu::DownlevelFlags::SHADER_F16_IN_F32);
        let err_buf = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("errors"),
            size: 4,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(WgpuBackend {
            index,
            device,
            queue,
            info,
            limits,
            pool,
            batch: Mutex::new(Batch {
                id: 1,
                pass: None,
                encoder: None,
                params: Vec::new(),
                ring: Vec::new(),
                ring_at: 0,
                binds: HashMap::new(),
                bind_gen: 0,
                dispatches: 0,
                limit: FIRST_DISPATCHES,
            }),
            pipelines: Mutex::new(HashMap::new()),
            layouts: Mutex::new(HashMap::new()),
            subgroups: AtomicBool::new(adapter.features().contains(wgpu::Features::SUBGROUP)),
            f16_in_f32,
            f16_unpack: AtomicBool::new(f16_in_f32),
            error,
            host_waits: AtomicU64::new(0),
            launches: AtomicU64::new(0),
            submits: AtomicU64::new(0),
            bind_groups: AtomicU64::new(0),
            param_align,
            err_buf,
        })
    }

    pub fn memory_stats(&self) -> MemoryStats {
        self.pool.stats()
    }

    /// Destroys the pool's cached buffers, and the cached bind groups that hold them.
    pub(crate) fn empty_cache(&self) {
        lock(&self.batch).binds.clear();
        self.pool.empty_cache();
    }

    /// Whether kernels may use subgroup operations.
    pub(crate) fn subgroups(&self) -> bool {
        self.subgroups.load(Ordering::Relaxed)
    }

    /// Turns subgroup operations off (or back on, where the device has them): the fallback
    /// kernels run instead.
    pub(crate) fn set_subgroups(&self, on: bool) {
        let has = self.device.features().contains(wgpu::Features::SUBGROUP);
        self.subgroups.store(on && has, Ordering::Relaxed);
    }

    pub fn sync_stats(&self) -> SyncStats {
        SyncStats {
            host_waits: self.host_waits.load(Ordering::Relaxed),
            launches: self.launches.load(Ordering::Relaxed),
            submits: self.submits.load(Ordering::Relaxed),
            bind_groups: self.bind_groups.load(Ordering::Relaxed),
        }
    }

    /// The first asynchronous wgpu error, as an error of `op`.
    pub(crate) fn check(&self, op: &'static str) -> Result<()> {
        match lock(&self.error).clone() {
            Some(e) => Err(Error::backend(op, format!("wgpu reported: {e}"))),
            None => Ok(()),
        }
    }

    /// A new pooled buffer of `n` elements of `dt` as a storage written in the open batch.
    pub(crate) fn alloc(&self, op: &'static str, dt: DType, n: usize) -> Result<WgpuStorage> {
        shader::word(op, dt)?;
        let bytes = n
            .checked_mul(4)
            .ok_or_else(|| Error::backend(op, format!("{n} elements overflow a buffer size")))?;
        if n > u32::MAX as usize {
            return Err(Error::backend(
                op,
                format!("{n} elements exceed the 2^32 a WGSL index can address"),
            ));
        }
        let block = self.pool.alloc(&self.device, op, bytes)?;
        Ok(WgpuStorage::new(block, dt, n, 0))
    }

    fn layout(&self, key: &[bool]) -> Arc<Layouts> {
        let mut layouts = lock(&self.layouts);
        if let Some(l) = layouts.get(key) {
            return l.clone();
        }
        let entries: Vec<wgpu::BindGroupLayoutEntry> = key
            .iter()
            .enumerate()
            .map(|(i, &read_only)| wgpu::BindGroupLayoutEntry {
                binding: i as u32,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only },
                    // the parameter window moves with each dispatch
                    has_dynamic_offset: i == 0,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let bgl = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: None,
                entries: &entries,
            });
        let pl = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: None,
                bind_group_layouts: &[Some(&bgl)],
                immediate_size: 0,
            });
        let l = Arc::new((bgl, pl));
        layouts.insert(key.to_vec(), l.clone());
        l
    }

    /// The pipeline of `src`'s `entry` with binding layout `key`, compiled at first use.
    fn pipeline(
        &self,
        op: &'static str,
        src: &Src<'_>,
        entry: &'static str,
        key: LayoutKey,
    ) -> Result<Pipeline> {
        let name: PipeKey = match src {
            Src::Kernel(k, v) => (Cow::Borrowed(k.file), entry, (*v).clone(), key),
            Src::Module { key: m, .. } => (
                Cow::Owned(m.to_string()),
                entry,
                Variant::new(&[], &[]),
                key,
            ),
        };
        if let Some(p) = lock(&self.pipelines).get(&name) {
            return Ok(p.clone());
        }
        let (label, text) = match src {
            Src::Kernel(k, v) => (k.file, shader::source(k, v)?),
            Src::Module { build, .. } => ("generated module", build()),
        };
        let layout = self.layout(&name.3);
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(label),
                source: wgpu::ShaderSource::Wgsl(text.into()),
            });
        let pipe = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: Some(&layout.1),
                module: &module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            let what = match src {
                Src::Kernel(k, v) => format!("{} entry {entry} ({v:?})", k.file),
                Src::Module { key, .. } => format!("{key} entry {entry}"),
            };
            return Err(Error::backend(op, format!("compiling {what}: {e}")));
        }
        let p = (Arc::new(pipe), layout);
        lock(&self.pipelines).insert(name, p.clone());
        Ok(p)
    }

    /// Records one dispatch of `groups` workgroups (spread over x and y past the per-dimension
    /// limit) with `params` at binding 0, then `outs` (read-write), `ins` (read-only) and, with
    /// `err`, the device error word, at bindings 1.. in that order. Marks `outs` as written by
    /// the batch the dispatch lands in.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch(
        &self,
        op: &'static str,
        kernel: &'static Kernel,
        entry: &'static str,
        v: &Variant,
        params: &[u32],
        outs: &[&WgpuStorage],
        ins: &[&wgpu::Buffer],
        err: bool,
        groups: usize,
    ) -> Result<()> {
        let mut args: Vec<Arg<'_>> = outs.iter().map(|o| Arg::W(o.buffer())).collect();
        args.extend(ins.iter().map(|b| Arg::R(b)));
        if err {
            args.push(Arg::W(&self.err_buf));
        }
        let src = Src::Kernel(kernel, v);
        self.launch_args(op, &src, entry, params, &args, outs, groups)
    }

    /// Records one dispatch of `groups` workgroups of `src`'s `entry` with `params` at
    /// binding 0 and `args` at bindings 1.. in that order; marks `written` (the storages among
    /// `args` it writes) as written by the batch it lands in.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_args(
        &self,
        op: &'static str,
        src: &Src<'_>,
        entry: &'static str,
        params: &[u32],
        args: &[Arg<'_>],
        written: &[&WgpuStorage],
        groups: usize,
    ) -> Result<()> {
        let id = self.dispatch(op, src, entry, params, args, groups)?;
        for o in written {
            o.set_written(id);
        }
        Ok(())
    }

    fn dispatch(
        &self,
        op: &'static str,
        src: &Src<'_>,
        entry: &'static str,
        params: &[u32],
        args: &[Arg<'_>],
        groups: usize,
    ) -> Result<u64> {
        if groups == 0 {
            return Ok(0);
        }
        let max_dim = self.limits.max_compute_workgroups_per_dimension.max(1) as usize;
        let (gx, gy) = if groups <= max_dim {
            (groups, 1)
        } else {
            (max_dim, groups.div_ceil(max_dim))
        };
        if gy > max_dim {
            return Err(Error::backend(
                op,
                format!("{groups} workgroups exceed the adapter's dispatch limit"),
            ));
        }
        let mut key = vec![true];
        key.extend(args.iter().map(|a| matches!(a, Arg::R(_))));
        let (pipe, layout) = self.pipeline(op, src, entry, key)?;
        let mut b = lock(&self.batch);
        let need = params.len().max(1);
        let (bind, offset) = if need > PARAM_WORDS_PER_DISPATCH {
            // a buffer of its own, written now (before any later submission), bound at 0
            use wgpu::util::DeviceExt;
            let mut words = params.to_vec();
            words.resize(need, 0);
            let own = self
                .device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("params"),
                    contents: &words_to_bytes(&words),
                    usage: wgpu::BufferUsages::STORAGE,
                });
            (self.bind_group(&layout.0, &own, need, args), 0)
        } else {
            let start = b.params.len().div_ceil(self.param_align) * self.param_align;
            if start + PARAM_WORDS_PER_DISPATCH > self.ring_words() {
                self.submit_locked(&mut b);
            }
            let start = b.params.len().div_ceil(self.param_align) * self.param_align;
            b.params.resize(start, 0);
            b.params.extend_from_slice(params);
            if params.is_empty() {
                b.params.push(0);
            }
            let param_buf = self.ring_buffer(&mut b);
            let gen = self.pool.generation();
            if b.bind_gen != gen || b.binds.len() >= BIND_GROUP_CACHE {
                b.binds.clear();
                b.bind_gen = gen;
            }
            let key: BindKey = (
                Arc::as_ptr(&layout) as usize,
                param_buf.clone(),
                args.iter()
                    .map(|a| match a {
                        Arg::R(buf) | Arg::W(buf) => (*buf).clone(),
                    })
                    .collect(),
            );
            let bind = match b.binds.get(&key) {
                Some(g) => g.clone(),
                None => {
                    let g = self.bind_group(&layout.0, &param_buf, PARAM_WORDS_PER_DISPATCH, args);
                    b.binds.insert(key, g.clone());
                    g
                }
            };
            (bind, (start * 4) as u32)
        };
        let pass = self.pass(&mut b);
        pass.set_pipeline(&pipe);
        pass.set_bind_group(0, &bind, &[offset]);
        pass.dispatch_workgroups(gx as u32, gy as u32, 1);
        b.dispatches += 1;
        self.launches.fetch_add(1, Ordering::Relaxed);
        let id = b.id;
        if b.dispatches >= b.limit {
            self.submit_locked(&mut b);
            b.limit = (b.limit + b.limit / 2).min(BATCH_DISPATCHES);
        }
        Ok(id)
    }

    /// Words in each buffer of the parameter ring: a full batch's windows, and room for the
    /// last window past the last aligned start.
    fn ring_words(&self) -> usize {
        PARAM_WORDS_PER_DISPATCH * (BATCH_DISPATCHES as usize + 1) + self.param_align
    }

    /// The open batch's parameter buffer (the ring is created at first use).
    fn ring_buffer(&self, b: &mut Batch) -> wgpu::Buffer {
        if b.ring.is_empty() {
            let words = self.ring_words();
            b.ring = (0..PARAM_RING)
                .map(|_| {
                    self.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("params"),
                        size: (words * 4) as u64,
                        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    })
                })
                .collect();
        }
        b.ring[b.ring_at].clone()
    }

    /// A bind group of `layout`: binding 0 the first `words` parameter words of `params` (at
    /// the dispatch's dynamic offset), then `args` at bindings 1...
    fn bind_group(
        &self,
        layout: &wgpu::BindGroupLayout,
        params: &wgpu::Buffer,
        words: usize,
        args: &[Arg<'_>],
    ) -> wgpu::BindGroup {
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: params,
                offset: 0,
                size: wgpu::BufferSize::new((words * 4) as u64),
            }),
        }];
        for (i, a) in args.iter().enumerate() {
            let buf = match a {
                Arg::R(b) | Arg::W(b) => *b,
            };
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: buf.as_entire_binding(),
            });
        }
        self.bind_groups.fetch_add(1, Ordering::Relaxed);
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout,
            entries: &entries,
        })
    }

    /// The batch's encoder for a copy or clear: ends the open compute pass, so the command
    /// lands after the dispatches recorded so far.
    fn encoder<'a>(&self, b: &'a mut Batch) -> &'a mut wgpu::CommandEncoder {
        b.pass = None;
        b.encoder.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
        })
    }

    /// The batch's open compute pass, begun if there is none.
    fn pass<'a>(&self, b: &'a mut Batch) -> &'a mut wgpu::ComputePass<'static> {
        let enc = &mut b.encoder;
        b.pass.get_or_insert_with(|| {
            enc.get_or_insert_with(|| {
                self.device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
            })
            .begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("ferrite"),
                timestamp_writes: None,
            })
            .forget_lifetime()
        })
    }

    /// Submits the open batch (if it recorded anything) and opens the next one.
    fn submit_locked(&self, b: &mut Batch) -> Option<wgpu::SubmissionIndex> {
        b.pass = None;
        let enc = b.encoder.take()?;
        if !b.params.is_empty() {
            if let Some(pb) = b.ring.get(b.ring_at) {
                self.queue.write_buffer(pb, 0, &words_to_bytes(&b.params));
            }
            b.ring_at = (b.ring_at + 1) % PARAM_RING;
        }
        let idx = self.queue.submit([enc.finish()]);
        self.submits.fetch_add(1, Ordering::Relaxed);
        b.params.clear();
        b.dispatches = 0;
        b.id += 1;
        Some(idx)
    }

    /// After a host wait: the device may be idle, so the open batch goes out after its first
    /// few dispatches.
    fn waited(&self) {
        let mut b = lock(&self.batch);
        b.limit = FIRST_DISPATCHES.max(b.dispatches + 1);
    }

    /// Submits the open batch (benchmarks and tests; reads submit what they need).
    pub fn flush(&self) {
        let mut b = lock(&self.batch);
        self.submit_locked(&mut b);
    }

    /// Waits for all submitted work (benchmarks only).
    pub fn synchronize(&self) -> Result<()> {
        self.flush();
        self.host_waits.fetch_add(1, Ordering::Relaxed);
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::backend("synchronize", e.to_string()))?;
        self.waited();
        self.check("synchronize")
    }

    /// Copies `bytes` into `dst` (at byte offset 0) in batch order.
    pub(crate) fn upload_into(&self, dst: &WgpuStorage, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        use wgpu::util::DeviceExt;
        let staging = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("upload"),
                contents: bytes,
                usage: wgpu::BufferUsages::COPY_SRC,
            });
        let mut b = lock(&self.batch);
        self.encoder(&mut b).copy_buffer_to_buffer(
            &staging,
            0,
            dst.buffer(),
            0,
            bytes.len() as u64,
        );
        dst.set_written(b.id);
    }

    /// Takes host data as a new contiguous storage.
    pub(crate) fn upload(&self, data: &HostBuffer) -> Result<Arc<dyn Storage>> {
        let dt = data.dtype();
        let words = to_words(data)?;
        let st = self.alloc("upload", dt, data.len())?;
        self.upload_into(&st, &words_to_bytes(&words));
        Ok(Arc::new(st))
    }

    /// Reads `n` words from `st` starting at word `start`, waiting for the work that wrote it.
    pub(crate) fn read_words(&self, st: &WgpuStorage, start: usize, n: usize) -> Result<Vec<u32>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: (n * 4 + 4) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let idx = {
            let mut b = lock(&self.batch);
            if st.written() >= b.id {
                // Written in the open batch: the copy goes at its end, and the batch is submitted.
                let enc = self.encoder(&mut b);
                enc.copy_buffer_to_buffer(
                    &st.block.buffer,
                    (start * 4) as u64,
                    &staging,
                    0,
                    (n * 4) as u64,
                );
                enc.copy_buffer_to_buffer(&self.err_buf, 0, &staging, (n * 4) as u64, 4);
                self.submit_locked(&mut b)
            } else {
                // Written by submitted work: the open batch may stay open.
                let mut enc = self
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
                enc.copy_buffer_to_buffer(
                    &st.block.buffer,
                    (start * 4) as u64,
                    &staging,
                    0,
                    (n * 4) as u64,
                );
                enc.copy_buffer_to_buffer(&self.err_buf, 0, &staging, (n * 4) as u64, 4);
                self.submits.fetch_add(1, Ordering::Relaxed);
                Some(self.queue.submit([enc.finish()]))
            }
        };
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.host_waits.fetch_add(1, Ordering::Relaxed);
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: idx,
                timeout: None,
            })
            .map_err(|e| Error::backend("to_host", format!("waiting for the device: {e}")))?;
        self.waited();
        self.check("to_host")?;
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Error::backend("to_host", format!("mapping: {e}"))),
            Err(_) => return Err(Error::backend("to_host", "the mapping never completed")),
        }
        let view = staging
            .get_mapped_range(..)
            .map_err(|e| Error::backend("to_host", format!("mapping: {e}")))?;
        let mut words: Vec<u32> = view
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        drop(view);
        staging.unmap();
        let code = words.pop().unwrap_or(0);
        if code != 0 {
            // Cleared in batch order: work queued after the failing op starts clean.
            let mut b = lock(&self.batch);
            self.encoder(&mut b).clear_buffer(&self.err_buf, 0, None);
            return Err(crate::errors::device_error(code));
        }
        Ok(words)
    }

    /// The elements `layout` selects from `storage`, as a host buffer.
    pub(crate) fn download(&self, storage: &dyn Storage, layout: &Layout) -> Result<HostBuffer> {
        let st = WgpuStorage::of(storage, "to_host")?;
        let n = layout.shape().elem_count();
        let words = if layout.is_contiguous() {
            self.read_words(st, layout.offset(), n)?
        } else {
            let c = crate::elementwise::copy_layout(self, st, layout)?;
            self.read_words(&c, 0, n)?
        };
        from_words(st.dtype(), &words)
    }
}

pub(crate) fn words_to_bytes(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Host elements to device words (see `shader.rs` for the representation).
fn to_words(data: &HostBuffer) -> Result<Vec<u32>> {
    Ok(match data {
        HostBuffer::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        HostBuffer::F16(v) => v.iter().map(|x| x.to_f32().to_bits()).collect(),
        HostBuffer::BF16(v) => v.iter().map(|x| x.to_f32().to_bits()).collect(),
        HostBuffer::F64(_) => {
            shader::word("upload", DType::F64)?;
            Vec::new()
        }
        HostBuffer::I32(v) => v.iter().map(|&x| x as u32).collect(),
        HostBuffer::I64(v) => {
            let mut out = Vec::with_capacity(v.len());
            for (i, &x) in v.iter().enumerate() {
                let y = i32::try_from(x).map_err(|_| {
                    Error::dtype(
                        "upload",
                        DType::I64,
                        format!(
                            "element {i} = {x} is outside the i32 range the wgpu backend \
                             stores i64 in"
                        ),
                    )
                })?;
                out.push(y as u32);
            }
            out
        }
        HostBuffer::U32(v) => v.clone(),
        HostBuffer::U8(v) => v.iter().map(|&x| x as u32).collect(),
        HostBuffer::Bool(v) => v.iter().map(|&x| x as u32).collect(),
    })
}

/// Device words to host elements of `dt`.
fn from_words(dt: DType, w: &[u32]) -> Result<HostBuffer> {
    use ferrite_core::{bf16, f16};
    Ok(match dt {
        DType::F32 => HostBuffer::F32(w.iter().map(|&x| f32::from_bits(x)).collect()),
        DType::F16 => HostBuffer::F16(
            w.iter()
                .map(|&x| f16::from_f32(f32::from_bits(x)))
                .collect(),
        ),
        DType::BF16 => HostBuffer::BF16(
            w.iter()
                .map(|&x| bf16::from_f32(f32::from_bits(x)))
                .collect(),
        ),
        DType::F64 => {
            shader::word("to_host", DType::F64)?;
            HostBuffer::F64(Vec::new())
        }
        DType::I32 => HostBuffer::I32(w.iter().map(|&x| x as i32).collect()),
        DType::I64 => HostBuffer::I64(w.iter().map(|&x| x as i32 as i64).collect()),
        DType::U32 => HostBuffer::U32(w.to_vec()),
        DType::U8 => HostBuffer::U8(w.iter().map(|&x| x as u8).collect()),
        DType::Bool => HostBuffer::Bool(w.iter().map(|&x| x != 0).collect()),
    })
}
