//! A Rust program on several processes that trains a model written in
//! Adjoint, data-parallel: each rank holds a quarter (a half, ...) of the
//! rows, Adjoint computes the gradient on them and averages it over the
//! ranks (`all_reduce`), and Rust takes the steps. Rank 0 then repeats
//! the training on all the rows in a second session that runs alone (a
//! session per communicator) and checks that both give the same weights.
//!
//! ```text
//! cargo build --release --features mpi --example mpi_embed
//! mpirun -np 4 target/release/examples/mpi_embed
//! ```

use std::sync::Arc;

use adjoint::comm::mpi::MpiWorld;
use adjoint::comm::{Communicator, Single};
use adjoint::{Mode, Session, Value};

const MODEL: &str = "
fn loss(w, x, y) = mean((tanh(x @ w) - y) ** 2.0)
// The gradient of the whole batch, from this rank's rows.
fn step(w, x, y) = all_reduce(grad(loss)(w, x, y), \"mean\")
";

const ROWS: usize = 16;
const COLS: usize = 3;

/// Row `i` of the data set, and its target.
fn row(i: usize) -> ([f64; COLS], f64) {
    let x = [
        (i as f64 * 0.37).sin(),
        (i as f64 * 0.11).cos(),
        i as f64 / ROWS as f64 - 0.5,
    ];
    (x, (i as f64 * 0.5).sin() * 0.8)
}

/// Rows `lo..hi` as an f64[hi - lo, COLS] matrix and an f64[hi - lo]
/// vector.
fn rows(lo: usize, hi: usize) -> (Value, Value) {
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for i in lo..hi {
        let (x, y) = row(i);
        xs.extend_from_slice(&x);
        ys.push(y);
    }
    let x = adjoint::Tensor::from_vec(xs, &[hi - lo, COLS]).expect("a matrix");
    (Value::from(x), Value::from(ys))
}

/// Gradient descent from zero weights, on `comm`, with the rows given.
fn train(comm: Arc<dyn Communicator>, x: &Value, y: &Value, steps: usize) -> Vec<f64> {
    let session = Session::new(Mode::Graph)
        .with_communicator(comm)
        .load_source("model.adj", MODEL)
        .unwrap_or_else(|e| panic!("{e}"));
    let step = session.function("step").unwrap_or_else(|e| panic!("{e}"));
    let mut w = vec![0.0; COLS];
    for _ in 0..steps {
        let g = step
            .call(&[Value::from(w.clone()), x.clone(), y.clone()])
            .unwrap_or_else(|e| panic!("{e}"));
        let g = g.to_vec_f64().expect("an f64 gradient");
        for (wi, gi) in w.iter_mut().zip(g) {
            *wi -= 0.5 * gi;
        }
    }
    w
}

fn main() {
    let Some(universe) = mpi::initialize() else {
        panic!("MPI was initialised already");
    };
    let world: Arc<dyn Communicator> = Arc::new(MpiWorld::new(universe.world()));
    let (rank, size) = (world.rank(), world.size());
    assert_eq!(ROWS % size, 0, "{ROWS} rows do not split over {size} ranks");
    let k = ROWS / size;
    let (x, y) = rows(rank * k, rank * k + k);
    let w = train(world, &x, &y, 20);
    if rank == 0 {
        let (x, y) = rows(0, ROWS);
        let alone = train(Arc::new(Single), &x, &y, 20);
        let diff = w
            .iter()
            .zip(&alone)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        println!("ranks: {size}");
        println!("weights: {w:?}");
        println!("same as one process: {}", diff < 1e-12);
    }
}
