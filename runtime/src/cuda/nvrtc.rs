//! CUDA C to PTX with NVRTC, and the PTX cache.
//!
//! NVRTC needs no GPU: this runs wherever `libnvrtc.so` (`.so.12`) can be
//! loaded, which is what lets CPU-only CI compile every generated kernel.
//! Compiled PTX is cached in memory and, when the host program set a
//! directory ([`set_cache_dir`]), on disk: one `.ptx` file per key, with
//! the source beside it (`.cu`), compared on a hit so that a collision of
//! the 64-bit key cannot return the wrong code.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use super::{quietly, CudaError};

/// The options every kernel is compiled with: no contraction of `a * b +
/// c` into a fused multiply-add (the reference kernels round each
/// operation; NVRTC contracts by default), IEEE division and square root,
/// denormals kept (the defaults, spelled out).
pub const OPTIONS: &[&str] = &[
    "--fmad=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--ftz=false",
];

/// Whether `libnvrtc` can be loaded (without loading it for good).
pub fn available() -> bool {
    // SAFETY: tries to open the library by its candidate names; no symbol
    // is called.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// NVRTC's version, `(major, minor)`; `None` when it cannot be loaded.
pub fn version() -> Option<(i32, i32)> {
    if !available() {
        return None;
    }
    quietly(|| {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        (r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
    })
    .ok()
    .flatten()
}

/// Compiles `source` to PTX for a virtual architecture (`compute_80`,
/// `compute_90`, ..). Errors carry NVRTC's log.
pub fn compile_ptx(source: &str, arch: &str) -> Result<String, CudaError> {
    let key = cache_key(source, arch);
    if let Some(ptx) = memory_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
    {
        return Ok(ptx.clone());
    }
    if let Some(ptx) = disk_get(key, source) {
        memory_cache()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, ptx.clone());
        return Ok(ptx);
    }
    if !available() {
        return Err(CudaError::new(
            "NVRTC is not available: libnvrtc.so.12 could not be loaded (set LD_LIBRARY_PATH)",
        ));
    }
    if source.contains('\0') {
        return Err(CudaError::new("kernel source contains a NUL byte"));
    }
    let arch_static: &'static str = match arch {
        "compute_70" => "compute_70",
        "compute_75" => "compute_75",
        "compute_80" => "compute_80",
        "compute_86" => "compute_86",
        "compute_89" => "compute_89",
        "compute_90" => "compute_90",
        other => {
            return Err(CudaError::new(format!(
                "unsupported GPU architecture {other} (compute_70 to compute_90)"
            )))
        }
    };
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch_static),
        options: OPTIONS.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let src = source.to_string();
    let result = quietly(move || cudarc::nvrtc::compile_ptx_with_opts(src, opts))
        .map_err(|m| CudaError::new(format!("NVRTC failed: {m}")))?;
    let ptx = match result {
        Ok(ptx) => ptx.to_src(),
        Err(cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. }) => {
            return Err(CudaError::new(format!(
                "NVRTC rejected a generated kernel ({:?}):\n{}",
                nvrtc.0,
                log.to_string_lossy()
            )))
        }
        Err(e) => return Err(CudaError::new(format!("NVRTC failed: {e:?}"))),
    };
    disk_put(key, source, &ptx);
    memory_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, ptx.clone());
    Ok(ptx)
}

/// FNV-1a, 64 bits: stable across Rust versions and runs (unlike
/// `DefaultHasher`), so it can name files.
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // A separator, so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The cache key of a compilation: the source, the architecture, the
/// options and NVRTC's version (a new compiler may make different code).
fn cache_key(source: &str, arch: &str) -> u64 {
    let v = version()
        .map(|(a, b)| format!("{a}.{b}"))
        .unwrap_or_default();
    let opts = OPTIONS.join(" ");
    fnv1a(&[
        source.as_bytes(),
        arch.as_bytes(),
        opts.as_bytes(),
        v.as_bytes(),
    ])
}

fn memory_cache() -> &'static Mutex<HashMap<u64, String>> {
    static C: OnceLock<Mutex<HashMap<u64, String>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

fn cache_dir() -> &'static Mutex<Option<PathBuf>> {
    static D: OnceLock<Mutex<Option<PathBuf>>> = OnceLock::new();
    D.get_or_init(Default::default)
}

/// Sets the directory compiled PTX is kept in between runs (the host
/// program chooses it: the runtime reads no environment). `None` keeps
/// the cache in memory only.
pub fn set_cache_dir(dir: Option<PathBuf>) {
    *cache_dir().lock().unwrap_or_else(|e| e.into_inner()) = dir;
}

fn disk_paths(key: u64) -> Option<(PathBuf, PathBuf)> {
    let dir = cache_dir()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()?;
    Some((
        dir.join(format!("{key:016x}.ptx")),
        dir.join(format!("{key:016x}.cu")),
    ))
}

fn disk_get(key: u64, source: &str) -> Option<String> {
    let (ptx, cu) = disk_paths(key)?;
    let stored = std::fs::read_to_string(cu).ok()?;
    if stored != source {
        return None;
    }
    std::fs::read_to_string(ptx).ok()
}

/// Writes a cache entry; failures (read-only home, full disk) only cost a
/// recompilation next time. The PTX is written to a temporary name and
/// renamed, so a concurrent reader never sees half a file.
fn disk_put(key: u64, source: &str, ptx: &str) {
    let Some((ptx_path, cu_path)) = disk_paths(key) else {
        return;
    };
    let Some(dir) = ptx_path.parent() else {
        return;
    };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = ptx_path.with_extension(format!("tmp{}", std::process::id()));
    let ok = std::fs::write(&cu_path, source).is_ok()
        && std::fs::write(&tmp, ptx).is_ok()
        && std::fs::rename(&tmp, &ptx_path).is_ok();
    if !ok {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_cache_round_trip() {
        let tmp = tempfile::tempdir().expect("a temporary directory");
        let dir = tmp.path().to_path_buf();
        set_cache_dir(Some(dir.clone()));
        disk_put(42, "source", "ptx text");
        assert!(dir.join("000000000000002a.ptx").exists());
        assert_eq!(disk_get(42, "source").as_deref(), Some("ptx text"));
        // Another source under the same key (a hash collision) misses.
        assert_eq!(disk_get(42, "other source"), None);
        assert_eq!(disk_get(43, "source"), None);
        set_cache_dir(None);
        assert_eq!(disk_get(42, "source"), None);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn fnv_is_stable_and_separates_parts() {
        assert_eq!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"ab", b"c"]));
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_eq!(fnv1a(&[]), 0xcbf2_9ce4_8422_2325);
    }
}
