//! Hand-built traces of another architecture than the host's, from real
//! images built with clang.

use super::*;

/// The `bl` in `caller`'s code that calls `callee`: the return address
/// (the instruction after it).
fn return_after_bl(text: &[u8], text_svma: u64, caller: (u64, u64), callee: u64) -> u64 {
    let (start, size) = caller;
    (start..start + size)
        .step_by(4)
        .find(|&pc| {
            let at = (pc - text_svma) as usize;
            let insn = u32::from_le_bytes(text[at..at + 4].try_into().unwrap());
            // BL: 100101 imm26, target = pc + sign_extend(imm26) * 4.
            insn & 0xfc00_0000 == 0x9400_0000 && {
                let imm = ((insn & 0x03ff_ffff) << 6) as i32 >> 6;
                pc.wrapping_add_signed(i64::from(imm) * 4) == callee
            }
        })
        .map(|pc| pc + 4)
        .unwrap_or_else(|| panic!("no bl to {callee:#x} in {caller:x?}"))
}

#[test]
fn aarch64_linux_trace_unwinds_through_elf_cfi_at_a_slid_address() {
    use lrnprof_format::*;
    use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
    let dir = scratch_dir("an-arm64");
    let exe = dir.join("an_arm64");
    let built = Command::new("clang")
        .args([
            "--target=aarch64-linux-gnu",
            "-O2",
            "-g",
            "-fno-omit-frame-pointer",
            "-ffreestanding",
            "-nostdlib",
            "-fPIE",
            "-fasynchronous-unwind-tables",
            "-fuse-ld=lld",
            "-Wl,-pie",
            "-Wl,-e,start",
            "-Wl,--build-id",
            "-Wl,--eh-frame-hdr",
            "-o",
        ])
        .arg(&exe)
        .arg(lrnprof_tests::fixture_source("an_arm64.c"))
        .output();
    match built {
        Ok(out) if out.status.success() => {}
        other => skip!("clang cannot build an aarch64 ELF here (Debian: clang lld): {other:?}"),
    }
    let bytes = std::fs::read(&exe).unwrap();
    let obj = object::File::parse(&bytes[..]).unwrap();
    let sym = |name: &str| {
        let s = obj.symbols().find(|s| s.name() == Ok(name)).unwrap();
        (s.address(), s.size())
    };
    let (leaf, middle, outer, start) = (sym("leaf"), sym("middle"), sym("outer"), sym("start"));
    let text = obj.section_by_name(".text").unwrap();
    let (text_svma, text_bytes) = (text.address(), text.data().unwrap());
    let ret_middle = return_after_bl(text_bytes, text_svma, middle, leaf.0);
    let ret_outer = return_after_bl(text_bytes, text_svma, outer, middle.0);
    let ret_start = return_after_bl(text_bytes, text_svma, start, outer.0);

    // Loaded 0x7fa0_0000_0000 above its SVMAs, as a PIE would be.
    const SLIDE: u64 = 0x7fa0_0000_0000;
    let pid = Pid(77);
    let mut records = vec![Record::Thread(ThreadRecord {
        time: Timestamp(1),
        pid,
        tid: Tid(77),
        event: ThreadEvent::Existing,
        name: Some("arm".into()),
    })];
    let build_id = obj.build_id().unwrap().map(|b| BuildId(b.to_vec()));
    for seg in obj.segments() {
        let (offset, size) = seg.file_range();
        let exec = matches!(seg.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & 1 != 0);
        // What the kernel maps: whole pages.
        let page_start = seg.address() & !0xfff;
        let page_end = (seg.address() + size + 0xfff) & !0xfff;
        records.push(Record::ImageMap(ImageMapRecord {
            time: Timestamp(2),
            pid,
            start: SLIDE + page_start,
            end: SLIDE + page_end.max(page_start + 0x1000),
            file_offset: offset & !0xfff,
            path: exe.to_string_lossy().into_owned(),
            build_id: build_id.clone(),
            kind: ImageKind::File,
            executable: exec,
        }));
    }
    // leaf has no frame record: sp = middle's record, lr = into middle.
    // Records (fp, lr) at S (middle), S+16 (outer), S+48 (start, whose
    // frame is 32 bytes with the record at its top); start's record ends
    // the chain with zeros.
    const S: u64 = 0xffff_f000_0000;
    let words: [u64; 10] = [
        S + 16,            // S+0:  middle's saved fp = outer's record
        SLIDE + ret_outer, // S+8:  middle's saved lr
        S + 48,            // S+16: outer's saved fp = start's record
        SLIDE + ret_start, // S+24: outer's saved lr
        0,                 // S+32: start's locals
        0,                 // S+40
        0,                 // S+48: start's saved fp: end of chain
        0,                 // S+56: start's saved lr
        0,
        0,
    ];
    let stack: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    for i in 0..3 {
        records.push(Record::Sample(Sample {
            time: Timestamp(10 + i),
            pid,
            tid: Tid(77),
            cpu: None,
            kind: SampleKind::CpuTime,
            weight: 1_000_000,
            regs: Regs::Aarch64(RegsAarch64 {
                pc: SLIDE + leaf.0 + 12,
                sp: S,
                fp: S,
                lr: SLIDE + ret_middle,
            }),
            stack: StackSnapshot {
                start: S,
                bytes: stack.clone(),
            },
            kernel_callchain: Vec::new(),
            frames: Vec::new(),
            kernel_frames: Vec::new(),
            flags: SampleFlags::default(),
            detail: SampleDetail::None,
        }));
    }
    let header = TraceHeader {
        arch: Arch::Aarch64,
        ..TraceHeader::example()
    };
    let trace = dir.join("arm.lpt");
    let mut out = Vec::new();
    let mut w = TraceWriter::new(&mut out, &header, WriterOptions::default()).unwrap();
    for r in &records {
        w.write(r).unwrap();
    }
    w.finish().unwrap();
    std::fs::write(&trace, out).unwrap();

    assert_eq!(
        folded_text(&trace, &[]),
        "arm-77;start;outer;middle;leaf 3\n"
    );
    let i = info(&trace, &[]);
    assert!(root_pct(&i) >= 99.0, "{i}");
}
