//! The crate's only `unsafe` code: calls into the operating system and the C library
//! that the standard library and the safe crates leave to the caller. Each says why
//! it is sound; everywhere else `unsafe_code` is denied.

/// Restricts the calling thread with a Landlock ruleset (`landlock_restrict_self`);
/// the caller has set `no_new_privs` (or holds `CAP_SYS_ADMIN`).
pub(crate) fn landlock_restrict_self(ruleset: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the system call takes a descriptor, borrowed and so open for the whole
    // call, and flags; no memory is passed. It only adds a Landlock domain to the
    // calling thread's credentials, which Rust code cannot observe broken.
    #[allow(unsafe_code)]
    let result =
        unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32) };
    if result == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// What [`fork_as_sibling`] returned, in the caller or in the child.
pub(crate) enum Forked {
    /// In the caller: the child's pid.
    Parent(rustix::process::Pid),
    /// In the child; `in_cgroup` when it was born in the cgroup asked for.
    Child { in_cgroup: bool },
}

/// Forks the calling process into a child whose parent is the caller's own parent
/// (`CLONE_PARENT`), born in the cgroup v2 directory `cgroup` where the kernel can do
/// that (`clone3` with `CLONE_INTO_CGROUP`, Linux 5.7) and else where the caller is.
///
/// Only for the supervisor spawner ([`crate::tools::spawner`]), which calls it while
/// it has a single thread.
pub(crate) fn fork_as_sibling(
    cgroup: Option<std::os::fd::BorrowedFd<'_>>,
) -> std::io::Result<Forked> {
    use std::os::fd::AsRawFd;

    /// `CLONE_INTO_CGROUP` of `linux/sched.h` (a 64-bit flag: clone3 only).
    const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

    /// `struct clone_args` up to `cgroup` (`CLONE_ARGS_SIZE_VER2`).
    #[repr(C)]
    #[derive(Default)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
        set_tid: u64,
        set_tid_size: u64,
        cgroup: u64,
    }

    let answer = |pid: libc::c_long, in_cgroup: bool| match pid {
        -1 => Err(std::io::Error::last_os_error()),
        0 => Ok(Forked::Child { in_cgroup }),
        pid => i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .map(Forked::Parent)
            .ok_or_else(|| std::io::Error::other("clone returned no pid")),
    };
    if let Some(cgroup) = cgroup
        && let Ok(fd) = u64::try_from(cgroup.as_raw_fd())
    {
        // With CLONE_PARENT the exit signal must be 0: the child takes the caller's.
        let args = CloneArgs {
            flags: (libc::CLONE_PARENT as u64) | CLONE_INTO_CGROUP,
            cgroup: fd,
            ..CloneArgs::default()
        };
        // SAFETY: as for the `clone` below (no new stack: the child runs on a copy of
        // this one), and `args` is a valid `clone_args` of the size passed, read by the
        // kernel during the call only.
        #[allow(unsafe_code)]
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                std::ptr::from_ref(&args),
                std::mem::size_of::<CloneArgs>(),
            )
        };
        if pid != -1 {
            return answer(pid, true);
        }
        // An older kernel, or a cgroup it will not place the child in: fork plainly;
        // the child enters the cgroup itself.
    }
    let flags = (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: with no new stack (0) and no CLONE_VM, `clone` is `fork` with another
    // parent: the child runs on a copy of this address space, and no pointer is passed.
    // The caller has one thread, so no lock, allocator state or stdio buffer can be
    // held by another thread at the fork. glibc's own fork bookkeeping is skipped: its
    // cached thread id is only read by recursive and error-checking mutexes, where a
    // stale value still names this same single thread, and `raise` asks the kernel.
    #[allow(unsafe_code)]
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    answer(pid, false)
}

/// Ends a process forked by [`fork_as_sibling`] at once (`_exit`), without the exit
/// handlers it copied from its parent: the C library's and the standard library's
/// clean-up at exit walk every loaded object and touch pages the child never used
/// (each a page fault in a fresh fork), and flush nothing it wrote (its reports go
/// straight to a socket, its complaints to unbuffered stderr).
pub(crate) fn exit_forked(code: i32) -> ! {
    // SAFETY: `_exit` takes an integer and never returns; it ends the process without
    // running any code of this process, so no invariant of it can be observed broken.
    #[allow(unsafe_code)]
    unsafe {
        libc::_exit(code)
    }
}

/// Registers an owned descriptor with the current runtime's reactor, for readiness
/// (a pidfd, a `SOCK_SEQPACKET` socket: kinds tokio has no type for).
pub(crate) fn async_fd(
    fd: std::os::fd::OwnedFd,
    interest: tokio::io::Interest,
) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: an `OwnedFd` is open, and stays open and names the same file description
    // until it is dropped; the `AsyncFd` owns it and lends only shared references, so
    // nothing can close or replace it while it is registered.
    #[allow(unsafe_code)]
    let registered = unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, interest) };
    registered.map_err(|err| err.into_parts().1)
}

/// Receives from a socket (`recv` with `flags`) into at most `limit` bytes of the
/// unfilled part of `buf`, without zeroing that room first, and counts what arrived
/// as filled. Returns how many bytes that is.
pub(crate) fn recv_into(
    socket: std::os::fd::BorrowedFd<'_>,
    buf: &mut tokio::io::ReadBuf<'_>,
    limit: usize,
    flags: rustix::net::RecvFlags,
) -> std::io::Result<usize> {
    // SAFETY: the room is only handed to the kernel to write into; nothing here
    // writes uninitialized bytes over bytes `buf` counts as initialized.
    #[allow(unsafe_code)]
    let room = unsafe { buf.unfilled_mut() };
    let limit = limit.min(room.len());
    let ((received, _), _) = rustix::net::recv(socket, &mut room[..limit], flags)?;
    let received = received.len();
    // SAFETY: the kernel wrote the first `received` bytes of the unfilled room (rustix
    // returns them as the initialized part of the slice it was given).
    #[allow(unsafe_code)]
    unsafe {
        buf.assume_init(received);
    }
    buf.advance(received);
    Ok(received)
}

/// Hands every free page of glibc's arenas back to the system (`malloc_trim`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn trim_heap() {
    // SAFETY: `malloc_trim` takes no pointers and only walks glibc's own arenas under
    // their locks; it is safe to call from any thread at any time.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Makes glibc's allocator give large blocks back when they are freed: a block of
/// 1 MiB or more gets a mapping of its own (unmapped when freed), and a heap gives
/// back a free top past 4 MiB. glibc otherwise raises both thresholds after the first
/// large free, and a thread's arena then keeps a freed large request for good
/// (`malloc_trim` does not reach the top of a thread's arena). Called once, first
/// thing in `main`, before any other thread exists.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn give_large_blocks_back() {
    // SAFETY: `mallopt` takes two integers and only sets parameters of glibc's
    // allocator; it is called before any other thread exists, so no allocation runs
    // concurrently with the change.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 4 << 20);
    }
}

/// Nothing to set outside glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn give_large_blocks_back() {}

/// Nothing to hand back outside glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn trim_heap() {}

/// Linux's scheduling policies this crate moves between (`sched_setscheduler`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheduling {
    /// `SCHED_OTHER`: what every process starts with.
    Normal,
    /// `SCHED_BATCH`: the same share of the processor, but a thread that wakes up
    /// waits for the one running where it lands to sleep or use up its slice, instead
    /// of taking the processor from it at once.
    Batch,
}

/// Sets the calling thread's scheduling policy; threads and processes it starts
/// afterwards inherit it. The nice value is kept.
#[cfg(target_os = "linux")]
pub fn set_scheduling(scheduling: Scheduling) -> std::io::Result<()> {
    let policy = match scheduling {
        Scheduling::Normal => libc::SCHED_OTHER,
        Scheduling::Batch => libc::SCHED_BATCH,
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid `sched_param` on this stack for the whole call, which
    // only reads it; pid 0 names the calling thread. Neither policy needs a privilege,
    // and neither touches memory of this process.
    #[allow(unsafe_code)]
    let status = unsafe { libc::sched_setscheduler(0, policy, &param) };
    if status == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// The calling thread's scheduling policy, when it is one of [`Scheduling`]'s.
#[cfg(target_os = "linux")]
fn scheduling() -> Option<Scheduling> {
    // SAFETY: takes a pid (0: the calling thread) and passes no memory.
    #[allow(unsafe_code)]
    let policy = unsafe { libc::sched_getscheduler(0) };
    match policy {
        libc::SCHED_OTHER => Some(Scheduling::Normal),
        libc::SCHED_BATCH => Some(Scheduling::Batch),
        _ => None,
    }
}

/// Only Linux's policies are set.
#[cfg(not(target_os = "linux"))]
pub fn set_scheduling(_: Scheduling) -> std::io::Result<()> {
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn scheduling() -> Option<Scheduling> {
    None
}

/// A process this binary becomes on behalf of a command (a supervisor, the spawner
/// of supervisors, the sandbox launcher) leaves [`Scheduling::Batch`], which it
/// inherits from `toolgate mcp`: commands run with the policy every process starts
/// with.
pub fn schedule_commands_normally() {
    if scheduling() == Some(Scheduling::Batch) {
        let _ = set_scheduling(Scheduling::Normal);
    }
}
