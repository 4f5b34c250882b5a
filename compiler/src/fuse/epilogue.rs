//! GEMM epilogues: a matrix product followed by a bias row and/or an
//! activation, as one native kernel.
//!
//! `act(a @ b + bias)` — a dense layer — otherwise runs as a product and
//! an element-wise kernel: two native calls, the second reading the
//! product back from memory. Here one kernel computes the product and
//! then, in place over the product's buffer, in chunks of rows small
//! enough for the cache and split over the threads, adds the bias row and
//! applies the activation. When the value before the activation is used
//! too (reverse mode keeps it for the activation's derivative), the kernel
//! returns both.
//!
//! The product is the `matmul` kernel's (the same `gemm` call, so the
//! same order of summation), and the bias and activation are the
//! reference kernels' scalar functions, so results are those of eager
//! mode, bit for bit (a test checks it).
//!
//! Computing the product in panels of rows, each finished by the
//! epilogue while in cache, was tried and measured slower here: each
//! panel's `gemm` call packs the whole right operand again (see
//! `docs/benchmarks.md`).

use adjoint_runtime::error::RtError;
use adjoint_runtime::kernels::num::{Float, Num};
use adjoint_runtime::tensor::{DType, Element, Tensor};
use adjoint_runtime::value::Value;
use adjoint_runtime::vm::NativeKernel;

use super::matmul::{MatmulKernel, View};
use crate::prim::Prim;

/// The activation of an epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    Relu,
    Tanh,
    Sigmoid,
}

impl Act {
    pub fn of(p: Prim) -> Option<Act> {
        match p {
            Prim::Relu => Some(Act::Relu),
            Prim::Tanh => Some(Act::Tanh),
            Prim::Sigmoid => Some(Act::Sigmoid),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Act::Relu => "relu",
            Act::Tanh => "tanh",
            Act::Sigmoid => "sigmoid",
        }
    }

    fn apply<T: Num + Float>(self, x: T) -> T {
        match self {
            Act::Relu => x.relu(),
            Act::Tanh => x.tanh(),
            Act::Sigmoid => x.sigmoid(),
        }
    }
}

/// `act(view_a(a) @ view_b(b) + bias)` over matrices of one float dtype;
/// its inputs are the product's, then the bias when there is one. It
/// returns the value after the bias and the value after the activation,
/// or the one of them `outputs` asks for.
pub struct EpilogueKernel {
    product: MatmulKernel,
    bias: bool,
    act: Option<Act>,
    /// Whether the value before the activation is an output too (first).
    keep_pre: bool,
    dtype: DType,
    name: String,
}

impl EpilogueKernel {
    pub fn new(
        a: View,
        b: View,
        bias: bool,
        act: Option<Act>,
        keep_pre: bool,
        dtype: DType,
    ) -> Self {
        let product = MatmulKernel::new(a, b);
        let mut name = NativeKernel::name(&product).to_string();
        if bias {
            name = format!("{name} + bias");
        }
        if let Some(f) = act {
            name = format!("{}({name})", f.name());
        }
        EpilogueKernel {
            product,
            bias,
            act,
            keep_pre: keep_pre && act.is_some(),
            dtype,
            name,
        }
    }

    pub fn arity(&self) -> usize {
        self.product.arity() + usize::from(self.bias)
    }

    pub fn outputs(&self) -> usize {
        1 + usize::from(self.keep_pre)
    }

    fn run<T: Num + Float + Element + Send + Sync>(
        &self,
        p: Tensor,
        bias: Option<&Tensor>,
    ) -> Result<Value, RtError> {
        use rayon::prelude::*;
        let shape = p.shape().to_vec();
        let n = *shape.last().unwrap_or(&1);
        let bias: Option<&[T]> = match bias {
            Some(b) => Some(
                b.slice::<T>()
                    .ok_or_else(|| RtError::internal("epilogue: bias buffer"))?,
            ),
            None => None,
        };
        let mut z: Vec<T> = p
            .into_vec::<T>()
            .or_else(|t| t.slice::<T>().map(|s| s.to_vec()).ok_or(()))
            .map_err(|_| RtError::internal("epilogue: product buffer"))?;
        let mut h: Vec<T> = if self.keep_pre { z.clone() } else { Vec::new() };
        // Rows in chunks of about 64 KiB, over the threads.
        let rows = (65536 / (n.max(1) * std::mem::size_of::<T>())).max(1);
        let chunk = rows * n.max(1);
        let act = self.act;
        let row = |zs: &mut [T], hs: Option<&mut [T]>| {
            if let Some(b) = bias {
                for r in zs.chunks_mut(n.max(1)) {
                    for (x, bv) in r.iter_mut().zip(b) {
                        *x = x.add(*bv);
                    }
                }
            }
            match (act, hs) {
                (Some(f), Some(hs)) => {
                    for (h, x) in hs.iter_mut().zip(zs.iter()) {
                        *h = f.apply(*x);
                    }
                }
                (Some(f), None) => {
                    for x in zs.iter_mut() {
                        *x = f.apply(*x);
                    }
                }
                (None, _) => {}
            }
        };
        if self.keep_pre {
            z.par_chunks_mut(chunk)
                .zip(h.par_chunks_mut(chunk))
                .for_each(|(zs, hs)| row(zs, Some(hs)));
            let z = Tensor::from_vec(z, &shape)?;
            let h = Tensor::from_vec(h, &shape)?;
            Ok(Value::tuple(vec![Value::Tensor(z), Value::Tensor(h)]))
        } else {
            z.par_chunks_mut(chunk).for_each(|zs| row(zs, None));
            Ok(Value::Tensor(Tensor::from_vec(z, &shape)?))
        }
    }
}

impl NativeKernel for EpilogueKernel {
    fn name(&self) -> &str {
        &self.name
    }

    fn call(&self, mut args: Vec<Value>) -> Result<Value, RtError> {
        super::check_arity(&self.name, self.arity(), args.len())?;
        let bias = if self.bias { args.pop() } else { None };
        let Value::Tensor(p) = self.product.call(args)? else {
            return Err(RtError::internal("epilogue: the product is not a tensor"));
        };
        let bias = match bias {
            Some(Value::Tensor(b)) => Some(b),
            Some(_) => return Err(RtError::internal("epilogue: the bias is not a tensor")),
            None => None,
        };
        // Fusion checked the types at compile time; anything else runs as
        // the reference kernels would.
        let ok = p.dtype() == self.dtype
            && p.ndim() == 2
            && bias.as_ref().is_none_or(|b| {
                b.dtype() == self.dtype && b.ndim() == 1 && b.shape()[0] == p.shape()[1]
            });
        if !ok {
            return Err(RtError::internal(format!(
                "{}: operands of unexpected types",
                self.name
            )));
        }
        match self.dtype {
            DType::F32 => self.run::<f32>(p, bias.as_ref()),
            DType::F64 => self.run::<f64>(p, bias.as_ref()),
            _ => Err(RtError::internal("epilogue: not a float product")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use adjoint_runtime::kernels;

    struct NoCtx(std::io::Sink);
    impl kernels::Ctx for NoCtx {
        fn call(&mut self, _: &Value, _: &[Value]) -> Result<Value, RtError> {
            Err(RtError::internal("no calls"))
        }
        fn stdout(&mut self) -> &mut dyn std::io::Write {
            &mut self.0
        }
    }

    fn reference(name: &str, args: &[Value]) -> Value {
        let mut cx = NoCtx(std::io::sink());
        kernels::lookup(name).unwrap()(&mut cx, args).unwrap()
    }

    fn tensor(shape: &[usize], seed: u64, dtype: DType) -> Tensor {
        // A small linear congruential generator: values in [-1, 1).
        let n: usize = shape.iter().product();
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let xs: Vec<f64> = (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect();
        Tensor::from_vec(xs, shape).unwrap().cast(dtype)
    }

    fn bits(v: &Value) -> Vec<u64> {
        let Value::Tensor(t) = v else {
            panic!("a tensor")
        };
        let t = t.cast(DType::F64);
        t.slice::<f64>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    /// The epilogue kernel against `matmul`, `add` and the activation run
    /// one by one by the reference kernels: equal bit for bit.
    #[test]
    fn epilogues_equal_the_unfused_kernels() {
        let cases: &[(usize, usize, usize, DType)] = &[
            (128, 784, 512, DType::F32),
            (64, 96, 80, DType::F32),
            (33, 17, 130, DType::F64),
            (100, 50, 70, DType::F64),
            (128, 512, 512, DType::F32),
        ];
        for &(m, k, n, dt) in cases {
            let a = Value::Tensor(tensor(&[m, k], 1, dt));
            let b = Value::Tensor(tensor(&[k, n], 2, dt));
            let bias = Value::Tensor(tensor(&[n], 3, dt));
            let p = reference("matmul", &[a.clone(), b.clone()]);
            let z = reference("add", &[p.clone(), bias.clone()]);
            for act in [None, Some(Act::Relu), Some(Act::Tanh), Some(Act::Sigmoid)] {
                for (with_bias, keep_pre) in [(true, false), (true, true), (false, false)] {
                    if act.is_none() && !with_bias {
                        continue;
                    }
                    let pre = if with_bias { z.clone() } else { p.clone() };
                    let want = match act {
                        Some(f) => reference(f.name(), std::slice::from_ref(&pre)),
                        None => pre.clone(),
                    };
                    let kern =
                        EpilogueKernel::new(View::Plain, View::Plain, with_bias, act, keep_pre, dt);
                    let mut args = vec![a.clone(), b.clone()];
                    if with_bias {
                        args.push(bias.clone());
                    }
                    let got = kern.call(args).unwrap();
                    let what =
                        format!("{m}x{k}x{n} {dt:?} bias {with_bias} {act:?} keep {keep_pre}");
                    match got {
                        Value::Tuple(parts) if kern.outputs() == 2 => {
                            assert_eq!(bits(&parts[0]), bits(&pre), "{what}: pre-activation");
                            assert_eq!(bits(&parts[1]), bits(&want), "{what}");
                        }
                        v => assert_eq!(bits(&v), bits(&want), "{what}"),
                    }
                }
            }
        }
    }

    /// A transposed operand read in place gives the same values.
    #[test]
    fn epilogue_with_a_transposed_operand() {
        let a = Value::Tensor(tensor(&[64, 96], 4, DType::F32));
        let bt = Value::Tensor(tensor(&[80, 96], 5, DType::F32));
        let bias = Value::Tensor(tensor(&[80], 6, DType::F32));
        let b = reference("mT", std::slice::from_ref(&bt));
        let p = reference("matmul", &[a.clone(), b]);
        let want = reference("relu", &[reference("add", &[p, bias.clone()])]);
        let kern = EpilogueKernel::new(
            View::Plain,
            View::MatrixT,
            true,
            Some(Act::Relu),
            false,
            DType::F32,
        );
        let got = kern.call(vec![a, bt, bias]).unwrap();
        assert_eq!(bits(&got), bits(&want));
    }
}
