//! No input makes the front end panic, overflow the stack or take long.

use adjoint_lang::*;
use std::time::{Duration, Instant};

const PROGRAM: &str = r#"
import nn
import "layers.adj" as ly

fn square(x) = x * x

fn power(x, n: i64) -> f64 {
    let mut acc = 1.0;
    for i in 0..n {
        acc = acc * x;
    }
    acc
}

fn train(p: { w: f32[4, 3], b: f32[3] }, x, lr = 0.01) {
    let { w, b } = p;
    let (a, _) = (w @ x + b, 0);
    let mut s = 0.0;
    for i in progress(0..10) {
        if i % 2 == 0 { continue; } else if i > 8 { break; }
        s += sum(a[i, :3] ** 2) * -1e-3;
    }
    while s > 1.0 { s = s / 2.0; }
    fn local(y) { y + s }
    let f = |z| z * t.0.1;
    let g = || { w: w - lr * s, b: b };
    if s < 0.5 { return g(); }
    nn.dense(p, x[1:, b * 64 : b * 64 + 64])
}

bprop square(x, out, dout) = (2.0 * x * dout,);

fn main() {
    print(grad(square)(3.0), "done\n");
}
"#;

/// Parses on a thread with a small stack, so that any deep recursion
/// (in the parser, the AST's drop, or the dump) would fail the test.
fn parse_small_stack(src: String) -> (usize, Vec<Diagnostic>, String) {
    std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || {
            let mut sm = SourceMap::new();
            let f = sm.add_file("t.adj", src.clone());
            let (m, d) = parse(f, &src);
            let dumped = dump(&m, &sm);
            let rendered = render(&d, &sm, false);
            for x in &d {
                let _ = render_short(x, &sm);
            }
            let n = m.items.len();
            drop(m);
            (n, d, dumped + &rendered)
        })
        .unwrap()
        .join()
        .expect("parser thread panicked")
}

#[test]
fn reference_program_parses() {
    let (n, d, _) = parse_small_stack(PROGRAM.to_string());
    assert!(d.is_empty(), "{d:?}");
    assert_eq!(n, 7);
}

#[test]
fn every_truncated_prefix() {
    let src = PROGRAM;
    let mut sm = SourceMap::new();
    for end in 0..=src.len() {
        if !src.is_char_boundary(end) {
            continue;
        }
        let prefix = &src[..end];
        let f = sm.add_file("p.adj", prefix);
        let (_, d) = parse(f, prefix);
        let _ = render(&d, &sm, false);
        // A prefix that leaves a bracket open is invalid and must say so.
        let lexed = lexer::lex(f, prefix);
        let mut depth = 0i64;
        for (_, t, _) in &lexed.tokens {
            if t.is_open() {
                depth += 1;
            } else if t.is_close() {
                depth -= 1;
            }
        }
        if depth > 0 {
            assert!(
                !d.is_empty(),
                "no diagnostic for prefix ending at {end}: {prefix:?}"
            );
        }
    }
}

#[test]
fn every_single_byte_deletion() {
    let src = PROGRAM.as_bytes();
    for i in 0..src.len() {
        let mut v = src.to_vec();
        v.remove(i);
        let s = String::from_utf8_lossy(&v).into_owned();
        let _ = parse(FileId(0), &s);
    }
}

/// A small deterministic generator (xorshift), so the test needs no crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_bytes() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for round in 0..300 {
        let len = (rng.next() % 400) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let s = String::from_utf8_lossy(&bytes).into_owned();
        let (_, d) = parse(FileId(0), &s);
        if !s.trim().is_empty() && round % 2 == 0 {
            let _ = d; // most random inputs are invalid; no claim either way
        }
    }
}

#[test]
fn random_ascii_soup() {
    let alphabet = b"fn let mut if else for in while return |x| () [] {} ,;:.. ** * - + = == < a b 1 2.5 \"s\" \n";
    let mut rng = Rng(42);
    for _ in 0..500 {
        let len = (rng.next() % 300) as usize;
        let s: String = (0..len)
            .map(|_| alphabet[(rng.next() % alphabet.len() as u64) as usize] as char)
            .collect();
        let _ = parse(FileId(0), &s);
    }
}

#[test]
fn deep_nesting_is_rejected_before_parsing() {
    for (open, close) in [("(", ")"), ("[", "]"), ("{", "}")] {
        let n = 100_000;
        let src = format!("fn f() = {}1{}", open.repeat(n), close.repeat(n));
        let (n_items, d, _) = parse_small_stack(src);
        assert_eq!(n_items, 0);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].message, "nesting too deep");
    }
    // unclosed deep nesting too
    let (_, d, _) = parse_small_stack(format!("fn f() = {}", "(".repeat(100_000)));
    assert_eq!(d[0].message, "nesting too deep");
    // 150 levels is fine
    let src = format!("fn f() = {}1{}", "(".repeat(150), ")".repeat(150));
    let (_, d, _) = parse_small_stack(src);
    assert!(d.is_empty(), "{d:?}");
}

#[test]
fn long_operator_chains_are_capped() {
    let cases = [
        format!("fn f(a) = a{}", " + a".repeat(100_000)),
        format!("fn f(a) = a{}", " ** a".repeat(100_000)),
        format!("fn f(a) = {}a", "-".repeat(100_000)),
        format!("fn f(a) = {}a", "!".repeat(100_000)),
        format!("fn f(a) = {}a", "|x| ".repeat(50_000)),
        format!("fn f(a) = a{}", ".b".repeat(100_000)),
        format!("fn f(a) = a{}", "(1)".repeat(50_000)),
        format!("fn f(a) = a{}", "[0]".repeat(50_000)),
        format!("fn f(a) = a{}", ".0".repeat(100_000)),
        format!(
            "fn f(a) = if a {{ 1 }}{} else {{ 3 }}",
            " else if a { 2 }".repeat(30_000)
        ),
        format!("fn f(a) = {}{{ a }}", "if a { 1 } else ".repeat(30_000)),
    ];
    for src in cases {
        let start = Instant::now();
        let (n, d, _) = parse_small_stack(src.clone());
        assert!(n <= 1, "{}", &src[..40]);
        assert!(
            d.iter()
                .any(|d| d.message == "expression is nested too deeply"
                    || d.message == "the parser gave up here"),
            "{}: {d:?}",
            &src[..40]
        );
        assert!(start.elapsed() < Duration::from_secs(20));
    }
    // a chain under the limit is fine
    let src = format!("fn f(a) = a{}", " + a".repeat(200));
    let (_, d, _) = parse_small_stack(src);
    assert!(d.is_empty(), "{d:?}");
}

#[test]
fn many_statements_and_lines() {
    // 10^5 lines; must parse in well under a second in release and a few
    // seconds in debug.
    let mut src = String::from("fn main() {\n    let mut s = 0.0;\n");
    for i in 0..100_000 {
        src.push_str(&format!("    s = s + f(x[{i}], lr = 0.1) * 2.0;\n"));
    }
    src.push_str("    s\n}\n");
    let start = Instant::now();
    let (m, d) = parse(FileId(0), &src);
    let took = start.elapsed();
    assert!(d.is_empty());
    assert_eq!(m.items.len(), 1);
    let limit = if cfg!(debug_assertions) { 10 } else { 1 };
    assert!(took < Duration::from_secs(limit), "took {took:?}");

    // 10^5 small items
    let src: String = (0..100_000)
        .map(|i| format!("fn f{i}(x) = x + {i}\n"))
        .collect();
    let start = Instant::now();
    let (m, d) = parse(FileId(0), &src);
    assert!(d.is_empty());
    assert_eq!(m.items.len(), 100_000);
    assert!(start.elapsed() < Duration::from_secs(limit * 2));
}

#[test]
fn many_errors_do_not_blow_up() {
    // one error per line, 10^4 lines
    let src = "fn f() { let = ; }\n".repeat(10_000);
    let start = Instant::now();
    let (_, d) = parse(FileId(0), &src);
    assert!(d.len() <= parser::MAX_SYNTAX_ERRORS + 1);
    assert!(start.elapsed() < Duration::from_secs(20));
    // Garbage after a deep unreduced chain: error recovery rescans the
    // parse stack for every dropped token, so this would be quadratic if
    // the parser did not give up.
    for src in [
        format!("fn f() = {}{}", "- ".repeat(100_000), ") ".repeat(100_000)),
        format!(
            "fn f() = {}a{}",
            "a ** ".repeat(50_000),
            ") ".repeat(100_000)
        ),
        format!(
            "fn f() = {}a{}",
            "|x| ".repeat(50_000),
            "] ".repeat(100_000)
        ),
    ] {
        let start = Instant::now();
        let (_, d, _) = parse_small_stack(src);
        assert!(!d.is_empty());
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{:?}",
            start.elapsed()
        );
    }
}

#[test]
fn odd_text() {
    for src in [
        "",
        " ",
        "\0",
        "\u{feff}fn f() = 1",
        "fn f() = \"\\",
        "fn f() = \"é\\é",
        "/*/**/",
        "*/",
        "fn f() = 1..",
        "fn",
        "}",
        "{",
        "fn f() = x.",
        "fn f() = t.0.",
        "fn f() = 0x10",
        "fn f(,) = 1",
        "\r\r\r\n",
        "fn λ() = 1",
    ] {
        let (_, d, _) = parse_small_stack(src.to_string());
        if !src.trim().is_empty() && src != "\r\r\r\n" {
            assert!(!d.is_empty(), "{src:?} should be an error");
        }
    }
}
