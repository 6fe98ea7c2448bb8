//! `lrnprof-analyze pack`: add to a trace, on the machine that recorded
//! it, what the analyzer needs about each image (unwind sections, symbol
//! tables, optionally DWARF), keyed by build id, so that the trace can be
//! analyzed where the binaries do not exist.

use crate::error::AnalyzeError;
use crate::image::{debug_file_candidates, own_vdso, parse_file, EMBEDDED_ELF_HEADERS};
use crate::write_file::write_atomically;
use lrnprof_format::{
    Blob, BlobKind, BuildId, ImageKind, Pid, Record, TraceReader, TraceWriter, WriterOptions,
};
use object::{Object, ObjectSection};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Largest part of a blob in one record (bytes, after compression).
const BLOB_PART: usize = 512 * 1024;

/// Sections embedded for every ELF image (plus `.debug_*` with
/// [`PackOptions::debug`]).
const ELF_SECTIONS: [&str; 7] = [
    ".eh_frame",
    ".eh_frame_hdr",
    ".debug_frame",
    ".symtab",
    ".strtab",
    ".dynsym",
    ".dynstr",
];

/// Options of [`pack`].
#[derive(Debug, Clone, Default)]
pub struct PackOptions {
    /// Also embed DWARF debug info (`.debug_*`: file:line, inline frames),
    /// from the image or its separate debug file.
    pub debug: bool,
    /// Allow packing a trace whose recording host name differs from this
    /// machine's (the files must still match by build id).
    pub any_host: bool,
}

/// What [`pack`] embedded.
#[derive(Debug, Clone, Default)]
pub struct PackReport {
    /// `path: what` per embedded image or map.
    pub embedded: Vec<String>,
    /// Images not embedded, and why.
    pub skipped: Vec<String>,
    /// Bytes of blob data added (compressed).
    pub bytes: u64,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Compress `data` and cut it into blob records.
fn blobs(build_id: &BuildId, kind: BlobKind, data: &[u8]) -> Vec<Blob> {
    let compressed = zstd::encode_all(data, 3).ok();
    let (bytes, is_compressed) = match &compressed {
        Some(c) if c.len() < data.len() => (&c[..], true),
        _ => (data, false),
    };
    let total_len = bytes.len() as u64;
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let part = &bytes[offset..(offset + BLOB_PART).min(bytes.len())];
        out.push(Blob {
            build_id: build_id.clone(),
            kind: kind.clone(),
            compressed: is_compressed,
            offset: offset as u64,
            total_len,
            data: part.to_vec(),
        });
        offset += part.len();
        if offset >= bytes.len() {
            break;
        }
    }
    out
}

/// The sections to embed for the ELF file `bytes`, as (name, SVMA, data).
fn elf_sections(bytes: &[u8], debug: bool) -> Result<Vec<(String, u64, Vec<u8>)>, String> {
    let obj = object::File::parse(bytes).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for sec in obj.sections() {
        let Ok(name) = sec.name() else { continue };
        let wanted = ELF_SECTIONS.contains(&name) || (debug && name.starts_with(".debug_"));
        if !wanted || !seen.insert(name.to_string()) {
            continue;
        }
        if sec.kind() == object::SectionKind::UninitializedData {
            continue;
        }
        if let Ok(data) = sec.uncompressed_data() {
            if !data.is_empty() {
                out.push((name.to_string(), sec.address(), data.into_owned()));
            }
        }
    }
    Ok(out)
}

/// The ELF file header and program headers of `bytes`.
fn elf_headers(bytes: &[u8]) -> Option<Vec<u8>> {
    if bytes.len() < 0x40 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return None;
    }
    let phoff = u64::from_le_bytes(bytes[0x20..0x28].try_into().ok()?);
    let phentsize = u64::from(u16::from_le_bytes(bytes[0x36..0x38].try_into().ok()?));
    let phnum = u64::from(u16::from_le_bytes(bytes[0x38..0x3a].try_into().ok()?));
    let end = usize::try_from(phoff.checked_add(phentsize.checked_mul(phnum)?)?).ok()?;
    bytes.get(..end).map(<[u8]>::to_vec)
}

/// Blobs for the image file at `path` with build id `id`.
/// Sections in `have` (already embedded) are left out.
fn image_blobs(
    path: &Path,
    id: &BuildId,
    debug: bool,
    have: &BTreeSet<(BuildId, String)>,
) -> Result<(Vec<Blob>, String), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
    let parsed = parse_file(Arc::new(bytes.clone())).map_err(|e| e.to_string())?;
    match &parsed.build_id {
        Some(have) if have == &id.0 => {}
        Some(have) => {
            return Err(format!(
                "its build id {} differs from the recorded {id}: the file was replaced",
                BuildId(have.clone())
            ))
        }
        None => return Err(format!("it has no build id (recorded {id})")),
    }
    if parsed.data.is_macho {
        return Err("Mach-O files are not packed (the macOS recorder embeds what it needs)".into());
    }
    let mut sections = elf_sections(&bytes, debug)?;
    let has = |sections: &[(String, u64, Vec<u8>)], n: &str| sections.iter().any(|s| s.0 == n);
    let mut what = Vec::new();
    if !has(&sections, ".symtab") || (debug && !has(&sections, ".debug_info")) {
        // A separate debug file has the full symbol table and the DWARF.
        let candidates = debug_file_candidates(
            &path.to_string_lossy(),
            Some(id),
            parsed.debuglink.as_deref(),
            &[],
        );
        for c in candidates {
            let Ok(dbytes) = std::fs::read(&c) else {
                continue;
            };
            let Ok(dparsed) = parse_file(Arc::new(dbytes.clone())) else {
                continue;
            };
            if dparsed.build_id.as_ref() != Some(&id.0) {
                continue;
            }
            for s in elf_sections(&dbytes, debug)? {
                let from_debug = s.0.starts_with(".debug_") && s.0 != ".debug_frame";
                let symbols = s.0 == ".symtab" || s.0 == ".strtab";
                if (from_debug || symbols) && !has(&sections, &s.0) {
                    sections.push(s);
                }
            }
            what.push(format!("debug file {}", c.display()));
            break;
        }
    }
    if let Some(h) = elf_headers(&bytes) {
        sections.push((EMBEDDED_ELF_HEADERS.to_string(), 0, h));
    }
    sections.retain(|s| !have.contains(&(id.clone(), s.0.clone())));
    if sections.is_empty() {
        return Ok((Vec::new(), String::new()));
    }
    let mut names: Vec<&str> = sections.iter().map(|s| s.0.as_str()).collect();
    names.sort_unstable();
    what.insert(0, names.join(" "));
    let mut out = Vec::new();
    for (name, svma, data) in &sections {
        out.extend(blobs(
            id,
            BlobKind::Section {
                name: name.clone(),
                svma: *svma,
            },
            data,
        ));
    }
    Ok((out, what.join("; ")))
}

/// Rewrite the trace `input` into `output` with embedded image data added.
/// Must run on the recording machine: files are read at their recorded
/// paths and used only if their build id matches.
pub fn pack(
    input: &Path,
    output: &Path,
    options: &PackOptions,
) -> Result<PackReport, AnalyzeError> {
    let reader = TraceReader::open(input).map_err(|source| AnalyzeError::Trace {
        path: input.to_path_buf(),
        source,
    })?;
    let header = reader.header().clone();
    let here = hostname();
    if !options.any_host && header.hostname != here {
        return Err(AnalyzeError::Pack(format!(
            "the trace was recorded on host {:?} but this is {here:?}: run pack on the recording machine (or pass --any-host if the files are the same)",
            header.hostname
        )));
    }
    // Which images and processes the trace has, and what it embeds already.
    let mut images: BTreeMap<(String, BuildId), ImageKind> = BTreeMap::new();
    let mut pids = BTreeSet::new();
    // Sections (and whole images) already embedded, per build id.
    let mut have: BTreeSet<(BuildId, String)> = BTreeSet::new();
    for r in reader.records().flatten() {
        match r {
            Record::ImageMap(m) if m.executable => {
                if let Some(id) = m.build_id.filter(|b| !b.0.is_empty()) {
                    images.insert((m.path, id), m.kind);
                }
                pids.insert(m.pid);
            }
            Record::Blob(b) => match b.kind {
                BlobKind::Section { name, .. } => {
                    have.insert((b.build_id, name));
                }
                BlobKind::Image => {
                    have.insert((b.build_id, String::new()));
                }
                _ => {}
            },
            Record::Process(p) => {
                pids.insert(p.pid);
            }
            _ => {}
        }
    }
    let mut report = PackReport::default();
    let mut new_blobs = Vec::new();
    let mut done_ids = BTreeSet::new();
    for ((path, id), kind) in &images {
        if have.contains(&(id.clone(), String::new())) || !done_ids.insert(id.clone()) {
            continue;
        }
        match kind {
            ImageKind::File => match image_blobs(Path::new(path), id, options.debug, &have) {
                Ok((b, _)) if b.is_empty() => {}
                Ok((b, what)) => {
                    report.embedded.push(format!("{path} ({id}): {what}"));
                    new_blobs.extend(b);
                }
                Err(why) => report.skipped.push(format!("{path} ({id}): {why}")),
            },
            ImageKind::Vdso => {
                let vdso = own_vdso().filter(|b| {
                    parse_file(Arc::new(b.clone()))
                        .ok()
                        .and_then(|p| p.build_id)
                        .is_some_and(|b| b == id.0)
                });
                match vdso {
                    Some(bytes) => {
                        report.embedded.push(format!("{path} ({id}): whole image"));
                        new_blobs.extend(blobs(id, BlobKind::Image, &bytes));
                    }
                    None => report.skipped.push(format!(
                        "{path} ({id}): this machine's vDSO has another build id (kernel changed since recording)"
                    )),
                }
            }
            _ => {}
        }
    }
    for pid in &pids {
        let map = PathBuf::from(format!("/tmp/perf-{}.map", pid.0));
        if let Ok(text) = std::fs::read(&map) {
            report.embedded.push(format!("{} (JIT map)", map.display()));
            new_blobs.extend(blobs(
                &BuildId(Vec::new()),
                BlobKind::JitMap { pid: Pid(pid.0) },
                &text,
            ));
        }
    }
    report.bytes = new_blobs.iter().map(|b| b.data.len() as u64).sum();

    write_atomically(output, |out| {
        let mut w = TraceWriter::new(out, &header, WriterOptions::default())
            .map_err(std::io::Error::other)?;
        for r in reader.records() {
            match r {
                Ok(r) => w.write(&r).map_err(std::io::Error::other)?,
                // Undecodable blocks were already unreadable: leave them out.
                Err(_) => continue,
            }
        }
        for b in new_blobs {
            w.write(&Record::Blob(b)).map_err(std::io::Error::other)?;
        }
        w.finish().map_err(std::io::Error::other)?;
        Ok(())
    })?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_blobs_are_split_and_reassemble() {
        let data: Vec<u8> = (0..3_000_000u32)
            .flat_map(|i| (i.wrapping_mul(2_654_435_761)).to_le_bytes())
            .collect();
        let parts = blobs(&BuildId(vec![7]), BlobKind::Image, &data);
        assert!(parts.len() > 1);
        let mut store = crate::blobs::BlobStore::default();
        for p in parts {
            assert!(p.data.len() <= BLOB_PART);
            store.add(p);
        }
        store.finish();
        assert_eq!(
            store.image(&BuildId(vec![7])).unwrap().as_slice(),
            &data[..]
        );
    }
}
