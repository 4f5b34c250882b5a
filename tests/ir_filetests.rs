//! IR filetests: `tests/ir/*.adj` hold a program, a `// test lower` header,
//! a `// fn: NAME` line, and the expected IR of that function after
//! `// expected:` as comment lines. `BLESS=1 cargo test --test ir_filetests`
//! rewrites the expectations from the compiler's output.
//!
//! The second test lowers every program of the corpus and checks that its
//! printed IR parses back and prints identically.

use std::path::{Path, PathBuf};

use adjoint::{Mode, Session};
use adjoint_compiler::ir::parse::parse_module;
use adjoint_compiler::ir::print::print_module;

fn adj_files(dir: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("test directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "adj"))
        .collect();
    files.sort();
    files
}

const MARK: &str = "// expected:";

#[test]
fn lowering_filetests() {
    let bless = std::env::var_os("BLESS").is_some();
    let mut failures = Vec::new();
    for path in adj_files("tests/ir") {
        let text = std::fs::read_to_string(&path).unwrap();
        let source = text.split(MARK).next().unwrap().trim_end().to_string() + "\n";
        assert!(
            source.starts_with("// test lower"),
            "{}: missing `// test lower` header",
            path.display()
        );
        let function = source
            .lines()
            .find_map(|l| l.strip_prefix("// fn: "))
            .unwrap_or_else(|| panic!("{}: missing `// fn: NAME`", path.display()))
            .trim()
            .to_string();
        let session = Session::new(Mode::Eager)
            .load_source(&path.display().to_string(), &source)
            .unwrap_or_else(|e| panic!("{}: {}", path.display(), e.render(false)));
        let ir = session.emit_ir(Some(&function)).unwrap();
        let expected: String = text
            .split_once(MARK)
            .map(|(_, rest)| {
                rest.lines()
                    .skip(1)
                    .map(|l| {
                        l.strip_prefix("// ")
                            .unwrap_or(l.strip_prefix("//").unwrap_or(l))
                    })
                    .map(|l| format!("{l}\n"))
                    .collect()
            })
            .unwrap_or_default();
        if bless {
            let mut out = source.clone();
            out.push('\n');
            out.push_str(MARK);
            out.push('\n');
            for l in ir.lines() {
                if l.is_empty() {
                    out.push_str("//\n");
                } else {
                    out.push_str(&format!("// {l}\n"));
                }
            }
            std::fs::write(&path, out).unwrap();
        } else if ir.trim_end() != expected.trim_end() {
            failures.push(format!(
                "==== {}\n--- expected\n{expected}\n--- actual\n{ir}",
                path.display()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} filetests differ (BLESS=1 to accept):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn printed_ir_parses_back_identically() {
    let mut checked = 0;
    for path in adj_files("tests/programs")
        .into_iter()
        .chain(adj_files("tests/ir"))
    {
        let Ok(session) = Session::new(Mode::Eager).load_file(&path) else {
            continue; // error programs that fail before lowering
        };
        let text = session.emit_ir(None).unwrap();
        let (module, roots) = parse_module(&text).unwrap_or_else(|e| {
            panic!(
                "{}: printed IR does not parse: {e:?}\n{text}",
                path.display()
            )
        });
        let again = print_module(&module, &roots, None);
        assert_eq!(
            text,
            again,
            "{}: print → parse → print differs",
            path.display()
        );
        adjoint_compiler::ir::verify::verify(&module)
            .unwrap_or_else(|e| panic!("{}: parsed IR does not verify: {e:?}", path.display()));
        checked += 1;
    }
    assert!(checked > 100, "only {checked} programs lowered");
}
