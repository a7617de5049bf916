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
/// Only for the supervisor spawner ([`crate::exec::spawner`]), which calls it while
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

/// The longest answer [`send_then_take_out`] sends: answers to single calls; longer
/// writes (a batch, a large file) go the usual way.
pub(crate) const PAIRED_SEND_BYTES: usize = 16 * 1024;
/// The most bytes [`send_then_take_out`] takes out of the socket.
pub(crate) const PAIRED_TAKE_OUT_BYTES: usize = 16 * 1024;

/// What [`send_then_take_out`] did; `None` for a part it did not do.
pub(crate) struct SentAndTaken {
    /// Bytes sent, or why not (`WouldBlock` when the socket is full).
    pub(crate) sent: Option<std::io::Result<usize>>,
    /// Bytes taken out of the receive queue, or why not.
    pub(crate) taken: Option<std::io::Result<usize>>,
}

/// Sends `answer` on a stream socket and takes `take_out` bytes, which a `MSG_PEEK`
/// already returned, out of its receive queue, in one system call: two requests
/// submitted together to this thread's `io_uring`, both without waiting
/// (`MSG_DONTWAIT`), so both are done when the call returns. No return to user space
/// falls between them, so a client the answer woke cannot take the processor before
/// its request is taken out (see `rpc/unix/socket.rs` for why that matters).
///
/// `None` when the thread has no ring: the kernel refuses `io_uring` (too old, turned
/// off, or filtered) or lacks its send and receive requests, `answer` is longer than
/// [`PAIRED_SEND_BYTES`], or `take_out` is more than [`PAIRED_TAKE_OUT_BYTES`].
/// The caller then makes the two calls itself.
#[cfg(target_os = "linux")]
pub(crate) fn send_then_take_out(
    socket: std::os::fd::BorrowedFd<'_>,
    answer: &[u8],
    take_out: usize,
) -> Option<SentAndTaken> {
    if answer.len() > PAIRED_SEND_BYTES || take_out > PAIRED_TAKE_OUT_BYTES {
        return None;
    }
    // `try_with`: a thread already tearing down its locals writes the usual way.
    let paired = PAIRED.try_with(|state| {
        let mut state = state.borrow_mut();
        if let Paired::Untried = *state {
            *state = PairRing::open().map_or(Paired::Off, |ring| Paired::Ready(Box::new(ring)));
        }
        let Paired::Ready(ring) = &mut *state else { return None };
        match ring.submit(socket, answer, take_out) {
            Ok(done) => Some(done),
            Err(done) => {
                // Requests may still be in the kernel's hands: the ring and the
                // memory they name are never used nor freed again.
                if let Paired::Ready(ring) = std::mem::replace(&mut *state, Paired::Off) {
                    std::mem::forget(ring);
                }
                done
            }
        }
    });
    paired.ok().flatten()
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn send_then_take_out(
    _: std::os::fd::BorrowedFd<'_>,
    _: &[u8],
    _: usize,
) -> Option<SentAndTaken> {
    None
}

#[cfg(target_os = "linux")]
enum Paired {
    Untried,
    Ready(Box<PairRing>),
    Off,
}

#[cfg(target_os = "linux")]
thread_local! {
    static PAIRED: std::cell::RefCell<Paired> = const { std::cell::RefCell::new(Paired::Untried) };
}

/// One thread's ring for [`send_then_take_out`], with the only memory its requests
/// name. Every request submitted is reaped before `submit` returns, so when the ring
/// is dropped (its thread ends) nothing of it is in the kernel's hands.
#[cfg(target_os = "linux")]
struct PairRing {
    ring: io_uring::IoUring,
    /// The answer, copied for the kernel to send.
    out: Box<[u8]>,
    /// Where taken-out bytes land, never read.
    sink: Box<[u8]>,
}

#[cfg(target_os = "linux")]
impl PairRing {
    const SEND: u64 = 1;
    const TAKE_OUT: u64 = 2;

    fn open() -> Option<PairRing> {
        use io_uring::opcode;
        let ring = io_uring::IoUring::new(4).ok()?;
        let mut probe = io_uring::Probe::new();
        ring.submitter().register_probe(&mut probe).ok()?;
        if !probe.is_supported(opcode::Send::CODE) || !probe.is_supported(opcode::Recv::CODE) {
            return None;
        }
        Some(PairRing {
            ring,
            out: vec![0; PAIRED_SEND_BYTES].into_boxed_slice(),
            sink: vec![0; PAIRED_TAKE_OUT_BYTES].into_boxed_slice(),
        })
    }

    /// `Err` when the ring can no longer be trusted: it may hold requests not reaped,
    /// or requests not submitted. What was done is in it all the same.
    fn submit(
        &mut self,
        socket: std::os::fd::BorrowedFd<'_>,
        answer: &[u8],
        take_out: usize,
    ) -> Result<SentAndTaken, Option<SentAndTaken>> {
        use io_uring::{opcode, types};
        use std::os::fd::AsRawFd;
        let fd = types::Fd(socket.as_raw_fd());
        self.out[..answer.len()].copy_from_slice(answer);
        let send = opcode::Send::new(fd, self.out.as_ptr(), answer.len() as u32)
            .flags(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
            .build()
            .user_data(Self::SEND);
        let take = opcode::Recv::new(fd, self.sink.as_mut_ptr(), take_out as u32)
            .flags(libc::MSG_DONTWAIT)
            .build()
            .user_data(Self::TAKE_OUT);
        // SAFETY: the two requests name `self.out` and `self.sink`, which live as long
        // as the ring and serve nothing else. Both requests are reaped below before
        // this returns `Ok`, so the next submission's copy into `out` cannot race the
        // kernel, and dropping the ring with its buffers leaves nothing in flight. On
        // `Err` the caller forgets the ring with its buffers, so memory a request may
        // still name is never freed or reused. The socket descriptor is borrowed for
        // this whole call, so the kernel resolves it to the caller's socket.
        #[allow(unsafe_code)]
        let pushed = unsafe { self.ring.submission().push_multiple(&[send, take]) };
        if pushed.is_err() {
            // The queue is empty between calls; a full one means it is not.
            return Err(None);
        }
        let mut done = SentAndTaken { sent: None, taken: None };
        let mut submitted = false;
        let mut reaped = 0;
        while reaped < 2 {
            match self.ring.submit_and_wait(2 - reaped) {
                Ok(_) => submitted = true,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                // Nothing submitted: the caller does both itself.
                Err(_) if !submitted => return Err(None),
                // Submitted, but not every outcome is known: the unknown ones fail.
                Err(_) => {
                    let unknown = || Some(Err(std::io::Error::other("io_uring lost a request")));
                    done.sent = done.sent.or_else(unknown);
                    done.taken = done.taken.or_else(unknown);
                    return Err(Some(done));
                }
            }
            for completion in self.ring.completion() {
                let result = completion.result();
                let result = if result < 0 {
                    Err(std::io::Error::from_raw_os_error(-result))
                } else {
                    Ok(result as usize)
                };
                match completion.user_data() {
                    Self::SEND => done.sent = Some(result),
                    Self::TAKE_OUT => done.taken = Some(result),
                    _ => {}
                }
                reaped += 1;
            }
        }
        Ok(done)
    }
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
/// back a free top past 1 MiB. glibc otherwise raises both thresholds after the first
/// large free, and a thread's arena then keeps a freed large request for good. Even
/// fixed, the top threshold is what each thread's arena may keep: `malloc_trim` does
/// not reach the top of a thread's arena, so a free top under the threshold stays
/// resident, in every arena the workers and the blocking pool's threads use (at 4 MiB,
/// a daemon stayed 4 to 11 MiB above its idle size after 63 sessions with large task
/// lists had closed, with no more memory in use than before them). Called once, first
/// thing in `main`, before any other thread exists.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn give_large_blocks_back() {
    // SAFETY: `mallopt` takes two integers and only sets parameters of glibc's
    // allocator; it is called before any other thread exists, so no allocation runs
    // concurrently with the change.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
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
