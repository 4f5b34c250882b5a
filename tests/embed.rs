// Embedding Adjoint in a Rust program: load a program, call its functions,
// differentiate them. This file is both a test (`cargo test --test embed`)
// and the front-page example of the crate's documentation (a doctest runs
// its `main`).

use adjoint::{Device, ErrorKind, Mode, Options, Session, Value};

const PROGRAM: &str = "
fn f(x) = sin(x) * x

// A vector function: the squared norm of A x - b.
fn residual(a, x, b) {
    let r = a @ x - b;
    sum(r * r)
}

fn rosenbrock(p) = (1.0 - p[0]) ** 2 + 100.0 * (p[1] - p[0] ** 2) ** 2
";

fn main() -> Result<(), adjoint::Error> {
    // Graph mode (optimised) is the default; eager mode runs the IR as
    // differentiated, one primitive at a time.
    for mode in [Mode::Graph, Mode::Eager] {
        let session = Session::new(mode).load_source("example.adj", PROGRAM)?;

        // A scalar function and its derivatives.
        let f = session.function("f")?;
        let x = 1.2_f64;
        let y = f.call(&[Value::from(x)])?.to_f64().unwrap();
        assert_eq!(y, x.sin() * x);

        let df = f.grad()?;
        let g = df.call(&[Value::from(x)])?.to_f64().unwrap();
        assert!((g - (x.sin() + x * x.cos())).abs() < 1e-12);

        // Second derivative: grad of grad.
        let d2 = df.grad()?.call(&[Value::from(x)])?.to_f64().unwrap();
        assert!((d2 - (2.0 * x.cos() - x * x.sin())).abs() < 1e-12);

        // value_and_grad gives both from one forward pass.
        let vg = f.value_and_grad()?.call(&[Value::from(x)])?;
        let parts = vg.as_tuple().unwrap();
        assert_eq!(parts[0].to_f64(), Some(y));
        assert!((parts[1].to_f64().unwrap() - g).abs() < 1e-12);

        // Forward mode: the point, then the tangent.
        let jvp = f.jvp()?.call(&[Value::from(x), Value::from(1.0)])?;
        let (value, tangent) = (&jvp.as_tuple().unwrap()[0], &jvp.as_tuple().unwrap()[1]);
        assert_eq!(value.to_f64(), Some(y));
        assert!((tangent.to_f64().unwrap() - g).abs() < 1e-12);

        // A vector function of tensors with shapes.
        let a = Value::tensor_f64(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])?;
        let xv = Value::tensor_f64(&[0.5, -1.0], &[2])?;
        let b = Value::from(vec![1.0, 0.0, -1.0]);
        let residual = session.function("residual")?;
        // The gradients with respect to A and x: 2 r x^T and 2 A^T r.
        let grads = residual
            .grad_argnums(&[0, 1])?
            .call(&[a.clone(), xv.clone(), b.clone()])?;
        let (da, dx) = (&grads.as_tuple().unwrap()[0], &grads.as_tuple().unwrap()[1]);
        let (am, xs, bs) = (
            a.to_vec_f64().unwrap(),
            xv.to_vec_f64().unwrap(),
            b.to_vec_f64().unwrap(),
        );
        let r: Vec<f64> = (0..3)
            .map(|i| am[2 * i] * xs[0] + am[2 * i + 1] * xs[1] - bs[i])
            .collect();
        assert_eq!(da.shape(), Some(&[3, 2][..]));
        assert_eq!(dx.shape(), Some(&[2][..]));
        let da = da.to_vec_f64().unwrap();
        for i in 0..3 {
            for j in 0..2 {
                assert!((da[2 * i + j] - 2.0 * r[i] * xs[j]).abs() < 1e-12);
            }
        }
        let dx = dx.to_vec_f64().unwrap();
        for j in 0..2 {
            let want: f64 = (0..3).map(|i| 2.0 * am[2 * i + j] * r[i]).sum();
            assert!((dx[j] - want).abs() < 1e-12);
        }

        // Calling again with arguments of the same types reuses the
        // compiled code; new shapes compile once more.
        let before = residual.compiled_count();
        residual.call(&[a.clone(), xv.clone(), b.clone()])?;
        residual.call(&[a, xv, b])?;
        assert_eq!(residual.compiled_count(), before + 1);

        // Errors carry the rendered diagnostic, with file:line:col.
        let bad = Session::new(mode).load_source("bad.adj", "fn g(x) = x * y\n");
        let err = bad.err().expect("an unknown name is an error");
        assert_eq!(err.kind(), ErrorKind::Program);
        assert_eq!(err.location().map(|l| (l.1, l.2)), Some((1, 15)));
        assert!(err.render(false).contains("bad.adj:1:15"), "{err}");

        // A shape error shows up when the function is called with shapes
        // that do not fit.
        let wrong = Value::tensor_f64(&[1.0, 2.0, 3.0], &[3])?;
        let err = residual
            .call(&[Value::tensor_f64(&[0.0; 6], &[3, 2])?, wrong.clone(), wrong])
            .unwrap_err();
        assert!(err.render(false).contains("example.adj:6:"), "{err}");
    }

    // Asking for a GPU on a machine without a usable one (no driver, no
    // device, no NVRTC) is a typed error whose message says why, in one line.
    match Session::with_options(Options {
        mode: Mode::Graph,
        device: Device::Cuda,
        ..Default::default()
    }) {
        Ok(gpu) => assert_eq!(gpu.device(), Device::Cuda),
        Err(err) => {
            assert_eq!(err.kind(), ErrorKind::DeviceUnavailable);
            let text = err.to_string();
            assert!(text.contains("cannot use CUDA: "), "{text}");
            assert_eq!(text.trim_end().lines().count(), 1, "{text}");
        }
    }
    Ok(())
}

#[test]
fn embedding_example() {
    if let Err(e) = main() {
        panic!("{e}");
    }
}

// The program of `examples/embed.rs`: gradient descent, from Rust, on a
// function written in Adjoint.
#[cfg(test)]
#[allow(dead_code)]
#[path = "../examples/embed.rs"]
mod example;

#[test]
fn rust_gradient_descent_on_an_adjoint_function_converges() {
    let m = example::minimise(Mode::Graph, 1e-6, 200_000).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        (m.point[0] - 1.0).abs() < 1e-3 && (m.point[1] - 1.0).abs() < 1e-3,
        "{m:?}"
    );
    assert!(m.value < 1e-6, "{m:?}");
    assert!(m.steps < 200_000, "{m:?}");
}

/// The compiler's switches are a value the embedder passes in (the
/// command line builds it from `ADJOINT_*` variables): turning native
/// loops off leaves the loop and its gradient to the VM, with the same
/// results.
#[test]
fn compiler_options_reach_the_compiler() {
    use adjoint::CompilerOptions;
    let src = "fn f(x) {\n    let mut y = x;\n    for i in 0..100 { y = sin(y) * y + 0.5; }\n    y\n}\nfn main() { print(f(0.3), grad(f)(0.3)); }\n";
    let kernels = |opts: CompilerOptions| {
        Session::new(Mode::Graph)
            .with_compiler_options(opts)
            .load_source("o.adj", src)
            .unwrap()
            .emit_kernels("main")
            .unwrap()
    };
    let native = kernels(CompilerOptions::default());
    assert!(native.contains("scalar loop"), "{native}");
    let off = kernels(CompilerOptions {
        scalar_jit: false,
        ..Default::default()
    });
    assert!(!off.contains("scalar loop"), "{off}");
    let run = |opts: CompilerOptions| {
        let s = Session::new(Mode::Graph)
            .with_compiler_options(opts)
            .load_source("o.adj", src)
            .unwrap();
        let mut out = Vec::new();
        s.run_main(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    };
    assert_eq!(
        run(CompilerOptions::default()),
        run(CompilerOptions {
            scalar_jit: false,
            tapes: false,
            ..Default::default()
        })
    );
}
