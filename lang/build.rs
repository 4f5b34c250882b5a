fn main() {
    // Generates `$OUT_DIR/grammar.rs` from `src/grammar.lalrpop`.
    lalrpop::Configuration::new()
        .use_cargo_dir_conventions()
        .emit_rerun_directives(true)
        .process()
        .expect("lalrpop failed on src/grammar.lalrpop");
}
