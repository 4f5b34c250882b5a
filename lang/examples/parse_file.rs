//! Parses a file and prints the AST dump and diagnostics, with timings:
//! `cargo run -p adjoint-lang --example parse_file -- FILE [--quiet]`.
use adjoint_lang::*;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: parse_file FILE [--quiet]");
        std::process::exit(2);
    };
    let quiet = args.iter().any(|a| a == "--quiet");
    let bytes = std::fs::read(path).expect("cannot read file");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let mut sm = SourceMap::new();
    let file = sm.add_file(path.clone(), text.clone());
    let t = Instant::now();
    let lexed = lexer::lex(file, &text);
    let lex_time = t.elapsed();
    let ntok = lexed.tokens.len();
    drop(lexed);
    let t = Instant::now();
    let (module, diags) = parse(file, &text);
    let parse_time = t.elapsed();
    if !quiet {
        print!("{}", dump(&module, &sm));
    }
    eprint!("{}", render(&diags, &sm, false));
    eprintln!(
        "{ntok} tokens; lex {lex_time:?}; lex+parse {parse_time:?}; {} items; {} diagnostics",
        module.items.len(),
        diags.len()
    );
}
