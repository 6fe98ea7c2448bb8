//! Go's stack switches: where a walk of a Go program's stack ends.
//!
//! The Go runtime runs some code on another stack than the goroutine's:
//! `runtime.systemstack` and `runtime.mcall` switch to the thread's system
//! stack (the scheduler, the garbage collector), `runtime.asmcgocall` to
//! it for C code, `runtime.morestack` to grow a goroutine's stack. Each
//! moves the stack pointer in a way its unwind table does not describe
//! (Go's linker marks them as writing SP), and on the system stack the
//! caller's frame is not above theirs: read by the table, the "caller"
//! was stale stack data, a function that called nothing there
//! (`runtime.newproc` above the garbage collector's `systemstack`) or an
//! address in no code. Go's own tracebacks stop at these functions, and
//! so does a walk: the frame is kept and the stack ends there, cleanly.
//! (Go's profiler goes on through the goroutine the switch came from,
//! through runtime data on the heap, which a stack copy does not hold.)
//!
//! The functions are found by name in the image's symbols or, analyzed
//! elsewhere, in the frame table the trace carries, for images that read
//! `.debug_frame` (Go's linker writes it; the analyzer makes it for a
//! stripped Go binary).

use crate::image::ImageData;
use std::ops::Range;

/// The Go runtime functions that switch stacks, as named without an ABI
/// suffix (`.abi0`).
const STACK_SWITCHES: [&str; 6] = [
    "runtime.systemstack",
    "runtime.mcall",
    "runtime.asmcgocall",
    "runtime.asmcgocall_no_g",
    "runtime.morestack",
    "runtime.cgocallback",
];

fn switches_stacks(name: &str) -> bool {
    let name = name.strip_suffix(".abi0").unwrap_or(name);
    STACK_SWITCHES.contains(&name)
}

/// SVMA ranges of the stack-switching functions of a Go image: whole
/// functions from its symbols, single lookup addresses from its frame
/// table. Empty for other images.
pub(crate) fn stack_switches(data: &ImageData) -> Vec<Range<u64>> {
    let reads_debug_frame = data.section(".debug_frame").is_some_and(|s| s.has_bytes());
    if !reads_debug_frame || data.is_macho {
        return Vec::new();
    }
    let mut found = Vec::new();
    if !data.symbols.is_empty() {
        let table = data.symbols.table();
        for (i, s) in table.iter().enumerate() {
            if !switches_stacks(&s.name) {
                continue;
            }
            let end = match s.size {
                0 => table.get(i + 1).map_or(s.svma, |next| next.svma),
                size => s.svma.saturating_add(size),
            };
            found.push(s.svma..end.max(s.svma + 1));
        }
    }
    if let Some(frames) = &data.frames {
        for (address, lines) in frames.entries() {
            if lines.iter().any(|l| switches_stacks(&l.function)) {
                found.push(*address..address.saturating_add(1));
            }
        }
    }
    found
}

/// Whether `lookup` (an instruction pointer, or a return address minus
/// one) is in one of the stack switches at AVMA `ranges`.
pub(crate) fn in_switch(ranges: &[Range<u64>], lookup: u64) -> bool {
    ranges.iter().any(|r| r.contains(&lookup))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_with_or_without_the_abi_suffix() {
        assert!(switches_stacks("runtime.systemstack"));
        assert!(switches_stacks("runtime.systemstack.abi0"));
        assert!(switches_stacks("runtime.asmcgocall"));
        assert!(!switches_stacks("runtime.systemstack_switch"));
        assert!(!switches_stacks("main.systemstack"));
        assert!(!switches_stacks("runtime.newproc"));
    }
}
