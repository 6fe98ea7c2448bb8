//! `lrnprof-analyze pack`: add to a trace, on the machine that recorded
//! it, what the analyzer needs about each image (unwind sections, symbol
//! tables, optionally DWARF), keyed by build id, so that the trace can be
//! analyzed where the binaries do not exist.

use crate::error::AnalyzeError;
use crate::image::{own_vdso, parse_file};
use crate::write_file::write_atomically;
use lrnprof_format::{
    Blob, BlobKind, BuildId, ImageKind, Pid, Record, TraceReader, TraceWriter, WriterOptions,
};
use lrnprof_image::{
    blobs_for_file, debug_file_candidates, section_role, split_blob, EmbedLevel, SectionRole,
    MAX_BLOB_PART,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

fn section_name(b: &Blob) -> &str {
    match &b.kind {
        BlobKind::Section { name, .. } => name,
        _ => "",
    }
}

/// Blobs for the image file at `path` with build id `id`, extracted as the
/// recorder extracts them. Sections in `have` (already embedded) are left
/// out.
fn image_blobs(
    path: &Path,
    id: &BuildId,
    debug: bool,
    have: &BTreeSet<(BuildId, String)>,
) -> Result<(Vec<Blob>, String), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
    let parsed = parse_file(Arc::new(bytes)).map_err(|e| e.to_string())?;
    match &parsed.build_id {
        Some(found) if found == &id.0 => {}
        Some(found) => {
            return Err(format!(
                "its build id {} differs from the recorded {id}: the file was replaced",
                BuildId(found.clone())
            ))
        }
        None => return Err(format!("it has no build id (recorded {id})")),
    }
    let level = if debug {
        EmbedLevel::Debug
    } else {
        EmbedLevel::Symbols
    };
    let mut blobs = blobs_for_file(path, id, level).map_err(|e| e.to_string())?;
    let has = |blobs: &[Blob], n: &str| blobs.iter().any(|b| section_name(b) == n);
    let mut what = Vec::new();
    if !has(&blobs, ".symtab") || (debug && !has(&blobs, ".debug_info")) {
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
            let Ok(dparsed) = parse_file(Arc::new(dbytes)) else {
                continue;
            };
            // An image without a build id note (a content id) has a debug
            // file only by its `.gnu_debuglink`, whose content differs:
            // checked by the link's CRC-32, as the analysis checks it.
            let matches = match (id.is_content_id(), parsed.debuglink_crc) {
                (true, Some(crc)) => lrnprof_image::debuglink_crc_matches(&c, crc),
                (true, None) => false,
                (false, _) => dparsed.build_id.as_ref() == Some(&id.0),
            };
            if !matches {
                continue;
            }
            for b in blobs_for_file(&c, id, level).map_err(|e| e.to_string())? {
                let name = section_name(&b);
                // Its DWARF and full symbol table; unwind tables and the
                // layout are the binary's.
                let wanted = section_role(name) == Some(SectionRole::Debug)
                    || name == ".symtab"
                    || name == ".strtab";
                if wanted && !has(&blobs, name) {
                    blobs.push(b);
                }
            }
            what.push(format!("debug file {}", c.display()));
            break;
        }
    }
    blobs.retain(|b| !have.contains(&(id.clone(), section_name(b).to_string())));
    let mut names: Vec<&str> = blobs.iter().map(section_name).collect();
    names.sort_unstable();
    names.dedup();
    what.insert(0, names.join(" "));
    Ok((blobs, what.join("; ")))
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
    let mut have_jit = BTreeSet::new();
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
                BlobKind::JitMap { pid } => {
                    have_jit.insert(pid);
                }
                // Not image sections: pack never adds these.
                BlobKind::KernelSymbols | BlobKind::Table { .. } => {}
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
                Err(why) => {
                    // A file gone since (a deleted binary, a memfd) whose
                    // parts the recorder embedded: say that they stay.
                    let kept = if have.iter().any(|(b, _)| b == id) {
                        "; what the recorder embedded of it stays in the trace"
                    } else {
                        ""
                    };
                    report.skipped.push(format!("{path} ({id}): {why}{kept}"))
                }
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
                        let kind = BlobKind::Image;
                        new_blobs.extend(split_blob(id, kind, false, bytes, MAX_BLOB_PART));
                    }
                    None => report.skipped.push(format!(
                        "{path} ({id}): this machine's vDSO has another build id (kernel changed since recording)"
                    )),
                }
            }
            _ => {}
        }
    }
    for pid in pids.difference(&have_jit) {
        let map = PathBuf::from(format!("/tmp/perf-{}.map", pid.0));
        if let Ok(text) = std::fs::read(&map) {
            report.embedded.push(format!("{} (JIT map)", map.display()));
            let kind = BlobKind::JitMap { pid: Pid(pid.0) };
            let jit = split_blob(&BuildId(Vec::new()), kind, false, text, MAX_BLOB_PART);
            new_blobs.extend(jit);
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
