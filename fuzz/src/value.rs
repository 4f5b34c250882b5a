//! Parsing what `print` writes: floats, ints, bools, nested tensors `[..]`,
//! tuples `(..)` and records `{w: .., b: ..}`.

#[derive(Clone, Debug, PartialEq)]
pub enum PVal {
    /// A number; `true` when it was written as an int.
    Num(f64, bool),
    Bool(bool),
    List(Vec<PVal>),
    Tup(Vec<PVal>),
    Rec(Vec<(String, PVal)>),
    /// Anything else (a string), kept as text.
    Text(String),
}

impl PVal {
    pub fn flatten(&self, out: &mut Vec<f64>) {
        match self {
            PVal::Num(x, _) => out.push(*x),
            PVal::Bool(b) => out.push(if *b { 1.0 } else { 0.0 }),
            PVal::List(xs) | PVal::Tup(xs) => xs.iter().for_each(|x| x.flatten(out)),
            PVal::Rec(fs) => fs.iter().for_each(|(_, x)| x.flatten(out)),
            PVal::Text(_) => {}
        }
    }

    pub fn flat(&self) -> Vec<f64> {
        let mut v = Vec::new();
        self.flatten(&mut v);
        v
    }

    /// The structure with the numbers left out (`f` float, `i` int).
    pub fn shape_sig(&self) -> String {
        match self {
            PVal::Num(_, true) => "i".into(),
            PVal::Num(_, false) => "f".into(),
            PVal::Bool(b) => b.to_string(),
            PVal::List(xs) => format!(
                "[{}]",
                xs.iter()
                    .map(|x| x.shape_sig())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            PVal::Tup(xs) => format!(
                "({})",
                xs.iter()
                    .map(|x| x.shape_sig())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            PVal::Rec(fs) => format!(
                "{{{}}}",
                fs.iter()
                    .map(|(n, x)| format!("{n}:{}", x.shape_sig()))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            PVal::Text(s) => format!("\"{s}\""),
        }
    }
}

struct P<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> P<'a> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }
    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn word(&mut self) -> String {
        self.ws();
        let st = self.i;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || c == b'-' || c == b'+' {
                self.i += 1;
            } else {
                break;
            }
        }
        String::from_utf8_lossy(&self.s[st..self.i]).into_owned()
    }
    fn seq(&mut self, close: u8) -> Option<Vec<PVal>> {
        let mut xs = Vec::new();
        loop {
            if self.eat(close) {
                return Some(xs);
            }
            xs.push(self.value()?);
            if !self.eat(b',') {
                return if self.eat(close) { Some(xs) } else { None };
            }
        }
    }
    fn value(&mut self) -> Option<PVal> {
        self.ws();
        match self.peek()? {
            b'[' => {
                self.i += 1;
                Some(PVal::List(self.seq(b']')?))
            }
            b'(' => {
                self.i += 1;
                Some(PVal::Tup(self.seq(b')')?))
            }
            b'{' => {
                self.i += 1;
                let mut fs = Vec::new();
                loop {
                    if self.eat(b'}') {
                        return Some(PVal::Rec(fs));
                    }
                    let name = self.word();
                    if name.is_empty() || !self.eat(b':') {
                        return None;
                    }
                    let v = self.value()?;
                    fs.push((name, v));
                    if !self.eat(b',') {
                        return if self.eat(b'}') {
                            Some(PVal::Rec(fs))
                        } else {
                            None
                        };
                    }
                }
            }
            _ => {
                let w = self.word();
                match w.as_str() {
                    "" => None,
                    "true" => Some(PVal::Bool(true)),
                    "false" => Some(PVal::Bool(false)),
                    "nan" | "NaN" | "-nan" => Some(PVal::Num(f64::NAN, false)),
                    "inf" | "+inf" => Some(PVal::Num(f64::INFINITY, false)),
                    "-inf" => Some(PVal::Num(f64::NEG_INFINITY, false)),
                    _ => {
                        if let Ok(i) = w.parse::<i64>() {
                            Some(PVal::Num(i as f64, true))
                        } else {
                            w.parse::<f64>().ok().map(|x| PVal::Num(x, false))
                        }
                    }
                }
            }
        }
    }
}

/// Parses one printed value (the whole text).
pub fn parse_value(text: &str) -> Option<PVal> {
    let mut p = P {
        s: text.as_bytes(),
        i: 0,
    };
    let v = p.value()?;
    p.ws();
    if p.i == p.s.len() {
        Some(v)
    } else {
        None
    }
}

/// A line `label value`; the value is `Text` when it does not parse.
pub fn parse_line(line: &str) -> (String, PVal) {
    let line = line.trim();
    let (label, rest) = match line.find(' ') {
        Some(k) => (&line[..k], &line[k + 1..]),
        None => (line, ""),
    };
    let v = parse_value(rest).unwrap_or_else(|| PVal::Text(rest.to_string()));
    (label.to_string(), v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_print_forms() {
        let v = parse_value("{w: [1.0, 2.5e-3], b: (0.5, -1)}").unwrap();
        assert_eq!(v.flat(), vec![1.0, 2.5e-3, 0.5, -1.0]);
        assert_eq!(v.shape_sig(), "{w:[f,f],b:(f,i)}");
        assert_eq!(parse_value("(1.0,)").unwrap().flat(), vec![1.0]);
        assert_eq!(
            parse_value("[[1.0, 2.0], [3.0, nan]]")
                .unwrap()
                .flat()
                .len(),
            4
        );
        assert!(parse_value("-inf").unwrap().flat()[0].is_infinite());
        let (l, v) = parse_line("grad ((3.0, 2.0), [1.0, -1.0])");
        assert_eq!(l, "grad");
        assert_eq!(v.flat(), vec![3.0, 2.0, 1.0, -1.0]);
        assert_eq!(parse_value("()").unwrap(), PVal::Tup(vec![]));
    }
}
