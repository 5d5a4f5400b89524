//! Runtime-compiled kernels: CUDA C++ sources embedded next to their Rust wrappers, compiled by
//! NVRTC for the device's architecture at first use, cached on disk (key: sha256 of source,
//! architecture, options and NVRTC version) and loaded once per process. A source may also
//! carry cubins compiled at build time ([`Prebuilt`], `build/aot.rs`: `FERRITE_CUDA_ARCHS` or
//! the build machine's devices); one for the device's architecture whose key matches the
//! source is used as is, with no compile and no NVRTC needed.
//!
//! Cache folder: `$FERRITE_CACHE/kernels` if `FERRITE_CACHE` is set, else
//! `$HOME/.cache/ferrite/kernels`; without either the cache is skipped.

use crate::driver::Check;
use cudarc::driver::{result as dr, sys};
use cudarc::nvrtc::sys as nv;
use ferrite_core::{Error, Result};

use crate::kernel_key::{self, OPTIONS};
use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::Mutex;

/// One `.cu` file. Every source is compiled with `common.cuh` in front of it.
pub struct KernelSource {
    pub name: &'static str,
    pub src: &'static str,
    /// Cubins of this source compiled at build time (none where the build had no NVRTC or
    /// no architecture to compile for).
    pub prebuilt: &'static [Prebuilt],
}

/// A source's cubin for one architecture, compiled at build time. `key` is
/// [`prebuilt_key`] of the source it was compiled from: a cubin whose key does not match
/// the source (a build script out of step with the Rust side) is never used.
pub struct Prebuilt {
    pub arch: &'static str,
    pub key: &'static str,
    pub cubin: &'static [u8],
}

/// The text NVRTC compiles for `src`: `common.cuh`, a line directive, the source.
fn full_source(src: &KernelSource) -> String {
    kernel_key::full_source(COMMON, src.name, src.src)
}

/// sha256 (hex) of the full source of `src`, `--gpu-architecture=<arch>` and the compile
/// options: what a [`Prebuilt`] cubin for `arch` must carry to be used for `src`.
pub fn prebuilt_key(src: &KernelSource, arch: &str) -> String {
    kernel_key::key(&full_source(src), arch, "")
}

/// Checks the build-time cubins of `sources`: each one's key is its source's, and every
/// source has one for the same architectures (a build script that misses a source or is
/// out of step with it shows here). Returns how many cubins there are.
pub fn check_prebuilt(sources: &[&KernelSource]) -> std::result::Result<usize, String> {
    let archs = |s: &KernelSource| -> Vec<&str> { s.prebuilt.iter().map(|p| p.arch).collect() };
    let want = sources.first().map(|s| archs(s)).unwrap_or_default();
    let mut n = 0;
    for s in sources {
        if archs(s) != want {
            return Err(format!(
                "kernel source {}.cu has build-time cubins for {:?}, {}.cu for {want:?}",
                s.name,
                archs(s),
                sources[0].name
            ));
        }
        for p in s.prebuilt {
            if p.key != prebuilt_key(s, p.arch) {
                return Err(format!(
                    "kernel source {}.cu: its build-time cubin for {} was compiled from \
                     other text (build.rs out of step with the KernelSource)",
                    s.name, p.arch
                ));
            }
            n += 1;
        }
    }
    Ok(n)
}

/// The build-time cubin of `src` for `arch`, if there is one for this very source.
pub fn prebuilt(src: &KernelSource, arch: &str) -> Option<&'static [u8]> {
    let p = src.prebuilt.iter().find(|p| p.arch == arch)?;
    (p.key == prebuilt_key(src, arch)).then_some(p.cubin)
}

/// [`crate::CudaDevice::kernel_compiler`] for a device whose kernels are for `arch` (the
/// architecture [`compile`] is asked for): the build's NVRTC where the build embedded cubins
/// for it, else the run-time library's.
pub(crate) fn compiler(arch: &str) -> String {
    // the build embeds every source for the same architectures (`check_prebuilt`)
    if prebuilt(&crate::elementwise::SOURCE, arch).is_some() && !crate::prebuilt::NVRTC.is_empty() {
        format!("NVRTC {}, at build time ({arch})", crate::prebuilt::NVRTC)
    } else if nvrtc_present() {
        let (a, b) = nvrtc_version();
        format!("NVRTC {a}.{b}, at first use ({arch})")
    } else {
        format!("no NVRTC for {arch}")
    }
}

pub(crate) const COMMON: &str = include_str!("common.cuh");

/// Every kernel source of the backend (the compile-all test walks this list).
pub fn all_sources() -> Vec<&'static KernelSource> {
    vec![
        &crate::elementwise::SOURCE,
        &crate::cast::SOURCE,
        &crate::create::SOURCE,
        &crate::reduce::SOURCE,
        &crate::index::SOURCE,
        &crate::scan::SOURCE,
        &crate::norm::SOURCE,
        &crate::cross_entropy::SOURCE,
        &crate::attention::SOURCE,
        &crate::conv::SOURCE,
        &crate::channel_norm::SOURCE,
        &crate::optim::SOURCE,
        &crate::matvec::SOURCE,
        &crate::llm::decode::SOURCE,
        &crate::llm::prefill::SOURCE,
        &crate::llm::sample::SOURCE,
        &crate::llm::paged::SOURCE,
    ]
}

/// Whether NVRTC can be loaded in this process.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { nv::is_culib_present() }
}

fn nvrtc_version() -> (i32, i32) {
    let (mut a, mut b) = (0, 0);
    // SAFETY: out-pointers are valid.
    unsafe { nv::nvrtcVersion(&mut a, &mut b) };
    (a, b)
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("FERRITE_CACHE").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("kernels"));
    }
    std::env::var_os("HOME")
        .filter(|d| !d.is_empty())
        .map(|h| PathBuf::from(h).join(".cache/ferrite/kernels"))
}

fn nv_err(src: &KernelSource, what: &str, r: nv::nvrtcResult) -> Error {
    Error::backend(
        "nvrtc",
        format!("kernel source {}.cu: {what} failed: {r:?}", src.name),
    )
}

/// The cubin of one source for `arch` (e.g. "sm_90"): its [`Prebuilt`] one where it has a
/// matching one, else [`compile_nvrtc`].
pub fn compile(src: &KernelSource, arch: &str) -> Result<Vec<u8>> {
    if let Some(c) = prebuilt(src, arch) {
        return Ok(c.to_vec());
    }
    compile_nvrtc(src, arch)
}

/// Compiles one source to a cubin for `arch` with NVRTC, through the disk cache.
pub fn compile_nvrtc(src: &KernelSource, arch: &str) -> Result<Vec<u8>> {
    if !nvrtc_present() {
        return Err(Error::backend(
            "nvrtc",
            "the NVRTC library (libnvrtc.so) is not installed",
        ));
    }
    let full = full_source(src);
    let arch_opt = format!("--gpu-architecture={arch}");
    let (va, vb) = nvrtc_version();
    let key = kernel_key::key(&full, arch, &format!("nvrtc {va}.{vb}"));
    let cached = cache_dir().map(|d| d.join(format!("{}-{arch}-{key}.cubin", src.name)));
    if let Some(p) = &cached {
        if let Ok(bytes) = std::fs::read(p) {
            if !bytes.is_empty() {
                return Ok(bytes);
            }
        }
    }
    let cubin = nvrtc_compile(src, &full, &arch_opt)?;
    if let Some(p) = cached {
        if let Some(dir) = p.parent() {
            if std::fs::create_dir_all(dir).is_ok() {
                let tmp = p.with_extension(format!("tmp{}", std::process::id()));
                if std::fs::write(&tmp, &cubin).is_ok() {
                    let _ = std::fs::rename(&tmp, &p);
                }
            }
        }
    }
    Ok(cubin)
}

fn nvrtc_compile(src: &KernelSource, full: &str, arch_opt: &str) -> Result<Vec<u8>> {
    let code = CString::new(full).map_err(|_| {
        nv_err(
            src,
            "reading source",
            nv::nvrtcResult::NVRTC_ERROR_INVALID_INPUT,
        )
    })?;
    let name = CString::new(format!("{}.cu", src.name)).unwrap_or_default();
    let mut opts: Vec<CString> = OPTIONS
        .iter()
        .map(|o| CString::new(*o).unwrap_or_default())
        .collect();
    opts.push(CString::new(arch_opt).unwrap_or_default());
    let opt_ptrs: Vec<*const std::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: nv::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the calls; the program is destroyed at the end.
    unsafe {
        let r = nv::nvrtcCreateProgram(
            &mut prog,
            code.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        if r != nv::nvrtcResult::NVRTC_SUCCESS {
            return Err(nv_err(src, "nvrtcCreateProgram", r));
        }
        let r = nv::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr());
        let out = if r != nv::nvrtcResult::NVRTC_SUCCESS {
            let mut n = 0usize;
            nv::nvrtcGetProgramLogSize(prog, &mut n);
            let mut log = vec![0u8; n.max(1)];
            nv::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast());
            let log = CStr::from_bytes_until_nul(&log)
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default();
            Err(Error::backend(
                "nvrtc",
                format!("kernel source {}.cu failed to compile:\n{log}", src.name),
            ))
        } else {
            let mut n = 0usize;
            let r = nv::nvrtcGetCUBINSize(prog, &mut n);
            if r != nv::nvrtcResult::NVRTC_SUCCESS || n == 0 {
                Err(nv_err(src, "nvrtcGetCUBINSize", r))
            } else {
                let mut bin = vec![0u8; n];
                let r = nv::nvrtcGetCUBIN(prog, bin.as_mut_ptr().cast());
                if r != nv::nvrtcResult::NVRTC_SUCCESS {
                    Err(nv_err(src, "nvrtcGetCUBIN", r))
                } else {
                    Ok(bin)
                }
            }
        };
        nv::nvrtcDestroyProgram(&mut prog);
        out
    }
}

struct Module {
    raw: sys::CUmodule,
    funcs: HashMap<String, Func>,
}

#[derive(Clone, Copy)]
pub(crate) struct Func {
    pub raw: sys::CUfunction,
    /// Dynamic shared memory the function has been allowed (above the 48 KiB default).
    pub smem_allowed: u32,
}

/// The loaded modules of one device, by source name.
pub(crate) struct Kernels {
    pub arch: String,
    modules: Mutex<HashMap<&'static str, Module>>,
}

unsafe impl Send for Kernels {}
unsafe impl Sync for Kernels {}

impl Kernels {
    pub fn new(arch: String) -> Kernels {
        Kernels {
            arch,
            modules: Mutex::new(HashMap::new()),
        }
    }

    /// The function `name` of `src`, compiling and loading the source at first use.
    pub fn func(&self, src: &'static KernelSource, name: &str) -> Result<Func> {
        let mut mods = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if !mods.contains_key(src.name) {
            let cubin = compile(src, &self.arch)?;
            // SAFETY: the image is a cubin for this device's architecture, alive for the call.
            let raw =
                unsafe { dr::module::load_data(cubin.as_ptr() as *const c_void) }.op("nvrtc")?;
            mods.insert(
                src.name,
                Module {
                    raw,
                    funcs: HashMap::new(),
                },
            );
        }
        let m = mods
            .get_mut(src.name)
            .ok_or_else(|| Error::backend("nvrtc", "module vanished"))?;
        if let Some(f) = m.funcs.get(name) {
            return Ok(*f);
        }
        let cname = CString::new(name).unwrap_or_default();
        // SAFETY: the module is loaded; the name is NUL-terminated.
        let raw = unsafe { dr::module::get_function(m.raw, cname) }.map_err(|e| {
            Error::backend(
                "nvrtc",
                format!("kernel {name} not found in {}.cu: {:?}", src.name, e.0),
            )
        })?;
        let f = Func {
            raw,
            smem_allowed: 48 << 10,
        };
        m.funcs.insert(name.to_string(), f);
        Ok(f)
    }

    /// Raises a function's dynamic shared memory limit.
    pub fn allow_smem(&self, src: &'static KernelSource, name: &str, bytes: u32) -> Result<()> {
        let mut mods = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = mods.get_mut(src.name).and_then(|m| m.funcs.get_mut(name)) {
            // SAFETY: valid function handle.
            unsafe {
                dr::function::set_function_attribute(
                    f.raw,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes as i32,
                )
            }
            .op("cuda")?;
            f.smem_allowed = bytes;
        }
        Ok(())
    }
}

/// Kernel arguments, copied into one 8-byte-aligned buffer (every parameter type here has
/// alignment ≤ 8); `ptrs` gives each argument's address for `cuLaunchKernel`.
#[derive(Default)]
pub(crate) struct Args {
    words: Vec<u64>,
    /// Word offset of each argument.
    at: Vec<usize>,
}

impl Args {
    pub fn new() -> Args {
        Args {
            words: Vec::with_capacity(48),
            at: Vec::with_capacity(8),
        }
    }
    /// Appends one argument; its type must match the kernel's parameter exactly.
    pub fn arg<T: Copy + 'static>(mut self, v: T) -> Args {
        const { assert!(std::mem::align_of::<T>() <= 8) };
        let n = std::mem::size_of::<T>().div_ceil(8).max(1);
        let at = self.words.len();
        self.words.resize(at + n, 0);
        // SAFETY: the words at `at..at + n` hold size_of::<T>() bytes, 8-byte aligned.
        unsafe { (self.words.as_mut_ptr().add(at) as *mut T).write(v) };
        self.at.push(at);
        self
    }
    pub fn ptrs(&mut self) -> Vec<*mut c_void> {
        let base = self.words.as_mut_ptr();
        // SAFETY: every offset lies within `words`, which is not resized after this.
        self.at
            .iter()
            .map(|&a| unsafe { base.add(a) } as *mut c_void)
            .collect()
    }
}

/// Grid and block of a launch, plus dynamic shared memory bytes.
#[derive(Clone, Copy, Debug)]
pub struct Cfg {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub smem: u32,
}

impl Cfg {
    pub fn new(grid: (u32, u32, u32), block: (u32, u32, u32), smem: u32) -> Cfg {
        Cfg { grid, block, smem }
    }
}

/// The kernel-name suffix of a dtype (`FOR_ALL` in common.cuh).
pub(crate) fn suffix(dt: ferrite_core::DType) -> &'static str {
    use ferrite_core::DType as D;
    match dt {
        D::F32 => "f32",
        D::F16 => "f16",
        D::BF16 => "bf16",
        D::F64 => "f64",
        D::I32 => "i32",
        D::I64 => "i64",
        D::U32 => "u32",
        D::U8 => "u8",
        D::Bool => "bool",
    }
}

/// Up to this many dims after coalescing (`MAX_DIMS` in common.cuh).
pub(crate) const MAX_DIMS: usize = 8;

/// A strided walk over one shape for up to three operands (`Idx` in common.cuh).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Idx {
    pub rank: u32,
    pub n: u64,
    pub dims: [u64; MAX_DIMS],
    pub st: [[i64; MAX_DIMS]; 3],
    pub off: [i64; 3],
}

impl Idx {
    /// The walk over `dims` for operands given as (strides, offset), in elements. Size-1
    /// dims are dropped and dims that are contiguous for every operand merged.
    pub fn new(op: &'static str, dims: &[usize], ops: &[(&[usize], usize)]) -> Result<Idx> {
        let mut ix = Idx {
            rank: 0,
            n: dims.iter().product::<usize>() as u64,
            dims: [1; MAX_DIMS],
            st: [[0; MAX_DIMS]; 3],
            off: [0; 3],
        };
        let mut r = 0usize; // dims kept so far
        let mut unmerged = 0usize; // dims needed without the MAX_DIMS cap
        for (k, &n) in dims.iter().enumerate() {
            if n == 1 {
                continue;
            }
            let merge = r > 0
                && ops
                    .iter()
                    .enumerate()
                    .all(|(j, (st, _))| ix.st[j][r - 1] as usize == st[k] * n);
            if merge {
                ix.dims[r - 1] *= n as u64;
                for (j, (st, _)) in ops.iter().enumerate() {
                    ix.st[j][r - 1] = st[k] as i64;
                }
            } else {
                unmerged += 1;
                if r < MAX_DIMS {
                    ix.dims[r] = n as u64;
                    for (j, (st, _)) in ops.iter().enumerate() {
                        ix.st[j][r] = st[k] as i64;
                    }
                    r += 1;
                }
            }
        }
        if unmerged > MAX_DIMS {
            return Err(Error::backend(
                op,
                format!(
                    "strided layout needs {unmerged} dims after merging; the CUDA kernels take at most {MAX_DIMS}"
                ),
            ));
        }
        ix.rank = r as u32;
        for (j, (_, off)) in ops.iter().enumerate() {
            ix.off[j] = *off as i64;
        }
        Ok(ix)
    }

    /// True when each of the first `k` operands walks its storage contiguously from its
    /// offset.
    pub fn contiguous(&self, k: usize) -> bool {
        self.rank == 0 || (self.rank == 1 && (0..k).all(|j| self.st[j][0] == 1))
    }

    /// The same walk in 16-byte units, for elements of `elem` bytes, when every operand's
    /// innermost dim is contiguous and every operand (base pointers `bases`, offsets and
    /// strides) and the contiguous output `out` are 16-byte aligned; `None` otherwise.
    pub fn in_packs(&self, elem: usize, bases: &[u64], out: u64) -> Option<Idx> {
        let r = self.rank as usize;
        if r == 0 || elem == 0 || !16usize.is_multiple_of(elem) || !out.is_multiple_of(16) {
            return None;
        }
        let v = (16 / elem) as u64;
        if !self.dims[r - 1].is_multiple_of(v) {
            return None;
        }
        let mut px = *self;
        px.dims[r - 1] /= v;
        px.n /= v;
        for (j, &base) in bases.iter().enumerate() {
            let aligned = |x: i64| x.rem_euclid(v as i64) == 0;
            if base % 16 != 0
                || self.st[j][r - 1] != 1
                || !aligned(self.off[j])
                || !(0..r - 1).all(|d| aligned(self.st[j][d]))
            {
                return None;
            }
            px.off[j] /= v as i64;
            for d in 0..r - 1 {
                px.st[j][d] /= v as i64;
            }
        }
        Some(px)
    }

    /// For two operands over [rows, m] (after merging), one walking its storage contiguously
    /// and the other one row of m elements repeated (strides [0, 1]): `(m, true)` when the
    /// repeated row is the second operand, `(m, false)` when it is the first.
    pub fn row_broadcast(&self) -> Option<(u64, bool)> {
        if self.rank != 2 {
            return None;
        }
        let m = self.dims[1];
        let full = [m as i64, 1];
        let row = [0, 1];
        let st = |j: usize| [self.st[j][0], self.st[j][1]];
        match (st(0), st(1)) {
            (a, b) if a == full && b == row => Some((m, true)),
            (a, b) if a == row && b == full => Some((m, false)),
            _ => None,
        }
    }

    /// For a two-operand walk: `Some((m, inner, col_b))` when one operand is contiguous and
    /// the other holds one value per run of `inner` consecutive elements, cycling with period
    /// m (merged dims [o, m, inner] with strides [0, 1, 0], or [m, inner] with [1, 0]: a
    /// per-channel value over [n, c, h, w], a per-row value over [rows, cols]); `col_b`: that
    /// operand is the second.
    pub fn col_broadcast(&self) -> Option<(u64, u64, bool)> {
        let r = self.rank as usize;
        if !(2..=3).contains(&r) {
            return None;
        }
        let (m, inner) = (self.dims[r - 2], self.dims[r - 1]);
        let mut full = [0i64; 3];
        let mut acc = 1i64;
        for k in (0..r).rev() {
            full[k] = acc;
            acc *= self.dims[k] as i64;
        }
        let col: &[i64] = if r == 3 { &[0, 1, 0] } else { &[1, 0] };
        let st = |j: usize| &self.st[j][..r];
        match (st(0), st(1)) {
            (a, b) if a == &full[..r] && b == col => Some((m, inner, true)),
            (a, b) if a == col && b == &full[..r] => Some((m, inner, false)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A per-channel bias over [n, c, h, w] and a per-row value over [rows, cols] walk as
    /// `binary_k`'s runs, either operand order; other broadcasts do not.
    #[test]
    fn column_broadcasts_are_recognised() {
        let full = [3 * 5 * 7, 5 * 7, 7, 1];
        let chan = [0, 1, 0, 0];
        let ix = Idx::new("t", &[2, 3, 5, 7], &[(&full, 0), (&chan, 0)]).unwrap();
        assert_eq!(ix.col_broadcast(), Some((3, 35, true)));
        let ix = Idx::new("t", &[2, 3, 5, 7], &[(&chan, 0), (&full, 0)]).unwrap();
        assert_eq!(ix.col_broadcast(), Some((3, 35, false)));
        // [6, 40] with a [6, 1] operand: one value a row.
        let ix = Idx::new("t", &[6, 40], &[(&[40, 1], 0), (&[1, 0], 0)]).unwrap();
        assert_eq!(ix.col_broadcast(), Some((6, 40, true)));
        // A row bias ([cols] over [rows, cols]) is `row_broadcast`'s, and a transposed
        // operand is neither.
        let ix = Idx::new("t", &[6, 40], &[(&[40, 1], 0), (&[0, 1], 0)]).unwrap();
        assert_eq!(ix.col_broadcast(), None);
        let ix = Idx::new("t", &[6, 40], &[(&[1, 6], 0), (&[1, 0], 0)]).unwrap();
        assert_eq!(ix.col_broadcast(), None);
    }

    /// A [b, h, l, d] -> [b, l, h, d] permutation of bf16 rows walks 16-byte packs of 8
    /// elements; an odd innermost length, an unaligned offset or a strided innermost dim
    /// stay element by element.
    #[test]
    fn copies_walk_16_byte_packs_when_rows_allow() {
        let (b, h, l, d) = (2usize, 3usize, 5usize, 16usize);
        // The source is contiguous [b, h, l, d]; the copy reads it as [b, l, h, d].
        let strides = [h * l * d, d, l * d, 1];
        let ix = Idx::new("t", &[b, l, h, d], &[(&strides, 0)]).unwrap();
        let px = ix.in_packs(2, &[256], 512).expect("packs");
        assert_eq!(px.n, ix.n / 8);
        assert_eq!(&px.dims[..4], &[2, 5, 3, 2]);
        assert_eq!(
            &px.st[0][..4],
            &[(h * l * d / 8) as i64, 2, (l * d / 8) as i64, 1]
        );
        assert!(ix.in_packs(2, &[256 + 2], 512).is_none(), "unaligned base");
        assert!(ix.in_packs(2, &[256], 514).is_none(), "unaligned output");
        let odd = Idx::new("t", &[b, l, h, 12], &[(&[h * l * 12, 12, l * 12, 1], 0)]).unwrap();
        assert!(
            odd.in_packs(2, &[256], 512).is_none(),
            "12 bf16 are not whole packs"
        );
        let off = Idx::new("t", &[b, l, h, d], &[(&strides, 3)]).unwrap();
        assert!(
            off.in_packs(2, &[256], 512).is_none(),
            "offset of 3 elements"
        );
        let col = Idx::new("t", &[4, 8], &[(&[1, 4], 0)]).unwrap();
        assert!(
            col.in_packs(2, &[256], 512).is_none(),
            "transposed: innermost dim strided"
        );
    }

    /// The compiler a device's kernels are reported as coming from: the build's NVRTC
    /// ("major.minor") exactly for the architectures the build embedded cubins for.
    #[test]
    fn kernel_compiler_names_the_build_nvrtc_only_where_cubins_are_embedded() {
        let s = compiler("sm_999");
        assert!(
            (!s.contains("build time") && s.ends_with("sm_999)")) || s == "no NVRTC for sm_999",
            "{s}"
        );
        for p in crate::elementwise::SOURCE.prebuilt {
            let v = crate::prebuilt::NVRTC;
            assert!(
                v.split('.').count() == 2 && v.split('.').all(|n| n.parse::<u32>().is_ok()),
                "NVRTC {v:?}"
            );
            assert_eq!(
                compiler(p.arch),
                format!("NVRTC {v}, at build time ({})", p.arch)
            );
        }
    }

    /// A build-time cubin is used for its architecture only, and only while its key is the
    /// source's; otherwise `compile` goes to NVRTC.
    #[test]
    fn prebuilt_cubins_need_their_arch_and_source_key() {
        fn source(key: &'static str) -> KernelSource {
            let prebuilt: &'static [Prebuilt] = Box::leak(Box::new([Prebuilt {
                arch: "sm_90",
                key,
                cubin: b"not really a cubin",
            }]));
            KernelSource {
                name: "prebuilt_test",
                src: "extern \"C\" __global__ void k() {}",
                prebuilt,
            }
        }
        let plain = source("");
        let key: &'static str = Box::leak(prebuilt_key(&plain, "sm_90").into_boxed_str());
        assert_eq!(key.len(), 64);
        let good = source(key);
        assert_eq!(prebuilt(&good, "sm_90"), Some(&b"not really a cubin"[..]));
        assert_eq!(compile(&good, "sm_90").unwrap(), b"not really a cubin");
        assert_eq!(prebuilt(&good, "sm_80"), None);
        assert_eq!(prebuilt(&plain, "sm_90"), None);
        let edited = KernelSource {
            src: "extern \"C\" __global__ void k2() {}",
            ..source(key)
        };
        assert_eq!(prebuilt(&edited, "sm_90"), None);
        assert_ne!(prebuilt_key(&good, "sm_90"), prebuilt_key(&good, "sm_80"));
    }
}
