//! Every WGSL variant the backend can compile passes naga's validation and translates to Metal
//! Shading Language and SPIR-V. Needs no adapter: it runs in CI, where nothing can run Metal.

#[test]
fn every_shader_validates_and_translates_to_msl_and_spirv() {
    let sources = ferrite_wgpu::all_shader_sources().expect("shader sources");
    assert!(sources.len() > 100, "{} variants", sources.len());
    let mut failures = Vec::new();
    let mut found = std::collections::HashSet::new();
    for (file, entries, src) in &sources {
        let module = match naga::front::wgsl::parse_str(src) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{file}: parse: {}", e.emit_to_string(src)));
                continue;
            }
        };
        let info = match naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::empty(),
        )
        .validate(&module)
        {
            Ok(i) => i,
            Err(e) => {
                failures.push(format!("{file}: validate: {}", e.emit_to_string(src)));
                continue;
            }
        };
        for ep in &module.entry_points {
            assert!(
                entries.contains(&ep.name.as_str()),
                "{file}: entry point {} is not listed",
                ep.name
            );
            found.insert((*file, ep.name.clone()));
        }
        let msl = naga::back::msl::Options {
            lang_version: (2, 1),
            fake_missing_bindings: true,
            ..Default::default()
        };
        match naga::back::msl::write_string(
            &module,
            &info,
            &msl,
            &naga::back::msl::PipelineOptions::default(),
        ) {
            Ok((text, _)) => assert!(text.contains("kernel void"), "{file}: no kernel in MSL"),
            Err(e) => failures.push(format!("{file}: msl: {e}")),
        }
        if let Err(e) =
            naga::back::spv::write_vec(&module, &info, &naga::back::spv::Options::default(), None)
        {
            failures.push(format!("{file}: spir-v: {e}"));
        }
        for a in dynamic_array_value_accesses(&module, &info) {
            failures.push(format!("{file}: an array value indexed dynamically: {a}"));
        }
    }
    for (file, entries, _) in &sources {
        for e in *entries {
            if !found.contains(&(*file, e.to_string())) {
                failures.push(format!("{file}: no variant has entry point {e}"));
            }
        }
    }
    failures.dedup();
    assert!(
        failures.is_empty(),
        "{} of {} variants failed:\n{}",
        failures.len(),
        sources.len(),
        failures.join("\n")
    );
}

/// Array *values* indexed with a dynamic index (`function: expression`): naga's SPIR-V backend
/// stores the whole array to a temporary at every such access, which the NVIDIA Vulkan driver
/// keeps (see the LLM kernel set's `wgsl` test); arrays behind a pointer are fine.
fn dynamic_array_value_accesses(
    module: &naga::Module,
    info: &naga::valid::ModuleInfo,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |name: &str, f: &naga::Function, fi: &naga::valid::FunctionInfo| {
        for (h, e) in f.expressions.iter() {
            if let naga::Expression::Access { base, .. } = *e {
                if let naga::TypeInner::Array { .. } = fi[base].ty.inner_with(&module.types) {
                    out.push(format!("{name}: {e:?} (expression {h:?})"));
                }
            }
        }
    };
    for (h, f) in module.functions.iter() {
        check(f.name.as_deref().unwrap_or("?"), f, &info[h]);
    }
    for (i, ep) in module.entry_points.iter().enumerate() {
        check(&ep.name, &ep.function, info.get_entry_point(i));
    }
    out
}
