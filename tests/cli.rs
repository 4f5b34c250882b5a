#[test]
fn smoke() {
    assert!(std::path::Path::new(env!("CARGO_BIN_EXE_adjoint")).exists());
}
