//! GEMM epilogues: a matrix product followed by a bias row and/or an
//! activation, as one native kernel.
//!
//! `act(a @ b + bias)` — a dense layer — otherwise runs as a product and
//! an element-wise kernel: the product is written to memory, then read
//! back, and the result written again. Here one kernel computes the
//! product in panels of rows, split over the threads, and adds the bias
//! row and applies the activation to each panel as soon as it is written,
//! while it is still in cache: the result goes to memory once. When the
//! value before the activation is used too (reverse mode keeps it for the
//! activation's derivative), the kernel returns both.
//!
//! Every element of the product is summed in the order the `matmul`
//! kernel sums it (`gemm`'s order depends only on the inner dimension),
//! and the bias and activation are the reference kernels' scalar
//! functions, so results are those of eager mode, bit for bit (tests
//! check it). Shapes where `gemm` would take another path fall back to the
//! whole product, then the bias and activation in place over it.

use adjoint_runtime::error::RtError;
use adjoint_runtime::kernels::linalg::{self, Layout};
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

impl EpilogueKernel {
    /// The product computed in panels of rows with the bias and the
    /// activation applied to each panel while it is in cache
    /// ([`linalg::matmul_panels`]); `None` when the operands are not
    /// matrices of the kernel's dtype or the shapes are not ones where the
    /// panels sum as the `matmul` kernel does (then the whole product is
    /// computed first).
    fn in_panels(&self, args: &[Value], bias: Option<&Tensor>) -> Result<Option<Value>, RtError> {
        let (va, vb) = self.product.views();
        let na = va.arity();
        let (Some((a, ta)), Some((b, tb))) = (
            MatmulKernel::operand(va, &args[..na]),
            MatmulKernel::operand(vb, &args[na..]),
        ) else {
            return Ok(None);
        };
        let d = self.dtype;
        if a.dtype() != d || b.dtype() != d || a.ndim() != 2 || b.ndim() != 2 {
            return Ok(None);
        }
        let dims = |x: &Tensor, t: bool| {
            let s = x.shape();
            if t {
                (s[1], s[0])
            } else {
                (s[0], s[1])
            }
        };
        let ((m, k), (k2, n)) = (dims(&a, ta), dims(&b, tb));
        if k != k2 || bias.is_some_and(|x| x.dtype() != d || x.shape() != [n]) {
            return Ok(None);
        }
        let layout = |t: bool| if t { Layout::Transposed } else { Layout::Plain };
        let (la, lb) = (layout(ta), layout(tb));
        match d {
            DType::F32 => self.panels_of::<f32>(m, k, n, (&a, la), (&b, lb), bias),
            DType::F64 => self.panels_of::<f64>(m, k, n, (&a, la), (&b, lb), bias),
            _ => Ok(None),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn panels_of<T: Num + Float + Element + Send + Sync>(
        &self,
        m: usize,
        k: usize,
        n: usize,
        (a, la): (&Tensor, Layout),
        (b, lb): (&Tensor, Layout),
        bias: Option<&Tensor>,
    ) -> Result<Option<Value>, RtError> {
        fn buf<T: Element>(x: &Tensor) -> Result<&[T], RtError> {
            x.slice::<T>()
                .ok_or_else(|| RtError::internal("epilogue: operand buffer"))
        }
        let (av, bv) = (buf::<T>(a)?, buf::<T>(b)?);
        let bias: Option<&[T]> = bias.map(buf::<T>).transpose()?;
        let keep = self.keep_pre;
        let act = self.act;
        // The activations, when the sum before them is an output too.
        let mut h: Vec<T> = Vec::with_capacity(if keep { m * n } else { 0 });
        let h_addr = h.as_mut_ptr() as usize;
        let after = |r0: usize, z: &mut [T]| {
            if let Some(bs) = bias {
                for row in z.chunks_mut(n) {
                    for (x, bv) in row.iter_mut().zip(bs) {
                        *x = x.add(*bv);
                    }
                }
            }
            match act {
                Some(f) if keep => {
                    let hp = (h_addr as *mut T).wrapping_add(r0 * n);
                    for (i, x) in z.iter().enumerate() {
                        // SAFETY: `h` has room for m×n elements, and the
                        // panel starting at row r0 owns elements
                        // r0·n .. r0·n + z.len() of it alone.
                        unsafe { hp.add(i).write(f.apply(*x)) };
                    }
                }
                Some(f) => z.iter_mut().for_each(|x| *x = f.apply(*x)),
                None => {}
            }
        };
        let Some(z) = linalg::matmul_panels(m, k, n, av, la, bv, lb, &after) else {
            return Ok(None);
        };
        let z = Tensor::from_vec(z, &[m, n])?;
        if !keep {
            return Ok(Some(Value::Tensor(z)));
        }
        // SAFETY: every panel wrote its rows of `h`: all m×n elements.
        unsafe { h.set_len(m * n) };
        let h = Tensor::from_vec(h, &[m, n])?;
        Ok(Some(Value::tuple(vec![Value::Tensor(z), Value::Tensor(h)])))
    }
}

impl NativeKernel for EpilogueKernel {
    fn name(&self) -> &str {
        &self.name
    }

    fn call(&self, mut args: Vec<Value>) -> Result<Value, RtError> {
        if args.len() != self.arity() {
            return Err(RtError::internal(format!(
                "{}: expected {} inputs, got {}",
                self.name,
                self.arity(),
                args.len()
            )));
        }
        let bias = match if self.bias { args.pop() } else { None } {
            Some(Value::Tensor(b)) => Some(b),
            Some(_) => return Err(RtError::internal("epilogue: the bias is not a tensor")),
            None => None,
        };
        if let Some(v) = self.in_panels(&args, bias.as_ref())? {
            return Ok(v);
        }
        let Value::Tensor(p) = self.product.call(args)? else {
            return Err(RtError::internal("epilogue: the product is not a tensor"));
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
                        Some(f) => reference(f.name(), &[pre.clone()]),
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

    /// The dense layers of the MLP benchmark take the panel path.
    #[test]
    fn mlp_layers_are_computed_in_panels() {
        let a = vec![0.5f32; 128 * 784];
        let b = vec![0.25f32; 784 * 512];
        let rows = std::sync::Mutex::new(0);
        let after = |_: usize, z: &mut [f32]| *rows.lock().unwrap() += z.len() / 512;
        let p = linalg::matmul_panels(128, 784, 512, &a, Layout::Plain, &b, Layout::Plain, &after);
        assert!(p.is_some_and(|p| p.iter().all(|x| *x == 98.0)));
        assert_eq!(*rows.lock().unwrap(), 128);
    }

    /// A transposed operand read in place gives the same values.
    #[test]
    fn epilogue_with_a_transposed_operand() {
        let a = Value::Tensor(tensor(&[64, 96], 4, DType::F32));
        let bt = Value::Tensor(tensor(&[80, 96], 5, DType::F32));
        let bias = Value::Tensor(tensor(&[80], 6, DType::F32));
        let b = reference("mT", &[bt.clone()]);
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
