//! Embedded data (`Record::Blob`): parts are reassembled and decompressed
//! after the first pass, keyed by build id and kind.

use lrnprof_format::{Blob, BlobKind, BuildId, Pid};
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::sync::Arc;

/// The most bytes one blob may decompress to: a trace is untrusted input.
const MAX_BLOB_LEN: u64 = 4 << 30;

#[derive(Debug, Default)]
struct Parts {
    compressed: bool,
    total_len: u64,
    parts: BTreeMap<u64, Vec<u8>>,
}

/// Blobs of a trace.
#[derive(Debug, Default)]
pub(crate) struct BlobStore {
    pending: HashMap<(BuildId, BlobKind), Parts>,
    done: HashMap<(BuildId, BlobKind), Arc<Vec<u8>>>,
    /// Blobs that were incomplete or could not be decompressed.
    pub problems: Vec<String>,
}

impl BlobStore {
    pub fn add(&mut self, b: Blob) {
        let p = self.pending.entry((b.build_id, b.kind)).or_default();
        p.compressed = b.compressed;
        p.total_len = b.total_len;
        p.parts.insert(b.offset, b.data);
    }

    /// Reassemble every blob. Call once after the first pass.
    pub fn finish(&mut self) {
        let mut pending: Vec<_> = self.pending.drain().collect();
        pending.sort_by(|a, b| (&a.0 .0, describe(&a.0 .1)).cmp(&(&b.0 .0, describe(&b.0 .1))));
        for ((id, kind), parts) in pending {
            match assemble(parts) {
                Ok(data) => {
                    self.done.insert((id, kind), Arc::new(data));
                }
                Err(e) => self
                    .problems
                    .push(format!("embedded {} of image {id}: {e}", describe(&kind))),
            }
        }
    }

    /// An embedded section of image `id`, with its SVMA.
    pub fn section(&self, id: &BuildId, name: &str) -> Option<(u64, Arc<Vec<u8>>)> {
        // Blob kinds hold the SVMA, so find by name.
        self.done.iter().find_map(|((bid, kind), data)| match kind {
            BlobKind::Section { name: n, svma } if bid == id && n == name => {
                Some((*svma, data.clone()))
            }
            _ => None,
        })
    }

    /// The table `name` lrnprof derived from image `id`
    /// (`BlobKind::Table`).
    pub fn table(&self, id: &BuildId, name: &str) -> Option<Arc<Vec<u8>>> {
        self.done.iter().find_map(|((bid, kind), data)| match kind {
            BlobKind::Table { name: n } if bid == id && n == name => Some(data.clone()),
            _ => None,
        })
    }

    /// Whether any image has a table named `name`.
    pub fn any_table(&self, name: &str) -> bool {
        self.done
            .keys()
            .any(|(_, kind)| matches!(kind, BlobKind::Table { name: n } if n == name))
    }

    /// Whether anything is embedded for image `id`.
    pub fn has_image_data(&self, id: &BuildId) -> bool {
        self.done.keys().any(|(bid, kind)| {
            bid == id && matches!(kind, BlobKind::Section { .. } | BlobKind::Image)
        })
    }

    /// The whole embedded image file `id` (e.g. the vDSO).
    pub fn image(&self, id: &BuildId) -> Option<Arc<Vec<u8>>> {
        self.done.get(&(id.clone(), BlobKind::Image)).cloned()
    }

    /// Names and SVMAs of the sections embedded for `id`.
    pub fn section_names(&self, id: &BuildId) -> Vec<(String, u64)> {
        let mut v: Vec<_> = self
            .done
            .keys()
            .filter_map(|(bid, kind)| match kind {
                BlobKind::Section { name, svma } if bid == id => Some((name.clone(), *svma)),
                _ => None,
            })
            .collect();
        v.sort();
        v
    }

    /// The embedded kernel symbol table (`/proc/kallsyms` lines).
    pub fn kernel_symbols(&self) -> Option<Arc<Vec<u8>>> {
        let mut found: Vec<_> = self
            .done
            .iter()
            .filter(|((_, kind), _)| *kind == BlobKind::KernelSymbols)
            .collect();
        // Deterministic if a trace holds several (it should not).
        found.sort_by(|a, b| a.0 .0.cmp(&b.0 .0));
        found.first().map(|(_, data)| Arc::clone(data))
    }

    /// The embedded `perf-PID.map` of `pid`.
    pub fn jit_map(&self, pid: Pid) -> Option<Arc<Vec<u8>>> {
        self.done.iter().find_map(|((_, kind), data)| match kind {
            BlobKind::JitMap { pid: p } if *p == pid => Some(data.clone()),
            _ => None,
        })
    }
}

fn describe(kind: &BlobKind) -> String {
    match kind {
        BlobKind::Section { name, .. } => format!("section {name}"),
        BlobKind::Image => "image".to_string(),
        BlobKind::JitMap { pid } => format!("JIT map of pid {}", pid.0),
        BlobKind::KernelSymbols => "kernel symbols".to_string(),
        BlobKind::Table { name } => format!("table {name}"),
    }
}

fn assemble(p: Parts) -> Result<Vec<u8>, String> {
    if p.total_len > MAX_BLOB_LEN {
        return Err(format!("claims {} bytes, more than the bound", p.total_len));
    }
    let mut data = Vec::with_capacity(p.total_len.min(1 << 26) as usize);
    for (offset, part) in p.parts {
        if offset != data.len() as u64 {
            return Err(format!(
                "part at offset {offset} missing or overlapping (have {} bytes); the trace was probably cut short",
                data.len()
            ));
        }
        data.extend_from_slice(&part);
    }
    if data.len() as u64 != p.total_len {
        return Err(format!(
            "has {} of {} bytes; the trace was probably cut short",
            data.len(),
            p.total_len
        ));
    }
    if !p.compressed {
        return Ok(data);
    }
    let mut out = Vec::new();
    zstd::stream::read::Decoder::new(&data[..])
        .and_then(|d| d.take(MAX_BLOB_LEN + 1).read_to_end(&mut out))
        .map_err(|e| format!("cannot be decompressed: {e}"))?;
    if out.len() as u64 > MAX_BLOB_LEN {
        return Err("decompresses to more than the bound".to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(offset: u64, total: u64, data: &[u8], compressed: bool) -> Blob {
        Blob {
            build_id: BuildId(vec![1, 2]),
            kind: BlobKind::Section {
                name: ".eh_frame".into(),
                svma: 0x400,
            },
            compressed,
            offset,
            total_len: total,
            data: data.to_vec(),
        }
    }

    #[test]
    fn parts_reassemble_in_any_order() {
        let mut s = BlobStore::default();
        s.add(blob(3, 6, b"def", false));
        s.add(blob(0, 6, b"abc", false));
        s.finish();
        let (svma, data) = s.section(&BuildId(vec![1, 2]), ".eh_frame").unwrap();
        assert_eq!((svma, &data[..]), (0x400, &b"abcdef"[..]));
        assert!(s.problems.is_empty());
    }

    #[test]
    fn compressed_and_incomplete_blobs() {
        let z = zstd::encode_all(&b"hello hello hello"[..], 3).unwrap();
        let mut s = BlobStore::default();
        s.add(blob(0, z.len() as u64, &z, true));
        s.finish();
        let (_, data) = s.section(&BuildId(vec![1, 2]), ".eh_frame").unwrap();
        assert_eq!(&data[..], b"hello hello hello");

        let mut s = BlobStore::default();
        s.add(blob(0, 10, b"abc", false));
        s.finish();
        assert!(s.section(&BuildId(vec![1, 2]), ".eh_frame").is_none());
        assert!(s.problems[0].contains("cut short"), "{:?}", s.problems);
    }
}
