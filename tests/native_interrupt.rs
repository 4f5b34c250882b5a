//! An interrupt request stops a loop that graph mode compiled to native
//! code (its own test binary: the request is process-wide).

use adjoint::{Mode, Session};

const SPIN: &str = "\
fn spin(n) = if n < 0 { n } else { spin(n + 1) }
fn main() {
    print(spin(0));
}
";

#[test]
fn an_interrupt_stops_a_native_loop() {
    let s = Session::new(Mode::Graph)
        .load_source("spin.adj", SPIN)
        .unwrap();
    let kernels = s.emit_kernels("main").unwrap();
    assert!(kernels.contains("scalar loop over i64 (@spin"), "{kernels}");
    let stopper = std::thread::spawn(|| {
        std::thread::sleep(std::time::Duration::from_millis(300));
        adjoint_runtime::vm::request_interrupt();
    });
    let mut out = Vec::new();
    let err = s
        .run_main(&mut out)
        .expect_err("the loop never ends by itself");
    stopper.join().unwrap();
    adjoint_runtime::vm::clear_interrupt();
    let text = err.render(false);
    assert!(text.contains("interrupted"), "{text}");
    // The location is the call that entered the loop.
    assert!(text.contains("spin.adj:3"), "{text}");
    assert!(out.is_empty());
}
