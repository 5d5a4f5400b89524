//! Containers: `Sequential` (children applied in order), `ModuleList` and `ModuleDict`
//! (children held by index or name; forward belongs to the module that owns them).

use crate::module::forward_child;
use crate::{Members, MembersMut, Module};
use ferrite_core::{Error, Result, Tensor};

/// Children applied in order; children are named `0`, `1`, ... as in PyTorch.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Appends a layer (builder style).
    pub fn with(mut self, m: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(m));
        self
    }

    pub fn push(&mut self, m: Box<dyn Module>) {
        self.layers.push(m);
    }

    pub fn len(&self) -> usize {
        self.layers.len()
    }
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
    pub fn get(&self, i: usize) -> Option<&dyn Module> {
        self.layers.get(i).map(|m| &**m)
    }
}

impl Module for Sequential {
    fn type_name(&self) -> &'static str {
        "Sequential"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, m) in self.layers.iter().enumerate() {
            h = forward_child(&i.to_string(), &**m, &h)?;
        }
        Ok(h)
    }

    fn members(&self) -> Members<'_> {
        Members {
            children: self
                .layers
                .iter()
                .enumerate()
                .map(|(i, m)| (i.to_string(), &**m))
                .collect(),
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        MembersMut {
            children: self
                .layers
                .iter_mut()
                .enumerate()
                .map(|(i, m)| (i.to_string(), &mut **m as &mut dyn Module))
                .collect(),
            ..MembersMut::default()
        }
    }
}

/// Children by index (`0`, `1`, ...), without a forward of its own.
#[derive(Default)]
pub struct ModuleList {
    items: Vec<Box<dyn Module>>,
}

impl ModuleList {
    pub fn new() -> ModuleList {
        ModuleList::default()
    }
    pub fn push(&mut self, m: Box<dyn Module>) {
        self.items.push(m);
    }
    pub fn len(&self) -> usize {
        self.items.len()
    }
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
    pub fn get(&self, i: usize) -> Option<&dyn Module> {
        self.items.get(i).map(|m| &**m)
    }
    pub fn iter(&self) -> impl Iterator<Item = &dyn Module> {
        self.items.iter().map(|m| &**m)
    }
}

impl FromIterator<Box<dyn Module>> for ModuleList {
    fn from_iter<I: IntoIterator<Item = Box<dyn Module>>>(iter: I) -> ModuleList {
        ModuleList {
            items: iter.into_iter().collect(),
        }
    }
}

impl Module for ModuleList {
    fn type_name(&self) -> &'static str {
        "ModuleList"
    }

    /// A list has no forward of its own (as in PyTorch): an error naming the alternatives.
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Err(Error::module(
            "ModuleList",
            "has no forward: iterate over its modules, or use Sequential",
        ))
    }

    fn members(&self) -> Members<'_> {
        Members {
            children: self
                .items
                .iter()
                .enumerate()
                .map(|(i, m)| (i.to_string(), &**m))
                .collect(),
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        MembersMut {
            children: self
                .items
                .iter_mut()
                .enumerate()
                .map(|(i, m)| (i.to_string(), &mut **m as &mut dyn Module))
                .collect(),
            ..MembersMut::default()
        }
    }
}

/// Children by name, in insertion order, without a forward of its own.
#[derive(Default)]
pub struct ModuleDict {
    items: Vec<(String, Box<dyn Module>)>,
}

impl ModuleDict {
    pub fn new() -> ModuleDict {
        ModuleDict::default()
    }

    /// Inserts `m` under `name`, replacing a module of that name in place (as PyTorch does).
    /// Names must be non-empty and contain no `.`.
    pub fn insert(&mut self, name: &str, m: Box<dyn Module>) -> Result<()> {
        if name.is_empty() || name.contains('.') {
            return Err(Error::module(
                "ModuleDict",
                format!("invalid key {name:?}: keys are non-empty and contain no '.'"),
            ));
        }
        match self.items.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = m,
            None => self.items.push((name.to_string(), m)),
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&dyn Module> {
        self.items
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, m)| &**m)
    }
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.items.iter().map(|(n, _)| n.as_str())
    }
    pub fn len(&self) -> usize {
        self.items.len()
    }
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl Module for ModuleDict {
    fn type_name(&self) -> &'static str {
        "ModuleDict"
    }

    /// A dict has no forward of its own (as in PyTorch): an error naming the alternative.
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Err(Error::module(
            "ModuleDict",
            "has no forward: look its modules up by name",
        ))
    }

    fn members(&self) -> Members<'_> {
        Members {
            children: self.items.iter().map(|(n, m)| (n.clone(), &**m)).collect(),
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        MembersMut {
            children: self
                .items
                .iter_mut()
                .map(|(n, m)| (n.clone(), &mut **m as &mut dyn Module))
                .collect(),
            ..MembersMut::default()
        }
    }
}
