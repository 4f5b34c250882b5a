//! One test per rewrite: IR text in, optimised IR text out.

use super::{optimize, Options};
use crate::ir::parse::parse_module;
use crate::ir::print::print_module;

fn opt(text: &str) -> String {
    let (mut m, roots) = parse_module(text).unwrap_or_else(|e| panic!("{e:?}"));
    let root = roots[0];
    optimize(&mut m, &[root], &Options::default());
    if let Err(e) = crate::ir::verify::verify_reachable(&m, &[root]) {
        panic!("invalid IR after optimisation: {e:?}");
    }
    print_module(&m, &[root], None)
}

/// The body lines of the optimised root graph (no ids, to compare shapes).
fn ops(text: &str) -> Vec<String> {
    let printed = opt(text);
    printed
        .lines()
        .take_while(|l| *l != "}")
        .filter_map(|l| l.split_once(" = ").map(|(_, r)| r.to_string()))
        .chain(
            printed
                .lines()
                .find(|l| l.trim_start().starts_with("return"))
                .map(|l| l.trim().to_string()),
        )
        .collect()
}

#[test]
fn inlines_a_call_and_removes_the_callee() {
    let out = opt("graph @main(%0 x) {\n  %1 = @sq(%0)\n  return %1\n}\n\
         graph @sq(%2 y) {\n  %3 = mul(%2, %2)\n  return %3\n}\n");
    assert!(!out.contains("@sq"), "{out}");
    assert!(out.contains("mul(%0, %0)"), "{out}");
}

#[test]
fn tuple_get_of_make_tuple() {
    let o = ops("graph @main(%0 x, %1 y) {\n  %2 = make_tuple(%0, %1)\n  %3 = tuple_get(%2, 1)\n  %4 = exp(%3)\n  return %4\n}\n");
    assert_eq!(o, ["exp(%1)", "return %2"], "{o:?}");
}

#[test]
fn record_get_of_make_record() {
    let o = ops("graph @main(%0 x, %1 y) {\n  %2 = make_record(\"w\", %0, \"b\", %1)\n  %3 = record_get(%2, \"b\")\n  return %3\n}\n");
    assert_eq!(o, ["return %1"], "{o:?}");
}

#[test]
fn env_get_of_set_skips_other_keys() {
    let o = ops("graph @main(%0 x, %1 y) {\n  %2 = zero()\n  %3 = env_setitem(%2, 7, %0)\n  %4 = env_setitem(%3, 9, %1)\n  %5 = env_getitem(%4, 7)\n  %6 = env_getitem(%4, 8)\n  %7 = make_tuple(%5, %6)\n  return %7\n}\n");
    assert_eq!(o, ["zero()", "make_tuple(%0, %2)", "return %3"], "{o:?}");
}

#[test]
fn env_set_of_zero_on_a_key_not_there() {
    // Setting key 7 to zero() where only key 9 was set changes nothing;
    // on an environment that may hold key 7, or over a set of key 9
    // itself, it would. (Key 7 is stored nonzero in %8.)
    let o = ops("graph @main(%0 x, %1 e) {\n  %2 = zero()\n  %3 = env_setitem(%2, 9, %0)\n  %4 = env_setitem(%3, 7, %2)\n  %5 = env_setitem(%1, 7, %2)\n  %6 = env_setitem(%3, 9, %2)\n  %8 = env_setitem(%2, 7, %0)\n  %7 = make_tuple(%4, %5, %6, %8)\n  return %7\n}\n");
    assert_eq!(
        o,
        [
            "zero()",
            "env_setitem(%2, 9, %0)",
            "env_setitem(%1, 7, %2)",
            "env_setitem(%3, 9, %2)",
            "env_setitem(%2, 7, %0)",
            "make_tuple(%3, %4, %5, %6)",
            "return %7"
        ],
        "{o:?}"
    );
}

#[test]
fn env_keys_nothing_stores_are_zero() {
    // Key 5 is only ever stored as zero() or as what key 5 held: it is
    // always zero, and so are reads of it.
    let o = ops("graph @main(%0 x, %1 e) {\n  %2 = zero()\n  %3 = env_getitem(%1, 5)\n  %4 = env_setitem(%2, 5, %3)\n  %5 = env_setitem(%4, 9, %0)\n  %6 = env_getitem(%5, 5)\n  %7 = make_tuple(%5, %6)\n  return %7\n}\n");
    assert_eq!(
        o,
        [
            "zero()",
            "env_setitem(%2, 9, %0)",
            "make_tuple(%3, %2)",
            "return %4"
        ],
        "{o:?}"
    );
}

#[test]
fn gadd_of_builders_of_one_field() {
    let o = ops("graph @main(%0 r, %1 a, %2 b) {\n  %3 = record_grad(%0, \"y\", %1)\n  %4 = record_grad(%0, \"y\", %2)\n  %5 = gadd(%3, %4)\n  return %5\n}\n");
    assert_eq!(
        o,
        ["gadd(%1, %2)", "record_grad(%0, \"y\", %3)", "return %4"],
        "{o:?}"
    );
    // Different fields stay apart.
    let o = ops("graph @main(%0 r, %1 a, %2 b) {\n  %3 = record_grad(%0, \"y\", %1)\n  %4 = record_grad(%0, \"z\", %2)\n  %5 = gadd(%3, %4)\n  return %5\n}\n");
    assert_eq!(o.len(), 4, "{o:?}");
}

#[test]
fn unread_slots_of_branch_results_become_unit() {
    // Only slot 0 of the `if`'s result is read: the branches stop
    // computing slot 1.
    let out = opt("graph @main(%0 c, %1 x) {\n  %2 = switch(%0, @a, @b)\n  %3 = %2()\n  %4 = tuple_get(%3, 0)\n  return %4\n}\n\
         graph @a() {\n  %5 = exp(%1)\n  %6 = sin(%1)\n  %7 = make_tuple(%5, %6)\n  return %7\n}\n\
         graph @b() {\n  %8 = cos(%1)\n  %9 = tanh(%1)\n  %10 = make_tuple(%8, %9)\n  return %10\n}\n");
    assert!(!out.contains("sin(") && !out.contains("tanh("), "{out}");
    assert!(out.contains("exp(") && out.contains("cos("), "{out}");
}

#[test]
fn is_zero_switch_and_call_fold_to_the_rule() {
    // The shape of every primitive's backpropagator: a zero check that
    // selects between two graphs, then a call of the selected one.
    let o = ops("graph @main(%0 x) {\n  %1 = exp(%0)\n  %2 = is_zero(%1)\n  %3 = switch(%2, @z, @r)\n  %4 = %3()\n  return %4\n}\n\
         graph @z() {\n  %5 = zero()\n  return %5\n}\n\
         graph @r() {\n  %6 = mul(%1, %0)\n  return %6\n}\n");
    assert_eq!(o, ["exp(%0)", "mul(%1, %0)", "return %2"], "{o:?}");
}

#[test]
fn gadd_of_zero() {
    let o = ops("graph @main(%0 x) {\n  %1 = zero()\n  %2 = sin(%0)\n  %3 = gadd(%1, %2)\n  %4 = grad_finalize(%3, %0)\n  return %4\n}\n");
    // Without types, grad_finalize stays (it may cast).
    assert_eq!(
        o,
        ["sin(%0)", "grad_finalize(%1, %0)", "return %2"],
        "{o:?}"
    );
}

#[test]
fn gets_of_cotangent_builders() {
    // The cotangent of a record argument, taken apart field by field.
    let o = ops("graph @main(%0 r, %1 a, %2 b) {\n  %3 = record_grad(%0, \"w\", %1)\n  %4 = record_grad(%0, \"b\", %2)\n  %5 = gadd(%3, %4)\n  %6 = record_get(%5, \"b\")\n  %7 = tuple_grad(%0, 1, %1)\n  %8 = tuple_get(%7, 0)\n  %9 = make_tuple(%6, %8)\n  return %9\n}\n");
    assert_eq!(o, ["zero()", "make_tuple(%2, %3)", "return %4"], "{o:?}");
}

/// Optimises with `@main` (no parameters) as the typed entry.
fn ops_typed(text: &str) -> Vec<String> {
    let (mut m, roots) = parse_module(text).unwrap_or_else(|e| panic!("{e:?}"));
    let root = roots[0];
    let opts = Options {
        entry: Some((root, Vec::new())),
        ..Options::default()
    };
    optimize(&mut m, &[root], &opts);
    let printed = print_module(&m, &[root], None);
    printed
        .lines()
        .take_while(|l| *l != "}")
        .filter_map(|l| {
            l.split_once(" = ").map(|(_, r)| r.to_string()).or_else(|| {
                l.trim()
                    .strip_prefix("return")
                    .map(|r| format!("return{r}"))
            })
        })
        .collect()
}

#[test]
fn typed_shape_queries_fold_and_the_switch_on_them() {
    let o = ops_typed("graph @main() {\n  %1 = make_tuple(2, 3)\n  %2 = ones(%1, f32)\n  %3 = shape(%2)\n  %4 = tuple_len(%3)\n  %5 = eq(%4, 2)\n  %6 = switch(%5, @a, @b)\n  %7 = %6()\n  return %7\n}\n\
         graph @a() {\n  %8 = sum_to(%2, %2)\n  %9 = reshape(%8, %3)\n  %10 = exp(%9)\n  return %10\n}\n\
         graph @b() {\n  %11 = neg(%2)\n  return %11\n}\n");
    assert_eq!(
        o,
        ["make_tuple(2, 3)", "ones(%0, f32)", "exp(%1)", "return %2"],
        "{o:?}"
    );
}

#[test]
fn typed_grad_finalize_keeps_a_needed_cast() {
    // d is f32, x is a weak f64 scalar: the cast stays.
    let o = ops_typed("graph @main() {\n  %1 = make_tuple()\n  %2 = ones(%1, f32)\n  %3 = grad_finalize(%2, 2.0)\n  %4 = grad_finalize(%2, %2)\n  %5 = make_tuple(%3, %4)\n  return %5\n}\n");
    assert_eq!(
        o,
        [
            "make_tuple()",
            "ones(%0, f32)",
            "grad_finalize(%1, 2.0)",
            "make_tuple(%2, %1)",
            "return %3"
        ],
        "{o:?}"
    );
}

#[test]
fn switch_on_a_runtime_condition_stays() {
    let out = opt("graph @main(%0 x) {\n  %1 = gt(%0, 0.0)\n  %2 = switch(%1, @a, @b)\n  %3 = %2()\n  return %3\n}\n\
         graph @a() {\n  %4 = exp(%0)\n  return %4\n}\n\
         graph @b() {\n  %5 = neg(%0)\n  return %5\n}\n");
    assert!(out.contains("switch"), "{out}");
}

#[test]
fn cse_merges_equal_applications_with_equal_constants() {
    let o = ops("graph @main(%0 x) {\n  %1 = mul(%0, 2.0)\n  %2 = mul(%0, 2.0)\n  %3 = add(%1, %2)\n  return %3\n}\n");
    assert_eq!(o, ["mul(%0, 2.0)", "add(%1, %1)", "return %2"], "{o:?}");
}

#[test]
fn recursive_graphs_are_not_inlined() {
    let out = opt("graph @main(%0 n) {\n  %1 = @loop(%0)\n  return %1\n}\n\
         graph @loop(%2 i) {\n  %3 = gt(%2, 0)\n  %4 = switch(%3, @again, @done)\n  %5 = %4()\n  return %5\n}\n\
         graph @again() {\n  %6 = sub(%2, 1)\n  %7 = @loop(%6)\n  return %7\n}\n\
         graph @done() {\n  return %2\n}\n");
    assert!(out.contains("@loop("), "{out}");
}

#[test]
fn closures_nested_in_an_inlined_graph_are_cloned() {
    // J-style: the callee returns (value, closure over its own nodes).
    let o = ops("graph @main(%0 x) {\n  %1 = @jf(%0)\n  %2 = tuple_get(%1, 0)\n  %3 = tuple_get(%1, 1)\n  %4 = %3(1.0)\n  %5 = make_tuple(%2, %4)\n  return %5\n}\n\
         graph @jf(%6 a) {\n  %7 = sin(%6)\n  %8 = make_tuple(%7, @bf)\n  return %8\n}\n\
         graph @bf(%9 d) {\n  %10 = cos(%6)\n  %11 = mul(%9, %10)\n  return %11\n}\n");
    assert_eq!(
        o,
        [
            "sin(%0)",
            "cos(%0)",
            "mul(1.0, %2)",
            "make_tuple(%1, %3)",
            "return %4"
        ],
        "{o:?}"
    );
}
