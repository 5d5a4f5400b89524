//! The dynamic loss scaler on fp16 parameters (CPU): overflow found on the device, the step
//! skipped with parameters untouched, the scale backed off and grown again after the growth
//! interval, and training that recovers from a forced overflow.

use ferrite_train::{GradScaler, GradScalerConfig, Implementation};

mod common;

#[test]
fn grad_scaler_skips_backs_off_grows_and_recovers_from_a_forced_overflow() {
    for imp in [Implementation::Fused, Implementation::Composed] {
        let l = common::loss_scaled_training(&ferrite_cpu::cpu(), imp);
        let (first, before, last) = (l[0], l[18], l[59]);
        assert!(
            last < 0.02 * first && last < before,
            "{imp:?}: losses {first} -> {before} (before the overflow) -> {last}"
        );
    }
}

#[test]
fn grad_scaler_refuses_bad_settings() {
    let dev = ferrite_cpu::cpu();
    let base = GradScalerConfig::default();
    for (cfg, want) in [
        (
            GradScalerConfig {
                init_scale: 0.0,
                ..base
            },
            "init_scale must be finite and > 0, got 0",
        ),
        (
            GradScalerConfig {
                growth_factor: 1.0,
                ..base
            },
            "growth_factor must be finite and > 1, got 1",
        ),
        (
            GradScalerConfig {
                backoff_factor: 1.5,
                ..base
            },
            "backoff_factor must be in (0, 1), got 1.5",
        ),
        (
            GradScalerConfig {
                growth_interval: 0,
                ..base
            },
            "growth_interval must be at least 1",
        ),
    ] {
        let err = GradScaler::new(cfg, &dev)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(want), "{err}");
    }
}
