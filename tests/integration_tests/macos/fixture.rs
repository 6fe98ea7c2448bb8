//! What the macOS end-to-end tests share: building the Mach-O fixture,
//! reading it, the synthetic sample in `leaf`, writing the trace and running
//! the analyzer on it.

use lrnprof_format::{
    Arch, Blob, BlobKind, BuildId, Clock, ImageKind, ImageMapRecord, Os, Pid, ProcessEvent,
    ProcessRecord, Record, Regs, RegsAarch64, RegsX86_64, Sample, SampleDetail, SampleEvent,
    SampleFlags, SampleKind, StackSnapshot, Summary, Target, ThreadEvent, ThreadRecord, Tid,
    Timestamp, TraceHeader, TraceWriter, WriterOptions,
};
use lrnprof_tests::{cannot_check, fixture_source, lrnprof_analyze};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How far the image is moved from its linked address (a multiple of the
/// 16 KiB arm64 page, like ASLR's slides), so that a wrong AVMA/SVMA
/// translation cannot find the symbols.
pub(super) const SLIDE: u64 = 0x3a4_c000;
/// One past the top of the synthetic stack (AVMA), where macOS puts a main
/// thread's stack.
pub(super) const STACK_TOP: u64 = 0x1_6fdf_f000;
/// Samples written per trace; the folded count must match.
pub(super) const SAMPLES: u64 = 3;
pub(super) const PID: Pid = Pid(4242);
pub(super) const TID: Tid = Tid(0x1_2345);

/// clang targets of the fixtures.
pub(super) const ARM64: &str = "arm64-apple-macos11";
pub(super) const X86_64: &str = "x86_64-apple-macos11";

/// The expected stack, root first.
pub(super) const EXPECTED: [&str; 4] = ["start", "outer", "middle", "leaf"];

pub(super) fn runs(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A tool from the LLVM toolchain, unversioned or with Debian's suffix.
pub(super) fn find_tool(name: &str) -> Option<String> {
    let path = std::env::var_os("PATH")?;
    let names =
        std::iter::once(name.to_string()).chain((14..=22).rev().map(|v| format!("{name}-{v}")));
    for candidate in names {
        for dir in std::env::split_paths(&path) {
            if dir.join(&candidate).is_file() {
                return Some(dir.join(&candidate).to_string_lossy().into_owned());
            }
        }
    }
    None
}

/// Compile the fixture for `target` (`ARM64` or `X86_64`) with `cflags` and
/// link it into `dir/out_name`;
/// `None` when the toolchain is missing (after [`cannot_check`], which
/// fails the test under `CI=true`). A toolchain that is present but fails
/// is a test failure.
pub(super) fn build_fixture(
    dir: &Path,
    target: &str,
    out_name: &str,
    cflags: &[&str],
) -> Option<PathBuf> {
    if !runs("clang", "--version") {
        cannot_check("clang is not installed (Debian: apt-get install clang lld)");
        return None;
    }
    let Some(linker) = find_tool("ld64.lld") else {
        cannot_check("ld64.lld is not installed (Debian: apt-get install lld)");
        return None;
    };
    let object = dir.join(format!("{out_name}.o"));
    let out = dir.join(out_name);
    let run = |cmd: &mut Command, what: &str| {
        let output = cmd.output().expect("running clang");
        assert!(
            output.status.success(),
            "{what} the Mach-O fixture failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    run(
        Command::new("clang")
            .arg(format!("--target={target}"))
            .args(["-O1", "-fno-omit-frame-pointer", "-c"])
            .args(cflags)
            .arg("-o")
            .arg(&object)
            .arg(fixture_source("macho_callchain.c")),
        "compiling",
    );
    // No SDK and no libSystem: the fixture calls nothing, and `start` is
    // the entry point.
    run(
        Command::new("clang")
            .arg(format!("--target={target}"))
            .args(["-nostdlib", "-fuse-ld=lld"])
            .arg(format!("--ld-path={linker}"))
            .args([
                "-Wl,-e,_start",
                "-Wl,-platform_version,macos,11.0,11.0",
                "-o",
            ])
            .arg(&out)
            .arg(&object),
        "linking",
    );
    Some(out)
}

/// What the test needs to know about a built fixture.
pub(super) struct Fixture {
    pub(super) path: PathBuf,
    pub(super) arch: Arch,
    pub(super) bytes: Vec<u8>,
    pub(super) uuid: [u8; 16],
    /// `__TEXT` vmaddr and vmsize (SVMA).
    pub(super) text: (u64, u64),
    /// Function name (without the leading underscore) to SVMA.
    pub(super) functions: HashMap<String, u64>,
    /// `__text` address (SVMA) and bytes.
    pub(super) code: (u64, Vec<u8>),
    /// `__unwind_info` address (SVMA) and bytes, if the linker made one.
    pub(super) unwind_info: Option<(u64, Vec<u8>)>,
}

/// Function name (without the leading underscore) to SVMA.
pub(super) fn function_symbols(file: &object::File) -> HashMap<String, u64> {
    file.symbols()
        .filter_map(|s| {
            let name = s.name().ok()?.strip_prefix('_')?.to_string();
            Some((name, s.address()))
        })
        .collect()
}

impl Fixture {
    pub(super) fn load(path: &Path) -> Fixture {
        let bytes = std::fs::read(path).unwrap();
        let file = object::File::parse(&bytes[..]).unwrap();
        let arch = match file.architecture() {
            object::Architecture::Aarch64 => Arch::Aarch64,
            object::Architecture::X86_64 => Arch::X86_64,
            other => panic!("unexpected fixture architecture {other:?}"),
        };
        let uuid = file.mach_uuid().unwrap().expect("ld64.lld writes LC_UUID");
        let text = file
            .segments()
            .find(|s| s.name().ok().flatten() == Some("__TEXT"))
            .map(|s| (s.address(), s.size()))
            .unwrap();
        let functions = function_symbols(&file);
        let section = |name: &str| {
            file.section_by_name(name)
                .map(|s| (s.address(), s.data().unwrap().to_vec()))
        };
        let code = section("__text").unwrap();
        let unwind_info = section("__unwind_info");
        Fixture {
            path: path.to_owned(),
            arch,
            uuid,
            text,
            functions,
            code,
            unwind_info,
            bytes: bytes.clone(),
        }
    }

    /// The function whose code holds `svma` (the symbol at or below it).
    pub(super) fn function_containing(&self, svma: u64) -> &str {
        self.functions
            .iter()
            .filter(|(name, &start)| start <= svma && !name.starts_with('_'))
            .max_by_key(|(_, &start)| start)
            .map(|(name, _)| name.as_str())
            .unwrap_or("?")
    }

    pub(super) fn function(&self, name: &str) -> u64 {
        *self
            .functions
            .get(name)
            .unwrap_or_else(|| panic!("fixture has no symbol {name}"))
    }

    /// The return address (SVMA) of the `bl callee` inside `caller`: the
    /// instruction after it. Found by decoding, not by fixed offsets, so a
    /// different compiler version still gives the right answer.
    pub(super) fn return_address(&self, caller: &str, callee: &str) -> u64 {
        let (base, code) = &self.code;
        let start = self.function(caller);
        let end = self
            .functions
            .values()
            .filter(|&&a| a > start)
            .min()
            .copied()
            .unwrap_or(base + code.len() as u64);
        let target = self.function(callee);
        let body = &code[(start - base) as usize..(end - base) as usize];
        match self.arch {
            Arch::Aarch64 => {
                for (i, insn) in body.chunks_exact(4).enumerate() {
                    let at = start + 4 * i as u64;
                    let insn = u32::from_le_bytes(insn.try_into().unwrap());
                    // BL: 0b100101 then a signed 26-bit word offset.
                    if insn >> 26 == 0b100101 {
                        let offset = (((insn & 0x03ff_ffff) << 6) as i32 >> 6) as i64 * 4;
                        if at.wrapping_add(offset as u64) == target {
                            return at + 4;
                        }
                    }
                }
            }
            Arch::X86_64 => {
                // CALL rel32: e8 then a signed offset from the next instruction.
                for (i, w) in body.windows(5).enumerate() {
                    let next = start + i as u64 + 5;
                    let offset = i32::from_le_bytes(w[1..5].try_into().unwrap()) as i64;
                    if w[0] == 0xe8 && next.wrapping_add(offset as u64) == target {
                        return next;
                    }
                }
            }
        }
        panic!("no call to {callee} in {caller}");
    }

    /// Header plus load commands: what the recorder embeds as `__TEXT` for a
    /// shared-cache image.
    pub(super) fn header_and_load_commands(&self) -> Vec<u8> {
        let sizeofcmds = u32::from_le_bytes(self.bytes[20..24].try_into().unwrap()) as usize;
        self.bytes[..32 + sizeofcmds].to_vec()
    }
}

/// Registers and stack of a thread stopped inside `leaf`, called from
/// `middle`, from `outer`, from `start`, with the image slid by [`SLIDE`].
pub(super) fn sample_in_leaf(fx: &Fixture) -> (Regs, StackSnapshot) {
    let ret_into_middle = fx.return_address("middle", "leaf") + SLIDE;
    let ret_into_outer = fx.return_address("outer", "middle") + SLIDE;
    let ret_into_start = fx.return_address("start", "outer") + SLIDE;
    let (regs, sp, words) = match fx.arch {
        Arch::Aarch64 => {
            // Frame records: each function that calls pushes (caller's fp,
            // return address) and points fp at the pair; `leaf` pushes
            // nothing and returns through lr. From sp upwards:
            //   sp+0  middle's record: outer's fp, return into outer
            //   sp+16 outer's record:  start's fp, return into start
            //   sp+32 start's locals (16 bytes)
            //   sp+48 start's record:  0, 0 (the end of the chain)
            let sp = STACK_TOP - 64;
            let words = vec![
                sp + 16,
                ret_into_outer,
                sp + 48,
                ret_into_start,
                0,
                0x0000_0001_0000_0000, // start's `volatile int x = 1`, padding
                0,
                0,
            ];
            let regs = Regs::Aarch64(RegsAarch64 {
                // Inside leaf's loop, three instructions in.
                pc: fx.function("leaf") + 12 + SLIDE,
                sp,
                fp: sp,
                lr: ret_into_middle,
            });
            (regs, sp, words)
        }
        Arch::X86_64 => {
            // Each function pushes rbp and points rbp at it; each call
            // pushed the return address just above. From rsp upwards:
            //   rsp+0  leaf's saved rbp (middle's), return into middle
            //   rsp+16 middle's saved rbp (outer's), return into outer
            //   rsp+32 outer's saved rbp (start's), return into start
            //   rsp+48 start's saved rax and rbx
            //   rsp+64 start's saved rbp: 0 (the end of the chain), no return
            let sp = STACK_TOP - 80;
            let words = vec![
                sp + 16,
                ret_into_middle,
                sp + 32,
                ret_into_outer,
                sp + 64,
                ret_into_start,
                0,
                0,
                0,
                0,
            ];
            let leaf = fx.function("leaf");
            let prologue = &fx.code.1[(leaf - fx.code.0) as usize..][..4];
            assert_eq!(
                prologue,
                [0x55, 0x48, 0x89, 0xe5],
                "push %rbp; mov %rsp,%rbp"
            );
            let regs = Regs::X86_64(RegsX86_64 {
                // Right after leaf's prologue: its frame is set up.
                ip: leaf + 4 + SLIDE,
                sp,
                bp: sp,
            });
            (regs, sp, words)
        }
    };
    let stack = StackSnapshot {
        start: sp,
        bytes: words.iter().flat_map(|w| w.to_le_bytes()).collect(),
    };
    (regs, stack)
}

/// Write a trace of [`SAMPLES`] identical samples in `leaf`, with the
/// fixture mapped as `kind` under `recorded_path`, plus `blobs`.
pub(super) fn write_trace(
    fx: &Fixture,
    out: &Path,
    kind: ImageKind,
    recorded_path: &str,
    blobs: Vec<Blob>,
) {
    write_trace_of(fx, out, kind, recorded_path, blobs, sample_in_leaf(fx));
}

/// [`write_trace`] with the given registers and stack.
pub(super) fn write_trace_of(
    fx: &Fixture,
    out: &Path,
    kind: ImageKind,
    recorded_path: &str,
    blobs: Vec<Blob>,
    (regs, stack): (Regs, StackSnapshot),
) {
    let header = TraceHeader {
        arch: fx.arch,
        os: Os::MacOs,
        page_size: 16384,
        clock: Clock::MachAbsolute,
        target: Target::Launch {
            command: vec![recorded_path.to_string()],
            pid: PID,
        },
        ..TraceHeader::example()
    };
    let mut header = header;
    header.sampling.event = SampleEvent::Timer;
    header.sampling.kernel_callchain = false;
    let text_start = fx.text.0 + SLIDE;
    let mut records = vec![
        Record::Process(ProcessRecord {
            time: Timestamp(10),
            pid: PID,
            parent: None,
            event: ProcessEvent::Exec,
            command: vec![recorded_path.to_string()],
            executable: Some(recorded_path.to_string()),
            cgroup: None,
        }),
        Record::Thread(ThreadRecord {
            time: Timestamp(20),
            pid: PID,
            tid: TID,
            event: ThreadEvent::Existing,
            name: Some("main".to_string()),
        }),
        Record::ImageMap(ImageMapRecord {
            time: Timestamp(30),
            pid: PID,
            start: text_start,
            end: text_start + fx.text.1,
            file_offset: 0,
            path: recorded_path.to_string(),
            build_id: Some(BuildId(fx.uuid.to_vec())),
            kind,
            executable: true,
        }),
    ];
    for i in 0..SAMPLES {
        records.push(Record::Sample(Sample {
            time: Timestamp(1_000 * (i + 1)),
            pid: PID,
            tid: TID,
            cpu: None,
            kind: SampleKind::CpuTime,
            weight: 1_000_000,
            regs,
            stack: stack.clone(),
            kernel_callchain: Vec::new(),
            frames: Vec::new(),
            kernel_frames: Vec::new(),
            flags: SampleFlags::default(),
            detail: SampleDetail::None,
        }));
    }
    records.extend(blobs.into_iter().map(Record::Blob));
    records.push(Record::Summary(Summary {
        end_time: Timestamp(10_000),
        samples: SAMPLES,
        lost: 0,
        threads: 1,
        images: 1,
    }));
    let file = std::fs::File::create(out).unwrap();
    let mut writer = TraceWriter::new(file, &header, WriterOptions::default()).unwrap();
    for r in &records {
        writer.write(r).unwrap();
    }
    writer.finish().unwrap();
}

/// Run `lrnprof-analyze --format folded` on `trace`; return the stacks
/// (frames root first, after the thread label) with their counts.
pub(super) fn analyze_folded(trace: &Path, extra: &[&str]) -> Vec<(Vec<String>, u64)> {
    let out = trace.with_extension("folded");
    let output = Command::new(lrnprof_analyze())
        .arg(trace)
        .args(["--format", "folded", "-o"])
        .arg(&out)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "lrnprof-analyze failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(&out).unwrap();
    text.lines()
        .map(|line| {
            let (stack, count) = line.rsplit_once(' ').expect("`STACK COUNT` lines");
            let mut frames: Vec<String> = stack.split(';').map(str::to_string).collect();
            frames.remove(0); // the thread label
            (frames, count.parse().expect("a sample count"))
        })
        .collect()
}

pub(super) fn assert_single_stack(stacks: &[(Vec<String>, u64)], expected: &[&str]) {
    assert_eq!(
        stacks.len(),
        1,
        "expected one stack, got {stacks:?} (all samples are identical)"
    );
    let (frames, count) = &stacks[0];
    assert_eq!(frames, expected, "unwound stack");
    assert_eq!(*count, SAMPLES);
}

/// A blob record holding all of `data` (what the recorder writes for a
/// section that fits one record).
pub(super) fn section_blob(fx: &Fixture, name: &str, svma: u64, data: Vec<u8>) -> Blob {
    Blob {
        build_id: BuildId(fx.uuid.to_vec()),
        kind: BlobKind::Section {
            name: name.to_string(),
            svma,
        },
        compressed: false,
        offset: 0,
        total_len: data.len() as u64,
        data,
    }
}

/// One stack whose frames are named `IMAGE+OFFSET` (the offset from the
/// image's base, `__TEXT`), each landing in the expected function of `fx`
/// (return addresses are shown minus one, inside the call instruction).
pub(super) fn assert_frames_at_offsets(stacks: &[(Vec<String>, u64)], fx: &Fixture, image: &str) {
    assert_eq!(stacks.len(), 1, "{stacks:?}");
    let (frames, count) = &stacks[0];
    assert_eq!(*count, SAMPLES);
    let prefix = format!("{image}+0x");
    let functions: Vec<&str> = frames
        .iter()
        .map(|f| {
            let offset = f
                .strip_prefix(&prefix)
                .and_then(|hex| u64::from_str_radix(hex, 16).ok())
                .unwrap_or_else(|| panic!("frame {f:?} is not {image}+OFFSET: {frames:?}"));
            fx.function_containing(fx.text.0 + offset)
        })
        .collect();
    assert_eq!(functions, EXPECTED, "frames {frames:?}");
}

/// A hand-made `__eh_frame` at SVMA `svma` for the fixture built with
/// `-fomit-frame-pointer` (ld64.lld 14 writes a broken one): one CIE
/// (CFA = sp, return address in x30) and one FDE per function.
pub(super) fn eh_frame_for_omit_fp(fx: &Fixture, svma: u64) -> Vec<u8> {
    // DW_CFA_advance_loc 4; DW_CFA_def_cfa_offset N;
    // DW_CFA_offset x30 at CFA-8; DW_CFA_offset x29 at CFA-16.
    let push_frame = |size: u8| vec![0x44, 0x0e, size, 0x9e, 0x01, 0x9d, 0x02];
    let functions = [
        ("leaf", Vec::new()),       // frameless: nothing moves
        ("middle", push_frame(16)), // stp x29, x30, [sp, #-16]!
        ("outer", push_frame(16)),  // stp x29, x30, [sp, #-16]!
        // sub sp, sp, #32; stp x29, x30, [sp, #16]
        ("start", vec![0x44, 0x0e, 32, 0x44, 0x9e, 0x01, 0x9d, 0x02]),
    ];
    let mut out = Vec::new();
    #[rustfmt::skip]
    let cie: Vec<u8> = vec![
        0, 0, 0, 0,       // CIE id
        1,                // version
        b'z', b'R', 0,    // augmentation
        1,                // code alignment factor
        0x78,             // data alignment factor: -8
        30,               // return address register: x30
        1,                // augmentation data length
        0x1b,             // FDE pointers: pc-relative sdata4
        0x0c, 31, 0,      // DW_CFA_def_cfa sp, 0
        0, 0, 0,          // DW_CFA_nop padding to a multiple of 4
    ];
    out.extend_from_slice(&(cie.len() as u32).to_le_bytes());
    out.extend_from_slice(&cie);
    let ends: Vec<u64> = {
        let mut starts: Vec<u64> = functions.iter().map(|(n, _)| fx.function(n)).collect();
        starts.sort_unstable();
        starts
    };
    for (name, instructions) in functions {
        let start = fx.function(name);
        let end = ends
            .iter()
            .copied()
            .find(|&a| a > start)
            .unwrap_or(fx.code.0 + fx.code.1.len() as u64);
        let fde_start = out.len();
        let mut body = Vec::new();
        // CIE pointer: from this field back to the CIE at offset 0.
        body.extend_from_slice(&((fde_start + 4) as u32).to_le_bytes());
        let pc_field = svma + (fde_start + 8) as u64;
        body.extend_from_slice(&((start.wrapping_sub(pc_field)) as u32).to_le_bytes());
        body.extend_from_slice(&((end - start) as u32).to_le_bytes());
        body.push(0); // augmentation data length
        body.extend_from_slice(&instructions);
        while (body.len() + 4) % 4 != 0 {
            body.push(0); // DW_CFA_nop
        }
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
    }
    out.extend_from_slice(&0u32.to_le_bytes()); // terminator
    out
}
