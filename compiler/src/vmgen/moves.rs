//! Memory planning for the VM's code.
//!
//! A code object is straight-line: each instruction reads slots written
//! before it (calls and branches are instructions that return). So the
//! last instruction to read a slot is known when the code is compiled:
//! that read becomes a [`Operand::Move`], which takes the value out of the
//! frame. A tensor is then released as soon as the last operation that
//! needs it is done (not when the function returns), the allocator hands
//! its memory to the next tensor of that size, and a kernel that receives
//! the only reference to a buffer may write its result over it (fused
//! element-wise kernels do: `fuse::FusedKernel`).
//!
//! The effect is measured by `adjoint run --stats`, which reports the
//! peak of heap memory while the program runs (see `docs/benchmarks.md`).

use adjoint_runtime::vm::{Code, Instr, Operand};

/// Turns the last read of every slot in `code` into a move.
pub fn move_last_uses(code: &mut Code) {
    let mut last: Vec<Option<(usize, usize)>> = vec![None; code.n_slots as usize];
    let n = code.instrs.len();
    for (i, instr) in code.instrs.iter_mut().enumerate() {
        for (k, op) in operands(instr).into_iter().enumerate() {
            if let Some(s) = op.slot() {
                last[s as usize] = Some((i, k));
            }
        }
    }
    let ends_in_call = matches!(code.instrs.last(), Some(Instr::TailCall { .. }));
    if !ends_in_call {
        if let Some(s) = code.ret.slot() {
            // Read after every instruction.
            last[s as usize] = Some((n, 0));
        }
    }
    for (s, at) in last.iter().enumerate() {
        let Some((i, k)) = *at else {
            continue;
        };
        let op = if i == n {
            &mut code.ret
        } else {
            operands(&mut code.instrs[i])
                .into_iter()
                .nth(k)
                .expect("operand")
        };
        if *op == Operand::Slot(s as u32) {
            *op = Operand::Move(s as u32);
        }
    }
}

/// The operands of an instruction, in the order the VM reads them.
fn operands(instr: &mut Instr) -> Vec<&mut Operand> {
    match instr {
        Instr::Prim { args, .. } | Instr::Native { args, .. } => args.iter_mut().collect(),
        Instr::Switch { cond, a, b, .. } => vec![cond, a, b],
        Instr::MakeClosure { captures, .. } => captures.iter_mut().collect(),
        Instr::TapePush {
            stack, captures, ..
        } => {
            let mut v = vec![stack];
            v.extend(captures.iter_mut());
            v
        }
        Instr::CallFirst { of, args, .. } => {
            let mut v = vec![of];
            v.extend(args.iter_mut());
            v
        }
        Instr::Call { callee, args, .. } | Instr::TailCall { callee, args, .. } => {
            let mut v = vec![callee];
            v.extend(args.iter_mut());
            v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use adjoint_runtime::kernels;

    fn prim(dst: u32, args: Vec<Operand>) -> Instr {
        Instr::Prim {
            dst,
            name: "add",
            kernel: kernels::lookup("add").expect("add"),
            inplace: None,
            args,
            loc: 0,
            batch: adjoint_runtime::batch::BatchRule::Elementwise,
        }
    }

    #[test]
    fn last_reads_move_and_earlier_ones_copy() {
        use Operand::{Const, Move, Slot};
        // s2 = s0 + s1; s3 = s2 + s0; s4 = s3 + s3; return s4
        let mut code = Code {
            name: "f".into(),
            n_params: 2,
            n_captures: 0,
            n_slots: 5,
            consts: Vec::new(),
            instrs: vec![
                prim(2, vec![Slot(0), Slot(1)]),
                prim(3, vec![Slot(2), Slot(0)]),
                prim(4, vec![Slot(3), Slot(3), Const(0)]),
            ],
            ret: Slot(4),
            extra_args: false,
        };
        move_last_uses(&mut code);
        let args: Vec<Vec<Operand>> = code
            .instrs
            .iter()
            .map(|i| match i {
                Instr::Prim { args, .. } => args.clone(),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(args[0], vec![Slot(0), Move(1)]);
        assert_eq!(args[1], vec![Move(2), Move(0)]);
        // The second read of s3 in one instruction is the last.
        assert_eq!(args[2], vec![Slot(3), Move(3), Const(0)]);
        assert_eq!(code.ret, Move(4));
    }

    #[test]
    fn a_tail_call_keeps_its_reads_and_has_no_return_read() {
        use Operand::{Move, Slot};
        let mut code = Code {
            name: "loop".into(),
            n_params: 2,
            n_captures: 0,
            n_slots: 3,
            consts: Vec::new(),
            instrs: vec![
                prim(2, vec![Slot(1), Slot(1)]),
                Instr::TailCall {
                    callee: Slot(0),
                    args: vec![Slot(2), Slot(0)],
                    loc: 0,
                },
            ],
            ret: Slot(0),
            extra_args: false,
        };
        move_last_uses(&mut code);
        match &code.instrs[1] {
            Instr::TailCall { callee, args, .. } => {
                assert_eq!(*callee, Slot(0));
                assert_eq!(args, &vec![Move(2), Move(0)]);
            }
            _ => unreachable!(),
        }
        assert_eq!(code.ret, Slot(0));
    }
}
