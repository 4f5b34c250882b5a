//! Tensors: a dtype, a shared immutable row-major buffer, a static shape and
//! the *weak* flag of literals (language.md §2).
//!
//! A scalar is a 0-d tensor. Cloning a tensor is cheap: the buffer and the
//! shape are reference counted and never mutated after construction.

use std::fmt;
use std::sync::Arc;

use crate::error::RtError;
use crate::shape::TensorTy;

pub use crate::dtype::DType;

#[derive(Clone, Debug)]
pub enum Buffer {
    /// f32 elements.
    F32(Arc<Vec<f32>>),
    /// f64 elements.
    F64(Arc<Vec<f64>>),
    /// i32 elements.
    I32(Arc<Vec<i32>>),
    /// i64 elements.
    I64(Arc<Vec<i64>>),
    /// bool elements.
    Bool(Arc<Vec<bool>>),
    /// u8 elements.
    U8(Arc<Vec<u8>>),
}

/// Runs `$body` with `$v` bound to the typed vector of a [`Buffer`]; the
/// body is written once and instantiated for every element type.
#[macro_export]
#[doc(hidden)]
macro_rules! with_buffer {
    ($buf:expr, $v:ident => $body:expr) => {
        match $buf {
            $crate::tensor::Buffer::F32($v) => $body,
            $crate::tensor::Buffer::F64($v) => $body,
            $crate::tensor::Buffer::I32($v) => $body,
            $crate::tensor::Buffer::I64($v) => $body,
            $crate::tensor::Buffer::Bool($v) => $body,
            $crate::tensor::Buffer::U8($v) => $body,
        }
    };
}

impl Buffer {
    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        match self {
            Buffer::F32(_) => DType::F32,
            Buffer::F64(_) => DType::F64,
            Buffer::I32(_) => DType::I32,
            Buffer::I64(_) => DType::I64,
            Buffer::Bool(_) => DType::Bool,
            Buffer::U8(_) => DType::U8,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_buffer!(self, v => v.len())
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` zeros (`false` for bool) of the given dtype.
    pub fn zeros(dtype: DType, n: usize) -> Buffer {
        match dtype {
            DType::F32 => f32::wrap(vec![0.0; n]),
            DType::F64 => f64::wrap(vec![0.0; n]),
            DType::I32 => i32::wrap(vec![0; n]),
            DType::I64 => i64::wrap(vec![0; n]),
            DType::Bool => bool::wrap(vec![false; n]),
            DType::U8 => u8::wrap(vec![0; n]),
        }
    }

    /// The elements converted to `dtype` (see [`Element::cast_from`]).
    pub fn cast(&self, dtype: DType) -> Buffer {
        if self.dtype() == dtype {
            return self.clone();
        }
        fn go<S: Element>(src: &[S], dtype: DType) -> Buffer {
            match dtype {
                DType::F32 => f32::wrap(src.iter().map(|&x| f32::cast_from(x)).collect()),
                DType::F64 => f64::wrap(src.iter().map(|&x| f64::cast_from(x)).collect()),
                DType::I32 => i32::wrap(src.iter().map(|&x| i32::cast_from(x)).collect()),
                DType::I64 => i64::wrap(src.iter().map(|&x| i64::cast_from(x)).collect()),
                DType::Bool => bool::wrap(src.iter().map(|&x| bool::cast_from(x)).collect()),
                DType::U8 => u8::wrap(src.iter().map(|&x| u8::cast_from(x)).collect()),
            }
        }
        with_buffer!(self, v => go(v, dtype))
    }

    fn elements_eq(&self, other: &Buffer) -> bool {
        match (self, other) {
            (Buffer::F32(a), Buffer::F32(b)) => a == b,
            (Buffer::F64(a), Buffer::F64(b)) => a == b,
            (Buffer::I32(a), Buffer::I32(b)) => a == b,
            (Buffer::I64(a), Buffer::I64(b)) => a == b,
            (Buffer::Bool(a), Buffer::Bool(b)) => a == b,
            (Buffer::U8(a), Buffer::U8(b)) => a == b,
            _ => false,
        }
    }
}

/// A Rust type that can be the element of a tensor.
pub trait Element: Copy + PartialEq + PartialOrd + fmt::Debug + Send + Sync + 'static {
    /// The matching dtype.
    const DTYPE: DType;
    /// Moves a vector into a buffer.
    fn wrap(v: Vec<Self>) -> Buffer;
    /// The typed elements of a buffer of this dtype.
    fn view(b: &Buffer) -> Option<&[Self]>;
    /// The elements of a buffer of this dtype that no other value shares,
    /// moved out; the buffer back otherwise.
    fn take(b: Buffer) -> Result<Vec<Self>, Buffer>;
    /// The value as an f64 (`true` is 1).
    fn to_f64(self) -> f64;
    /// The value as an i64: floats truncate toward zero (saturating, NaN is
    /// 0), `true` is 1.
    fn to_i64(self) -> i64;
    /// Whether the value is nonzero (the value `bool(x)` gives).
    fn is_nonzero(self) -> bool;
    /// Whether the value is a float NaN.
    fn is_nan(self) -> bool;
    /// The conversion `dtype(x)` performs: floats round to nearest, float to
    /// int truncates toward zero (saturating), int to int wraps, anything to
    /// bool tests for nonzero.
    fn cast_from<S: Element>(x: S) -> Self;
    /// Writes the value in the print format of language.md §5.
    fn write_elem(self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
    /// Appends the little-endian bytes of the value.
    fn write_le(self, out: &mut Vec<u8>);
    /// Reads a value from its little-endian bytes (`Self::DTYPE.size_bytes()` of them).
    fn read_le(bytes: &[u8]) -> Self;
}

macro_rules! float_element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn wrap(v: Vec<Self>) -> Buffer {
                Buffer::$variant(Arc::new(v))
            }
            fn view(b: &Buffer) -> Option<&[Self]> {
                match b {
                    Buffer::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn take(b: Buffer) -> Result<Vec<Self>, Buffer> {
                match b {
                    Buffer::$variant(v) => Arc::try_unwrap(v).map_err(Buffer::$variant),
                    other => Err(other),
                }
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn to_i64(self) -> i64 {
                self as i64
            }
            fn is_nonzero(self) -> bool {
                self != 0.0
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn cast_from<S: Element>(x: S) -> Self {
                x.to_f64() as $t
            }
            fn write_elem(self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&crate::format::format_float(self))
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&bytes[..std::mem::size_of::<$t>()]);
                <$t>::from_le_bytes(a)
            }
        }
    };
}

macro_rules! int_element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn wrap(v: Vec<Self>) -> Buffer {
                Buffer::$variant(Arc::new(v))
            }
            fn view(b: &Buffer) -> Option<&[Self]> {
                match b {
                    Buffer::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn take(b: Buffer) -> Result<Vec<Self>, Buffer> {
                match b {
                    Buffer::$variant(v) => Arc::try_unwrap(v).map_err(Buffer::$variant),
                    other => Err(other),
                }
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn to_i64(self) -> i64 {
                self as i64
            }
            fn is_nonzero(self) -> bool {
                self != 0
            }
            fn is_nan(self) -> bool {
                false
            }
            fn cast_from<S: Element>(x: S) -> Self {
                if S::DTYPE.is_float() {
                    // `as` from a float truncates toward zero and saturates.
                    x.to_f64() as $t
                } else {
                    x.to_i64() as $t
                }
            }
            fn write_elem(self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self)
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&bytes[..std::mem::size_of::<$t>()]);
                <$t>::from_le_bytes(a)
            }
        }
    };
}

float_element!(f32, F32);
float_element!(f64, F64);
int_element!(i32, I32);
int_element!(i64, I64);
int_element!(u8, U8);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn wrap(v: Vec<Self>) -> Buffer {
        Buffer::Bool(Arc::new(v))
    }
    fn view(b: &Buffer) -> Option<&[Self]> {
        match b {
            Buffer::Bool(v) => Some(v),
            _ => None,
        }
    }
    fn take(b: Buffer) -> Result<Vec<Self>, Buffer> {
        match b {
            Buffer::Bool(v) => Arc::try_unwrap(v).map_err(Buffer::Bool),
            other => Err(other),
        }
    }
    fn to_f64(self) -> f64 {
        if self {
            1.0
        } else {
            0.0
        }
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
    fn is_nonzero(self) -> bool {
        self
    }
    fn is_nan(self) -> bool {
        false
    }
    fn cast_from<S: Element>(x: S) -> Self {
        x.is_nonzero()
    }
    fn write_elem(self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self { "true" } else { "false" })
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
    fn read_le(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}

/// A tensor value. See the module documentation.
#[derive(Clone, Debug)]
pub struct Tensor {
    buffer: Buffer,
    shape: Arc<[usize]>,
    /// Whether this is a weakly typed literal (or computed only from such):
    /// it adopts the dtype of the value it meets (language.md §2).
    /// Weak tensors are `i64` (int literals) or `f64` (float literals).
    pub weak: bool,
}

/// A shared shape: the empty one (of every scalar) is one allocation for
/// the whole process, not one per scalar.
fn shape_arc(shape: &[usize]) -> Arc<[usize]> {
    if shape.is_empty() {
        static EMPTY: std::sync::OnceLock<Arc<[usize]>> = std::sync::OnceLock::new();
        EMPTY.get_or_init(|| Arc::from([].as_slice())).clone()
    } else {
        Arc::from(shape)
    }
}

impl Tensor {
    /// A strong tensor from a buffer whose size matches the shape of
    /// `like`, sharing that shape (no allocation for it).
    pub fn with_shape_of(buffer: Buffer, like: &Tensor) -> Result<Tensor, RtError> {
        if like.len() != buffer.len() {
            return Tensor::new(buffer, like.shape());
        }
        Ok(Tensor {
            buffer,
            shape: like.shape.clone(),
            weak: false,
        })
    }

    /// A strong tensor from a buffer and a shape whose size matches it.
    pub fn new(buffer: Buffer, shape: &[usize]) -> Result<Tensor, RtError> {
        let size = crate::shape::checked_size(shape)
            .ok_or_else(|| RtError::new(format!("shape {shape:?} is too large")))?;
        if size != buffer.len() {
            return Err(RtError::new(format!(
                "cannot make a tensor of shape {} from {} elements",
                crate::shape::fmt_shape(shape),
                buffer.len()
            )));
        }
        Ok(Tensor {
            buffer,
            shape: shape_arc(shape),
            weak: false,
        })
    }

    /// A strong tensor from a vector of elements and a shape.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor, RtError> {
        Tensor::new(T::wrap(data), shape)
    }

    /// A strong 1-d tensor.
    pub fn vector<T: Element>(data: Vec<T>) -> Tensor {
        let n = data.len();
        Tensor {
            buffer: T::wrap(data),
            shape: Arc::from([n].as_slice()),
            weak: false,
        }
    }

    /// A strong 0-d tensor.
    pub fn scalar<T: Element>(v: T) -> Tensor {
        Tensor {
            buffer: T::wrap(vec![v]),
            shape: shape_arc(&[]),
            weak: false,
        }
    }

    /// A strong f32 scalar.
    pub fn scalar_f32(v: f32) -> Tensor {
        Tensor::scalar(v)
    }

    /// A strong f64 scalar.
    pub fn scalar_f64(v: f64) -> Tensor {
        Tensor::scalar(v)
    }

    /// A strong i32 scalar.
    pub fn scalar_i32(v: i32) -> Tensor {
        Tensor::scalar(v)
    }

    /// A strong i64 scalar.
    pub fn scalar_i64(v: i64) -> Tensor {
        Tensor::scalar(v)
    }

    /// A strong u8 scalar.
    pub fn scalar_u8(v: u8) -> Tensor {
        Tensor::scalar(v)
    }

    /// A bool scalar (bools are never weak).
    pub fn scalar_bool(v: bool) -> Tensor {
        Tensor::scalar(v)
    }

    /// A weakly typed float literal such as `2.5`.
    pub fn weak_f64(v: f64) -> Tensor {
        Tensor::scalar(v).with_weak(true)
    }

    /// A weakly typed int literal such as `3`.
    pub fn weak_i64(v: i64) -> Tensor {
        Tensor::scalar(v).with_weak(true)
    }

    /// Zeros (`false`) of a dtype and shape.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Result<Tensor, RtError> {
        let n = crate::shape::checked_size(shape)
            .ok_or_else(|| RtError::new(format!("shape {shape:?} is too large")))?;
        Tensor::new(Buffer::zeros(dtype, n), shape)
    }

    /// The same tensor with the weak flag set to `weak` (ignored for bool,
    /// which is never weak).
    pub fn with_weak(mut self, weak: bool) -> Tensor {
        self.weak = weak && self.dtype() != DType::Bool;
        self
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.buffer.dtype()
    }

    /// The static type used by shape rules and messages.
    pub fn ty(&self) -> TensorTy<'_> {
        TensorTy::new(self.dtype(), &self.shape)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    /// Whether the tensor has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the tensor is 0-d.
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }

    /// The storage.
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// The elements moved out, when the dtype is `T` and no other value
    /// shares the buffer; the tensor back otherwise.
    pub fn into_vec<T: Element>(self) -> Result<Vec<T>, Tensor> {
        let Tensor {
            buffer,
            shape,
            weak,
        } = self;
        T::take(buffer).map_err(|buffer| Tensor {
            buffer,
            shape,
            weak,
        })
    }

    /// The tensor with its elements changed by `f`: in its own buffer when
    /// no other value shares it (the caller held the only reference), in a
    /// copy otherwise. `None` when the dtype is not `T`'s. The bool says
    /// whether the buffer was written in place.
    pub fn modify<T: Element>(self, f: impl FnOnce(&mut [T])) -> Option<(Tensor, bool)> {
        let Tensor {
            buffer,
            shape,
            weak,
        } = self;
        let (mut data, in_place) = match T::take(buffer) {
            Ok(v) => (v, true),
            Err(b) => (T::view(&b)?.to_vec(), false),
        };
        f(&mut data);
        let t = Tensor {
            buffer: T::wrap(data),
            shape,
            weak,
        };
        Some((t, in_place))
    }

    /// The elements, if the dtype is `T`'s.
    pub fn slice<T: Element>(&self) -> Option<&[T]> {
        T::view(&self.buffer)
    }

    /// The elements of an f32 tensor.
    pub fn as_f32(&self) -> Option<&[f32]> {
        self.slice()
    }

    /// The elements of an f64 tensor.
    pub fn as_f64(&self) -> Option<&[f64]> {
        self.slice()
    }

    /// The elements of an i32 tensor.
    pub fn as_i32(&self) -> Option<&[i32]> {
        self.slice()
    }

    /// The elements of an i64 tensor.
    pub fn as_i64(&self) -> Option<&[i64]> {
        self.slice()
    }

    /// The elements of a bool tensor.
    pub fn as_bool(&self) -> Option<&[bool]> {
        self.slice()
    }

    /// The elements of a u8 tensor.
    pub fn as_u8(&self) -> Option<&[u8]> {
        self.slice()
    }

    /// Every element converted to f64.
    pub fn as_f64_vec(&self) -> Vec<f64> {
        with_buffer!(&self.buffer, v => v.iter().map(|x| x.to_f64()).collect())
    }

    /// Every element converted to i64 (floats truncate toward zero).
    pub fn as_i64_vec(&self) -> Vec<i64> {
        with_buffer!(&self.buffer, v => v.iter().map(|x| x.to_i64()).collect())
    }

    /// The value of a 0-d int tensor (i32, i64 or u8).
    pub fn to_i64_scalar(&self) -> Option<i64> {
        if !self.is_scalar() || !self.dtype().is_int() {
            return None;
        }
        self.as_i64_vec().first().copied()
    }

    /// The value of a 0-d numeric tensor as an f64.
    pub fn to_f64_scalar(&self) -> Option<f64> {
        if !self.is_scalar() || !self.dtype().is_numeric() {
            return None;
        }
        self.as_f64_vec().first().copied()
    }

    /// The value of a 0-d bool tensor.
    pub fn to_bool_scalar(&self) -> Option<bool> {
        if !self.is_scalar() {
            return None;
        }
        self.as_bool().and_then(|v| v.first().copied())
    }

    /// The type as messages and `print(dtype(x), shape(x))` show it:
    /// `f32[3, 4]`, `f32[]` for a scalar.
    pub fn type_string(&self) -> String {
        self.ty().to_string()
    }

    /// The same elements under another shape of the same size; shares the buffer.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor, RtError> {
        let t = Tensor::new(self.buffer.clone(), shape)?;
        Ok(t.with_weak(self.weak))
    }

    /// The elements converted to `dtype` (see [`Element::cast_from`]);
    /// keeps the weak flag (cleared for bool). Free when the dtype is the same.
    pub fn cast(&self, dtype: DType) -> Tensor {
        Tensor {
            buffer: self.buffer.cast(dtype),
            shape: self.shape.clone(),
            weak: self.weak,
        }
        .with_weak(self.weak)
    }
}

/// Equal dtype, shape, weakness and elements (so NaN != NaN).
impl PartialEq for Tensor {
    fn eq(&self, other: &Tensor) -> bool {
        self.weak == other.weak
            && self.shape == other.shape
            && self.buffer.elements_eq(&other.buffer)
    }
}

impl<T: Element> From<T> for Tensor {
    fn from(v: T) -> Tensor {
        Tensor::scalar(v)
    }
}

fn write_nested<T: Element>(
    f: &mut fmt::Formatter<'_>,
    data: &[T],
    shape: &[usize],
) -> fmt::Result {
    match shape.split_first() {
        None => match data.first() {
            Some(x) => x.write_elem(f),
            None => Ok(()),
        },
        Some((&n, rest)) => {
            let chunk: usize = rest.iter().product();
            f.write_str("[")?;
            for i in 0..n {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write_nested(f, &data[i * chunk..(i + 1) * chunk], rest)?;
            }
            f.write_str("]")
        }
    }
}

/// Writes the tensor in the print format (see [`crate::format`]).
impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("[]");
        }
        with_buffer!(self.buffer(), v => write_nested(f, v, self.shape()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
            assert_eq!(d.to_string().parse::<DType>(), Ok(d));
        }
        assert!(DType::from_name("f16").is_none());
        assert!(DType::F32.is_float() && !DType::F32.is_int());
        assert!(DType::U8.is_int() && !DType::Bool.is_numeric());
    }

    #[test]
    fn constructors_and_accessors() {
        let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(t.dtype(), DType::F32);
        assert_eq!(t.len(), 6);
        assert_eq!(t.type_string(), "f32[2, 3]");
        assert_eq!(t.as_f64_vec(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert!(Tensor::from_vec(vec![1i64, 2], &[3]).is_err());
        assert_eq!(Tensor::scalar_f32(1.0).type_string(), "f32[]");
        assert_eq!(Tensor::scalar_i64(-4).to_i64_scalar(), Some(-4));
        assert_eq!(Tensor::scalar_f64(1.0).to_i64_scalar(), None);
        assert_eq!(Tensor::scalar_bool(true).to_bool_scalar(), Some(true));
        assert!(Tensor::weak_i64(3).weak);
        assert!(!Tensor::scalar_bool(true).with_weak(true).weak);
    }

    #[test]
    fn clone_shares_buffer() {
        let t = Tensor::vector(vec![1.0f64; 4]);
        let u = t.clone();
        match (t.buffer(), u.buffer()) {
            (Buffer::F64(a), Buffer::F64(b)) => assert!(Arc::ptr_eq(a, b)),
            _ => panic!("wrong dtype"),
        }
    }

    #[test]
    fn casts() {
        let t = Tensor::vector(vec![-1.7f64, 2.9, 0.0]);
        assert_eq!(t.cast(DType::I64).as_i64(), Some(&[-1i64, 2, 0][..]));
        assert_eq!(
            t.cast(DType::Bool).as_bool(),
            Some(&[true, true, false][..])
        );
        let b = Tensor::vector(vec![true, false]);
        assert_eq!(b.cast(DType::F32).as_f32(), Some(&[1.0f32, 0.0][..]));
        let i = Tensor::vector(vec![300i64, -1]);
        assert_eq!(i.cast(DType::U8).as_u8(), Some(&[44u8, 255][..]));
        assert_eq!(
            Tensor::vector(vec![f64::NAN]).cast(DType::I32).as_i32(),
            Some(&[0][..])
        );
    }

    #[test]
    fn equality_checks_everything() {
        let a = Tensor::vector(vec![1i64, 2]);
        assert_eq!(a, Tensor::vector(vec![1i64, 2]));
        assert_ne!(a, Tensor::vector(vec![1i32, 2]));
        assert_ne!(a, a.reshape(&[2, 1]).unwrap());
        assert_ne!(a, a.clone().with_weak(true));
    }
}
