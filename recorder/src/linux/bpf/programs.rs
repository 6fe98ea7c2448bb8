//! The three tracepoint programs behind `--syscall-stack-every N`, built
//! instruction by instruction ([`super::insn`]).
//!
//! Maps (all hashes; see [`super::layout`] for the byte layouts):
//! - targets: tgid -> state (0: launched, waiting for its `execve`;
//!   1: traced). Processes not in it are left alone: the programs return 1
//!   for them, so perf records their events as if no program were there.
//! - inflight: tid -> the call the thread is in (entry time, number,
//!   flags: [`FLAG_SAMPLED`], [`FLAG_TALLIED`]).
//! - tally: (tid, nr) -> counts of every call, and of the sampled ones.
//!
//! A tracepoint program's return value decides whether perf records the
//! event: 0 drops it before any perf work, which is where the time goes.
//! `sys_enter` counts the call and returns 1 for the first call of each
//! (thread, syscall) and then every Nth; `sys_exit` tallies its return and
//! duration and returns what its entry returned, so samples come in pairs.
//! A call the programs cannot tally (a map full) is recorded (return 1)
//! and not counted, which keeps "tallies + samples - sampled tallies"
//! exact. `sched_process_fork` adds the children of traced processes.

use super::insn::{
    alu_imm, alu_reg, call, exit, jump, jump_imm, jump_reg, load, load_map_fd, mov_imm, mov_reg,
    store_imm, store_reg, Alu, Cond, Helper, Insn, Program, Size, R0, R1, R10, R2, R3, R4, R6, R7,
    R8, R9,
};
use super::layout::{inflight, tally, TALLY_VALUE_LEN};

/// The call's entry was recorded as a sample (perf records its exit too).
pub(crate) const FLAG_SAMPLED: i32 = 1;
/// The call was counted in the tally map.
pub(crate) const FLAG_TALLIED: i32 = 2;

/// `BPF_NOEXIST`: create only.
const NOEXIST: i32 = 1;

/// Where things are: map file descriptors and payload offsets (from the
/// tracepoints' `format` files).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProgramSettings {
    pub targets: i32,
    pub inflight: i32,
    pub tally: i32,
    /// `sys_enter`'s `id`.
    pub enter_id: i16,
    /// `sys_exit`'s `id` and `ret`.
    pub exit_id: i16,
    pub exit_ret: i16,
    /// `sched_process_fork`'s `child_pid`.
    pub fork_child_pid: i16,
    /// One call in this many per (thread, syscall) is sampled (> 1).
    pub every: u32,
    /// `execve` and `execveat` on this architecture: a launched command is
    /// traced from its first successful one.
    pub execve: [u32; 2],
}

// The stack frame (offsets from R10).
/// u32: a tgid, the targets key.
const FP_TGID: i16 = -8;
/// The tally key: u32 tid, u32 nr.
const FP_TALLY_KEY: i16 = -16;
/// u32: a tid, the inflight key.
const FP_TID: i16 = -24;
/// The inflight value (16 bytes).
const FP_INFLIGHT: i16 = -40;
/// A zero tally value to create entries with.
const FP_ZERO_TALLY: i16 = FP_INFLIGHT - TALLY_VALUE_LEN as i16;

/// `dst = &map`, as a chain of two instructions.
fn map(dst: super::insn::Reg, fd: i32) -> [Insn; 2] {
    load_map_fd(dst, fd)
}

/// `R1 = map; R2 = R10 + key_at`, ready for a lookup.
fn lookup(p: &mut Program, fd: i32, key_at: i16) {
    p.push(map(R1, fd)).push([
        mov_reg(R2, R10),
        alu_imm(Alu::Add, R2, key_at.into()),
        call(Helper::MapLookupElem),
    ]);
}

/// `*(u64 *)(base + off) += src`.
fn add_to(p: &mut Program, base: super::insn::Reg, off: i16, src: super::insn::Reg) {
    p.push([
        load(Size::DW, R1, base, off),
        alu_reg(Alu::Add, R1, src),
        store_reg(Size::DW, base, off, R1),
    ]);
}

/// `*(u64 *)(base + off) += 1` (through R1 and R3).
fn increment(p: &mut Program, base: super::insn::Reg, off: i16) {
    p.push([mov_imm(R3, 1)]);
    add_to(p, base, off, R3);
}

/// The targets check every program starts with: R6 = ctx, R7 =
/// pid_tgid, R0 = the target's state pointer (jumps to `not_target`
/// when the process is not one).
fn target_check(p: &mut Program, s: &ProgramSettings, not_target: &'static str) {
    p.push([
        mov_reg(R6, R1),
        call(Helper::GetCurrentPidTgid),
        mov_reg(R7, R0),
        alu_imm(Alu::Rsh, R0, 32),
        store_reg(Size::W, R10, FP_TGID, R0),
    ]);
    lookup(p, s.targets, FP_TGID);
    p.jump_to(jump_imm(Cond::Eq, R0, 0, 0), not_target);
}

/// Labels of one use of [`write_inflight`].
struct InflightLabels {
    create: &'static str,
    written: &'static str,
    failed: &'static str,
}

/// Write the inflight entry {now, nr (R8), flags (R6)} for this thread
/// (R7): in place when the thread has one (no map update, no lock), else
/// created; jumps to `failed` when the map refuses.
fn write_inflight(p: &mut Program, s: &ProgramSettings, l: &InflightLabels) {
    p.push([
        call(Helper::KtimeGetNs),
        store_reg(Size::DW, R10, FP_INFLIGHT + inflight::ENTER_NS as i16, R0),
        store_reg(Size::W, R10, FP_TID, R7),
    ]);
    lookup(p, s.inflight, FP_TID);
    p.jump_to(jump_imm(Cond::Eq, R0, 0, 0), l.create)
        .push([
            load(Size::DW, R1, R10, FP_INFLIGHT + inflight::ENTER_NS as i16),
            store_reg(Size::DW, R0, inflight::ENTER_NS as i16, R1),
            store_reg(Size::W, R0, inflight::NR as i16, R8),
            store_reg(Size::W, R0, inflight::FLAGS as i16, R6),
        ])
        .jump_to(jump(0), l.written)
        .label(l.create)
        .push([
            store_reg(Size::W, R10, FP_INFLIGHT + inflight::NR as i16, R8),
            store_reg(Size::W, R10, FP_INFLIGHT + inflight::FLAGS as i16, R6),
        ])
        .push(map(R1, s.inflight))
        .push([
            mov_reg(R2, R10),
            alu_imm(Alu::Add, R2, FP_TID.into()),
            mov_reg(R3, R10),
            alu_imm(Alu::Add, R3, FP_INFLIGHT.into()),
            mov_imm(R4, 0),
            call(Helper::MapUpdateElem),
        ])
        .jump_to(jump_imm(Cond::Ne, R0, 0, 0), l.failed)
        .label(l.written);
}

/// The `raw_syscalls:sys_enter` program.
pub(crate) fn sys_enter(s: &ProgramSettings) -> Option<Vec<Insn>> {
    let mut p = Program::default();
    target_check(&mut p, s, "record");
    p.push([load(Size::W, R1, R0, 0)])
        // Launched, not exec'd yet: not the command's own calls.
        .jump_to(jump_imm(Cond::Eq, R1, 0, 0), "record")
        .push([
            load(Size::DW, R8, R6, s.enter_id),
            store_reg(Size::W, R10, FP_TALLY_KEY, R7),
            store_reg(Size::W, R10, FP_TALLY_KEY + 4, R8),
        ]);
    lookup(&mut p, s.tally, FP_TALLY_KEY);
    p.jump_to(jump_imm(Cond::Ne, R0, 0, 0), "have_tally");
    // This thread's first call of this syscall: a zero entry with its tgid.
    for word in 0..TALLY_VALUE_LEN as i16 / 8 {
        p.push([store_imm(Size::DW, R10, FP_ZERO_TALLY + 8 * word, 0)]);
    }
    p.push([
        mov_reg(R1, R7),
        alu_imm(Alu::Rsh, R1, 32),
        store_reg(Size::DW, R10, FP_ZERO_TALLY + tally::TGID as i16, R1),
    ])
    .push(map(R1, s.tally))
    .push([
        mov_reg(R2, R10),
        alu_imm(Alu::Add, R2, FP_TALLY_KEY.into()),
        mov_reg(R3, R10),
        alu_imm(Alu::Add, R3, FP_ZERO_TALLY.into()),
        mov_imm(R4, NOEXIST),
        call(Helper::MapUpdateElem),
    ]);
    lookup(&mut p, s.tally, FP_TALLY_KEY);
    p.jump_to(jump_imm(Cond::Eq, R0, 0, 0), "untallied");
    p.label("have_tally").push([
        mov_reg(R9, R0),
        // The ctx is read: R6 now holds the flags.
        load(Size::DW, R1, R9, tally::CALLS as i16),
        alu_imm(Alu::Mod, R1, s.every as i32),
        mov_imm(R6, FLAG_TALLIED | FLAG_SAMPLED),
        jump_imm(Cond::Eq, R1, 0, 1),
        mov_imm(R6, FLAG_TALLIED),
    ]);
    write_inflight(
        &mut p,
        s,
        &InflightLabels {
            create: "create_tallied",
            written: "written_tallied",
            failed: "record",
        },
    );
    increment(&mut p, R9, tally::CALLS as i16);
    p.push([mov_reg(R0, R6), alu_imm(Alu::And, R0, FLAG_SAMPLED)]);
    add_to(&mut p, R9, tally::SAMPLED_CALLS as i16, R0);
    p.push([exit()]);
    // The tally map is full: record the call, count it nowhere (its exit
    // must be recorded too, which the inflight flags say).
    p.label("untallied").push([mov_imm(R6, FLAG_SAMPLED)]);
    write_inflight(
        &mut p,
        s,
        &InflightLabels {
            create: "create_untallied",
            written: "written_untallied",
            failed: "record",
        },
    );
    p.label("record").push([mov_imm(R0, 1), exit()]);
    p.finish()
}

/// The `raw_syscalls:sys_exit` program.
pub(crate) fn sys_exit(s: &ProgramSettings) -> Option<Vec<Insn>> {
    let mut p = Program::default();
    target_check(&mut p, s, "record");
    p.push([load(Size::W, R1, R0, 0)])
        .jump_to(jump_imm(Cond::Ne, R1, 0, 0), "traced")
        // Launched, not exec'd yet: traced from a successful exec on.
        .push([load(Size::DW, R2, R6, s.exit_ret)])
        .jump_to(jump_imm(Cond::Ne, R2, 0, 0), "record")
        .push([load(Size::DW, R2, R6, s.exit_id)])
        .jump_to(jump_imm(Cond::Eq, R2, s.execve[0] as i32, 0), "exec")
        .jump_to(jump_imm(Cond::Ne, R2, s.execve[1] as i32, 0), "record")
        .label("exec")
        .push([store_imm(Size::W, R0, 0, 1)])
        .jump_to(jump(0), "record");
    p.label("traced")
        .push([store_reg(Size::W, R10, FP_TID, R7)]);
    lookup(&mut p, s.inflight, FP_TID);
    p.jump_to(jump_imm(Cond::Eq, R0, 0, 0), "record")
        .push([
            mov_reg(R8, R0),
            load(Size::DW, R1, R6, s.exit_id),
            load(Size::W, R2, R8, inflight::NR as i16),
        ])
        // Not the call the thread entered (it entered before the programs
        // were attached): recorded, counted nowhere.
        .jump_to(jump_reg(Cond::Ne, R1, R2, 0), "record")
        .push([
            // Consumed: a later exit cannot pair with this entry.
            store_imm(Size::W, R8, inflight::NR as i16, -1),
            store_reg(Size::W, R10, FP_TALLY_KEY, R7),
            store_reg(Size::W, R10, FP_TALLY_KEY + 4, R1),
            load(Size::W, R1, R8, inflight::FLAGS as i16),
            store_reg(Size::W, R10, FP_INFLIGHT + inflight::FLAGS as i16, R1),
        ])
        .jump_to(jump_imm(Cond::Set, R1, FLAG_TALLIED, 0), "tallied")
        .jump_to(jump(0), "record");
    p.label("tallied").push([
        call(Helper::KtimeGetNs),
        load(Size::DW, R1, R8, inflight::ENTER_NS as i16),
        alu_reg(Alu::Sub, R0, R1),
        mov_reg(R9, R0),
    ]);
    lookup(&mut p, s.tally, FP_TALLY_KEY);
    p.jump_to(jump_imm(Cond::Eq, R0, 0, 0), "record").push([
        mov_reg(R8, R0),
        // R2 = 1 if ret is in -4095..=-1 (unsigned: at least -4095).
        load(Size::DW, R3, R6, s.exit_ret),
        mov_imm(R2, 0),
        mov_imm(R4, -4095),
        jump_reg(Cond::Lt, R3, R4, 1),
        mov_imm(R2, 1),
    ]);
    increment(&mut p, R8, tally::FINISHED as i16);
    add_to(&mut p, R8, tally::ERRORS as i16, R2);
    add_to(&mut p, R8, tally::TOTAL_NS as i16, R9);
    p.push([
        load(Size::DW, R1, R8, tally::MAX_NS as i16),
        jump_reg(Cond::Gt, R1, R9, 1),
        store_reg(Size::DW, R8, tally::MAX_NS as i16, R9),
        load(Size::W, R0, R10, FP_INFLIGHT + inflight::FLAGS as i16),
        alu_imm(Alu::And, R0, FLAG_SAMPLED),
    ])
    .jump_to(jump_imm(Cond::Eq, R0, 0, 0), "done");
    increment(&mut p, R8, tally::SAMPLED_FINISHED as i16);
    add_to(&mut p, R8, tally::SAMPLED_ERRORS as i16, R2);
    add_to(&mut p, R8, tally::SAMPLED_NS as i16, R9);
    p.push([mov_imm(R0, 1)]);
    p.label("done").push([exit()]);
    p.label("record").push([mov_imm(R0, 1), exit()]);
    p.finish()
}

/// The `sched:sched_process_fork` program: runs in the parent before the
/// child does, and makes the child of a traced process a target (threads
/// too, harmlessly: their tid is never looked up as a tgid).
pub(crate) fn process_fork(s: &ProgramSettings) -> Option<Vec<Insn>> {
    let mut p = Program::default();
    target_check(&mut p, s, "out");
    p.push([load(Size::W, R1, R0, 0)])
        .jump_to(jump_imm(Cond::Eq, R1, 0, 0), "out")
        .push([
            load(Size::W, R1, R6, s.fork_child_pid),
            store_reg(Size::W, R10, FP_TGID, R1),
            store_imm(Size::W, R10, FP_TID, 1),
        ])
        .push(map(R1, s.targets))
        .push([
            mov_reg(R2, R10),
            alu_imm(Alu::Add, R2, FP_TGID.into()),
            mov_reg(R3, R10),
            alu_imm(Alu::Add, R3, FP_TID.into()),
            mov_imm(R4, 0),
            call(Helper::MapUpdateElem),
        ]);
    p.label("out").push([mov_imm(R0, 1), exit()]);
    p.finish()
}
