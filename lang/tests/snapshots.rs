//! AST dump snapshots: each `tests/snapshots/NAME.adj` is parsed and its
//! dump (plus any diagnostics, rendered without colour) must equal
//! `tests/snapshots/NAME.ast`. Run with `BLESS=1` to rewrite the expected
//! files after an intended change, then review the diff.

use adjoint_lang::*;
use std::path::Path;

fn snapshot(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let mut sm = SourceMap::new();
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let f = sm.add_file(name, text.clone());
    let (m, diags) = parse(f, &text);
    let mut out = dump(&m, &sm);
    if !diags.is_empty() {
        out.push_str("-- diagnostics --\n");
        for d in &diags {
            out.push_str(&render_short(d, &sm));
            out.push('\n');
        }
        out.push_str(&render(&diags, &sm, false));
    }
    out
}

#[test]
fn ast_snapshots() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots");
    let bless = std::env::var_os("BLESS").is_some();
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "adj"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 4);
    let mut failed = Vec::new();
    for p in paths {
        let got = snapshot(&p);
        let expected_path = p.with_extension("ast");
        if bless {
            std::fs::write(&expected_path, &got).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if got != expected {
            eprintln!("--- {} differs; got:\n{got}", expected_path.display());
            failed.push(expected_path);
        }
    }
    assert!(
        failed.is_empty(),
        "snapshots differ (BLESS=1 to update): {failed:?}"
    );
}
