//! Checks on WGSL shaders (through naga) that the wgpu backends' tests share.

/// Bytes of workgroup memory `module` declares (every WebGPU adapter offers 16 KiB).
pub fn workgroup_bytes(module: &naga::Module) -> u32 {
    let mut layouter = naga::proc::Layouter::default();
    layouter
        .update(module.to_ctx())
        .unwrap_or_else(|e| unreachable!("a validated module lays out: {e}"));
    module
        .global_variables
        .iter()
        .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
        .map(|(_, g)| layouter[g.ty].size)
        .sum()
}

/// Array *values* indexed with a dynamic index, as `function: expression` lines. naga's SPIR-V
/// backend spills such a value to a function variable and stores the whole array again at
/// every access (`spill_to_internal_variable`), which the NVIDIA Vulkan driver keeps: a
/// per-value array returned by a function and indexed in a loop made every LLM product 1,024
/// local stores per weight unit and row. Arrays behind a pointer (`var`, workgroup, storage)
/// are fine.
pub fn dynamic_array_value_accesses(
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
