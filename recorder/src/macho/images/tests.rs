//! Tests of the image tracker against a pretend task.

use super::*;
use crate::macho::CPU_TYPE_ARM64;

/// Memory regions of a pretend task.
#[derive(Default)]
struct FakeTask {
    regions: Vec<(u64, Vec<u8>)>,
    infos_address: u64,
}

impl FakeTask {
    fn put(&mut self, address: u64, bytes: Vec<u8>) {
        self.regions.retain(|(a, _)| *a != address);
        self.regions.push((address, bytes));
    }
}

impl TaskMemory for FakeTask {
    fn read(&self, address: u64, buf: &mut [u8]) -> bool {
        for (start, bytes) in &self.regions {
            let Some(offset) = address.checked_sub(*start) else {
                continue;
            };
            if let Some(src) = bytes.get(offset as usize..offset as usize + buf.len()) {
                buf.copy_from_slice(src);
                return true;
            }
        }
        false
    }

    fn all_image_infos_address(&self) -> Result<u64, RecordError> {
        Ok(self.infos_address)
    }
}

const INFOS: u64 = 0x7000_0000;
const ARRAY: u64 = 0x7000_1000;
const EXE_PATH: u64 = 0x7000_2000;
const LIB_PATH: u64 = 0x7000_2100;
/// The executable: linked at 0x1_0000_0000, loaded 0x400_0000 higher.
const EXE: u64 = 0x1_0400_0000;
/// A shared-cache dylib: linked at 0x1_8000_0000, loaded at this AVMA.
const LIB: u64 = 0x1_8b12_3000;
const LIB_SLIDE: u64 = LIB - 0x1_8000_0000;
const EXE_UUID: [u8; 16] = [0xe0; 16];
const LIB_UUID: [u8; 16] = [0x11; 16];

/// A Mach-O header with `__TEXT` (and `sections` in it) and `LC_UUID`.
#[rustfmt::skip]
fn macho(filetype: u32, flags: u32, vmaddr: u64, vmsize: u64,
         sections: &[(&str, u64, u64)], uuid: [u8; 16]) -> Vec<u8> {
    let name16 = |n: &str| {
        let mut b = n.as_bytes().to_vec();
        b.resize(16, 0);
        b
    };
    let segment_len = 72 + 80 * sections.len() as u32;
    let mut b = Vec::new();
    b.extend_from_slice(&0xfeed_facf_u32.to_le_bytes());    // magic
    b.extend_from_slice(&CPU_TYPE_ARM64.to_le_bytes());     // cputype
    b.extend_from_slice(&0u32.to_le_bytes());               // cpusubtype
    b.extend_from_slice(&filetype.to_le_bytes());           // filetype
    b.extend_from_slice(&2u32.to_le_bytes());               // ncmds
    b.extend_from_slice(&(segment_len + 24).to_le_bytes()); // sizeofcmds
    b.extend_from_slice(&flags.to_le_bytes());              // flags
    b.extend_from_slice(&0u32.to_le_bytes());               // reserved
    b.extend_from_slice(&0x19u32.to_le_bytes());            // LC_SEGMENT_64
    b.extend_from_slice(&segment_len.to_le_bytes());        // cmdsize
    b.extend_from_slice(&name16("__TEXT"));                 // segname
    b.extend_from_slice(&vmaddr.to_le_bytes());             // vmaddr
    b.extend_from_slice(&vmsize.to_le_bytes());             // vmsize
    b.extend_from_slice(&[0; 16]);                          // fileoff, filesize
    b.extend_from_slice(&[5, 0, 0, 0, 5, 0, 0, 0]);         // maxprot, initprot
    b.extend_from_slice(&(sections.len() as u32).to_le_bytes()); // nsects
    b.extend_from_slice(&0u32.to_le_bytes());               // flags
    for (name, addr, size) in sections {
        b.extend_from_slice(&name16(name));                 // sectname
        b.extend_from_slice(&name16("__TEXT"));             // segname
        b.extend_from_slice(&addr.to_le_bytes());           // addr
        b.extend_from_slice(&size.to_le_bytes());           // size
        b.extend_from_slice(&[0; 32]);                      // offset .. reserved3
    }
    b.extend_from_slice(&0x1bu32.to_le_bytes());            // LC_UUID
    b.extend_from_slice(&24u32.to_le_bytes());              // cmdsize
    b.extend_from_slice(&uuid);                             // uuid
    b
}

/// A version 15 `dyld_all_image_infos` (no dyld entry).
fn infos(count: u32, array: u64, timestamp: u64) -> Vec<u8> {
    let mut b = vec![0u8; DYLD_ALL_IMAGE_INFOS_LEN];
    b[0..4].copy_from_slice(&15u32.to_le_bytes());
    b[4..8].copy_from_slice(&count.to_le_bytes());
    b[8..16].copy_from_slice(&array.to_le_bytes());
    b[184..192].copy_from_slice(&timestamp.to_le_bytes());
    b
}

fn image_array(images: &[(u64, u64)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (load, path) in images {
        b.extend_from_slice(&load.to_le_bytes());
        b.extend_from_slice(&path.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
    }
    b
}

/// The executable and a shared-cache dylib with 16 bytes of
/// `__unwind_info` (0xab) at its slid address.
fn task() -> FakeTask {
    let mut t = FakeTask {
        infos_address: INFOS,
        ..Default::default()
    };
    t.put(INFOS, infos(2, ARRAY, 1));
    t.put(ARRAY, image_array(&[(EXE, EXE_PATH), (LIB, LIB_PATH)]));
    // Paths are read page by page, as the task's memory is mapped.
    let mut page = vec![0u8; 4096];
    page[..14].copy_from_slice(b"/Users/me/app\0");
    page[0x100..0x116].copy_from_slice(b"/usr/lib/libfoo.dylib\0");
    t.put(EXE_PATH, page);
    t.put(
        EXE,
        macho(2, 0x0020_0085, 0x1_0000_0000, 0x4000, &[], EXE_UUID),
    );
    let lib = macho(
        6,
        0x8000_0000,
        0x1_8000_0000,
        0x8000,
        &[("__unwind_info", 0x1_8000_1000, 16)],
        LIB_UUID,
    );
    t.put(LIB, lib);
    t.put(0x1_8000_1000 + LIB_SLIDE, vec![0xab; 16]);
    t
}

fn maps(records: &[Record]) -> Vec<&ImageMapRecord> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::ImageMap(m) => Some(m),
            _ => None,
        })
        .collect()
}

#[test]
fn first_refresh_maps_every_image() {
    let task = task();
    let mut images = Images::new(Pid(7), EmbedLevel::Symbols);
    let mut out = Vec::new();
    images.refresh(&task, Timestamp(5), &mut out).unwrap();
    let maps = maps(&out);
    assert_eq!(maps.len(), 2, "{out:?}");
    let exe = maps.iter().find(|m| m.start == EXE).unwrap();
    assert_eq!(exe.end, EXE + 0x4000);
    assert_eq!(exe.path, "/Users/me/app");
    assert_eq!(exe.build_id, Some(BuildId(EXE_UUID.to_vec())));
    assert_eq!(exe.kind, ImageKind::File);
    assert_eq!(
        (exe.pid, exe.time, exe.file_offset),
        (Pid(7), Timestamp(5), 0)
    );
    let lib = maps.iter().find(|m| m.start == LIB).unwrap();
    assert_eq!(lib.kind, ImageKind::SharedCache);
    assert_eq!(lib.path, "/usr/lib/libfoo.dylib");
    assert_eq!(images.executable_cputype(), Some(CPU_TYPE_ARM64));
}

#[test]
fn the_list_is_read_again_only_when_its_timestamp_moves() {
    let mut task = task();
    let mut images = Images::new(Pid(7), EmbedLevel::Symbols);
    let mut out = Vec::new();
    images.refresh(&task, Timestamp(5), &mut out).unwrap();
    out.clear();
    // The library is replaced by another copy of the executable's
    // image, but dyld has not moved the timestamp yet.
    const OTHER: u64 = 0x1_0800_0000;
    let exe = task
        .regions
        .iter()
        .find(|(a, _)| *a == EXE)
        .unwrap()
        .1
        .clone();
    task.put(OTHER, exe);
    task.put(ARRAY, image_array(&[(EXE, EXE_PATH), (OTHER, EXE_PATH)]));
    images.refresh(&task, Timestamp(6), &mut out).unwrap();
    assert!(out.is_empty(), "{out:?}");
    task.put(INFOS, infos(2, ARRAY, 2));
    images.refresh(&task, Timestamp(7), &mut out).unwrap();
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(
        out[0],
        Record::ImageUnmap(ImageUnmapRecord {
            time: Timestamp(7),
            pid: Pid(7),
            start: LIB,
            end: LIB + 0x8000,
        })
    );
    assert_eq!(maps(&out[1..])[0].start, OTHER);
    // A different count is a change even with the same timestamp (for
    // systems without one).
    task.put(INFOS, infos(1, ARRAY, 2));
    out.clear();
    images.refresh(&task, Timestamp(8), &mut out).unwrap();
    assert!(matches!(
        out[..],
        [Record::ImageUnmap(ImageUnmapRecord { start: OTHER, .. })]
    ));
}

#[test]
fn a_list_being_updated_or_not_yet_there_is_skipped() {
    let mut task = task();
    let mut images = Images::new(Pid(7), EmbedLevel::Symbols);
    let mut out = Vec::new();
    task.infos_address = 0;
    images.refresh(&task, Timestamp(1), &mut out).unwrap();
    task.infos_address = INFOS;
    task.put(INFOS, infos(2, 0, 1));
    images.refresh(&task, Timestamp(2), &mut out).unwrap();
    assert!(out.is_empty(), "{out:?}");
    task.put(INFOS, infos(2, ARRAY, 1));
    images.refresh(&task, Timestamp(3), &mut out).unwrap();
    assert_eq!(maps(&out).len(), 2);
}

#[test]
fn unreadable_images_are_counted_not_mapped() {
    let mut task = task();
    task.regions.retain(|(a, _)| *a != EXE);
    let mut images = Images::new(Pid(7), EmbedLevel::Symbols);
    let mut out = Vec::new();
    images.refresh(&task, Timestamp(1), &mut out).unwrap();
    assert_eq!(maps(&out).len(), 1);
    assert_eq!(images.unreadable, 1);
}

#[test]
fn a_touched_shared_cache_image_has_its_sections_embedded_once() {
    let task = task();
    let mut images = Images::new(Pid(7), EmbedLevel::Symbols);
    let mut out = Vec::new();
    images.refresh(&task, Timestamp(1), &mut out).unwrap();
    out.clear();
    assert_eq!(images.wants_embedding(LIB - 1), None);
    assert_eq!(images.wants_embedding(LIB + 0x8000), None);
    assert_eq!(images.wants_embedding(LIB + 0x1234), Some(LIB));
    images.embed(&task, LIB, &mut out);
    let blobs: Vec<(&BlobKind, &[u8])> = out
        .iter()
        .map(|r| match r {
            Record::Blob(b) => {
                assert_eq!(b.build_id, BuildId(LIB_UUID.to_vec()));
                assert_eq!(b.total_len, b.data.len() as u64);
                (&b.kind, &b.data[..])
            }
            other => panic!("expected blobs, got {other:?}"),
        })
        .collect();
    assert_eq!(blobs.len(), 2, "{out:?}");
    let header = task.regions.iter().find(|(a, _)| *a == LIB).unwrap();
    assert_eq!(
        blobs[0],
        (
            &BlobKind::Section {
                name: "__TEXT".into(),
                svma: 0x1_8000_0000
            },
            &header.1[..]
        )
    );
    assert_eq!(
        blobs[1],
        (
            &BlobKind::Section {
                name: "__unwind_info".into(),
                svma: 0x1_8000_1000
            },
            &[0xab; 16][..]
        )
    );
    assert_eq!(images.wants_embedding(LIB + 0x1234), None);
    assert!(images.take_files().is_empty());
}

#[test]
fn a_touched_file_image_is_queued_by_level() {
    let task = task();
    for (level, queued, blobs) in [
        (EmbedLevel::Symbols, true, 0),
        (EmbedLevel::Debug, true, 0),
        (EmbedLevel::Unwind, false, 1),
    ] {
        let mut images = Images::new(Pid(7), level);
        let mut out = Vec::new();
        images.refresh(&task, Timestamp(1), &mut out).unwrap();
        out.clear();
        let start = images.wants_embedding(EXE + 8).expect("not yet embedded");
        images.embed(&task, start, &mut out);
        // At the unwind level the header comes from memory (the
        // executable has no unwind sections in this fixture).
        assert_eq!(out.len(), blobs, "{level:?}: {out:?}");
        let files = images.take_files();
        assert_eq!(files.len(), usize::from(queued), "{level:?}");
        if queued {
            assert_eq!(files[0].path, "/Users/me/app");
            assert_eq!(files[0].uuid, EXE_UUID);
            assert_eq!(files[0].cputype, CPU_TYPE_ARM64);
        }
        assert_eq!(images.wants_embedding(EXE + 8), None);
    }
    let mut images = Images::new(Pid(7), EmbedLevel::None);
    images
        .refresh(&task, Timestamp(1), &mut Vec::new())
        .unwrap();
    assert!(!images.has_pending());
    assert_eq!(images.wants_embedding(EXE + 8), None);
}

#[test]
fn embedded_files_must_have_the_mapped_uuid() {
    let dir = std::env::temp_dir().join(format!("lrnprof-macho-images-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("app");
    let bytes = macho(2, 0, 0x1_0000_0000, 0x4000, &[], EXE_UUID);
    std::fs::write(&path, &bytes).unwrap();
    let mut file = FileToEmbed {
        path: path.to_string_lossy().into_owned(),
        uuid: EXE_UUID,
        cputype: CPU_TYPE_ARM64,
    };
    let mut out = Vec::new();
    embed_file(&file, &mut out).unwrap();
    match &out[..] {
        [Record::Blob(b)] => {
            assert_eq!(b.kind, BlobKind::Image);
            assert_eq!(b.data, bytes);
        }
        other => panic!("expected one image blob, got {other:?}"),
    }
    file.uuid = LIB_UUID;
    let msg = embed_file(&file, &mut Vec::new()).unwrap_err();
    assert!(msg.contains("UUID differs"), "{msg}");
    file.path = dir.join("missing").to_string_lossy().into_owned();
    assert!(embed_file(&file, &mut Vec::new()).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
