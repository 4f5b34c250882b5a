//! The processes a program runs on, and the collectives between them.
//!
//! A process belongs to one world of `size` ranks ([`Communicator`]); the
//! collective kernels (`kernels/collective.rs`) exchange data through it.
//! Without MPI the world is [`Single`]: rank 0 of 1, and every collective
//! is the identity. With the `mpi` feature, the host program (the CLI, or
//! an embedder) initialises MPI and gives the session a
//! [`mpi::MpiWorld`] (`Session::with_communicator`); the VM hands it to
//! the kernels through their context ([`crate::kernels::Ctx::comm`]), so
//! two sessions of one process may run on different communicators.
//!
//! Data travels as f64 or i64 (every dtype converts to one of them
//! exactly), and before each exchange the ranks compare what they are about
//! to do (the collective, the dtype and the shape), so that ranks running
//! different programs get an error naming the ranks that differ instead
//! of a hang or of garbage.

/// A reduction across ranks.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

/// One world of processes.
pub trait Communicator: Send + Sync + std::fmt::Debug {
    /// This process's index, `0..size`.
    fn rank(&self) -> usize;
    /// The number of processes.
    fn size(&self) -> usize;
    /// Reduces `data` element-wise over the ranks, in place.
    fn all_reduce_f64(&self, data: &mut [f64], op: ReduceOp);
    fn all_reduce_i64(&self, data: &mut [i64], op: ReduceOp);
    /// Every rank's `data` (all the same length), in rank order.
    fn all_gather_f64(&self, data: &[f64]) -> Vec<f64>;
    fn all_gather_i64(&self, data: &[i64]) -> Vec<i64>;
    /// `data` of rank `root`, on every rank.
    fn broadcast_f64(&self, data: &mut [f64], root: usize);
    fn broadcast_i64(&self, data: &mut [i64], root: usize);
    /// Ends every process of the world (after this one has reported its
    /// error): a failing rank must not leave the others waiting in a
    /// collective.
    fn abort(&self, code: i32) -> !;
}

/// The world of one process.
#[derive(Debug, Default)]
pub struct Single;

impl Communicator for Single {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_reduce_f64(&self, _: &mut [f64], _: ReduceOp) {}
    fn all_reduce_i64(&self, _: &mut [i64], _: ReduceOp) {}
    fn all_gather_f64(&self, data: &[f64]) -> Vec<f64> {
        data.to_vec()
    }
    fn all_gather_i64(&self, data: &[i64]) -> Vec<i64> {
        data.to_vec()
    }
    fn broadcast_f64(&self, _: &mut [f64], _: usize) {}
    fn broadcast_i64(&self, _: &mut [i64], _: usize) {}
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

/// Checks that every rank is about to run the same collective on data of
/// the same kind: `header` describes it (the same length on every rank).
/// The error names the first rank that differs from rank 0.
pub fn agree(c: &dyn Communicator, what: &str, header: &[i64]) -> Result<(), String> {
    if c.size() == 1 {
        return Ok(());
    }
    let all = c.all_gather_i64(header);
    let n = header.len();
    let first = &all[..n];
    for r in 1..c.size() {
        if &all[r * n..(r + 1) * n] != first {
            return Err(format!(
                "{what}: rank {r} is not running the same collective as rank 0 \
                 (different programs, or data of different dtypes or shapes)"
            ));
        }
    }
    Ok(())
}

#[cfg(feature = "mpi")]
pub mod mpi {
    //! The world of an MPI job (`mpirun -np N adjoint run ...`), through
    //! rsmpi.

    use super::ReduceOp;
    use ::mpi::collective::SystemOperation;
    use ::mpi::topology::SimpleCommunicator;
    use ::mpi::traits::*;

    /// `MPI_COMM_WORLD`. The host keeps MPI's `Universe` alive (dropping
    /// it finalises MPI) for as long as this is used.
    pub struct MpiWorld {
        comm: SimpleCommunicator,
    }

    // MPI is initialised with `Threading::Serialized` by the host, and
    // the VM calls collectives from one thread at a time.
    impl std::fmt::Debug for MpiWorld {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            use super::Communicator;
            write!(f, "MpiWorld(rank {} of {})", self.rank(), self.size())
        }
    }

    unsafe impl Send for MpiWorld {}
    unsafe impl Sync for MpiWorld {}

    impl MpiWorld {
        pub fn new(comm: SimpleCommunicator) -> MpiWorld {
            MpiWorld { comm }
        }
    }

    fn op(o: ReduceOp) -> SystemOperation {
        match o {
            ReduceOp::Sum => SystemOperation::sum(),
            ReduceOp::Max => SystemOperation::max(),
            ReduceOp::Min => SystemOperation::min(),
        }
    }

    impl super::Communicator for MpiWorld {
        fn rank(&self) -> usize {
            self.comm.rank() as usize
        }
        fn size(&self) -> usize {
            self.comm.size() as usize
        }
        fn all_reduce_f64(&self, data: &mut [f64], o: ReduceOp) {
            let send = data.to_vec();
            self.comm.all_reduce_into(&send[..], data, op(o));
        }
        fn all_reduce_i64(&self, data: &mut [i64], o: ReduceOp) {
            let send = data.to_vec();
            self.comm.all_reduce_into(&send[..], data, op(o));
        }
        fn all_gather_f64(&self, data: &[f64]) -> Vec<f64> {
            let mut out = vec![0.0; data.len() * self.size()];
            self.comm.all_gather_into(data, &mut out[..]);
            out
        }
        fn all_gather_i64(&self, data: &[i64]) -> Vec<i64> {
            let mut out = vec![0; data.len() * self.size()];
            self.comm.all_gather_into(data, &mut out[..]);
            out
        }
        fn broadcast_f64(&self, data: &mut [f64], root: usize) {
            self.comm.process_at_rank(root as i32).broadcast_into(data);
        }
        fn broadcast_i64(&self, data: &mut [i64], root: usize) {
            self.comm.process_at_rank(root as i32).broadcast_into(data);
        }
        fn abort(&self, code: i32) -> ! {
            self.comm.abort(code)
        }
    }
}
