//! Ahead-of-time artefacts (`adjoint build`).
//!
//! A library built ahead of time carries the compiled program as data: the
//! IR text of the optimised module holding the exported entry functions
//! (for `--with-grad`, a generated graph computing `grad(F)` too). This
//! module makes that text ([`blob_text`]), reads it back ([`AotModule`]),
//! specialises an entry to the dtypes and shapes of its arguments (fusion
//! and Cranelift kernels, compiled on the first call with that signature)
//! and runs it; and it writes, with `cranelift-object`, the object file
//! whose exported C functions hand the blob to the runtime entry
//! [`RUNTIME_ENTRY`] (implemented by the `adjoint-capi` crate).

use adjoint_runtime::tensor::DType;
use adjoint_runtime::value::Value;
use adjoint_runtime::vm::Vm;

use crate::infer::{AbsTensor, AbsVal, InferOptions};
use crate::ir::print::print_module;
use crate::ir::{GraphId, Module};
use crate::pipeline::Program;
use crate::vmgen::{self, Executable};

/// The first line of every blob (the format and the compiler's version);
/// it is checked when the blob is read.
pub const BLOB_MAGIC: &str = concat!("// adjoint aot 1 ", env!("CARGO_PKG_VERSION"));

/// The symbol of the runtime function the exported functions call:
/// `int32_t adjoint_aot_call(const uint8_t* blob, size_t blob_len,
/// size_t entry, const adj_tensor* in, size_t n_in, adj_tensor* out,
/// size_t n_out)`.
pub const RUNTIME_ENTRY: &str = "adjoint_aot_call";

/// An exported function of a library.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The C symbol.
    pub name: String,
    pub graph: GraphId,
    /// For a gradient, the index of the entry it differentiates and the
    /// parameters it differentiates with respect to: calls check what type
    /// checking checks for `grad` in a program (a float scalar result,
    /// float arguments).
    pub grad_of: Option<(usize, Vec<usize>)>,
}

/// A parameter of the entries as declared in the source: its name and,
/// when annotated, its dtype and (when written) shape, which calls are
/// checked against.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: String,
    pub declared: Option<(DType, Option<Vec<usize>>)>,
}

impl Param {
    /// The declared type as source writes it (`f32[3, 4]`, `f64`).
    pub fn declared_type(&self) -> Option<String> {
        let (d, shape) = self.declared.as_ref()?;
        Some(match shape {
            Some(s) => adjoint_runtime::TensorTy::new(*d, s).to_string(),
            None => d.name().to_string(),
        })
    }
}

/// The IR text that a library carries for `entries` (in the order of the
/// entry indices): the optimised module reached
/// from them, with a header naming the entries. The text is checked to
/// read back to the same module.
pub fn blob_text(program: &Program, entries: &[Entry], params: &[Param]) -> Result<String, String> {
    let roots: Vec<GraphId> = entries.iter().map(|e| e.graph).collect();
    if crate::vmgen::uses_dynamic_ad(&program.lowered.module, &roots) {
        return Err("this function differentiates a function value at run time (`grad` of a parameter or of a value from a tuple); ahead-of-time builds do not support it yet".into());
    }
    let (m, _) = program.optimized(&roots);
    if let Err(errors) = crate::ir::verify::verify_reachable(&m, &roots) {
        return Err(format!(
            "internal error: the optimiser produced invalid IR: {}",
            errors.join("; ")
        ));
    }
    let body = print_module(&m, &roots, None);
    // Where each entry's graph is in the text (the printer puts a root's
    // graphs after it, before the next root).
    let layout = crate::ir::print::layout(&m, &roots);
    let positions: Vec<usize> = roots
        .iter()
        .map(|g| layout.position(*g))
        .collect::<Option<_>>()
        .ok_or("internal error: an entry is not printed")?;
    // The library is only as good as the text: check that it reads back.
    let (back, graphs) = crate::ir::parse::parse_module(&body)
        .map_err(|e| format!("internal error: the IR text does not read back: {e}"))?;
    let back_roots: Vec<GraphId> = positions
        .iter()
        .map(|p| graphs.get(*p).copied())
        .collect::<Option<_>>()
        .ok_or("internal error: the IR text lacks an entry")?;
    let again = print_module(&back, &back_roots, None);
    if again != body {
        let (n, (a, b)) = body
            .lines()
            .zip(again.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .unwrap_or((0, ("", "")));
        return Err(format!(
            "internal error: the IR text does not read back to the same module (line {}: `{a}` reads back as `{b}`)",
            n + 1
        ));
    }
    let mut text = format!("{BLOB_MAGIC}\n");
    for p in params {
        let ty = match &p.declared {
            None => "any".to_string(),
            Some((d, None)) => d.name().to_string(),
            Some((d, Some(s))) => {
                let dims: Vec<String> = s.iter().map(|x| x.to_string()).collect();
                format!("{}[{}]", d.name(), dims.join(","))
            }
        };
        text.push_str(&format!("// param {} {ty}\n", p.name));
    }
    for (e, p) in entries.iter().zip(&positions) {
        match &e.grad_of {
            None => text.push_str(&format!("// entry {} {p}\n", e.name)),
            Some((i, wrt)) => {
                let wrt: Vec<String> = wrt.iter().map(|k| k.to_string()).collect();
                text.push_str(&format!(
                    "// entry {} {p} grad-of {i} wrt {}\n",
                    e.name,
                    wrt.join(",")
                ))
            }
        }
    }
    text.push_str(&body);
    Ok(text)
}

/// An exported entry: its name, graph and (for a gradient) the
/// differentiated entry and parameters.
type LoadedEntry = (String, GraphId, Option<(usize, Vec<usize>)>);

/// A program read back from a blob.
pub struct AotModule {
    module: Module,
    /// The entries, by entry index.
    entries: Vec<LoadedEntry>,
    /// The parameters of the entries, as declared.
    params: Vec<Param>,
}

impl AotModule {
    /// Reads a blob written by [`blob_text`].
    pub fn parse(text: &str) -> Result<AotModule, String> {
        let mut lines = text.lines();
        if lines.next() != Some(BLOB_MAGIC) {
            return Err(
                "the library's program was written by another version of adjoint (rebuild it with `adjoint build`)"
                    .into(),
            );
        }
        let bad = || "the library's program has a bad entry line".to_string();
        let mut lines = lines.peekable();
        let mut params = Vec::new();
        while let Some(l) = lines.peek().and_then(|l| l.strip_prefix("// param ")) {
            lines.next();
            let (name, ty) = l.split_once(' ').ok_or_else(bad)?;
            let declared = if ty == "any" {
                None
            } else {
                let (d, dims) = match ty.split_once('[') {
                    None => (ty, None),
                    Some((d, rest)) => {
                        let dims = rest.strip_suffix(']').ok_or_else(bad)?;
                        let dims = if dims.is_empty() {
                            Vec::new()
                        } else {
                            dims.split(',')
                                .map(|x| x.parse::<usize>())
                                .collect::<Result<Vec<_>, _>>()
                                .map_err(|_| bad())?
                        };
                        (d, Some(dims))
                    }
                };
                Some((DType::from_name(d).ok_or_else(bad)?, dims))
            };
            params.push(Param {
                name: name.to_string(),
                declared,
            });
        }
        let mut heads = Vec::new();
        for l in lines.map_while(|l| l.strip_prefix("// entry ")) {
            let words: Vec<&str> = l.split(' ').collect();
            let (name, pos, grad_of) = match words.as_slice() {
                [n, p] => (n, p, None),
                [n, p, "grad-of", i, "wrt", ks] => {
                    let i = i.parse::<usize>().map_err(|_| bad())?;
                    let ks = ks
                        .split(',')
                        .map(|k| k.parse::<usize>())
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|_| bad())?;
                    (n, p, Some((i, ks)))
                }
                _ => return Err(bad()),
            };
            heads.push((
                name.to_string(),
                pos.parse::<usize>().map_err(|_| bad())?,
                grad_of,
            ));
        }
        let (module, graphs) = crate::ir::parse::parse_module(text)
            .map_err(|e| format!("the library's program does not parse: {e}"))?;
        let entries = heads
            .into_iter()
            .map(|(n, p, d)| Some((n, *graphs.get(p)?, d)))
            .collect::<Option<Vec<_>>>()
            .ok_or("the library's program lacks some of its entries")?;
        Ok(AotModule {
            module,
            entries,
            params,
        })
    }

    /// The number of entries.
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }

    /// The exported name of entry `i`.
    pub fn entry_name(&self, i: usize) -> Option<&str> {
        self.entries.get(i).map(|(n, _, _)| n.as_str())
    }

    /// The number of parameters of entry `i`.
    pub fn entry_arity(&self, i: usize) -> Option<usize> {
        self.entries
            .get(i)
            .map(|(_, g, _)| self.module.graph(*g).params.len())
    }

    /// Compiles entry `i` for arguments of the given dtypes and shapes:
    /// element-wise chains are fused into native kernels when inference
    /// gives their types (as graph mode does); a type error in the
    /// arguments is reported here.
    pub fn compile(&self, i: usize, args: &[(DType, Vec<usize>)]) -> Result<Compiled, String> {
        let (name, g, grad_of) = self
            .entries
            .get(i)
            .ok_or_else(|| format!("the library has no entry {i}"))?;
        for (k, (p, (d, s))) in self.params.iter().zip(args).enumerate() {
            if let Some((want_d, want_s)) = &p.declared {
                if d != want_d || want_s.as_ref().is_some_and(|w| w != s) {
                    return Err(format!(
                        "{name}: in[{k}] is {}, but `{}` is declared {}",
                        adjoint_runtime::TensorTy::new(*d, s),
                        p.name,
                        p.declared_type().unwrap_or_default()
                    ));
                }
            }
        }
        let abs: Vec<AbsVal> = args
            .iter()
            .map(|(d, s)| AbsVal::Tensor(AbsTensor::new(*d, s.clone(), false)))
            .collect();
        let opts = InferOptions {
            only_taken_branches: true,
            ..Default::default()
        };
        if let Some((f, wrt)) = grad_of {
            // What type checking checks for `grad(f)` in a program.
            for &k in wrt {
                if let Some((d, s)) = args.get(k).filter(|(d, _)| !d.is_float()) {
                    return Err(format!(
                        "{name}: in[{k}] is {}, but the gradient is taken with respect to it: it must be a float tensor",
                        adjoint_runtime::TensorTy::new(*d, s)
                    ));
                }
            }
            let (fname, fg, _) = self
                .entries
                .get(*f)
                .ok_or_else(|| format!("{name}: the library has no entry {f}"))?;
            // (When inference cannot type the program, the run reports
            // the errors.)
            let t = crate::infer::infer_module_with(&self.module, *fg, &abs, &opts);
            match t.as_ref().map_or(&AbsVal::Unknown, |t| t.result()) {
                AbsVal::Tensor(r) if !(r.dtype.is_float() && r.shape.is_empty()) => {
                    return Err(format!(
                        "{name}: {fname} returns {} for these inputs, but its gradient needs a float scalar",
                        adjoint_runtime::TensorTy::new(r.dtype, &r.shape)
                    ))
                }
                AbsVal::Tensor(_) | AbsVal::Unknown | AbsVal::Zero => {}
                _ => {
                    return Err(format!(
                        "{name}: {fname} does not return a tensor, but its gradient needs a float scalar"
                    ))
                }
            }
        }
        // Kernels need types; a program inference cannot type still runs
        // (on the reference kernels), and the VM reports its errors.
        let types = crate::infer::infer_module_with(&self.module, *g, &abs, &opts);
        // Weak literals take the type of their joins for these arguments
        // (as a program run by the command does, `crate::adopt`).
        let adopted = types
            .as_ref()
            .ok()
            .and_then(|t| crate::adopt::weak_joins(&self.module, t));
        let (module, types) = match &adopted {
            Some(m) => (m, crate::infer::infer_module_with(m, *g, &abs, &opts)),
            None => (&self.module, types),
        };
        let opts = crate::options::CompilerOptions::default();
        let plan = crate::fuse::plan(module, &[*g], types.as_ref().ok(), &opts);
        let ex = vmgen::compile_with(module, &[*g], Some(&plan), &opts)
            .map_err(|e| format!("internal error: {}", e.message))?;
        Ok(Compiled {
            ex,
            graph: *g,
            name: name.clone(),
            kernels: plan.describe(),
        })
    }
}

/// An entry compiled for one signature of its arguments.
pub struct Compiled {
    ex: Executable,
    graph: GraphId,
    name: String,
    kernels: Vec<String>,
}

impl Compiled {
    /// The fused kernels compiled for this signature, one line each.
    pub fn kernels(&self) -> &[String] {
        &self.kernels
    }

    /// Runs the entry on `args`.
    pub fn call(&self, args: Vec<Value>) -> Result<Value, String> {
        let f = self
            .ex
            .function(self.graph)
            .ok_or_else(|| "internal error: the entry is not compiled".to_string())?;
        let mut sink = std::io::sink();
        let mut vm = Vm::new(&self.ex.program, &mut sink);
        vm.call(&f, args)
            .map_err(|e| format!("{}: {}", self.name, e.message))
    }
}

/// Writes the object file of a library: a read-only copy of `blob` and, for
/// each exported name `exports[i]`, a C function
/// `int32_t NAME(const adj_tensor* in, size_t n_in, adj_tensor* out, size_t n_out)`
/// that returns [`RUNTIME_ENTRY`]`(blob, blob_len, i, in, n_in, out, n_out)`.
/// The code is position-independent (it can go into a shared library).
pub fn emit_object(blob: &[u8], exports: &[String]) -> Result<Vec<u8>, String> {
    use cranelift_codegen::ir::{types, AbiParam, InstBuilder, UserFuncName};
    use cranelift_codegen::settings::{self, Configurable};
    use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
    use cranelift_module::{DataDescription, Linkage, Module as _};
    use cranelift_object::{ObjectBuilder, ObjectModule};

    let err = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    let mut flags = settings::builder();
    flags
        .set("is_pic", "true")
        .map_err(|e| err("cranelift setting", &e))?;
    flags
        .set("opt_level", "speed")
        .map_err(|e| err("cranelift setting", &e))?;
    let isa = cranelift_native::builder()
        .map_err(|e| err("this machine is not supported", &e))?
        .finish(settings::Flags::new(flags))
        .map_err(|e| err("cranelift", &e))?;
    let builder = ObjectBuilder::new(
        isa,
        "adjoint_aot",
        cranelift_module::default_libcall_names(),
    )
    .map_err(|e| err("cranelift-object", &e))?;
    let mut module = ObjectModule::new(builder);
    let target = module.target_config();
    let ptr = target.pointer_type();

    // The program, as data local to the object.
    let data = module
        .declare_data("__adjoint_aot_blob", Linkage::Local, false, false)
        .map_err(|e| err("declaring the program's data", &e))?;
    let mut desc = DataDescription::new();
    desc.define(blob.to_vec().into_boxed_slice());
    module
        .define_data(data, &desc)
        .map_err(|e| err("defining the program's data", &e))?;

    // The runtime's entry, imported.
    let mut rt_sig = module.make_signature();
    for t in [ptr, ptr, ptr, ptr, ptr, ptr, ptr] {
        rt_sig.params.push(AbiParam::new(t));
    }
    rt_sig.returns.push(AbiParam::new(types::I32));
    let rt = module
        .declare_function(RUNTIME_ENTRY, Linkage::Import, &rt_sig)
        .map_err(|e| err("declaring the runtime entry", &e))?;

    let mut sig = module.make_signature();
    for t in [ptr, ptr, ptr, ptr] {
        sig.params.push(AbiParam::new(t));
    }
    sig.returns.push(AbiParam::new(types::I32));
    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();
    for (i, name) in exports.iter().enumerate() {
        let id = module
            .declare_function(name, Linkage::Export, &sig)
            .map_err(|e| err(&format!("declaring `{name}`"), &e))?;
        ctx.func.signature = sig.clone();
        ctx.func.name = UserFuncName::user(0, id.as_u32());
        {
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            let block = b.create_block();
            b.append_block_params_for_function_params(block);
            b.switch_to_block(block);
            let params = b.block_params(block).to_vec();
            let gv = module.declare_data_in_func(data, b.func);
            let blob_ptr = b.ins().symbol_value(ptr, gv);
            let blob_len = b.ins().iconst(ptr, blob.len() as i64);
            let entry = b.ins().iconst(ptr, i as i64);
            let callee = module.declare_func_in_func(rt, b.func);
            let call = b.ins().call(
                callee,
                &[
                    blob_ptr, blob_len, entry, params[0], params[1], params[2], params[3],
                ],
            );
            let r = b.inst_results(call)[0];
            b.ins().return_(&[r]);
            b.seal_all_blocks();
            b.finalize(target);
        }
        module
            .define_function(id, &mut ctx)
            .map_err(|e| err(&format!("compiling `{name}`"), &e))?;
        module.clear_context(&mut ctx);
    }
    module
        .finish()
        .emit()
        .map_err(|e| err("writing the object file", &e))
}
