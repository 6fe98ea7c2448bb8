//! Why a program's allocations may escape the sampler, told before it is
//! launched: a statically linked program has no dynamic loader to preload
//! anything, one that defines `malloc` itself is found before the sampler
//! in symbol lookup, and one with its own allocator (linked in under other
//! names) never calls `malloc` for most of its memory.

use object::read::elf::{ElfFile64, ProgramHeader};
use object::{Object, ObjectSymbol, ReadCache};
use std::path::Path;

/// Entry points of allocators that programs link in under their own names.
const OWN_ALLOCATORS: &[(&str, &str)] = &[
    ("mi_malloc", "mimalloc"),
    ("je_malloc", "jemalloc"),
    ("_rjem_malloc", "jemalloc"),
    ("tc_malloc", "tcmalloc"),
    ("rpmalloc", "rpmalloc"),
    ("sn_malloc", "snmalloc"),
];

/// The allocator of Go programs, as [`Escape::OwnAllocator`] names it.
const GO_HEAP: &str = "the Go runtime's garbage-collected heap";

/// What stops the sampler from seeing some or all of a program's
/// allocations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Escape {
    /// No `PT_INTERP`: nothing is preloaded, nothing is sampled.
    StaticallyLinked,
    /// A 32-bit program, whose dynamic loader cannot load the 64-bit
    /// sampler: nothing is sampled.
    ThirtyTwoBit,
    /// The program's own `malloc` is found first: nothing is sampled.
    OwnMalloc,
    /// An allocator linked in under other names: what it hands out is
    /// not sampled.
    OwnAllocator(&'static str),
}

impl Escape {
    /// What happens and why, following the program's name in a warning.
    pub fn reason(&self) -> String {
        match self {
            Escape::StaticallyLinked => {
                "is statically linked: no allocation will be recorded (the \
                                         allocation sampler is loaded by the dynamic loader, \
                                         which a static program does not run)"
                    .into()
            }
            Escape::ThirtyTwoBit => "is a 32-bit program: no allocation will be recorded (the \
                                     allocation sampler is a 64-bit library, which the dynamic \
                                     loader of a 32-bit program cannot load)"
                .into(),
            Escape::OwnMalloc => "defines malloc itself: no allocation will be recorded (its own \
                                  malloc is found before the allocation sampler's)"
                .into(),
            Escape::OwnAllocator(name) => format!(
                "has its own allocator ({name}): only allocations made through malloc will be \
                 recorded, not those made through {name}"
            ),
        }
    }
}

/// Look at the ELF file `program` for an [`Escape`]. Anything that is not
/// an ELF file (a script, which starts a dynamic interpreter) or cannot be
/// read gives `None`.
pub(crate) fn check(program: &Path) -> Option<Escape> {
    let file = std::fs::File::open(program).ok()?;
    let cache = ReadCache::new(file);
    if object::FileKind::parse(&cache).ok()? == object::FileKind::Elf32 {
        return Some(Escape::ThirtyTwoBit);
    }
    let elf = ElfFile64::<object::Endianness, _>::parse(&cache).ok()?;
    let endian = elf.endian();
    let has_interp = elf
        .elf_program_headers()
        .iter()
        .any(|ph| ph.p_type(endian) == object::elf::PT_INTERP);
    if !has_interp {
        return Some(Escape::StaticallyLinked);
    }
    let defined = |name: &str| {
        elf.symbols()
            .chain(elf.dynamic_symbols())
            .any(|s| s.is_definition() && s.name() == Ok(name))
    };
    if defined("malloc") {
        return Some(Escape::OwnMalloc);
    }
    // A Go program linked with C code (cgo) is dynamic, and its C code
    // calls malloc; Go's own allocations come from its garbage-collected
    // heap. Its function table (kept when stripped) says it is Go.
    if elf.section_by_name(".gopclntab").is_some() {
        return Some(Escape::OwnAllocator(GO_HEAP));
    }
    OWN_ALLOCATORS
        .iter()
        .find(|(symbol, _)| defined(symbol))
        .map(|(_, name)| Escape::OwnAllocator(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_program_without_its_own_allocator_is_fine() {
        assert_eq!(check(Path::new("/bin/sh")), None);
        assert_eq!(check(Path::new("/nonexistent")), None);
        // This test binary: dynamic, Rust's allocator is malloc.
        assert_eq!(check(&std::env::current_exe().unwrap()), None);
    }

    #[test]
    fn a_32_bit_program_is_named() {
        let dir = std::env::temp_dir().join(format!("lrnprof-test-elf32-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("elf32");
        // An ELF identification: 32-bit, little endian, version 1.
        let mut bytes = vec![0x7f, b'E', b'L', b'F', 1, 1, 1];
        bytes.resize(64, 0);
        std::fs::write(&path, bytes).unwrap();
        let found = check(&path);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found, Some(Escape::ThirtyTwoBit));
        assert!(Escape::ThirtyTwoBit.reason().contains("32-bit"));
    }

    #[test]
    fn reasons_say_what_is_recorded() {
        assert!(Escape::StaticallyLinked
            .reason()
            .contains("statically linked"));
        assert!(Escape::OwnAllocator("mimalloc")
            .reason()
            .contains("mimalloc"));
    }
}
