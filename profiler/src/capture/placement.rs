//! Where a function's probes cost least. The kernel's x86 uprobe code emulates a few
//! instructions (`push` of a register, relative `jmp`/`jcc`/`call`, `nop`) right in the trap and
//! single-steps every other one out of line, which on a virtual machine costs ten times as much
//! (10–30 µs per hit against 1–2 µs). Open MPI's MPI_Test, MPI_Waitall and MPI_Finalize start
//! with a RIP-relative `mov`, so a probe on their first instruction is single-stepped on every
//! call, and polling codes call MPI_Test millions of times.
//!
//! An entry probe and its return probe can move from the first instruction to a later one of
//! the entry block when what runs before it leaves what both probes read untouched: the return
//! probe takes the return address from the top of the stack (so nothing before may move the
//! stack pointer), and the entry probe reads the arguments (so nothing before may write an
//! argument register) and recognises MPI_COMM_WORLD from the probe's address (which the caller
//! accounts for). Every call must reach the new point exactly once: no branch before it, and no
//! branch of the function may land between the entry and it.

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, OpAccess,
    Register,
};

/// Registers a skipped instruction must not write: the stack pointer and the six argument
/// registers of the System V x86-64 calling convention.
const KEPT: [Register; 7] = [
    Register::RSP,
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::RCX,
    Register::R8,
    Register::R9,
];

/// The file offset where the probes of the function whose code is `code`, starting at file
/// offset `start`, cost least: `start` when its first instruction is emulated or no later one
/// qualifies, else the first emulated instruction of the entry block that every call reaches
/// once with the stack pointer and the arguments as they were at the entry.
pub fn probe_offset(code: &[u8], start: u64) -> u64 {
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut instruction = Instruction::default();
    while decoder.can_decode() {
        let at = decoder.position();
        decoder.decode_out(&mut instruction);
        if instruction.is_invalid() {
            return start;
        }
        if emulated(&instruction, &code[at..at + instruction.len()]) {
            let offset = instruction.ip();
            return if offset == start || no_branch_lands_up_to(code, start, offset) {
                offset
            } else {
                start
            };
        }
        if instruction.flow_control() != FlowControl::Next || !harmless(&instruction, &mut info) {
            return start;
        }
    }
    start
}

/// Whether the kernel's uprobe code emulates this instruction (arch/x86/kernel/uprobes.c:
/// `branch_setup_xol_ops` for relative branches and `nop`, `push_setup_xol_ops` for `push` of a
/// 64-bit register without prefixes other than REX.B).
fn emulated(instruction: &Instruction, bytes: &[u8]) -> bool {
    match instruction.code() {
        Code::Push_r64 => matches!(bytes, [0x50..=0x57] | [0x41, 0x50..=0x57]),
        Code::Jmp_rel8_64 | Code::Jmp_rel32_64 | Code::Call_rel32_64 => true,
        _ if instruction.is_jcc_short_or_near() => true,
        _ => bytes == [0x90],
    }
}

/// Whether running `instruction` before the probes leaves them the entry's view: no write to
/// memory (the stack's return address among it) and none to the stack pointer or an argument
/// register.
fn harmless(instruction: &Instruction, info: &mut InstructionInfoFactory) -> bool {
    let info = info.info(instruction);
    let writes = |access: OpAccess| {
        !matches!(
            access,
            OpAccess::Read | OpAccess::CondRead | OpAccess::NoMemAccess | OpAccess::None
        )
    };
    info.used_memory().iter().all(|m| !writes(m.access()))
        && info
            .used_registers()
            .iter()
            .all(|r| !writes(r.access()) || !KEPT.contains(&r.register().full_register()))
}

/// Whether no branch of the function lands in (start, offset]: every call then runs the
/// instruction at `offset` once, and only as the first pass through the entry block. All of the
/// function's branches count, since a loop may jump back to just past its first instruction.
fn no_branch_lands_up_to(code: &[u8], start: u64, offset: u64) -> bool {
    Decoder::with_ip(64, code, start, DecoderOptions::NONE)
        .iter()
        .all(|i| {
            let target = i.near_branch_target();
            i.is_invalid() || target == 0 || !(start < target && target <= offset)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_that_starts_with_push_is_probed_at_its_entry() {
        // push r15; push r14; mov r12,rdx; ret
        let code = [0x41, 0x57, 0x41, 0x56, 0x49, 0x89, 0xd4, 0xc3];
        assert_eq!(probe_offset(&code, 0x1000), 0x1000);
    }

    #[test]
    fn a_rip_relative_load_first_moves_the_probes_to_the_first_push() {
        // Open MPI's MPI_Test: mov rax,[rip+0x8a001]; push r12; mov r12,rdi; ret
        let code = [
            0x48, 0x8b, 0x05, 0x01, 0xa0, 0x08, 0x00, 0x41, 0x54, 0x49, 0x89, 0xfc, 0xc3,
        ];
        assert_eq!(probe_offset(&code, 0x91600), 0x91607);
    }

    #[test]
    fn a_branch_into_the_entry_block_keeps_the_probes_at_the_entry() {
        // mov rax,[rip+0]; push r12; jmp back to the push (a loop to the second instruction).
        let code = [0x48, 0x8b, 0x05, 0, 0, 0, 0, 0x41, 0x54, 0xeb, 0xfc];
        assert_eq!(probe_offset(&code, 0), 0);
    }

    #[test]
    fn the_first_branch_of_the_entry_block_is_emulated_and_may_hold_the_probes() {
        // mov rax,[rip+0]; cmp byte [rax],0; je +2; ud2; ud2 (Open MPI's MPI_Finalize's shape)
        let code = [
            0x48, 0x8b, 0x05, 0, 0, 0, 0, 0x80, 0x38, 0x00, 0x74, 0x02, 0x0f, 0x0b, 0x0f, 0x0b,
        ];
        assert_eq!(probe_offset(&code, 0), 10);
    }

    #[test]
    fn a_write_to_an_argument_or_the_stack_keeps_the_probes_at_the_entry() {
        // mov rdi,[rip+0]; push r12 (the first argument is overwritten)
        assert_eq!(
            probe_offset(&[0x48, 0x8b, 0x3d, 0, 0, 0, 0, 0x41, 0x54], 0),
            0
        );
        // sub rsp,8; push r12 (the return address is no longer on top)
        assert_eq!(probe_offset(&[0x48, 0x83, 0xec, 0x08, 0x41, 0x54], 0), 0);
        // mov [rsp],rax; push r12 (the return address is overwritten)
        assert_eq!(probe_offset(&[0x48, 0x89, 0x04, 0x24, 0x41, 0x54], 0), 0);
    }

    #[test]
    fn a_return_before_any_emulated_instruction_keeps_the_probes_at_the_entry() {
        // xor eax,eax; ret
        assert_eq!(probe_offset(&[0x31, 0xc0, 0xc3], 0x20), 0x20);
    }
}
