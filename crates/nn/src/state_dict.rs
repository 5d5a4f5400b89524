//! State dicts with PyTorch's names and layouts: `state_dict()` lists every parameter and
//! buffer module by module (own parameters, own buffers, then children, as PyTorch orders
//! them); `load_state_dict` writes values into the existing buffers in place (`copy_`), so
//! loading never moves a parameter.

use crate::module::join;
use crate::safetensors::{save, SafetensorsFile};
use crate::{Buffer, Module, Parameter};
use ferrite_core::{Error, Result, Tensor};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Every parameter and buffer of `m` by dotted path, as tensors sharing their buffers.
pub fn state_dict(m: &dyn Module) -> Vec<(String, Tensor)> {
    let mut out = Vec::new();
    collect(m, "", &mut out);
    out
}

fn collect(m: &dyn Module, path: &str, out: &mut Vec<(String, Tensor)>) {
    let members = m.members();
    for (n, p) in &members.params {
        out.push((join(path, n), p.tensor().detach()));
    }
    for (n, b) in &members.buffers {
        out.push((join(path, n), b.tensor().clone()));
    }
    for (n, c) in members.children {
        collect(c, &join(path, &n), out);
    }
}

/// What a load found besides the keys it loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Keys of the module that the state dict lacks.
    pub missing: Vec<String>,
    /// Keys of the state dict that the module lacks.
    pub unexpected: Vec<String>,
    /// Keys whose shapes differ: (key, module shape, state-dict shape).
    pub misshapen: Vec<(String, Vec<usize>, Vec<usize>)>,
}

impl LoadReport {
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty() && self.misshapen.is_empty()
    }
}

impl std::fmt::Display for LoadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if !self.missing.is_empty() {
            parts.push(format!("missing keys: {}", self.missing.join(", ")));
        }
        if !self.unexpected.is_empty() {
            parts.push(format!("unexpected keys: {}", self.unexpected.join(", ")));
        }
        if !self.misshapen.is_empty() {
            let m: Vec<String> = self
                .misshapen
                .iter()
                .map(|(k, want, got)| format!("{k} (model {want:?}, state dict {got:?})"))
                .collect();
            parts.push(format!("shape mismatches: {}", m.join(", ")));
        }
        f.write_str(&parts.join("; "))
    }
}

enum Slot<'a> {
    Param(&'a Parameter),
    Buffer(&'a Buffer),
}

fn slots<'a>(m: &'a dyn Module, path: &str, out: &mut Vec<(String, Slot<'a>)>) {
    let members = m.members();
    for (n, p) in members.params {
        out.push((join(path, &n), Slot::Param(p)));
    }
    for (n, b) in members.buffers {
        out.push((join(path, &n), Slot::Buffer(b)));
    }
    for (n, c) in members.children {
        slots(c, &join(path, &n), out);
    }
}

/// Loads `state` into `m` in place (values cast to each parameter's dtype and copied to its
/// device). With `strict`, any missing, unexpected or misshapen key is an error listing all
/// of them, and nothing is written; without, the matching keys load and the rest is returned.
/// Misshapen keys are never loaded.
pub fn load_state_dict(
    m: &dyn Module,
    state: &[(String, Tensor)],
    strict: bool,
) -> Result<LoadReport> {
    let keys: Vec<(String, Vec<usize>)> = state
        .iter()
        .map(|(k, t)| (k.clone(), t.dims().to_vec()))
        .collect();
    load_with(m, &keys, strict, |i, dev| state[i].1.to_device(dev))
}

/// The load itself over a list of (key, shape); `fetch(i, device)` gives entry i's values on
/// a device, called only for keys that load, after every key has been checked.
fn load_with(
    m: &dyn Module,
    keys: &[(String, Vec<usize>)],
    strict: bool,
    fetch: impl Fn(usize, &ferrite_core::Device) -> Result<Tensor>,
) -> Result<LoadReport> {
    let mut targets = Vec::new();
    slots(m, "", &mut targets);
    let given: HashMap<&str, usize> = keys
        .iter()
        .enumerate()
        .map(|(i, (k, _))| (k.as_str(), i))
        .collect();
    let mut report = LoadReport::default();
    let mut plan = Vec::new();
    for (k, slot) in &targets {
        let dims = match slot {
            Slot::Param(p) => p.dims().to_vec(),
            Slot::Buffer(b) => b.shape().dims().to_vec(),
        };
        match given.get(k.as_str()) {
            None => report.missing.push(k.clone()),
            Some(&i) if keys[i].1 != dims => {
                report.misshapen.push((k.clone(), dims, keys[i].1.clone()))
            }
            Some(&i) => plan.push((slot, i)),
        }
    }
    let known: HashSet<&str> = targets.iter().map(|(k, _)| k.as_str()).collect();
    report.unexpected = keys
        .iter()
        .filter(|(k, _)| !known.contains(k.as_str()))
        .map(|(k, _)| k.clone())
        .collect();
    if strict && !report.is_clean() {
        return Err(Error::module(
            m.type_name(),
            format!("load_state_dict (strict): {report}"),
        ));
    }
    for (slot, i) in plan {
        let in_key = |e: Error| {
            Error::module(
                m.type_name(),
                format!("load_state_dict: {}: {e}", keys[i].0),
            )
        };
        match slot {
            Slot::Param(p) => p.copy_(&fetch(i, p.device())?).map_err(in_key)?,
            Slot::Buffer(b) => b.copy_(&fetch(i, b.device())?).map_err(in_key)?,
        }
    }
    Ok(report)
}

/// Writes `m`'s state dict as a safetensors file.
pub fn save_state_dict(m: &dyn Module, path: impl AsRef<Path>) -> Result<()> {
    save(&state_dict(m), path)
}

/// Loads a safetensors file (e.g. from `safetensors.torch.save_file(model.state_dict(), f)`)
/// into `m` in place; see `load_state_dict`. Keys and shapes are checked from the validated
/// header before any tensor data is read; each tensor is then read onto its slot's device.
pub fn load_state_dict_file(
    m: &dyn Module,
    path: impl AsRef<Path>,
    strict: bool,
) -> Result<LoadReport> {
    let f = SafetensorsFile::open(path)?;
    let keys: Vec<(String, Vec<usize>)> = f
        .entries()
        .iter()
        .map(|e| (e.name.clone(), e.shape.clone()))
        .collect();
    load_with(m, &keys, strict, |i, dev| f.load(&f.entries()[i], dev))
}
