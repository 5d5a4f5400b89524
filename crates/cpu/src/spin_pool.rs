//! A small persistent thread pool for the many short parallel loops of one decode step
//! (about 200 per token). Workers spin briefly between jobs, then sleep, so back-to-back
//! jobs start in well under a microsecond instead of paying a wake-up each (rayon's cost
//! here measured larger than the work itself on 2 cores).
//!
//! Tasks are claimed one at a time through an atomic (epoch, task count, next index) word
//! (the count in the same word, so a worker that saw one job late can never pair its epoch
//! with the next job's count and claim from a job that is over), and a job is
//! complete when every task has *finished*, not when every worker has checked in: a worker
//! that is descheduled (a busy machine) costs nothing, the caller just runs more tasks.
//! A worker preempted while holding a task still stalls the caller; when such waits grow
//! past a third of the caller's own work time (an oversubscribed machine), jobs run on the
//! caller alone for the next 100 ms, then parallelism is tried again.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

type JobRef<'a> = &'a (dyn Fn(usize) + Sync);

struct Inner {
    /// Bits 32..64: job epoch; 16..32: its task count; 0..16: next unclaimed task index.
    state: AtomicU64,
    /// Points at the current job's `JobRef` (on the caller's stack), published before the
    /// epoch; dereferenced only after claiming a task of that epoch.
    job: AtomicPtr<u8>,
    done: AtomicUsize,
    sleeping: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

pub struct Pool {
    inner: Arc<Inner>,
    n_workers: usize,
    run_lock: Mutex<Adapt>,
}

/// Caller-side accounting for the contention fallback (guarded by `run_lock`).
struct Adapt {
    work_ns: u64,
    wait_ns: u64,
    solo_until: Option<Instant>,
}

const SPIN: Duration = Duration::from_micros(300);
/// How long jobs run on the caller alone after heavy waiting on preempted workers.
const SOLO: Duration = Duration::from_millis(100);

impl Inner {
    /// Claims the next task of epoch `epoch`; None when that job has no task left or a newer
    /// job replaced it.
    fn claim(&self, epoch: u64) -> Option<usize> {
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            let (n_tasks, next) = ((cur >> 16) & 0xFFFF, cur & 0xFFFF);
            if cur >> 32 != epoch || next >= n_tasks {
                return None;
            }
            match self.state.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(next as usize),
                Err(now) => cur = now,
            }
        }
    }

    /// Runs claimed tasks of `epoch` until none is left.
    fn work(&self, epoch: u64, job: *const JobRef<'_>) {
        while let Some(i) = self.claim(epoch) {
            // SAFETY: a task of `epoch` was claimed and is not finished, so the caller of
            // `run` for that epoch is still waiting and its `JobRef` is alive.
            let f = unsafe { *job };
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i)));
            if r.is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
            self.done.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Pool {
    /// A pool running jobs on `threads` threads in total (the caller plus threads - 1 workers).
    pub fn new(threads: usize) -> Pool {
        let n_workers = threads.max(1) - 1;
        let inner = Arc::new(Inner {
            state: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
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
        Pool {
            inner,
            n_workers,
            run_lock: Mutex::new(Adapt {
                work_ns: 0,
                wait_ns: 0,
                solo_until: None,
            }),
        }
    }

    /// The process-wide pool: `FERRITE_THREADS` threads (1..=1024; else ignored, see
    /// `env::check`), else one per available core.
    pub fn global() -> &'static Pool {
        static POOL: OnceLock<Pool> = OnceLock::new();
        POOL.get_or_init(|| {
            let n = crate::env::threads()
                .ok()
                .flatten()
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            Pool::new(n)
        })
    }

    pub fn threads(&self) -> usize {
        self.n_workers + 1
    }

    /// Calls `f(i)` for every i in 0..n_tasks across the pool; returns when all are done.
    /// Panics (after all tasks ended) if a task panicked.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if self.n_workers == 0 || n_tasks <= 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        // The state word holds 16-bit task counts: larger jobs run as several.
        const MAX_TASKS: usize = 0xFFFF;
        if n_tasks > MAX_TASKS {
            for s in (0..n_tasks).step_by(MAX_TASKS) {
                self.run((n_tasks - s).min(MAX_TASKS), &|i| f(s + i));
            }
            return;
        }
        // One job at a time (a second caller, e.g. another session's thread, waits).
        let mut adapt = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(until) = adapt.solo_until {
            if Instant::now() < until {
                (0..n_tasks).for_each(f);
                return;
            }
            adapt.solo_until = None;
        }
        let s = &*self.inner;
        let job: JobRef<'_> = f;
        let job_ptr: *const JobRef<'_> = &job;
        let epoch = ((s.state.load(Ordering::Relaxed) >> 32) + 1) & 0xFFFF_FFFF;
        s.done.store(0, Ordering::Relaxed);
        s.job.store(job_ptr as *mut u8, Ordering::Relaxed);
        s.state
            .store(epoch << 32 | (n_tasks as u64) << 16, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.cv.notify_all();
        }
        let t0 = Instant::now();
        s.work(epoch, job_ptr);
        let t1 = Instant::now();
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) < n_tasks {
            spins += 1;
            if spins > 1 << 12 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        adapt.work_ns += (t1 - t0).as_nanos() as u64;
        adapt.wait_ns += t1.elapsed().as_nanos() as u64;
        if adapt.work_ns > 20_000_000 {
            if adapt.wait_ns * 3 > adapt.work_ns {
                adapt.solo_until = Some(Instant::now() + SOLO);
            }
            adapt.work_ns = 0;
            adapt.wait_ns = 0;
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
    let mut seen = 0u64;
    loop {
        // Wait for a new epoch: spin for SPIN, then sleep on the condvar.
        let start = Instant::now();
        let mut spins = 0u32;
        let epoch = loop {
            if s.shutdown.load(Ordering::Relaxed) {
                return;
            }
            let e = s.state.load(Ordering::Acquire) >> 32;
            if e != seen {
                break e;
            }
            spins += 1;
            if spins.is_multiple_of(1024) && start.elapsed() > SPIN {
                let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleeping.fetch_add(1, Ordering::SeqCst);
                while s.state.load(Ordering::SeqCst) >> 32 == seen
                    && !s.shutdown.load(Ordering::SeqCst)
                {
                    l = s.cv.wait(l).unwrap_or_else(|e| e.into_inner());
                }
                s.sleeping.fetch_sub(1, Ordering::SeqCst);
            } else {
                std::hint::spin_loop();
            }
        };
        seen = epoch;
        // Published before the epoch (Release/Acquire through `state`); only dereferenced
        // after a successful claim of a task of this epoch, which succeeds only while that
        // job's `run` waits, that is before a newer job is published.
        let job = s.job.load(Ordering::Acquire) as *const JobRef<'_>;
        s.work(epoch, job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_across_many_jobs() {
        let pool = Pool::new(3);
        for n in [1usize, 2, 5, 64, 1000, 70_000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..50 {
                pool.run(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 50),
                "n={n}"
            );
        }
        std::thread::sleep(Duration::from_millis(5));
        let sum = AtomicUsize::new(0);
        pool.run(10, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 45);
    }

    /// Back-to-back jobs of different sizes on more threads than cores (workers preempted
    /// between seeing a job and claiming from it): every task of every job runs exactly
    /// once, within its `run`. A worker that paired an old epoch with the next job's task
    /// count once ran a task of the next job early and let its `run` return too soon.
    #[test]
    fn jobs_never_mix_under_preemption() {
        let pool = Pool::new(8);
        for round in 0..100_000usize {
            let n = 1 + round % 7;
            let hits: Vec<AtomicUsize> = (0..8).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            for (i, h) in hits.iter().enumerate() {
                assert_eq!(
                    h.load(Ordering::Relaxed),
                    usize::from(i < n),
                    "round {round} task {i}"
                );
            }
        }
    }
}
