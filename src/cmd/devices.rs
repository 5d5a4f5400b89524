//! `ferrite devices`: the CPU, CUDA devices and wgpu adapters this machine has.

use clap::Args as ClapArgs;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let cuda = ferrite_cuda::device_count();
    let adapters = ferrite_wgpu::adapters();
    if args.json {
        let list: Vec<serde_json::Value> = adapters
            .iter()
            .map(|a| {
                serde_json::json!({
                    "device": format!("wgpu:{}", a.index),
                    "name": a.name,
                    "backend": a.backend,
                    "type": a.device_type,
                    "driver": a.driver,
                    "max_buffer_size": a.max_buffer_size,
                    "max_storage_binding": a.max_storage_binding,
                    "max_workgroup_storage": a.max_workgroup_storage,
                    "shader_f16": a.shader_f16,
                    "f16_in_f32": a.f16_in_f32,
                    "subgroups": a.subgroups,
                    "features": a.features,
                })
            })
            .collect();
        let v = serde_json::json!({
            "cpu": true,
            "cuda_devices": cuda,
            "wgpu_adapters": list,
            "wgpu_default": ferrite_wgpu::default_adapter().map(|i| format!("wgpu:{i}")),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("cpu");
    for i in 0..cuda {
        match ferrite_cuda::CudaDevice::new(i) {
            Ok(d) => {
                let (maj, min) = d.compute_capability();
                println!("cuda:{i}  {} (sm_{maj}{min})", d.name());
            }
            Err(e) => println!("cuda:{i}  (failed to open: {e})"),
        }
    }
    if cuda == 0 {
        println!("(no CUDA device)");
    }
    if adapters.is_empty() {
        println!("(no wgpu adapter: no Vulkan, Metal or DX12 driver was found)");
    }
    let default = ferrite_wgpu::default_adapter();
    for a in &adapters {
        println!(
            "wgpu:{}  {} ({}, {}){}",
            a.index,
            a.name,
            a.backend,
            a.device_type,
            if default == Some(a.index) {
                "  [--device wgpu]"
            } else {
                ""
            }
        );
        println!("    driver: {}", a.driver);
        println!(
            "    memory: largest buffer {} MiB, largest storage binding {} MiB, workgroup memory {} KiB (wgpu reports no total)",
            a.max_buffer_size >> 20,
            a.max_storage_binding >> 20,
            a.max_workgroup_storage >> 10
        );
        println!(
            "    shader-f16: {}, unpack2x16float: {}, subgroups: {}",
            yes(a.shader_f16),
            yes(a.f16_in_f32),
            yes(a.subgroups)
        );
        println!("    features: {}", a.features);
    }
    Ok(())
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
