//! The address spaces a code address can be in, one type each, so that a
//! value of one is never taken for another (framehop's words: AVMA, SVMA).

/// An actual virtual memory address: where code was in the recorded
/// process (instruction pointers, return addresses, JIT maps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Avma(pub u64);

/// A stated virtual memory address: where code is in its image file's own
/// address space, the one its symbols and DWARF use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Svma(pub u64);

/// A byte offset into an image file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct FileOffset(pub u64);
