//! A model summary like torchinfo's / Keras's `summary()`: one row per module (dotted path,
//! type, output shape for a given input, parameters), then trainable / total counts.
//! Output shapes come from running the model once (without recording gradients): every
//! module of a `Sequential` chain gets its own shape (children run one after another, as
//! `Sequential::forward` does); modules inside any other module show `-`, since only their
//! parent's forward knows how they are called.

use crate::module::join;
use crate::Module;
use ferrite_core::{no_grad, Result, Tensor};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SummaryRow {
    /// Dotted path (`""` for the root).
    pub path: String,
    pub type_name: &'static str,
    pub output_shape: Option<Vec<usize>>,
    /// Elements of this module's own parameters (not its children's).
    pub params: usize,
    pub trainable: usize,
    pub depth: usize,
}

#[derive(Clone, Debug)]
pub struct Summary {
    pub rows: Vec<SummaryRow>,
    pub total: usize,
    pub trainable: usize,
}

/// Runs `m` on `input` and lists every module with its output shape and parameter counts.
pub fn summary(m: &dyn Module, input: &Tensor) -> Result<Summary> {
    let mut rows = Vec::new();
    no_grad(|| visit(m, "", 0, Some(input), &mut rows))?;
    let total = rows.iter().map(|r| r.params).sum();
    let trainable = rows.iter().map(|r| r.trainable).sum();
    Ok(Summary {
        rows,
        total,
        trainable,
    })
}

/// Adds the rows of `m` (at `path`) and below; with `input`, runs `m` on it and returns its
/// output.
fn visit(
    m: &dyn Module,
    path: &str,
    depth: usize,
    input: Option<&Tensor>,
    rows: &mut Vec<SummaryRow>,
) -> Result<Option<Tensor>> {
    let members = m.members();
    let params = members.params.iter().map(|(_, p)| p.elem_count()).sum();
    let trainable = members
        .params
        .iter()
        .filter(|(_, p)| p.requires_grad())
        .map(|(_, p)| p.elem_count())
        .sum();
    let at = rows.len();
    rows.push(SummaryRow {
        path: path.to_string(),
        type_name: m.type_name(),
        output_shape: None,
        params,
        trainable,
        depth,
    });
    let sequential = m.type_name() == "Sequential";
    let mut h = match (sequential, input) {
        (true, Some(x)) => Some(x.clone()),
        _ => None,
    };
    for (name, c) in members.children {
        let child_path = join(path, &name);
        let out = visit(c, &child_path, depth + 1, h.as_ref(), rows)
            .map_err(|e| crate::in_child(e, &name, c.type_name()))?;
        if sequential {
            h = out;
        }
    }
    let out = match (input, sequential) {
        (Some(_), true) => h,
        // Lists and dicts have no forward of their own.
        (Some(_), false) if matches!(m.type_name(), "ModuleList" | "ModuleDict") => None,
        (Some(x), false) => Some(m.forward(x)?),
        (None, _) => None,
    };
    rows[at].output_shape = out.as_ref().map(|t| t.dims().to_vec());
    Ok(out)
}

fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let label = |r: &SummaryRow| {
            let name = match r.path.rsplit('.').next() {
                Some(n) if !r.path.is_empty() => format!("{n} ({})", r.type_name),
                _ => r.type_name.to_string(),
            };
            format!("{}{name}", "  ".repeat(r.depth))
        };
        let shape = |r: &SummaryRow| match &r.output_shape {
            Some(s) => format!("{s:?}"),
            None => "-".to_string(),
        };
        let lw = self
            .rows
            .iter()
            .map(|r| label(r).len())
            .max()
            .unwrap_or(0)
            .max(12);
        let sw = self
            .rows
            .iter()
            .map(|r| shape(r).len())
            .max()
            .unwrap_or(0)
            .max(12);
        let width = lw + sw + 16;
        writeln!(
            f,
            "{:lw$}  {:sw$}  {:>12}",
            "Layer (type)", "Output Shape", "Param #"
        )?;
        writeln!(f, "{}", "=".repeat(width))?;
        for r in &self.rows {
            let p = if r.params == 0 {
                "-".to_string()
            } else {
                thousands(r.params)
            };
            writeln!(f, "{:lw$}  {:sw$}  {:>12}", label(r), shape(r), p)?;
        }
        writeln!(f, "{}", "=".repeat(width))?;
        writeln!(f, "Total params: {}", thousands(self.total))?;
        writeln!(f, "Trainable params: {}", thousands(self.trainable))?;
        write!(
            f,
            "Non-trainable params: {}",
            thousands(self.total - self.trainable)
        )
    }
}
