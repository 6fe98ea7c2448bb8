//! Tiny wrappers around the Mach and BSD calls of the macOS backend. Each
//! `unsafe` block says why it is sound; nothing here parses bytes (that is
//! `crate::macho`).

use crate::error::RecordError;
use mach2::kern_return::{kern_return_t, KERN_SUCCESS};
use mach2::mach_port::mach_port_deallocate;
use mach2::mach_types::thread_act_t;
use mach2::message::mach_msg_type_number_t;
use mach2::port::{mach_port_name_t, mach_port_t, MACH_PORT_NULL};
use mach2::task::{task_info, task_threads};
use mach2::task_info::{task_dyld_info, TASK_DYLD_INFO};
use mach2::thread_act::{thread_get_state, thread_resume, thread_suspend};
use mach2::thread_status::thread_state_flavor_t;
use mach2::traps::{mach_task_self, task_for_pid};
use mach2::vm::{mach_vm_deallocate, mach_vm_read_overwrite, mach_vm_region};
use mach2::vm_region::{vm_region_basic_info_64, VM_REGION_BASIC_INFO_64};
use mach2::vm_types::{mach_vm_address_t, mach_vm_size_t};
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;

/// A failed Mach call's `kern_return_t`.
pub(super) type Kern = kern_return_t;

/// A [`RecordError::Sys`] for a failed Mach call.
pub(super) fn kern_error(what: impl Into<String>, code: Kern) -> RecordError {
    RecordError::Sys {
        what: what.into(),
        source: std::io::Error::other(format!("kern_return_t {code:#x}")),
    }
}

fn check(code: kern_return_t) -> Result<(), Kern> {
    if code == KERN_SUCCESS {
        Ok(())
    } else {
        Err(code)
    }
}

/// Our own task port name.
fn self_task() -> mach_port_t {
    // Safety: reads the process-wide constant set up by libSystem at start.
    unsafe { mach_task_self() }
}

/// A send right to a port in our IPC space, released on drop.
#[derive(Debug)]
pub(super) struct Port(mach_port_name_t);

impl Port {
    /// The port name, for passing to Mach calls.
    pub fn name(&self) -> mach_port_name_t {
        self.0
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        // Safety: we own one user reference to this name; releasing it
        // cannot affect memory safety.
        unsafe { mach_port_deallocate(self_task(), self.0) };
    }
}

/// The task port of process `pid`.
pub(super) fn task_for(pid: u32) -> Result<Port, Kern> {
    let mut task: mach_port_name_t = MACH_PORT_NULL;
    // Safety: `task` is a valid out-pointer for the duration of the call.
    check(unsafe { task_for_pid(self_task(), pid as libc::c_int, &mut task) })?;
    Ok(Port(task))
}

/// The threads of a task at one moment: the port array and one send right
/// per thread, all released on drop (so none leak, whatever happens to the
/// threads in between).
pub(super) struct ThreadList {
    ports: *mut thread_act_t,
    count: mach_msg_type_number_t,
}

impl ThreadList {
    /// The thread ports.
    pub fn ports(&self) -> &[thread_act_t] {
        if self.ports.is_null() {
            return &[];
        }
        // Safety: task_threads returned `count` initialized ports at
        // `ports`, which stay mapped until we deallocate them in drop.
        unsafe { std::slice::from_raw_parts(self.ports, self.count as usize) }
    }
}

impl AsRef<[thread_act_t]> for ThreadList {
    fn as_ref(&self) -> &[thread_act_t] {
        self.ports()
    }
}

impl Drop for ThreadList {
    fn drop(&mut self) {
        for &port in self.ports() {
            // Safety: each port is a send right task_threads gave us.
            unsafe { mach_port_deallocate(self_task(), port) };
        }
        if !self.ports.is_null() {
            let size = self.count as usize * std::mem::size_of::<thread_act_t>();
            // Safety: the array was allocated in our address space by
            // task_threads (out-of-line memory) and is not used after this.
            unsafe { mach_vm_deallocate(self_task(), self.ports as u64, size as u64) };
        }
    }
}

/// The current threads of `task`.
pub(super) fn threads_of(task: &Port) -> Result<ThreadList, Kern> {
    let mut ports: *mut thread_act_t = std::ptr::null_mut();
    let mut count: mach_msg_type_number_t = 0;
    // Safety: both out-pointers are valid; on success the kernel hands us
    // ownership of the array and of one send right per element.
    check(unsafe { task_threads(task.name(), &mut ports, &mut count) })?;
    Ok(ThreadList { ports, count })
}

/// `thread_info(flavor)` into a plain-old-data struct `T`.
fn thread_info_of<T: Copy>(thread: thread_act_t, flavor: libc::c_int) -> Result<T, Kern> {
    // Safety: T is a C struct of integers (all-zero is a valid value).
    let mut info: T = unsafe { std::mem::zeroed() };
    let mut count =
        (std::mem::size_of::<T>() / std::mem::size_of::<libc::c_int>()) as mach_msg_type_number_t;
    // Safety: `info` has room for `count` natural_t words; the kernel
    // writes at most that many.
    check(unsafe {
        libc::thread_info(
            thread,
            flavor as libc::thread_flavor_t,
            (&mut info as *mut T).cast(),
            &mut count,
        )
    })?;
    Ok(info)
}

/// The thread's user plus system CPU time, in nanoseconds
/// (`THREAD_BASIC_INFO`, microsecond resolution).
pub(super) fn thread_cpu_time_ns(thread: thread_act_t) -> Result<u64, Kern> {
    let info: libc::thread_basic_info = thread_info_of(thread, libc::THREAD_BASIC_INFO)?;
    let us = |t: libc::time_value_t| t.seconds as u64 * 1_000_000 + t.microseconds as u64;
    Ok((us(info.user_time) + us(info.system_time)) * 1_000)
}

/// The system-wide 64-bit thread id (`pthread_threadid_np`'s value).
pub(super) fn thread_id(thread: thread_act_t) -> Result<u64, Kern> {
    let info: libc::thread_identifier_info = thread_info_of(thread, libc::THREAD_IDENTIFIER_INFO)?;
    Ok(info.thread_id)
}

/// The thread's name, if it has one.
pub(super) fn thread_name(thread: thread_act_t) -> Option<String> {
    let info: libc::thread_extended_info =
        thread_info_of(thread, libc::THREAD_EXTENDED_INFO).ok()?;
    let bytes: Vec<u8> = info
        .pth_name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    (!bytes.is_empty()).then(|| String::from_utf8_lossy(&bytes).into_owned())
}

/// A suspended thread, resumed on drop: no error path can leave the target
/// thread stopped.
pub(super) struct Suspended(thread_act_t);

impl Suspended {
    /// Suspend `thread` until the guard drops.
    pub fn new(thread: thread_act_t) -> Result<Suspended, Kern> {
        // Safety: suspending another task's thread is a kernel call on a
        // port we hold; the guard pairs it with exactly one resume.
        check(unsafe { thread_suspend(thread) })?;
        Ok(Suspended(thread))
    }
}

impl Drop for Suspended {
    fn drop(&mut self) {
        // Safety: balances the successful thread_suspend in `new`.
        unsafe { thread_resume(self.0) };
    }
}

/// `thread_get_state(flavor)` into `words`; returns the words filled.
pub(super) fn thread_state(
    thread: &Suspended,
    flavor: thread_state_flavor_t,
    words: &mut [u32],
) -> Result<usize, Kern> {
    let mut count = words.len() as mach_msg_type_number_t;
    // Safety: `words` has room for `count` natural_t; the kernel writes at
    // most `count` and updates it to what it wrote.
    check(unsafe { thread_get_state(thread.0, flavor, words.as_mut_ptr(), &mut count) })?;
    Ok((count as usize).min(words.len()))
}

/// Copy `buf.len()` bytes at `address` of `task` into `buf`.
pub(super) fn read_memory(task: &Port, address: u64, buf: &mut [u8]) -> Result<(), Kern> {
    let mut copied: mach_vm_size_t = 0;
    // Safety: the destination is our own writable buffer of exactly the
    // requested size; the kernel copies into it or fails.
    check(unsafe {
        mach_vm_read_overwrite(
            task.name(),
            address,
            buf.len() as mach_vm_size_t,
            buf.as_mut_ptr() as mach_vm_address_t,
            &mut copied,
        )
    })?;
    if copied as usize != buf.len() {
        return Err(mach2::kern_return::KERN_INVALID_ADDRESS);
    }
    Ok(())
}

/// The VM region of `task` containing `address`: `(start, end)` AVMAs.
pub(super) fn region_containing(task: &Port, address: u64) -> Option<(u64, u64)> {
    let mut start: mach_vm_address_t = address;
    let mut size: mach_vm_size_t = 0;
    let mut info = vm_region_basic_info_64::default();
    let mut count = vm_region_basic_info_64::count();
    let mut object: mach_port_t = MACH_PORT_NULL;
    // Safety: all out-pointers are valid; `info` has room for `count` words.
    let code = unsafe {
        mach_vm_region(
            task.name(),
            &mut start,
            &mut size,
            VM_REGION_BASIC_INFO_64,
            (&mut info as *mut vm_region_basic_info_64).cast(),
            &mut count,
            &mut object,
        )
    };
    // mach_vm_region returns the next region at or above `address`.
    (code == KERN_SUCCESS && start <= address).then(|| (start, start.saturating_add(size)))
}

/// AVMA of the task's `dyld_all_image_infos`; 0 before dyld has run.
pub(super) fn dyld_all_image_infos_address(task: &Port) -> Result<u64, Kern> {
    let mut info = task_dyld_info::default();
    let mut count = (std::mem::size_of::<task_dyld_info>() / std::mem::size_of::<u32>())
        as mach_msg_type_number_t;
    // Safety: `info` has room for `count` natural_t words.
    check(unsafe {
        task_info(
            task.name(),
            TASK_DYLD_INFO,
            (&mut info as *mut task_dyld_info).cast(),
            &mut count,
        )
    })?;
    Ok(info.all_image_info_addr)
}

/// `mach_absolute_time` converted to nanoseconds.
#[derive(Debug, Clone, Copy)]
pub(super) struct MachClock {
    numer: u64,
    denom: u64,
}

impl MachClock {
    /// Read the timebase (1/1 on Intel, 125/3 on Apple silicon).
    pub fn new() -> MachClock {
        let mut info = mach2::mach_time::mach_timebase_info::default();
        // Safety: `info` is a valid out-pointer.
        let code = unsafe { mach2::mach_time::mach_timebase_info(&mut info) };
        if code != KERN_SUCCESS || info.denom == 0 {
            return MachClock { numer: 1, denom: 1 };
        }
        MachClock {
            numer: info.numer.into(),
            denom: info.denom.into(),
        }
    }

    /// Now, in nanoseconds on the `mach_absolute_time` clock.
    pub fn now_ns(&self) -> u64 {
        // Safety: no preconditions.
        let ticks = unsafe { mach2::mach_time::mach_absolute_time() };
        (u128::from(ticks) * u128::from(self.numer) / u128::from(self.denom)) as u64
    }
}

/// Start `command` suspended before its first instruction
/// (`POSIX_SPAWN_START_SUSPENDED`); resume it with [`resume_process`].
pub(super) fn spawn_suspended(command: &[OsString]) -> Result<u32, RecordError> {
    let Some(first) = command.first() else {
        return Err(RecordError::InvalidOption("no command to launch".into()));
    };
    let program = first.to_string_lossy().into_owned();
    let to_c = |s: &OsString| {
        CString::new(s.as_bytes()).map_err(|_| {
            RecordError::InvalidOption(format!("the command argument {s:?} contains a NUL byte"))
        })
    };
    let args = command.iter().map(to_c).collect::<Result<Vec<_>, _>>()?;
    let mut argv: Vec<*mut libc::c_char> = args.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv.push(std::ptr::null_mut());
    extern "C" {
        static environ: *const *mut libc::c_char;
    }
    let mut attr: libc::posix_spawnattr_t = std::ptr::null_mut();
    let mut pid: libc::pid_t = 0;
    // Safety: `attr` is initialized before use and destroyed after;
    // argv is NUL-terminated and its strings outlive the call; environ is
    // the process environment maintained by libc.
    let rc = unsafe {
        let rc = libc::posix_spawnattr_init(&mut attr);
        if rc != 0 {
            return Err(RecordError::Sys {
                what: "posix_spawnattr_init".into(),
                source: std::io::Error::from_raw_os_error(rc),
            });
        }
        libc::posix_spawnattr_setflags(&mut attr, libc::POSIX_SPAWN_START_SUSPENDED as _);
        let rc = libc::posix_spawnp(
            &mut pid,
            args[0].as_ptr(),
            std::ptr::null(),
            &attr,
            argv.as_ptr(),
            environ,
        );
        libc::posix_spawnattr_destroy(&mut attr);
        rc
    };
    match rc {
        0 => Ok(pid as u32),
        // A path to a file that exists: what is missing is what it names
        // (a script's interpreter).
        libc::ENOENT if program.contains('/') && std::path::Path::new(&program).is_file() => {
            Err(RecordError::CommandNotExecutable {
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    crate::error::missing_interpreter(std::path::Path::new(&program)),
                ),
                command: program,
            })
        }
        libc::ENOENT => Err(RecordError::CommandNotFound { command: program }),
        errno => Err(RecordError::CommandNotExecutable {
            command: program,
            source: std::io::Error::from_raw_os_error(errno),
        }),
    }
}

/// Let a process started by [`spawn_suspended`] run.
pub(super) fn resume_process(pid: u32) -> Result<(), RecordError> {
    // Safety: plain signal send.
    if unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) } != 0 {
        return Err(RecordError::last_os(format!("resuming pid {pid}")));
    }
    Ok(())
}

/// Kill and reap a child we started; how it ended, as [`try_wait`] says.
pub(super) fn kill_child(pid: u32) -> Option<(Option<i32>, Option<i32>)> {
    signal(pid, libc::SIGKILL);
    let mut status = 0;
    // Safety: waits on our own child, which SIGKILL ends promptly.
    let rc = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
    (rc == pid as libc::pid_t).then(|| decode_status(status))?
}

/// Send `signal` to `pid`, ignoring failure (it may have exited).
pub(super) fn signal(pid: u32, signal: libc::c_int) {
    // Safety: plain signal send.
    unsafe { libc::kill(pid as libc::pid_t, signal) };
}

/// How a child ended: `Some((code, signal))` once it has, without blocking.
pub(super) fn try_wait(pid: u32) -> Option<(Option<i32>, Option<i32>)> {
    let mut status = 0;
    // Safety: waits on our own child without blocking.
    let rc = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) };
    if rc != pid as libc::pid_t {
        return None;
    }
    decode_status(status)
}

fn decode_status(status: libc::c_int) -> Option<(Option<i32>, Option<i32>)> {
    if libc::WIFEXITED(status) {
        Some((Some(libc::WEXITSTATUS(status)), None))
    } else if libc::WIFSIGNALED(status) {
        Some((None, Some(libc::WTERMSIG(status))))
    } else {
        None
    }
}

/// Whether a process with this pid exists (we may lack the right to signal it).
pub(super) fn process_exists(pid: u32) -> bool {
    // Safety: signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The executable path of `pid`, if the kernel tells us.
pub(super) fn executable_path(pid: u32) -> Option<String> {
    let mut buf = vec![0u8; libc::PROC_PIDPATHINFO_MAXSIZE as usize];
    // Safety: the buffer is valid for its length.
    let n = unsafe {
        libc::proc_pidpath(
            pid as libc::c_int,
            buf.as_mut_ptr().cast(),
            buf.len() as u32,
        )
    };
    (n > 0).then(|| String::from_utf8_lossy(&buf[..n as usize]).into_owned())
}
