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

/// Recording keeps of each input only what the op's backward rule reads, which depends on
/// which inputs require a gradient: every rule with one float input trainable at a time gives
/// that input the same gradient as with all of them trainable.
#[test]
fn each_input_trainable_alone_gets_the_same_gradient_on_cpu() {
    let (checked, failures) = ferrite_testing::grad_single_input_all(&ferrite_cpu::cpu());
    assert!(
        failures.is_empty(),
        "{} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked > 100, "only {checked} inputs checked");
    println!("{checked} inputs checked one at a time");
}
