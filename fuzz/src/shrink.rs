//! A greedy, line-based shrinker: deletes blocks and single lines, then
//! simplifies sub-expressions (unwrapping calls, keeping one side of a
//! binary operation), keeping every candidate that still fails with the same
//! class, until nothing changes (or the time budget is spent).

use std::time::{Duration, Instant};

/// Shrinks `source` while `still_fails(candidate)` holds.
pub fn shrink(
    source: &str,
    budget: Duration,
    mut still_fails: impl FnMut(&str) -> bool,
) -> (String, usize) {
    let start = Instant::now();
    let mut lines: Vec<String> = source.lines().map(|l| l.to_string()).collect();
    let mut tries = 0usize;
    let out_of_time = |start: &Instant| start.elapsed() > budget;
    let join = |ls: &[String]| {
        let mut s = ls.join("\n");
        s.push('\n');
        s
    };
    loop {
        let mut changed = false;
        // 1. blocks: a line ending in `{` up to its closing line, largest first
        let mut blocks: Vec<(usize, usize)> = Vec::new();
        for i in 0..lines.len() {
            if let Some(j) = block_end(&lines, i) {
                blocks.push((i, j));
            }
        }
        blocks.sort_by_key(|(i, j)| std::cmp::Reverse(j - i));
        let mut removed: Vec<(usize, usize)> = Vec::new();
        for (i, j) in blocks {
            if out_of_time(&start) {
                break;
            }
            // indices shift after a removal: recompute against removed ranges
            if removed.iter().any(|(a, b)| i <= *b && j >= *a) {
                continue;
            }
            let shift: usize = removed
                .iter()
                .filter(|(_, b)| *b < i)
                .map(|(a, b)| b - a + 1)
                .sum();
            let (ii, jj) = (i - shift, j - shift);
            if jj >= lines.len() {
                continue;
            }
            let mut cand = lines.clone();
            cand.drain(ii..=jj);
            tries += 1;
            if still_fails(&join(&cand)) {
                lines = cand;
                removed.push((i, j));
                changed = true;
            }
        }
        // 2. single lines, last first (main's prints, then f's statements)
        let mut k = lines.len();
        while k > 0 {
            k -= 1;
            if out_of_time(&start) {
                break;
            }
            if k >= lines.len() || lines[k].trim().is_empty() {
                continue;
            }
            let mut cand = lines.clone();
            cand.remove(k);
            tries += 1;
            if still_fails(&join(&cand)) {
                lines = cand;
                changed = true;
            }
        }
        // 3. unwrap a block: keep its body, drop the header and closing line
        let mut i = 0;
        while i < lines.len() {
            if out_of_time(&start) {
                break;
            }
            if let Some(j) = block_end(&lines, i) {
                let body_is_simple = (i + 1..j).all(|k| !lines[k].trim_start().starts_with('}'));
                if body_is_simple && !lines[i].trim_start().starts_with("fn ") {
                    let mut cand = lines.clone();
                    cand.remove(j);
                    cand.remove(i);
                    tries += 1;
                    if still_fails(&join(&cand)) {
                        lines = cand;
                        changed = true;
                        continue;
                    }
                }
            }
            i += 1;
        }
        // 4. sub-expressions
        let mut k = 0;
        while k < lines.len() {
            if out_of_time(&start) {
                break;
            }
            let mut improved = false;
            for cand_line in simplifications(&lines[k]) {
                if out_of_time(&start) {
                    break;
                }
                let mut cand = lines.clone();
                cand[k] = cand_line;
                tries += 1;
                if still_fails(&join(&cand)) {
                    lines = cand;
                    changed = true;
                    improved = true;
                    break;
                }
            }
            if !improved {
                k += 1;
            }
        }
        if !changed || out_of_time(&start) {
            break;
        }
    }
    // cosmetics: drop redundant parentheses, if the program still fails
    let tidy: Vec<String> = lines.iter().map(|l| drop_redundant_parens(l)).collect();
    if tidy != lines {
        tries += 1;
        if still_fails(&join(&tidy)) {
            lines = tidy;
        }
    }
    (join(&lines), tries)
}

/// `((x))` -> `(x)`, `(name)` / `(a.b)` / `(1.5)` -> `name` (not after a
/// name, `)` or `]`, where the parenthesis is a call).
pub fn drop_redundant_parens(line: &str) -> String {
    let mut cur = line.to_string();
    loop {
        let b = cur.as_bytes();
        let mut edit: Option<(usize, usize, String)> = None;
        for open in 0..b.len() {
            if b[open] != b'(' {
                continue;
            }
            let prev = cur[..open].trim_end().as_bytes().last().copied();
            if matches!(prev, Some(c) if is_ident_byte(c) || c == b')' || c == b']' || c == b'"') {
                continue;
            }
            let Some(close) = matching_close(b, open) else {
                continue;
            };
            let inner = &cur[open + 1..close];
            let simple = !inner.is_empty()
                && inner.bytes().all(|c| is_ident_byte(c) || c == b'.')
                && !inner.starts_with('.');
            let doubled = inner.starts_with('(') && {
                let ib = inner.as_bytes();
                let mut d = 0i32;
                let mut end = None;
                for (k, &c) in ib.iter().enumerate() {
                    match c {
                        b'(' | b'[' | b'{' => d += 1,
                        b')' | b']' | b'}' => {
                            d -= 1;
                            if d == 0 {
                                end = Some(k);
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end == Some(ib.len() - 1)
            };
            if simple || doubled {
                edit = Some((open, close, inner.to_string()));
                break;
            }
        }
        match edit {
            Some((o, c, inner)) => cur = format!("{}{}{}", &cur[..o], inner, &cur[c + 1..]),
            None => return cur,
        }
    }
}

/// If line `i` opens a block (ends with `{`), the line that closes it.
fn block_end(lines: &[String], i: usize) -> Option<usize> {
    let l = lines[i].trim_end();
    if !l.ends_with('{') || l.trim_start().starts_with('}') {
        return None;
    }
    let mut depth: i64 = 0;
    for (j, line) in lines.iter().enumerate().skip(i) {
        for c in line.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
        }
        if j > i && depth <= 0 {
            return if depth == 0 { Some(j) } else { None };
        }
    }
    None
}

fn is_ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Simpler versions of one line: `name(x)` -> `(x)`, `(a op b)` -> `(a)` or
/// `(b)`, `maximum(a, b)` -> `(a)` or `(b)`, a tensor literal of
/// expressions is left alone.
pub fn simplifications(line: &str) -> Vec<String> {
    let b = line.as_bytes();
    let mut out: Vec<String> = Vec::new();
    for open in 0..b.len() {
        if b[open] != b'(' {
            continue;
        }
        // matching close
        let Some(close) = matching_close(b, open) else {
            continue;
        };
        let inner = &line[open + 1..close];
        // the name before the parenthesis, if any
        let mut s = open;
        while s > 0 && is_ident_byte(b[s - 1]) {
            s -= 1;
        }
        let name = &line[s..open];
        let parts = split_top(inner, b',');
        let replace = |from: usize, with: &str| {
            format!("{}({}){}", &line[..from], with.trim(), &line[close + 1..])
        };
        if !name.is_empty() && !name.as_bytes()[0].is_ascii_digit() {
            if matches!(
                name,
                "fn" | "print" | "grad" | "jvp" | "vjp" | "value_and_grad" | "if" | "while" | "for"
            ) {
                continue;
            }
            if parts.len() == 1 && !inner.trim().is_empty() {
                out.push(replace(s, inner));
            } else if matches!(name, "maximum" | "minimum" | "where") {
                for p in &parts[if name == "where" { 1 } else { 0 }..] {
                    out.push(replace(s, p));
                }
            }
        } else if s == open && parts.len() == 1 {
            // a grouping parenthesis: keep one operand of a binary operator
            for op in [" + ", " - ", " * ", " / ", " @ "] {
                if let Some(k) = find_top(inner, op) {
                    out.push(replace(open, &inner[..k]));
                    out.push(replace(open, &inner[k + op.len()..]));
                    break;
                }
            }
        }
    }
    out.dedup();
    out
}

fn split_top(s: &str, sep: u8) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut st = 0;
    for (k, &c) in s.as_bytes().iter().enumerate() {
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            _ if c == sep && depth == 0 => {
                parts.push(&s[st..k]);
                st = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[st..]);
    parts
}

fn find_top(s: &str, op: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut depth = 0i32;
    for k in 0..b.len() {
        match b[k] {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            b'|' => return None, // a lambda: leave it
            _ => {}
        }
        if depth == 0 && s[k..].starts_with(op) {
            return Some(k);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simplifies() {
        let c = simplifications("    let t1 = tanh((a + b));");
        assert!(c.contains(&"    let t1 = ((a + b));".to_string()));
        assert!(c.contains(&"    let t1 = tanh((a));".to_string()));
        assert!(c.contains(&"    let t1 = tanh((b));".to_string()));
        let c = simplifications("x = maximum(a, sin(b));");
        assert!(c.contains(&"x = (a);".to_string()));
    }

    #[test]
    fn tidies_parentheses() {
        assert_eq!(
            drop_redundant_parens("let a = ((x)) + (y.0) * f(z) + (-0.5);"),
            "let a = x + y.0 * f(z) + (-0.5);"
        );
        assert_eq!(drop_redundant_parens("let (p, q) = t;"), "let (p, q) = t;");
        assert_eq!(
            drop_redundant_parens("g(a)(b) + ((a + b))"),
            "g(a)(b) + (a + b)"
        );
    }

    #[test]
    fn shrinks_to_the_failing_line() {
        let src = "fn f() {\n    let a = 1;\n    let bad = 2;\n    if x {\n        y;\n    }\n}\n";
        let (out, _) = shrink(src, Duration::from_secs(5), |s| s.contains("bad"));
        assert_eq!(out, "    let bad = 2;\n");
    }
}

/// The position of the bracket closing the one at `open`, if any.
fn matching_close(b: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (k, &c) in b.iter().enumerate().skip(open) {
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}
