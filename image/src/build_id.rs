//! An image's identity: the GNU build-id note of an ELF image (lacking
//! one, Go's build ID note), the `LC_UUID` of a Mach-O image. Found through the program headers or the
//! load commands only, so reading a file touches a few hundred bytes of it,
//! whatever its size. An ELF image with no such note (linked with
//! `--build-id=none`, or by a linker that writes none by default) of at
//! most [`MAX_CONTENT_BYTES`] is identified by its content instead: a
//! content id ([`lrnprof_format::CONTENT_ID_PREFIX`]), for which the whole
//! file is read.

use lrnprof_format::{BuildId, CONTENT_ID_PREFIX};
use object::read::elf::{FileHeader, ProgramHeader};
use object::read::macho::MachHeader;
use object::{elf, FileKind, ReadCache, ReadRef};
use sha2::{Digest, Sha256};
use std::io::{Seek, SeekFrom};
use std::path::Path;

/// Largest image given a content id: the recorder reads such a file whole
/// when it first sees it mapped, while it records (SHA-256 of 64 MiB: a few
/// tens of ms).
pub const MAX_CONTENT_BYTES: u64 = 64 << 20;

/// Bound on the program header table and on a note segment: what a corrupt
/// header can make us read. Real ones are a few hundred bytes.
const MAX_NOTES_LEN: u64 = 1 << 16;

/// The build id of the ELF or thin Mach-O image `data` (the whole file, or
/// the vDSO read from memory): its GNU build-id note or its `LC_UUID`; for
/// an ELF image without a note, its content id. `None` if it is not such
/// an image, or a Mach-O image without `LC_UUID`.
pub fn build_id_of_bytes(data: &[u8]) -> Option<BuildId> {
    match noted_id(data)? {
        Noted::Id(id) => Some(BuildId(id)),
        Noted::ElfWithout if data.len() as u64 <= MAX_CONTENT_BYTES => {
            Some(content_id(Sha256::digest(data)))
        }
        Noted::ElfWithout => None,
    }
}

/// [`build_id_of_bytes`] for the file at `path`, reading only the headers
/// and the note segments, and for an ELF image without a note the whole
/// file. `None` if the file is unreadable, not an image, or a Mach-O image
/// without `LC_UUID`.
pub fn build_id_of_file(path: &Path) -> Option<BuildId> {
    let file = std::fs::File::open(path).ok()?;
    let cache = ReadCache::new(file);
    match noted_id(&cache)? {
        Noted::Id(id) => Some(BuildId(id)),
        Noted::ElfWithout => {
            let mut file = cache.into_inner();
            if file.metadata().ok()?.len() > MAX_CONTENT_BYTES {
                return None;
            }
            file.seek(SeekFrom::Start(0)).ok()?;
            let mut hasher = Sha256::new();
            std::io::copy(&mut file, &mut hasher).ok()?;
            Some(content_id(hasher.finalize()))
        }
    }
}

/// The id of an image that has no build id note: see
/// [`lrnprof_format::CONTENT_ID_PREFIX`].
fn content_id(sha256: impl AsRef<[u8]>) -> BuildId {
    let mut id = CONTENT_ID_PREFIX.to_vec();
    id.extend_from_slice(&sha256.as_ref()[..16]);
    BuildId(id)
}

/// What an image's headers say of its identity.
enum Noted {
    /// Its build id note or `LC_UUID`.
    Id(Vec<u8>),
    /// An ELF image without a build id note.
    ElfWithout,
}

fn noted_id<'data, R: ReadRef<'data>>(data: R) -> Option<Noted> {
    match FileKind::parse(data).ok()? {
        FileKind::Elf32 => elf_build_id::<elf::FileHeader32<object::Endianness>, R>(data),
        FileKind::Elf64 => elf_build_id::<elf::FileHeader64<object::Endianness>, R>(data),
        FileKind::MachO32 => {
            macho_uuid::<object::macho::MachHeader32<object::Endianness>, R>(data).map(Noted::Id)
        }
        FileKind::MachO64 => {
            macho_uuid::<object::macho::MachHeader64<object::Endianness>, R>(data).map(Noted::Id)
        }
        _ => None,
    }
}

/// Type of the note in which Go's linker writes a binary's build ID
/// (section `.note.go.buildid`, owner `Go`). Go's linker writes no GNU
/// build-id note unless asked to (`-ldflags=-B ...`).
const NT_GO_BUILD_ID: u32 = 4;

/// The descriptor of the first `NT_GNU_BUILD_ID` note named `GNU` in a
/// `PT_NOTE` segment; failing that, of the first Go build ID note (whose
/// descriptor is the ID's text, a hash of the binary's content), so that
/// Go binaries are identified, and their data embedded, too. `None` where
/// the headers do not parse or there are no program headers.
fn elf_build_id<'data, Elf: FileHeader, R: ReadRef<'data>>(data: R) -> Option<Noted> {
    let header = Elf::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let phnum = header.phnum(endian, data).ok()? as u64;
    let phentsize = u64::from(header.e_phentsize(endian));
    if phnum == 0 || phnum.saturating_mul(phentsize) > MAX_NOTES_LEN {
        return None;
    }
    let phdrs = header.program_headers(endian, data).ok()?;
    let mut go = None;
    // A note segment past the end of the data (a truncated file) or too
    // large to read, or a malformed note, may have held the id: such an
    // image gets no content id.
    let mut unread = false;
    let segments = phdrs.iter().filter(|ph| ph.p_type(endian) == elf::PT_NOTE);
    for ph in segments {
        if ph.p_filesz(endian).into() > MAX_NOTES_LEN {
            unread = true;
            continue;
        }
        let Ok(Some(mut notes)) = ph.notes(endian, data) else {
            unread = true;
            continue;
        };
        // A malformed note ends the search in its segment.
        loop {
            let note = match notes.next() {
                Ok(Some(note)) => note,
                Ok(None) => break,
                Err(_) => {
                    unread = true;
                    break;
                }
            };
            let (name, kind, desc) = (note.name(), note.n_type(endian), note.desc());
            if desc.is_empty() {
                continue;
            }
            if name == elf::ELF_NOTE_GNU && kind == elf::NT_GNU_BUILD_ID {
                return Some(Noted::Id(desc.to_vec()));
            }
            if name == b"Go" && kind == NT_GO_BUILD_ID && go.is_none() {
                go = Some(desc.to_vec());
            }
        }
    }
    match go {
        Some(id) => Some(Noted::Id(id)),
        None if unread => None,
        None => Some(Noted::ElfWithout),
    }
}

/// The `LC_UUID` of a thin Mach-O image.
fn macho_uuid<'data, Mach: MachHeader, R: ReadRef<'data>>(data: R) -> Option<Vec<u8>> {
    let header = Mach::parse(data, 0).ok()?;
    let endian = header.endian().ok()?;
    header.uuid(endian, data, 0).ok()?.map(|uuid| uuid.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal little-endian ELF64 image: header, one PT_NOTE program
    /// header, one note of `kind` named `note_name`.
    pub(crate) fn tiny_elf(note_name: &[u8; 4], kind: u32) -> Vec<u8> {
        elf_with_notes(&[(note_name, kind, [0xde, 0xad, 0xbe, 0xef])])
    }

    /// [`tiny_elf`] with these notes (name, type, 4-byte descriptor) in
    /// its one PT_NOTE segment.
    #[rustfmt::skip]
    fn elf_with_notes(notes: &[(&[u8; 4], u32, [u8; 4])]) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;                                            // ELFCLASS64
        b[5] = 1;                                            // little endian
        b[6] = 1;                                            // EV_CURRENT
        b[0x20..0x28].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        b[0x34..0x36].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
        b[0x36..0x38].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        b[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());  // e_phnum
        let mut ph = vec![0u8; 56];
        let size = 20 * notes.len() as u64;
        ph[..4].copy_from_slice(&elf::PT_NOTE.to_le_bytes()); // p_type
        ph[8..16].copy_from_slice(&120u64.to_le_bytes());    // p_offset
        ph[32..40].copy_from_slice(&size.to_le_bytes());     // p_filesz
        ph[48..56].copy_from_slice(&4u64.to_le_bytes());     // p_align
        b.extend(ph);
        for (name, kind, desc) in notes {
            b.extend(4u32.to_le_bytes());                    // namesz
            b.extend(4u32.to_le_bytes());                    // descsz
            b.extend(kind.to_le_bytes());                    // type
            b.extend(*name);                                 // name
            b.extend(desc);                                  // desc: the id
        }
        b
    }

    #[test]
    fn finds_the_gnu_build_id() {
        let id = build_id_of_bytes(&tiny_elf(b"GNU\0", elf::NT_GNU_BUILD_ID)).unwrap();
        assert_eq!(id.to_hex(), "deadbeef");
    }

    #[test]
    fn a_go_build_id_stands_in_for_a_missing_gnu_one() {
        let go = build_id_of_bytes(&tiny_elf(b"Go\0\0", NT_GO_BUILD_ID)).unwrap();
        assert_eq!(go.to_hex(), "deadbeef");
        // Whichever comes first, the GNU note wins.
        let (gnu, go) = (
            (b"GNU\0", elf::NT_GNU_BUILD_ID, [1, 2, 3, 4]),
            (b"Go\0\0", NT_GO_BUILD_ID, [5, 6, 7, 8]),
        );
        for notes in [[gnu, go], [go, gnu]] {
            let id = build_id_of_bytes(&elf_with_notes(&notes)).unwrap();
            assert_eq!(id.to_hex(), "01020304");
        }
    }

    /// Other notes are no build id: the image gets a content id, the
    /// same for the same bytes, another for other bytes, from a file as
    /// from memory.
    #[test]
    fn ignores_other_notes() {
        let other = [
            tiny_elf(b"GNU\0", 1),
            tiny_elf(b"Go\0\0", elf::NT_GNU_BUILD_ID),
            tiny_elf(b"GNU\0", NT_GO_BUILD_ID),
        ];
        let ids: Vec<BuildId> = other
            .iter()
            .map(|elf| build_id_of_bytes(elf).unwrap())
            .collect();
        for (id, elf) in ids.iter().zip(&other) {
            assert!(id.is_content_id(), "{id}");
            assert_eq!(&id.0[4..], &Sha256::digest(elf)[..16]);
        }
        assert_ne!(ids[0], ids[1]);
        let path = std::env::temp_dir().join(format!("lrnprof-content-id-{}", std::process::id()));
        std::fs::write(&path, &other[0]).unwrap();
        let from_file = build_id_of_file(&path);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(from_file.as_ref(), Some(&ids[0]));
    }

    #[test]
    fn big_endian_images_are_read_in_their_byte_order() {
        let mut elf = tiny_elf(b"GNU\0", elf::NT_GNU_BUILD_ID);
        elf[5] = 2; // ELFDATA2MSB
        for (at, len) in [(0x20, 8), (0x34, 2), (0x36, 2), (0x38, 2)] {
            elf[at..at + len].reverse();
        }
        for (at, len) in [
            (64, 4),
            (72, 8),
            (96, 8),
            (112, 8),
            (120, 4),
            (124, 4),
            (128, 4),
        ] {
            elf[at..at + len].reverse();
        }
        assert_eq!(build_id_of_bytes(&elf).unwrap().to_hex(), "deadbeef");
    }

    #[test]
    fn malformed_input_is_none_never_a_panic() {
        assert_eq!(build_id_of_bytes(b"not an elf file at all"), None);
        let elf = tiny_elf(b"GNU\0", elf::NT_GNU_BUILD_ID);
        for len in 0..elf.len() {
            assert_eq!(build_id_of_bytes(&elf[..len]), None, "prefix of {len}");
        }
        for i in 0..elf.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut b = elf.clone();
                b[i] ^= flip;
                let _ = build_id_of_bytes(&b);
            }
        }
        // Note sizes near u32::MAX cannot overflow.
        let mut huge = elf.clone();
        huge[120..124].copy_from_slice(&u32::MAX.to_le_bytes());
        huge[124..128].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(build_id_of_bytes(&huge), None);
    }

    /// This test binary, read whole and piecewise, has the id object finds
    /// through its section headers (if the linker gave it one) or its UUID.
    #[test]
    fn reads_files_piecewise() {
        use object::Object;
        let exe = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&exe).unwrap();
        let file = object::File::parse(&bytes[..]).unwrap();
        let by_sections = match file.build_id().unwrap() {
            Some(id) => Some(BuildId(id.to_vec())),
            None => file.mach_uuid().unwrap().map(|u| BuildId(u.to_vec())),
        };
        // Without either, an ELF test binary small enough has a content id.
        let elf = file.format() == object::BinaryFormat::Elf;
        let small = bytes.len() as u64 <= MAX_CONTENT_BYTES;
        let by_sections =
            by_sections.or_else(|| (elf && small).then(|| content_id(Sha256::digest(&bytes))));
        assert_eq!(build_id_of_bytes(&bytes), by_sections);
        assert_eq!(build_id_of_file(&exe), by_sections);
        assert_eq!(build_id_of_file(Path::new("/nonexistent")), None);
    }
}
