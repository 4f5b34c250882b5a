//! Graph mode's optimiser on whole programs: statically controlled
//! gradients become one first-order graph of primitives, and graph mode
//! prints what eager mode prints.

use adjoint::{Mode, Session};

/// An MLP's loss and its gradient over a parameter record, as in the
/// digits example (smaller shapes).
const MLP: &str = "\
fn loss(p, x, y) {
    let h = relu(x @ p.w1 + p.b1);
    let h2 = relu(h @ p.w2 + p.b2);
    let logits = h2 @ p.w3 + p.b3;
    let m = max(logits, axis = 1, keepdims = true);
    let lse = log(sum(exp(logits - m), axis = 1, keepdims = true)) + m;
    -mean(sum((logits - lse) * y, axis = 1))
}
fn main() {
    let p = {w1: randn((64, 32), seed = 1) * 0.1, b1: zeros((32,)),
             w2: randn((32, 32), seed = 2) * 0.1, b2: zeros((32,)),
             w3: randn((32, 10), seed = 3) * 0.1, b3: zeros((10,))};
    let x = rand((16, 64), seed = 4);
    let y = one_hot(i64(rand((16,), seed = 5) * 10.0), 10);
    let (l, g) = value_and_grad(loss)(p, x, y);
    print(l, sum(g.w1), sum(g.b1), sum(g.w2), sum(g.b2), sum(g.w3), sum(g.b3));
}
";

fn run(mode: Mode, src: &str) -> String {
    let s = Session::new(mode).load_source("mlp.adj", src).unwrap();
    let mut out = Vec::new();
    s.run_main(&mut out)
        .unwrap_or_else(|e| panic!("{}", e.render(false)));
    String::from_utf8(out).unwrap()
}

/// The optimised IR of `main`, checked to be one graph with none of AD's
/// machinery (nor the extra names in `gone`) left.
fn assert_closure_free(name: &str, src: &str, gone: &[&str]) -> String {
    let s = Session::new(Mode::Graph).load_source(name, src).unwrap();
    let ir = s.emit_opt(Some("main")).unwrap();
    let graphs = ir.lines().filter(|l| l.starts_with("graph ")).count();
    assert_eq!(graphs, 1, "{ir}");
    let machinery = ["J.", "B.", "env_", "is_zero", "switch", "zero()", "gadd"];
    for g in machinery.iter().chain(gone) {
        assert!(!ir.contains(g), "`{g}` left in\n{ir}");
    }
    ir
}

#[test]
fn mlp_gradient_optimises_to_one_closure_free_graph() {
    let ir = assert_closure_free(
        "mlp.adj",
        MLP,
        &["record_grad", "grad_finalize", "= shape(", "tuple_len"],
    );
    // The three weight gradients are matrix products.
    assert!(ir.matches("matmul(").count() >= 3 + 5, "{ir}");
}

#[test]
fn mlp_graph_and_eager_agree() {
    let g = run(Mode::Graph, MLP);
    let e = run(Mode::Eager, MLP);
    assert_eq!(g, e);
    assert!(g.split_whitespace().count() == 7, "{g}");
}

/// ADBench's GMM objective from `examples/gmm.adj`, with inputs of known
/// shapes (d = 3, K = 4, n = 50) made in the program.
fn gmm_program() -> String {
    let example = include_str!("../examples/gmm.adj");
    let functions = example.split("fn main()").next().unwrap();
    format!(
        "{functions}
fn main() {{
    let alphas = randn((4,), seed = 1, dtype = f64);
    let means = randn((4, 3), seed = 2, dtype = f64);
    let icf = randn((4, 6), seed = 3, dtype = f64) * 0.3;
    let x = randn((50, 3), seed = 4, dtype = f64);
    let (v, g) = value_and_grad(gmm_objective, argnums = (0, 1, 2))(alphas, means, icf, x, 1.0, 0.0);
    print(v, sum(g.0), sum(g.1), sum(g.2));
}}
"
    )
}

#[test]
fn gmm_gradient_optimises_to_one_closure_free_graph() {
    let src = gmm_program();
    assert_closure_free("gmm.adj", &src, &["tuple_grad"]);
    assert_eq!(run(Mode::Graph, &src), run(Mode::Eager, &src));
}
