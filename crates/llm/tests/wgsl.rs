//! Every WGSL module of the LLM engine's wgpu kernel set (`model/wgpu/*.wgsl`) passes naga's
//! validation and translates to Metal Shading Language and SPIR-V (the products it records
//! are ferrite-wgpu's, checked by that crate's naga test). Needs no adapter: it runs in CI,
//! where nothing can run Metal.

use ferrite_testing::wgsl::dynamic_array_value_accesses;

#[test]
fn every_llm_shader_validates_and_translates_to_msl_and_spirv() {
    let sources = ferrite_llm::model::wgpu::shader_sources();
    // ops, paged, and sample (the device sampler) with 256 and 1024 threads.
    assert_eq!(sources.len(), 4);
    let mut failures = Vec::new();
    for (name, entries, src) in &sources {
        let module = match naga::front::wgsl::parse_str(src) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{name}: parse: {}", e.emit_to_string(src)));
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
                failures.push(format!("{name}: validate: {}", e.emit_to_string(src)));
                continue;
            }
        };
        // Workgroup memory within the 16 KiB every WebGPU adapter offers; the sampler's
        // 1024-thread variant within what the host asks of an adapter before taking it.
        let shared = ferrite_testing::wgsl::workgroup_bytes(&module);
        let limit = if name.contains("(1024 threads)") {
            ferrite_llm::model::wgpu::SAMPLE_1024_WORKGROUP_BYTES
        } else {
            16384
        };
        if shared > limit {
            failures.push(format!("{name}: {shared} bytes of workgroup memory"));
        }
        let found: Vec<&str> = module
            .entry_points
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        for e in *entries {
            if !found.contains(e) {
                failures.push(format!("{name}: no entry point {e}"));
            }
        }
        for e in &found {
            if !entries.contains(e) {
                failures.push(format!("{name}: entry point {e} is not listed"));
            }
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
            Ok((text, _)) => {
                if !text.contains("kernel void") {
                    failures.push(format!("{name}: no kernel in MSL"));
                }
            }
            Err(e) => failures.push(format!("{name}: msl: {e}")),
        }
        if let Err(e) =
            naga::back::spv::write_vec(&module, &info, &naga::back::spv::Options::default(), None)
        {
            failures.push(format!("{name}: spir-v: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} modules failed:\n{}",
        failures.len(),
        sources.len(),
        failures.join("\n")
    );
}

#[test]
fn no_llm_shader_indexes_an_array_value_dynamically() {
    let mut found = Vec::new();
    for (name, _, src) in ferrite_llm::model::wgpu::shader_sources() {
        let module = naga::front::wgsl::parse_str(&src).expect("parses");
        let info = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::empty(),
        )
        .validate(&module)
        .expect("validates");
        found.extend(
            dynamic_array_value_accesses(&module, &info)
                .into_iter()
                .map(|s| format!("{name}: {s}")),
        );
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
    // The check finds the pattern it guards against.
    let bad = "fn f(i: u32) -> f32 {\n    let w = array<f32, 4>(1.0, 2.0, 3.0, 4.0);\n    return w[i];\n}\n";
    let module = naga::front::wgsl::parse_str(bad).expect("parses");
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::empty(),
    )
    .validate(&module)
    .expect("validates");
    assert_eq!(dynamic_array_value_accesses(&module, &info).len(), 1);
}
