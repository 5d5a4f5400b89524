//! `ferrite inspect FILE [--json]`: a GGUF file's metadata (long arrays and strings
//! summarized), its tensor table (name, type, shape, bytes, offset) and totals per type; for a
//! `.safetensors` file, its tensor table
//! (name, dtype, shape, bytes) and totals.
//! A malformed file is one `error:` line and exit code 1 (from `main`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use ferrite_gguf::{Array, GgmlType, GgufFile, Value};
use serde_json::{json, Value as Json};

#[derive(clap::Args)]
pub struct Args {
    /// The .gguf file (for a split model, any of its name-0000K-of-0000N.gguf shards), or a
    /// .safetensors file.
    pub file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Array elements shown before the rest is summarized as a count.
const ARRAY_HEAD: usize = 8;
/// Characters of a string value shown before the rest is summarized as a length.
const STRING_HEAD: usize = 160;

/// Whether `path` names a safetensors file (by its extension; anything else is read as GGUF).
fn is_safetensors(path: &std::path::Path) -> bool {
    path.extension().is_some_and(|e| e == "safetensors")
}

fn safetensors_report(path: &std::path::Path, as_json: bool) -> anyhow::Result<String> {
    use ferrite_nn::safetensors::SafetensorsFile;
    let f = SafetensorsFile::open(path).with_context(|| format!("inspect {}", path.display()))?;
    let size = std::fs::metadata(path)?.len();
    let elems = |s: &[usize]| s.iter().product::<usize>();
    if as_json {
        let tensors: Vec<Json> = f
            .entries()
            .iter()
            .map(|e| {
                json!({"name": e.name, "dtype": e.dtype, "shape": e.shape,
                       "elements": elems(&e.shape), "bytes": e.bytes(), "offset": e.start})
            })
            .collect();
        return Ok(serde_json::to_string_pretty(&json!({
            "format": "safetensors",
            "file": path.display().to_string(),
            "file_size": size,
            "tensor_count": tensors.len(),
            "total_bytes": f.entries().iter().map(|e| e.bytes()).sum::<usize>(),
            "tensors": tensors,
        }))?);
    }
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{}: safetensors, {} bytes, {} tensors",
        path.display(),
        size,
        f.entries().len()
    );
    let names: Vec<String> = f.entries().iter().map(|e| short_name(&e.name)).collect();
    let name_w = names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        o,
        "\n  {:name_w$}  {:6}  {:20}  {:>12}",
        "name", "dtype", "shape", "bytes"
    );
    let (mut e_all, mut b_all) = (0usize, 0usize);
    for (e, name) in f.entries().iter().zip(&names) {
        let dims: Vec<u64> = e.shape.iter().map(|&d| d as u64).collect();
        let _ = writeln!(
            o,
            "  {:name_w$}  {:6}  {:20}  {:>12}",
            name,
            e.dtype,
            shape(&dims),
            e.bytes()
        );
        e_all += elems(&e.shape);
        b_all += e.bytes();
    }
    let _ = write!(o, "\ntotal: {e_all} elements, {b_all} bytes");
    Ok(o)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if is_safetensors(&args.file) {
        let out = safetensors_report(&args.file, args.json)?;
        return match writeln!(std::io::stdout().lock(), "{out}") {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            r => Ok(r?),
        };
    }
    let f = GgufFile::open(&args.file)
        .map_err(|e| super::gguf_open_error(format!("inspect {}", args.file.display()), e))?;
    let out = if args.json {
        serde_json::to_string_pretty(&to_json(&f))?
    } else {
        to_text(&f)
    };
    // A closed pipe (`ferrite inspect m.gguf | head`) is not an error.
    match writeln!(std::io::stdout().lock(), "{out}") {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

fn short_string(s: &str) -> String {
    let n = s.chars().count();
    if n <= STRING_HEAD {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(STRING_HEAD).collect();
        format!("{head:?}... ({n} chars)")
    }
}

/// A key or tensor name for the text report: at most `STRING_HEAD` characters, so that a
/// crafted file cannot blow up the report (the table pads every name to the widest).
fn short_name(s: &str) -> String {
    if s.chars().count() <= STRING_HEAD {
        s.to_string()
    } else {
        let head: String = s.chars().take(STRING_HEAD).collect();
        format!("{head}...")
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => short_string(s),
        Value::Array(a) => {
            let mut out = String::from("[");
            for i in 0..a.len().min(ARRAY_HEAD) {
                if i > 0 {
                    out.push_str(", ");
                }
                if let Some(e) = a.get(i) {
                    out.push_str(&value_text(&e));
                }
            }
            if a.len() > ARRAY_HEAD {
                let _ = write!(out, ", ... ({} {} total)", a.len(), a.elem_type().name());
            }
            out.push(']');
            out
        }
        v => v.to_string(),
    }
}

fn shape(dims: &[u64]) -> String {
    let d: Vec<String> = dims.iter().map(u64::to_string).collect();
    format!("[{}]", d.join(", "))
}

/// Per type: (tensors, elements, bytes).
fn totals(f: &GgufFile) -> BTreeMap<GgmlType, (usize, u64, u64)> {
    let mut t = BTreeMap::new();
    for info in f.tensors() {
        let e = t.entry(info.ty).or_insert((0, 0, 0));
        e.0 += 1;
        e.1 += info.n_elements;
        e.2 += info.n_bytes;
    }
    t
}

fn to_text(f: &GgufFile) -> String {
    let mut o = String::new();
    let paths: Vec<String> = f.paths().iter().map(|p| p.display().to_string()).collect();
    let _ = writeln!(
        o,
        "{}: GGUF v{}, {} bytes, alignment {}, tensor data at {:#x}",
        paths.join(" + "),
        f.version(),
        f.file_size(),
        f.alignment(),
        f.data_start()
    );
    let _ = writeln!(o, "\nmetadata ({} keys):", f.metadata().len());
    for (k, v) in f.metadata() {
        let _ = writeln!(
            o,
            "  {} ({}) = {}",
            short_name(k),
            v.type_desc(),
            value_text(v)
        );
    }
    let names: Vec<String> = f.tensors().iter().map(|t| short_name(&t.name)).collect();
    let name_w = names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(o, "\ntensors ({}):", f.tensors().len());
    let _ = writeln!(
        o,
        "  {:name_w$}  {:7}  {:20}  {:>12}  {:>12}",
        "name", "type", "shape", "bytes", "offset"
    );
    for (t, name) in f.tensors().iter().zip(&names) {
        let _ = writeln!(
            o,
            "  {:name_w$}  {:7}  {:20}  {:>12}  {:>#12x}",
            name,
            t.ty.name(),
            shape(&t.dims),
            t.n_bytes,
            t.offset
        );
    }
    let _ = writeln!(o, "\ntotals per type:");
    let (mut n, mut e, mut b) = (0, 0, 0);
    for (ty, (tn, te, tb)) in totals(f) {
        let _ = writeln!(
            o,
            "  {:7}  {tn:5} tensors  {te:12} elements  {tb:12} bytes",
            ty.name()
        );
        (n, e, b) = (n + tn, e + te, b + tb);
    }
    let _ = write!(
        o,
        "  {:7}  {n:5} tensors  {e:12} elements  {b:12} bytes",
        "all"
    );
    o
}

fn array_json(a: &Array) -> Json {
    let head: Vec<Json> = (0..a.len().min(ARRAY_HEAD))
        .filter_map(|i| a.get(i))
        .map(|v| value_json(&v))
        .collect();
    if a.len() <= ARRAY_HEAD {
        Json::Array(head)
    } else {
        json!({ "len": a.len(), "elem_type": a.elem_type().name(), "head": head })
    }
}

fn value_json(v: &Value) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(s) if s.chars().count() > STRING_HEAD * 8 => {
            json!({ "len_chars": s.chars().count(), "head": s.chars().take(STRING_HEAD).collect::<String>() })
        }
        Value::String(s) => json!(s),
        Value::Array(a) => array_json(a),
    }
}

fn to_json(f: &GgufFile) -> Json {
    let metadata: Vec<Json> = f
        .metadata()
        .iter()
        .map(|(k, v)| json!({ "key": k, "type": v.type_desc(), "value": value_json(v) }))
        .collect();
    let tensors: Vec<Json> = f
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.name, "type": t.ty.name(), "shape": t.dims, "n_elements": t.n_elements,
                "n_bytes": t.n_bytes, "offset": t.offset, "shard": t.shard,
            })
        })
        .collect();
    let totals: serde_json::Map<String, Json> = totals(f)
        .into_iter()
        .map(|(ty, (n, e, b))| {
            (
                ty.name().to_string(),
                json!({ "tensors": n, "elements": e, "bytes": b }),
            )
        })
        .collect();
    json!({
        "files": f.paths(),
        "version": f.version(),
        "file_size": f.file_size(),
        "alignment": f.alignment(),
        "data_offset": f.data_start(),
        "metadata": metadata,
        "tensors": tensors,
        "totals": totals,
    })
}
