//! Syntax and lexical errors: several per file, in words, with locations.

use adjoint_lang::*;

fn check(src: &str) -> (Module, Vec<Diagnostic>, SourceMap) {
    let mut sm = SourceMap::new();
    let f = sm.add_file("bad.adj", src);
    let (m, d) = parse(f, src);
    (m, d, sm)
}

fn short(src: &str) -> Vec<String> {
    let (_, d, sm) = check(src);
    d.iter().map(|d| render_short(d, &sm)).collect()
}

#[test]
fn several_errors_per_file() {
    let src = "\
fn f(x) {
    let y = x +;
    let z = 1
    let w = (1, 2;
    y = @;
}
fn g() = 3 $ 4
fn h(x {
}
fn ok() = 1
fn k() { let a = 1;
";
    let got = short(src);
    assert_eq!(
        got,
        vec![
            "bad.adj:2:16: error: expected an expression, found `;`",
            "bad.adj:3:13: error: expected `;` after this statement",
            "bad.adj:4:18: error: expected `,` or `)`, found `;`",
            "bad.adj:5:9: error: expected an expression, found `@`",
            "bad.adj:7:12: error: unexpected character `$`",
            "bad.adj:8:8: error: expected `,`, `)`, `=` or `:`, found `{`",
            "bad.adj:11:20: error: expected a statement or `}`, found end of file",
        ]
    );
    // the good item after the errors survives
    let (m, _, _) = check(src);
    assert!(m
        .items
        .iter()
        .any(|i| matches!(i, Item::Fn(f) if f.name.name == "ok")));
}

#[test]
fn errors_in_separate_functions_are_all_reported() {
    let src = "fn a() { 1 + }\nfn b() { let = 2; }\nfn c() { f(,) }\nfn d() = 4\n";
    let (m, d, sm) = check(src);
    assert_eq!(d.len(), 3, "{}", render(&d, &sm, false));
    assert!(m
        .items
        .iter()
        .any(|i| matches!(i, Item::Fn(f) if f.name.name == "d")));
}

#[test]
fn full_rendering_shows_location_line_and_caret() {
    let src = "fn main() {\n    let x = 1\n    x\n}\n";
    let (_, d, sm) = check(src);
    let out = render(&d, &sm, false);
    assert!(out.contains("expected `;` after this statement"), "{out}");
    assert!(out.contains("bad.adj:2:13"), "{out}");
    assert!(out.contains("    let x = 1"), "{out}");
    assert!(out.contains('┬') || out.contains('^'), "{out}");
    assert!(!out.contains('\x1b'), "{out}");
    assert!(render(&d, &sm, true).contains('\x1b'));
}

#[test]
fn messages_say_what_was_expected() {
    assert_eq!(
        short("fn f() = )"),
        vec!["bad.adj:1:10: error: expected an expression, found `)`"]
    );
    assert_eq!(
        short("fn f() { return 1 2; }"),
        vec!["bad.adj:1:17: error: expected `;` after this statement"]
    );
    assert_eq!(
        short("let x = 1;"),
        vec!["bad.adj:1:1: error: expected an item (`fn`, `bprop` or `import`), found `let`"]
    );
    assert_eq!(
        short("fn (x) = 1"),
        vec!["bad.adj:1:4: error: expected an identifier, found `(`"]
    );
    assert_eq!(
        short("fn f() { let x: = 1; }"),
        vec!["bad.adj:1:17: error: expected a type, found `=`"]
    );
    assert_eq!(
        short("fn f() { let = 1; }"),
        vec!["bad.adj:1:14: error: expected a pattern or `mut`, found `=`"]
    );
    assert_eq!(
        short("fn f() { for in x {} }"),
        vec!["bad.adj:1:14: error: expected a pattern, found `in`"]
    );
    assert_eq!(
        short("fn f() = g(1"),
        vec!["bad.adj:1:13: error: expected `,` or `)`, found end of file"]
    );
}

#[test]
fn eof_error_points_at_unclosed_bracket() {
    let (_, d, _) = check("fn f() {\n  let x = [1, 2");
    assert_eq!(d.len(), 1);
    assert!(d[0].message.ends_with("found end of file"), "{:?}", d[0]);
    assert_eq!(d[0].secondary.len(), 1);
    assert_eq!(d[0].secondary[0].message, "this `[` is not closed");
}

#[test]
fn bad_assignment_targets() {
    assert_eq!(
        short("fn f() { g(0) = 1; }"),
        vec!["bad.adj:1:10: error: cannot assign to this expression"]
    );
    // An indexed update needs a variable to update (issue 25).
    assert_eq!(
        short("fn f() { p.w[0] = 1; }"),
        vec!["bad.adj:1:10: error: cannot assign to this indexed expression"]
    );
    assert!(short("fn f() { x[0] = 1; x[i, 1:3] += y; }").is_empty());
    assert_eq!(
        short("fn f() { (a, b) += 1; }"),
        vec!["bad.adj:1:10: error: cannot use `+=` on this expression"]
    );
    assert!(short("fn f() { (a, (b, _)) = g(); x -= 1; }").is_empty());
}

#[test]
fn lexical_errors() {
    let got = short("fn f() = \"abc\nfn g() = 1 /* open");
    assert_eq!(
        got,
        vec![
            "bad.adj:1:10: error: unterminated string",
            "bad.adj:2:12: error: unterminated block comment",
        ]
    );
    assert_eq!(
        short(r#"fn f() = "a\qb""#),
        vec![r"bad.adj:1:12: error: unknown escape `\q` in string"]
    );
    assert_eq!(
        short("fn f() = 99999999999999999999"),
        vec!["bad.adj:1:10: error: integer literal `99999999999999999999` is too large"]
    );
    // a bad character does not also produce a syntax error right after it
    assert_eq!(
        short("fn f() = 1 # 2"),
        vec!["bad.adj:1:12: error: unexpected character `#`"]
    );
}

#[test]
fn empty_index_and_big_tuple_index() {
    assert_eq!(
        short("fn f() = x[]"),
        vec!["bad.adj:1:10: error: expected an index, found `]`"]
    );
    assert_eq!(
        short("fn f() = t.99999999999"),
        vec!["bad.adj:1:12: error: tuple index is too large"]
    );
}

#[test]
fn missing_semicolon_for_local_expression_fn() {
    let d = short("fn f() { fn g(x) = x * 2\n let y = 1; y }");
    assert_eq!(
        d,
        vec!["bad.adj:1:24: error: expected `;` after this statement"]
    );
}

#[test]
fn too_many_errors_are_capped() {
    let src = "fn f() { ) }\n".repeat(200);
    let (_, d, _) = check(&src);
    assert!(d.len() <= parser::MAX_SYNTAX_ERRORS + 1, "{}", d.len());
    assert!(d.last().unwrap().message.contains("more syntax errors"));
}
