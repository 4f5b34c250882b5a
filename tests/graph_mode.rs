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

#[test]
fn mlp_gradient_optimises_to_one_closure_free_graph() {
    let s = Session::new(Mode::Graph)
        .load_source("mlp.adj", MLP)
        .unwrap();
    let ir = s.emit_opt(Some("main")).unwrap();
    let graphs = ir.lines().filter(|l| l.starts_with("graph ")).count();
    assert_eq!(graphs, 1, "{ir}");
    for gone in [
        "J.",
        "B.",
        "env_",
        "is_zero",
        "switch",
        "zero()",
        "gadd",
        "record_grad",
        "grad_finalize",
        "= shape(",
        "tuple_len",
    ] {
        assert!(!ir.contains(gone), "`{gone}` left in\n{ir}");
    }
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
