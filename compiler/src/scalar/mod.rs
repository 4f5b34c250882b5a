//! The scalar compiler: loops and recursion over scalars, as native
//! functions. This module holds the programs and their reference
//! interpreter; [`ad`] reverses them, [`native`] compiles them.
//!
//! A [`ScalarProgram`] is a set of first-order functions whose values are
//! 0-d numbers and bools. Fusion (`fuse::regions`) builds one from a family
//! of graphs that inference types as scalars throughout (a loop's header,
//! body and exit, the `if`s in them, the graphs they call); [`native`]
//! compiles it with Cranelift, every function a native function and every
//! tail call a native tail call, so a loop of 10^6 iterations runs as a
//! machine loop in constant stack with no allocation.
//!
//! The semantics are those of the runtime's reference kernels on 0-d
//! tensors: integer arithmetic wraps, float comparisons follow IEEE (`ne`
//! is true for NaN), transcendental functions are the runtime's own
//! scalar functions. Operations that can fail at run time (integer
//! division, integer powers) are not part of the language of this module;
//! code using them stays with the VM.

pub mod ad;
pub mod native;

use std::fmt;

use adjoint_runtime::kernels::num::{Float, Num};
use adjoint_runtime::math::MathFn;

use crate::prim::Prim;
use adjoint_runtime::tensor::DType;

/// The type of a scalar value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SType {
    F32,
    F64,
    I64,
    Bool,
}

impl SType {
    /// The scalar type of a runtime dtype, if supported.
    pub fn of(d: DType) -> Option<SType> {
        Some(match d {
            DType::F32 => SType::F32,
            DType::F64 => SType::F64,
            DType::I64 => SType::I64,
            DType::Bool => SType::Bool,
            _ => return None,
        })
    }

    pub fn dtype(self) -> DType {
        match self {
            SType::F32 => DType::F32,
            SType::F64 => DType::F64,
            SType::I64 => DType::I64,
            SType::Bool => DType::Bool,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, SType::F32 | SType::F64)
    }
}

impl fmt::Display for SType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.dtype(), f)
    }
}

/// A scalar value, for constants and the reference interpreter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    F32(f32),
    F64(f64),
    I64(i64),
    Bool(bool),
}

impl Scalar {
    pub fn as_f32(self) -> Option<f32> {
        match self {
            Scalar::F32(x) => Some(x),
            _ => None,
        }
    }

    pub fn as_f64(self) -> Option<f64> {
        match self {
            Scalar::F64(x) => Some(x),
            _ => None,
        }
    }

    pub fn as_i64(self) -> Option<i64> {
        match self {
            Scalar::I64(x) => Some(x),
            _ => None,
        }
    }

    pub fn as_bool(self) -> Option<bool> {
        match self {
            Scalar::Bool(x) => Some(x),
            _ => None,
        }
    }

    pub fn ty(self) -> SType {
        match self {
            Scalar::F32(_) => SType::F32,
            Scalar::F64(_) => SType::F64,
            Scalar::I64(_) => SType::I64,
            Scalar::Bool(_) => SType::Bool,
        }
    }

    /// The value converted to `to` as the runtime's `cast` does (through
    /// f64 to a float, Rust `as`, bools as 0 and 1, non-zero to `true`).
    pub fn cast(self, to: SType) -> Scalar {
        let f = match self {
            Scalar::F32(x) => x as f64,
            Scalar::F64(x) => x,
            Scalar::I64(i) => {
                return match to {
                    SType::F32 => Scalar::F32(i as f64 as f32),
                    SType::F64 => Scalar::F64(i as f64),
                    SType::I64 => Scalar::I64(i),
                    SType::Bool => Scalar::Bool(i != 0),
                }
            }
            Scalar::Bool(b) => {
                return match to {
                    SType::F32 => Scalar::F32(b as u8 as f32),
                    SType::F64 => Scalar::F64(b as u8 as f64),
                    SType::I64 => Scalar::I64(b as i64),
                    SType::Bool => Scalar::Bool(b),
                }
            }
        };
        match (self, to) {
            (Scalar::F32(x), SType::F32) => Scalar::F32(x),
            (_, SType::F32) => Scalar::F32(f as f32),
            (_, SType::F64) => Scalar::F64(f),
            (Scalar::F32(x), SType::I64) => Scalar::I64(x as i64),
            (_, SType::I64) => Scalar::I64(f as i64),
            (_, SType::Bool) => Scalar::Bool(f != 0.0),
        }
    }

    /// The value's bits, zero-extended to 64 (bools as 0 and 1).
    pub fn to_bits(self) -> u64 {
        match self {
            Scalar::F32(x) => x.to_bits() as u64,
            Scalar::F64(x) => x.to_bits(),
            Scalar::I64(i) => i as u64,
            Scalar::Bool(b) => b as u64,
        }
    }

    /// The value of type `ty` whose bits [`Scalar::to_bits`] gave.
    pub fn from_bits(ty: SType, bits: u64) -> Scalar {
        match ty {
            SType::F32 => Scalar::F32(f32::from_bits(bits as u32)),
            SType::F64 => Scalar::F64(f64::from_bits(bits)),
            SType::I64 => Scalar::I64(bits as i64),
            SType::Bool => Scalar::Bool(bits & 1 != 0),
        }
    }
}

/// Unary operations, by their primitive's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SUnary {
    Neg,
    Abs,
    Sign,
    Relu,
    Floor,
    Ceil,
    Exp,
    Log,
    Log1p,
    Tanh,
    Sigmoid,
    Sqrt,
    Rsqrt,
    Lgamma,
    Erf,
    Digamma,
    Trigamma,
    Not,
    /// A function of the math table (`adjoint_runtime::math`).
    Math(MathFn),
}

impl SUnary {
    const BUILT_IN: [SUnary; 18] = [
        SUnary::Neg,
        SUnary::Abs,
        SUnary::Sign,
        SUnary::Relu,
        SUnary::Floor,
        SUnary::Ceil,
        SUnary::Exp,
        SUnary::Log,
        SUnary::Log1p,
        SUnary::Tanh,
        SUnary::Sigmoid,
        SUnary::Sqrt,
        SUnary::Rsqrt,
        SUnary::Lgamma,
        SUnary::Erf,
        SUnary::Digamma,
        SUnary::Trigamma,
        SUnary::Not,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SUnary::Neg => "neg",
            SUnary::Abs => "abs",
            SUnary::Sign => "sign",
            SUnary::Relu => "relu",
            SUnary::Floor => "floor",
            SUnary::Ceil => "ceil",
            SUnary::Exp => "exp",
            SUnary::Log => "log",
            SUnary::Log1p => "log1p",
            SUnary::Tanh => "tanh",
            SUnary::Sigmoid => "sigmoid",
            SUnary::Sqrt => "sqrt",
            SUnary::Rsqrt => "rsqrt",
            SUnary::Lgamma => "lgamma",
            SUnary::Erf => "erf",
            SUnary::Digamma => "digamma",
            SUnary::Trigamma => "trigamma",
            SUnary::Not => "not",
            SUnary::Math(f) => f.name(),
        }
    }

    /// Every operation: the built-in ones, then the math table's.
    pub fn all() -> &'static [SUnary] {
        static ALL: std::sync::OnceLock<Vec<SUnary>> = std::sync::OnceLock::new();
        ALL.get_or_init(|| {
            let math = MathFn::ALL.iter().map(|f| SUnary::Math(*f));
            SUnary::BUILT_IN.iter().copied().chain(math).collect()
        })
    }

    /// The operation computing primitive `p`, if it is one of these.
    pub fn of_prim(p: Prim) -> Option<SUnary> {
        SUnary::all().iter().copied().find(|op| op.prim() == p)
    }

    /// The primitive the operation computes (whose table row holds its
    /// derivative rule).
    pub fn prim(self) -> Prim {
        match self {
            SUnary::Neg => Prim::Neg,
            SUnary::Abs => Prim::Abs,
            SUnary::Sign => Prim::Sign,
            SUnary::Relu => Prim::Relu,
            SUnary::Floor => Prim::Floor,
            SUnary::Ceil => Prim::Ceil,
            SUnary::Exp => Prim::Exp,
            SUnary::Log => Prim::Log,
            SUnary::Log1p => Prim::Log1p,
            SUnary::Tanh => Prim::Tanh,
            SUnary::Sigmoid => Prim::Sigmoid,
            SUnary::Sqrt => Prim::Sqrt,
            SUnary::Rsqrt => Prim::Rsqrt,
            SUnary::Lgamma => Prim::Lgamma,
            SUnary::Erf => Prim::Erf,
            SUnary::Digamma => Prim::Digamma,
            SUnary::Trigamma => Prim::Trigamma,
            SUnary::Not => Prim::Not,
            SUnary::Math(f) => Prim::Math(f),
        }
    }

    /// The operation on one value of its type (the reference semantics).
    pub fn eval(self, x: Scalar) -> Scalar {
        macro_rules! num {
            ($x:expr, $f:ident) => {
                match $x {
                    Scalar::F32(v) => Scalar::F32(Num::$f(v)),
                    Scalar::F64(v) => Scalar::F64(Num::$f(v)),
                    Scalar::I64(v) => Scalar::I64(Num::$f(v)),
                    Scalar::Bool(_) => unreachable!("numeric op on bool"),
                }
            };
        }
        macro_rules! float {
            ($x:expr, $f:ident) => {
                match $x {
                    Scalar::F32(v) => Scalar::F32(Float::$f(v)),
                    Scalar::F64(v) => Scalar::F64(Float::$f(v)),
                    _ => unreachable!("float op on an int"),
                }
            };
        }
        match self {
            SUnary::Neg => num!(x, neg),
            SUnary::Abs => num!(x, abs),
            SUnary::Sign => num!(x, sign),
            SUnary::Relu => num!(x, relu),
            SUnary::Floor => num!(x, floor),
            SUnary::Ceil => num!(x, ceil),
            SUnary::Exp => float!(x, exp),
            SUnary::Log => float!(x, ln),
            SUnary::Log1p => float!(x, ln_1p),
            SUnary::Tanh => float!(x, tanh),
            SUnary::Sigmoid => float!(x, sigmoid),
            SUnary::Sqrt => float!(x, sqrt),
            SUnary::Rsqrt => float!(x, rsqrt),
            SUnary::Lgamma => float!(x, lgamma),
            SUnary::Erf => float!(x, erf),
            SUnary::Digamma => float!(x, digamma),
            SUnary::Trigamma => float!(x, trigamma),
            SUnary::Math(f) => match x {
                Scalar::F32(v) => Scalar::F32(f.eval_f32(v)),
                Scalar::F64(v) => Scalar::F64(f.eval_f64(v)),
                _ => unreachable!("float op on an int"),
            },
            SUnary::Not => match x {
                Scalar::Bool(b) => Scalar::Bool(!b),
                _ => unreachable!("not of a number"),
            },
        }
    }
}

crate::prim::op_enum! {
    /// Binary operations, each the scalar form of a primitive.
    SBinary {
        Add,
        Sub,
        Mul,
        /// Division; on ints, a zero divisor is a fault the program reports.
        Div,
        /// Powers; on ints, a negative exponent is a fault.
        Pow,
        /// Remainder with the dividend's sign; on ints, as `Div`.
        Rem,
        Maximum,
        Minimum,
        Eq,
        Ne,
        Lt,
        Le,
        Gt,
        Ge,
        And,
        Or,
    }
}

impl SBinary {
    /// Whether the result is a bool whatever the operands.
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            SBinary::Eq | SBinary::Ne | SBinary::Lt | SBinary::Le | SBinary::Gt | SBinary::Ge
        )
    }

    /// Whether operands of type `t` are allowed.
    pub fn accepts(self, t: SType) -> bool {
        match self {
            // Integer division by zero and integer powers with negative
            // exponents are faults the program reports.
            SBinary::Div | SBinary::Rem | SBinary::Pow => t != SType::Bool,
            SBinary::Add | SBinary::Sub | SBinary::Mul | SBinary::Maximum | SBinary::Minimum => {
                t != SType::Bool
            }
            SBinary::And | SBinary::Or => t == SType::Bool,
            _ => true,
        }
    }

    /// The operation on two values of one type (the reference semantics).
    pub fn eval(self, a: Scalar, b: Scalar) -> Scalar {
        use std::cmp::Ordering;
        if self.is_comparison() {
            let ord = match (a, b) {
                (Scalar::F32(x), Scalar::F32(y)) => x.partial_cmp(&y),
                (Scalar::F64(x), Scalar::F64(y)) => x.partial_cmp(&y),
                (Scalar::I64(x), Scalar::I64(y)) => x.partial_cmp(&y),
                (Scalar::Bool(x), Scalar::Bool(y)) => x.partial_cmp(&y),
                _ => unreachable!("comparison of mixed types"),
            };
            let r = match self {
                SBinary::Eq => ord == Some(Ordering::Equal),
                SBinary::Ne => ord != Some(Ordering::Equal),
                SBinary::Lt => ord == Some(Ordering::Less),
                SBinary::Le => matches!(ord, Some(Ordering::Less | Ordering::Equal)),
                SBinary::Gt => ord == Some(Ordering::Greater),
                _ => matches!(ord, Some(Ordering::Greater | Ordering::Equal)),
            };
            return Scalar::Bool(r);
        }
        macro_rules! num {
            ($f:ident) => {
                match (a, b) {
                    (Scalar::F32(x), Scalar::F32(y)) => Scalar::F32(Num::$f(x, y)),
                    (Scalar::F64(x), Scalar::F64(y)) => Scalar::F64(Num::$f(x, y)),
                    (Scalar::I64(x), Scalar::I64(y)) => Scalar::I64(Num::$f(x, y)),
                    _ => unreachable!("arithmetic on mixed types"),
                }
            };
        }
        match self {
            SBinary::Add => num!(add),
            SBinary::Sub => num!(sub),
            SBinary::Mul => num!(mul),
            SBinary::Div => num!(div),
            SBinary::Pow => num!(pow),
            SBinary::Rem => num!(rem),
            SBinary::Maximum => num!(maximum),
            SBinary::Minimum => num!(minimum),
            SBinary::And | SBinary::Or => match (a, b) {
                (Scalar::Bool(x), Scalar::Bool(y)) => {
                    Scalar::Bool(if self == SBinary::And { x && y } else { x || y })
                }
                _ => unreachable!("logical op on numbers"),
            },
            _ => unreachable!("comparisons are handled above"),
        }
    }
}

/// A value of a function: parameters are `0..params.len()`, then one per
/// result of each instruction, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SVal(pub u32);

/// The index of a function in [`ScalarProgram::funcs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FuncIdx(pub u32);

/// A call: the function and its arguments (of its parameter types).
#[derive(Clone, Debug, PartialEq)]
pub struct SCall {
    pub func: FuncIdx,
    pub args: Vec<SVal>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum SOp {
    Const(Scalar),
    /// The operand and result have the same type.
    Unary(SUnary, SVal),
    /// Operands of one type; the result has it too, except comparisons
    /// (bool).
    Binary(SBinary, SVal, SVal),
    /// The runtime's `cast` to the result's type.
    Cast(SVal),
    /// `if c { a } else { b }`, both evaluated.
    Select(SVal, SVal, SVal),
    /// The callee's results.
    Call(SCall),
    /// One of two calls of functions with the same result types.
    CallIf(SVal, SCall, SCall),
    /// Appends the values to the program's tape, 8 bytes each (reverse
    /// mode's record of a forward pass, [`crate::scalar::ad`]);
    /// no results.
    Push(Vec<SVal>),
    /// Removes the last `results.len()` values from the tape and gives
    /// them, with the result types, in the order they were pushed.
    Pop,
    /// An i64 index into axis `axis` of size `size`, counted from the
    /// end when negative, as an offset in `0..size`; any other index is
    /// a fault the program reports (a tensor indexed at a run-time
    /// position, [`crate::fuse::regions`]).
    Bound {
        index: SVal,
        size: u32,
        axis: u32,
    },
    /// Element `offset` (an i64 in `0..len`, which the program checks
    /// before, with [`SOp::Bound`]) of the program's buffer `buf`
    /// ([`ScalarProgram::buffers`]), of the buffer's element type: a
    /// large tensor the loop reads in place.
    Load {
        buf: u32,
        offset: SVal,
    },
}

impl SOp {
    /// Calls `f` on every value the operation reads.
    pub fn each_val(&self, f: &mut impl FnMut(SVal)) {
        let call = |c: &SCall, f: &mut dyn FnMut(SVal)| c.args.iter().for_each(|v| f(*v));
        match self {
            SOp::Const(_) | SOp::Pop => {}
            SOp::Unary(_, x)
            | SOp::Cast(x)
            | SOp::Bound { index: x, .. }
            | SOp::Load { offset: x, .. } => f(*x),
            SOp::Binary(_, x, y) => {
                f(*x);
                f(*y);
            }
            SOp::Select(c, a, b) => {
                f(*c);
                f(*a);
                f(*b);
            }
            SOp::Call(c) => call(c, f),
            SOp::CallIf(c, a, b) => {
                f(*c);
                call(a, f);
                call(b, f);
            }
            SOp::Push(xs) => xs.iter().for_each(|v| f(*v)),
        }
    }

    /// Renames every value the operation reads.
    pub fn rename(&mut self, f: &impl Fn(SVal) -> SVal) {
        let call = |c: &mut SCall| c.args.iter_mut().for_each(|v| *v = f(*v));
        match self {
            SOp::Const(_) | SOp::Pop => {}
            SOp::Unary(_, x)
            | SOp::Cast(x)
            | SOp::Bound { index: x, .. }
            | SOp::Load { offset: x, .. } => *x = f(*x),
            SOp::Binary(_, x, y) => {
                *x = f(*x);
                *y = f(*y);
            }
            SOp::Select(c, a, b) => {
                *c = f(*c);
                *a = f(*a);
                *b = f(*b);
            }
            SOp::Call(c) => call(c),
            SOp::CallIf(c, a, b) => {
                *c = f(*c);
                call(a);
                call(b);
            }
            SOp::Push(xs) => xs.iter_mut().for_each(|v| *v = f(*v)),
        }
    }
}

impl STerm {
    /// Calls `f` on every value the end reads.
    pub fn each_val(&self, f: &mut impl FnMut(SVal)) {
        match self {
            STerm::Return(vs) => vs.iter().for_each(|v| f(*v)),
            STerm::TailCall(c) => c.args.iter().for_each(|v| f(*v)),
            STerm::TailCallIf(c, a, b) => {
                f(*c);
                a.args.iter().chain(&b.args).for_each(|v| f(*v));
            }
        }
    }

    /// Renames every value the end reads.
    pub fn rename(&mut self, f: &impl Fn(SVal) -> SVal) {
        let call = |c: &mut SCall| c.args.iter_mut().for_each(|v| *v = f(*v));
        match self {
            STerm::Return(vs) => vs.iter_mut().for_each(|v| *v = f(*v)),
            STerm::TailCall(c) => call(c),
            STerm::TailCallIf(c, a, b) => {
                *c = f(*c);
                call(a);
                call(b);
            }
        }
    }
}

/// An instruction and the types of its results (one, except calls).
#[derive(Clone, Debug, PartialEq)]
pub struct SInst {
    pub op: SOp,
    pub results: Vec<SType>,
    /// Where the instruction comes from, in terms its producer defines
    /// (fusion: the index of the IR node it computes). A fault the
    /// instruction raises reports it, so errors point at the operation
    /// rather than at the loop that contains it.
    pub site: Option<u32>,
}

impl SInst {
    /// An instruction with no site.
    pub fn new(op: SOp, results: Vec<SType>) -> SInst {
        SInst {
            op,
            results,
            site: None,
        }
    }

    /// Whether it divides or raises integers (`tys`: the types of the
    /// function's values) or checks an index, which may stop the program
    /// with a fault.
    fn may_fault(&self, tys: &[SType]) -> bool {
        matches!(self.op, SOp::Bound { .. })
            || matches!(self.op, SOp::Binary(SBinary::Div | SBinary::Rem | SBinary::Pow, a, _)
            if tys[a.0 as usize] == SType::I64)
    }
}

/// How a function ends.
#[derive(Clone, Debug, PartialEq)]
pub enum STerm {
    Return(Vec<SVal>),
    /// A tail call: the caller's frame is reused (loops).
    TailCall(SCall),
    TailCallIf(SVal, SCall, SCall),
}

#[derive(Clone, Debug, PartialEq)]
pub struct SFunc {
    pub name: String,
    pub params: Vec<SType>,
    pub results: Vec<SType>,
    pub body: Vec<SInst>,
    pub term: STerm,
}

impl SFunc {
    /// The type of every value, parameters first.
    pub fn value_types(&self) -> Vec<SType> {
        let mut tys = self.params.clone();
        for inst in &self.body {
            tys.extend_from_slice(&inst.results);
        }
        tys
    }
}

/// A tensor a program reads in place ([`SOp::Load`]): its element type
/// and number of elements. The caller passes one of each, in order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SBuffer {
    pub ty: SType,
    pub len: usize,
}

/// Functions, the first of which is the entry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScalarProgram {
    pub funcs: Vec<SFunc>,
    /// The tensors its loads read.
    pub buffers: Vec<SBuffer>,
}

impl ScalarProgram {
    pub fn entry(&self) -> &SFunc {
        &self.funcs[0]
    }

    /// The same program with each tail call of a small function other than
    /// the caller replaced by a copy of that function's body and end (one
    /// level). A loop's header tail-called from its body becomes part of
    /// the body, whose back edge is then a tail call of itself, which code
    /// generation makes a jump.
    pub fn inline_tail_calls(&self, max_body: usize) -> ScalarProgram {
        let mut out = self.clone();
        for (k, f) in out.funcs.iter_mut().enumerate() {
            let STerm::TailCall(c) = &f.term else {
                continue;
            };
            let callee = &self.funcs[c.func.0 as usize];
            if c.func.0 as usize == k || callee.body.len() > max_body {
                continue;
            }
            let mut map: Vec<SVal> = c.args.clone();
            let mut next =
                (f.params.len() + f.body.iter().map(|i| i.results.len()).sum::<usize>()) as u32;
            for inst in &callee.body {
                let mut op = inst.op.clone();
                op.rename(&|v| map[v.0 as usize]);
                f.body.push(SInst {
                    op,
                    results: inst.results.clone(),
                    site: inst.site,
                });
                for _ in &inst.results {
                    map.push(SVal(next));
                    next += 1;
                }
            }
            let mut term = callee.term.clone();
            term.rename(&|v| map[v.0 as usize]);
            f.term = term;
        }
        out
    }

    /// Whether the program divides or raises integers: a division by zero
    /// or a negative exponent stops it with a fault
    /// ([`ScalarProgram::eval`] gives `None`).
    pub fn may_fault(&self) -> bool {
        self.funcs.iter().any(|f| {
            let tys = f.value_types();
            f.body.iter().any(|i| i.may_fault(&tys))
        })
    }

    /// The sites of the instructions that may fault, each once, in order.
    pub fn fault_sites(&self) -> Vec<u32> {
        let mut sites = std::collections::BTreeSet::new();
        for f in &self.funcs {
            let tys = f.value_types();
            sites.extend(
                f.body
                    .iter()
                    .filter(|i| i.may_fault(&tys))
                    .filter_map(|i| i.site),
            );
        }
        sites.into_iter().collect()
    }

    /// Whether some function pushes to or pops from the tape.
    pub fn uses_tape(&self) -> bool {
        self.funcs.iter().any(|f| {
            f.body
                .iter()
                .any(|i| matches!(i.op, SOp::Push(_) | SOp::Pop))
        })
    }

    /// Checks that every value is defined before it is used and has the
    /// type its use needs, and that calls match their callees. Codegen
    /// relies on it.
    pub fn validate(&self) -> Result<(), String> {
        if self.funcs.is_empty() {
            return Err("a scalar program needs a function".into());
        }
        for f in &self.funcs {
            let tys = f.value_types();
            let mut defined = f.params.len();
            let ty = |v: SVal, defined: usize| -> Result<SType, String> {
                if (v.0 as usize) < defined {
                    Ok(tys[v.0 as usize])
                } else {
                    Err(format!(
                        "{}: value {} used before it is defined",
                        f.name, v.0
                    ))
                }
            };
            let call = |c: &SCall, defined: usize| -> Result<&[SType], String> {
                let callee = self
                    .funcs
                    .get(c.func.0 as usize)
                    .ok_or_else(|| format!("{}: no function {}", f.name, c.func.0))?;
                if callee.params.len() != c.args.len() {
                    return Err(format!(
                        "{}: call of {} with wrong arity",
                        f.name, callee.name
                    ));
                }
                for (a, p) in c.args.iter().zip(&callee.params) {
                    if ty(*a, defined)? != *p {
                        return Err(format!(
                            "{}: argument type mismatch in call of {}",
                            f.name, callee.name
                        ));
                    }
                }
                Ok(&callee.results)
            };
            for inst in &f.body {
                let bad = || format!("{}: ill-typed {:?}", f.name, inst.op);
                let one = |t: SType| inst.results == [t];
                let ok = match &inst.op {
                    SOp::Const(c) => one(c.ty()),
                    SOp::Unary(op, x) => {
                        let t = ty(*x, defined)?;
                        one(t)
                            && match op {
                                SUnary::Not => t == SType::Bool,
                                SUnary::Neg
                                | SUnary::Abs
                                | SUnary::Sign
                                | SUnary::Relu
                                | SUnary::Floor
                                | SUnary::Ceil => t != SType::Bool,
                                _ => t.is_float(),
                            }
                    }
                    SOp::Binary(op, a, b) => {
                        let (ta, tb) = (ty(*a, defined)?, ty(*b, defined)?);
                        ta == tb
                            && op.accepts(ta)
                            && one(if op.is_comparison() { SType::Bool } else { ta })
                    }
                    SOp::Cast(x) => {
                        ty(*x, defined)?;
                        inst.results.len() == 1
                    }
                    SOp::Select(c, a, b) => {
                        let (tc, ta, tb) = (ty(*c, defined)?, ty(*a, defined)?, ty(*b, defined)?);
                        tc == SType::Bool && ta == tb && one(ta)
                    }
                    SOp::Call(c) => call(c, defined)? == inst.results.as_slice(),
                    SOp::CallIf(cond, a, b) => {
                        ty(*cond, defined)? == SType::Bool
                            && call(a, defined)? == inst.results.as_slice()
                            && call(b, defined)? == inst.results.as_slice()
                    }
                    SOp::Push(vs) => {
                        for v in vs {
                            ty(*v, defined)?;
                        }
                        inst.results.is_empty()
                    }
                    SOp::Pop => !inst.results.is_empty(),
                    SOp::Bound { index, size, .. } => {
                        ty(*index, defined)? == SType::I64 && *size > 0 && one(SType::I64)
                    }
                    SOp::Load { buf, offset } => {
                        ty(*offset, defined)? == SType::I64
                            && self
                                .buffers
                                .get(*buf as usize)
                                .is_some_and(|b| b.ty != SType::Bool && one(b.ty))
                    }
                };
                if !ok {
                    return Err(bad());
                }
                defined += inst.results.len();
            }
            let ok = match &f.term {
                STerm::Return(vs) => {
                    let got: Result<Vec<SType>, String> =
                        vs.iter().map(|v| ty(*v, defined)).collect();
                    got? == f.results
                }
                STerm::TailCall(c) => call(c, defined)? == f.results.as_slice(),
                STerm::TailCallIf(cond, a, b) => {
                    ty(*cond, defined)? == SType::Bool
                        && call(a, defined)? == f.results.as_slice()
                        && call(b, defined)? == f.results.as_slice()
                }
            };
            if !ok {
                return Err(format!("{}: the end does not give the results", f.name));
            }
        }
        Ok(())
    }

    /// Runs the program on `args` (the reference semantics, for tests),
    /// with at most `fuel` calls.
    pub fn eval(&self, args: &[Scalar], fuel: usize) -> Option<Vec<Scalar>> {
        self.eval_with_tape(args, &mut Vec::new(), fuel)
    }

    /// [`ScalarProgram::eval`] with the tape `tape` (`None` also when a
    /// pop finds too few values, an integer is divided by zero or raised
    /// to a negative power).
    pub fn eval_with_tape(
        &self,
        args: &[Scalar],
        tape: &mut Vec<u64>,
        fuel: usize,
    ) -> Option<Vec<Scalar>> {
        self.eval_with_buffers(args, &[], tape, fuel)
    }

    /// [`ScalarProgram::eval_with_tape`] reading `buffers`, one per
    /// [`ScalarProgram::buffers`] (`None` if one is missing or a load
    /// falls outside its buffer).
    pub fn eval_with_buffers(
        &self,
        args: &[Scalar],
        buffers: &[Vec<Scalar>],
        tape: &mut Vec<u64>,
        fuel: usize,
    ) -> Option<Vec<Scalar>> {
        let mut fuel = fuel;
        self.run(FuncIdx(0), args.to_vec(), buffers, tape, &mut fuel)
    }

    fn run(
        &self,
        func: FuncIdx,
        args: Vec<Scalar>,
        buffers: &[Vec<Scalar>],
        tape: &mut Vec<u64>,
        fuel: &mut usize,
    ) -> Option<Vec<Scalar>> {
        let (mut func, mut args) = (func, args);
        loop {
            *fuel = fuel.checked_sub(1)?;
            let f = &self.funcs[func.0 as usize];
            let mut vals = args;
            for inst in &f.body {
                let v = |x: &SVal| vals[x.0 as usize];
                let out = match &inst.op {
                    SOp::Const(c) => vec![*c],
                    SOp::Unary(op, x) => vec![op.eval(v(x))],
                    SOp::Binary(SBinary::Div | SBinary::Rem, _, b) if v(b) == Scalar::I64(0) => {
                        return None
                    }
                    SOp::Binary(SBinary::Pow, _, b) if matches!(v(b), Scalar::I64(e) if e < 0) => {
                        return None
                    }
                    SOp::Binary(op, a, b) => vec![op.eval(v(a), v(b))],
                    SOp::Cast(x) => vec![v(x).cast(inst.results[0])],
                    SOp::Bound { index, size, axis } => {
                        let i = v(index).as_i64()?;
                        let j =
                            adjoint_runtime::shape::resolve_at(i, *axis as usize, *size as usize);
                        vec![Scalar::I64(j.ok()? as i64)]
                    }
                    SOp::Load { buf, offset } => {
                        let k = usize::try_from(v(offset).as_i64()?).ok()?;
                        vec![*buffers.get(*buf as usize)?.get(k)?]
                    }
                    SOp::Select(c, a, b) => {
                        vec![if v(c) == Scalar::Bool(true) {
                            v(a)
                        } else {
                            v(b)
                        }]
                    }
                    SOp::Call(c) => {
                        self.run(c.func, c.args.iter().map(v).collect(), buffers, tape, fuel)?
                    }
                    SOp::CallIf(c, a, b) => {
                        let pick = if v(c) == Scalar::Bool(true) { a } else { b };
                        self.run(
                            pick.func,
                            pick.args.iter().map(v).collect(),
                            buffers,
                            tape,
                            fuel,
                        )?
                    }
                    SOp::Push(vs) => {
                        tape.extend(vs.iter().map(|x| v(x).to_bits()));
                        Vec::new()
                    }
                    SOp::Pop => {
                        let start = tape.len().checked_sub(inst.results.len())?;
                        let out = tape[start..]
                            .iter()
                            .zip(&inst.results)
                            .map(|(b, t)| Scalar::from_bits(*t, *b))
                            .collect();
                        tape.truncate(start);
                        out
                    }
                };
                vals.extend(out);
            }
            let v = |x: &SVal| vals[x.0 as usize];
            let next = match &f.term {
                STerm::Return(vs) => return Some(vs.iter().map(v).collect()),
                STerm::TailCall(c) => c,
                STerm::TailCallIf(c, a, b) => {
                    if v(c) == Scalar::Bool(true) {
                        a
                    } else {
                        b
                    }
                }
            };
            args = next.args.iter().map(v).collect();
            func = next.func;
        }
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::F32(x) => write!(f, "{x:?}f32"),
            Scalar::F64(x) => write!(f, "{x:?}"),
            Scalar::I64(i) => write!(f, "{i}"),
            Scalar::Bool(b) => write!(f, "{b}"),
        }
    }
}

impl fmt::Display for ScalarProgram {
    /// One function per block: `fn f1(v0: f64, v1: i64) -> (f64)`, its
    /// instructions `v2: bool = lt v0 v1`, and how it ends.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let vals = |vs: &[SVal]| {
            vs.iter()
                .map(|v| format!("v{}", v.0))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let call = |c: &SCall| format!("f{}({})", c.func.0, vals(&c.args));
        for (i, func) in self.funcs.iter().enumerate() {
            let params: Vec<String> = func
                .params
                .iter()
                .enumerate()
                .map(|(k, t)| format!("v{k}: {t}"))
                .collect();
            let results: Vec<String> = func.results.iter().map(|t| t.to_string()).collect();
            writeln!(
                f,
                "fn f{i} {}({}) -> ({}) {{",
                func.name,
                params.join(", "),
                results.join(", ")
            )?;
            let mut next = func.params.len();
            for inst in &func.body {
                let dst: Vec<String> = inst
                    .results
                    .iter()
                    .enumerate()
                    .map(|(k, t)| format!("v{}: {t}", next + k))
                    .collect();
                next += inst.results.len();
                let rhs = match &inst.op {
                    SOp::Const(c) => c.to_string(),
                    SOp::Unary(op, x) => format!("{} v{}", op.name(), x.0),
                    SOp::Binary(op, x, y) => format!("{} v{} v{}", op.name(), x.0, y.0),
                    SOp::Cast(x) => format!("cast v{}", x.0),
                    SOp::Bound { index, size, axis } => {
                        format!("bound v{} size {size} axis {axis}", index.0)
                    }
                    SOp::Load { buf, offset } => format!("load b{buf}[v{}]", offset.0),
                    SOp::Select(c, x, y) => format!("select v{} v{} v{}", c.0, x.0, y.0),
                    SOp::Call(c) => format!("call {}", call(c)),
                    SOp::CallIf(c, x, y) => {
                        format!("if v{} call {} else call {}", c.0, call(x), call(y))
                    }
                    SOp::Push(vs) => format!("push {}", vals(vs)),
                    SOp::Pop => "pop".to_string(),
                };
                if dst.is_empty() {
                    writeln!(f, "  {rhs}")?;
                } else {
                    writeln!(f, "  {} = {rhs}", dst.join(", "))?;
                }
            }
            match &func.term {
                STerm::Return(vs) => writeln!(f, "  return {}", vals(vs))?,
                STerm::TailCall(c) => writeln!(f, "  tail call {}", call(c))?,
                STerm::TailCallIf(c, x, y) => writeln!(
                    f,
                    "  if v{} tail call {} else tail call {}",
                    c.0,
                    call(x),
                    call(y)
                )?,
            }
            writeln!(f, "}}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::scalar::native::compile_scalar;
    use proptest::prelude::*;

    fn inst(op: SOp, t: SType) -> SInst {
        SInst::new(op, vec![t])
    }

    /// `iterate(i, x, n)`: `x <- sin(x) * x + 0.5` while `i < n`, as a
    /// header that tail-calls a body or an exit; returns `(x, i)`.
    pub(crate) fn iterate() -> ScalarProgram {
        use SType::*;
        let call = |f, args: &[u32]| SCall {
            func: FuncIdx(f),
            args: args.iter().map(|a| SVal(*a)).collect(),
        };
        let header = SFunc {
            name: "header".into(),
            params: vec![I64, F64, I64],
            results: vec![F64, I64],
            body: vec![inst(SOp::Binary(SBinary::Lt, SVal(0), SVal(2)), Bool)],
            term: STerm::TailCallIf(SVal(3), call(1, &[0, 1, 2]), call(2, &[0, 1, 2])),
        };
        let body = SFunc {
            name: "body".into(),
            params: vec![I64, F64, I64],
            results: vec![F64, I64],
            body: vec![
                inst(SOp::Unary(SUnary::Math(MathFn::Sin), SVal(1)), F64),
                inst(SOp::Binary(SBinary::Mul, SVal(3), SVal(1)), F64),
                inst(SOp::Const(Scalar::F64(0.5)), F64),
                inst(SOp::Binary(SBinary::Add, SVal(4), SVal(5)), F64),
                inst(SOp::Const(Scalar::I64(1)), I64),
                inst(SOp::Binary(SBinary::Add, SVal(0), SVal(7)), I64),
            ],
            term: STerm::TailCall(call(0, &[8, 6, 2])),
        };
        let exit = SFunc {
            name: "exit".into(),
            params: vec![I64, F64, I64],
            results: vec![F64, I64],
            body: vec![],
            term: STerm::Return(vec![SVal(1), SVal(0)]),
        };
        ScalarProgram {
            funcs: vec![header, body, exit],
            buffers: Vec::new(),
        }
    }

    #[test]
    fn a_loop_runs_natively_as_the_interpreter_does() {
        let p = iterate();
        p.validate().unwrap();
        let native = compile_scalar(&p).unwrap();
        for n in [0i64, 1, 7, 1000] {
            let args = [Scalar::I64(0), Scalar::F64(0.3), Scalar::I64(n)];
            let want = p.eval(&args, 10_000).unwrap();
            assert_eq!(native.call(&args).unwrap(), want, "n = {n}");
        }
    }

    #[test]
    fn a_million_iterations_run_in_constant_stack() {
        let p = iterate();
        let native = compile_scalar(&p).unwrap();
        let r = native
            .call(&[Scalar::I64(0), Scalar::F64(0.3), Scalar::I64(1_000_000)])
            .unwrap();
        assert_eq!(r[1], Scalar::I64(1_000_000));
    }

    #[test]
    fn programs_print_one_function_per_block() {
        let text = iterate().to_string();
        assert!(
            text.starts_with(
                "fn f0 header(v0: i64, v1: f64, v2: i64) -> (f64, i64) {\n  v3: bool = lt v0 v2\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("  if v3 tail call f1(v0, v1, v2) else tail call f2(v0, v1, v2)\n"),
            "{text}"
        );
        assert!(text.contains("  v3: f64 = sin v1\n"), "{text}");
        assert!(text.contains("  v5: f64 = 0.5\n"), "{text}");
        assert!(text.contains("  return v1, v0\n}"), "{text}");
    }

    #[test]
    fn equal_programs_share_their_code() {
        use crate::scalar::native::compile_scalar_cached;
        let a = compile_scalar_cached(&iterate()).unwrap();
        let b = compile_scalar_cached(&iterate()).unwrap();
        assert!(std::sync::Arc::ptr_eq(&a, &b));
        let mut other = iterate();
        other.funcs[1].body[2].op = SOp::Const(Scalar::F64(0.25));
        let c = compile_scalar_cached(&other).unwrap();
        assert!(!std::sync::Arc::ptr_eq(&a, &c));
    }

    #[test]
    fn ill_typed_programs_are_refused() {
        let mut p = iterate();
        // The body's tail call passes the f64 where the i64 goes.
        p.funcs[1].term = STerm::TailCall(SCall {
            func: FuncIdx(0),
            args: vec![SVal(6), SVal(8), SVal(2)],
        });
        assert!(p.validate().is_err());
        assert!(compile_scalar(&p).is_err());
        let native = compile_scalar(&iterate()).unwrap();
        assert!(native.call(&[Scalar::F64(0.0)]).is_err());
    }

    /// A random straight-line function over one value of each type, run
    /// inside a counted loop; every operation the back end knows, with
    /// casts between the types.
    pub(crate) fn random_program(ops: &[(u8, u8, u8)], trips: i64) -> ScalarProgram {
        use SType::*;
        // Values 0..4 are the parameters (f64, f32, i64, bool) and 4 the
        // counter; each step makes a new value of one type from the
        // latest values of each type.
        let mut body = Vec::new();
        let mut latest = [SVal(0), SVal(1), SVal(2), SVal(3)];
        let tys = [F64, F32, I64, Bool];
        let mut next = 5u32;
        let mut push = |body: &mut Vec<SInst>, op: SOp, t: SType| {
            body.push(SInst::new(op, vec![t]));
            next += 1;
            SVal(next - 1)
        };
        for &(kind, a, b) in ops {
            let ti = (a % 4) as usize;
            let t = tys[ti];
            let x = latest[ti];
            let v = match kind % 5 {
                0 => {
                    let op = SUnary::all()[b as usize % SUnary::all().len()];
                    let ok = match op {
                        SUnary::Not => t == Bool,
                        SUnary::Neg
                        | SUnary::Abs
                        | SUnary::Sign
                        | SUnary::Relu
                        | SUnary::Floor
                        | SUnary::Ceil => t != Bool,
                        _ => t.is_float(),
                    };
                    if !ok {
                        continue;
                    }
                    push(&mut body, SOp::Unary(op, x), t)
                }
                1 => {
                    let op = SBinary::ALL[b as usize % SBinary::ALL.len()];
                    if !op.accepts(t) {
                        continue;
                    }
                    let y = latest[(ti + 1) % 4];
                    let y = if tys[(ti + 1) % 4] == t {
                        y
                    } else {
                        push(&mut body, SOp::Cast(y), t)
                    };
                    let r = if op.is_comparison() { Bool } else { t };
                    let v = push(&mut body, SOp::Binary(op, x, y), r);
                    latest[tys.iter().position(|u| *u == r).unwrap()] = v;
                    continue;
                }
                2 => {
                    let to = tys[b as usize % 4];
                    let v = push(&mut body, SOp::Cast(x), to);
                    latest[b as usize % 4] = v;
                    continue;
                }
                3 => {
                    let c = latest[3];
                    let y = latest[(ti + 2) % 4];
                    let y = if tys[(ti + 2) % 4] == t {
                        y
                    } else {
                        push(&mut body, SOp::Cast(y), t)
                    };
                    push(&mut body, SOp::Select(c, x, y), t)
                }
                _ => {
                    let c = match t {
                        F64 => Scalar::F64(b as f64 / 7.0 - 10.0),
                        F32 => Scalar::F32(b as f32 / 3.0),
                        I64 => Scalar::I64(b as i64 - 100),
                        Bool => Scalar::Bool(b % 2 == 0),
                    };
                    push(&mut body, SOp::Const(c), t)
                }
            };
            latest[ti] = v;
        }
        let one = push(&mut body, SOp::Const(Scalar::I64(1)), I64);
        let i1 = push(&mut body, SOp::Binary(SBinary::Add, SVal(4), one), I64);
        let n = push(&mut body, SOp::Const(Scalar::I64(trips)), I64);
        let go = push(&mut body, SOp::Binary(SBinary::Lt, i1, n), Bool);
        let mut args: Vec<SVal> = latest.to_vec();
        args.push(i1);
        let step = SFunc {
            name: "step".into(),
            params: vec![F64, F32, I64, Bool, I64],
            results: vec![F64, F32, I64, Bool],
            body,
            term: STerm::TailCallIf(
                go,
                SCall {
                    func: FuncIdx(0),
                    args: args.clone(),
                },
                SCall {
                    func: FuncIdx(1),
                    args,
                },
            ),
        };
        let done = SFunc {
            name: "done".into(),
            params: vec![F64, F32, I64, Bool, I64],
            results: vec![F64, F32, I64, Bool],
            body: vec![],
            term: STerm::Return(vec![SVal(0), SVal(1), SVal(2), SVal(3)]),
        };
        ScalarProgram {
            funcs: vec![step, done],
            buffers: Vec::new(),
        }
    }

    /// Equal values, NaNs equal to each other.
    pub(crate) fn same(a: &[Scalar], b: &[Scalar]) -> bool {
        a.iter().zip(b).all(|(x, y)| match (x, y) {
            (Scalar::F64(p), Scalar::F64(q)) => {
                p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan())
            }
            (Scalar::F32(p), Scalar::F32(q)) => {
                p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan())
            }
            _ => x == y,
        })
    }

    /// `sum(i)`: adds element `(3 i) % 7` of a 7-element f64 buffer for
    /// `i` in `0..n`, reading it with bound-checked loads.
    fn buffer_sum() -> ScalarProgram {
        use SType::*;
        // v0 i, v1 acc, v2 n
        let body = vec![
            inst(SOp::Binary(SBinary::Lt, SVal(0), SVal(2)), Bool), // v3
            inst(SOp::Const(Scalar::I64(3)), I64),                  // v4
            inst(SOp::Binary(SBinary::Mul, SVal(0), SVal(4)), I64), // v5
            inst(SOp::Const(Scalar::I64(7)), I64),                  // v6
            inst(SOp::Binary(SBinary::Rem, SVal(5), SVal(6)), I64), // v7
            inst(
                SOp::Bound {
                    index: SVal(7),
                    size: 7,
                    axis: 0,
                },
                I64,
            ), // v8
            inst(
                SOp::Load {
                    buf: 0,
                    offset: SVal(8),
                },
                F64,
            ), // v9
            inst(SOp::Binary(SBinary::Add, SVal(1), SVal(9)), F64), // v10
            inst(SOp::Const(Scalar::I64(1)), I64),                  // v11
            inst(SOp::Binary(SBinary::Add, SVal(0), SVal(11)), I64), // v12
        ];
        let step = SFunc {
            name: "step".into(),
            params: vec![I64, F64, I64],
            results: vec![F64],
            body,
            term: STerm::TailCallIf(
                SVal(3),
                SCall {
                    func: FuncIdx(0),
                    args: vec![SVal(12), SVal(10), SVal(2)],
                },
                SCall {
                    func: FuncIdx(1),
                    args: vec![SVal(1)],
                },
            ),
        };
        let done = SFunc {
            name: "done".into(),
            params: vec![F64],
            results: vec![F64],
            body: vec![],
            term: STerm::Return(vec![SVal(0)]),
        };
        ScalarProgram {
            funcs: vec![step, done],
            buffers: vec![SBuffer { ty: F64, len: 7 }],
        }
    }

    #[test]
    fn loads_read_the_buffers_the_caller_passes() {
        use crate::scalar::native::BufRef;
        let p = buffer_sum();
        p.validate().unwrap();
        let data: Vec<f64> = (0..7).map(|k| 1.5f64.powi(k)).collect();
        let native = compile_scalar(&p).unwrap();
        let args = [Scalar::I64(0), Scalar::F64(0.0), Scalar::I64(20)];
        let scalars: Vec<Scalar> = data.iter().map(|x| Scalar::F64(*x)).collect();
        let want = p
            .eval_with_buffers(&args, &[scalars], &mut Vec::new(), 1000)
            .unwrap();
        let got = native
            .call_with(&args, &[BufRef::F64(&data)], &mut Vec::new(), u64::MAX)
            .unwrap();
        assert_eq!(got, want);
        // A buffer of another length or type, or none, is refused before
        // any load runs.
        for bad in [
            vec![BufRef::F64(&data[..6])],
            vec![BufRef::I64(&[1, 2, 3, 4, 5, 6, 7])],
            vec![],
        ] {
            let err = native
                .call_with(&args, &bad, &mut Vec::new(), u64::MAX)
                .unwrap_err();
            assert!(err.message.contains("expected buffers"), "{err}");
        }
    }

    #[test]
    fn both_tiers_compute_the_same_bits() {
        use crate::scalar::native::compile_tiered;
        // A long body: more instructions than the first tier's threshold.
        let ops: Vec<(u8, u8, u8)> = (0..600u32)
            .map(|k| ((k * 7) as u8, (k * 13 + 1) as u8, (k * 29 + 3) as u8))
            .collect();
        let p = random_program(&ops, 9);
        p.validate().unwrap();
        let quick = compile_tiered(&p).unwrap();
        assert!(
            !quick.optimised(),
            "a long program starts in the quick tier"
        );
        let slow = compile_scalar(&p).unwrap();
        assert!(slow.optimised());
        for (x, k) in [(0.3, 5i64), (-2.5, -17), (1e3, 40)] {
            let args = [
                Scalar::F64(x),
                Scalar::F32(x as f32),
                Scalar::I64(k),
                Scalar::Bool(k > 0),
                Scalar::I64(0),
            ];
            match (quick.call(&args), slow.call(&args)) {
                (Ok(a), Ok(b)) => assert!(same(&a, &b), "{a:?} != {b:?}"),
                (Err(a), Err(b)) => assert_eq!(a, b),
                (a, b) => panic!("{a:?} vs {b:?}"),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn native_code_agrees_with_the_interpreter(
            ops in prop::collection::vec((any::<u8>(), any::<u8>(), any::<u8>()), 1..40),
            trips in 1i64..20,
            x in -4.0f64..4.0,
            y in -4.0f32..4.0,
            k in -50i64..50,
            c in any::<bool>(),
        ) {
            let p = random_program(&ops, trips);
            p.validate().unwrap();
            let native = compile_scalar(&p).unwrap();
            let args = [Scalar::F64(x), Scalar::F32(y), Scalar::I64(k), Scalar::Bool(c), Scalar::I64(0)];
            match p.eval(&args, 100) {
                Some(want) => {
                    let got = native.call(&args).unwrap();
                    prop_assert!(same(&got, &want), "{got:?} != {want:?} for {p:#?}");
                }
                // An integer division by zero or negative power: the
                // native run stops too.
                None => {
                    let err = native.call(&args).unwrap_err();
                    prop_assert!(
                        err.message.contains("integer division by zero")
                            || err.message.contains("negative exponent"),
                        "{err} for {p:#?}"
                    );
                }
            }
        }
    }
}
