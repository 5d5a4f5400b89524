//! Gradient mode of the harness on the CPU: every differentiable op case, backward vs
//! central finite differences in float64.

#[test]
fn every_differentiable_case_matches_finite_differences_on_cpu() {
    let (checked, failures) = ferrite_testing::grad_check_all(&ferrite_cpu::cpu());
    assert!(
        failures.is_empty(),
        "{} gradient cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked > 200, "only {checked} gradient cases ran");
    println!("{checked} gradient cases");
}
