//! The CUDA device: driver, buffers, a caching allocator, kernel modules,
//! cuBLAS, and a residency table that keeps tensors on the device between
//! kernels.
//!
//! Everything goes through `cudarc` with dynamic loading, so this builds
//! and links on machines with no CUDA toolkit and no driver. `cudarc`
//! panics when a library is missing (and when an old driver lacks a
//! symbol), so every entry point first checks the library can be loaded
//! ([`probe`]) and calls `cudarc` inside [`quietly`] (`catch_unwind` with
//! the panic message kept out of the terminal). Driver errors are
//! formatted by their code ([`driver_error`]); `DriverError`'s own
//! `Display` calls back into the driver.
//!
//! **Untested on hardware.** This module was written on a machine with no
//! GPU: probing, the allocator's bookkeeping, the gemm mapping and NVRTC
//! compilation are tested here; device memory, launches, cuBLAS calls and
//! the residency table have only been compiled. `scripts/gpu-check.sh`
//! is the test to run where a GPU is.
//!
//! # Residency
//!
//! Device kernels read their inputs from device memory. A host tensor is
//! uploaded the first time a kernel reads it; its device copy is recorded
//! in a side table keyed by the tensor's buffer (a weak reference, so the
//! entry dies with the tensor). A kernel's output is copied back to a host
//! tensor, which is recorded with the device buffer it came from, so the
//! next kernel reading it uses the device copy with no upload. Uploads thus
//! happen once per host value (program inputs, results of host
//! primitives); the copy back after every kernel is what host primitives
//! need when they read the value, and the part a lazy scheme (a tensor
//! whose data stays on the device until a host primitive reads it) would
//! remove.

pub mod alloc;
pub mod gemm;
pub mod nvrtc;

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::{result, sys, CudaContext, CudaStream};

use crate::tensor::{Buffer, DType, Tensor};
use alloc::{AllocStats, Block, CachingAllocator, RawAlloc};

/// An error of the CUDA back end, as one line (NVRTC logs aside).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaError {
    pub message: String,
}

impl CudaError {
    pub fn new(message: impl Into<String>) -> CudaError {
        CudaError {
            message: message.into(),
        }
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CudaError {}

impl From<CudaError> for crate::error::RtError {
    fn from(e: CudaError) -> Self {
        crate::error::RtError::new(format!("cuda: {}", e.message))
    }
}

/// A driver error by its code (`CUDA_ERROR_OUT_OF_MEMORY (2)`), without
/// calling the driver to describe it.
pub fn driver_error(what: &str, e: result::DriverError) -> CudaError {
    CudaError::new(format!("{what}: {:?} ({})", e.0, e.0 as i32))
}

/// Runs `f`, turning a panic into an error with its message, and keeping
/// the panic hook (which would print the message and a backtrace hint)
/// quiet meanwhile. `cudarc` panics when a library or symbol is missing.
pub fn quietly<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: Mutex<()> = Mutex::new(());
    let _guard = HOOK.lock().unwrap_or_else(|e| e.into_inner());
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(prev);
    r.map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a CUDA library call panicked".into())
    })
}

/// Which CUDA libraries this process can load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// `libcuda` (the driver).
    pub driver: bool,
    /// `libnvrtc` (run-time compilation).
    pub nvrtc: bool,
    /// `libcublas`.
    pub cublas: bool,
}

/// Checks which libraries can be loaded; loads nothing for good and calls
/// no CUDA function.
pub fn probe() -> Probe {
    // SAFETY: each tries `dlopen` on candidate names and closes the handle.
    unsafe {
        Probe {
            driver: sys::is_culib_present(),
            nvrtc: cudarc::nvrtc::sys::is_culib_present(),
            cublas: cudarc::cublas::sys::is_culib_present(),
        }
    }
}

/// What [`devices`] reports about one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub total_memory: usize,
    /// Compute capability, `(major, minor)`.
    pub compute_capability: (i32, i32),
    pub multiprocessors: i32,
}

impl DeviceInfo {
    /// The NVRTC virtual architecture to compile for: the device's own,
    /// capped at the newest this back end names (PTX is forward compatible:
    /// the driver compiles it for newer GPUs).
    pub fn arch(&self) -> Option<String> {
        arch_for(self.compute_capability)
    }
}

/// The virtual architecture for a compute capability (see
/// [`DeviceInfo::arch`]); `None` below 7.0 (Volta), which is not supported.
pub fn arch_for((major, minor): (i32, i32)) -> Option<String> {
    let cc = major * 10 + minor;
    let known = [70, 75, 80, 86, 89, 90];
    let pick = known.iter().rev().find(|&&k| k <= cc)?;
    Some(format!("compute_{pick}"))
}

/// The driver's version as `major.minor`, when a driver is present.
pub fn driver_version() -> Option<String> {
    if !probe().driver {
        return None;
    }
    quietly(|| {
        let mut v = 0;
        // SAFETY: a valid out-pointer.
        let r = unsafe { sys::cuDriverGetVersion(&mut v) };
        (r == sys::CUresult::CUDA_SUCCESS).then(|| format!("{}.{}", v / 1000, (v % 1000) / 10))
    })
    .ok()
    .flatten()
}

/// The GPUs the driver sees, or why there are none to use.
pub fn devices() -> Result<Vec<DeviceInfo>, CudaError> {
    if !probe().driver {
        return Err(CudaError::new(
            "no CUDA driver: libcuda.so could not be loaded",
        ));
    }
    let r = quietly(|| -> Result<Vec<DeviceInfo>, CudaError> {
        result::init().map_err(|e| driver_error("cuInit", e))?;
        let n = result::device::get_count().map_err(|e| driver_error("cuDeviceGetCount", e))?;
        (0..n.max(0) as usize).map(device_info).collect()
    });
    match r {
        Ok(r) => r,
        Err(m) => Err(CudaError::new(format!("the CUDA driver failed: {m}"))),
    }
}

fn device_info(ordinal: usize) -> Result<DeviceInfo, CudaError> {
    use sys::CUdevice_attribute as A;
    let dev = result::device::get(ordinal as i32).map_err(|e| driver_error("cuDeviceGet", e))?;
    let attr = |a: A| -> Result<i32, CudaError> {
        // SAFETY: `dev` is a device handle from the driver.
        unsafe { result::device::get_attribute(dev, a) }
            .map_err(|e| driver_error("cuDeviceGetAttribute", e))
    };
    Ok(DeviceInfo {
        ordinal,
        name: result::device::get_name(dev).map_err(|e| driver_error("cuDeviceGetName", e))?,
        // SAFETY: as above.
        total_memory: unsafe { result::device::total_mem(dev) }
            .map_err(|e| driver_error("cuDeviceTotalMem", e))?,
        compute_capability: (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
    })
}

/// Device memory from the driver, for the caching allocator.
struct DriverAlloc {
    ctx: Arc<CudaContext>,
}

impl RawAlloc for DriverAlloc {
    type Error = CudaError;
    fn alloc(&mut self, bytes: usize) -> Result<u64, CudaError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        // SAFETY: the context is current; the block is freed by `free`.
        unsafe { result::malloc_sync(bytes) }.map_err(|e| driver_error("cuMemAlloc", e))
    }
    fn free(&mut self, ptr: u64, _bytes: usize) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from `malloc_sync` and is freed once (the
            // allocator's bookkeeping). cuMemFree waits for work using it.
            let _ = unsafe { result::free_sync(ptr) };
        }
    }
}

type Pool = Arc<Mutex<CachingAllocator<DriverAlloc>>>;

/// Device memory holding `len` elements of `dtype`; returned to the
/// session's cache when dropped.
pub struct DeviceBuffer {
    block: Block,
    len: usize,
    dtype: DType,
    pool: Pool,
}

impl DeviceBuffer {
    /// The device address (a kernel argument).
    pub fn ptr(&self) -> u64 {
        self.block.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        self.pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free(self.block);
    }
}

/// A host buffer's identity that cannot be reused while the entry exists.
enum WeakBuf {
    F32(Weak<Vec<f32>>),
    F64(Weak<Vec<f64>>),
}

impl WeakBuf {
    fn of(b: &Buffer) -> Option<(usize, WeakBuf)> {
        match b {
            Buffer::F32(a) => Some((Arc::as_ptr(a) as usize, WeakBuf::F32(Arc::downgrade(a)))),
            Buffer::F64(a) => Some((Arc::as_ptr(a) as usize, WeakBuf::F64(Arc::downgrade(a)))),
            _ => None,
        }
    }
    fn alive(&self) -> bool {
        match self {
            WeakBuf::F32(w) => w.strong_count() > 0,
            WeakBuf::F64(w) => w.strong_count() > 0,
        }
    }
}

/// Host buffers with a copy on the device (see the module documentation).
#[derive(Default)]
struct Residency {
    entries: HashMap<usize, (WeakBuf, Arc<DeviceBuffer>)>,
}

impl Residency {
    fn get(&mut self, b: &Buffer) -> Option<Arc<DeviceBuffer>> {
        let (key, _) = WeakBuf::of(b)?;
        match self.entries.get(&key) {
            Some((w, d)) if w.alive() => Some(d.clone()),
            Some(_) => {
                self.entries.remove(&key);
                None
            }
            None => None,
        }
    }
    fn insert(&mut self, b: &Buffer, d: Arc<DeviceBuffer>) {
        // Dead entries go first: their device blocks return to the cache.
        self.entries.retain(|_, (w, _)| w.alive());
        if let Some((key, w)) = WeakBuf::of(b) {
            self.entries.insert(key, (w, d));
        }
    }
}

/// A compiled kernel: its module stays loaded while the session lives.
#[derive(Clone, Copy)]
pub struct Function {
    func: sys::CUfunction,
}

// SAFETY: a CUfunction is a handle the driver accepts from any thread once
// its context is current (the session binds it before every call).
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

/// A kernel argument.
#[derive(Clone, Copy, Debug)]
pub enum KernelArg {
    /// A device address.
    Ptr(u64),
    /// A 64-bit integer (`long long`).
    I64(i64),
}

/// One GPU, opened: a context, the session's stream, the allocator, the
/// loaded kernels, cuBLAS (created when first needed) and the residency
/// table.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    pool: Pool,
    functions: Mutex<HashMap<String, Function>>,
    residency: Mutex<Residency>,
    blas: Mutex<Option<cudarc::cublas::CudaBlas>>,
}

impl CudaDevice {
    /// Opens GPU `ordinal`; an error says in one line why it cannot be
    /// used (no driver, no device, no NVRTC, a driver error).
    pub fn open(ordinal: usize) -> Result<Arc<CudaDevice>, CudaError> {
        let p = probe();
        if !p.driver {
            return Err(CudaError::new(
                "no CUDA driver: libcuda.so could not be loaded",
            ));
        }
        let infos = devices()?;
        let Some(info) = infos.get(ordinal).cloned() else {
            return Err(CudaError::new(if infos.is_empty() {
                "the CUDA driver reports no GPU".to_string()
            } else {
                format!("there is no GPU {ordinal} ({} found)", infos.len())
            }));
        };
        if info.arch().is_none() {
            return Err(CudaError::new(format!(
                "{} has compute capability {}.{}; the CUDA back end needs 7.0 or newer",
                info.name, info.compute_capability.0, info.compute_capability.1
            )));
        }
        if !p.nvrtc {
            return Err(CudaError::new(
                "NVRTC is not available: libnvrtc.so.12 could not be loaded (set LD_LIBRARY_PATH)",
            ));
        }
        let opened = quietly(|| -> Result<_, CudaError> {
            let ctx = CudaContext::new(ordinal).map_err(|e| driver_error("cuCtxCreate", e))?;
            let stream = ctx
                .new_stream()
                .map_err(|e| driver_error("cuStreamCreate", e))?;
            Ok((ctx, stream))
        })
        .map_err(|m| CudaError::new(format!("the CUDA driver failed: {m}")))??;
        let (ctx, stream) = opened;
        Ok(Arc::new(CudaDevice {
            pool: Arc::new(Mutex::new(CachingAllocator::new(DriverAlloc {
                ctx: ctx.clone(),
            }))),
            ctx,
            stream,
            info,
            functions: Mutex::default(),
            residency: Mutex::default(),
            blas: Mutex::new(None),
        }))
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The allocator's counters.
    pub fn alloc_stats(&self) -> AllocStats {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).stats()
    }

    fn bind(&self) -> Result<(), CudaError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))
    }

    /// Uninitialised device memory for `len` elements of `dtype`.
    pub fn alloc(&self, len: usize, dtype: DType) -> Result<DeviceBuffer, CudaError> {
        let block = self
            .pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .alloc(len * dtype.size_bytes())?;
        Ok(DeviceBuffer {
            block,
            len,
            dtype,
            pool: self.pool.clone(),
        })
    }

    /// The device copy of a float tensor: the resident one, or a new
    /// upload (recorded, so the next reader finds it).
    pub fn to_device(&self, t: &Tensor) -> Result<Arc<DeviceBuffer>, CudaError> {
        let mut res = self.residency.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = res.get(t.buffer()) {
            return Ok(d);
        }
        let buf = self.alloc(t.len(), t.dtype())?;
        self.bind()?;
        let stream = self.stream.cu_stream();
        // SAFETY: the block holds at least `len` elements of the dtype; for
        // pageable host memory the driver has copied the source when the
        // call returns (CUDA's documented behaviour of cuMemcpyHtoDAsync).
        let r = unsafe {
            match t.buffer() {
                Buffer::F32(v) => result::memcpy_htod_async(buf.ptr(), &v[..], stream),
                Buffer::F64(v) => result::memcpy_htod_async(buf.ptr(), &v[..], stream),
                _ => {
                    return Err(CudaError::new(format!(
                        "only f32 and f64 tensors go to the GPU, not {}",
                        t.dtype().name()
                    )))
                }
            }
        };
        r.map_err(|e| driver_error("cuMemcpyHtoDAsync", e))?;
        let buf = Arc::new(buf);
        res.insert(t.buffer(), buf.clone());
        Ok(buf)
    }

    /// Copies a device buffer back into a host tensor of `shape` (waiting
    /// for the stream), and records the tensor as resident.
    pub fn to_host(&self, buf: DeviceBuffer, shape: &[usize]) -> Result<Tensor, CudaError> {
        self.bind()?;
        let stream = self.stream.cu_stream();
        let t = match buf.dtype {
            DType::F32 => {
                let mut v = vec![0f32; buf.len];
                // SAFETY: the block holds `len` f32s; the stream is
                // synchronised before `v` is read.
                unsafe { result::memcpy_dtoh_async(&mut v[..], buf.ptr(), stream) }
                    .map_err(|e| driver_error("cuMemcpyDtoHAsync", e))?;
                self.synchronize()?;
                Tensor::from_vec(v, shape)
            }
            DType::F64 => {
                let mut v = vec![0f64; buf.len];
                // SAFETY: as above.
                unsafe { result::memcpy_dtoh_async(&mut v[..], buf.ptr(), stream) }
                    .map_err(|e| driver_error("cuMemcpyDtoHAsync", e))?;
                self.synchronize()?;
                Tensor::from_vec(v, shape)
            }
            d => return Err(CudaError::new(format!("no device buffers of {}", d.name()))),
        }
        .map_err(|e| CudaError::new(e.message))?;
        self.residency
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(t.buffer(), Arc::new(buf));
        Ok(t)
    }

    /// Waits for the session's stream.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(|e| driver_error("cuStreamSynchronize", e))
    }

    /// The kernel `name` of `source` (CUDA C), compiled by NVRTC for this
    /// device and loaded once per session.
    pub fn function(&self, name: &str, source: &str) -> Result<Function, CudaError> {
        if let Some(f) = self
            .functions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return Ok(*f);
        }
        let arch = self
            .info
            .arch()
            .ok_or_else(|| CudaError::new("unsupported compute capability"))?;
        let ptx = nvrtc::compile_ptx(source, &arch)?;
        self.bind()?;
        let image = CString::new(ptx).map_err(|_| CudaError::new("PTX contains a NUL byte"))?;
        let cname = CString::new(name).map_err(|_| CudaError::new("bad kernel name"))?;
        // SAFETY: a NUL-terminated PTX image; the module is never unloaded
        // (kernels live as long as the process's session).
        let func = unsafe {
            let module = result::module::load_data(image.as_ptr() as *const c_void)
                .map_err(|e| driver_error("cuModuleLoadData", e))?;
            result::module::get_function(module, cname)
                .map_err(|e| driver_error("cuModuleGetFunction", e))?
        };
        let f = Function { func };
        self.functions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), f);
        Ok(f)
    }

    /// Launches `f` on the session's stream.
    pub fn launch(
        &self,
        f: Function,
        grid: u32,
        block: u32,
        args: &[KernelArg],
    ) -> Result<(), CudaError> {
        self.bind()?;
        let mut storage: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                KernelArg::Ptr(p) => p,
                KernelArg::I64(v) => v as u64,
            })
            .collect();
        let mut params: Vec<*mut c_void> = storage
            .iter_mut()
            .map(|v| v as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: every parameter of the generated kernels is a pointer or
        // a `long long`, 8 bytes each, in this order; `storage` outlives
        // the call (the driver copies parameters at launch).
        unsafe {
            result::launch_kernel(
                f.func,
                (grid, 1, 1),
                (block, 1, 1),
                0,
                self.stream.cu_stream(),
                &mut params,
            )
        }
        .map_err(|e| driver_error("cuLaunchKernel", e))
    }

    /// `C = op(A) @ op(B)` by cuBLAS, with `a` and `b` cuBLAS's operands as
    /// [`gemm::plan_gemm`] arranged them (cuBLAS's first operand is the
    /// row-major `B`).
    pub fn gemm(
        &self,
        p: &gemm::GemmPlan,
        dtype: DType,
        first: &DeviceBuffer,
        second: &DeviceBuffer,
        c: &DeviceBuffer,
    ) -> Result<(), CudaError> {
        use cudarc::cublas::{result as cb, sys as cs};
        if p.is_empty() {
            return Ok(());
        }
        if !p.fits_i32() {
            return Err(CudaError::new("matrix too large for cuBLAS's 32-bit sizes"));
        }
        self.bind()?;
        let mut guard = self.blas.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            if !probe().cublas {
                return Err(CudaError::new(
                    "cuBLAS is not available: libcublas.so.12 could not be loaded",
                ));
            }
            let stream = self.stream.clone();
            let blas = quietly(move || cudarc::cublas::CudaBlas::new(stream))
                .map_err(|m| CudaError::new(format!("cuBLAS failed: {m}")))?
                .map_err(|e| CudaError::new(format!("cublasCreate: {:?}", e.0)))?;
            *guard = Some(blas);
        }
        let handle = *guard.as_ref().expect("created above").handle();
        let op = |o: gemm::Op| match o {
            gemm::Op::N => cs::cublasOperation_t::CUBLAS_OP_N,
            gemm::Op::T => cs::cublasOperation_t::CUBLAS_OP_T,
        };
        let (m, n, k) = (p.m as i32, p.n as i32, p.k as i32);
        let (lda, ldb, ldc) = (p.lda as i32, p.ldb as i32, p.ldc as i32);
        let (sa, sb, sc) = (p.stride_a as i64, p.stride_b as i64, p.stride_c as i64);
        let batch = p.batch as i32;
        // One call for both dtypes: `$f` the cuBLAS function, `$t` the type.
        macro_rules! gemm {
            ($f:path, $t:ty) => {
                $f(
                    handle,
                    op(p.transa),
                    op(p.transb),
                    m,
                    n,
                    k,
                    &(1.0 as $t),
                    first.ptr() as *const $t,
                    lda,
                    sa,
                    second.ptr() as *const $t,
                    ldb,
                    sb,
                    &(0.0 as $t),
                    c.ptr() as *mut $t,
                    ldc,
                    sc,
                    batch,
                )
            };
        }
        // SAFETY: the buffers hold the operands and result as the plan
        // describes (the caller allocated them from its shapes); cuBLAS
        // runs on the session's stream.
        let r = unsafe {
            match dtype {
                DType::F32 => gemm!(cb::sgemm_strided_batched, f32),
                DType::F64 => gemm!(cb::dgemm_strided_batched, f64),
                d => return Err(CudaError::new(format!("no cuBLAS product of {}", d.name()))),
            }
        };
        r.map_err(|e| CudaError::new(format!("cuBLAS gemm: {:?}", e.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architectures() {
        let a = |cc| arch_for(cc).unwrap_or_default();
        assert_eq!(a((9, 0)), "compute_90");
        assert_eq!(a((8, 6)), "compute_86");
        assert_eq!(a((8, 7)), "compute_86");
        assert_eq!(a((10, 0)), "compute_90");
        assert_eq!(arch_for((6, 1)), None);
    }

    #[test]
    fn quietly_catches_panics() {
        let r: Result<(), String> = quietly(|| panic!("no library"));
        assert_eq!(r.unwrap_err(), "no library");
        assert_eq!(quietly(|| 3), Ok(3));
    }

    #[test]
    fn no_driver_is_one_line() {
        // Meaningful on machines without a driver (CI); with one, opening
        // must succeed or fail with a one-line reason.
        match CudaDevice::open(0) {
            Ok(d) => assert!(!d.info().name.is_empty()),
            Err(e) => assert!(!e.message.contains('\n'), "{}", e.message),
        }
    }
}
