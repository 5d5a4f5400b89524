//! A small persistent thread pool for the many short parallel loops of one decode step
//! (about 200 per token). Workers spin briefly between jobs, then sleep, so back-to-back
//! jobs start in well under a microsecond instead of paying a wake-up each (rayon's cost
//! here measured larger than the work itself on 2 cores). Tasks are claimed dynamically
//! through an atomic counter; the calling thread works too.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

type Job = *const (dyn Fn(usize) + Sync);

struct Inner {
    epoch: AtomicUsize,
    /// Set before `epoch` is bumped; read by workers after they observe the new epoch.
    job: UnsafeCell<Option<Job>>,
    n_tasks: AtomicUsize,
    next: AtomicUsize,
    /// Workers still inside the current job.
    active: AtomicUsize,
    sleeping: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

// SAFETY: `job` is written only by the (single) caller of `run` while no worker reads it
// (all workers have left the previous job: `active == 0`), and read by workers only between
// observing a new epoch and decrementing `active`.
unsafe impl Sync for Inner {}
// SAFETY: as above; the raw job pointer is only dereferenced under that protocol.
unsafe impl Send for Inner {}

pub struct Pool {
    inner: Arc<Inner>,
    n_workers: usize,
    run_lock: Mutex<()>,
}

const SPIN: Duration = Duration::from_micros(200);

impl Pool {
    /// A pool running jobs on `threads` threads in total (the caller plus threads - 1 workers).
    pub fn new(threads: usize) -> Pool {
        let n_workers = threads.max(1) - 1;
        let inner = Arc::new(Inner {
            epoch: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            n_tasks: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        });
        for _ in 0..n_workers {
            let inner = Arc::clone(&inner);
            std::thread::spawn(move || worker(&inner));
        }
        Pool { inner, n_workers, run_lock: Mutex::new(()) }
    }

    /// The process-wide pool: `FERRITE_THREADS` threads, else one per available core.
    pub fn global() -> &'static Pool {
        static POOL: OnceLock<Pool> = OnceLock::new();
        POOL.get_or_init(|| {
            let n = std::env::var("FERRITE_THREADS")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|&n: &usize| n > 0)
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            Pool::new(n)
        })
    }

    pub fn threads(&self) -> usize {
        self.n_workers + 1
    }

    /// Calls `f(i)` for every i in 0..n_tasks across the pool; returns when all are done.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        if self.n_workers == 0 || n_tasks == 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        // One job at a time (a second caller, e.g. another session's thread, waits).
        let _g = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.inner;
        // SAFETY: erases the lifetime of `f`; the pointer is used only until every worker
        // has decremented `active`, which this function waits for before returning.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(f) };
        // SAFETY: no worker reads `job` now: the previous run ended with active == 0.
        unsafe { *s.job.get() = Some(job) };
        s.n_tasks.store(n_tasks, Ordering::Relaxed);
        s.next.store(0, Ordering::Relaxed);
        s.active.store(self.n_workers, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.cv.notify_all();
        }
        loop {
            let i = s.next.fetch_add(1, Ordering::Relaxed);
            if i >= n_tasks {
                break;
            }
            f(i);
        }
        while s.active.load(Ordering::Acquire) != 0 {
            std::hint::spin_loop();
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a pool task panicked");
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::SeqCst);
        let _l = self.inner.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.inner.cv.notify_all();
    }
}

fn worker(s: &Inner) {
    // Epoch 0 is the state at creation: a job published before this thread started still
    // counts on it.
    let mut seen = 0;
    loop {
        // Wait for a new epoch: spin for SPIN, then sleep on the condvar.
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.shutdown.load(Ordering::Relaxed) {
                return;
            }
            if s.epoch.load(Ordering::Acquire) != seen {
                break;
            }
            spins += 1;
            if spins % 1024 == 0 && start.elapsed() > SPIN {
                let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleeping.fetch_add(1, Ordering::SeqCst);
                while s.epoch.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::SeqCst) {
                    l = s.cv.wait(l).unwrap_or_else(|e| e.into_inner());
                }
                s.sleeping.fetch_sub(1, Ordering::SeqCst);
                drop(l);
                spins = 0;
            } else {
                std::hint::spin_loop();
            }
        }
        seen = s.epoch.load(Ordering::Acquire);
        // SAFETY: the job was published before the epoch we observed, and stays valid
        // until we decrement `active` below.
        let job = unsafe { *s.job.get() };
        if let Some(job) = job {
            // SAFETY: see above.
            let f = unsafe { &*job };
            let n = s.n_tasks.load(Ordering::Relaxed);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
                let i = s.next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                f(i);
            }));
            if r.is_err() {
                s.panicked.store(true, Ordering::Relaxed);
            }
        }
        s.active.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_across_many_jobs() {
        let pool = Pool::new(3);
        for n in [1usize, 2, 5, 64, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..50 {
                pool.run(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 50), "n={n}");
        }
        std::thread::sleep(Duration::from_millis(5));
        let sum = AtomicUsize::new(0);
        pool.run(10, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 45);
    }
}
