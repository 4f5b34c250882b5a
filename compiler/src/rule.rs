//! Derivative rules of element-wise primitives of one argument, written
//! once in the primitive table (a `d "..."` column of `prim.rs`, or the
//! `derivative` of a row of `adjoint_runtime::math`).
//!
//! A rule is an Adjoint expression in `x` (the argument), `out` (the
//! result) and `d`, linear in `d`: the tangent of the result for a tangent
//! `d` of `x`. Since the primitive is element-wise, the same expression is
//! also the cotangent of `x` for a cotangent `d` of the result. From it
//! come the reverse rule (`bprop p(x, out, d) = (RULE,)`), the forward rule
//! (`fn jvp_p(x, out, d) = RULE`), both added to the standard library's
//! rule files by [`stdlib_rules`], and the native scalar-loop derivative
//! (`codegen::scalar_ad`, through [`parse`]). The rule `zero` says the
//! derivative is zero everywhere it exists (`floor`, `sign`).

use std::fmt::Write as _;
use std::sync::OnceLock;

use crate::prim::Prim;

/// A parsed rule.
#[derive(Clone, Debug, PartialEq)]
pub enum RuleExpr {
    Num(f64),
    /// The argument `x`.
    X,
    /// The result `out`.
    Out,
    /// The tangent or cotangent `d`.
    D,
    Neg(Box<RuleExpr>),
    /// `+ - * /`.
    Arith(char, Box<RuleExpr>, Box<RuleExpr>),
    /// `> < >= <= == !=`, as written.
    Cmp(&'static str, Box<RuleExpr>, Box<RuleExpr>),
    /// A call of a function by name (`where`, `zeros_like` or an
    /// element-wise primitive).
    Call(String, Vec<RuleExpr>),
}

/// A rule: zero everywhere, or an expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Rule {
    Zero,
    Expr(RuleExpr),
}

/// Parses a rule of the table. The table is part of the compiler, so an
/// error here is a bug in it (the unit tests parse every rule).
pub fn parse(text: &str) -> Result<Rule, String> {
    if text.trim() == "zero" {
        return Ok(Rule::Zero);
    }
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
    };
    let e = p.cmp()?;
    p.ws();
    if p.i != p.s.len() {
        return Err(format!("rule `{text}`: unexpected text at byte {}", p.i));
    }
    Ok(Rule::Expr(e))
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
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
            self.i += 1;
            let b = next(self)?;
            a = RuleExpr::Arith(op, Box::new(a), Box::new(b));
        }
    }

    fn unary(&mut self) -> Result<RuleExpr, String> {
        if self.eat("-") {
            return Ok(RuleExpr::Neg(Box::new(self.unary()?)));
        }
        self.atom()
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
            "x" => Ok(RuleExpr::X),
            "out" => Ok(RuleExpr::Out),
            "d" => Ok(RuleExpr::D),
            _ => Err(format!("unknown name `{name}` (rules use x, out and d)")),
        }
    }
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
            let Some(text) = p.derivative() else { continue };
            let name = p.name();
            if text.trim() == "zero" {
                let _ = writeln!(bprop, "bprop {name}(x, out, d) = (zeros_like(x),);");
                let _ = writeln!(jvp, "fn jvp_{name}(x, out, d) = zero()");
            } else {
                let _ = writeln!(bprop, "bprop {name}(x, out, d) = ({text},);");
                let _ = writeln!(jvp, "fn jvp_{name}(x, out, d) = {text}");
            }
        }
        (bprop, jvp)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_of_the_table_parses() {
        let mut n = 0;
        for &p in Prim::all() {
            if let Some(text) = p.derivative() {
                assert_eq!(p.info().params.len(), 1, "{p}: rules are for one argument");
                parse(text).unwrap_or_else(|e| panic!("{p}: {e}"));
                n += 1;
            }
        }
        assert!(n >= 20, "{n} rules");
    }

    #[test]
    fn precedence_and_forms() {
        use RuleExpr::*;
        let b = Box::new;
        assert_eq!(
            parse("-(d * sin(x)) + 2.5 / out").unwrap(),
            Rule::Expr(Arith(
                '+',
                b(Neg(b(Arith('*', b(D), b(Call("sin".into(), vec![X])))))),
                b(Arith('/', b(Num(2.5)), b(Out)))
            ))
        );
        assert_eq!(
            parse("where(x > 0.0, d, zeros_like(d))").unwrap(),
            Rule::Expr(Call(
                "where".into(),
                vec![
                    Cmp(">", b(X), b(Num(0.0))),
                    D,
                    Call("zeros_like".into(), vec![D])
                ]
            ))
        );
        assert_eq!(parse(" zero ").unwrap(), Rule::Zero);
        assert!(parse("d * y").unwrap_err().contains("unknown name `y`"));
        assert!(parse("d * (x").is_err());
        assert!(parse("d d").is_err());
    }

    #[test]
    fn generated_rules_are_adjoint_source() {
        let (bprop, jvp) = stdlib_rules();
        assert!(
            bprop.contains("bprop tanh(x, out, d) = (d * (1.0 - out * out),);"),
            "{bprop}"
        );
        assert!(jvp.contains("fn jvp_floor(x, out, d) = zero()"), "{jvp}");
        assert!(
            jvp.contains("fn jvp_tan(x, out, d) = d * (1.0 + out * out)"),
            "{jvp}"
        );
        for text in [bprop, jvp] {
            let (_, diags) = adjoint_lang::parse(adjoint_lang::FileId(0), text);
            assert!(diags.is_empty(), "{diags:?}\n{text}");
        }
    }
}
