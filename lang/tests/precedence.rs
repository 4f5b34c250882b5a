//! Operator precedence and associativity (language.md §3), and the lexing
//! rules that interact with the grammar (tuple indices, ranges, floats).

use adjoint_lang::*;

fn e(src: &str) -> String {
    let (e, diags) = parse_expr(FileId(0), src);
    assert!(diags.is_empty(), "{src}: {diags:?}");
    dump_expr(&e.unwrap())
}

fn errs(src: &str) -> Vec<String> {
    let (_, diags) = parse(FileId(0), src);
    diags.into_iter().map(|d| d.message).collect()
}

#[test]
fn power_binds_tighter_than_unary_minus() {
    assert_eq!(e("-x ** 2"), "(neg (** x 2))");
    assert_eq!(e("-(x ** 2)"), "(neg (** x 2))");
    assert_eq!(e("(-x) ** 2"), "(** (neg x) 2)");
    assert_eq!(e("!a ** b"), "(not (** a b))");
}

#[test]
fn power_is_right_associative() {
    assert_eq!(e("2 ** 3 ** 2"), "(** 2 (** 3 2))");
    assert_eq!(e("a ** b ** c ** d"), "(** a (** b (** c d)))");
}

#[test]
fn power_of_negative() {
    assert_eq!(e("x ** -1"), "(** x (neg 1))");
    assert_eq!(e("x ** -y ** 2"), "(** x (neg (** y 2)))");
    assert_eq!(e("2 * x ** 3"), "(* 2 (** x 3))");
}

#[test]
fn postfix_binds_tightest() {
    assert_eq!(e("-f(x)"), "(neg (call f x))");
    assert_eq!(e("a.b ** 2"), "(** (field a b) 2)");
    assert_eq!(e("x[0] ** t.1"), "(** (index x 0) (get t 1))");
}

#[test]
fn arithmetic_levels() {
    assert_eq!(e("a + b * c"), "(+ a (* b c))");
    assert_eq!(e("a * b + c"), "(+ (* a b) c)");
    assert_eq!(e("a - b - c"), "(- (- a b) c)");
    assert_eq!(e("a / b / c"), "(/ (/ a b) c)");
    assert_eq!(e("a @ b * c % d"), "(% (* (@ a b) c) d)");
    assert_eq!(e("-a * b"), "(* (neg a) b)");
    assert_eq!(e("a - -b"), "(- a (neg b))");
    assert_eq!(e("a * -b"), "(* a (neg b))");
    assert_eq!(e("--a"), "(neg (neg a))");
}

#[test]
fn logic_and_comparison_levels() {
    assert_eq!(e("a || b && c"), "(|| a (&& b c))");
    assert_eq!(e("a && b || c"), "(|| (&& a b) c)");
    assert_eq!(e("a < b && c >= d"), "(&& (< a b) (>= c d))");
    assert_eq!(e("a + 1 == b * 2"), "(== (+ a 1) (* b 2))");
    assert_eq!(e("!a && !b"), "(&& (not a) (not b))");
    assert_eq!(
        e("-x ** 2 == -(x ** 2)"),
        "(== (neg (** x 2)) (neg (** x 2)))"
    );
    assert_eq!(e("2 ** 3 ** 2 == 512"), "(== (** 2 (** 3 2)) 512)");
    assert_eq!(e("(a < b) < c"), "(< (< a b) c)");
}

#[test]
fn comparisons_do_not_chain() {
    let m = errs("fn f() = a < b < c");
    assert_eq!(m, vec!["comparison operators cannot be chained"]);
    let m = errs("fn f() = a == b != c");
    assert_eq!(m, vec!["comparison operators cannot be chained"]);
    let m = errs("fn f() = a < b < c < d");
    assert_eq!(m.len(), 2);
    assert!(errs("fn f() = (a < b) < c").is_empty());
}

#[test]
fn range_binds_loosest() {
    let m = {
        let (m, d) = parse(
            FileId(0),
            "fn f() { for i in 1..p + 1 { } for j in a * 2..b - 1 { } }",
        );
        assert!(d.is_empty(), "{d:?}");
        m
    };
    let out = dump(&m, &SourceMap::new());
    assert!(out.contains("(range 1 (+ p 1))"), "{out}");
    assert!(out.contains("(range (* a 2) (- b 1))"), "{out}");
    assert_eq!(e("progress(0..n - 1)"), "(call progress (range 0 (- n 1)))");
}

#[test]
fn range_only_where_allowed() {
    assert_eq!(
        errs("fn f() = g(0..2)"),
        vec!["a range is not allowed here"]
    );
    assert!(!errs("fn f() { let r = 0..2; }").is_empty());
    assert!(!errs("fn f() = 0..2").is_empty());
}

#[test]
fn tuple_index_lexing() {
    assert_eq!(e("t.0.1"), "(get (get t 0) 1)");
    assert_eq!(e("shape(x).1"), "(get (call shape x) 1)");
    assert_eq!(e("x[0].1"), "(get (index x 0) 1)");
    assert_eq!(e("t.10"), "(get t 10)");
    assert_eq!(e("t.0 + .5"), "(+ (get t 0) .5)");
    assert_eq!(e("p.w.0"), "(get (field p w) 0)");
}

#[test]
fn float_lexing() {
    assert_eq!(e(".5"), ".5");
    assert_eq!(e("1.5e-3"), "1.5e-3");
    assert_eq!(e("2.5e+4"), "2.5e+4");
    assert_eq!(e("1e3"), "1e3");
    let (x, _) = parse_expr(FileId(0), "1_000.25");
    assert!(matches!(&*x.unwrap().kind, ExprKind::Float { value, .. } if *value == 1000.25));
    let (x, _) = parse_expr(FileId(0), "1_000");
    assert!(matches!(&*x.unwrap().kind, ExprKind::Int(1000)));
}

#[test]
fn range_lexing() {
    let toks: Vec<_> = lexer::lex(FileId(0), "1..2")
        .tokens
        .into_iter()
        .map(|t| t.1)
        .collect();
    assert_eq!(
        toks,
        vec![lexer::Tok::Int(1), lexer::Tok::DotDot, lexer::Tok::Int(2)]
    );
    let toks: Vec<_> = lexer::lex(FileId(0), "0..n")
        .tokens
        .into_iter()
        .map(|t| t.1)
        .collect();
    assert_eq!(
        toks,
        vec![
            lexer::Tok::Int(0),
            lexer::Tok::DotDot,
            lexer::Tok::Ident("n")
        ]
    );
}

#[test]
fn keyword_args_and_ranges_in_calls() {
    assert_eq!(e("f(x = 1 + 2, y)"), "(call f (kw x (+ 1 2)) y)");
    assert_eq!(e("f(x == 1)"), "(call f (== x 1))");
}
