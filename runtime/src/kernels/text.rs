//! Strings: `format(template, values..)`, and `int(s)` / `float(s)`
//! (`parse_int`, `parse_float`), which read a number from a string (the
//! arguments `main` gets from the command line). Concatenation (`s + t`)
//! is `add` of two strings (`kernels/map.rs`).
//!
//! A template holds text and placeholders: `{}` writes a value as `print`
//! does; `{:SPEC}` writes it with `SPEC = [<|>][width][.precision][f|e]`:
//! floats (and the elements of float tensors) in fixed notation with
//! `precision` decimals (`f`, the default when a precision is given) or in
//! exponent notation (`e`); a width pads each number with spaces (each
//! element of a tensor, as NumPy's element formats do; other values
//! whole), on the left unless `<` asks for the right. `{{` and `}}` are
//! braces.

use super::args::{arity, min_arity, string};
use super::ctx::Ctx;
use crate::error::RtError;
use crate::tensor::Tensor;
use crate::value::Value;

/// One piece of a template.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Text(String),
    Value(Spec),
}

/// How a placeholder writes its value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Spec {
    /// Pad on the right (`<`) instead of the left.
    pub left: bool,
    pub width: usize,
    pub precision: Option<usize>,
    /// `e`: exponent notation.
    pub exponent: bool,
}

/// Splits a template into text and placeholders.
pub fn parse_template(t: &str) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut chars = t.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '{' => {
                let mut inner = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => inner.push(c),
                        None => return Err(format!("the placeholder `{{{inner}` is not closed")),
                    }
                }
                if !text.is_empty() {
                    out.push(Piece::Text(std::mem::take(&mut text)));
                }
                out.push(Piece::Value(parse_spec(&inner)?));
            }
            '}' => return Err("a `}` without its `{` (write `}}` for a brace)".into()),
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    Ok(out)
}

fn parse_spec(inner: &str) -> Result<Spec, String> {
    let bad = || {
        format!("`{{{inner}}}` is not a placeholder: write `{{}}` or `{{:SPEC}}` with SPEC like `.3`, `8.2f`, `.4e`, `>10`")
    };
    if inner.is_empty() {
        return Ok(Spec::default());
    }
    let Some(mut s) = inner.strip_prefix(':') else {
        return Err(bad());
    };
    let mut spec = Spec::default();
    if let Some(r) = s.strip_prefix('<') {
        spec.left = true;
        s = r;
    } else if let Some(r) = s.strip_prefix('>') {
        s = r;
    }
    let digits = |s: &str| s.chars().take_while(|c| c.is_ascii_digit()).count();
    let w = digits(s);
    if w > 0 {
        spec.width = s[..w].parse().map_err(|_| bad())?;
        s = &s[w..];
    }
    if let Some(r) = s.strip_prefix('.') {
        let p = digits(r);
        if p == 0 {
            return Err(bad());
        }
        spec.precision = Some(r[..p].parse().map_err(|_| bad())?);
        s = &r[p..];
    }
    match s {
        "" | "f" => {}
        "e" => spec.exponent = true,
        _ => return Err(bad()),
    }
    Ok(spec)
}

/// The number of values a template takes.
pub fn placeholders(pieces: &[Piece]) -> usize {
    pieces
        .iter()
        .filter(|p| matches!(p, Piece::Value(_)))
        .count()
}

/// One float under a spec with a precision or `e`.
fn float_with(v: f64, spec: &Spec) -> String {
    match (spec.exponent, spec.precision) {
        (true, Some(p)) => format!("{v:.p$e}"),
        (true, None) => format!("{v:e}"),
        (false, Some(p)) => format!("{v:.p$}"),
        (false, None) => crate::format::format_float(v),
    }
}

/// `body` padded to the spec's width.
fn padded(body: String, spec: &Spec) -> String {
    let pad = spec.width.saturating_sub(body.chars().count());
    if pad == 0 {
        body
    } else if spec.left {
        format!("{body}{}", " ".repeat(pad))
    } else {
        format!("{}{body}", " ".repeat(pad))
    }
}

/// Writes `t` as `print` does, each element under `spec` (floats with its
/// precision when it has one, every element padded to its width).
fn tensor_with(t: &Tensor, spec: &Spec) -> String {
    if t.is_empty() {
        return "[]".into();
    }
    let floats = t.dtype().is_float() && (spec.precision.is_some() || spec.exponent);
    let elems: Vec<String> = if floats {
        t.as_f64_vec()
            .into_iter()
            .map(|v| padded(float_with(v, spec), spec))
            .collect()
    } else {
        // `print`'s own text of each element, split off the whole.
        let n = t.len();
        let flat = t.reshape(&[n]).map(|f| f.to_string()).unwrap_or_default();
        let inner = flat.trim_start_matches('[').trim_end_matches(']');
        let parts: Vec<String> = inner
            .split(", ")
            .map(|e| padded(e.to_string(), spec))
            .collect();
        if parts.len() != n {
            return padded(t.to_string(), spec);
        }
        parts
    };
    fn nest(out: &mut String, elems: &[String], shape: &[usize]) {
        match shape.split_first() {
            None => out.push_str(&elems[0]),
            Some((&n, rest)) => {
                let chunk: usize = rest.iter().product();
                out.push('[');
                for i in 0..n {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    nest(out, &elems[i * chunk..(i + 1) * chunk], rest);
                }
                out.push(']');
            }
        }
    }
    let mut out = String::new();
    nest(&mut out, &elems, t.shape());
    out
}

/// One value under a spec.
fn value_with(v: &Value, spec: &Spec) -> String {
    match v {
        // a tensor with axes: element by element
        Value::Tensor(t) if t.ndim() > 0 => tensor_with(t, spec),
        Value::Tensor(t) if t.dtype().is_float() && (spec.precision.is_some() || spec.exponent) => {
            padded(tensor_with(t, spec), spec)
        }
        other => padded(other.to_string(), spec),
    }
}

/// `format(template, values..)`: the template with each placeholder
/// replaced by the next value.
pub fn format(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "format";
    min_arity(op, args, 1)?;
    let t = string(op, &args[0], "the template")?;
    let pieces = parse_template(t).map_err(|e| RtError::new(format!("{op}: {e}")))?;
    let want = placeholders(&pieces);
    if want != args.len() - 1 {
        return Err(RtError::new(format!(
            "{op}: the template has {want} placeholder{} but {} value{} given",
            if want == 1 { "" } else { "s" },
            args.len() - 1,
            if args.len() == 2 { " was" } else { "s were" }
        )));
    }
    let mut out = String::new();
    let mut next = args[1..].iter();
    for p in &pieces {
        match p {
            Piece::Text(s) => out.push_str(s),
            Piece::Value(spec) => {
                let v = next.next().expect("counted above");
                out.push_str(&value_with(v, spec));
            }
        }
    }
    Ok(Value::str(out))
}

/// `int(s)`: the i64 a string holds (surrounding spaces allowed).
pub fn parse_int(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("int", args, 1)?;
    let s = string("int", &args[0], "the argument")?;
    s.trim()
        .parse::<i64>()
        .map(|v| Value::Tensor(Tensor::scalar(v)))
        .map_err(|_| RtError::new(format!("int: {s:?} is not an integer")))
}

/// `float(s)`: the f64 a string holds (`1.5`, `-2e-3`, `inf`, `nan`).
pub fn parse_float(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("float", args, 1)?;
    let s = string("float", &args[0], "the argument")?;
    s.trim()
        .parse::<f64>()
        .map(|v| Value::Tensor(Tensor::scalar(v)))
        .map_err(|_| RtError::new(format!("float: {s:?} is not a number")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates() {
        let p = parse_template("a {} b {:.3} {{c}} {:>6.1e}").unwrap();
        assert_eq!(placeholders(&p), 3);
        assert_eq!(p[0], Piece::Text("a ".into()));
        assert_eq!(
            p[3],
            Piece::Value(Spec {
                precision: Some(3),
                ..Spec::default()
            })
        );
        assert!(parse_template("{").is_err());
        assert!(parse_template("}").is_err());
        assert!(parse_template("{x}").is_err());
        assert!(parse_template("{:.}").is_err());
    }

    #[test]
    fn values() {
        let spec = |s: &str| parse_spec(s).unwrap();
        let x = Value::Tensor(Tensor::vector(vec![1.0f64, 2.25]));
        assert_eq!(value_with(&x, &spec(":.1")), "[1.0, 2.2]");
        assert_eq!(value_with(&x, &spec("")), "[1.0, 2.25]");
        let s = Value::Tensor(Tensor::scalar(0.5f32));
        assert_eq!(value_with(&s, &spec(":.3")), "0.500");
        assert_eq!(value_with(&s, &spec(":8.2e")), " 5.00e-1");
        assert_eq!(value_with(&s, &spec(":<6")), "0.5   ");
        let i = Value::Tensor(Tensor::scalar(7i64));
        assert_eq!(value_with(&i, &spec(":.2")), "7");
    }
}
