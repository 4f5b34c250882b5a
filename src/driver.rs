//! Driver functions for `adjoint grad` and `adjoint check-grad`: small
//! Adjoint functions, generated from the command line and appended to the
//! program, that call the user's function with the given arguments.

use std::path::Path;

use adjoint_lang::{ast, FileId};

/// The name of the generated entry function.
pub const DRIVER: &str = "__adjoint_driver";

/// One command-line argument as an Adjoint expression: `.npy` paths are
/// loaded; anything else must parse as an expression (`1.5`, `[1.0, 2.0]`).
fn arg_expr(text: &str) -> Result<(String, bool), String> {
    if text.ends_with(".npy") {
        return Ok((format!("load_npy({:?})", text), true));
    }
    let (e, diags) = adjoint_lang::parser::parse_expr(FileId(0), text);
    let Some(e) = e.filter(|_| diags.is_empty()) else {
        return Err(format!("cannot read argument `{text}`: expected a number, a tensor literal such as [1.0, 2.0], or a .npy path"));
    };
    let no_derivative = match &*e.kind {
        ast::ExprKind::Int(_) | ast::ExprKind::Bool(_) | ast::ExprKind::Str(_) => true,
        ast::ExprKind::Unary { operand, .. } => matches!(*operand.kind, ast::ExprKind::Int(_)),
        _ => false,
    };
    Ok((format!("({text})"), !no_derivative))
}

/// How many parameters of `d` have no default.
fn required(d: &ast::FnDef) -> usize {
    d.params.iter().filter(|p| p.default.is_none()).count()
}

/// Checks that `file` defines `function` taking `n` arguments (its
/// defaults fill the rest); returns,
/// for each parameter, whether its annotation makes it an `f32`.
fn check_function(path: &Path, function: &str, n: usize) -> Result<Vec<bool>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read \"{}\": {e}", path.display()))?;
    let (module, _) = adjoint_lang::parse(FileId(0), &text);
    let def = module.items.iter().find_map(|i| match i {
        ast::Item::Fn(d) if d.name.name == function => Some(d),
        _ => None,
    });
    match def {
        None => Err(format!("{} has no function `{function}`", path.display())),
        Some(d) if !(required(d)..=d.params.len()).contains(&n) => {
            let total = d.params.len();
            let takes = if required(d) == total {
                format!("{total} argument{}", if total == 1 { "" } else { "s" })
            } else {
                format!("{} to {total} arguments", required(d))
            };
            Err(format!("`{function}` takes {takes}, but --at gives {n}"))
        }
        Some(d) => Ok(d
            .params
            .iter()
            .map(|p| {
                // The annotation as written, after the name's `:`.
                p.ty.is_some()
                    && text
                        .get(p.span.range())
                        .and_then(|t| t.split_once(':'))
                        .is_some_and(|(_, ty)| ty.trim_start().starts_with("f32"))
            })
            .collect()),
    }
}

/// What `adjoint check-grad` runs, and whether its finite differences are
/// taken in f32 (a differentiated parameter is annotated `f32`): then they
/// are good to about 1e-3, not 1e-6, and the default tolerance is wider.
pub struct CheckGrad {
    pub source: String,
    pub in_f32: bool,
}

/// The driver of `adjoint grad`: prints the value and the gradient with
/// respect to every float argument.
pub fn grad_driver(path: &Path, function: &str, args: &[String]) -> Result<String, String> {
    let f32_params = check_function(path, function, args.len())?;
    let parsed: Vec<(String, bool)> = args.iter().map(|a| arg_expr(a)).collect::<Result<_, _>>()?;
    let diff: Vec<usize> = (0..parsed.len()).filter(|i| parsed[*i].1).collect();
    if diff.is_empty() {
        return Err("no float argument to differentiate with respect to".into());
    }
    // An f32-annotated parameter is given an f32 (a weak literal would be
    // taken as an f64 at the call).
    let call_args: Vec<String> = parsed
        .iter()
        .zip(&f32_params)
        .map(|((e, float), f32)| {
            if *float && *f32 {
                format!("f32{e}")
            } else {
                e.clone()
            }
        })
        .collect();
    let argnums: Vec<String> = diff.iter().map(|i| i.to_string()).collect();
    let mut src = format!(
        "fn {DRIVER}() {{\n    let (__v, __g) = value_and_grad({function}, argnums = ({},))({});\n    print(\"value:\", __v);\n",
        argnums.join(", "),
        call_args.join(", ")
    );
    for (k, i) in diff.iter().enumerate() {
        src.push_str(&format!("    print(\"gradient {i}:\", __g.{k});\n"));
    }
    src.push_str("}\n");
    Ok(src)
}

/// The driver of `adjoint check-grad`: compares reverse mode with central
/// finite differences and with forward mode, element by element, in f64.
/// Returns the worst relative error as the function's result.
pub fn check_grad_driver(
    path: &Path,
    function: &str,
    args: &[String],
) -> Result<CheckGrad, String> {
    let f32_params = check_function(path, function, args.len())?;
    let parsed: Vec<(String, bool)> = args.iter().map(|a| arg_expr(a)).collect::<Result<_, _>>()?;
    let diff: Vec<usize> = (0..parsed.len()).filter(|i| parsed[*i].1).collect();
    if diff.is_empty() {
        return Err("no float argument to differentiate with respect to".into());
    }
    let in_f32 = diff.iter().any(|&i| f32_params[i]);
    let mut src = format!("fn {DRIVER}() {{\n");
    for (i, (e, is_float)) in parsed.iter().enumerate() {
        if *is_float {
            let d = if f32_params[i] { "f32" } else { "f64" };
            src.push_str(&format!("    let __a{i} = {d}({e});\n"));
        } else {
            src.push_str(&format!("    let __a{i} = {e};\n"));
        }
    }
    let all: Vec<String> = (0..parsed.len()).map(|i| format!("__a{i}")).collect();
    let argnums: Vec<String> = diff.iter().map(|i| i.to_string()).collect();
    src.push_str(&format!(
        "    let __g = grad({function}, argnums = ({},))({});\n    let __h = {};\n    let mut __worst_fd = 0.0;\n    let mut __worst_fwd = 0.0;\n",
        argnums.join(", "),
        all.join(", "),
        if in_f32 { "1e-2" } else { "1e-6" },
    ));
    if in_f32 {
        src.push_str("    print(\"finite differences in f32 (parameters annotated f32)\");\n");
    }
    for (k, i) in diff.iter().enumerate() {
        let with = |sub: &str| -> String {
            (0..parsed.len())
                .map(|j| {
                    if j == *i {
                        sub.to_string()
                    } else {
                        format!("__a{j}")
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let tangents: Vec<String> = (0..parsed.len())
            .map(|j| {
                if j == *i {
                    "__e".to_string()
                } else {
                    format!("zeros_like(__a{j})")
                }
            })
            .collect();
        src.push_str(&format!(
            "    for __k in 0..size(__a{i}) {{\n        let __e = reshape(one_hot(__k, size(__a{i}), dtype = dtype(__a{i})), shape(__a{i}));\n        let __fd = ({function}({plus}) - {function}({minus})) / (2.0 * __h);\n        let __rev = sum(__g.{k} * __e);\n        let __fwd = jvp({function}, ({all},), ({tan},)).1;\n        let __scale = maximum(maximum(abs(__rev), abs(__fd)), 1e-6);\n        __worst_fd = maximum(__worst_fd, abs(__rev - __fd) / __scale);\n        __worst_fwd = maximum(__worst_fwd, abs(__rev - __fwd) / maximum(abs(__rev), 1e-6));\n    }}\n",
            plus = with(&format!("__a{i} + __h * __e")),
            minus = with(&format!("__a{i} - __h * __e")),
            all = all.join(", "),
            tan = tangents.join(", "),
        ));
    }
    src.push_str(&format!(
        "    print(\"value:\", {function}({}));\n    print(\"reverse vs finite differences: worst relative error\", __worst_fd);\n    print(\"reverse vs forward mode: worst relative error\", __worst_fwd);\n    maximum(__worst_fd, __worst_fwd)\n}}\n",
        all.join(", ")
    ));
    Ok(CheckGrad {
        source: src,
        in_f32,
    })
}

/// The driver of `emit --stage grad`: a function whose value is `grad(f)`.
pub fn emit_grad_driver(function: &str) -> String {
    format!("fn {DRIVER}() = grad({function})\n")
}
