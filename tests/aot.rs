//! `adjoint build`: libraries built ahead of time, used from C.
//!
//! Each test builds a library with the `adjoint` command, compiles a C
//! program against it with `cc`, runs it and compares the numbers it
//! prints with the same functions run through the `Session` API (and with
//! the derivatives worked out by hand). The runtime's static library is
//! the one cargo built for these tests (`adjoint-capi` is a
//! dev-dependency). Without a C compiler the tests say so and pass.

use std::path::PathBuf;
use std::process::{Command, Output};

use adjoint::{Mode, Session, Value};

/// A scratch directory for one test, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("adjoint-aot-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create a scratch directory");
        Dir(p)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).expect("write a scratch file");
        p
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn adjoint_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_adjoint"))
}

/// Whether a C compiler is installed (else the test is skipped, saying so).
fn have_cc(test: &str) -> bool {
    let ok = Command::new("cc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!("SKIPPED {test}: no C compiler (`cc`) is installed");
    }
    ok
}

/// The runtime's static library, which cargo built for this test (the
/// package's dev-dependency `adjoint-capi` is a static library too): the
/// newest `libadjoint_capi-*.a` of this profile's `deps` directory.
fn runtime_lib() -> PathBuf {
    let exe = adjoint_exe();
    let deps = exe
        .parent()
        .expect("the executable's directory")
        .join("deps");
    let newest = std::fs::read_dir(&deps)
        .expect("the deps directory")
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with("libadjoint_capi-") && n.ends_with(".a")
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max();
    match newest {
        Some((_, p)) => p,
        None => panic!(
            "no libadjoint_capi-*.a in {}: cargo did not build the runtime's static library",
            deps.display()
        ),
    }
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run a command");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("internal compiler error"),
        "a panic:\n{stderr}"
    );
    out
}

fn adjoint(args: &[&str]) -> Output {
    run(Command::new(adjoint_exe()).args(args))
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The numbers a program printed, line by line, after each line's label.
/// Compiles `main_c` in `d` against the library `lib{name}.so` there,
/// runs it and returns what it printed.
fn run_c(d: &Dir, main_c: &str, name: &str) -> String {
    let c = d.write("main.c", main_c);
    let exe = d.path("main");
    ok(
        &run(Command::new("cc")
            .arg("-o")
            .arg(&exe)
            .arg(&c)
            .arg("-I")
            .arg(&d.0)
            .arg("-L")
            .arg(&d.0)
            .arg(format!("-l{name}"))
            .arg(format!("-Wl,-rpath,{}", d.0.display()))),
        "cc",
    );
    ok(&run(&mut Command::new(&exe)), "the C program")
}

fn numbers(stdout: &str, label: &str) -> Vec<f64> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{label}:")))
        .unwrap_or_else(|| panic!("no `{label}:` line in\n{stdout}"));
    line.split_whitespace()
        .map(|t| t.parse().unwrap_or_else(|_| panic!("not a number: {t}")))
        .collect()
}

/// The elements of a tensor result, as f64.
fn elems(v: &Value) -> Vec<f64> {
    v.as_tensor().expect("a tensor").as_f64_vec()
}

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}: got {got:?}, want {want:?}"
        );
    }
}

const F: &str = "fn f(w, x) = sum(tanh(x * w)) + w * w\n";

const F_MAIN: &str = r#"
#include <stdio.h>
#include <string.h>
#include "f.h"

int main(void) {
    double w = 0.7;
    double x[3] = {0.5, -1.25, 2.0};
    int64_t xs[1] = {3};
    adj_tensor in[2] = {
        {&w, NULL, 0, ADJ_F64},
        {x, xs, 1, ADJ_F64},
    };
    double v = 0.0;
    adj_tensor out[1] = {{&v, NULL, 0, ADJ_F64}};
    if (f(in, 2, out, 1) != ADJ_OK) {
        printf("error: %s\n", adjoint_last_error());
        return 1;
    }
    printf("value: %.17g\n", v);
    double dw = 0.0, dx[3] = {0, 0, 0};
    adj_tensor grads[2] = {
        {&dw, NULL, 0, ADJ_F64},
        {dx, xs, 1, ADJ_F64},
    };
    if (f_grad(in, 2, grads, 2) != ADJ_OK) {
        printf("error: %s\n", adjoint_last_error());
        return 1;
    }
    printf("dw: %.17g\n", dw);
    printf("dx: %.17g %.17g %.17g\n", dx[0], dx[1], dx[2]);
    /* Value and gradient in one call. */
    double vg_v = 0.0, vg_dw = 0.0, vg_dx[3] = {0, 0, 0};
    adj_tensor vg[3] = {
        {&vg_v, NULL, 0, ADJ_F64},
        {&vg_dw, NULL, 0, ADJ_F64},
        {vg_dx, xs, 1, ADJ_F64},
    };
    if (f_value_and_grad(in, 2, vg, 3) != ADJ_OK) {
        printf("error: %s\n", adjoint_last_error());
        return 1;
    }
    printf("vg: %.17g %.17g %.17g %.17g %.17g\n", vg_v, vg_dw, vg_dx[0], vg_dx[1], vg_dx[2]);
    /* Twice: the second call runs the compiled function again. */
    double v2 = 0.0;
    adj_tensor out2[1] = {{&v2, NULL, 0, ADJ_F64}};
    if (f(in, 2, out2, 1) != ADJ_OK || v2 != v) {
        printf("error: second call\n");
        return 1;
    }

    /* Errors: a vector where the scalar result goes (wrong rank). */
    int64_t one[1] = {1};
    adj_tensor bad_out[1] = {{&v, one, 1, ADJ_F64}};
    int rc = f(in, 2, bad_out, 1);
    printf("wrong rank: %d %s\n", rc, adjoint_last_error());
    /* An input with a negative rank. */
    adj_tensor bad_in[2] = {{&w, NULL, -1, ADJ_F64}, {x, xs, 1, ADJ_F64}};
    rc = f(bad_in, 2, out, 1);
    printf("negative rank: %d %s\n", rc, adjoint_last_error());
    /* Too few inputs. */
    rc = f(in, 1, out, 1);
    printf("one input: %d %s\n", rc, adjoint_last_error());
    /* Shapes that do not broadcast: an error of the program. */
    int64_t x2s[1] = {2};
    adj_tensor in3[2] = {{x, xs, 1, ADJ_F64}, {x, x2s, 1, ADJ_F64}};
    rc = f(in3, 2, out, 1);
    printf("bad shapes: %d %s\n", rc, adjoint_last_error());
    /* After errors, a good call still works and clears the message. */
    rc = f(in, 2, out, 1);
    printf("again: %d [%s] %.17g\n", rc, adjoint_last_error(), v);
    return 0;
}
"#;

/// The value and gradient of `f` at (0.7, [0.5, -1.25, 2.0]) in f64,
/// through the `Session` API.
fn f_reference() -> (f64, f64, Vec<f64>) {
    let src = format!(
        "{F}fn reference() {{\n    print(\"\");\n    value_and_grad(f, argnums = (0, 1))(f64(0.7), f64([0.5, -1.25, 2.0]))\n}}\n"
    );
    let s = Session::new(Mode::Graph)
        .load_source("f.adj", &src)
        .unwrap_or_else(|e| panic!("{e}"));
    let r = s
        .run_function("reference", &mut std::io::sink())
        .unwrap_or_else(|e| panic!("{e}"));
    let Value::Tuple(vg) = &r else {
        panic!("a pair: {r:?}")
    };
    let Value::Tuple(g) = &vg[1] else {
        panic!("a tuple of gradients: {r:?}")
    };
    (elems(&vg[0])[0], elems(&g[0])[0], elems(&g[1]))
}

#[test]
fn shared_library_value_and_gradient_from_c() {
    if !have_cc("shared_library_value_and_gradient_from_c") {
        return;
    }
    let rt = runtime_lib();
    let d = Dir::new("so");
    let src = d.write("f.adj", F);
    let lib = d.path("libf.so");
    let out = adjoint(&[
        "build",
        src.to_str().unwrap(),
        "--entry",
        "f",
        "--with-grad",
        "-o",
        lib.to_str().unwrap(),
        "--runtime",
        rt.to_str().unwrap(),
    ]);
    ok(&out, "adjoint build");
    let header = std::fs::read_to_string(d.path("f.h")).expect("the header f.h");
    for want in [
        "typedef struct adj_tensor",
        "int f(const adj_tensor *in, size_t n_in, adj_tensor *out, size_t n_out);",
        "int f_grad(const adj_tensor *in, size_t n_in, adj_tensor *out, size_t n_out);",
        "int f_value_and_grad(const adj_tensor *in, size_t n_in, adj_tensor *out, size_t n_out);",
        "in[0] = w",
        "in[1] = x",
        "const char *adjoint_last_error(void);",
    ] {
        assert!(header.contains(want), "f.h lacks `{want}`:\n{header}");
    }
    // The library exports the entries and nothing of the runtime's.
    if let Ok(nm) = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
    {
        if nm.status.success() {
            let syms = String::from_utf8_lossy(&nm.stdout);
            let names: Vec<&str> = syms
                .lines()
                .filter_map(|l| l.split_whitespace().nth(2))
                .collect();
            for want in ["f", "f_grad", "f_value_and_grad", "adjoint_last_error"] {
                assert!(
                    names.contains(&want),
                    "libf.so does not export {want}: {names:?}"
                );
            }
            assert!(!names.contains(&"adjoint_aot_call"), "{names:?}");
        }
    }
    let stdout = run_c(&d, F_MAIN, "f");

    let (v, dw, dx) = f_reference();
    close(&numbers(&stdout, "value"), &[v], 1e-12, "value");
    close(&numbers(&stdout, "dw"), &[dw], 1e-12, "dw");
    close(&numbers(&stdout, "dx"), &dx, 1e-12, "dx");
    let mut all = vec![v, dw];
    all.extend(&dx);
    close(&numbers(&stdout, "vg"), &all, 1e-12, "value_and_grad");
    // And by hand: f = sum(tanh(x w)) + w^2.
    let (w, x) = (0.7f64, [0.5f64, -1.25, 2.0]);
    let hv: f64 = x.iter().map(|xi| (xi * w).tanh()).sum::<f64>() + w * w;
    let hdw: f64 = x
        .iter()
        .map(|xi| xi * (1.0 - (xi * w).tanh().powi(2)))
        .sum::<f64>()
        + 2.0 * w;
    let hdx: Vec<f64> = x
        .iter()
        .map(|xi| w * (1.0 - (xi * w).tanh().powi(2)))
        .collect();
    close(&[v, dw], &[hv, hdw], 1e-12, "by hand");
    close(&dx, &hdx, 1e-12, "dx by hand");

    let line = |label: &str| -> String {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{label}: ")))
            .unwrap_or_else(|| panic!("no `{label}` line in\n{stdout}"))
            .to_string()
    };
    let wrong_rank = line("wrong rank");
    assert!(wrong_rank.starts_with("1 "), "{wrong_rank}");
    assert!(
        wrong_rank.contains("result 0 is f64[], but out[0] is f64[1]"),
        "{wrong_rank}"
    );
    let neg = line("negative rank");
    assert!(
        neg.starts_with("1 ") && neg.contains("in[0]: rank -1"),
        "{neg}"
    );
    let one = line("one input");
    assert!(
        one.starts_with("1 ") && one.contains("f takes 2 input tensors, but n_in is 1"),
        "{one}"
    );
    let shapes = line("bad shapes");
    assert!(shapes.starts_with("1 f: ") && shapes.len() > 6, "{shapes}");
    let again = line("again");
    assert!(again.starts_with("0 [] "), "{again}");
}

/// A matrix function big enough for fused native kernels, built as an
/// object file and linked with the runtime by hand.
const G: &str = r#"
fn g(W, x, b) = sum(tanh(W @ x + b) * tanh(W @ x + b)) / 10.0
"#;

const G_MAIN: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include "g.h"

#define R 96
#define C 80
#define K 64

int main(void) {
    static double W[R * C], x[C * K], b[K], gW[R * C], gx[C * K], gb[K];
    for (int i = 0; i < R * C; i++) W[i] = 0.01 * ((i * 7) % 23 - 11);
    for (int i = 0; i < C * K; i++) x[i] = 0.02 * ((i * 5) % 17 - 8);
    for (int i = 0; i < K; i++) b[i] = 0.1 * (i % 5) - 0.2;
    int64_t ws[2] = {R, C}, xs[2] = {C, K}, bs[1] = {K};
    adj_tensor in[3] = {{W, ws, 2, ADJ_F64}, {x, xs, 2, ADJ_F64}, {b, bs, 1, ADJ_F64}};
    double v;
    adj_tensor out[1] = {{&v, NULL, 0, ADJ_F64}};
    if (g(in, 3, out, 1)) { printf("error: %s\n", adjoint_last_error()); return 1; }
    adj_tensor grads[3] = {{gW, ws, 2, ADJ_F64}, {gx, xs, 2, ADJ_F64}, {gb, bs, 1, ADJ_F64}};
    if (g_grad(in, 3, grads, 3)) { printf("error: %s\n", adjoint_last_error()); return 1; }
    printf("value: %.17g\n", v);
    printf("gW:");
    for (int i = 0; i < R * C; i += 97) printf(" %.17g", gW[i]);
    printf("\ngx:");
    for (int i = 0; i < C * K; i += 89) printf(" %.17g", gx[i]);
    printf("\ngb:");
    for (int i = 0; i < K; i++) printf(" %.17g", gb[i]);
    printf("\n");
    return 0;
}
"#;

#[test]
fn object_file_linked_by_hand_matrix_gradient() {
    if !have_cc("object_file_linked_by_hand_matrix_gradient") {
        return;
    }
    let rt = runtime_lib();
    let d = Dir::new("obj");
    let src = d.write("g.adj", G);
    let obj = d.path("g.o");
    ok(
        &adjoint(&[
            "build",
            src.to_str().unwrap(),
            "--entry",
            "g",
            "--with-grad",
            "-o",
            obj.to_str().unwrap(),
        ]),
        "adjoint build -o g.o",
    );
    let c = d.write("main.c", G_MAIN);
    let exe = d.path("main");
    ok(
        &run(Command::new("cc")
            .arg("-o")
            .arg(&exe)
            .arg(&c)
            .arg(&obj)
            .arg(&rt)
            .arg("-I")
            .arg(&d.0)
            .args(["-lpthread", "-ldl", "-lm"])),
        "cc",
    );
    let stdout = ok(&run(&mut Command::new(&exe)), "the C program");

    // The same in f64 through the Session API.
    let src = format!(
        r#"{G}
fn inputs() {{
    let W = f64(reshape(0.01 * (f64(arange(96 * 80) * 7 % 23) - 11.0), [96, 80]));
    let x = f64(reshape(0.02 * (f64(arange(80 * 64) * 5 % 17) - 8.0), [80, 64]));
    let b = 0.1 * f64(arange(64) % 5) - 0.2;
    (W, x, b)
}}
fn reference() {{
    print("");
    let (W, x, b) = inputs();
    value_and_grad(g, argnums = (0, 1, 2))(W, x, b)
}}
"#
    );
    let s = Session::new(Mode::Graph)
        .load_source("g.adj", &src)
        .unwrap_or_else(|e| panic!("{e}"));
    let r = s
        .run_function("reference", &mut std::io::sink())
        .unwrap_or_else(|e| panic!("{e}"));
    let Value::Tuple(vg) = &r else { panic!() };
    let Value::Tuple(gr) = &vg[1] else { panic!() };
    let every = |v: Vec<f64>, step: usize| -> Vec<f64> { v.into_iter().step_by(step).collect() };
    // Fused kernels use vector polynomials (a few ulp from libm).
    close(&numbers(&stdout, "value"), &elems(&vg[0]), 1e-12, "value");
    close(
        &numbers(&stdout, "gW"),
        &every(elems(&gr[0]), 97),
        1e-12,
        "gW",
    );
    close(
        &numbers(&stdout, "gx"),
        &every(elems(&gr[1]), 89),
        1e-12,
        "gx",
    );
    close(&numbers(&stdout, "gb"), &elems(&gr[2]), 1e-12, "gb");
}

#[test]
fn build_errors_are_diagnostics() {
    let d = Dir::new("errors");
    let src = d.write(
        "p.adj",
        "fn f(x) = x * 2.0\nfn noisy(x) { print(x); x }\nfn k() = 1.0\n",
    );
    let s = src.to_str().unwrap();
    let o = d.path("p.o");
    let o = o.to_str().unwrap();
    let err = |args: &[&str], want: &str| {
        let out = adjoint(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(want),
            "{args:?}: want `{want}` in\n{stderr}"
        );
    };
    err(
        &["build", s, "--entry", "nope", "-o", o],
        "has no function `nope`",
    );
    err(
        &["build", "/no/such/file.adj", "--entry", "f", "-o", o],
        "cannot read \"/no/such/file.adj\"",
    );
    err(&["build", s, "--entry", "noisy", "-o", o], "performs IO");
    err(
        &["build", s, "--entry", "k", "--with-grad", "-o", o],
        "nothing to differentiate",
    );
    err(
        &[
            "build",
            s,
            "--entry",
            "f",
            "-o",
            d.path("libf.so").to_str().unwrap(),
            "--runtime",
            "/no/such/libadjoint_capi.a",
        ],
        "the runtime library \"/no/such/libadjoint_capi.a\" does not exist",
    );
    let bad = d.write("bad.adj", "fn f(x) = x +\n");
    err(
        &["build", bad.to_str().unwrap(), "--entry", "f", "-o", o],
        "bad.adj",
    );
    let rec = d.write("rec.adj", "fn r(p: { w: f64 }) = p.w\n");
    err(
        &["build", rec.to_str().unwrap(), "--entry", "r", "-o", o],
        "parameter `p` of `r` is declared a tuple or record",
    );
    // Declared types are documented in the header (and checked by calls).
    let typed = d.write("typed.adj", "fn t(x: f64[3], n: i64) = sum(x) * f64(n)\n");
    let out = adjoint(&["build", typed.to_str().unwrap(), "--entry", "t", "-o", o]);
    ok(&out, "adjoint build typed.adj");
    let h = std::fs::read_to_string(d.path("t.h")).expect("t.h");
    assert!(
        h.contains("in[0] = x: f64[3]\n") && h.contains("in[1] = n: i64\n"),
        "{h}"
    );
    // With every parameter's type declared, type errors come at build time.
    let t2 = d.write(
        "typed2.adj",
        "fn bad(x: f64[3], y: f64[2]) = sum(x + y)\nfn ns(x: f64[3]) = x * 2.0\n",
    );
    let t2 = t2.to_str().unwrap();
    err(&["build", t2, "--entry", "bad", "-o", o], "typed2.adj:1:36");
    err(
        &["build", t2, "--entry", "ns", "--with-grad", "-o", o],
        "ns_grad: `grad` needs `ns` to return a float scalar, but it returns f64[3]",
    );
    // An object file needs no runtime library or C compiler.
    let out = adjoint(&["build", s, "--entry", "f", "-o", o]);
    ok(&out, "adjoint build -o p.o");
    let bytes = std::fs::read(o).expect("the object file");
    assert_eq!(&bytes[..4], b"\x7fELF", "an ELF object");
    assert!(d.path("f.h").is_file());
}

const LOOP_MAIN: &str = r#"
#include <stdio.h>
#include "loss.h"

int main(void) {
    double w[4] = {0.1, 0.2, 0.3, -0.4}, x[2] = {1.0, 2.0};
    int64_t n = 3;
    int64_t ws[2] = {2, 2}, xs[2] = {1, 2};
    adj_tensor in[3] = {{w, ws, 2, ADJ_F64}, {x, xs, 2, ADJ_F64}, {&n, NULL, 0, ADJ_I64}};
    double v, gw[4], gx[2];
    adj_tensor out[1] = {{&v, NULL, 0, ADJ_F64}};
    adj_tensor grads[2] = {{gw, ws, 2, ADJ_F64}, {gx, xs, 2, ADJ_F64}};
    if (loss(in, 3, out, 1) || loss_grad(in, 3, grads, 2)) {
        printf("error: %s\n", adjoint_last_error());
        return 1;
    }
    printf("value: %.17g\n", v);
    printf("gw: %.17g %.17g %.17g %.17g\n", gw[0], gw[1], gw[2], gw[3]);
    printf("gx: %.17g %.17g\n", gx[0], gx[1]);
    /* Another trip count: the same compiled code, another result. */
    n = 5;
    if (loss(in, 3, out, 1)) { printf("error: %s\n", adjoint_last_error()); return 1; }
    printf("value5: %.17g\n", v);
    /* The gradient with respect to an int tensor is refused. */
    int64_t xi[2] = {1, 2};
    adj_tensor in_int[3] = {{w, ws, 2, ADJ_F64}, {xi, xs, 2, ADJ_I64}, {&n, NULL, 0, ADJ_I64}};
    int rc = loss_grad(in_int, 3, grads, 2);
    printf("int x: %d %s\n", rc, adjoint_last_error());
    return 0;
}
"#;

/// A loop with a data-dependent trip count (recursive graphs in the IR),
/// an int parameter, and the gradient with respect to two of three
/// parameters (`--wrt`).
#[test]
fn loop_int_parameter_and_wrt() {
    if !have_cc("loop_int_parameter_and_wrt") {
        return;
    }
    let rt = runtime_lib();
    let d = Dir::new("loop");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/tanh_loss.adj");
    let lib = d.path("libloss.so");
    ok(
        &adjoint(&[
            "build",
            example,
            "--entry",
            "loss",
            "--with-grad",
            "--wrt",
            "w,x",
            "-o",
            lib.to_str().unwrap(),
            "--runtime",
            rt.to_str().unwrap(),
        ]),
        "adjoint build",
    );
    let header = std::fs::read_to_string(d.path("loss.h")).expect("loss.h");
    assert!(header.contains("with respect to w, x."), "{header}");
    assert!(header.contains("n_out = 2:"), "{header}");
    let stdout = run_c(&d, LOOP_MAIN, "loss");
    let text = std::fs::read_to_string(example).expect("the example");
    let src = format!(
        r#"{text}
fn reference() {{
    print("");
    let w = f64([[0.1, 0.2], [0.3, -0.4]]);
    let x = f64([[1.0, 2.0]]);
    (value_and_grad(loss, argnums = (0, 1))(w, x, 3), loss(w, x, 5))
}}
"#
    );
    let s = Session::new(Mode::Graph)
        .load_source("loss.adj", &src)
        .unwrap_or_else(|e| panic!("{e}"));
    let r = s
        .run_function("reference", &mut std::io::sink())
        .unwrap_or_else(|e| panic!("{e}"));
    let Value::Tuple(top) = &r else {
        panic!("{r:?}")
    };
    let Value::Tuple(vg) = &top[0] else {
        panic!("{r:?}")
    };
    let Value::Tuple(g) = &vg[1] else {
        panic!("{r:?}")
    };
    close(&numbers(&stdout, "value"), &elems(&vg[0]), 1e-12, "value");
    close(&numbers(&stdout, "gw"), &elems(&g[0]), 1e-12, "gw");
    close(&numbers(&stdout, "gx"), &elems(&g[1]), 1e-12, "gx");
    close(
        &numbers(&stdout, "value5"),
        &elems(&top[1]),
        1e-12,
        "value5",
    );
    let int_x = stdout
        .lines()
        .find_map(|l| l.strip_prefix("int x: "))
        .expect("the int x line");
    assert!(
        int_x.starts_with("1 ")
            && int_x.contains("in[1] is i64[1, 2], but the gradient is taken with respect to it"),
        "{int_x}"
    );
}

/// The gradient of a function that does not return a scalar is refused
/// when called, with the reason; the function itself works.
#[test]
fn gradient_of_non_scalar_is_an_error() {
    if !have_cc("gradient_of_non_scalar_is_an_error") {
        return;
    }
    let rt = runtime_lib();
    let d = Dir::new("nonscalar");
    let src = d.write("h.adj", "fn h(x) = x * 2.0\n");
    let obj = d.path("h.o");
    ok(
        &adjoint(&[
            "build",
            src.to_str().unwrap(),
            "--entry",
            "h",
            "--with-grad",
            "-o",
            obj.to_str().unwrap(),
        ]),
        "adjoint build",
    );
    let c = d.write(
        "main.c",
        r#"
#include <stdio.h>
#include "h.h"
int main(void) {
    float x[3] = {1, 2, 3}, y[3], g[3];
    int64_t s[1] = {3};
    adj_tensor in[1] = {{x, s, 1, ADJ_F32}};
    adj_tensor out[1] = {{y, s, 1, ADJ_F32}};
    adj_tensor grad[1] = {{g, s, 1, ADJ_F32}};
    int rc = h(in, 1, out, 1);
    printf("h: %d %g %g %g\n", rc, y[0], y[1], y[2]);
    rc = h_grad(in, 1, grad, 1);
    printf("h_grad: %d %s\n", rc, adjoint_last_error());
    return 0;
}
"#,
    );
    let exe = d.path("main");
    ok(
        &run(Command::new("cc")
            .arg("-o")
            .arg(&exe)
            .arg(&c)
            .arg(&obj)
            .arg(&rt)
            .arg("-I")
            .arg(&d.0)
            .args(["-lpthread", "-ldl", "-lm"])),
        "cc",
    );
    let stdout = ok(&run(&mut Command::new(&exe)), "the C program");
    assert!(stdout.contains("h: 0 2 4 6\n"), "{stdout}");
    assert!(
        stdout.contains("h_grad: 1 h_grad: h returns f32[3] for these inputs, but its gradient needs a float scalar"),
        "{stdout}"
    );
}

const THREADS_MAIN: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include "f.h"

#define T 4

static double results[T];
static int status[T];

static void *work(void *arg) {
    int k = (int)(long)arg;
    /* Each thread its own shape: k + 1 elements. */
    double w = 0.25 * (k + 1), x[T], v = 0.0;
    for (int i = 0; i <= k; i++) x[i] = 0.5 * i - 0.3;
    int64_t xs[1] = {k + 1};
    adj_tensor in[2] = {{&w, NULL, 0, ADJ_F64}, {x, xs, 1, ADJ_F64}};
    adj_tensor out[1] = {{&v, NULL, 0, ADJ_F64}};
    for (int r = 0; r < 20; r++) {
        status[k] |= f(in, 2, out, 1);
    }
    results[k] = v;
    return NULL;
}

int main(void) {
    pthread_t th[T];
    for (long k = 0; k < T; k++) pthread_create(&th[k], NULL, work, (void *)k);
    for (int k = 0; k < T; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < T; k++) printf("thread%d: %d %.17g\n", k, status[k], results[k]);
    return 0;
}
"#;

/// Calls from several threads at once, each with its own input shape
/// (so each compiles its own specialisation), give the right values.
#[test]
fn calls_from_threads() {
    if !have_cc("calls_from_threads") {
        return;
    }
    let rt = runtime_lib();
    let d = Dir::new("threads");
    let src = d.write("f.adj", F);
    let obj = d.path("f.o");
    ok(
        &adjoint(&[
            "build",
            src.to_str().unwrap(),
            "--entry",
            "f",
            "-o",
            obj.to_str().unwrap(),
        ]),
        "adjoint build",
    );
    let c = d.write("main.c", THREADS_MAIN);
    let exe = d.path("main");
    ok(
        &run(Command::new("cc")
            .arg("-o")
            .arg(&exe)
            .arg(&c)
            .arg(&obj)
            .arg(&rt)
            .arg("-I")
            .arg(&d.0)
            .args(["-lpthread", "-ldl", "-lm"])),
        "cc",
    );
    let stdout = ok(&run(&mut Command::new(&exe)), "the C program");
    for k in 0..4usize {
        let w = 0.25 * (k + 1) as f64;
        let want: f64 = (0..=k)
            .map(|i| ((0.5 * i as f64 - 0.3) * w).tanh())
            .sum::<f64>()
            + w * w;
        let got = numbers(&stdout, &format!("thread{k}"));
        assert_eq!(got[0], 0.0, "status of thread {k}: {stdout}");
        close(&got[1..], &[want], 1e-12, &format!("thread {k}"));
    }
}

const RELU_MAIN: &str = r#"
#include <stdio.h>
#include "relu0.h"

int main(void) {
    float x[2] = {-1.5f, 2.0f}, v = 7.0f, g[2];
    int64_t xs[1] = {2};
    adj_tensor in[1] = {{x, xs, 1, ADJ_F32}};
    adj_tensor out[1] = {{&v, NULL, 0, ADJ_F32}};
    adj_tensor grads[1] = {{g, xs, 1, ADJ_F32}};
    if (relu0(in, 1, out, 1) || relu0_grad(in, 1, grads, 1)) {
        printf("error: %s\n", adjoint_last_error());
        return 1;
    }
    printf("%g %g %g\n", v, g[0], g[1]);
    x[0] = 3.0f;
    if (relu0(in, 1, out, 1)) { printf("error: %s\n", adjoint_last_error()); return 1; }
    printf("%g\n", v);
    return 0;
}
"#;

/// A library compiled per argument signature gives a weak literal the
/// type of its join: `relu0` of an f32 vector returns an f32 on the
/// literal's path too (it gave a weak f64 there, which an f32 output does
/// not take).
#[test]
fn weak_literal_paths_return_the_argument_dtype() {
    if !have_cc("weak_literal_paths_return_the_argument_dtype") {
        return;
    }
    let rt = runtime_lib();
    let d = Dir::new("relu");
    let src = d.write(
        "relu.adj",
        "fn relu0(x) { if x[0] > 0.0 { x[0] } else { 0.0 } }\n",
    );
    let lib = d.path("librelu.so");
    ok(
        &adjoint(&[
            "build",
            src.to_str().unwrap(),
            "--entry",
            "relu0",
            "--with-grad",
            "-o",
            lib.to_str().unwrap(),
            "--runtime",
            rt.to_str().unwrap(),
        ]),
        "adjoint build",
    );
    let stdout = run_c(&d, RELU_MAIN, "relu");
    assert_eq!(stdout, "0 0 0\n3\n");
}
