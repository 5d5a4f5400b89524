//! The `Module` trait: a layer with parameters, buffers and child modules addressed by
//! PyTorch-style dotted paths (`layers.0.attn.in_proj_weight`), a train/eval mode, and moves
//! across devices and dtypes. `ModuleExt` adds the walks over the whole tree to every module,
//! boxed ones included.

use crate::{Buffer, Parameter};
use ferrite_core::{DType, Device, Error, Result, Tensor};
use std::sync::atomic::{AtomicU64, Ordering};

/// A module's own members, in registration order (PyTorch's `_parameters`, `_buffers`,
/// `_modules`); names are local (`weight`, `0`, `attn`).
#[derive(Default)]
pub struct Members<'a> {
    pub params: Vec<(String, &'a Parameter)>,
    pub buffers: Vec<(String, &'a Buffer)>,
    pub children: Vec<(String, &'a dyn Module)>,
    /// The module's train/eval flag, for modules whose forward depends on it.
    pub training: Option<bool>,
    /// The draw counter of a module whose random masks come from a stream of its own
    /// (Dropout, RNN dropout): checkpoints keep it so a resumed run draws the same masks.
    pub rng_calls: Option<&'a AtomicU64>,
}

/// Mutable access to a module's own members (same names and order as `Members`).
#[derive(Default)]
pub struct MembersMut<'a> {
    pub params: Vec<(String, &'a mut Parameter)>,
    pub buffers: Vec<(String, &'a mut Buffer)>,
    pub children: Vec<(String, &'a mut dyn Module)>,
    pub training: Option<&'a mut bool>,
}

/// A layer. Object safe: containers hold `Box<dyn Module>`.
///
/// Implementors list their members in `members`/`members_mut` (same names, same order);
/// everything else (paths, modes, moves, state dicts) is derived from those by `ModuleExt`.
/// Errors a module returns name its type (`Error::module("Linear", ...)`); containers prefix
/// the child's path, so a user sees `features.3 (Conv2d): expected 64 input channels, ...`.
pub trait Module: Send + Sync {
    /// The PyTorch class name (`Linear`, `Sequential`).
    fn type_name(&self) -> &'static str;

    /// Applies the module to one input.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    fn members(&self) -> Members<'_> {
        Members::default()
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        MembersMut::default()
    }
}

/// Walks over a module tree; implemented for every `Module`, `dyn Module` included.
pub trait ModuleExt: Module {
    /// Every parameter with its dotted path, depth first in registration order (PyTorch's
    /// `named_parameters()`).
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        let mut out = Vec::new();
        walk(self.as_dyn(), "", &mut |path, m| {
            for (n, p) in m.params {
                out.push((join(path, &n), p.clone()));
            }
        });
        out
    }

    /// Every buffer with its dotted path (PyTorch's `named_buffers()`).
    fn named_buffers(&self) -> Vec<(String, Buffer)> {
        let mut out = Vec::new();
        walk(self.as_dyn(), "", &mut |path, m| {
            for (n, b) in m.buffers {
                out.push((join(path, &n), b.clone()));
            }
        });
        out
    }

    /// Every module with its path (`""` for the root) and type, depth first.
    fn named_modules(&self) -> Vec<(String, &'static str)> {
        let mut out = Vec::new();
        named_modules_into(self.as_dyn(), "", &mut out);
        out
    }

    fn parameters(&self) -> Vec<Parameter> {
        self.named_parameters()
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }

    /// The gradient of every parameter that has one, by path.
    fn named_grads(&self) -> Vec<(String, Tensor)> {
        self.named_parameters()
            .into_iter()
            .filter_map(|(n, p)| p.grad().map(|g| (n, g)))
            .collect()
    }

    fn zero_grad(&self) {
        for p in self.parameters() {
            p.zero_grad();
        }
    }

    /// The random-draw state of every module that owns a mask stream, by path (its draw
    /// count); with `init::rng_state`, what makes a resumed run with dropout bit-exact.
    fn rng_states(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        walk(self.as_dyn(), "", &mut |path, m| {
            if let Some(c) = m.rng_calls {
                out.push((path.to_string(), c.load(Ordering::Relaxed)));
            }
        });
        out
    }

    /// Restores `rng_states`; a path naming no module with a mask stream is an error listing
    /// every such path.
    fn load_rng_states(&self, states: &[(String, u64)]) -> Result<()> {
        let mut found = vec![false; states.len()];
        walk(self.as_dyn(), "", &mut |path, m| {
            if let Some(c) = m.rng_calls {
                if let Some(i) = states.iter().position(|(p, _)| p == path) {
                    c.store(states[i].1, Ordering::Relaxed);
                    found[i] = true;
                }
            }
        });
        let unknown: Vec<&str> = states
            .iter()
            .zip(&found)
            .filter(|(_, f)| !**f)
            .map(|((p, _), _)| p.as_str())
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(Error::module(
                self.type_name(),
                format!("load_rng_states: no module with a mask stream at {unknown:?}"),
            ))
        }
    }

    /// (trainable, total) parameter element counts.
    fn num_parameters(&self) -> (usize, usize) {
        self.parameters().iter().fold((0, 0), |(t, a), p| {
            let n = p.elem_count();
            (t + if p.requires_grad() { n } else { 0 }, a + n)
        })
    }

    /// Sets training mode on every module of the tree (dropout active, batch norm using and
    /// updating batch statistics).
    fn train(&mut self) {
        set_mode(self.as_dyn_mut(), true);
    }

    /// Sets evaluation mode on every module of the tree.
    fn eval(&mut self) {
        set_mode(self.as_dyn_mut(), false);
    }

    /// The module's mode: its own flag, else that of its first child that has one; `true`
    /// (PyTorch's default) when no module below keeps a flag.
    fn is_training(&self) -> bool {
        mode_of(self.as_dyn()).unwrap_or(true)
    }

    /// Moves every parameter and buffer to `device` (new buffers there).
    fn to_device(&mut self, device: &Device) -> Result<()> {
        walk_mut(self.as_dyn_mut(), &mut |m| {
            for (_, p) in m.params {
                p.to_device(device)?;
            }
            for (_, b) in m.buffers {
                b.to_device(device)?;
            }
            Ok(())
        })
    }

    /// Casts every parameter and float buffer to a float `dtype` (integer buffers keep theirs).
    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        walk_mut(self.as_dyn_mut(), &mut |m| {
            for (_, p) in m.params {
                p.to_dtype(dtype)?;
            }
            for (_, b) in m.buffers {
                b.to_dtype(dtype)?;
            }
            Ok(())
        })
    }

    #[doc(hidden)]
    fn as_dyn(&self) -> &dyn Module;
    #[doc(hidden)]
    fn as_dyn_mut(&mut self) -> &mut dyn Module;
}

impl<M: Module> ModuleExt for M {
    fn as_dyn(&self) -> &dyn Module {
        self
    }
    fn as_dyn_mut(&mut self) -> &mut dyn Module {
        self
    }
}

impl ModuleExt for dyn Module {
    fn as_dyn(&self) -> &dyn Module {
        self
    }
    fn as_dyn_mut(&mut self) -> &mut dyn Module {
        self
    }
}

/// `prefix.name`, or `name` at the root.
pub(crate) fn join(prefix: &str, name: &str) -> String {
    match prefix.is_empty() {
        true => name.to_string(),
        false => format!("{prefix}.{name}"),
    }
}

fn walk(m: &dyn Module, path: &str, f: &mut dyn FnMut(&str, Members<'_>)) {
    let members = m.members();
    let children: Vec<(String, &dyn Module)> = members
        .children
        .iter()
        .map(|(n, c)| (n.clone(), *c))
        .collect();
    f(path, members);
    for (n, c) in children {
        walk(c, &join(path, &n), f);
    }
}

fn walk_mut(m: &mut dyn Module, f: &mut dyn FnMut(MembersMut<'_>) -> Result<()>) -> Result<()> {
    let MembersMut {
        params,
        buffers,
        children,
        training,
    } = m.members_mut();
    f(MembersMut {
        params,
        buffers,
        children: Vec::new(),
        training,
    })?;
    for (_, c) in children {
        walk_mut(c, f)?;
    }
    Ok(())
}

fn named_modules_into(m: &dyn Module, path: &str, out: &mut Vec<(String, &'static str)>) {
    out.push((path.to_string(), m.type_name()));
    for (n, c) in m.members().children {
        named_modules_into(c, &join(path, &n), out);
    }
}

fn set_mode(m: &mut dyn Module, training: bool) {
    let _ = walk_mut(m, &mut |mm| {
        if let Some(t) = mm.training {
            *t = training;
        }
        Ok(())
    });
}

fn mode_of(m: &dyn Module) -> Option<bool> {
    let members = m.members();
    if let Some(t) = members.training {
        return Some(t);
    }
    members.children.iter().find_map(|(_, c)| mode_of(*c))
}

/// Runs a child's forward, prefixing its errors with its path: a child's own `Module`
/// error gets `name.` in front of its path; any other error is attributed to the child.
pub fn forward_child(name: &str, child: &dyn Module, x: &Tensor) -> Result<Tensor> {
    child
        .forward(x)
        .map_err(|e| in_child(e, name, child.type_name()))
}

/// `e`, raised inside child `name` of type `module`, as seen from the parent.
pub fn in_child(e: Error, name: &str, module: &'static str) -> Error {
    match e {
        Error::Module {
            path,
            module: m,
            msg,
        } => Error::Module {
            path: match path.is_empty() {
                true => name.to_string(),
                false => join(name, &path),
            },
            module: m,
            msg,
        },
        other => Error::Module {
            path: name.to_string(),
            module,
            msg: other.to_string(),
        },
    }
}
