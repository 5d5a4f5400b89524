//! Thin safe layer over the CUDA driver: library presence, errors that name the op, the
//! per-device context, streams and pooled events.

use cudarc::driver::{result as dr, sys, DriverError};
use ferrite_core::{Error, Result};
use std::sync::{Arc, Mutex};

/// Whether the CUDA driver library can be loaded in this process.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

/// Maps a driver error to an error naming `op`.
pub(crate) fn drv(op: &'static str, e: DriverError) -> Error {
    let name = e
        .error_name()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    let text = e
        .error_string()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default();
    Error::backend(op, format!("CUDA error {name}: {text}"))
}

pub(crate) trait Check<T> {
    fn op(self, op: &'static str) -> Result<T>;
}

impl<T> Check<T> for std::result::Result<T, DriverError> {
    fn op(self, op: &'static str) -> Result<T> {
        self.map_err(|e| drv(op, e))
    }
}

/// The device's primary context, made current on the calling thread by `bind`.
pub(crate) struct Context {
    pub ctx: sys::CUcontext,
    pub dev: sys::CUdevice,
    pub ordinal: usize,
}

// SAFETY: a CUcontext handle may be used from any thread once made current there.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

thread_local! {
    static CURRENT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Context {
    pub fn new(ordinal: usize) -> Result<Context> {
        let op = "cuda";
        if !driver_present() {
            return Err(Error::backend(
                op,
                "no CUDA device: the CUDA driver library (libcuda.so) is not installed",
            ));
        }
        dr::init().op(op)?;
        let count = dr::device::get_count().op(op)? as usize;
        if ordinal >= count {
            return Err(Error::backend(
                op,
                match count {
                    0 => "no CUDA device: the driver reports none".to_string(),
                    n => format!("invalid device index {ordinal}: {n} CUDA device(s) present"),
                },
            ));
        }
        let dev = dr::device::get(ordinal as i32).op(op)?;
        // SAFETY: dev is a valid device handle.
        let ctx = unsafe { dr::primary_ctx::retain(dev) }.op(op)?;
        let c = Context { ctx, dev, ordinal };
        c.bind()?;
        Ok(c)
    }

    /// Makes this context current on the calling thread (cheap when it already is).
    pub fn bind(&self) -> Result<()> {
        let key = self.ctx as usize;
        if CURRENT.with(|c| c.get()) != key {
            // SAFETY: ctx is a retained primary context.
            unsafe { dr::ctx::set_current(self.ctx) }.op("cuda")?;
            CURRENT.with(|c| c.set(key));
        }
        Ok(())
    }

    pub fn attribute(&self, a: sys::CUdevice_attribute) -> Result<i32> {
        // SAFETY: dev is valid.
        unsafe { dr::device::get_attribute(self.dev, a) }.op("cuda")
    }
}

/// A stream owned by a device.
pub(crate) struct Stream(pub sys::CUstream);
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    pub fn new() -> Result<Stream> {
        Ok(Stream(
            dr::stream::create(dr::stream::StreamKind::NonBlocking).op("cuda")?,
        ))
    }
}

/// A recycled CUDA event (timing disabled). Returned to its pool on drop.
pub struct Event {
    pub(crate) raw: sys::CUevent,
    pool: Arc<EventPool>,
}
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    pub(crate) fn record(&self, s: &Stream) -> Result<()> {
        // SAFETY: both handles are valid.
        unsafe { dr::event::record(self.raw, s.0) }.op("cuda")
    }
    /// Makes `s` wait for this event.
    pub(crate) fn wait_on(&self, s: &Stream) -> Result<()> {
        // SAFETY: both handles are valid.
        unsafe {
            dr::stream::wait_event(
                s.0,
                self.raw,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .op("cuda")
    }
    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: valid event.
        unsafe { dr::event::synchronize(self.raw) }.op("cuda")
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(mut v) = self.pool.free.lock() {
            v.push(self.raw);
        }
    }
}

#[derive(Default)]
pub(crate) struct EventPool {
    free: Mutex<Vec<sys::CUevent>>,
}
unsafe impl Send for EventPool {}
unsafe impl Sync for EventPool {}

impl EventPool {
    pub fn get(self: &Arc<Self>) -> Result<Event> {
        let raw = match self.free.lock().ok().and_then(|mut v| v.pop()) {
            Some(e) => e,
            None => dr::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).op("cuda")?,
        };
        Ok(Event {
            raw,
            pool: self.clone(),
        })
    }
}

/// A timing event pair for benchmarks.
pub struct Timer {
    start: sys::CUevent,
    end: sys::CUevent,
}

impl Timer {
    pub(crate) fn new() -> Result<Timer> {
        Ok(Timer {
            start: dr::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).op("timer")?,
            end: dr::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).op("timer")?,
        })
    }
    pub(crate) fn start(&self, s: &Stream) -> Result<()> {
        // SAFETY: valid handles.
        unsafe { dr::event::record(self.start, s.0) }.op("timer")
    }
    pub(crate) fn stop_ms(&self, s: &Stream) -> Result<f32> {
        // SAFETY: valid handles.
        unsafe {
            dr::event::record(self.end, s.0).op("timer")?;
            dr::event::synchronize(self.end).op("timer")?;
            dr::event::elapsed(self.start, self.end).op("timer")
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once.
        unsafe {
            let _ = dr::event::destroy(self.start);
            let _ = dr::event::destroy(self.end);
        }
    }
}
