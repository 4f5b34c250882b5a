//! A Rust program that minimises a function written in Adjoint.
//!
//! The Rosenbrock function is defined in Adjoint; Rust asks the compiler
//! for its gradient (`Function::value_and_grad`, compiled once) and runs
//! gradient descent with momentum on it, from (-1.5, 2) to the minimum at
//! (1, 1).
//!
//! ```text
//! cargo run --release --example embed
//! ```

use adjoint::{Mode, Session, Value};

/// The function to minimise, in Adjoint.
pub const ROSENBROCK: &str = "
fn rosenbrock(p) {
    let x = p[0];
    let y = p[1];
    (1.0 - x) ** 2 + 100.0 * (y - x ** 2) ** 2
}
";

/// The result of a minimisation.
#[derive(Debug)]
pub struct Minimum {
    /// Where it stopped.
    pub point: [f64; 2],
    /// The function's value there.
    pub value: f64,
    /// How many gradient steps it took.
    pub steps: usize,
}

/// Gradient descent with momentum on the Rosenbrock function, until the
/// gradient's norm is under `tolerance` (or `max_steps` steps).
pub fn minimise(mode: Mode, tolerance: f64, max_steps: usize) -> Result<Minimum, adjoint::Error> {
    let session = Session::new(mode).load_source("rosenbrock.adj", ROSENBROCK)?;
    // (value, gradient) of the Adjoint function: compiled on the first
    // call, reused by every later one.
    let value_and_grad = session.function("rosenbrock")?.value_and_grad()?;
    let (lr, momentum) = (2e-4, 0.95);
    let mut p = [-1.5, 2.0];
    let mut velocity = [0.0, 0.0];
    let mut value = f64::INFINITY;
    for step in 0..max_steps {
        let out = value_and_grad.call(&[Value::from(p.to_vec())])?;
        let (v, g) = match out.as_tuple() {
            Some([v, g]) => (v.to_f64(), g.to_vec_f64()),
            _ => (None, None),
        };
        let (Some(v), Some(g)) = (v, g) else {
            panic!("value_and_grad gives (f64, f64[2]), not {out}");
        };
        value = v;
        if (g[0] * g[0] + g[1] * g[1]).sqrt() < tolerance {
            return Ok(Minimum {
                point: p,
                value,
                steps: step,
            });
        }
        for i in 0..2 {
            velocity[i] = momentum * velocity[i] - lr * g[i];
            p[i] += velocity[i];
        }
    }
    Ok(Minimum {
        point: p,
        value,
        steps: max_steps,
    })
}

#[allow(dead_code)] // tests/embed.rs includes this file for `minimise`
fn main() {
    match minimise(Mode::Graph, 1e-6, 200_000) {
        Ok(m) => println!(
            "minimum of the Rosenbrock function: f({:.6}, {:.6}) = {:.3e} after {} steps",
            m.point[0], m.point[1], m.value, m.steps
        ),
        Err(e) => {
            eprint!("{}", e.render(false));
            std::process::exit(1);
        }
    }
}
