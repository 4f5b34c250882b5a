//! `einsum("ij,jk->ik", a, b)`: NumPy's Einstein summation. The
//! subscripts are a string literal, so the call is expanded when it is
//! lowered: each operand is transposed to one common order of the letters
//! (the output's, then the summed ones), given axes of size 1 for the
//! letters it lacks, the operands are multiplied (broadcasting), and the
//! summed letters are reduced. Derivatives come from those primitives.
//! The product is formed whole, so a contraction that is a matrix product
//! is better written with `@`.

use super::*;

/// Parsed subscripts: each operand's letters and the output's.
struct Spec {
    inputs: Vec<Vec<char>>,
    output: Vec<char>,
}

fn parse(spec: &str) -> Result<Spec, String> {
    let spec: String = spec.chars().filter(|c| !c.is_whitespace()).collect();
    if spec.contains("...") {
        return Err("`...` (broadcast dimensions) is not supported; name every axis".into());
    }
    let (ins, out) = match spec.split_once("->") {
        Some((i, o)) => (i.to_string(), Some(o.to_string())),
        None => (spec.clone(), None),
    };
    let letters = |s: &str| -> Result<Vec<char>, String> {
        let v: Vec<char> = s.chars().collect();
        if let Some(c) = v.iter().find(|c| !c.is_ascii_alphabetic()) {
            return Err(format!("unexpected `{c}` in the subscripts"));
        }
        for (i, c) in v.iter().enumerate() {
            if v[..i].contains(c) {
                return Err(format!(
                    "`{c}` repeats within one term (diagonals are not supported; use `diagonal`)"
                ));
            }
        }
        Ok(v)
    };
    let inputs = ins.split(',').map(letters).collect::<Result<Vec<_>, _>>()?;
    let output = match out {
        Some(o) => {
            let o = letters(&o)?;
            if let Some(c) = o.iter().find(|c| !inputs.iter().any(|t| t.contains(c))) {
                return Err(format!("output subscript `{c}` is in no operand"));
            }
            o
        }
        // Implicit: the letters that appear once, in alphabetical order.
        None => {
            let mut once: Vec<char> = inputs
                .iter()
                .flatten()
                .copied()
                .filter(|c| inputs.iter().flatten().filter(|d| *d == c).count() == 1)
                .collect();
            once.sort_unstable();
            once
        }
    };
    Ok(Spec { inputs, output })
}

impl Lowerer<'_> {
    pub(super) fn lower_einsum(
        &mut self,
        module: usize,
        cx: &mut Cx,
        args: &[ast::Arg],
        span: Span,
    ) -> R<NodeId> {
        if let Some(a) = args.iter().find(|a| a.name.is_some()) {
            return Err(Diagnostic::error(
                "einsum takes its subscripts and operands by position",
                a.span,
            ));
        }
        let Some(first) = args.first() else {
            return Err(Diagnostic::error(
                "einsum needs subscripts and operands, as in `einsum(\"ij,jk->ik\", a, b)`",
                span,
            ));
        };
        let ExprKind::Str(text) = &*first.value.kind else {
            return Err(Diagnostic::error(
                "einsum: the subscripts must be a string literal",
                first.value.span,
            ));
        };
        let spec =
            parse(text).map_err(|m| Diagnostic::error(format!("einsum: {m}"), first.value.span))?;
        if spec.inputs.len() != args.len() - 1 {
            return Err(Diagnostic::error(
                format!(
                    "einsum: the subscripts name {} operand{}, but {} {} given",
                    spec.inputs.len(),
                    if spec.inputs.len() == 1 { "" } else { "s" },
                    args.len() - 1,
                    if args.len() == 2 { "is" } else { "are" }
                ),
                span,
            ));
        }
        // One order of all letters: the output's, then the summed ones.
        let mut order = spec.output.clone();
        for c in spec.inputs.iter().flatten() {
            if !order.contains(c) {
                order.push(*c);
            }
        }
        let mut product: Option<NodeId> = None;
        let mut operands = Vec::new();
        for (a, letters) in args[1..].iter().zip(&spec.inputs) {
            let x = self.lower_expr(module, cx, &a.value)?;
            operands.push((x, letters.clone(), a.value.span));
            let pos: Vec<usize> = letters
                .iter()
                .map(|c| {
                    order
                        .iter()
                        .position(|o| o == c)
                        .expect("every letter is in the order")
                })
                .collect();
            let mut perm: Vec<usize> = (0..letters.len()).collect();
            perm.sort_by_key(|&k| pos[k]);
            let mut v = x;
            if perm.iter().enumerate().any(|(i, &p)| i != p) {
                let items: Vec<NodeId> = perm
                    .iter()
                    .map(|&p| self.konst(Const::Int(p as i64), a.span))
                    .collect();
                let p = self.prim(cx, Prim::MakeTuple, &items, a.span);
                v = self.prim(cx, Prim::Transpose, &[v, p], a.span);
            }
            for k in 0..order.len() {
                if !pos.contains(&k) {
                    let axis = self.konst(Const::Int(k as i64), a.span);
                    v = self.prim(cx, Prim::ExpandDims, &[v, axis], a.span);
                }
            }
            product = Some(match product {
                None => v,
                Some(p) => self.prim(cx, Prim::Mul, &[p, v], span),
            });
        }
        self.checks.push(crate::checks::Check::Einsum { operands });
        let mut r = product.expect("einsum has an operand");
        if order.len() > spec.output.len() {
            let axes: Vec<NodeId> = (spec.output.len()..order.len())
                .map(|k| self.konst(Const::Int(k as i64), span))
                .collect();
            let axes = self.prim(cx, Prim::MakeTuple, &axes, span);
            let keep = self.konst(Const::Bool(false), span);
            r = self.prim(cx, Prim::Sum, &[r, axes, keep], span);
        }
        Ok(r)
    }
}
