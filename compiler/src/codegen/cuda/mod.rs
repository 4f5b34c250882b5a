//! The CUDA back end: fused kernels as CUDA C compiled at run time by
//! NVRTC, matrix products by cuBLAS.
//!
//! - [`source`] writes the CUDA C of a [`KernelSpec`] (maps: a thread per
//!   element in grid-stride loops; reductions: a thread per output, or a
//!   block per output with a deterministic tree of warp shuffles);
//! - [`layout`] is its index arithmetic as pure, tested functions;
//! - [`CudaFusedKernel`] and [`CudaMatmulKernel`] are the VM's native
//!   kernels on a device ([`adjoint_runtime::cuda::CudaDevice`]);
//! - [`retarget`] turns a fusion plan made for the CPU into one for a
//!   device: every group's kernel is replaced, and plain matrix products
//!   become groups too (on the CPU they stay reference kernels).
//!
//! Kernels are compiled on their first call, for the device's
//! architecture, and cached (the runtime's PTX cache, in memory and on
//! disk).
//!
//! Run on hardware by `scripts/gpu-check.sh` (an H200, 2026-12-04: the
//! corpus agrees with the CPU, and so do random programs under
//! `adjoint-fuzz --cuda`). Slow for now: every kernel copies its results
//! back to host tensors and waits (see docs/benchmarks.md, GPU).

pub mod layout;
pub mod source;

#[cfg(test)]
mod tests;

use std::sync::{Arc, OnceLock};

use adjoint_runtime::cuda::{gemm, CudaDevice, CudaError, DeviceBuffer, KernelArg};
use adjoint_runtime::error::RtError;
use adjoint_runtime::tensor::{DType, Tensor};
use adjoint_runtime::value::Value;
use adjoint_runtime::vm::NativeKernel;

use crate::codegen::kernel::{KDType, KernelSpec};
use crate::fuse::form::KernelForm;
use crate::fuse::matmul::{MatmulKernel, View};
use crate::fuse::{Group, Plan};
use crate::ir::analysis::{free_variables, graph_body_with, reachable_graphs};
use crate::ir::{GraphId, Module};
use crate::prim::Prim;

pub use source::{generate, CudaKernel, Launch};

/// A fused kernel on a GPU. It checks its arguments as the CPU's
/// `FusedKernel` does, reads them from device memory (uploading the ones
/// not resident yet), and copies its results back into host tensors that
/// stay resident for the next kernel.
pub struct CudaFusedKernel {
    device: Arc<CudaDevice>,
    spec: KernelSpec,
    kernel: CudaKernel,
    name: String,
    /// The kernel's entry point, once compiled and loaded.
    function: OnceLock<adjoint_runtime::cuda::Function>,
}

impl CudaFusedKernel {
    pub fn new(device: Arc<CudaDevice>, spec: &KernelSpec, name: String) -> Self {
        CudaFusedKernel {
            device,
            kernel: generate(spec),
            spec: spec.canonical(),
            name,
            function: OnceLock::new(),
        }
    }

    /// The generated kernel.
    pub fn kernel(&self) -> &CudaKernel {
        &self.kernel
    }

    fn dtype(&self) -> DType {
        match self.spec.dtype {
            KDType::F32 => DType::F32,
            KDType::F64 => DType::F64,
        }
    }

    fn run(&self, args: Vec<Value>) -> Result<Value, CudaError> {
        let inputs = checked_inputs(&self.name, &self.spec, self.dtype(), args)?;
        let f = match self.function.get() {
            Some(f) => *f,
            None => {
                let f = self
                    .device
                    .function(&self.kernel.name, &self.kernel.source)?;
                *self.function.get_or_init(|| f)
            }
        };
        let dev_in: Vec<Arc<DeviceBuffer>> = inputs
            .iter()
            .map(|t| self.device.to_device(t))
            .collect::<Result<_, _>>()?;
        let out_shape = self.spec.output_shape();
        let n_out: usize = out_shape.iter().product();
        let outs: Vec<DeviceBuffer> = (0..self.spec.outputs.len())
            .map(|_| self.device.alloc(n_out, self.dtype()))
            .collect::<Result<_, _>>()?;
        let launch = &self.kernel.launch;
        if !launch.is_empty() {
            let mut args: Vec<KernelArg> = dev_in.iter().map(|b| KernelArg::Ptr(b.ptr())).collect();
            args.extend(outs.iter().map(|b| KernelArg::Ptr(b.ptr())));
            args.extend(launch.sizes().into_iter().map(KernelArg::I64));
            let max_blocks = self.device.info().multiprocessors.max(1) as usize * 32;
            self.device
                .launch(f, launch.grid(max_blocks), layout::BLOCK, &args)?;
        }
        let tensors: Vec<Tensor> = outs
            .into_iter()
            .map(|b| self.device.to_host(b, &out_shape))
            .collect::<Result<_, _>>()?;
        Ok(if tensors.len() == 1 {
            Value::Tensor(tensors.into_iter().next().expect("one output"))
        } else {
            Value::tuple(tensors.into_iter().map(Value::Tensor).collect())
        })
    }
}

/// The kernel's tensor arguments, checked against the spec's input lengths
/// and converted to its dtype.
fn checked_inputs(
    name: &str,
    spec: &KernelSpec,
    dtype: DType,
    args: Vec<Value>,
) -> Result<Vec<Tensor>, CudaError> {
    if args.len() != spec.inputs.len() {
        return Err(CudaError::new(format!(
            "{name}: expected {} inputs, got {}",
            spec.inputs.len(),
            args.len()
        )));
    }
    args.into_iter()
        .enumerate()
        .map(|(i, a)| {
            let Value::Tensor(t) = a else {
                return Err(CudaError::new(format!(
                    "{name}: expected a tensor, got {}",
                    a.kind()
                )));
            };
            if t.len() < spec.input_len(i) {
                return Err(CudaError::new(format!(
                    "{name}: input {i} has {} elements, the kernel reads {}",
                    t.len(),
                    spec.input_len(i)
                )));
            }
            Ok(if t.dtype() == dtype { t } else { t.cast(dtype) })
        })
        .collect()
}

impl NativeKernel for CudaFusedKernel {
    fn name(&self) -> &str {
        &self.name
    }

    fn call(&self, args: Vec<Value>) -> Result<Value, RtError> {
        self.run(args).map_err(RtError::from)
    }
}

/// A matrix product on a GPU by cuBLAS: operands that are a swap of the
/// last two axes are read in place (`CUBLAS_OP_T`). Cases cuBLAS is not
/// given (vectors, integer or mixed dtypes, batch broadcasting of size-1
/// dimensions) and every error go to the CPU kernel, so results and
/// messages are eager mode's.
pub struct CudaMatmulKernel {
    device: Arc<CudaDevice>,
    cpu: MatmulKernel,
    a: View,
    b: View,
    name: String,
}

impl CudaMatmulKernel {
    pub fn new(device: Arc<CudaDevice>, a: View, b: View) -> Self {
        let cpu = MatmulKernel::new(a, b);
        let name = format!("cuda:{}", NativeKernel::name(&cpu));
        CudaMatmulKernel {
            device,
            cpu,
            a,
            b,
            name,
        }
    }

    /// The product on the device, or `None` for the CPU to do it.
    fn on_device(&self, args: &[Value]) -> Option<Result<Tensor, CudaError>> {
        let na = self.a.arity();
        if args.len() != na + self.b.arity() {
            return None;
        }
        let (a, ta) = MatmulKernel::operand(self.a, &args[..na])?;
        let (b, tb) = MatmulKernel::operand(self.b, &args[na..])?;
        let dtype = a.dtype();
        if !matches!(dtype, DType::F32 | DType::F64) || b.dtype() != dtype {
            return None;
        }
        let (plan, out_shape) = gemm::plan_gemm(a.shape(), ta, b.shape(), tb)?;
        Some((|| {
            let da = self.device.to_device(&a)?;
            let db = self.device.to_device(&b)?;
            let n: usize = out_shape.iter().product();
            let c = self.device.alloc(n, dtype)?;
            if plan.k == 0 {
                // An empty inner dimension: the product is zeros.
                return Tensor::zeros(dtype, &out_shape).map_err(|e| CudaError::new(e.message));
            }
            // cuBLAS's first operand is the row-major B.
            self.device.gemm(&plan, dtype, &db, &da, &c)?;
            self.device.to_host(c, &out_shape)
        })())
    }
}

impl NativeKernel for CudaMatmulKernel {
    fn name(&self) -> &str {
        &self.name
    }

    fn call(&self, args: Vec<Value>) -> Result<Value, RtError> {
        match self.on_device(&args) {
            Some(r) => r.map(Value::Tensor).map_err(RtError::from),
            None => self.cpu.call(args),
        }
    }
}

/// Makes a CPU fusion plan run on `device`: fused groups get CUDA kernels,
/// products of transposes cuBLAS, and every other `matmul` in the graphs
/// reachable from `roots` becomes a cuBLAS group too.
pub fn retarget(m: &Module, roots: &[GraphId], plan: &mut Plan, device: &Arc<CudaDevice>) {
    for g in plan.groups.iter_mut() {
        match &g.form {
            // Groups over small tensors (fused for the CPU because they
            // save calls in loops) would cost a round trip to the device
            // each: they stay on the CPU.
            KernelForm::Fused(spec)
                if spec.shape.iter().product::<usize>() < crate::fuse::MIN_ELEMENTS => {}
            // The CUDA generator has no side outputs yet: a reduction that
            // also writes values unreduced stays on the CPU.
            KernelForm::Fused(spec) if spec.has_side_outputs() => {}
            KernelForm::Fused(spec) => {
                let name = format!("cuda:{}", g.kernel.name());
                g.kernel = Arc::new(CudaFusedKernel::new(device.clone(), spec, name));
            }
            KernelForm::Matmul(a, b) => {
                g.kernel = Arc::new(CudaMatmulKernel::new(device.clone(), *a, *b));
            }
            // No CUDA epilogue kernel yet: the product with its bias and
            // activation stays on the CPU (correct, but a round trip).
            KernelForm::Epilogue | KernelForm::Scalar(_) => {}
        }
    }
    let fv = free_variables(m);
    for g in reachable_graphs(m, roots) {
        for n in graph_body_with(m, g, &fv) {
            if m.applied_prim(n) != Some(Prim::Matmul) || plan.member_of.contains_key(&n) {
                continue;
            }
            let ins = &m.inputs(n)[1..];
            if ins.len() != 2 {
                continue;
            }
            let kernel = CudaMatmulKernel::new(device.clone(), View::Plain, View::Plain);
            let description = format!("{}: 2 inputs, 1 outputs", kernel.name);
            plan.member_of.insert(n, plan.groups.len());
            plan.groups.push(Group {
                graph: g,
                graph_name: m.graph(g).name.clone(),
                members: vec![n],
                inputs: ins.to_vec(),
                outputs: vec![n],
                recomputed: vec![],
                kernel: Arc::new(kernel),
                description,
                form: KernelForm::Matmul(View::Plain, View::Plain),
                then: None,
                sites: Vec::new(),
            });
        }
    }
}

/// The CUDA source of every fused kernel of a plan: `(group description,
/// kernel)`, for `adjoint emit --stage cuda` and the NVRTC tests. A
/// reduction with side outputs has none (it runs on the CPU).
pub fn plan_sources(plan: &Plan) -> Vec<(String, CudaKernel)> {
    plan.groups
        .iter()
        .filter_map(|g| match &g.form {
            KernelForm::Fused(spec) if !spec.has_side_outputs() => {
                Some((g.description.clone(), generate(spec)))
            }
            KernelForm::Fused(_) => None,
            KernelForm::Matmul(..) | KernelForm::Epilogue | KernelForm::Scalar(_) => None,
        })
        .collect()
}
