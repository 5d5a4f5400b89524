//! A test runner for binaries with `harness = false` (the GPU tests): libtest cannot decide at
//! run time that a test is skipped, and CI must see each GPU test reported skipped by name.
//!
//! Each test returns `None` when it ran, or the reason it was skipped; a panic is a failure.
//! The first non-flag argument filters tests by substring, like libtest; `--skip SUBSTRING`
//! (repeatable) leaves out the tests whose names contain it.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

pub struct Runner {
    filter: Option<String>,
    skip: Vec<String>,
    passed: usize,
    skipped: usize,
    failed: Vec<String>,
}

impl Runner {
    pub fn from_args() -> Runner {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let mut skip = Vec::new();
        let mut filter = None;
        let mut i = 0;
        while i < args.len() {
            if args[i] == "--skip" {
                skip.extend(args.get(i + 1).cloned());
                i += 2;
                continue;
            }
            if filter.is_none() && !args[i].starts_with('-') {
                filter = Some(args[i].clone());
            }
            i += 1;
        }
        Runner {
            filter,
            skip,
            passed: 0,
            skipped: 0,
            failed: Vec::new(),
        }
    }

    /// Runs `f` as test `name` (unless filtered out) and prints its outcome.
    pub fn run(&mut self, name: &str, f: impl FnOnce() -> Option<String>) {
        if self
            .filter
            .as_ref()
            .is_some_and(|s| !name.contains(s.as_str()))
            || self.skip.iter().any(|s| name.contains(s.as_str()))
        {
            return;
        }
        let t = Instant::now();
        match std::panic::catch_unwind(AssertUnwindSafe(f)) {
            Ok(None) => {
                println!("test {name} ... ok ({:.2} s)", t.elapsed().as_secs_f64());
                self.passed += 1;
            }
            Ok(Some(why)) => {
                println!("test {name} ... skipped: {why}");
                self.skipped += 1;
            }
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                println!("test {name} ... FAILED\n{msg}");
                self.failed.push(name.to_string());
            }
        }
    }

    /// Reports test `name` skipped for `why` without running it.
    pub fn skip(&mut self, name: &str, why: &str) {
        self.run(name, || Some(why.to_string()));
    }

    /// Prints the summary line for `suite` and exits non-zero when a test failed.
    pub fn finish(self, suite: &str) {
        println!(
            "\n{suite}: {} passed, {} failed, {} skipped",
            self.passed,
            self.failed.len(),
            self.skipped
        );
        if !self.failed.is_empty() {
            println!("failed: {}", self.failed.join(", "));
            std::process::exit(1);
        }
    }
}
