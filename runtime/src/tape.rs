//! Reverse mode's stack of backpropagators, stored as a tape.
//!
//! A reversed loop pushes, at every step, the backpropagator of that step:
//! a function of the cotangent, which reads the values the step saved.
//! Built from tuples and closures, the stack is a linked list
//! `(B_n, (B_n-1, .. ()))` whose every cell costs a closure (and the vector
//! of its captures) and a tuple. A [`Tape`] holds the same stack as two
//! vectors: the saved values, one record after another, and per record the
//! code that reads them (which says what the record's values are: its
//! "type") and where its values start. Pushing appends to both; popping
//! gives the tape one record shorter, over the same buffer. No closure is
//! made until something asks for the top as a value; the VM calls the top
//! record directly ([`crate::vm::Instr::CallFirst`]).
//!
//! A tape is a value like any other: `tuple_len` and `tuple_get` see the
//! list it stands for (length 2 unless empty; element 0 the top function,
//! element 1 the rest). Popping does not destroy, so a backpropagator may
//! run twice. Pushing onto a tape that is not the whole buffer (a shorter
//! tape over a buffer that has grown since) copies the records it has
//! first, so no value ever sees another's pushes.
//!
//! [`Tape`] itself is defined in `value.rs` (a value holds a tape, and a
//! tape holds values); this module re-exports it with the kernel
//! [`tape_new`].

use crate::kernels::ctx::Ctx;
use crate::value::Value;
pub use crate::value::{tape_growths, Tape, TapeHint};

/// The most records and values [`tape_new`] makes room for up front.
const AHEAD_RECORDS: usize = 1 << 22;
const AHEAD_VALUES: usize = 1 << 24;

/// `tape_new(start, bound, records_per_trip, values_per_trip)`: an empty
/// tape with room for a loop that counts from `start` up to `bound` (by
/// one; numbers of any dtype, or no room when they are not numbers) and
/// pushes at most that many records and values per trip, plus its exit's
/// record (bounded by [`AHEAD_RECORDS`] and [`AHEAD_VALUES`]).
pub fn tape_new(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, crate::RtError> {
    use crate::kernels::args::{arity, int};
    let op = "tape_new";
    arity(op, args, 4)?;
    // The counter may be a float stepped by 1 (`t = t + 1`): any numbers
    // give a size, anything else none.
    let num = |v: &Value| v.to_f64().filter(|x| x.is_finite());
    let trips = match (num(&args[0]), num(&args[1])) {
        // `as` saturates.
        (Some(start), Some(bound)) if bound > start => (bound - start).ceil() as usize,
        _ => 0,
    };
    let per = |v: &Value, what| int(op, v, what).map(|n| n.max(0) as usize);
    let (records, values) = (per(&args[2], "records")?, per(&args[3], "values")?);
    let records = trips
        .saturating_mul(records)
        .saturating_add(1)
        .min(AHEAD_RECORDS);
    let values = trips
        .saturating_add(1)
        .saturating_mul(values)
        .min(AHEAD_VALUES);
    Ok(Tape::from_parts(
        Vec::with_capacity(records),
        Vec::with_capacity(values),
        None,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;
    use crate::value::CodeId;
    use std::sync::Arc;

    fn int(v: i64) -> Value {
        Value::Tensor(Tensor::scalar_i64(v))
    }

    fn top(t: &Value) -> (u32, Vec<i64>) {
        let Value::Tape(t) = t else { panic!("a tape") };
        t.with_top(|c, vs| (c.0, vs.iter().map(|v| v.to_i64().unwrap()).collect()))
            .expect("not empty")
    }

    fn rest(t: &Value) -> Value {
        let Value::Tape(t) = t else { panic!("a tape") };
        Value::Tape(t.rest())
    }

    #[test]
    fn pushes_and_pops_in_order() {
        let hint = Arc::new(TapeHint::default());
        let mut s = Value::unit();
        for i in 0..5 {
            let caps: Vec<Value> = (0..i).map(int).collect();
            s = Tape::push(&s, CodeId(i as u32), caps.into_iter(), &hint).unwrap();
        }
        for i in (0..5).rev() {
            assert_eq!(top(&s), (i as u32, (0..i).collect()));
            s = rest(&s);
        }
        let Value::Tape(t) = &s else { panic!() };
        assert!(t.is_empty());
        assert!(t.top().is_none());
    }

    #[test]
    fn a_shorter_tape_pushed_again_does_not_disturb_the_longer() {
        let hint = Arc::new(TapeHint::default());
        let a = Tape::push(&Value::unit(), CodeId(1), [int(10)].into_iter(), &hint).unwrap();
        let b = Tape::push(&a, CodeId(2), [int(20), int(21)].into_iter(), &hint).unwrap();
        // Push onto `a` again: a branch of its own.
        let c = Tape::push(&a, CodeId(3), [int(30)].into_iter(), &hint).unwrap();
        assert_eq!(top(&b), (2, vec![20, 21]));
        assert_eq!(top(&c), (3, vec![30]));
        assert_eq!(top(&rest(&c)), (1, vec![10]));
        assert_eq!(top(&rest(&b)), (1, vec![10]));
    }

    #[test]
    fn a_dropped_tape_sizes_the_next() {
        let hint = Arc::new(TapeHint::default());
        let mut s = Value::unit();
        for i in 0..100 {
            s = Tape::push(&s, CodeId(0), [int(i), int(i)].into_iter(), &hint).unwrap();
        }
        drop(s);
        assert_eq!(hint.get(), (100, 200));
    }

    #[test]
    fn a_new_tape_has_room_for_its_trips() {
        let mut cx = crate::kernels::testing::TestCtx::default();
        let args = [int(3), int(103), int(2), int(5)];
        let mut s = tape_new(&mut cx, &args).unwrap();
        let hint = Arc::new(TapeHint::default());
        let before = tape_growths();
        for i in 0..201 {
            let caps: Vec<Value> = (0..if i % 2 == 0 { 5 } else { 0 }).map(int).collect();
            s = Tape::push(&s, CodeId(0), caps.into_iter(), &hint).unwrap();
        }
        assert_eq!(tape_growths(), before);
        Tape::push(&s, CodeId(0), [int(1)].into_iter(), &hint).unwrap();
        assert_eq!(tape_growths(), before + 1);
        // A loop that does not run: room for its exit only.
        let none = tape_new(&mut cx, &[int(5), int(2), int(2), int(5)]).unwrap();
        let Value::Tape(t) = none else { panic!() };
        assert!(t.is_empty());
        // A float counter, and a bound that is not a number.
        let f = |x: f64| Value::Tensor(Tensor::scalar(x));
        assert!(tape_new(&mut cx, &[f(0.5), f(10.0), int(1), int(1)]).is_ok());
        assert!(tape_new(&mut cx, &[f(0.5), Value::unit(), int(1), int(1)]).is_ok());
        assert!(tape_new(&mut cx, &[f(0.0), f(f64::INFINITY), int(1), int(1)]).is_ok());
    }

    /// Random pushes onto, and pops of, any stack made so far agree with
    /// a model that copies every list: no tape sees another's pushes.
    #[test]
    fn random_pushes_and_pops_match_a_copying_model() {
        let hint = Arc::new(TapeHint::default());
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        // Each stack as a tape value and as the model's list of records
        // (code, values), oldest first.
        type Model = Vec<(u32, Vec<i64>)>;
        let mut stacks: Vec<(Value, Model)> = vec![(Value::unit(), Vec::new())];
        for step in 0..4000 {
            let (v, model) = stacks[next(stacks.len())].clone();
            if next(3) == 0 {
                // Pop (the rest of an empty stack is itself).
                let Value::Tape(t) = &v else { continue };
                let mut rest = model.clone();
                rest.pop();
                stacks.push((Value::Tape(t.rest()), rest));
            } else {
                let vals: Vec<i64> = (0..next(4)).map(|k| (step * 10 + k) as i64).collect();
                let code = next(5) as u32;
                let pushed = Tape::push(&v, CodeId(code), vals.iter().map(|x| int(*x)), &hint)
                    .expect("a tape or unit");
                let mut m = model.clone();
                m.push((code, vals));
                stacks.push((pushed, m));
            }
            if stacks.len() > 64 {
                stacks.remove(next(stacks.len()));
            }
        }
        for (v, model) in &stacks {
            let mut v = v.clone();
            for want in model.iter().rev() {
                assert_eq!(&top(&v), want);
                v = rest(&v);
            }
            if let Value::Tape(t) = &v {
                assert!(t.is_empty());
            }
        }
    }

    #[test]
    fn only_tapes_and_unit_take_pushes() {
        let hint = Arc::new(TapeHint::default());
        let cell = Value::tuple(vec![int(1), Value::unit()]);
        assert!(Tape::push(&cell, CodeId(0), std::iter::empty(), &hint).is_none());
    }
}
