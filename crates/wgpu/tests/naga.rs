//! Every WGSL variant the backend can compile passes naga's validation and translates to Metal
//! Shading Language and SPIR-V. Needs no adapter: it runs in CI, where nothing can run Metal.

use ferrite_testing::wgsl::dynamic_array_value_accesses;
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
        // Subgroup variants are compiled only where the adapter has subgroups.
        let caps = if src.starts_with(ferrite_wgpu::SUBGROUP_MARK) {
            naga::valid::Capabilities::SUBGROUP
        } else {
            naga::valid::Capabilities::empty()
        };
        let info = match naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
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
