//! Facts about the recording machine for the trace header.

use std::time::{SystemTime, UNIX_EPOCH};

/// Name and version of this recorder, for [`lrnprof_format::TraceHeader::recorder`].
pub(crate) const RECORDER_NAME: &str = concat!("lrnprof-rec ", env!("CARGO_PKG_VERSION"));

/// The host name, or empty if unknown.
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // Safety: the buffer is valid for its length; gethostname NUL-terminates
    // on success when the name fits.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Nanoseconds since the Unix epoch, now.
pub(crate) fn wall_clock_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The system page size, in bytes.
pub(crate) fn page_size() -> u32 {
    // Safety: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as u32
    } else {
        4096
    }
}
