//! IO kernels, ordered by the state token `Value::Io` passed first:
//! `print load_npy load_csv save_npy save_safetensors load_safetensors`.
//!
//! Relative paths are relative to the working directory. Failures name the
//! path: `cannot read "x.npy": no such file or directory`.

use std::collections::HashMap;
use std::sync::Arc;

use super::args::{arity, int, io, min_arity, string, tensor};
use super::ctx::Ctx;
use super::shape::transpose_tensor;
use crate::error::RtError;
use crate::tensor::{DType, Element, Tensor};
use crate::value::Value;
use crate::with_buffer;

/// The metadata key under which `save_safetensors` records the field order.
pub const ORDER_KEY: &str = "adjoint.order";

/// A lowercase description of an IO error, without the OS error number.
fn describe(e: &std::io::Error) -> String {
    use std::io::ErrorKind::*;
    match e.kind() {
        NotFound => "no such file or directory".into(),
        PermissionDenied => "permission denied".into(),
        IsADirectory => "is a directory".into(),
        _ => {
            let s = e.to_string();
            let s = match s.find(" (os error") {
                Some(i) => s[..i].to_string(),
                None => s,
            };
            let mut c = s.chars();
            match c.next() {
                Some(f) => f.to_lowercase().chain(c).collect(),
                None => s,
            }
        }
    }
}

fn read_err(path: &str, why: impl std::fmt::Display) -> RtError {
    RtError::new(format!("cannot read \"{path}\": {why}"))
}

fn write_err(path: &str, why: impl std::fmt::Display) -> RtError {
    RtError::new(format!("cannot write \"{path}\": {why}"))
}

fn read_file(path: &str) -> Result<Vec<u8>, RtError> {
    std::fs::read(path).map_err(|e| read_err(path, describe(&e)))
}

/// `print(io, a, b, ..)`: the arguments separated by spaces, then a newline.
pub fn print(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "print";
    min_arity(op, args, 1)?;
    io(op, &args[0])?;
    let mut line = String::new();
    for (i, a) in args[1..].iter().enumerate() {
        if i > 0 {
            line.push(' ');
        }
        line.push_str(&a.to_string());
    }
    line.push('\n');
    let mut write = || ctx.stdout().write_all(line.as_bytes());
    // With a host, its progress bars are hidden while the line is written.
    let mut result = None;
    if crate::host::with_host(|h| h.suspend(&mut || result = Some(write()))).is_none() {
        result = Some(write());
    }
    result
        .unwrap_or(Ok(()))
        .map_err(|e| RtError::new(format!("print: cannot write: {}", describe(&e))))?;
    Ok(Value::Io)
}

/// `progress_start(io, lo, hi)`: a loop `for i in progress(lo..hi)` starts
/// (the host draws a bar of `hi - lo` steps).
pub fn progress_start(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "progress_start";
    arity(op, args, 3)?;
    io(op, &args[0])?;
    let lo = int(op, &args[1], "the start")?;
    let hi = int(op, &args[2], "the end")?;
    let len = hi.saturating_sub(lo).max(0) as u64;
    crate::host::with_host(|h| h.progress_start(len));
    // The bar counts from `lo`: remember it for `progress_step`.
    PROGRESS_LO.with(|s| s.borrow_mut().push(lo));
    Ok(Value::Io)
}

thread_local! {
    /// The start of each active progress loop, innermost last.
    static PROGRESS_LO: std::cell::RefCell<Vec<i64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `progress_step(io, i)`: iteration `i` of the innermost progress loop
/// begins, so `i - lo` iterations are complete.
pub fn progress_step(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "progress_step";
    arity(op, args, 2)?;
    io(op, &args[0])?;
    let i = int(op, &args[1], "the counter")?;
    let lo = PROGRESS_LO
        .with(|s| s.borrow().last().copied())
        .unwrap_or(i);
    let done = i.saturating_sub(lo).max(0) as u64;
    crate::host::with_host(|h| h.progress_set(done));
    Ok(Value::Io)
}

/// `progress_end(io)`: the innermost progress loop has ended.
pub fn progress_end(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "progress_end";
    arity(op, args, 1)?;
    io(op, &args[0])?;
    PROGRESS_LO.with(|s| s.borrow_mut().pop());
    crate::host::with_host(|h| h.progress_end());
    Ok(Value::Io)
}

/// `progress_note(io, a, b, ..)`: the arguments, formatted as `print`
/// formats them, become the message of the innermost progress bar.
pub fn progress_note(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "progress_note";
    min_arity(op, args, 1)?;
    io(op, &args[0])?;
    let text = args[1..]
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(" ");
    crate::host::with_host(|h| h.progress_note(&text));
    Ok(Value::Io)
}

/// The rows of a CSV file for a tensor of one dimension (one column) or
/// two (one row each), elements formatted as `print` formats them.
fn csv_text(op: &str, t: &Tensor, header: Option<&str>) -> Result<String, RtError> {
    let (rows, cols) = match t.shape() {
        [n] => (*n, 1),
        [n, k] => (*n, *k),
        _ => {
            return Err(RtError::new(format!(
                "{op}: expected a tensor of one or two dimensions, got {}",
                t.ty()
            )))
        }
    };
    let mut out = String::new();
    if let Some(h) = header {
        out.push_str(h);
        out.push('\n');
    }
    struct Elem<'a, T: Element>(&'a T);
    impl<T: Element> std::fmt::Display for Elem<'_, T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            self.0.write_elem(f)
        }
    }
    let items: Vec<String> =
        with_buffer!(t.buffer(), v => v.iter().map(|x| Elem(x).to_string()).collect());
    for r in 0..rows {
        out.push_str(&items[r * cols..(r + 1) * cols].join(","));
        out.push('\n');
    }
    Ok(out)
}

/// `save_csv(io, path, x, header)`: writes a tensor of one dimension (one
/// value a line) or two (one row a line, values separated by commas), with
/// the line `header` first when it is given. Returns `io`.
pub fn save_csv(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "save_csv";
    arity(op, args, 4)?;
    io(op, &args[0])?;
    let path = string(op, &args[1], "the path")?;
    let t = tensor(op, &args[2], "x")?;
    let header = if args[3].is_unit() {
        None
    } else {
        Some(string(op, &args[3], "the header")?)
    };
    let text = csv_text(op, t, header)?;
    std::fs::write(path, text).map_err(|e| write_err(path, describe(&e)))?;
    Ok(Value::Io)
}

/// `plot(io, y, title)`: hands a curve (a 1-d tensor) or curves (the
/// columns of a 2-d tensor) to the host, which draws them when the
/// program was asked to (`adjoint run --plot FILE`). Returns `io`.
pub fn plot(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "plot";
    arity(op, args, 3)?;
    io(op, &args[0])?;
    let t = tensor(op, &args[1], "y")?;
    let title = if args[2].is_unit() {
        ""
    } else {
        string(op, &args[2], "the title")?
    };
    let cols = match t.shape() {
        [_] => 1,
        [_, k] => *k,
        _ => {
            return Err(RtError::new(format!(
                "{op}: expected a tensor of one or two dimensions, got {}",
                t.ty()
            )))
        }
    };
    if t.dtype() == DType::Bool {
        return Err(RtError::new(format!(
            "{op}: expected numbers, got {}",
            t.ty()
        )));
    }
    let ys = t.as_f64_vec();
    match crate::host::with_host(|h| h.plot(title, &ys, cols)) {
        Some(Err(e)) => Err(RtError::new(format!("{op}: {e}"))),
        _ => Ok(Value::Io),
    }
}

fn npy_vec<T: npyz::Deserialize>(
    path: &str,
    file: npyz::NpyFile<&[u8]>,
) -> Result<Vec<T>, RtError> {
    file.into_vec::<T>()
        .map_err(|e| read_err(path, describe(&e)))
}

/// Whether the `shape` in an .npy header has a product that overflows.
fn header_shape_overflows(bytes: &[u8]) -> bool {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return false;
    }
    let (len, start): (usize, usize) = if bytes[6] == 1 {
        (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10)
    } else if bytes.len() >= 12 {
        (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        )
    } else {
        return false;
    };
    let Some(header) = bytes.get(start..start.saturating_add(len)) else {
        return false;
    };
    let header = String::from_utf8_lossy(header);
    let Some(at) = header.find("shape") else {
        return false;
    };
    let rest = &header[at..];
    let (Some(open), Some(close)) = (rest.find('('), rest.find(')')) else {
        return false;
    };
    if close < open {
        return false;
    }
    let mut n: u64 = 1;
    for part in rest[open + 1..close].split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        match part.parse::<u64>() {
            Ok(d) => match n.checked_mul(d) {
                Some(m) => n = m,
                None => return true,
            },
            Err(_) => return true,
        }
    }
    false
}

/// The dtype `load_npy` gives the data of an .npy type (`kind`, `size`).
fn npy_dtype(kind: npyz::TypeChar, size: u64) -> Option<crate::DType> {
    use crate::DType as D;
    use npyz::TypeChar as C;
    Some(match (kind, size) {
        (C::Float, 4) => D::F32,
        (C::Float, 8) => D::F64,
        (C::Int, 1 | 2 | 4) | (C::Uint, 2) => D::I32,
        (C::Int, 8) | (C::Uint, 4) => D::I64,
        (C::Uint, 1) => D::U8,
        (C::Bool, 1) => D::Bool,
        _ => return None,
    })
}

/// The dtype and shape of the tensor `load_npy` makes of an .npy file
/// that starts with `prefix` (its header; the data need not follow), or
/// `None` when the header does not tell (not an .npy header, an
/// unsupported dtype, a shape too large). For compilers that specialise a
/// program to the data it loads.
pub fn npy_type(prefix: &[u8]) -> Option<(crate::DType, Vec<usize>)> {
    if header_shape_overflows(prefix) {
        return None;
    }
    let header = npyz::NpyHeader::from_reader(prefix).ok()?;
    let npyz::DType::Plain(ts) = header.dtype() else {
        return None;
    };
    let dtype = npy_dtype(ts.type_char(), ts.size_field())?;
    let shape: Vec<usize> = header
        .shape()
        .iter()
        .map(|&d| usize::try_from(d).ok())
        .collect::<Option<_>>()?;
    let n = crate::shape::checked_size(&shape)?;
    crate::shape::check_alloc("load_npy", n).ok()?;
    Some((dtype, shape))
}

/// Reads an .npy file's bytes into a tensor (C or Fortran order).
fn npy_tensor(path: &str, bytes: &[u8]) -> Result<Tensor, RtError> {
    // npyz multiplies the header's dimensions without checking for
    // overflow (a panic in debug builds): check the shape first.
    if header_shape_overflows(bytes) {
        return Err(read_err(path, "the header's shape is too large"));
    }
    let file = npyz::NpyFile::new(bytes).map_err(|e| read_err(path, describe(&e)))?;
    let shape: Vec<usize> = file.shape().iter().map(|&d| d as usize).collect();
    let n = crate::shape::checked_size(&shape)
        .ok_or_else(|| read_err(path, "the header's shape is too large"))?;
    crate::shape::check_alloc("load_npy", n).map_err(RtError::new)?;
    let fortran = file.order() == npyz::Order::Fortran;
    let npyz::DType::Plain(ts) = file.dtype() else {
        return Err(read_err(path, "structured arrays are not supported"));
    };
    use npyz::TypeChar as C;
    let (kind, size) = (ts.type_char(), ts.size_field());
    let data: crate::tensor::Buffer = match (kind, size) {
        (C::Float, 4) => f32::wrap(npy_vec(path, file)?),
        (C::Float, 8) => f64::wrap(npy_vec(path, file)?),
        (C::Int, 1) => i32::wrap(
            npy_vec::<i8>(path, file)?
                .into_iter()
                .map(i32::from)
                .collect(),
        ),
        (C::Int, 2) => i32::wrap(
            npy_vec::<i16>(path, file)?
                .into_iter()
                .map(i32::from)
                .collect(),
        ),
        (C::Int, 4) => i32::wrap(npy_vec(path, file)?),
        (C::Int, 8) => i64::wrap(npy_vec(path, file)?),
        (C::Uint, 1) => u8::wrap(npy_vec(path, file)?),
        (C::Uint, 2) => i32::wrap(
            npy_vec::<u16>(path, file)?
                .into_iter()
                .map(i32::from)
                .collect(),
        ),
        (C::Uint, 4) => i64::wrap(
            npy_vec::<u32>(path, file)?
                .into_iter()
                .map(i64::from)
                .collect(),
        ),
        (C::Bool, 1) => bool::wrap(npy_vec(path, file)?),
        _ => {
            return Err(read_err(
                path,
                format!("unsupported dtype `{ts}`; expected f32, f64, i32, i64, u8 or bool"),
            ))
        }
    };
    if !fortran {
        return Tensor::new(data, &shape).map_err(|e| read_err(path, e));
    }
    // Fortran order: the data is the transpose, in C order, of the reversed shape.
    let rev: Vec<usize> = shape.iter().rev().copied().collect();
    let t = Tensor::new(data, &rev).map_err(|e| read_err(path, e))?;
    transpose_tensor(&t, None)
}

/// The numbers of a CSV file, row-major, and its (rows, columns): rows of
/// comma-separated numbers (spaces around them allowed); a first row that
/// is not all numbers is a header and is skipped; blank lines are skipped.
/// Every row must have as many values as the first.
pub fn csv_table(path: &str, text: &str) -> Result<(Vec<f64>, usize, usize), String> {
    let mut data = Vec::new();
    let (mut rows, mut cols) = (0usize, 0usize);
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let parsed: Vec<Option<f64>> = cells.iter().map(|c| c.parse::<f64>().ok()).collect();
        if rows == 0 && data.is_empty() && parsed.iter().any(Option::is_none) && cols == 0 {
            // A header: its width is the table's.
            cols = cells.len();
            continue;
        }
        if let Some(k) = parsed.iter().position(Option::is_none) {
            return Err(format!(
                "\"{path}\" line {}: `{}` is not a number",
                i + 1,
                cells[k]
            ));
        }
        if cols == 0 {
            cols = cells.len();
        } else if cells.len() != cols {
            return Err(format!(
                "\"{path}\" line {}: {} value{}, but the rows before have {cols}",
                i + 1,
                cells.len(),
                if cells.len() == 1 { "" } else { "s" }
            ));
        }
        data.extend(parsed.into_iter().flatten());
        rows += 1;
    }
    Ok((data, rows, cols))
}

/// `load_csv(io, path)`: `(io, f64[rows, columns])`, see [`csv_table`].
pub fn load_csv(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "load_csv";
    arity(op, args, 2)?;
    io(op, &args[0])?;
    let path = string(op, &args[1], "the path")?;
    let bytes = read_file(path)?;
    let text = String::from_utf8(bytes).map_err(|_| read_err(path, "it is not UTF-8 text"))?;
    let (data, rows, cols) =
        csv_table(path, &text).map_err(|e| RtError::new(format!("{op}: {e}")))?;
    let t = Tensor::from_vec(data, &[rows, cols])?;
    Ok(Value::tuple(vec![Value::Io, Value::Tensor(t)]))
}

/// `load_npy(io, path)`: `(io, tensor)`.
pub fn load_npy(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "load_npy";
    arity(op, args, 2)?;
    io(op, &args[0])?;
    let path = string(op, &args[1], "the path")?;
    let bytes = read_file(path)?;
    let t = npy_tensor(path, &bytes)?;
    Ok(Value::tuple(vec![Value::Io, Value::Tensor(t)]))
}

fn write_npy<T: npyz::AutoSerialize + Element>(
    path: &str,
    data: &[T],
    shape: &[usize],
) -> Result<(), RtError> {
    use npyz::WriterBuilder;
    let file = std::fs::File::create(path).map_err(|e| write_err(path, describe(&e)))?;
    let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(&dims)
        .writer(std::io::BufWriter::new(file))
        .begin_nd()
        .map_err(|e| write_err(path, describe(&e)))?;
    w.extend(data.iter().copied())
        .map_err(|e| write_err(path, describe(&e)))?;
    w.finish().map_err(|e| write_err(path, describe(&e)))
}

/// `save_npy(io, path, x)`: writes `x` as a C-order .npy file; returns `io`.
pub fn save_npy(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "save_npy";
    arity(op, args, 3)?;
    io(op, &args[0])?;
    let path = string(op, &args[1], "the path")?;
    let x = tensor(op, &args[2], "x")?;
    with_buffer!(x.buffer(), v => write_npy(path, v, x.shape()))?;
    Ok(Value::Io)
}

fn st_dtype(d: DType) -> safetensors::Dtype {
    match d {
        DType::F32 => safetensors::Dtype::F32,
        DType::F64 => safetensors::Dtype::F64,
        DType::I32 => safetensors::Dtype::I32,
        DType::I64 => safetensors::Dtype::I64,
        DType::Bool => safetensors::Dtype::BOOL,
        DType::U8 => safetensors::Dtype::U8,
    }
}

fn flatten(
    op: &str,
    prefix: &str,
    v: &Value,
    out: &mut Vec<(String, Tensor)>,
) -> Result<(), RtError> {
    let join = |name: &str| {
        if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}.{name}")
        }
    };
    match v {
        Value::Record(r) => r.fields.iter().try_for_each(|(n, x)| {
            if n.is_empty() || n.contains(['.', ',']) {
                return Err(RtError::new(format!(
                    "{op}: the field name `{n}` cannot be saved"
                )));
            }
            flatten(op, &join(n), x, out)
        }),
        Value::Tuple(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, x)| flatten(op, &join(&i.to_string()), x, out)),
        Value::Tensor(t) if !prefix.is_empty() => {
            out.push((prefix.to_string(), t.clone()));
            Ok(())
        }
        other => Err(RtError::new(format!(
            "{op}: expected a record of tensors, got {}{}",
            other.kind(),
            if prefix.is_empty() {
                String::new()
            } else {
                format!(" at `{prefix}`")
            }
        ))),
    }
}

/// `save_safetensors(io, path, record)`: writes the tensors of a record
/// (nested records and tuples flatten to dotted names such as `layer1.w`
/// and `state.0`); the field order is kept in the metadata under
/// [`ORDER_KEY`]. Returns `io`.
pub fn save_safetensors(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "save_safetensors";
    arity(op, args, 3)?;
    io(op, &args[0])?;
    let path = string(op, &args[1], "the path")?;
    let mut leaves = Vec::new();
    flatten(op, "", &args[2], &mut leaves)?;
    let bytes: Vec<Vec<u8>> = leaves
        .iter()
        .map(|(_, t)| {
            let mut b = Vec::with_capacity(t.len() * t.dtype().size_bytes());
            with_buffer!(t.buffer(), v => v.iter().for_each(|x| x.write_le(&mut b)));
            b
        })
        .collect();
    let views = leaves
        .iter()
        .zip(&bytes)
        .map(|((name, t), b)| {
            safetensors::tensor::TensorView::new(st_dtype(t.dtype()), t.shape().to_vec(), b)
                .map(|view| (name.clone(), view))
                .map_err(|e| write_err(path, e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let order: Vec<&str> = leaves.iter().map(|(n, _)| n.as_str()).collect();
    let meta = HashMap::from([(ORDER_KEY.to_string(), order.join(","))]);
    let data = safetensors::serialize(views, Some(meta)).map_err(|e| write_err(path, e))?;
    std::fs::write(path, data).map_err(|e| write_err(path, describe(&e)))?;
    Ok(Value::Io)
}

/// A tree being rebuilt from dotted names.
enum Node {
    Leaf(Tensor),
    Branch(Vec<(String, Node)>),
}

fn insert(
    node: &mut Vec<(String, Node)>,
    path: &[&str],
    t: Tensor,
    full: &str,
) -> Result<(), String> {
    let Some((head, rest)) = path.split_first() else {
        return Err(format!("empty tensor name in `{full}`"));
    };
    let pos = node.iter().position(|(n, _)| n == head);
    if rest.is_empty() {
        if pos.is_some() {
            return Err(format!("tensor `{full}` clashes with another name"));
        }
        node.push((head.to_string(), Node::Leaf(t)));
        return Ok(());
    }
    let i = match pos {
        Some(i) => i,
        None => {
            node.push((head.to_string(), Node::Branch(Vec::new())));
            node.len() - 1
        }
    };
    match &mut node[i].1 {
        Node::Branch(children) => insert(children, rest, t, full),
        Node::Leaf(_) => Err(format!("tensor `{full}` clashes with another name")),
    }
}

/// A branch whose names are exactly `0..n` becomes a tuple; any other, a record.
fn build(children: Vec<(String, Node)>) -> Value {
    let all_digits = children
        .iter()
        .all(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if all_digits {
        let mut idx: Vec<usize> = children
            .iter()
            .filter_map(|(n, _)| n.parse().ok())
            .collect();
        idx.sort_unstable();
        if idx.len() == children.len() && idx.iter().enumerate().all(|(i, &k)| i == k) {
            let mut numbered: Vec<(usize, Node)> = children
                .into_iter()
                .filter_map(|(n, c)| n.parse().ok().map(|k| (k, c)))
                .collect();
            numbered.sort_by_key(|(k, _)| *k);
            return Value::tuple(numbered.into_iter().map(|(_, c)| to_value(c)).collect());
        }
    }
    Value::record(
        children
            .into_iter()
            .map(|(n, c)| (Arc::<str>::from(n), to_value(c)))
            .collect(),
    )
}

fn to_value(n: Node) -> Value {
    match n {
        Node::Leaf(t) => Value::Tensor(t),
        Node::Branch(c) => build(c),
    }
}

fn st_tensor(
    path: &str,
    name: &str,
    view: &safetensors::tensor::TensorView,
) -> Result<Tensor, RtError> {
    fn decode<T: Element>(bytes: &[u8]) -> Vec<T> {
        bytes
            .chunks_exact(T::DTYPE.size_bytes())
            .map(T::read_le)
            .collect()
    }
    let b = view.data();
    let buf = match view.dtype() {
        safetensors::Dtype::F32 => f32::wrap(decode(b)),
        safetensors::Dtype::F64 => f64::wrap(decode(b)),
        safetensors::Dtype::I32 => i32::wrap(decode(b)),
        safetensors::Dtype::I64 => i64::wrap(decode(b)),
        safetensors::Dtype::BOOL => bool::wrap(decode(b)),
        safetensors::Dtype::U8 => u8::wrap(decode(b)),
        other => {
            return Err(read_err(
                path,
                format!("tensor `{name}` has unsupported dtype {other:?}"),
            ))
        }
    };
    Tensor::new(buf, view.shape()).map_err(|e| read_err(path, e))
}

/// `load_safetensors(io, path)`: `(io, record)`, nesting rebuilt from the
/// dotted names (numbered levels become tuples) in the saved field order
/// (for files from elsewhere: the order of the data in the file).
pub fn load_safetensors(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "load_safetensors";
    arity(op, args, 2)?;
    io(op, &args[0])?;
    let path = string(op, &args[1], "the path")?;
    let bytes = read_file(path)?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| read_err(path, e))?;
    let (_, meta) =
        safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| read_err(path, e))?;
    let saved: Option<Vec<String>> =
        meta.metadata()
            .as_ref()
            .and_then(|m| m.get(ORDER_KEY))
            .map(|s| {
                s.split(',')
                    .filter(|n| !n.is_empty())
                    .map(String::from)
                    .collect()
            });
    let names = match saved {
        Some(order) if order.len() == st.len() => order,
        _ => meta.offset_keys(),
    };
    let mut root = Vec::new();
    for name in &names {
        let view = st.tensor(name).map_err(|e| read_err(path, e))?;
        let t = st_tensor(path, name, &view)?;
        let parts: Vec<&str> = name.split('.').collect();
        insert(&mut root, &parts, t, name).map_err(|e| read_err(path, e))?;
    }
    Ok(Value::tuple(vec![Value::Io, build(root)]))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{call, call_err, v, TestCtx};
    use super::*;

    fn tmp(name: &str) -> String {
        // One directory for the test binary, removed when it exits.
        static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
        let dir = DIR.get_or_init(|| tempfile::tempdir().expect("a temporary directory"));
        dir.path().join(name).to_string_lossy().into_owned()
    }

    #[test]
    fn prints() {
        let mut ctx = TestCtx::default();
        let args = [
            Value::Io,
            v(Tensor::scalar_i64(6)),
            Value::str("loss"),
            v(Tensor::from_vec(vec![1.0f32, 2.5, 3.0, 4.0], &[2, 2]).unwrap()),
            Value::tuple(vec![v(Tensor::scalar_bool(true))]),
        ];
        assert_eq!(print(&mut ctx, &args).unwrap(), Value::Io);
        print(&mut ctx, &[Value::Io]).unwrap();
        assert_eq!(
            String::from_utf8(ctx.out).unwrap(),
            "6 loss [[1.0, 2.5], [3.0, 4.0]] (true,)\n\n"
        );
        assert!(call_err("print", &[v(Tensor::scalar_i64(1))]).contains("io token"));
    }

    #[test]
    fn csv_files() {
        let path = tmp("c.csv");
        let m = Tensor::from_vec(vec![1.0f32, -2.5, 3.0, 1e-9], &[2, 2]).unwrap();
        call(
            "save_csv",
            &[
                Value::Io,
                Value::str(path.as_str()),
                v(m),
                Value::str("a,b"),
            ],
        );
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "a,b\n1.0,-2.5\n3.0,1e-9\n"
        );
        let col = Tensor::vector(vec![3i64, 4]);
        call(
            "save_csv",
            &[Value::Io, Value::str(path.as_str()), v(col), Value::unit()],
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "3\n4\n");
        let cube = Tensor::zeros(DType::F32, &[1, 1, 1]).unwrap();
        let e = call_err(
            "save_csv",
            &[Value::Io, Value::str(path.as_str()), v(cube), Value::unit()],
        );
        assert!(e.contains("one or two dimensions"), "{e}");
        let e = call_err(
            "save_csv",
            &[
                Value::Io,
                Value::str("/nonexistent-dir/x.csv"),
                v(Tensor::vector(vec![1.0f32])),
                Value::unit(),
            ],
        );
        assert!(e.contains("cannot write \"/nonexistent-dir/x.csv\""), "{e}");
    }

    /// Progress loops, notes and plots reach the installed host, in order;
    /// without a host they do nothing.
    #[test]
    fn host_hooks() {
        use std::sync::{Arc, Mutex};
        struct Rec(Arc<Mutex<Vec<String>>>);
        impl crate::host::Host for Rec {
            fn progress_start(&mut self, len: u64) {
                self.0.lock().unwrap().push(format!("start {len}"));
            }
            fn progress_set(&mut self, done: u64) {
                self.0.lock().unwrap().push(format!("set {done}"));
            }
            fn progress_note(&mut self, m: &str) {
                self.0.lock().unwrap().push(format!("note {m}"));
            }
            fn progress_end(&mut self) {
                self.0.lock().unwrap().push("end".into());
            }
            fn plot(&mut self, title: &str, ys: &[f64], cols: usize) -> Result<(), String> {
                self.0
                    .lock()
                    .unwrap()
                    .push(format!("plot {title} {ys:?} {cols}"));
                Err("no room".into())
            }
        }
        let i = |x: i64| v(Tensor::scalar_i64(x));
        let y = || v(Tensor::vector(vec![2.0f32, 1.0]));
        // No host: nothing happens, nothing fails.
        call("progress_start", &[Value::Io, i(3), i(5)]);
        call("plot", &[Value::Io, y(), Value::unit()]);
        call("progress_end", &[Value::Io]);
        let log = Arc::new(Mutex::new(Vec::new()));
        crate::host::set_host(Some(Box::new(Rec(log.clone()))));
        call("progress_start", &[Value::Io, i(3), i(5)]);
        call("progress_step", &[Value::Io, i(4)]);
        call(
            "progress_note",
            &[Value::Io, Value::str("loss"), v(Tensor::scalar_f32(0.5))],
        );
        call("progress_end", &[Value::Io]);
        let e = call_err("plot", &[Value::Io, y(), Value::str("t")]);
        crate::host::set_host(None);
        assert_eq!(e, "plot: no room");
        assert_eq!(
            *log.lock().unwrap(),
            [
                "start 2",
                "set 1",
                "note loss 0.5",
                "end",
                "plot t [2.0, 1.0] 1"
            ]
        );
    }

    #[test]
    fn npy_round_trips() {
        let cases = vec![
            Tensor::from_vec(vec![1.0f32, -2.5, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap(),
            Tensor::vector(vec![1.0f64, 0.1]),
            Tensor::scalar_i64(-7),
            Tensor::vector(vec![1i32, 2]),
            Tensor::vector(vec![true, false]),
            Tensor::vector(vec![0u8, 255]),
            Tensor::zeros(DType::F32, &[0, 2]).unwrap(),
        ];
        for (i, t) in cases.into_iter().enumerate() {
            let p = tmp(&format!("t{i}.npy"));
            call(
                "save_npy",
                &[Value::Io, Value::str(p.as_str()), v(t.clone())],
            );
            let r = call("load_npy", &[Value::Io, Value::str(p.as_str())]);
            assert_eq!(r, Value::tuple(vec![Value::Io, v(t)]));
        }
    }

    #[test]
    fn npy_types_from_headers() {
        let path = tmp("types.npy");
        let t = Tensor::from_vec(vec![1.0f64; 6], &[2, 3]).unwrap();
        call("save_npy", &[Value::Io, Value::str(path.as_str()), v(t)]);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(npy_type(&bytes), Some((crate::DType::F64, vec![2, 3])));
        // The header alone is enough; garbage is not a header.
        assert_eq!(
            npy_type(&bytes[..bytes.len() - 48]),
            Some((crate::DType::F64, vec![2, 3]))
        );
        assert_eq!(npy_type(b"not an npy file"), None);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn npy_fortran_order() {
        use npyz::WriterBuilder;
        let p = tmp("fortran.npy");
        let file = std::fs::File::create(&p).unwrap();
        let mut w = npyz::WriteOptions::new()
            .default_dtype()
            .order(npyz::Order::Fortran)
            .shape(&[2, 3])
            .writer(file)
            .begin_nd()
            .unwrap();
        // Column-major data of [[1, 2, 3], [4, 5, 6]].
        w.extend([1i64, 4, 2, 5, 3, 6]).unwrap();
        w.finish().unwrap();
        let r = call("load_npy", &[Value::Io, Value::str(p.as_str())]);
        let t = r.as_tuple().unwrap()[1].as_tensor().unwrap().clone();
        assert_eq!(
            t,
            Tensor::from_vec(vec![1i64, 2, 3, 4, 5, 6], &[2, 3]).unwrap()
        );
    }

    #[test]
    fn missing_files() {
        assert_eq!(
            call_err("load_npy", &[Value::Io, Value::str("/nonexistent/x.npy")]),
            "cannot read \"/nonexistent/x.npy\": no such file or directory"
        );
        assert!(call_err(
            "load_safetensors",
            &[Value::Io, Value::str("/nonexistent/m.safetensors")]
        )
        .starts_with("cannot read \"/nonexistent/m.safetensors\""));
        assert!(call_err(
            "save_npy",
            &[
                Value::Io,
                Value::str("/nonexistent/x.npy"),
                v(Tensor::scalar_f32(1.0))
            ]
        )
        .starts_with("cannot write \"/nonexistent/x.npy\""));
        let p = tmp("garbage.npy");
        std::fs::write(&p, b"not an npy file").unwrap();
        assert!(
            call_err("load_npy", &[Value::Io, Value::str(p.as_str())]).starts_with("cannot read")
        );
        assert!(
            call_err("load_safetensors", &[Value::Io, Value::str(p.as_str())])
                .starts_with("cannot read")
        );
    }

    #[test]
    fn safetensors_round_trip() {
        let model = Value::record(vec![
            (
                "layer2",
                Value::record(vec![
                    (
                        "w",
                        v(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap()),
                    ),
                    ("b", v(Tensor::vector(vec![0.5f32, -0.5]))),
                ]),
            ),
            (
                "layer1",
                Value::record(vec![("w", v(Tensor::scalar_f64(3.0)))]),
            ),
            (
                "state",
                Value::tuple(vec![
                    v(Tensor::vector(vec![1i64, 2])),
                    v(Tensor::vector(vec![true])),
                ]),
            ),
            ("step", v(Tensor::scalar_i32(7))),
            ("bytes", v(Tensor::vector(vec![1u8, 2]))),
        ]);
        let p = tmp("model.safetensors");
        let io = call(
            "save_safetensors",
            &[Value::Io, Value::str(p.as_str()), model.clone()],
        );
        assert_eq!(io, Value::Io);
        let r = call("load_safetensors", &[Value::Io, Value::str(p.as_str())]);
        assert_eq!(r, Value::tuple(vec![Value::Io, model.clone()]));
        // Field order survives, even though the file sorts tensors.
        assert_eq!(r.as_tuple().unwrap()[1].to_string(), model.to_string());
        let bad = Value::record(vec![("f", Value::str("x"))]);
        assert!(call_err(
            "save_safetensors",
            &[Value::Io, Value::str(p.as_str()), bad]
        )
        .contains("expected a record of tensors, got string at `f`"));
    }
}
