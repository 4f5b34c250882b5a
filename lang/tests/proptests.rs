//! Property tests: random token streams never make the parser panic, and
//! randomly generated expressions, printed with minimal parentheses, parse
//! back to the same tree (a check of precedence and associativity).

use adjoint_lang::*;
use proptest::prelude::*;

/// The token vocabulary of §1, plus a few invalid characters.
const VOCAB: &[&str] = &[
    "fn",
    "bprop",
    "let",
    "mut",
    "if",
    "else",
    "for",
    "in",
    "while",
    "break",
    "continue",
    "return",
    "import",
    "as",
    "true",
    "false",
    "x",
    "y",
    "_",
    "progress",
    "nn",
    "0",
    "1",
    "42",
    "1_000",
    "1.0",
    ".5",
    "1e-3",
    "2.5e+4",
    "\"s\"",
    "\"a\\n\"",
    "+",
    "-",
    "*",
    "/",
    "%",
    "**",
    "@",
    "==",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "&&",
    "||",
    "!",
    "=",
    "+=",
    "-=",
    "*=",
    "/=",
    "..",
    ":",
    ",",
    ";",
    ".",
    "|",
    "->",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "/* c */",
    "// c\n",
    "\n",
    "$",
    "\"open",
    "/* open",
    "t.0",
    "f32[3, 4]",
];

fn token_stream() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(VOCAB), 0..120).prop_map(|toks| toks.join(" "))
}

/// Token streams glued without spaces exercise the lexer's longest match.
fn glued_stream() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(VOCAB), 0..80).prop_map(|toks| toks.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_tokens_never_panic(src in token_stream()) {
        let mut sm = SourceMap::new();
        let f = sm.add_file("p.adj", src.clone());
        let (m, d) = parse(f, &src);
        let _ = dump(&m, &sm);
        let _ = render(&d, &sm, false);
    }

    #[test]
    fn glued_tokens_never_panic(src in glued_stream()) {
        let (_, d) = parse(FileId(0), &src);
        for x in &d {
            prop_assert!(x.primary.span.lo as usize <= src.len());
            prop_assert!(x.primary.span.hi as usize <= src.len());
        }
    }

    #[test]
    fn random_tokens_in_a_function_body_never_panic(body in token_stream()) {
        let src = format!("fn main() {{ {body} }}\nfn after() = 1");
        let _ = parse(FileId(0), &src);
        let _ = parse_expr(FileId(0), &body);
    }

    #[test]
    fn arbitrary_strings_never_panic(src in "\\PC{0,200}") {
        let _ = parse(FileId(0), &src);
    }
}

/// A random expression tree.
#[derive(Clone, Debug)]
enum T {
    Leaf(String),
    Un(&'static str, Box<T>),
    Bin(&'static str, Box<T>, Box<T>),
}

const BIN: &[&str] = &[
    "||", "&&", "==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "%", "@", "**",
];

fn prec(op: &str) -> u8 {
    match op {
        "||" => 1,
        "&&" => 2,
        "==" | "!=" | "<" | "<=" | ">" | ">=" => 3,
        "+" | "-" => 4,
        "*" | "/" | "%" | "@" => 5,
        "**" => 7,
        _ => unreachable!(),
    }
}

impl T {
    fn prec(&self) -> u8 {
        match self {
            T::Leaf(_) => 9,
            T::Un(..) => 6,
            T::Bin(op, ..) => prec(op),
        }
    }

    /// The expected dump.
    fn sexp(&self) -> String {
        match self {
            T::Leaf(s) => s.clone(),
            T::Un(op, e) => format!("({} {})", if *op == "-" { "neg" } else { "not" }, e.sexp()),
            T::Bin(op, l, r) => format!("({} {} {})", op, l.sexp(), r.sexp()),
        }
    }

    /// Source text with as few parentheses as the grammar allows.
    fn print(&self) -> String {
        fn wrap(t: &T, yes: bool) -> String {
            if yes {
                format!("({})", t.print())
            } else {
                t.print()
            }
        }
        match self {
            T::Leaf(s) => s.clone(),
            // the operand of a unary operator is a unary-level expression
            T::Un(op, e) => format!("{} {}", op, wrap(e, e.prec() < 6)),
            T::Bin(op, l, r) => {
                let p = prec(op);
                let (lp, rp) = match *op {
                    // `**`: left is postfix-level, right is unary-level
                    "**" => (l.prec() < 8, r.prec() < 6),
                    // comparisons do not associate
                    _ if p == 3 => (l.prec() <= p, r.prec() <= p),
                    // the others associate to the left
                    _ => (l.prec() < p, r.prec() <= p),
                };
                format!("{} {} {}", wrap(l, lp), op, wrap(r, rp))
            }
        }
    }
}

fn tree() -> impl Strategy<Value = T> {
    let leaf = prop_oneof![
        prop::sample::select(&["a", "b", "c", "x1"][..]).prop_map(|s| T::Leaf(s.to_string())),
        (0u32..100).prop_map(|n| T::Leaf(n.to_string())),
    ];
    leaf.prop_recursive(6, 40, 2, |inner| {
        prop_oneof![
            (prop::sample::select(&["-", "!"][..]), inner.clone())
                .prop_map(|(op, e)| T::Un(op, Box::new(e))),
            (prop::sample::select(BIN), inner.clone(), inner).prop_map(|(op, l, r)| T::Bin(
                op,
                Box::new(l),
                Box::new(r)
            )),
        ]
    })
}

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn minimal_parentheses_round_trip(t in tree()) {
        let src = t.print();
        let (e, d) = parse_expr(FileId(0), &src);
        prop_assert!(d.is_empty(), "{}: {:?}", src, d);
        prop_assert_eq!(squash(&dump_expr(&e.unwrap())), t.sexp(), "source: {}", src);
    }
}
