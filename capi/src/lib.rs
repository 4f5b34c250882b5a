//! The C ABI runtime of libraries built ahead of time by `adjoint build`.
//!
//! A library made by `adjoint build FILE --entry F [--with-grad]` is an
//! object file (`compiler/src/aot.rs` writes it with `cranelift-object`)
//! linked with this crate's static library. The object holds the
//! optimised program as IR text and exports one C function per entry,
//! `int F(const adj_tensor* in, size_t n_in, adj_tensor* out, size_t n_out)`,
//! which calls [`adjoint_aot_call`] with the program and the entry's index.
//!
//! On the first call the program is read back (once per library); each
//! entry is compiled for the dtypes and shapes of its arguments on the
//! first call with them (fusion and Cranelift kernels, as graph mode does)
//! and the result is kept. Inputs are copied into runtime tensors; results
//! (a tensor, or tuples and records of tensors, flattened in order) are
//! copied into the buffers the caller gives, after checking their dtypes
//! and shapes. Errors return a nonzero status and leave a message for
//! [`adjoint_last_error`]; no panic crosses the C boundary.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use adjoint_compiler::aot::{AotModule, Compiled};
use adjoint_runtime::tensor::{DType, Tensor};
use adjoint_runtime::value::Value;

/// A tensor as C sees it: `{ void* data; const int64_t* shape; int32_t
/// rank; int32_t dtype; }`, row-major and contiguous; `shape` may be null
/// when `rank` is 0 (a scalar). `bool` elements are one byte, 0 or 1.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct AdjTensor {
    pub data: *mut c_void,
    pub shape: *const i64,
    pub rank: i32,
    pub dtype: i32,
}

/// Status: success.
pub const ADJ_OK: i32 = 0;
/// Status: the call was refused or failed (bad arguments, a run-time
/// error of the program); [`adjoint_last_error`] says why.
pub const ADJ_ERROR: i32 = 1;
/// Status: an internal error of the runtime (a bug).
pub const ADJ_INTERNAL: i32 = 2;

/// The dtype codes of [`AdjTensor::dtype`], in the order of
/// [`DType::ALL`]: f32, f64, i32, i64, bool, u8.
pub fn dtype_code(d: DType) -> i32 {
    DType::ALL.iter().position(|x| *x == d).unwrap_or(0) as i32
}

fn dtype_of(code: i32) -> Option<DType> {
    usize::try_from(code)
        .ok()
        .and_then(|i| DType::ALL.get(i).copied())
}

/// A program read back from a library, with its entries compiled per
/// signature.
struct Loaded {
    module: AotModule,
    compiled: Mutex<HashMap<(usize, Signature), Arc<Compiled>>>,
}

type Signature = Vec<(DType, Vec<usize>)>;

/// Programs by the address of their blob (one per library).
fn programs() -> &'static Mutex<HashMap<usize, Arc<Loaded>>> {
    static P: OnceLock<Mutex<HashMap<usize, Arc<Loaded>>>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(HashMap::new()))
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// The message of the last failed call on this thread (empty when the last
/// call succeeded). The pointer stays valid until the next call on this
/// thread.
#[no_mangle]
pub extern "C" fn adjoint_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Runs entry `entry` of the program in `blob` on `n_in` input tensors,
/// writing its results into the `n_out` output tensors (whose data buffers,
/// shapes and dtypes the caller provides). Returns [`ADJ_OK`], or
/// [`ADJ_ERROR`]/[`ADJ_INTERNAL`] with a message for
/// [`adjoint_last_error`].
///
/// # Safety
///
/// `blob` must point to `blob_len` readable bytes that do not change while
/// the process runs; `inputs` to `n_in` and `outputs` to `n_out` tensors
/// whose `shape` arrays hold `rank` elements and whose `data` buffers hold
/// as many elements of their dtype as the shape says.
#[no_mangle]
pub unsafe extern "C" fn adjoint_aot_call(
    blob: *const u8,
    blob_len: usize,
    entry: usize,
    inputs: *const AdjTensor,
    n_in: usize,
    outputs: *mut AdjTensor,
    n_out: usize,
) -> i32 {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the caller's contract, passed on.
        unsafe { call(blob, blob_len, entry, inputs, n_in, outputs, n_out) }
    }));
    match r {
        Ok(Ok(())) => {
            set_error("");
            ADJ_OK
        }
        Ok(Err(msg)) => {
            set_error(&msg);
            ADJ_ERROR
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_error(&format!(
                "internal error in the adjoint runtime: {what} (please report this as a bug)"
            ));
            ADJ_INTERNAL
        }
    }
}

unsafe fn call(
    blob: *const u8,
    blob_len: usize,
    entry: usize,
    inputs: *const AdjTensor,
    n_in: usize,
    outputs: *mut AdjTensor,
    n_out: usize,
) -> Result<(), String> {
    if blob.is_null() {
        return Err("no program (null blob)".into());
    }
    let loaded = load(blob, blob_len)?;
    let name = loaded
        .module
        .entry_name(entry)
        .ok_or_else(|| format!("the library has no entry {entry}"))?
        .to_string();
    let arity = loaded.module.entry_arity(entry).unwrap_or(0);
    if n_in != arity {
        return Err(format!(
            "{name} takes {arity} input tensor{}, but n_in is {n_in}",
            if arity == 1 { "" } else { "s" }
        ));
    }
    let ins: &[AdjTensor] = if n_in == 0 {
        &[]
    } else if inputs.is_null() {
        return Err(format!("{name}: `in` is null"));
    } else {
        // SAFETY: the caller passes n_in tensors.
        unsafe { std::slice::from_raw_parts(inputs, n_in) }
    };
    let mut args = Vec::with_capacity(n_in);
    for (i, t) in ins.iter().enumerate() {
        // SAFETY: the caller's contract on each tensor.
        let t = unsafe { read_tensor(t) }.map_err(|e| format!("{name}: in[{i}]: {e}"))?;
        args.push(t);
    }
    let sig: Signature = args
        .iter()
        .map(|t| (t.dtype(), t.shape().to_vec()))
        .collect();
    let compiled = {
        let key = (entry, sig);
        let found = lock(&loaded.compiled).get(&key).cloned();
        match found {
            Some(c) => c,
            None => {
                let c = Arc::new(loaded.module.compile(entry, &key.1)?);
                lock(&loaded.compiled).insert(key, c.clone());
                c
            }
        }
    };
    let result = compiled.call(args.into_iter().map(Value::Tensor).collect())?;
    let mut flat = Vec::new();
    flatten(&result, &mut flat).map_err(|e| format!("{name}: {e}"))?;
    if flat.len() != n_out {
        return Err(format!(
            "{name} returns {} tensor{} ({}), but n_out is {n_out}",
            flat.len(),
            if flat.len() == 1 { "" } else { "s" },
            flat.iter()
                .map(|t| t.as_ref().map_or("zero".into(), |t| t.type_string()))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let outs: &mut [AdjTensor] = if n_out == 0 {
        &mut []
    } else if outputs.is_null() {
        return Err(format!("{name}: `out` is null"));
    } else {
        // SAFETY: the caller passes n_out tensors.
        unsafe { std::slice::from_raw_parts_mut(outputs, n_out) }
    };
    // Check every output before writing any.
    let mut checked = Vec::with_capacity(n_out);
    for (i, (o, r)) in outs.iter().zip(&flat).enumerate() {
        // SAFETY: the caller's contract on each tensor.
        let (dtype, shape) =
            unsafe { describe(o) }.map_err(|e| format!("{name}: out[{i}]: {e}"))?;
        let t = match r {
            Some(t) => {
                if t.dtype() != dtype || t.shape() != shape.as_slice() {
                    return Err(format!(
                        "{name}: result {i} is {}, but out[{i}] is {}",
                        t.type_string(),
                        type_string(dtype, &shape)
                    ));
                }
                t.clone()
            }
            // A symbolic zero (no contribution): zeros of the caller's type.
            None => Tensor::zeros(dtype, &shape).map_err(|e| format!("{name}: out[{i}]: {e}"))?,
        };
        checked.push(t);
    }
    for (o, t) in outs.iter_mut().zip(&checked) {
        // SAFETY: checked above: the buffer holds t.len() elements of its dtype.
        unsafe { write_tensor(o, t) };
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The program at `blob`, read back on first use.
unsafe fn load(blob: *const u8, blob_len: usize) -> Result<Arc<Loaded>, String> {
    let key = blob as usize;
    if let Some(l) = lock(programs()).get(&key) {
        return Ok(l.clone());
    }
    // SAFETY: the caller passes blob_len readable bytes.
    let bytes = unsafe { std::slice::from_raw_parts(blob, blob_len) };
    let text = std::str::from_utf8(bytes).map_err(|_| "the library's program is not UTF-8")?;
    let module = AotModule::parse(text)?;
    let loaded = Arc::new(Loaded {
        module,
        compiled: Mutex::new(HashMap::new()),
    });
    Ok(lock(programs()).entry(key).or_insert(loaded).clone())
}

fn type_string(d: DType, shape: &[usize]) -> String {
    format!(
        "{}[{}]",
        d.name(),
        shape
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The dtype and shape of a C tensor, checked.
unsafe fn describe(t: &AdjTensor) -> Result<(DType, Vec<usize>), String> {
    let dtype = dtype_of(t.dtype).ok_or_else(|| {
        format!(
            "unknown dtype code {} (0 f32, 1 f64, 2 i32, 3 i64, 4 bool, 5 u8)",
            t.dtype
        )
    })?;
    if !(0..=64).contains(&t.rank) {
        return Err(format!("rank {} is out of range (0 to 64)", t.rank));
    }
    let rank = t.rank as usize;
    let dims: &[i64] = if rank == 0 {
        &[]
    } else if t.shape.is_null() {
        return Err(format!("rank {rank} with a null shape"));
    } else {
        // SAFETY: the caller passes `rank` dimensions.
        unsafe { std::slice::from_raw_parts(t.shape, rank) }
    };
    let mut shape = Vec::with_capacity(rank);
    let mut n: usize = 1;
    for &d in dims {
        let d = usize::try_from(d).map_err(|_| format!("negative dimension {d}"))?;
        n = n
            .checked_mul(d)
            .filter(|n| n.checked_mul(dtype.size_bytes()).is_some())
            .ok_or("the shape is too large")?;
        shape.push(d);
    }
    if n > 0 {
        if t.data.is_null() {
            return Err("null data".into());
        }
        let align = match dtype {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::Bool | DType::U8 => 1,
        };
        if !(t.data as usize).is_multiple_of(align) {
            return Err(format!("data is not aligned for {} elements", dtype.name()));
        }
    }
    Ok((dtype, shape))
}

/// A runtime tensor holding a copy of a C tensor.
unsafe fn read_tensor(t: &AdjTensor) -> Result<Tensor, String> {
    // SAFETY: the caller's contract.
    let (dtype, shape) = unsafe { describe(t) }?;
    let n: usize = shape.iter().product();
    /// SAFETY: `describe` checked data is non-null and aligned when n > 0.
    unsafe fn copy<T: Copy>(p: *mut c_void, n: usize) -> Vec<T> {
        if n == 0 {
            Vec::new()
        } else {
            // SAFETY: see above.
            unsafe { std::slice::from_raw_parts(p as *const T, n) }.to_vec()
        }
    }
    let p = t.data;
    // SAFETY: `describe` checked the pointer for the dtype and length.
    let r = unsafe {
        match dtype {
            DType::F32 => Tensor::from_vec(copy::<f32>(p, n), &shape),
            DType::F64 => Tensor::from_vec(copy::<f64>(p, n), &shape),
            DType::I32 => Tensor::from_vec(copy::<i32>(p, n), &shape),
            DType::I64 => Tensor::from_vec(copy::<i64>(p, n), &shape),
            DType::U8 => Tensor::from_vec(copy::<u8>(p, n), &shape),
            DType::Bool => {
                let v: Vec<bool> = copy::<u8>(p, n).into_iter().map(|b| b != 0).collect();
                Tensor::from_vec(v, &shape)
            }
        }
    };
    r.map_err(|e| e.to_string())
}

/// Copies `t` into the C tensor `o` (checked by `describe` to have its
/// dtype and shape).
unsafe fn write_tensor(o: &mut AdjTensor, t: &Tensor) {
    let n = t.len();
    if n == 0 {
        return;
    }
    /// SAFETY: `o` holds `src.len()` elements of `T`.
    unsafe fn put<T: Copy>(o: *mut c_void, src: &[T]) {
        // SAFETY: see above.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), o as *mut T, src.len()) }
    }
    let p = o.data;
    // SAFETY: the caller checked the buffer.
    unsafe {
        match t.dtype() {
            DType::F32 => put(p, t.as_f32().unwrap_or(&[])),
            DType::F64 => put(p, t.as_f64().unwrap_or(&[])),
            DType::I32 => put(p, t.as_i32().unwrap_or(&[])),
            DType::I64 => put(p, t.as_i64().unwrap_or(&[])),
            DType::U8 => put(p, t.as_u8().unwrap_or(&[])),
            DType::Bool => {
                let v: Vec<u8> = t
                    .as_bool()
                    .unwrap_or(&[])
                    .iter()
                    .map(|b| *b as u8)
                    .collect();
                put(p, &v)
            }
        }
    }
}

/// The tensors of a result, in order (`None` for a symbolic zero).
fn flatten(v: &Value, out: &mut Vec<Option<Tensor>>) -> Result<(), String> {
    match v {
        Value::Tensor(t) => out.push(Some(t.clone())),
        Value::Zero => out.push(None),
        Value::Tuple(items) => {
            for i in items.iter() {
                flatten(i, out)?;
            }
        }
        Value::Record(r) => {
            for (_, i) in &r.fields {
                flatten(i, out)?;
            }
        }
        Value::Str(_) => return Err("a string cannot be returned through the C interface".into()),
        Value::Func(_) | Value::Tape(_) => {
            return Err("a function cannot be returned through the C interface".into())
        }
        Value::DType(_) => return Err("a dtype cannot be returned through the C interface".into()),
        Value::Io | Value::Env(_) => {
            return Err("internal error: an IO token or environment as a result".into())
        }
        Value::Batched(_) | Value::Lanes(_) => {
            return Err("a value mapped by `vmap` escaped its function".into())
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `f(x, y) = sum(x * y)` and `g(x) = (x, x * 2.0)` as a library
    /// carries them.
    const BLOB: &str = concat!(
        "// adjoint aot 1 ",
        env!("CARGO_PKG_VERSION"),
        "
// entry f 0
// entry g 1
graph @f(%0 x, %1 y) {
  %2 = mul(%0, %1)
  %3 = sum(%2, (), false)
  return %3
}

graph @g(%4 x) {
  %5 = mul(%4, 2.0)
  %6 = make_tuple(%4, %5)
  return %6
}
"
    );

    fn last_error() -> String {
        let p = adjoint_last_error();
        // SAFETY: a valid C string until the next call on this thread.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }

    fn t(data: *mut c_void, shape: &[i64], dtype: DType) -> AdjTensor {
        AdjTensor {
            data,
            shape: shape.as_ptr(),
            rank: shape.len() as i32,
            dtype: dtype_code(dtype),
        }
    }

    fn call(entry: usize, ins: &[AdjTensor], outs: &mut [AdjTensor]) -> i32 {
        // SAFETY: the tensors point at live buffers of their shapes.
        unsafe {
            adjoint_aot_call(
                BLOB.as_ptr(),
                BLOB.len(),
                entry,
                ins.as_ptr(),
                ins.len(),
                outs.as_mut_ptr(),
                outs.len(),
            )
        }
    }

    #[test]
    fn calls_check_and_copy() {
        let mut x = [1.0f64, 2.0, 3.0];
        let mut y = [0.5f64, -1.0, 4.0];
        let mut v = 0.0f64;
        let s3 = [3i64];
        let ins = [
            t(x.as_mut_ptr().cast(), &s3, DType::F64),
            t(y.as_mut_ptr().cast(), &s3, DType::F64),
        ];
        let mut outs = [t((&mut v as *mut f64).cast(), &[], DType::F64)];
        assert_eq!(call(0, &ins, &mut outs), ADJ_OK, "{}", last_error());
        assert_eq!(v, 0.5 - 2.0 + 12.0);
        assert_eq!(last_error(), "");

        // A tuple result is flattened; f32 stays f32.
        let mut a = [1.5f32, -2.0];
        let (mut r0, mut r1) = ([0f32; 2], [0f32; 2]);
        let s2 = [2i64];
        let ins = [t(a.as_mut_ptr().cast(), &s2, DType::F32)];
        let mut outs = [
            t(r0.as_mut_ptr().cast(), &s2, DType::F32),
            t(r1.as_mut_ptr().cast(), &s2, DType::F32),
        ];
        assert_eq!(call(1, &ins, &mut outs), ADJ_OK, "{}", last_error());
        assert_eq!((r0, r1), ([1.5, -2.0], [3.0, -4.0]));

        // Errors: a wrong dtype, too few outputs, a bad entry, a bad dtype code.
        let mut outs = [
            t(r0.as_mut_ptr().cast(), &s2, DType::F64),
            t(r1.as_mut_ptr().cast(), &s2, DType::F32),
        ];
        assert_eq!(call(1, &ins, &mut outs), ADJ_ERROR);
        assert_eq!(last_error(), "g: result 0 is f32[2], but out[0] is f64[2]");
        assert_eq!(call(1, &ins, &mut outs[..1]), ADJ_ERROR);
        assert_eq!(
            last_error(),
            "g returns 2 tensors (f32[2], f32[2]), but n_out is 1"
        );
        assert_eq!(call(7, &ins, &mut outs), ADJ_ERROR);
        assert_eq!(last_error(), "the library has no entry 7");
        let mut bad = ins;
        bad[0].dtype = 9;
        assert_eq!(call(1, &bad, &mut outs), ADJ_ERROR);
        assert!(last_error().starts_with("g: in[0]: unknown dtype code 9"));
        // Shapes that do not broadcast: the program's own error.
        let ins = [
            t(x.as_mut_ptr().cast(), &s3, DType::F64),
            t(y.as_mut_ptr().cast(), &s2, DType::F64),
        ];
        let mut outs = [t((&mut v as *mut f64).cast(), &[], DType::F64)];
        assert_eq!(call(0, &ins, &mut outs), ADJ_ERROR);
        assert!(last_error().starts_with("f: "), "{}", last_error());
        // Null pointers.
        // SAFETY: null is checked before use.
        let rc = unsafe {
            adjoint_aot_call(
                std::ptr::null(),
                0,
                0,
                ins.as_ptr(),
                2,
                outs.as_mut_ptr(),
                1,
            )
        };
        assert_eq!(rc, ADJ_ERROR);
        // SAFETY: as above.
        let rc = unsafe {
            adjoint_aot_call(
                BLOB.as_ptr(),
                BLOB.len(),
                0,
                std::ptr::null(),
                2,
                outs.as_mut_ptr(),
                1,
            )
        };
        assert_eq!(rc, ADJ_ERROR);
        assert_eq!(last_error(), "f: `in` is null");
    }

    #[test]
    fn declared_types_are_checked() {
        let blob = BLOB.replace(
            "// entry f 0\n",
            "// param x f64[3]\n// param y f64\n// entry f 0\n",
        );
        let m = AotModule::parse(&blob).expect("the blob parses");
        let sig = |a: DType, b: DType| vec![(a, vec![3]), (b, vec![3])];
        assert!(m.compile(0, &sig(DType::F64, DType::F64)).is_ok());
        let err = |r: Result<Compiled, String>| r.err().unwrap_or_default();
        assert_eq!(
            err(m.compile(0, &sig(DType::F32, DType::F64))),
            "f: in[0] is f32[3], but `x` is declared f64[3]"
        );
        assert_eq!(
            err(m.compile(0, &sig(DType::F64, DType::I64))),
            "f: in[1] is i64[3], but `y` is declared f64"
        );
        assert_eq!(
            err(m.compile(0, &[(DType::F64, vec![2]), (DType::F64, vec![2])])),
            "f: in[0] is f64[2], but `x` is declared f64[3]"
        );
    }

    #[test]
    fn a_blob_of_another_version_is_refused() {
        let text = "// adjoint aot 0\n";
        let mut v = 0.0f64;
        let mut outs = [t((&mut v as *mut f64).cast(), &[], DType::F64)];
        // SAFETY: a valid blob pointer and output.
        let rc = unsafe {
            adjoint_aot_call(
                text.as_ptr(),
                text.len(),
                0,
                std::ptr::null(),
                0,
                outs.as_mut_ptr(),
                1,
            )
        };
        assert_eq!(rc, ADJ_ERROR);
        assert!(last_error().contains("another version of adjoint"));
    }

    #[test]
    fn large_element_wise_chains_are_fused() {
        let m = AotModule::parse(BLOB).expect("the blob parses");
        let c = m
            .compile(
                0,
                &[(DType::F32, vec![256, 64]), (DType::F32, vec![256, 64])],
            )
            .expect("compiles");
        assert_eq!(c.kernels().len(), 1, "{:?}", c.kernels());
    }
}
