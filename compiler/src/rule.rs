//! Derivative rules of element-wise primitives, written once in the
//! primitive table (a `d "..."` column of `prim.rs`, or the `derivative`
//! of a row of `adjoint_runtime::math`).
//!
//! A rule is an Adjoint expression in the primitive's parameters (by
//! their names in the table), `out` (the result) and `d`, linear in `d`:
//! the tangent of the result for a tangent `d` of one parameter. A row of
//! one parameter gives one rule; a row of several gives one per
//! parameter, `x: RULE; y: RULE`. Besides an expression, a parameter's
//! rule may be `zero` (the derivative is zero everywhere it exists:
//! `floor`, `sign`) or `none` (the parameter is an int or a bool, with no
//! derivative: `polygamma`'s order, `where`'s condition).
//!
//! Since the primitive is element-wise, the rule of a parameter is also
//! its cotangent for a cotangent `d` of the result, up to broadcasting.
//! From the rules come the reverse rule (`bprop p(x, y, out, d) =
//! (sum_to(RULE_x, x), sum_to(RULE_y, y))`), the forward rule (`fn
//! jvp_p(x, y, out, dx, dy) = RULE_x[d := dx] + RULE_y[d := dy]`), both
//! added to the standard library's rule files by [`stdlib_rules`], and
//! the native scalar-loop derivative (`scalar::ad`, through
//! [`rules_of`]).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::OnceLock;

use crate::prim::Prim;

/// A parsed rule expression.
#[derive(Clone, Debug, PartialEq)]
pub enum RuleExpr {
    /// A float literal.
    Num(f64),
    /// An int literal (an argument of `polygamma`'s order, say).
    Int(i64),
    /// The primitive's parameter of this index.
    Param(usize),
    /// The result `out`.
    Out,
    /// The tangent or cotangent `d`.
    D,
    /// The tangent of the parameter of this index (in forward rules made
    /// from several parameters' rules; not written in the table).
    Tangent(usize),
    Neg(Box<RuleExpr>),
    /// `+ - * /`.
    Arith(char, Box<RuleExpr>, Box<RuleExpr>),
    /// `a ** b`.
    Pow(Box<RuleExpr>, Box<RuleExpr>),
    /// `> < >= <= == !=`, as written.
    Cmp(&'static str, Box<RuleExpr>, Box<RuleExpr>),
    /// A call of a function by name (`where`, `zeros_like`, `ones_like`
    /// or an element-wise primitive).
    Call(String, Vec<RuleExpr>),
}

/// The rule of one parameter.
#[derive(Clone, Debug, PartialEq)]
pub enum Rule {
    /// No derivative: an int or bool parameter.
    None,
    /// Zero wherever the derivative exists.
    Zero,
    Expr(RuleExpr),
}

/// Parses the rule text of a row whose parameters are `params`: one rule
/// for a row of one parameter, else `name: RULE` for each parameter,
/// separated by `;`. The table is part of the compiler, so an error here
/// is a bug in it (the unit tests parse every rule).
pub fn parse(text: &str, params: &[&str]) -> Result<Vec<Rule>, String> {
    if params.len() == 1 && !text.contains(';') {
        let body = match text.split_once(':') {
            Some((name, body)) if name.trim() == params[0] => body,
            _ => text,
        };
        return Ok(vec![parse_one(body, params)?]);
    }
    let mut rules: Vec<Option<Rule>> = vec![None; params.len()];
    for part in text.split(';') {
        let (name, body) = part
            .split_once(':')
            .ok_or_else(|| format!("rule `{part}`: expected `parameter: rule`"))?;
        let i = params
            .iter()
            .position(|p| *p == name.trim())
            .ok_or_else(|| format!("rule `{part}`: no parameter `{}`", name.trim()))?;
        if rules[i].is_some() {
            return Err(format!("two rules for parameter `{}`", params[i]));
        }
        rules[i] = Some(parse_one(body, params)?);
    }
    rules
        .into_iter()
        .zip(params)
        .map(|(r, p)| r.ok_or_else(|| format!("no rule for parameter `{p}`")))
        .collect()
}

fn parse_one(text: &str, params: &[&str]) -> Result<Rule, String> {
    match text.trim() {
        "zero" => return Ok(Rule::Zero),
        "none" => return Ok(Rule::None),
        _ => {}
    }
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
        params,
    };
    let e = p.cmp()?;
    p.ws();
    if p.i != p.s.len() {
        return Err(format!("rule `{text}`: unexpected text at byte {}", p.i));
    }
    Ok(Rule::Expr(e))
}

/// The parsed rules of primitive `p`, one per parameter, if its row
/// gives them.
pub fn rules_of(p: Prim) -> Option<&'static [Rule]> {
    static RULES: OnceLock<HashMap<Prim, Vec<Rule>>> = OnceLock::new();
    RULES
        .get_or_init(|| {
            Prim::all()
                .iter()
                .filter_map(|&p| {
                    let text = p.derivative()?;
                    let params: Vec<&str> = p.info().params.iter().map(|q| q.name).collect();
                    let rules = parse(text, &params)
                        .unwrap_or_else(|e| panic!("the rule of `{p}` in the table: {e}"));
                    Some((p, rules))
                })
                .collect()
        })
        .get(&p)
        .map(Vec::as_slice)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    params: &'a [&'a str],
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn eat(&mut self, t: &str) -> bool {
        self.ws();
        if self.s[self.i..].starts_with(t.as_bytes()) {
            self.i += t.len();
            true
        } else {
            false
        }
    }

    fn cmp(&mut self) -> Result<RuleExpr, String> {
        let a = self.sum()?;
        for op in [">=", "<=", "==", "!=", ">", "<"] {
            if self.eat(op) {
                let b = self.sum()?;
                return Ok(RuleExpr::Cmp(op, Box::new(a), Box::new(b)));
            }
        }
        Ok(a)
    }

    fn sum(&mut self) -> Result<RuleExpr, String> {
        self.left_assoc(&['+', '-'], Self::product)
    }

    fn product(&mut self) -> Result<RuleExpr, String> {
        self.left_assoc(&['*', '/'], Self::unary)
    }

    /// Operands of `next` joined by the operators `ops`, to the left.
    fn left_assoc(
        &mut self,
        ops: &[char],
        next: fn(&mut Self) -> Result<RuleExpr, String>,
    ) -> Result<RuleExpr, String> {
        let mut a = next(self)?;
        loop {
            self.ws();
            let Some(&op) = ops
                .iter()
                .find(|&&op| self.s.get(self.i) == Some(&(op as u8)))
            else {
                return Ok(a);
            };
            // `**` is a power, not a product.
            if op == '*' && self.s.get(self.i + 1) == Some(&b'*') {
                return Ok(a);
            }
            self.i += 1;
            let b = next(self)?;
            a = RuleExpr::Arith(op, Box::new(a), Box::new(b));
        }
    }

    fn unary(&mut self) -> Result<RuleExpr, String> {
        if self.eat("-") {
            return Ok(RuleExpr::Neg(Box::new(self.unary()?)));
        }
        self.power()
    }

    /// `a ** b`, to the right, binding tighter than a leading `-`.
    fn power(&mut self) -> Result<RuleExpr, String> {
        let a = self.atom()?;
        if self.eat("**") {
            let b = self.unary()?;
            return Ok(RuleExpr::Pow(Box::new(a), Box::new(b)));
        }
        Ok(a)
    }

    fn atom(&mut self) -> Result<RuleExpr, String> {
        self.ws();
        if self.eat("(") {
            let e = self.cmp()?;
            return if self.eat(")") {
                Ok(e)
            } else {
                Err(format!("expected `)` at byte {}", self.i))
            };
        }
        let start = self.i;
        let c = *self.s.get(self.i).ok_or("unexpected end of rule")?;
        if c.is_ascii_digit() {
            while self
                .s
                .get(self.i)
                .is_some_and(|c| c.is_ascii_digit() || *c == b'.' || *c == b'e')
            {
                self.i += 1;
            }
            let text = std::str::from_utf8(&self.s[start..self.i]).expect("ASCII");
            if !text.contains(['.', 'e']) {
                return text
                    .parse()
                    .map(RuleExpr::Int)
                    .map_err(|_| format!("bad number `{text}`"));
            }
            return text
                .parse()
                .map(RuleExpr::Num)
                .map_err(|_| format!("bad number `{text}`"));
        }
        if !(c.is_ascii_alphabetic() || c == b'_') {
            return Err(format!("unexpected `{}` at byte {}", c as char, self.i));
        }
        while self
            .s
            .get(self.i)
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
        {
            self.i += 1;
        }
        let name = std::str::from_utf8(&self.s[start..self.i]).expect("ASCII");
        if self.eat("(") {
            let mut args = vec![self.cmp()?];
            while self.eat(",") {
                args.push(self.cmp()?);
            }
            if !self.eat(")") {
                return Err(format!("expected `)` after the arguments of `{name}`"));
            }
            return Ok(RuleExpr::Call(name.to_string(), args));
        }
        match name {
            "out" => Ok(RuleExpr::Out),
            "d" => Ok(RuleExpr::D),
            _ => match self.params.iter().position(|p| *p == name) {
                Some(i) => Ok(RuleExpr::Param(i)),
                None => Err(format!(
                    "unknown name `{name}` (rules use {}, out and d)",
                    self.params.join(", ")
                )),
            },
        }
    }
}

/// Binding strength of an expression's outermost operator, for printing.
fn precedence(e: &RuleExpr) -> u8 {
    match e {
        RuleExpr::Cmp(..) => 1,
        RuleExpr::Arith('+' | '-', ..) => 2,
        RuleExpr::Arith(..) => 3,
        RuleExpr::Neg(_) => 4,
        RuleExpr::Pow(..) => 5,
        _ => 6,
    }
}

/// Writes `e` as Adjoint source: parameters by `params`, `d` as `d_name`,
/// with the parentheses its tree needs.
pub fn print(e: &RuleExpr, params: &[&str], d_name: &str) -> String {
    let mut s = String::new();
    write_expr(&mut s, e, params, d_name);
    s
}

fn write_expr(s: &mut String, e: &RuleExpr, params: &[&str], d_name: &str) {
    let sub = |s: &mut String, x: &RuleExpr, min: u8| {
        if precedence(x) < min {
            s.push('(');
            write_expr(s, x, params, d_name);
            s.push(')');
        } else {
            write_expr(s, x, params, d_name);
        }
    };
    match e {
        RuleExpr::Num(v) => {
            let _ = write!(s, "{v:?}");
        }
        RuleExpr::Int(v) => {
            let _ = write!(s, "{v}");
        }
        RuleExpr::Param(i) => s.push_str(params[*i]),
        RuleExpr::Out => s.push_str("out"),
        RuleExpr::D => s.push_str(d_name),
        RuleExpr::Tangent(i) => {
            let _ = write!(s, "d{}", params[*i]);
        }
        RuleExpr::Neg(a) => {
            s.push('-');
            // `-(-a)`, not `--a`.
            sub(
                s,
                a,
                if matches!(**a, RuleExpr::Neg(_)) {
                    6
                } else {
                    4
                },
            );
        }
        RuleExpr::Arith(op, a, b) => {
            let p = precedence(e);
            sub(s, a, p);
            let _ = write!(s, " {op} ");
            sub(s, b, p + 1);
        }
        RuleExpr::Pow(a, b) => {
            sub(s, a, 6);
            s.push_str(" ** ");
            sub(s, b, 4);
        }
        RuleExpr::Cmp(op, a, b) => {
            sub(s, a, 2);
            let _ = write!(s, " {op} ");
            sub(s, b, 2);
        }
        RuleExpr::Call(name, args) => {
            s.push_str(name);
            s.push('(');
            for (k, a) in args.iter().enumerate() {
                if k > 0 {
                    s.push_str(", ");
                }
                write_expr(s, a, params, d_name);
            }
            s.push(')');
        }
    }
}

/// `where(c, a, b)`'s parts when exactly one of `a` and `b` is a
/// `zeros_like`.
fn masked(e: &RuleExpr) -> Option<(&RuleExpr, &RuleExpr, &RuleExpr)> {
    match e {
        RuleExpr::Call(n, args) if n == "where" && args.len() == 3 => {
            let (c, a, b) = (&args[0], &args[1], &args[2]);
            (is_zeros(a) != is_zeros(b)).then_some((c, a, b))
        }
        _ => None,
    }
}

/// Whether `e` is a `zeros_like(..)`.
fn is_zeros(e: &RuleExpr) -> bool {
    matches!(e, RuleExpr::Call(n, _) if n == "zeros_like")
}

/// `e` with `d` replaced by the tangent of parameter `i`.
fn with_tangent(e: &RuleExpr, i: usize) -> RuleExpr {
    let b = |x: &RuleExpr| Box::new(with_tangent(x, i));
    match e {
        RuleExpr::D => RuleExpr::Tangent(i),
        RuleExpr::Neg(a) => RuleExpr::Neg(b(a)),
        RuleExpr::Arith(op, x, y) => RuleExpr::Arith(*op, b(x), b(y)),
        RuleExpr::Pow(x, y) => RuleExpr::Pow(b(x), b(y)),
        RuleExpr::Cmp(op, x, y) => RuleExpr::Cmp(op, b(x), b(y)),
        RuleExpr::Call(n, args) => {
            RuleExpr::Call(n.clone(), args.iter().map(|a| with_tangent(a, i)).collect())
        }
        other => other.clone(),
    }
}

/// The tangent of the result from the parameters' rules: the sum of each
/// rule with `d` the parameter's tangent; `None` when every rule is zero.
/// Two terms that select on the same condition with opposite zero
/// branches, `where(c, a, 0) + where(c, 0, b)`, become `where(c, a, b)`
/// (the rules of `maximum`, `minimum` and `where`).
pub fn forward(rules: &[Rule]) -> Option<RuleExpr> {
    let mut terms: Vec<RuleExpr> = rules
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match r {
            Rule::Expr(e) => Some(with_tangent(e, i)),
            Rule::Zero | Rule::None => None,
        })
        .collect();
    let mut i = 0;
    while i < terms.len() {
        let merged = (i + 1..terms.len()).find_map(|j| {
            let (c1, a1, b1) = masked(&terms[i])?;
            let (c2, a2, b2) = masked(&terms[j])?;
            if c1 != c2 || is_zeros(a1) == is_zeros(a2) {
                return None;
            }
            let (a, b) = if is_zeros(b1) { (a1, b2) } else { (a2, b1) };
            let w = RuleExpr::Call("where".into(), vec![c1.clone(), a.clone(), b.clone()]);
            Some((j, w))
        });
        match merged {
            Some((j, w)) => {
                terms.remove(j);
                terms[i] = w;
            }
            None => i += 1,
        }
    }
    terms
        .into_iter()
        .reduce(|a, b| RuleExpr::Arith('+', Box::new(a), Box::new(b)))
}

/// The reverse and forward rules of every primitive with a table rule, as
/// Adjoint source to append to `stdlib/bprop.adj` and `stdlib/jvp.adj`.
pub fn stdlib_rules() -> &'static (String, String) {
    static RULES: OnceLock<(String, String)> = OnceLock::new();
    RULES.get_or_init(|| {
        let mut bprop =
            String::from("\n// ----- generated from the primitive table (rule.rs) -----\n\n");
        let mut jvp = bprop.clone();
        for &p in Prim::all() {
            let Some(rules) = rules_of(p) else { continue };
            let name = p.name();
            let params: Vec<&str> = p.info().params.iter().map(|q| q.name).collect();
            let list = params.join(", ");
            // Reverse: one cotangent per parameter, summed back to the
            // parameter's shape where the primitive broadcasts.
            let cotangents: Vec<String> = rules
                .iter()
                .zip(&params)
                .map(|(r, x)| match r {
                    Rule::None => "zero()".to_string(),
                    Rule::Zero => format!("zeros_like({x})"),
                    Rule::Expr(e) if params.len() == 1 => print(e, &params, "d"),
                    Rule::Expr(e) => format!("sum_to({}, {x})", print(e, &params, "d")),
                })
                .collect();
            let tuple = match &cotangents[..] {
                [one] => format!("({one},)"),
                more => format!("({})", more.join(", ")),
            };
            let _ = writeln!(bprop, "bprop {name}({list}, out, d) = {tuple};");
            let tangents: Vec<String> = params.iter().map(|x| format!("d{x}")).collect();
            let body = match forward(rules) {
                Some(e) => print(&e, &params, "d"),
                None => "zero()".to_string(),
            };
            let _ = writeln!(
                jvp,
                "fn jvp_{name}({list}, out, {}) = {body}",
                tangents.join(", ")
            );
        }
        (bprop, jvp)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(p: Prim) -> Vec<&'static str> {
        p.info().params.iter().map(|q| q.name).collect()
    }

    #[test]
    fn every_rule_of_the_table_parses() {
        let mut n = 0;
        for &p in Prim::all() {
            if let Some(text) = p.derivative() {
                let rules = parse(text, &params(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
                assert_eq!(rules.len(), p.info().params.len(), "{p}");
                assert!(
                    p.category() == crate::prim::Category::Map,
                    "{p}: rules are for element-wise primitives"
                );
                n += 1;
            }
        }
        assert!(n >= 30, "{n} rules");
        // Every differentiable element-wise primitive has its rule in the
        // table, except `cast`, whose reverse casts back to the operand's
        // dtype (stdlib/bprop.adj).
        for &p in Prim::all() {
            if p.category() == crate::prim::Category::Map
                && p.info().differentiable
                && p != Prim::Cast
            {
                assert!(rules_of(p).is_some(), "{p} has no rule in the table");
            }
        }
    }

    #[test]
    fn precedence_and_forms() {
        use RuleExpr::*;
        let b = Box::new;
        let one = |t: &str| parse(t, &["x"]).unwrap().remove(0);
        assert_eq!(
            one("-(d * sin(x)) + 2.5 / out"),
            Rule::Expr(Arith(
                '+',
                b(Neg(b(Arith(
                    '*',
                    b(D),
                    b(Call("sin".into(), vec![Param(0)]))
                )))),
                b(Arith('/', b(Num(2.5)), b(Out)))
            ))
        );
        assert_eq!(
            one("where(x > 0.0, d, zeros_like(d))"),
            Rule::Expr(Call(
                "where".into(),
                vec![
                    Cmp(">", b(Param(0)), b(Num(0.0))),
                    D,
                    Call("zeros_like".into(), vec![D])
                ]
            ))
        );
        assert_eq!(
            parse("x: -d * x ** 2 ** y; y: none", &["x", "y"]).unwrap(),
            vec![
                Rule::Expr(Arith(
                    '*',
                    b(Neg(b(D))),
                    b(Pow(b(Param(0)), b(Pow(b(Int(2)), b(Param(1))))))
                )),
                Rule::None
            ]
        );
        assert_eq!(one(" zero "), Rule::Zero);
        assert_eq!(one("none"), Rule::None);
        assert!(parse("d * y", &["x"])
            .unwrap_err()
            .contains("unknown name `y`"));
        assert!(parse("d * (x", &["x"]).is_err());
        assert!(parse("d d", &["x"]).is_err());
        assert!(parse("x: d", &["x", "y"])
            .unwrap_err()
            .contains("no rule for parameter `y`"));
        assert!(parse("x: d; x: d", &["x", "y"])
            .unwrap_err()
            .contains("two rules"));
        assert_eq!(
            parse("x: d * y; y: none", &["x", "y"]).unwrap(),
            vec![Rule::Expr(Arith('*', b(D), b(Param(1)))), Rule::None]
        );
    }

    #[test]
    fn printing_keeps_the_tree() {
        let ps = ["x", "y"];
        for text in [
            "-(d * out) / y",
            "d - (x - y)",
            "(d * y) * x",
            "d * (y * x)",
            "-d * x ** (y - 1.0)",
            "(-x) ** 2",
            "-(-d)",
            "where(x > 0.0, d * out * log(where(x > 0.0, x, ones_like(x))), zeros_like(out))",
            "d * polygamma(y + 1, x) / (1.0 + x * x)",
        ] {
            let first = |t: &str| parse(&format!("x: {t}; y: none"), &ps).unwrap().remove(0);
            let Rule::Expr(e) = first(text) else {
                panic!("{text}")
            };
            let printed = print(&e, &ps, "d");
            let again = first(&printed);
            assert_eq!(again, Rule::Expr(e), "{text} printed as {printed}");
        }
    }

    #[test]
    fn generated_rules_are_adjoint_source() {
        let (bprop, jvp) = stdlib_rules();
        for want in [
            "bprop tanh(x, out, d) = (d * (1.0 - out * out),);",
            "bprop mul(x, y, out, d) = (sum_to(d * y, x), sum_to(d * x, y));",
            "bprop where(c, a, b, out, d) = (zero(), sum_to(where(c, d, zeros_like(d)), a), sum_to(where(c, zeros_like(d), d), b));",
            "bprop floor(x, out, d) = (zeros_like(x),);",
        ] {
            assert!(bprop.contains(want), "{want}\n{bprop}");
        }
        for want in [
            "fn jvp_floor(x, out, dx) = zero()",
            "fn jvp_tan(x, out, dx) = dx * (1.0 + out * out)",
            "fn jvp_add(x, y, out, dx, dy) = dx + dy",
            "fn jvp_maximum(x, y, out, dx, dy) = where(x >= y, dx, dy)",
            "fn jvp_where(c, a, b, out, dc, da, db) = where(c, da, db)",
            "fn jvp_polygamma(n, x, out, dn, dx) = dx * polygamma(n + 1, x)",
        ] {
            assert!(jvp.contains(want), "{want}\n{jvp}");
        }
        for text in [bprop, jvp] {
            let (_, diags) = adjoint_lang::parse(adjoint_lang::FileId(0), text);
            assert!(diags.is_empty(), "{diags:?}\n{text}");
        }
    }
}
