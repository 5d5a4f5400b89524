//! CUDA graphs: a closure that enqueues work is captured once, with the buffer addresses it
//! used fixed, and replayed. Inputs are updated between replays by writing into the tensors
//! the capture read (`CudaDevice::write`); outputs are the tensors the closure returned, valid
//! (to host reads) after each replay.

use crate::alloc::Block;
use crate::device::CudaBackend;
use crate::driver::Check;
use cudarc::driver::{result as dr, sys};
use ferrite_core::{Error, Result, Tensor};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub struct Graph {
    exec: sys::CUgraphExec,
    graph: sys::CUgraph,
    dev: Arc<CudaBackend>,
    outputs: Vec<Tensor>,
    /// Blocks allocated during capture: the graph's kernels use their addresses on every
    /// replay, so they stay out of the cache until the graph is dropped.
    _blocks: Vec<Arc<Block>>,
    nodes: usize,
}

unsafe impl Send for Graph {}
unsafe impl Sync for Graph {}

/// A capture in progress on a device's compute stream ([`crate::CudaDevice::record`]): the
/// work queued on the stream until [`Recording::finish`] is recorded, not run, and becomes the
/// graph. Dropped unfinished, it ends the capture and discards what it recorded.
pub struct Recording {
    dev: Arc<CudaBackend>,
    live: bool,
}

pub(crate) fn record(dev: &Arc<CudaBackend>) -> Result<Recording> {
    let op = "graph_capture";
    dev.bind()?;
    if dev.capturing.swap(true, Ordering::AcqRel) {
        return Err(Error::backend(
            op,
            "a capture is already in progress on this device",
        ));
    }
    dev.alloc.begin_capture();
    // SAFETY: our compute stream; relaxed mode lets the allocator call cuMemAlloc meanwhile.
    let begun = unsafe {
        dr::stream::begin_capture(
            dev.compute.0,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        )
    }
    .op(op);
    if let Err(e) = begun {
        dev.capturing.store(false, Ordering::Release);
        drop(dev.alloc.end_capture());
        return Err(e);
    }
    Ok(Recording {
        dev: dev.clone(),
        live: true,
    })
}

impl Recording {
    /// Ends the capture once: the recorded graph (null where nothing was recorded), and the
    /// blocks it allocated or read, for a graph to keep.
    fn end(&mut self) -> (Result<sys::CUgraph>, Vec<Arc<Block>>) {
        self.live = false;
        let dev = &self.dev;
        let bound = dev.bind();
        // SAFETY: ends the capture `record` began on this stream.
        let ended = bound
            .and_then(|()| unsafe { dr::stream::end_capture(dev.compute.0) }.op("graph_capture"));
        dev.capturing.store(false, Ordering::Release);
        (ended, dev.alloc.end_capture())
    }

    /// Ends the capture: its graph, instantiated, with `outputs` (tensors the recorded work
    /// wrote) readable after each replay.
    pub fn finish(mut self, outputs: Vec<Tensor>) -> Result<Graph> {
        let op = "graph_capture";
        let (ended, blocks) = self.end();
        let graph = ended?;
        if graph.is_null() {
            return Err(Error::backend(op, "the capture recorded no graph"));
        }
        let mut nodes = 0usize;
        // SAFETY: graph is valid; a null node array asks for the count.
        let counted = unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut nodes) }
            .result()
            .op(op);
        // SAFETY: graph is valid.
        let exec = counted
            .and_then(|()| {
                unsafe { dr::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }.op(op)
            })
            .inspect_err(|_| {
                // SAFETY: destroyed once.
                unsafe {
                    let _ = dr::graph::destroy(graph);
                }
            })?;
        Ok(Graph {
            exec,
            graph,
            dev: self.dev.clone(),
            outputs,
            _blocks: blocks,
            nodes,
        })
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if !self.live {
            return;
        }
        // The recorded graph is destroyed unused; its blocks go back to the cache.
        if let (Ok(g), _) = self.end() {
            if !g.is_null() {
                // SAFETY: a graph the capture returned, destroyed once.
                unsafe {
                    let _ = dr::graph::destroy(g);
                }
            }
        }
    }
}

pub(crate) fn capture<F>(dev: &Arc<CudaBackend>, f: F) -> Result<Graph>
where
    F: FnOnce() -> Result<Vec<Tensor>>,
{
    let rec = record(dev)?;
    let outputs = f()?;
    rec.finish(outputs)
}

impl Graph {
    /// Enqueues one replay on the device's compute stream; returns at once.
    pub fn replay(&self) -> Result<()> {
        self.dev.bind()?;
        // SAFETY: exec belongs to this device's context.
        unsafe { dr::graph::launch(self.exec, self.dev.compute.0) }.op("graph_replay")?;
        let e = self.dev.mark()?;
        *self
            .dev
            .last_replay
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(e);
        Ok(())
    }

    /// The tensors the captured closure returned.
    pub fn outputs(&self) -> &[Tensor] {
        &self.outputs
    }

    /// Number of nodes (kernels, copies) in the graph.
    pub fn node_count(&self) -> usize {
        self.nodes
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: created by capture, destroyed once; pending replays keep running on the
        // stream (the driver defers the release).
        unsafe {
            let _ = dr::graph::exec_destroy(self.exec);
            let _ = dr::graph::destroy(self.graph);
        }
    }
}
