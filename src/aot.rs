//! `adjoint build`: a native library (or object file) exporting an Adjoint
//! function, and optionally its gradient, with a C ABI, and the C header
//! that declares it.
//!
//! The object file comes from `adjoint_compiler::aot::emit_object`
//! (`cranelift-object`): it holds the optimised program as data and one
//! exported function per entry. A shared library is that object linked by
//! the system C compiler with the `adjoint-capi` static library, which
//! runs the program (see `capi/src/lib.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

use adjoint_compiler::aot::{Entry, Param};
use adjoint_compiler::infer::{AbsTensor, AbsVal, InferOptions};
use adjoint_lang::{ast, Diagnostic, FileId};

use crate::{with_stack, Mode, Session, SessionError};

/// The file name of the runtime's static library, looked for next to the
/// running `adjoint` executable.
pub const RUNTIME_LIB: &str = "libadjoint_capi.a";

/// The name of the generated gradient function in the program.
const GRAD_DRIVER: &str = "__adjoint_aot_grad";
/// The name of the generated value-and-gradient function.
const VG_DRIVER: &str = "__adjoint_aot_value_and_grad";

/// What `adjoint build` makes.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// The program.
    pub file: PathBuf,
    /// The function to export.
    pub entry: String,
    /// Also export `ENTRY_grad`, its gradient.
    pub with_grad: bool,
    /// The parameters the gradient is taken with respect to (default:
    /// all).
    pub wrt: Option<Vec<String>>,
    /// The library to write: an object file when the name ends in `.o`,
    /// else a shared library.
    pub output: PathBuf,
    /// The C header to write (default: `ENTRY.h` beside the output).
    pub header: Option<PathBuf>,
    /// The runtime's static library (default: [`RUNTIME_LIB`] beside the
    /// running executable).
    pub runtime: Option<PathBuf>,
    /// The C compiler that links shared libraries.
    pub cc: String,
}

/// The files `build` wrote.
#[derive(Clone, Debug)]
pub struct Built {
    /// The shared library or object file.
    pub library: PathBuf,
    /// The C header.
    pub header: PathBuf,
}

fn fail(message: impl Into<String>) -> SessionError {
    SessionError::message(message.into())
}

fn is_c_identifier(s: &str) -> bool {
    let mut cs = s.chars();
    matches!(cs.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The parameters of function `name` in the program text, with their
/// declared types, or an error naming what is wrong.
fn parameters(path: &Path, text: &str, name: &str) -> Result<Vec<Param>, SessionError> {
    let (module, diags) = adjoint_lang::parse(FileId(0), text);
    if diags.iter().any(|d| d.is_error()) {
        // The program's own diagnostics, rendered with the source.
        Session::new(Mode::Graph).load_file(path)?;
    }
    let def = module.items.iter().find_map(|i| match i {
        ast::Item::Fn(d) if d.name.name == name => Some(d),
        _ => None,
    });
    let Some(def) = def else {
        return Err(fail(format!("{} has no function `{name}`", path.display())));
    };
    let mut params = Vec::new();
    for p in &def.params {
        let pname = p.name.name.clone();
        let declared = match p.ty.as_ref().map(|t| &t.kind) {
            None => None,
            Some(ast::TypeKind::Tensor { dtype, dims }) => {
                let Some(d) = adjoint_runtime::DType::from_name(&dtype.name) else {
                    return Err(fail(format!(
                        "parameter `{pname}` of `{name}` has an unknown dtype `{}`",
                        dtype.name
                    )));
                };
                let shape = match dims {
                    None => None,
                    Some(ds) => Some(
                        ds.iter()
                            .map(|x| usize::try_from(*x))
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(|_| {
                                fail(format!(
                                    "parameter `{pname}` of `{name}` has a negative dimension"
                                ))
                            })?,
                    ),
                };
                Some((d, shape))
            }
            Some(_) => {
                return Err(fail(format!(
                    "parameter `{pname}` of `{name}` is declared a tuple or record: functions built ahead of time take tensors"
                )))
            }
        };
        params.push(Param {
            name: pname,
            declared,
        });
    }
    Ok(params)
}

/// Builds the library and header `opts` describe.
pub fn build(opts: &BuildOptions) -> Result<Built, SessionError> {
    let entry = opts.entry.as_str();
    if !is_c_identifier(entry) || entry.starts_with("adjoint_") || entry.starts_with("__") {
        return Err(fail(format!(
            "`{entry}` cannot be exported to C: an entry must be a C identifier not starting with `adjoint_` or `__`"
        )));
    }
    let text = std::fs::read_to_string(&opts.file).map_err(|e| SessionError::io(&opts.file, e))?;
    let declared = parameters(&opts.file, &text, entry)?;
    let params: Vec<String> = declared.iter().map(|p| p.name.clone()).collect();
    if opts.with_grad && params.is_empty() {
        return Err(fail(format!(
            "`{entry}` takes no arguments: --with-grad has nothing to differentiate"
        )));
    }
    let wrt: Vec<usize> = match &opts.wrt {
        None => (0..params.len()).collect(),
        Some(names) => {
            if !opts.with_grad {
                return Err(fail("--wrt needs --with-grad"));
            }
            let mut ks = Vec::new();
            for n in names {
                match params.iter().position(|p| p == n) {
                    Some(k) if !ks.contains(&k) => ks.push(k),
                    Some(_) => return Err(fail(format!("--wrt names `{n}` twice"))),
                    None => {
                        return Err(fail(format!(
                            "`{entry}` has no parameter `{n}` (its parameters: {})",
                            params.join(", ")
                        )))
                    }
                }
            }
            if ks.is_empty() {
                return Err(fail("--wrt names no parameter"));
            }
            ks
        }
    };
    let is_object = opts.output.extension().is_some_and(|e| e == "o");
    let runtime = if is_object {
        None
    } else {
        Some(runtime_library(opts.runtime.as_deref())?)
    };

    // The gradient is a generated function of the program.
    let grad_name = format!("{entry}_grad");
    let extra = if opts.with_grad {
        let args: Vec<String> = (0..params.len()).map(|i| format!("a{i}")).collect();
        let argnums: Vec<String> = wrt.iter().map(|i| i.to_string()).collect();
        format!(
            "fn {GRAD_DRIVER}({a}) = grad({entry}, argnums = ({n},))({a})\n\
             fn {VG_DRIVER}({a}) = value_and_grad({entry}, argnums = ({n},))({a})\n",
            a = args.join(", "),
            n = argnums.join(", ")
        )
    } else {
        String::new()
    };
    let session = Session::new(Mode::Graph).load_file_with(&opts.file, &extra)?;
    let program = session.program()?;
    let Some(g) = program.function(entry) else {
        return Err(fail(format!(
            "{} has no function `{entry}`",
            opts.file.display()
        )));
    };
    if program.lowered.effectful.contains(&g) {
        let loc = program.lowered.module.graph(g).loc;
        let span = adjoint_compiler::lower::span_of(loc)
            .unwrap_or(adjoint_lang::Span::point(program.root, 0));
        return Err(session.error(vec![Diagnostic::error(
            format!("`{entry}` performs IO (printing, loading or saving files): a function built ahead of time must be pure"),
            span,
        )]));
    }
    let mut entries = vec![Entry {
        name: entry.to_string(),
        graph: g,
        grad_of: None,
    }];
    if opts.with_grad {
        let d = program
            .function(GRAD_DRIVER)
            .ok_or_else(|| fail("internal error: the gradient function is missing"))?;
        entries.push(Entry {
            name: grad_name.clone(),
            graph: d,
            grad_of: Some((0, wrt.clone())),
        });
        let vg = program
            .function(VG_DRIVER)
            .ok_or_else(|| fail("internal error: the value-and-gradient function is missing"))?;
        entries.push(Entry {
            name: format!("{entry}_value_and_grad"),
            graph: vg,
            grad_of: Some((0, wrt.clone())),
        });
    }
    // With every parameter's dtype and shape declared, the entries are
    // type-checked now, with errors at their place in the source.
    if let Some(args) = declared
        .iter()
        .map(|p| match &p.declared {
            Some((d, Some(s))) => Some(AbsVal::Tensor(AbsTensor::new(*d, s.clone(), false))),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
    {
        for e in &entries {
            with_stack(|| type_check(program, e.graph, &args)).map_err(|d| {
                if e.grad_of.is_none() {
                    session.error(d)
                } else {
                    // Errors of the generated gradient function: its text
                    // is not the user's, so say what failed in words.
                    let msgs: Vec<String> = d.iter().map(|d| d.message.clone()).collect();
                    fail(format!("{}: {}", e.name, msgs.join("; ")))
                }
            })?;
        }
    }
    let blob = with_stack(|| adjoint_compiler::aot::blob_text(program, &entries, &declared))
        .map_err(fail)?;
    let names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
    let object = adjoint_compiler::aot::emit_object(blob.as_bytes(), &names).map_err(fail)?;

    let header_path = opts.header.clone().unwrap_or_else(|| {
        opts.output
            .parent()
            .unwrap_or(Path::new(""))
            .join(format!("{entry}.h"))
    });
    let header = header_text(
        &opts.file,
        entry,
        &declared,
        opts.with_grad.then_some((&grad_name, &wrt[..])),
    );
    write(&header_path, header.as_bytes())?;
    match runtime {
        None => write(&opts.output, &object)?,
        Some(rt) => link(opts, &object, &rt, &names)?,
    }
    Ok(Built {
        library: opts.output.clone(),
        header: header_path,
    })
}

/// Type-checks entry `g` of `program` for arguments of types `args`, with
/// the checks that need types (annotations, differentiation).
fn type_check(
    program: &adjoint_compiler::pipeline::Program,
    g: adjoint_compiler::ir::GraphId,
    args: &[AbsVal],
) -> Result<(), Vec<Diagnostic>> {
    let m = &program.lowered.module;
    let internal: Vec<u32> = program.lowered.stdlib_files.iter().map(|f| f.0).collect();
    let opts = InferOptions {
        internal_files: &internal,
        ..InferOptions::default()
    };
    let at = |loc| {
        adjoint_compiler::lower::span_of(loc).unwrap_or(adjoint_lang::Span::point(program.root, 0))
    };
    let types = adjoint_compiler::infer::infer_module_with(m, g, args, &opts).map_err(|e| {
        let mut d = Diagnostic::error(e.message.clone(), at(e.loc));
        for (l, msg) in &e.secondary {
            if let Some(s) = adjoint_compiler::lower::span_of(*l) {
                d = d.with_secondary(s, msg.clone());
            }
        }
        vec![d]
    })?;
    let failed = adjoint_compiler::checks::run(
        &program.lowered.checks,
        m,
        &types,
        &program.lowered.ad_provenance.origin,
        false,
    );
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed)
    }
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), SessionError> {
    std::fs::write(path, bytes)
        .map_err(|e| fail(format!("cannot write \"{}\": {e}", path.display())))
}

/// The runtime's static library: the one given, or the one beside the
/// running executable (the same cargo profile directory).
fn runtime_library(given: Option<&Path>) -> Result<PathBuf, SessionError> {
    if let Some(p) = given {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(fail(format!(
                "the runtime library \"{}\" does not exist",
                p.display()
            )))
        };
    }
    let exe = std::env::current_exe()
        .map_err(|e| fail(format!("cannot find the adjoint executable: {e}")))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let lib = dir.join(RUNTIME_LIB);
    if lib.is_file() {
        return Ok(lib);
    }
    let release = dir.file_name().is_some_and(|n| n == "release");
    Err(fail(format!(
        "the runtime library \"{}\" is missing: build it with `cargo build{} -p adjoint-capi` (or give its path with --runtime, or write an object file with `-o NAME.o` and link it yourself)",
        lib.display(),
        if release { " --release" } else { "" }
    )))
}

/// Links `object` with the runtime into the shared library `opts.output`,
/// exporting only the entries and `adjoint_last_error`.
fn link(
    opts: &BuildOptions,
    object: &[u8],
    runtime: &Path,
    names: &[String],
) -> Result<(), SessionError> {
    let tmp = std::env::temp_dir().join(format!(
        "adjoint-build-{}-{}",
        std::process::id(),
        opts.entry
    ));
    std::fs::create_dir_all(&tmp)
        .map_err(|e| fail(format!("cannot create \"{}\": {e}", tmp.display())))?;
    let result = (|| {
        let obj = tmp.join(format!("{}.o", opts.entry));
        write(&obj, object)?;
        let script = tmp.join("exports.map");
        let mut exports: Vec<String> = names.to_vec();
        exports.push("adjoint_last_error".into());
        let globals: String = exports.iter().map(|n| format!("{n}; ")).collect();
        write(
            &script,
            format!("{{ global: {globals}local: *; }};\n").as_bytes(),
        )?;
        let out = Command::new(&opts.cc)
            .arg("-shared")
            .arg("-o")
            .arg(&opts.output)
            .arg(&obj)
            .arg(runtime)
            .arg(format!("-Wl,--version-script={}", script.display()))
            .arg("-Wl,--gc-sections")
            .arg("-Wl,--strip-debug")
            .args(["-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"])
            .output()
            .map_err(|e| {
                fail(format!(
                    "cannot run the C compiler `{}` to link the library: {e} (set CC, or write an object file with `-o NAME.o`)",
                    opts.cc
                ))
            })?;
        if !out.status.success() {
            return Err(fail(format!(
                "linking \"{}\" failed ({}):\n{}",
                opts.output.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim_end()
            )));
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// The C header of a library.
fn header_text(
    file: &Path,
    entry: &str,
    declared: &[Param],
    grad: Option<(&String, &[usize])>,
) -> String {
    let params: Vec<String> = declared.iter().map(|p| p.name.clone()).collect();
    let guard = format!("ADJOINT_{}_H", entry.to_ascii_uppercase());
    let plist = params.join(", ");
    let inputs: String = declared
        .iter()
        .enumerate()
        .map(|(i, p)| match p.declared_type() {
            Some(t) => format!(" *     in[{i}] = {}: {t}\n", p.name),
            None => format!(" *     in[{i}] = {}\n", p.name),
        })
        .collect();
    let mut h = format!(
        r#"/* Generated by `adjoint build` from {file}: do not edit. */
#ifndef {guard}
#define {guard}

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {{
#endif

#ifndef ADJOINT_TENSOR_DEFINED
#define ADJOINT_TENSOR_DEFINED
/* Element types (adj_tensor.dtype). bool elements are one byte, 0 or 1. */
enum {{ ADJ_F32 = 0, ADJ_F64 = 1, ADJ_I32 = 2, ADJ_I64 = 3, ADJ_BOOL = 4, ADJ_U8 = 5 }};

/* A tensor: `rank` dimensions in `shape` (may be NULL for a scalar,
 * rank 0), elements row-major and contiguous in `data`. */
typedef struct adj_tensor {{
    void *data;
    const int64_t *shape;
    int32_t rank;
    int32_t dtype;
}} adj_tensor;

/* Status codes of the functions below. */
enum {{ ADJ_OK = 0, ADJ_ERROR = 1, ADJ_INTERNAL = 2 }};

/* Why the last call on this thread failed ("" after a success). Valid
 * until the next call on this thread. */
const char *adjoint_last_error(void);
#endif

/* Every function takes its inputs in `in` (copied; any dtype and shape the
 * program accepts) and writes its results into `out`, whose buffers,
 * shapes and dtypes the caller provides: results are tensors, tuples of
 * results flattened in order, and each must match its `out` exactly.
 * The first call with a new signature of input dtypes and shapes compiles
 * the function for it. Returns ADJ_OK, or another status with a message
 * from adjoint_last_error(). */

/* {entry}({plist})
 *   n_in = {n}:
{inputs} *   out: the results of {entry}.
 */
int {entry}(const adj_tensor *in, size_t n_in, adj_tensor *out, size_t n_out);
"#,
        file = file.display().to_string().replace("*/", "* /"),
        n = params.len(),
    );
    if let Some((g, wrt)) = grad {
        let outs: String = wrt
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let p = &params[*k];
                format!(" *     out[{i}] = d {entry} / d {p} (the dtype and shape of {p})\n")
            })
            .collect();
        let wrt_names: Vec<&str> = wrt.iter().map(|k| params[*k].as_str()).collect();
        h.push_str(&format!(
            r#"
/* {g}({plist}): the gradient of {entry} (which must return a float
 * scalar) with respect to {wrt_list}.
 *   n_in = {n}:
{inputs} *   n_out = {nw}:
{outs} */
int {g}(const adj_tensor *in, size_t n_in, adj_tensor *out, size_t n_out);

/* {entry}_value_and_grad({plist}): {entry} and {g} in one call (one
 * forward pass): out[0] = the value of {entry}, then the gradients as
 * out[1..{nw}] of {g}.
 *   n_in = {n}, n_out = 1 + {nw}.
 */
int {entry}_value_and_grad(const adj_tensor *in, size_t n_in, adj_tensor *out, size_t n_out);
"#,
            n = params.len(),
            nw = wrt.len(),
            wrt_list = wrt_names.join(", "),
        ));
    }
    h.push_str(&format!(
        r#"
#ifdef __cplusplus
}}
#endif

#endif /* {guard} */
"#
    ));
    h
}
