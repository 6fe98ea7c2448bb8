//! Separate debug files: where a distribution keeps the DWARF and the full
//! symbol table of a stripped image (Debian's `*-dbg` and `*-dbgsym`
//! packages, Fedora's `debuginfo`): the build-id tree and the places
//! `.gnu_debuglink` names.

use std::path::{Path, PathBuf};

/// Where a separate debug file for the image at `path` (as the process
/// mapped it) may be, in the order to try: the build-id tree
/// (`usr/lib/debug/.build-id/xx/rest.debug`), then the `.gnu_debuglink`
/// places (next to the image, its `.debug/` directory,
/// `usr/lib/debug/DIR/`), each under `/` first and then under each of
/// `roots`. A candidate is only a place: its build id must still be
/// checked.
pub fn debug_file_candidates(
    path: &str,
    build_id: Option<&lrnprof_format::BuildId>,
    debuglink: Option<&str>,
    roots: &[PathBuf],
) -> Vec<PathBuf> {
    let mut all_roots = vec![PathBuf::from("/")];
    all_roots.extend(roots.iter().cloned());
    let mut candidates = Vec::new();
    if let Some(id) = build_id {
        candidates.extend(in_build_id_trees(&all_roots, id));
    }
    let dir = Path::new(path).parent().map(Path::to_path_buf);
    if let (Some(link), Some(dir)) = (debuglink, dir) {
        let rel = dir.strip_prefix("/").unwrap_or(&dir);
        for place in [
            rel.to_path_buf(),
            rel.join(".debug"),
            Path::new("usr/lib/debug").join(rel),
        ] {
            for root in &all_roots {
                candidates.push(root.join(&place).join(link));
            }
        }
    }
    candidates
}

/// Whether the file at `path` has the CRC-32 a `.gnu_debuglink` gives for
/// it (`crc`): the one check of a debug file for an image that no build id
/// identifies (a content id), whose debug file a rebuild may have left
/// stale. Reads the whole file.
pub fn debuglink_crc_matches(path: &Path, crc: u32) -> bool {
    let Ok(mut file) = std::fs::File::open(path) else {
        return false;
    };
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match std::io::Read::read(&mut file, &mut buf) {
            Ok(0) => return hasher.finalize() == crc,
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// Where the supplementary debug file a `.gnu_debugaltlink` section names
/// may be, in the order to try: the build-id tree (`usr/lib/debug/.build-id/
/// xx/rest.debug`, by the supplementary file's own build id), then the
/// name as the section has it, absolute (also under each of `roots`) or
/// relative to the directory of `file`, the file holding the section (and
/// of the file a symbolic link `file` leads to).
/// `dwz -m` makes such a file of the DWARF that several debug files share
/// (Debian's `-dbgsym` and Fedora's `debuginfo` packages), and rewrites
/// theirs to refer to it. A candidate is only a place: its build id must
/// still be checked.
pub fn alt_file_candidates(
    file: &Path,
    name: &[u8],
    build_id: &[u8],
    roots: &[PathBuf],
) -> Vec<PathBuf> {
    let mut all_roots = vec![PathBuf::from("/")];
    all_roots.extend(roots.iter().cloned());
    let mut candidates = in_build_id_trees(&all_roots, &lrnprof_format::BuildId(build_id.to_vec()));
    let Ok(name) = std::str::from_utf8(name) else {
        return candidates;
    };
    let name = Path::new(name);
    if name.is_absolute() {
        let rel = name.strip_prefix("/").unwrap_or(name);
        candidates.extend(all_roots.iter().map(|r| r.join(rel)));
    } else {
        // Relative to the file as found, and to where it really is (a
        // build-id link points into the tree of debug files, whose depth
        // the name was written for).
        let real = std::fs::canonicalize(file).ok();
        for f in std::iter::once(file).chain(real.as_deref()) {
            if let Some(dir) = f.parent() {
                let c = dir.join(name);
                if !candidates.contains(&c) {
                    candidates.push(c);
                }
            }
        }
    }
    candidates
}

/// The supplementary file the DWARF of `obj` refers to, as (name, id):
/// from `.gnu_debugaltlink` (the id is the file's build id), else from
/// DWARF 5's `.debug_sup` of a file that is not itself supplementary (the
/// id is the checksum both files' `.debug_sup` carry). `None` if neither
/// names one.
pub fn supplementary_link<'data, R: object::ReadRef<'data>>(
    obj: &object::File<'data, R>,
) -> Option<(Vec<u8>, Vec<u8>)> {
    use object::Object;
    if let Ok(Some((name, id))) = obj.gnu_debugaltlink() {
        return Some((name.to_vec(), id.to_vec()));
    }
    match debug_sup(obj)? {
        (false, name, id) if !name.is_empty() && !id.is_empty() => Some((name, id)),
        _ => None,
    }
}

/// The id a supplementary file answers to: its build id, else the
/// checksum of its own `.debug_sup` (`dwz --dwarf-5` writes no build id).
pub fn supplementary_id<'data, R: object::ReadRef<'data>>(
    obj: &object::File<'data, R>,
) -> Option<Vec<u8>> {
    use object::Object;
    if let Ok(Some(id)) = obj.build_id() {
        return Some(id.to_vec());
    }
    match debug_sup(obj)? {
        (true, _, id) if !id.is_empty() => Some(id),
        _ => None,
    }
}

/// `.debug_sup` of `obj`: whether the file is the supplementary one, the
/// file name and the checksum (DWARF 5, section 7.3.6).
fn debug_sup<'data, R: object::ReadRef<'data>>(
    obj: &object::File<'data, R>,
) -> Option<(bool, Vec<u8>, Vec<u8>)> {
    use object::{Object, ObjectSection};
    let data = obj.section_by_name(".debug_sup")?.data().ok()?;
    parse_debug_sup(data, obj.is_little_endian())
}

/// See [`debug_sup`]; `None` if malformed or not version 5.
fn parse_debug_sup(data: &[u8], little_endian: bool) -> Option<(bool, Vec<u8>, Vec<u8>)> {
    let bytes = [*data.first()?, *data.get(1)?];
    let version = if little_endian {
        u16::from_le_bytes(bytes)
    } else {
        u16::from_be_bytes(bytes)
    };
    if version != 5 {
        return None;
    }
    let is_supplementary = *data.get(2)? != 0;
    let rest = data.get(3..)?;
    let nul = rest.iter().position(|&b| b == 0)?;
    let name = rest[..nul].to_vec();
    // The checksum's length, ULEB128 (endianness does not matter to it).
    let mut rest = gimli::EndianSlice::new(&rest[nul + 1..], gimli::LittleEndian);
    let len = gimli::leb128::read::unsigned(&mut rest).ok()?;
    let len = usize::try_from(len).ok()?;
    let checksum = rest.slice().get(..len)?.to_vec();
    Some((is_supplementary, name, checksum))
}

/// `usr/lib/debug/.build-id/xx/rest.debug` for build id `id` under each
/// of `roots`; none for an id too short to split.
fn in_build_id_trees(roots: &[PathBuf], id: &lrnprof_format::BuildId) -> Vec<PathBuf> {
    let hex = id.to_hex();
    if hex.len() <= 2 {
        return Vec::new();
    }
    roots
        .iter()
        .map(|root| {
            root.join("usr/lib/debug/.build-id")
                .join(&hex[..2])
                .join(format!("{}.debug", &hex[2..]))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lrnprof_format::BuildId;

    /// A relative name is tried from the link's directory and from the
    /// directory of the file it leads to.
    #[cfg(unix)]
    #[test]
    fn relative_alt_names_from_a_build_id_link_and_its_target() {
        let root = std::env::temp_dir().join(format!("lrnprof-alt-{}", std::process::id()));
        let real_dir = root.join("debug/usr/lib64");
        let link_dir = root.join("debug/.build-id/ab");
        std::fs::create_dir_all(&real_dir).unwrap();
        std::fs::create_dir_all(&link_dir).unwrap();
        std::fs::write(real_dir.join("libfoo.so.debug"), b"").unwrap();
        let link = link_dir.join("cdef.debug");
        std::os::unix::fs::symlink("../../usr/lib64/libfoo.so.debug", &link).unwrap();
        let c = alt_file_candidates(&link, b"../../../.dwz/foo", &[], &[]);
        let real = std::fs::canonicalize(&real_dir).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(
            c,
            [
                link_dir.join("../../../.dwz/foo"),
                real.join("../../../.dwz/foo")
            ]
        );
    }

    #[test]
    fn debug_sup_sections_are_read() {
        // As `dwz --dwarf-5` writes them: the referring file's, then the
        // supplementary file's own.
        let mut referring = vec![5, 0, 0];
        referring.extend(b"/usr/lib/debug/.dwz/x.debug\0");
        referring.push(3);
        referring.extend([0xaa, 0xbb, 0xcc]);
        assert_eq!(
            parse_debug_sup(&referring, true),
            Some((
                false,
                b"/usr/lib/debug/.dwz/x.debug".to_vec(),
                vec![0xaa, 0xbb, 0xcc]
            ))
        );
        assert_eq!(
            parse_debug_sup(&[5, 0, 1, 0, 2, 1, 2], true),
            Some((true, Vec::new(), vec![1, 2]))
        );
        assert_eq!(
            parse_debug_sup(&[0, 5, 1, 0, 1, 9], false),
            Some((true, Vec::new(), vec![9]))
        );
        // Truncated, another version, a length past the end.
        for bad in [
            &[5u8][..],
            &[4, 0, 0, 0, 0],
            &[5, 0, 0, b'a'],
            &[5, 0, 0, 0, 9, 1],
        ] {
            assert_eq!(parse_debug_sup(bad, true), None, "{bad:?}");
        }
    }

    #[test]
    fn alt_files_by_build_id_then_by_name() {
        let c = alt_file_candidates(
            Path::new("/usr/lib/debug/.build-id/93/ac61.debug"),
            b"/usr/lib/debug/.dwz/x86_64-linux-gnu/libfoo1.debug",
            &[0x12, 0x34, 0x56],
            &[PathBuf::from("/srv/root")],
        );
        let c: Vec<&str> = c.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            c,
            [
                "/usr/lib/debug/.build-id/12/3456.debug",
                "/srv/root/usr/lib/debug/.build-id/12/3456.debug",
                "/usr/lib/debug/.dwz/x86_64-linux-gnu/libfoo1.debug",
                "/srv/root/usr/lib/debug/.dwz/x86_64-linux-gnu/libfoo1.debug",
            ]
        );
        // Relative to the file that names it.
        let c = alt_file_candidates(
            Path::new("/usr/lib/debug/.build-id/93/ac61.debug"),
            b"../../.dwz/foo.debug",
            &[],
            &[],
        );
        assert_eq!(
            c,
            [PathBuf::from(
                "/usr/lib/debug/.build-id/93/../../.dwz/foo.debug"
            )]
        );
    }

    #[test]
    fn build_id_tree_then_debuglink_places() {
        let id = BuildId(vec![0x93, 0xac, 0x61]);
        let c = debug_file_candidates(
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            Some(&id),
            Some("libc.so.6.debug"),
            &[PathBuf::from("/srv/root")],
        );
        let c: Vec<&str> = c.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            c,
            [
                "/usr/lib/debug/.build-id/93/ac61.debug",
                "/srv/root/usr/lib/debug/.build-id/93/ac61.debug",
                "/usr/lib/x86_64-linux-gnu/libc.so.6.debug",
                "/srv/root/usr/lib/x86_64-linux-gnu/libc.so.6.debug",
                "/usr/lib/x86_64-linux-gnu/.debug/libc.so.6.debug",
                "/srv/root/usr/lib/x86_64-linux-gnu/.debug/libc.so.6.debug",
                "/usr/lib/debug/usr/lib/x86_64-linux-gnu/libc.so.6.debug",
                "/srv/root/usr/lib/debug/usr/lib/x86_64-linux-gnu/libc.so.6.debug",
            ]
        );
        assert!(debug_file_candidates("x", None, None, &[]).is_empty());
    }
}
