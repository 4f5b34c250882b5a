//! Checks that need inferred types but belong to the source program:
//! type annotations (`let x: f32[3] = ..`, `n: i64`, `-> f32`) and the
//! rule that a `let mut` variable keeps the dtype of its first typed value.
//! Lowering records what to check; this pass runs after inference.

use adjoint_lang::ast::{TypeExpr, TypeKind};
use adjoint_lang::{Diagnostic, Span};
use adjoint_runtime::tensor::DType;
use std::collections::{HashMap, HashSet};

use crate::infer::domain::AbsVal;
use crate::infer::Types;
use crate::ir::{Const, Module, NodeId};
use crate::span::span_of;

/// Something lowering asks to be checked once types are known.
#[derive(Clone, Debug)]
pub enum Check {
    /// `node` must have the annotated type; `what` names it (`` `x` ``).
    Annotation {
        node: NodeId,
        ty: TypeExpr,
        what: String,
    },
    /// A tuple pattern `(a, b)` needs a tuple of exactly that many elements.
    TupleArity {
        node: NodeId,
        len: usize,
        span: Span,
    },
    /// `einsum`: each operand (`node`, written at `span`) has one axis per
    /// letter of its subscripts, and a letter has one size throughout.
    Einsum {
        operands: Vec<(NodeId, Vec<char>, Span)>,
    },
    /// The values a function returns (`return` statements, flagged, and
    /// its end), where a `return` gives one: reported only to explain a
    /// failed inference, as values of types that do not join.
    Returns { values: Vec<(NodeId, Span, bool)> },
    /// `for x in t` iterates over a tuple `t` (`node`).
    ForTuple { node: NodeId, span: Span },
    /// A bound of `for i in a..b` (`node`, written at `span`) is an int.
    RangeBound { node: NodeId, span: Span },
    /// A differentiated argument must be made of floats.
    DiffArg {
        node: NodeId,
        what: String,
        loc: crate::ir::Loc,
    },
    /// An argument of a differentiated function that is not differentiated
    /// but holds a function: the transformed body calls it transformed,
    /// which a value passed at the call is not. Reported only to explain a
    /// failed inference (a function argument the body never calls works).
    FnArg {
        node: NodeId,
        what: String,
        transform: &'static str,
        loc: crate::ir::Loc,
    },
    /// `grad` needs a scalar float result.
    ScalarOutput {
        node: NodeId,
        what: String,
        loc: crate::ir::Loc,
    },
    /// What a user's `bprop` rule returns (`node`) must be a tuple of one
    /// cotangent per input of the function (`inputs` of them).
    RuleResult {
        node: NodeId,
        inputs: usize,
        name: String,
        loc: crate::ir::Loc,
    },
    /// `jvp(f, primals, tangents)`: `node` (the primals or the tangents,
    /// `what`) must be a tuple of one value per parameter of `f`.
    JvpTuple {
        node: NodeId,
        /// `f`'s graph (its parameters are known once lowering is done).
        graph: crate::ir::GraphId,
        /// For the tangents: the primals, whose shapes they must have.
        primals: Option<NodeId>,
        what: &'static str,
        name: String,
        span: Span,
    },
    /// `name` held `old` and is reassigned `new` at `span`.
    Assign {
        name: String,
        old: NodeId,
        new: NodeId,
        span: Span,
    },
}

/// Runs every check; returns the diagnostics of those that fail.
/// `origin` says which nodes the transforms made from which (each copy →
/// the node it copies: `ad::Provenance::origin`): a node that only runs
/// transformed (a `grad` request inside code that `jvp` differentiates) is
/// checked on the types of its copies.
/// `failed`: whether inference failed, so that checks that only explain a
/// failure ([`Check::FnArg`]) run too.
pub fn run(
    checks: &[Check],
    m: &Module,
    types: &Types,
    origin: &HashMap<NodeId, NodeId>,
    failed: bool,
) -> Vec<Diagnostic> {
    // The copies of each node, built when a check first needs them.
    let mut copies: Option<HashMap<NodeId, Vec<NodeId>>> = None;
    // A node's type, or its copies' when only they ran.
    let mut value_or_copies = |node: NodeId| {
        value(m, types, node).or_else(|| {
            let copies = copies.get_or_insert_with(|| copies_of(origin));
            copy_value(types, copies, node)
        })
    };
    let mut out = Vec::new();
    for c in checks {
        match c {
            Check::Annotation { node, ty, what } if is_param(m, *node) => {
                // Check each specialisation, and blame the call that made it.
                for (sid, spec) in types.specs() {
                    let Some(v) = spec.values.get(node) else {
                        continue;
                    };
                    let Some(why) = mismatch(ty, v) else {
                        continue;
                    };
                    let caller = types
                        .specs()
                        .flat_map(|(_, s)| s.calls.iter())
                        .find(|(_, callees)| callees.contains(&sid))
                        .and_then(|(call, _)| span_of(m.node(*call).loc));
                    let d = match caller {
                        Some(at) => Diagnostic::error(
                            format!("{what} is annotated {} but this call passes {v}", show(ty)),
                            at,
                        )
                        .with_secondary(ty.span, format!("annotated here; {why}")),
                        None => Diagnostic::error(
                            format!("{what} is annotated {} but is {v}", show(ty)),
                            ty.span,
                        )
                        .with_label(why),
                    };
                    out.push(d);
                    break;
                }
            }
            Check::Annotation { node, ty, what } => {
                let Some(v) = value(m, types, *node) else {
                    continue;
                };
                if let Some(why) = mismatch(ty, &v) {
                    out.push(
                        Diagnostic::error(
                            format!("{what} is annotated {} but is {v}", show(ty)),
                            ty.span,
                        )
                        .with_label(why),
                    );
                }
            }
            Check::TupleArity { node, len, span } => {
                let Some(v) = value(m, types, *node) else {
                    continue;
                };
                let got = match &v {
                    AbsVal::Tuple(items) if items.len() == *len => continue,
                    AbsVal::Tuple(items) => format!("a tuple of {}", items.len()),
                    AbsVal::Unknown | AbsVal::Zero | AbsVal::Bottom => continue,
                    other => other.to_string(),
                };
                out.push(Diagnostic::error(
                    format!("this pattern expects a tuple of {len}, but the value is {got}"),
                    *span,
                ));
            }
            Check::Einsum { operands } => {
                let mut sizes: Vec<(char, usize, usize)> = Vec::new();
                'operands: for (k, (node, letters, span)) in operands.iter().enumerate() {
                    let Some(AbsVal::Tensor(t)) = value(m, types, *node) else {
                        continue;
                    };
                    if t.shape.len() != letters.len() {
                        let named: String = letters.iter().collect();
                        out.push(Diagnostic::error(
                            format!(
                                "einsum: operand {} is {}, of rank {}, but its subscripts `{named}` name {} ax{}",
                                k + 1,
                                AbsVal::Tensor(t.clone()),
                                t.shape.len(),
                                letters.len(),
                                if letters.len() == 1 { "is" } else { "es" }
                            ),
                            *span,
                        ));
                        break;
                    }
                    for (c, n) in letters.iter().zip(&t.shape) {
                        match sizes.iter().find(|(d, _, _)| d == c) {
                            Some((_, size, at)) if size != n => {
                                out.push(Diagnostic::error(
                                    format!(
                                        "einsum: `{c}` is {size} long in operand {} but {n} long in operand {}",
                                        at + 1,
                                        k + 1
                                    ),
                                    *span,
                                ));
                                break 'operands;
                            }
                            Some(_) => {}
                            None => sizes.push((*c, *n, k)),
                        }
                    }
                }
            }
            Check::ForTuple { node, span } => {
                let Some(v) = value(m, types, *node) else {
                    continue;
                };
                let hint = match &v {
                    AbsVal::Tuple(_) | AbsVal::Unknown | AbsVal::Zero | AbsVal::Bottom => continue,
                    AbsVal::Tensor(t) if !t.shape.is_empty() => format!(
                        "; to visit a tensor's elements along its first axis, loop over indices: `for i in 0..{} {{ let x = v[i]; .. }}`",
                        t.shape[0]
                    ),
                    _ => String::new(),
                };
                out.push(
                    Diagnostic::error(
                        format!("`for x in ..` iterates over a tuple, but this is {v}"),
                        *span,
                    )
                    .with_note(format!("`for i in a..b` counts; `for x in (a, b, c)` visits a tuple's elements{hint}")),
                );
            }
            Check::RangeBound { node, span } => {
                let Some(v) = value(m, types, *node) else {
                    continue;
                };
                let ok = match &v {
                    AbsVal::Tensor(t) => t.shape.is_empty() && t.dtype.is_int(),
                    _ => !matches!(v, AbsVal::Str(_) | AbsVal::Func(_) | AbsVal::DType(_)),
                };
                if !ok {
                    out.push(
                        Diagnostic::error(
                            format!("a range's bounds are ints, but this is {v}"),
                            *span,
                        )
                        .with_note(
                            "`for i in a..b` counts ints; convert a float bound with `i64(..)`",
                        ),
                    );
                }
            }
            Check::DiffArg { node, what, loc } => {
                let Some(v) = value(m, types, *node) else {
                    continue;
                };
                if let Some(bad) = non_float(&v) {
                    let is = if matches!(v, AbsVal::Tuple(_) | AbsVal::Record(_)) {
                        format!("it is {v}, which holds {bad}")
                    } else {
                        format!("it is {bad}")
                    };
                    out.push(
                        Diagnostic::error(
                            format!("cannot differentiate with respect to {what}: {is}"),
                            span_of(*loc).unwrap_or(Span::point(adjoint_lang::FileId(0), 0)),
                        )
                        .with_note("ints, bools and strings carry no derivative; pass a float or leave it out of argnums"),
                    );
                }
            }
            Check::Returns { values } if failed => {
                let typed: Vec<_> = values
                    .iter()
                    .filter_map(|&(n, s, explicit)| {
                        let v = value(m, types, n)?;
                        (!v.is_bottom()).then_some((v, s, explicit))
                    })
                    .collect();
                let clash = typed.iter().enumerate().find_map(|(i, a)| {
                    typed[i + 1..]
                        .iter()
                        .find(|b| crate::infer::domain::join(&a.0, &b.0).is_none())
                        .map(|b| (a, b))
                });
                let Some((a, b)) = clash else {
                    continue;
                };
                // Blame a `return` statement (the first of the two that is).
                let (ret, other) = if a.2 { (a, b) } else { (b, a) };
                let what = if other.2 {
                    "another `return`"
                } else {
                    "the function's end"
                };
                out.push(
                    Diagnostic::error(
                        format!(
                            "this `return` gives {}, but {what} gives {}",
                            ret.0.user_view(),
                            other.0.user_view()
                        ),
                        ret.1,
                    )
                    .with_secondary(other.1, format!("{}", other.0.user_view()))
                    .with_note("a function returns one type: every `return` and its last expression must agree"),
                );
            }
            Check::FnArg {
                node,
                what,
                transform,
                loc,
            } if failed => {
                let Some(AbsVal::Func(_)) = value(m, types, *node) else {
                    continue;
                };
                out.push(
                    Diagnostic::error(
                        format!("`{transform}` cannot pass a function as {what}: the differentiated code calls it, and only functions it sees whole can be differentiated"),
                        span_of(*loc).unwrap_or(Span::point(adjoint_lang::FileId(0), 0)),
                    )
                    .with_note(format!("differentiate a closure that makes the call instead, e.g. `{transform}(|x| f(x, g))(x)`")),
                );
            }
            Check::FnArg { .. } | Check::Returns { .. } => {}
            Check::ScalarOutput { node, what, loc } => {
                let Some(v) = value_or_copies(*node) else {
                    continue;
                };
                let ok = match &v {
                    AbsVal::Tensor(t) => t.shape.is_empty() && t.dtype.is_float(),
                    AbsVal::Unknown | AbsVal::Zero | AbsVal::Bottom => true,
                    _ => false,
                };
                if !ok {
                    out.push(
                        Diagnostic::error(
                            format!(
                                "`grad` needs {what} to return a float scalar, but it returns {v}"
                            ),
                            span_of(*loc).unwrap_or(Span::point(adjoint_lang::FileId(0), 0)),
                        )
                        .with_note("use `vjp` for functions with non-scalar results"),
                    );
                }
            }
            Check::RuleResult {
                node,
                inputs,
                name,
                loc,
            } => {
                let Some(v) = value_or_copies(*node) else {
                    continue;
                };
                let bad = match &v {
                    AbsVal::Tuple(items) if items.len() == *inputs => continue,
                    AbsVal::Tuple(items) => format!(
                        "returns {} cotangent{}, but `{name}` takes {inputs} input{}",
                        items.len(),
                        if items.len() == 1 { "" } else { "s" },
                        if *inputs == 1 { "" } else { "s" }
                    ),
                    AbsVal::Unknown | AbsVal::Bottom => continue,
                    other => format!("returns {other}, not a tuple of cotangents"),
                };
                out.push(
                    Diagnostic::error(
                        format!("the bprop of `{name}` {bad}"),
                        span_of(*loc).unwrap_or(Span::point(adjoint_lang::FileId(0), 0)),
                    )
                    .with_note(
                        "a bprop returns a tuple with one cotangent per input, in order: `(dx,)` for one",
                    ),
                );
            }
            Check::JvpTuple {
                node,
                graph,
                primals,
                what,
                name,
                span,
            } => {
                let Some(v) = value(m, types, *node) else {
                    continue;
                };
                let len = &m.graph(*graph).params.len();
                let got = match &v {
                    AbsVal::Tuple(items) if items.len() == *len => {
                        let p = primals.and_then(|p| value(m, types, p));
                        if let Some(AbsVal::Tuple(ps)) = p {
                            let bad = items.iter().zip(&ps).enumerate().find(|(_, (t, p))| {
                                matches!((t, p), (AbsVal::Tensor(t), AbsVal::Tensor(p))
                                    if p.dtype.is_float() && t.shape != p.shape)
                            });
                            if let Some((i, (t, p))) = bad {
                                out.push(
                                    Diagnostic::error(
                                        format!(
                                            "`jvp` of `{name}`: tangent {i} has type {t}, but its primal is {p}"
                                        ),
                                        *span,
                                    )
                                    .with_note("a tangent has the shape of its primal"),
                                );
                            }
                        }
                        continue;
                    }
                    AbsVal::Tuple(items) => format!("{} of them", items.len()),
                    AbsVal::Unknown | AbsVal::Bottom => continue,
                    other => format!("{other}, not a tuple"),
                };
                out.push(
                    Diagnostic::error(
                        format!(
                            "`jvp` of `{name}` takes a tuple of {len} {} (one per parameter), but got {got}",
                            if *len == 1 { what.trim_end_matches('s') } else { what }
                        ),
                        *span,
                    )
                    .with_note("write `jvp(f, (x,), (dx,))` for a function of one parameter"),
                );
            }
            Check::Assign {
                name,
                old,
                new,
                span,
            } => {
                let (Some(va), Some(vb)) = (value(m, types, *old), value(m, types, *new)) else {
                    continue;
                };
                if let Some((ka, kb)) = kind_of(&va).zip(kind_of(&vb)) {
                    if ka != kb {
                        out.push(
                            Diagnostic::error(
                                format!("cannot assign {vb} to `{name}`, which holds {va}"),
                                *span,
                            )
                            .with_note(format!(
                                "a variable keeps its kind of value ({ka} here); declare a new one with `let`"
                            )),
                        );
                        continue;
                    }
                }
                let (AbsVal::Tensor(a), AbsVal::Tensor(b)) = (va, vb) else {
                    continue;
                };
                // A bool never takes the place of a number, weak or not.
                let bools = (a.dtype == DType::Bool) != (b.dtype == DType::Bool);
                if (!a.weak && !b.weak || bools) && a.dtype != b.dtype {
                    out.push(
                        Diagnostic::error(
                            format!(
                                "cannot assign a {} value to `{name}`, which holds {}",
                                b.dtype, a.dtype
                            ),
                            *span,
                        )
                        .with_note(format!(
                            "a variable keeps the dtype of its first typed value; use a cast such as {}(..)",
                            a.dtype
                        )),
                    );
                }
            }
        }
    }
    out
}

/// The kind of value a variable holds, for assignments: `None` for values
/// whose kind is not known yet.
fn kind_of(v: &AbsVal) -> Option<&'static str> {
    Some(match v {
        AbsVal::Tensor(_) => "a number or tensor",
        AbsVal::Str(_) => "a string",
        AbsVal::Func(_) => "a function",
        AbsVal::DType(_) => "a dtype",
        AbsVal::Tuple(_) | AbsVal::Record(_) | AbsVal::Io => return None,
        AbsVal::Unknown | AbsVal::Bottom | AbsVal::Zero => return None,
    })
}

fn is_param(m: &Module, n: NodeId) -> bool {
    matches!(m.node(n).kind, crate::ir::NodeKind::Param { .. })
}

fn value(m: &Module, types: &Types, n: NodeId) -> Option<AbsVal> {
    match m.as_const(n) {
        Some(Const::Int(i)) => Some(AbsVal::int(*i, true)),
        Some(Const::Float(_)) => Some(AbsVal::weak_scalar(DType::F64)),
        Some(Const::Bool(b)) => Some(AbsVal::bool(*b)),
        Some(Const::Str(t)) => Some(AbsVal::Str(Some(t.clone()))),
        Some(Const::DType(d)) => Some(AbsVal::DType(*d)),
        Some(_) => None,
        None => types.value_of(n),
    }
}

/// For each node, the nodes the transforms made as copies of it (sorted,
/// so that the first one evaluated is the same on every run).
fn copies_of(origin: &HashMap<NodeId, NodeId>) -> HashMap<NodeId, Vec<NodeId>> {
    let mut copies: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    for (&copy, &orig) in origin {
        copies.entry(orig).or_default().push(copy);
    }
    for v in copies.values_mut() {
        v.sort();
    }
    copies
}

/// The value of the first copy of `n` (or of a copy of a copy) that
/// inference evaluated: a copy made by a transform holds `n`'s primal value.
fn copy_value(types: &Types, copies: &HashMap<NodeId, Vec<NodeId>>, n: NodeId) -> Option<AbsVal> {
    let mut stack: Vec<NodeId> = copies.get(&n).cloned().unwrap_or_default();
    let mut seen: HashSet<NodeId> = HashSet::new();
    while let Some(c) = stack.pop() {
        if !seen.insert(c) {
            continue;
        }
        if let Some(v) = types.value_of(c) {
            return Some(v);
        }
        stack.extend(copies.get(&c).into_iter().flatten().copied());
    }
    None
}

/// The type of the first non-float leaf of `v`, if any.
fn non_float(v: &AbsVal) -> Option<String> {
    match v {
        AbsVal::Tensor(t) if t.dtype.is_float() => None,
        AbsVal::Tensor(_) => Some(v.to_string()),
        AbsVal::Tuple(items) => items.iter().find_map(non_float),
        AbsVal::Record(fields) => fields.iter().find_map(|(_, x)| non_float(x)),
        AbsVal::Unknown | AbsVal::Zero | AbsVal::Bottom => None,
        other => Some(other.to_string()),
    }
}

/// Why `v` does not fit `ty`, if it does not.
fn mismatch(ty: &TypeExpr, v: &AbsVal) -> Option<String> {
    match (&ty.kind, v) {
        (_, AbsVal::Unknown | AbsVal::Zero | AbsVal::Bottom) => None,
        (TypeKind::Tensor { dtype, dims }, AbsVal::Tensor(t)) => {
            let Some(want) = DType::from_name(&dtype.name) else {
                return Some(format!("`{}` is not a dtype", dtype.name));
            };
            let dtype_ok = if t.weak {
                if t.dtype.is_float() {
                    want.is_float()
                } else {
                    want.is_numeric()
                }
            } else {
                t.dtype == want
            };
            if !dtype_ok {
                return Some(format!("the dtype is {}", t.dtype));
            }
            if let Some(dims) = dims {
                let same = dims.len() == t.shape.len()
                    && dims
                        .iter()
                        .zip(&t.shape)
                        .all(|(d, s)| *d >= 0 && *d as usize == *s);
                if !same {
                    return Some(format!("the shape is {:?}", t.shape));
                }
            }
            None
        }
        (TypeKind::Tuple(items), AbsVal::Tuple(vs)) => {
            if items.len() != vs.len() {
                return Some(format!("it has {} elements", vs.len()));
            }
            items.iter().zip(vs).find_map(|(t, v)| mismatch(t, v))
        }
        (TypeKind::Record(fields), AbsVal::Record(vs)) => {
            if fields.len() != vs.len() {
                return Some(format!("it has {} fields", vs.len()));
            }
            for (name, t) in fields {
                match vs.iter().find(|(n, _)| **n == *name.name) {
                    Some((_, v)) => {
                        if let Some(why) = mismatch(t, v) {
                            return Some(why);
                        }
                    }
                    None => return Some(format!("it has no field `{}`", name.name)),
                }
            }
            None
        }
        _ => Some("the kind of value differs".into()),
    }
}

/// An annotation as written.
fn show(ty: &TypeExpr) -> String {
    match &ty.kind {
        TypeKind::Tensor { dtype, dims } => match dims {
            None => dtype.name.clone(),
            Some(d) => format!(
                "{}[{}]",
                dtype.name,
                d.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
        TypeKind::Tuple(items) => {
            let parts: Vec<String> = items.iter().map(show).collect();
            if parts.len() == 1 {
                format!("({},)", parts[0])
            } else {
                format!("({})", parts.join(", "))
            }
        }
        TypeKind::Record(fields) => format!(
            "{{{}}}",
            fields
                .iter()
                .map(|(n, t)| format!("{}: {}", n.name, show(t)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
