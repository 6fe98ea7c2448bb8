//! The bpf(2) commands the syscall programs need, each a tiny wrapper.

use super::insn::Insn;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;

/// `BPF_MAP_TYPE_HASH`.
pub(crate) const MAP_TYPE_HASH: u32 = 1;
/// `BPF_PROG_TYPE_TRACEPOINT`.
pub(crate) const PROG_TYPE_TRACEPOINT: u32 = 5;
/// `BPF_ANY`: create or replace.
pub(crate) const UPDATE_ANY: u64 = 0;

/// `_IOW('$', 8, __u32)`.
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;

/// The `BPF_MAP_CREATE` part of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

/// The `BPF_MAP_*_ELEM` part of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    /// `value`, or `next_key` for `BPF_MAP_GET_NEXT_KEY`.
    value: u64,
    flags: u64,
}

/// The `BPF_PROG_LOAD` part of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // Safety: attr is a fully initialized prefix of `union bpf_attr` for
    // this command, and the size passed is its size; pointers inside it
    // point to live buffers of the lengths it states.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

fn name16(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    // 15 bytes at most, and only the characters the kernel accepts.
    for (o, b) in out.iter_mut().zip(name.bytes().take(15)) {
        *o = if b.is_ascii_alphanumeric() || b == b'_' {
            b
        } else {
            b'_'
        };
    }
    out
}

fn owned(fd: libc::c_long) -> OwnedFd {
    // Safety: the kernel returned a new file descriptor that we now own.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

/// Create a map.
pub(crate) fn map_create(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    name: &str,
) -> io::Result<OwnedFd> {
    let mut attr = MapCreate {
        map_type,
        key_size,
        value_size,
        max_entries,
        map_name: name16(name),
        ..Default::default()
    };
    bpf(BPF_MAP_CREATE, &mut attr).map(owned)
}

/// Look `key` up; `Ok(false)` if it is not in the map.
pub(crate) fn map_lookup(map: &OwnedFd, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
    elem(BPF_MAP_LOOKUP_ELEM, map, key, value.as_mut_ptr() as u64, 0)
}

/// Look `key` up and delete it at once; `Ok(false)` if it was not there.
pub(crate) fn map_lookup_and_delete(
    map: &OwnedFd,
    key: &[u8],
    value: &mut [u8],
) -> io::Result<bool> {
    elem(
        BPF_MAP_LOOKUP_AND_DELETE_ELEM,
        map,
        key,
        value.as_mut_ptr() as u64,
        0,
    )
}

/// Set `key` to `value`.
pub(crate) fn map_update(map: &OwnedFd, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
    elem(BPF_MAP_UPDATE_ELEM, map, key, value.as_ptr() as u64, flags).map(|_| ())
}

/// Delete `key`; `Ok(false)` if it was not there.
pub(crate) fn map_delete(map: &OwnedFd, key: &[u8]) -> io::Result<bool> {
    elem(BPF_MAP_DELETE_ELEM, map, key, 0, 0)
}

/// The key after `key` (the first key for `None`) into `next`;
/// `Ok(false)` at the end.
pub(crate) fn map_next_key(map: &OwnedFd, key: Option<&[u8]>, next: &mut [u8]) -> io::Result<bool> {
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        key: key.map_or(0, |k| k.as_ptr() as u64),
        value: next.as_mut_ptr() as u64,
        ..Default::default()
    };
    not_found_is_false(bpf(BPF_MAP_GET_NEXT_KEY, &mut attr))
}

fn elem(cmd: libc::c_long, map: &OwnedFd, key: &[u8], value: u64, flags: u64) -> io::Result<bool> {
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        key: key.as_ptr() as u64,
        value,
        flags,
        ..Default::default()
    };
    not_found_is_false(bpf(cmd, &mut attr))
}

fn not_found_is_false(rc: io::Result<libc::c_long>) -> io::Result<bool> {
    match rc {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// A program the kernel refused, with what its verifier said.
#[derive(Debug)]
pub(crate) struct LoadError {
    pub error: io::Error,
    /// The verifier's log (empty when it said nothing).
    pub log: String,
}

/// Load a program; on refusal, load it again with the verifier's log on.
pub(crate) fn prog_load(
    prog_type: u32,
    insns: &[Insn],
    license: &std::ffi::CStr,
    name: &str,
) -> Result<OwnedFd, LoadError> {
    let bytes: Vec<u8> = insns.iter().flat_map(|i| i.to_bytes()).collect();
    let load = |log: &mut [u8]| {
        let mut attr = ProgLoad {
            prog_type,
            insn_cnt: insns.len() as u32,
            insns: bytes.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: u32::from(!log.is_empty()),
            log_size: log.len() as u32,
            log_buf: if log.is_empty() {
                0
            } else {
                log.as_mut_ptr() as u64
            },
            prog_name: name16(name),
            ..Default::default()
        };
        bpf(BPF_PROG_LOAD, &mut attr).map(owned)
    };
    match load(&mut []) {
        Ok(fd) => Ok(fd),
        Err(error) => {
            let mut log = vec![0u8; 64 * 1024];
            // The second attempt fails the same way, now with the reason.
            let _ = load(&mut log);
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            Err(LoadError {
                error,
                log: String::from_utf8_lossy(&log[..end]).trim().to_string(),
            })
        }
    }
}

/// Attach a tracepoint program to a tracepoint perf event: from then on it
/// runs at every hit of that tracepoint.
pub(crate) fn perf_set_bpf(event: &OwnedFd, prog: &OwnedFd) -> io::Result<()> {
    // Safety: PERF_EVENT_IOC_SET_BPF takes a file descriptor by value and
    // touches no memory.
    let rc = unsafe {
        libc::ioctl(
            event.as_raw_fd(),
            PERF_EVENT_IOC_SET_BPF as _,
            prog.as_raw_fd() as libc::c_ulong,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
