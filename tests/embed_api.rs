//! The embedding API beyond the front-page example (`tests/embed.rs`):
//! argument checking, caching, IO, int arguments, files, both modes.

use adjoint::{ErrorKind, Mode, Session, Value};

// As the README suggests to embedders: every test here runs on Adjoint's
// allocator.
#[global_allocator]
static ALLOC: adjoint::CountingAlloc = adjoint::CountingAlloc;

const SRC: &str = "
fn power(x, n: i64) {
    let mut acc = 1.0;
    for i in 0..n {
        acc = acc * x;
    }
    acc
}

fn noisy(x) {
    print(\"x is\", x);
    x * 2.0
}

fn pair(x) = (x, [x, 2.0 * x])

fn rec(p) = sum(p.w * p.w) + p.b

fn scaler(a) = |x| x * a

fn main() {
    print(power(2.0, 10));
}
";

fn session(mode: Mode) -> Session {
    Session::new(mode)
        .load_source("api.adj", SRC)
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn calls_agree_in_both_modes_and_compile_once_per_signature() {
    for mode in [Mode::Graph, Mode::Eager] {
        let s = session(mode);
        let power = s.function("power").unwrap();
        assert_eq!(power.arity(), 2);
        assert_eq!(power.mode(), mode);
        let call = |x: f64, n: i64| {
            power
                .call(&[Value::from(x), Value::from(n)])
                .unwrap()
                .to_f64()
                .unwrap()
        };
        assert_eq!(call(2.0, 10), 1024.0);
        let after_first = power.compiled_count();
        assert_eq!(call(3.0, 10), 59049.0);
        assert_eq!(call(0.5, 10), 0.5f64.powi(10));
        // Same types and the same int: no new compilation.
        assert_eq!(power.compiled_count(), after_first);
        // The gradient, d/dx x^n = n x^(n-1).
        let d = power.grad().unwrap();
        let g = d.call(&[Value::from(1.5), Value::from(4i64)]).unwrap();
        assert!((g.to_f64().unwrap() - 4.0 * 1.5f64.powi(3)).abs() < 1e-12);
        // f32 arguments give f32 results.
        let y = power
            .call(&[Value::from(2.0f32), Value::from(3i64)])
            .unwrap();
        assert_eq!(y.dtype(), Some(adjoint::DType::F32));
        assert_eq!(y.to_f64(), Some(8.0));
    }
}

#[test]
fn what_a_function_prints_goes_to_the_writer_given() {
    let s = session(Mode::Graph);
    let noisy = s.function("noisy").unwrap();
    let mut out = Vec::new();
    let y = noisy
        .call_with_output(&[Value::from(1.5)], &mut out)
        .unwrap();
    assert_eq!(y.to_f64(), Some(3.0));
    assert_eq!(String::from_utf8(out).unwrap(), "x is 1.5\n");
    // `run_function` and `run_main` share the session's compiled code.
    let mut out = Vec::new();
    s.run_main(&mut out).unwrap();
    s.run_main(&mut out).unwrap();
    assert_eq!(String::from_utf8(out).unwrap(), "1024.0\n1024.0\n");
    // IO inside differentiated code is refused, with a location.
    let e = noisy.grad().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Program);
    assert!(e.location().is_some(), "{e}");
}

#[test]
fn tuples_records_and_shapes_come_back_as_values() {
    let s = session(Mode::Graph);
    let v = s
        .function("pair")
        .unwrap()
        .call(&[Value::from(1.5)])
        .unwrap();
    let t = v.as_tuple().unwrap();
    assert_eq!(t[0].to_f64(), Some(1.5));
    assert_eq!(t[1].shape(), Some(&[2][..]));
    assert_eq!(t[1].to_vec_f64(), Some(vec![1.5, 3.0]));
    assert_eq!(v.to_string(), "(1.5, [1.5, 3.0])");
    // A record argument, and its gradient (a record of the same fields).
    let p = Value::record(vec![
        ("w", Value::tensor_f64(&[1.0, -2.0, 3.0], &[3]).unwrap()),
        ("b", Value::from(0.5)),
    ]);
    let rec = s.function("rec").unwrap();
    assert_eq!(
        rec.call(std::slice::from_ref(&p)).unwrap().to_f64(),
        Some(14.5)
    );
    let g = rec.grad().unwrap().call(&[p]).unwrap();
    let g = g.as_record().unwrap();
    assert_eq!(g.get("w").unwrap().to_vec_f64(), Some(vec![2.0, -4.0, 6.0]));
    assert_eq!(g.get("b").unwrap().to_f64(), Some(1.0));
    // The result type, by inference alone.
    let pair = s.function("pair").unwrap();
    assert_eq!(
        pair.result_type(&[Value::from(1.0f32)]).unwrap(),
        "(f32[], f32[2])"
    );
}

#[test]
fn misuse_is_a_usage_error_not_a_panic() {
    let s = session(Mode::Graph);
    let e = s.function("nope").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Usage);
    assert!(e.to_string().contains("no `nope` function"), "{e}");
    assert!(e.to_string().contains("power"), "lists the functions: {e}");
    let power = s.function("power").unwrap();
    let e = power.call(&[Value::from(1.0)]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Usage);
    assert_eq!(e.summary(), "`power` takes 2 arguments, but 1 was given");
    let e = power.grad_argnums(&[5]).unwrap_err();
    assert!(e.summary().contains("out of range"), "{e}");
    // A gradient with respect to an int is a compile error naming it.
    let e = power
        .grad_argnums(&[1])
        .and_then(|g| g.call(&[Value::from(1.0), Value::from(2i64)]))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Program);
    // Shapes that do not match their data.
    let e: adjoint::Error = Value::tensor_f64(&[1.0, 2.0, 3.0], &[2, 2])
        .unwrap_err()
        .into();
    assert!(e.summary().contains("cannot make a tensor of shape"), "{e}");
    // A function value can come back to Rust but cannot be passed in.
    let closure = s
        .function("scaler")
        .unwrap()
        .call(&[Value::from(2.0)])
        .unwrap();
    assert_eq!(closure.kind(), "function");
    let e = s.function("pair").unwrap().call(&[closure]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Usage);
    assert!(e.summary().contains("cannot be passed from Rust"), "{e}");
}

#[test]
fn forward_mode_and_second_derivatives_compose() {
    let s = Session::new(Mode::Graph)
        .load_source("f.adj", "fn f(x, y) = sin(x) * y + x * x * y")
        .unwrap();
    let f = s.function("f").unwrap();
    let (x, y) = (0.7f64, -1.3f64);
    // jvp along (1, 0) and (0, 1) gives the partial derivatives.
    let jvp = f.jvp().unwrap();
    assert_eq!(jvp.arity(), 4);
    let along = |dx: f64, dy: f64| {
        let r = jvp
            .call(&[x.into(), y.into(), dx.into(), dy.into()])
            .unwrap();
        r.as_tuple().unwrap()[1].to_f64().unwrap()
    };
    assert!((along(1.0, 0.0) - (x.cos() * y + 2.0 * x * y)).abs() < 1e-12);
    assert!((along(0.0, 1.0) - (x.sin() + x * x)).abs() < 1e-12);
    // value_and_grad with argnums, and grad of grad.
    let vg = f.value_and_grad_argnums(&[0, 1]).unwrap();
    let r = vg.call(&[x.into(), y.into()]).unwrap();
    let r = r.as_tuple().unwrap();
    assert_eq!(r[0].to_f64(), Some(x.sin() * y + x * x * y));
    let gs = r[1].as_tuple().unwrap();
    assert!((gs[1].to_f64().unwrap() - (x.sin() + x * x)).abs() < 1e-12);
    let d2 = f.grad().unwrap().grad().unwrap();
    let v = d2.call(&[x.into(), y.into()]).unwrap().to_f64().unwrap();
    assert!((v - (-x.sin() * y + 2.0 * y)).abs() < 1e-12);
    // Hessian-vector product: jvp of grad.
    let hvp = f.grad().unwrap().jvp().unwrap();
    let r = hvp
        .call(&[x.into(), y.into(), 1.0.into(), 0.0.into()])
        .unwrap();
    assert!((r.as_tuple().unwrap()[1].to_f64().unwrap() - v).abs() < 1e-12);
}

#[test]
fn files_load_with_their_imports_and_errors_locate() {
    let dir = std::env::temp_dir().join(format!("adjoint-embed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("lib.adj"), "fn sq(x) = x * x\n").unwrap();
    std::fs::write(
        dir.join("main.adj"),
        "import \"lib.adj\" as l\n\nfn f(x) = l.sq(x) + 1.0\n\nfn bad(x) = x @ x\n",
    )
    .unwrap();
    let s = Session::new(Mode::Graph)
        .load_file(&dir.join("main.adj"))
        .unwrap();
    let f = s.function("f").unwrap();
    assert_eq!(f.call(&[3.0.into()]).unwrap().to_f64(), Some(10.0));
    assert_eq!(
        f.grad().unwrap().call(&[3.0.into()]).unwrap().to_f64(),
        Some(6.0)
    );
    let e = s
        .function("bad")
        .unwrap()
        .call(&[Value::tensor_f64(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap()])
        .unwrap_err();
    let (file, line, _) = e.location().unwrap();
    assert!(file.ends_with("main.adj"), "{e}");
    assert_eq!(line, 5, "{e}");
    let missing = Session::new(Mode::Graph).load_file(&dir.join("missing.adj"));
    assert_eq!(missing.err().unwrap().kind(), ErrorKind::Io);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn vjp_takes_the_cotangent_and_gives_one_per_argument() {
    for mode in [Mode::Graph, Mode::Eager] {
        let s = Session::new(mode)
            .load_source(
                "v.adj",
                "fn f(x, y) = (x * y, [sin(x), y])\nfn g(a) = a * 2.0\n",
            )
            .unwrap();
        assert_eq!(s.function_names().unwrap(), vec!["f", "g"]);
        let f = s.function("f").unwrap();
        assert_eq!(f.param_names(), vec!["x", "y"]);
        let vjp = f.vjp().unwrap();
        assert_eq!(vjp.arity(), 3);
        let (x, y) = (0.4f64, 1.7f64);
        // The cotangent has the result's structure: (scalar, vector).
        let dy = Value::tuple(vec![
            Value::from(0.5),
            Value::tensor_f64(&[2.0, -3.0], &[2]).unwrap(),
        ]);
        let r = vjp.call(&[x.into(), y.into(), dy]).unwrap();
        let r = r.as_tuple().unwrap();
        assert_eq!(r.len(), 2);
        // d/dx = 0.5 y + 2 cos x; d/dy = 0.5 x - 3.
        let dx = r[0].to_f64().unwrap();
        let dyy = r[1].to_f64().unwrap();
        assert!((dx - (0.5 * y + 2.0 * x.cos())).abs() < 1e-12, "{dx}");
        assert!((dyy - (0.5 * x - 3.0)).abs() < 1e-12, "{dyy}");
        // The transform keeps the names: the generated ones.
        assert_eq!(vjp.param_names(), vec!["x0", "x1", "dy"]);
        // A function without arguments has no vjp.
        let none = Session::new(mode)
            .load_source("n.adj", "fn k() = 1.0\n")
            .unwrap();
        let err = none.function("k").unwrap().vjp().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Usage);
    }
}

#[test]
fn one_argnum_gives_the_bare_gradient() {
    let s = Session::new(Mode::Graph)
        .load_source("a.adj", "fn f(x, y) = x * y * y\n")
        .unwrap();
    let f = s.function("f").unwrap();
    let (x, y) = (1.5f64, -2.0f64);
    let g1 = f.grad_argnum(1).unwrap();
    assert_eq!(
        g1.call(&[x.into(), y.into()]).unwrap().to_f64(),
        Some(2.0 * x * y)
    );
    let g0 = f.grad_argnum(0).unwrap();
    assert_eq!(
        g0.call(&[x.into(), y.into()]).unwrap().to_f64(),
        Some(y * y)
    );
    let vg = f.value_and_grad_argnum(1).unwrap();
    let r = vg.call(&[x.into(), y.into()]).unwrap();
    let r = r.as_tuple().unwrap();
    assert_eq!(r[0].to_f64(), Some(x * y * y));
    assert_eq!(r[1].to_f64(), Some(2.0 * x * y));
    // Second derivative in y through the bare gradient: 2 x.
    let h = g1.grad_argnum(1).unwrap();
    assert_eq!(
        h.call(&[x.into(), y.into()]).unwrap().to_f64(),
        Some(2.0 * x)
    );
    assert!(f.grad_argnum(2).is_err());
}

#[test]
fn new_int_arrays_of_the_same_shape_do_not_compile_again() {
    let s = Session::new(Mode::Graph)
        .load_source(
            "l.adj",
            "fn pick(x, labels) = sum(take(x, labels, axis = 0))\nfn count(n: i64) = sum(ones([n]))\n",
        )
        .unwrap();
    let pick = s.function("pick").unwrap();
    let x = Value::tensor_f64(&[1.0, 10.0, 100.0], &[3]).unwrap();
    let labels = |v: &[i64]| Value::Tensor(adjoint::Tensor::from_vec(v.to_vec(), &[2]).unwrap());
    let r = pick.call(&[x.clone(), labels(&[0, 2])]).unwrap();
    assert_eq!(r.to_f64(), Some(101.0));
    let compiled = pick.compiled_count();
    let r = pick.call(&[x.clone(), labels(&[1, 1])]).unwrap();
    assert_eq!(r.to_f64(), Some(20.0));
    assert_eq!(pick.compiled_count(), compiled);
    // Int scalars stay part of the signature: the program builds a shape
    // from this one.
    let count = s.function("count").unwrap();
    assert_eq!(
        count.call(&[Value::from(3i64)]).unwrap().to_f64(),
        Some(3.0)
    );
    assert_eq!(
        count.call(&[Value::from(5i64)]).unwrap().to_f64(),
        Some(5.0)
    );
    assert_eq!(count.compiled_count(), compiled + 2);
}

#[test]
fn parameters_left_out_take_their_defaults() {
    let s = Session::new(Mode::Graph)
        .load_source(
            "d.adj",
            "fn f(x, scale = 2.0, shift = 0.5) = x * scale + shift\n",
        )
        .unwrap();
    let f = s.function("f").unwrap();
    let call = |present: &[bool], args: &[f64]| {
        let args: Vec<Value> = args.iter().map(|a| Value::from(*a)).collect();
        f.with_args(present)
            .unwrap()
            .call(&args)
            .unwrap()
            .to_f64()
            .unwrap()
    };
    assert_eq!(call(&[true, false, false], &[3.0]), 6.5);
    assert_eq!(call(&[true, true, false], &[3.0, 10.0]), 30.5);
    // A later parameter given, an earlier one left out: passed by name.
    assert_eq!(call(&[true, false, true], &[3.0, 1.0]), 7.0);
    assert_eq!(call(&[true, true, true], &[3.0, 1.0, 1.0]), 4.0);
    // `x` has no default.
    let g = f
        .with_args(&[false, true, true])
        .and_then(|g| g.call(&[Value::from(1.0), Value::from(1.0)]));
    assert!(g.is_err());
}
