//! Every WGSL variant the backend can compile, and every module of the LLM kernels
//! (`ferrite_wgpu::llm`), passes naga's validation and translates to Metal Shading Language
//! and SPIR-V. Needs no adapter: it runs in CI, where nothing can run Metal.

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
        let mut caps = naga::valid::Capabilities::empty();
        if src.starts_with(ferrite_wgpu::SUBGROUP_MARK) {
            caps |= naga::valid::Capabilities::SUBGROUP;
        }
        if src.contains("unpack2x16float(") {
            caps |= naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
        }
        let info = match naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .validate(&module)
        {
            Ok(i) => i,
            Err(e) => {
                failures.push(format!("{file}: validate: {}", e.emit_to_string(src)));
                continue;
            }
        };
        // Workgroup memory within the 16 KiB every WebGPU adapter offers; the LLM sampler's
        // 1024-thread variant within what the host asks of an adapter before taking it.
        let shared = ferrite_testing::wgsl::workgroup_bytes(&module);
        let limit = if file.contains("(1024 threads)") {
            ferrite_wgpu::llm::sample::SAMPLE_1024_WORKGROUP_BYTES
        } else {
            16384
        };
        if shared > limit {
            failures.push(format!("{file}: {shared} bytes of workgroup memory"));
        }
        for ep in &module.entry_points {
            assert!(
                entries.contains(&ep.name.as_str()),
                "{file}: entry point {} is not listed",
                ep.name
            );
            found.insert((file.clone(), ep.name.clone()));
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
            if !found.contains(&(file.clone(), e.to_string())) {
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

#[test]
fn quantized_product_modules_cover_every_format() {
    let sources = ferrite_wgpu::qmatrix::shader_sources();
    // 13 weight formats and 3 regrouped ones x 4 row variants (1 row with 1 or 2 outputs a
    // subgroup, 4 rows, 8 rows) x with and without the input's norm x f16 fields by bit
    // operations or unpack2x16float; the same again with 8-bit activations for the 10 formats
    // of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K, and for those 1 row with 4 outputs a
    // subgroup; and quantize_q8.
    assert_eq!(sources.len(), (16 * 2 + 10 * 2) * 4 * 2 + 10 * 2 * 2 + 1);
    for (name, _, src, f16_in_f32) in &sources {
        assert_eq!(
            *f16_in_f32,
            src.contains("return unpack2x16float("),
            "{name}: unpack2x16float where it is not asked for, or not where it is"
        );
        assert_eq!(*f16_in_f32, name.contains(" unpack"), "{name}");
    }
    let names: std::collections::HashSet<&String> = sources.iter().map(|s| &s.0).collect();
    assert_eq!(names.len(), sources.len(), "two modules share a cache key");
}

/// The LLM kernels' modules are among the sources above: ops, paged, and the device sampler
/// with 256 and 1024 threads.
#[test]
fn llm_shaders_are_validated_too() {
    let all = ferrite_wgpu::all_shader_sources().expect("shader sources");
    let llm = ferrite_wgpu::llm::shader_sources();
    assert_eq!(llm.len(), 4);
    for (name, _, src) in &llm {
        assert!(all.iter().any(|(n, _, s)| n == name && s == src), "{name}");
    }
}

#[test]
fn the_dynamic_array_check_finds_what_it_guards_against() {
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
