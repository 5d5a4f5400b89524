//! Per-op wall-time counters of the CPU backend, off by default (one relaxed atomic load per op
//! when off). `set_enabled(true)` starts counting; `take()` returns and clears the counts,
//! keyed by op name, first input's dims and first output's dims, so the same op at different
//! shapes (a conv at 28x28 and at 7x7) is listed apart. CPU ops run on the calling thread, so
//! an op's time is the wall time of its call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Instant;

static ON: AtomicBool = AtomicBool::new(false);

type Key = (&'static str, Vec<usize>, Vec<usize>);

static COUNTS: LazyLock<Mutex<HashMap<Key, (usize, f64)>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Calls and wall time of one op at one pair of shapes.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTime {
    pub op: &'static str,
    /// Dims of the op's first input (empty for ops without inputs).
    pub input: Vec<usize>,
    /// Dims of the op's first output (empty for in-place ops).
    pub output: Vec<usize>,
    pub calls: usize,
    pub secs: f64,
}

/// Turns counting on or off (counts gathered so far are kept).
pub fn set_enabled(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// The counts since the last `take`, largest total time first; clears them.
pub fn take() -> Vec<OpTime> {
    let map = match COUNTS.lock() {
        Ok(mut m) => std::mem::take(&mut *m),
        Err(_) => return Vec::new(),
    };
    let mut v: Vec<OpTime> = map
        .into_iter()
        .map(|((op, input, output), (calls, secs))| OpTime {
            op,
            input,
            output,
            calls,
            secs,
        })
        .collect();
    v.sort_by(|a, b| b.secs.total_cmp(&a.secs));
    v
}

/// Runs `f`, counting its wall time under `op` and the shapes `shapes` returns (called only
/// when counting is on).
pub(crate) fn time<R>(
    op: &'static str,
    shapes: impl FnOnce() -> (Vec<usize>, Vec<usize>),
    f: impl FnOnce() -> R,
) -> R {
    if !ON.load(Ordering::Relaxed) {
        return f();
    }
    let t0 = Instant::now();
    let r = f();
    let dt = t0.elapsed().as_secs_f64();
    let (input, output) = shapes();
    if let Ok(mut m) = COUNTS.lock() {
        let e = m.entry((op, input, output)).or_insert((0, 0.0));
        e.0 += 1;
        e.1 += dt;
    }
    r
}
