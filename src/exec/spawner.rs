//! The supervisor spawner: one long-lived, single-threaded copy of the supervisor
//! binary that forks the per-call supervisors, so that a command costs a `fork` of a
//! small process instead of starting the whole binary again (loading and relocating
//! it, its runtime's start-up, and its exit: most of a short command's time).
//!
//! The spawner forks with `CLONE_PARENT` ([`crate::sys::fork_as_sibling`]): every
//! supervisor is the daemon's own child, exactly as if the daemon had started it. The
//! daemon reaps it (so its pid cannot be reused while the daemon still signals it),
//! it gets SIGCHLD when a supervisor stops, the supervisor's death signal follows the
//! daemon, and its check that the control socket's creator is its parent holds as
//! before. The forked supervisor runs the same code as a re-executed one (the process
//! module hands it over, [`Supervise`]); only its start differs.
//!
//! The daemon starts one spawner per supervisor binary on first use, from a thread of
//! its own that never ends (a death signal follows the thread that started a
//! process, not the whole daemon). Requests travel on a `SOCK_SEQPACKET` socket pair
//! installed as the spawner's stdin: one message per supervisor, carrying the
//! supervisor's arguments, the command's environment and three descriptors (the
//! control socket, stdout, stderr); the answer is the new supervisor's pid. A
//! supervisor can also be asked for ahead of its call (the process module keeps one
//! ready): it sets itself up and waits for the call on its control socket, which
//! carries the same arguments and environment ([`call_message`]). The
//! spawner itself is not dumpable, checks that its creator is its parent, dies with
//! the daemon (death signal and end of its socket), and holds nothing else: what it
//! forks starts from a clean copy.
//!
//! Whenever the spawner cannot be used — it cannot be started, a request is too large
//! for one message, it went away — the daemon re-executes the supervisor directly, as
//! it always could; only the time differs.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// The hidden first argument that turns the binary into a spawner.
pub(crate) const SPAWNER_ARG: &str = "__spawner";

/// The largest request, arguments and environment together. A larger one (a huge
/// environment) is started the direct way; the socket's buffer holds this much.
const REQUEST_MAX: usize = 60 * 1024;

/// Descriptors per request: control socket, stdout, stderr, and the call's cgroup v2
/// directory when it has one (the supervisor is born in it).
const REQUEST_FDS: usize = 4;

/// A new spawner's first message.
const READY: &[u8] = b"toolgate spawner 1";

/// How long a new spawner has to say it is ready.
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// How many times the daemon starts a spawner for one binary before it stops trying
/// and re-executes supervisors directly for good.
const MAX_STARTS: u32 = 3;

/// What a request asks the spawner to start.
pub(crate) struct Request<'a> {
    /// The supervisor's arguments (what follows its hidden first argument); `None` for
    /// a supervisor started ahead of its call, which it then reads from its control
    /// socket ([`read_call`]).
    pub call: Option<Call<'a>>,
    /// Whether the supervisor starts a process group of its own.
    pub own_group: bool,
    /// The call's cgroup v2 directory, which is also the first `--cgroup` of the
    /// arguments.
    pub cgroup: Option<BorrowedFd<'a>>,
}

/// A call as a supervisor takes it: its arguments and the command's environment.
#[derive(Clone, Copy)]
pub(crate) struct Call<'a> {
    /// The supervisor's arguments (what follows its hidden first argument).
    pub args: &'a [OsString],
    /// The command's whole environment.
    pub env: &'a [(String, String)],
}

/// A supervisor started by a spawner: the daemon's unreaped child.
pub(crate) struct Forked {
    pid: rustix::process::Pid,
    pidfd: Option<AsyncFd<OwnedFd>>,
    reaped: bool,
}

impl Forked {
    /// Takes charge of `pid`, a supervisor [`launch`] started for this daemon and
    /// nobody has reaped, waiting for it on the current runtime ([`Forked::watch`]).
    pub(crate) fn adopt(pid: rustix::process::Pid) -> Forked {
        let mut forked = Forked::unwatched(pid);
        forked.watch();
        forked
    }

    /// Takes charge of `pid` like [`Forked::adopt`], registering nothing with a runtime
    /// yet (its exit is then polled for, until [`Forked::watch`]).
    pub(crate) fn unwatched(pid: rustix::process::Pid) -> Forked {
        Forked { pid, pidfd: None, reaped: false }
    }

    /// Waits for its exit through a pidfd registered with the current runtime, when
    /// there is one.
    pub(crate) fn watch(&mut self) {
        if self.pidfd.is_none() && tokio::runtime::Handle::try_current().is_ok() {
            self.pidfd =
                rustix::process::pidfd_open(self.pid, rustix::process::PidfdFlags::NONBLOCK)
                    .ok()
                    .and_then(|fd| crate::sys::async_fd(fd, Interest::READABLE).ok());
        }
    }

    /// Whether it has exited (it is then only waiting to be reaped).
    pub(crate) fn has_exited(&self) -> bool {
        use rustix::process::{WaitId, WaitIdOptions};
        let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
        self.reaped || !matches!(rustix::process::waitid(WaitId::Pid(self.pid), options), Ok(None))
    }

    pub(crate) fn id(&self) -> u32 {
        self.pid.as_raw_nonzero().get().unsigned_abs()
    }

    /// Waits for the supervisor to exit and reaps it, without blocking a thread.
    pub(crate) async fn wait(&mut self) {
        if !self.reaped {
            reap_when_exited(self.pid, self.pidfd.as_ref()).await;
            self.reaped = true;
        }
    }
}

impl Drop for Forked {
    fn drop(&mut self) {
        if self.reaped || reap(self.pid, self.pidfd.as_ref().map(AsyncFd::get_ref), false) {
            return;
        }
        // Still running (its tree is being killed): reap it when it exits, so that it
        // does not stay a zombie of the daemon.
        let pid = self.pid;
        let pidfd = self.pidfd.take();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move { reap_when_exited(pid, pidfd.as_ref()).await });
            }
            Err(_) => {
                std::thread::spawn(move || reap(pid, pidfd.as_ref().map(AsyncFd::get_ref), true));
            }
        }
    }
}

/// Waits for `pid` to exit (its pidfd turns readable then) and reaps it.
async fn reap_when_exited(pid: rustix::process::Pid, pidfd: Option<&AsyncFd<OwnedFd>>) {
    if let Some(pidfd) = pidfd {
        let _ = pidfd.readable().await;
    }
    // Reapable at once, or within moments (its last threads are still going).
    let mut pause = std::time::Duration::from_micros(100);
    while !reap(pid, pidfd.map(AsyncFd::get_ref), false) {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(20));
    }
}

/// Reaps `pid` (waiting for it when `block`); true when it was reaped or is gone.
fn reap(pid: rustix::process::Pid, pidfd: Option<&OwnedFd>, block: bool) -> bool {
    use rustix::process::{WaitId, WaitIdOptions};
    let mut options = WaitIdOptions::EXITED;
    if !block {
        options |= WaitIdOptions::NOHANG;
    }
    let id = || match pidfd {
        Some(fd) => WaitId::PidFd(fd.as_fd()),
        None => WaitId::Pid(pid),
    };
    loop {
        match rustix::process::waitid(id(), options) {
            Ok(Some(_)) => return true,
            Ok(None) => return false,
            Err(rustix::io::Errno::INTR) => continue,
            // ECHILD: reaped already, or never ours.
            Err(_) => return true,
        }
    }
}

/// Starts a supervisor through the spawner for `program`, handing it `stdio` as its
/// stdin (the control socket), stdout and stderr, and returns its pid (see
/// [`Forked::adopt`]). `Ok(None)` when no spawner can take it (start it directly;
/// nothing was handed over). An error when the request was handed over but no answer
/// came: a supervisor may have started, so the call fails rather than start another.
///
/// `meanwhile` runs once the request is on its way, while the spawner forks: work of
/// the caller's that the supervisor needs soon after it starts. It does not run when
/// `Ok(None)` is returned.
pub(crate) async fn launch(
    program: &Path,
    request: &Request<'_>,
    stdio: [BorrowedFd<'_>; 3],
    meanwhile: impl FnOnce(),
) -> io::Result<Option<rustix::process::Pid>> {
    let fds: Vec<BorrowedFd<'_>> = stdio.into_iter().chain(request.cgroup).collect();
    let Some(message) = encode(request) else {
        return Ok(None);
    };
    let Some(spawner) = Spawner::get(program) else {
        return Ok(None);
    };
    let _turn = spawner.turn.lock().await;
    let sent = spawner
        .socket
        .async_io(Interest::WRITABLE, |socket| send_request(socket, &message, &fds))
        .await;
    if let Err(err) = sent {
        // Not delivered: the spawner is gone. The next call starts another.
        tracing::debug!(%err, "the supervisor spawner went away");
        spawner.forget(program);
        return Ok(None);
    }
    meanwhile();
    let mut answer = [0u8; 4];
    let received = spawner
        .socket
        .async_io(Interest::READABLE, |socket| {
            rustix::net::recv(socket, &mut answer, RecvFlags::empty())
                .map(|(received, _)| received)
                .map_err(io::Error::from)
        })
        .await;
    let pid = match received {
        Ok(4) => i32::from_le_bytes(answer),
        Ok(_) => {
            spawner.forget(program);
            return Err(io::Error::other("the supervisor spawner went away mid-request"));
        }
        Err(err) => {
            spawner.forget(program);
            return Err(err);
        }
    };
    if pid < 0 {
        return Err(io::Error::from_raw_os_error(-pid));
    }
    // Our unreaped child: its pid names it until we reap it.
    rustix::process::Pid::from_raw(pid)
        .map(Some)
        .ok_or_else(|| io::Error::other("the supervisor spawner answered no pid"))
}

/// One running spawner.
struct Spawner {
    socket: AsyncFd<OwnedFd>,
    /// One request and its answer at a time.
    turn: tokio::sync::Mutex<()>,
    process: Mutex<std::process::Child>,
}

/// What the daemon knows of the spawner for one supervisor binary.
#[derive(Default)]
struct Slot {
    running: Option<Arc<Spawner>>,
    /// Spawners started for it so far.
    starts: u32,
}

fn slots() -> &'static Mutex<HashMap<PathBuf, Slot>> {
    static SLOTS: OnceLock<Mutex<HashMap<PathBuf, Slot>>> = OnceLock::new();
    SLOTS.get_or_init(Mutex::default)
}

impl Spawner {
    /// The running spawner for `program`, started if there is none (and starting has
    /// not failed, nor been needed too often).
    fn get(program: &Path) -> Option<Arc<Spawner>> {
        let mut slots = slots().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let slot = slots.entry(program.to_owned()).or_default();
        if let Some(spawner) = &slot.running {
            return Some(spawner.clone());
        }
        if slot.starts >= MAX_STARTS {
            return None;
        }
        slot.starts += 1;
        match start(program) {
            Ok(spawner) => {
                let spawner = Arc::new(spawner);
                slot.running = Some(spawner.clone());
                Some(spawner)
            }
            Err(err) => {
                tracing::warn!(%err, program = %program.display(), "cannot start the supervisor spawner; commands start the slower way");
                slot.starts = MAX_STARTS;
                None
            }
        }
    }

    /// This spawner failed: it is stopped, and replaced on the next call.
    fn forget(&self, program: &Path) {
        if let Ok(mut process) = self.process.lock() {
            let _ = process.kill();
            let _ = process.wait();
        }
        let mut slots = slots().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(slot) = slots.get_mut(program)
            && slot.running.as_ref().is_some_and(|running| std::ptr::eq(Arc::as_ptr(running), self))
        {
            slot.running = None;
        }
    }
}

/// Starts a spawner for `program`, from the thread that starts them all.
fn start(program: &Path) -> io::Result<Spawner> {
    type Reply = io::Result<(OwnedFd, std::process::Child)>;
    type StartRequest = (PathBuf, std::sync::mpsc::Sender<Reply>);
    static STARTER: OnceLock<Mutex<std::sync::mpsc::Sender<StartRequest>>> = OnceLock::new();
    let starter = STARTER.get_or_init(|| {
        let (sender, requests) = std::sync::mpsc::channel::<StartRequest>();
        // Never ends: a spawner's death signal (and through CLONE_PARENT, every
        // supervisor's) follows the thread that started it.
        let _ =
            std::thread::Builder::new().name("toolgate-spawner-parent".into()).spawn(move || {
                for (program, reply) in requests {
                    let _ = reply.send(spawn_process(&program));
                }
                loop {
                    std::thread::park();
                }
            });
        Mutex::new(sender)
    });
    let (reply, answer) = std::sync::mpsc::channel();
    starter
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send((program.to_owned(), reply))
        .map_err(|_| io::Error::other("the spawner's starting thread is gone"))?;
    let (socket, process) =
        answer.recv().map_err(|_| io::Error::other("the spawner's starting thread is gone"))??;
    Ok(Spawner {
        socket: crate::sys::async_fd(socket, Interest::READABLE | Interest::WRITABLE)?,
        turn: tokio::sync::Mutex::new(()),
        process: Mutex::new(process),
    })
}

fn spawn_process(program: &Path) -> io::Result<(OwnedFd, std::process::Child)> {
    let (ours, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::net::sockopt::set_socket_send_buffer_size(&ours, 2 * REQUEST_MAX)?;
    let process = std::process::Command::new(program)
        .arg0("toolgate-spawner")
        .arg(SPAWNER_ARG)
        .env_clear()
        .current_dir("/")
        // Out of the daemon's process group: a terminal's Ctrl-C is the daemon's to
        // handle; the spawner goes when the daemon does.
        .process_group(0)
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    match await_ready(&ours) {
        Ok(()) => {
            rustix::io::ioctl_fionbio(&ours, true)?;
            Ok((ours, process))
        }
        Err(err) => {
            let mut process = process;
            let _ = process.kill();
            let _ = process.wait();
            Err(err)
        }
    }
}

/// Waits (boundedly) for a new spawner's first message, which says it is one and is
/// ready; a binary that is no spawner exits or says something else.
fn await_ready(socket: &OwnedFd) -> io::Result<()> {
    rustix::net::sockopt::set_socket_timeout(
        socket,
        rustix::net::sockopt::Timeout::Recv,
        Some(READY_TIMEOUT),
    )?;
    let mut hello = [0u8; READY.len() + 1];
    let (received, _) = rustix::net::recv(socket, &mut hello, RecvFlags::empty())?;
    rustix::net::sockopt::set_socket_timeout(socket, rustix::net::sockopt::Timeout::Recv, None)?;
    if hello[..received] != *READY {
        return Err(io::Error::other("the program did not start as a supervisor spawner"));
    }
    Ok(())
}

fn send_request(socket: &OwnedFd, message: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(REQUEST_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("no room for the descriptors"));
    }
    let sent =
        rustix::net::sendmsg(socket, &[IoSlice::new(message)], &mut control, SendFlags::NOSIGNAL)?;
    if sent != message.len() {
        return Err(io::Error::other("the request was cut"));
    }
    Ok(())
}

/// The request as one message: a flags byte (1: own process group, 2: a cgroup
/// descriptor comes fourth, 4: the call comes later), then the call as
/// [`encode_call`] writes it. `None` when it does not fit in one message or a string
/// holds a NUL.
fn encode(request: &Request<'_>) -> Option<Vec<u8>> {
    let flags = u8::from(request.own_group)
        | (u8::from(request.cgroup.is_some()) << 1)
        | (u8::from(request.call.is_none()) << 2);
    let mut message = vec![flags];
    if let Some(call) = request.call {
        encode_call(call, &mut message)?;
    }
    (message.len() <= REQUEST_MAX).then_some(message)
}

/// Appends a call: the number of arguments (u32 LE), then the arguments and the
/// environment's names and values, each ended by a NUL. `None` when a string holds a
/// NUL.
fn encode_call(call: Call<'_>, message: &mut Vec<u8>) -> Option<()> {
    message.extend_from_slice(&u32::try_from(call.args.len()).ok()?.to_le_bytes());
    let mut push = |bytes: &[u8]| -> Option<()> {
        if bytes.contains(&0) {
            return None;
        }
        message.extend_from_slice(bytes);
        message.push(0);
        Some(())
    };
    for arg in call.args {
        push(arg.as_bytes())?;
    }
    for (name, value) in call.env {
        push(name.as_bytes())?;
        push(value.as_bytes())?;
    }
    Some(())
}

/// A call for a supervisor started ahead of it, as sent on its control socket: its
/// length (u32 LE), then the call. `None` when a string holds a NUL or it is larger
/// than a request may be.
pub(crate) fn call_message(call: Call<'_>) -> Option<Vec<u8>> {
    let mut message = vec![0; 4];
    encode_call(call, &mut message)?;
    let length =
        u32::try_from(message.len() - 4).ok().filter(|&length| length as usize <= REQUEST_MAX)?;
    message[..4].copy_from_slice(&length.to_le_bytes());
    Some(message)
}

/// Reads the call a supervisor started ahead of it was sent ([`call_message`]).
pub(crate) fn read_call(mut control: impl io::Read) -> io::Result<Given> {
    let mut length = [0u8; 4];
    control.read_exact(&mut length)?;
    let length = u32::from_le_bytes(length) as usize;
    if length > REQUEST_MAX {
        return Err(io::Error::other("the call is larger than a request may be"));
    }
    let mut message = vec![0u8; length];
    control.read_exact(&mut message)?;
    decode_call(&message).ok_or_else(|| io::Error::other("the call is damaged"))
}

/// A request as the spawner reads it.
#[derive(Debug, PartialEq, Eq)]
struct Decoded {
    own_group: bool,
    /// A fourth descriptor, the cgroup to be born in, comes with it.
    cgroup: bool,
    /// `None`: the call comes later, on the control socket.
    call: Option<Given>,
}

/// A call as a supervisor receives it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Given {
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
}

fn decode(message: &[u8]) -> Option<Decoded> {
    let (&flags, rest) = message.split_first()?;
    let call = match flags & 4 {
        0 => Some(decode_call(rest)?),
        _ if rest.is_empty() => None,
        _ => return None,
    };
    Some(Decoded { own_group: flags & 1 != 0, cgroup: flags & 2 != 0, call })
}

fn decode_call(message: &[u8]) -> Option<Given> {
    let count = u32::from_le_bytes(message.get(..4)?.try_into().ok()?) as usize;
    let body = message.get(4..)?;
    if body.last().is_some_and(|&byte| byte != 0) {
        return None; // every string ends with a NUL
    }
    let mut strings = body
        .split_inclusive(|&byte| byte == 0)
        .map(|string| OsString::from_vec(string[..string.len() - 1].to_vec()));
    let args: Vec<OsString> = strings.by_ref().take(count).collect();
    let rest: Vec<OsString> = strings.collect();
    if args.len() < count || !rest.len().is_multiple_of(2) {
        return None;
    }
    let mut rest = rest.into_iter();
    let env = std::iter::from_fn(|| Some((rest.next()?, rest.next()?))).collect();
    Some(Given { args, env })
}

/// What a forked child runs to become a supervisor: its call (`None`: it comes later,
/// on the control socket) and how many of the call's cgroups (the first ones) it was
/// born in; returns the exit code.
pub(crate) type Supervise = fn(Option<Given>, usize) -> i32;

/// The spawner's entry point (the binary started with [`SPAWNER_ARG`]): serves
/// requests until the daemon goes away, each child running `supervise`. Returns the
/// exit code.
pub(crate) fn serve(supervise: Supervise) -> i32 {
    match serve_requests(supervise) {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("toolgate {SPAWNER_ARG}: {err}");
            1
        }
    }
}

fn serve_requests(supervise: Supervise) -> io::Result<()> {
    // Dies with the daemon; then checks the daemon is still there to die with.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
    let socket: OwnedFd = std::io::stdin().as_fd().try_clone_to_owned()?;
    let creator =
        nix::sys::socket::getsockopt(&socket, nix::sys::socket::sockopt::PeerCredentials)?;
    if nix::unistd::getppid().as_raw() != creator.pid() {
        return Ok(());
    }
    // Nothing the commands run may reach into it: it starts supervisors on request.
    crate::sandbox::harden::make_not_dumpable()?;
    // Dropped once here, the capabilities are gone from every supervisor it forks,
    // whose own drop then finds nothing to do.
    crate::sandbox::harden::drop_reaching_capabilities()?;
    // Its stdin is the request socket; what it forks gets other descriptors there.
    let null = std::fs::File::open("/dev/null")?;
    nix::unistd::dup2_stdin(&null)?;
    drop(null);

    // Compiled once here, the commands' seccomp filter is in every supervisor forked.
    crate::sandbox::confine::warm_network_filter();
    if rustix::net::send(&socket, READY, SendFlags::NOSIGNAL).is_err() {
        return Ok(());
    }
    let mut buffer = vec![0u8; REQUEST_MAX + 1];
    loop {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(REQUEST_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let received = match rustix::net::recvmsg(
            &socket,
            &mut [IoSliceMut::new(&mut buffer)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(received) => received,
            Err(rustix::io::Errno::INTR) => continue,
            Err(err) => return Err(err.into()),
        };
        if received.bytes == 0 {
            return Ok(()); // the daemon is gone
        }
        let mut fds: Vec<OwnedFd> = Vec::with_capacity(REQUEST_FDS);
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = message {
                fds.extend(received);
            }
        }
        let request = decode(&buffer[..received.bytes])
            .filter(|request| fds.len() == 3 + usize::from(request.cgroup));
        let answer: i32 = match request {
            Some(request) => {
                let cgroup = fds.get(3).map(AsFd::as_fd);
                match crate::sys::fork_as_sibling(cgroup) {
                    Ok(crate::sys::Forked::Child { in_cgroup }) => {
                        drop(socket);
                        crate::sys::exit_forked(run_supervisor(supervise, request, fds, in_cgroup));
                    }
                    Ok(crate::sys::Forked::Parent(pid)) => pid.as_raw_nonzero().get(),
                    Err(err) => -err.raw_os_error().unwrap_or(libc::EAGAIN),
                }
            }
            None => -libc::EINVAL,
        };
        drop(fds);
        // The descriptors handed over are closed here: only the supervisor holds them.
        if rustix::net::send(&socket, &answer.to_le_bytes(), SendFlags::NOSIGNAL).is_err() {
            return Ok(());
        }
    }
}

/// In the forked child: takes the descriptors as stdin, stdout and stderr, and
/// becomes the supervisor (which skips entering the first cgroup when it was born in
/// it).
fn run_supervisor(
    supervise: Supervise,
    request: Decoded,
    fds: Vec<OwnedFd>,
    in_cgroup: bool,
) -> i32 {
    let placed = nix::unistd::dup2_stdin(&fds[0])
        .and_then(|()| nix::unistd::dup2_stdout(&fds[1]))
        .and_then(|()| nix::unistd::dup2_stderr(&fds[2]));
    if let Err(err) = placed {
        eprintln!("toolgate {SPAWNER_ARG}: cannot take the supervisor's descriptors: {err}");
        return 2;
    }
    drop(fds);
    if request.own_group
        && let Err(err) =
            nix::unistd::setpgid(nix::unistd::Pid::from_raw(0), nix::unistd::Pid::from_raw(0))
    {
        eprintln!("toolgate {SPAWNER_ARG}: cannot start a process group: {err}");
        return 2;
    }
    let entered = usize::from(in_cgroup && request.cgroup);
    supervise(request.call, entered)
}

/// The argument strings of a request as the spawner would see them (for tests).
#[cfg(test)]
fn round_trip(request: &Request<'_>) -> Option<Decoded> {
    decode(&encode(request)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(strings: &[&str]) -> Vec<OsString> {
        strings.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_request_survives_encoding() {
        let args = strings(&["--cwd", "/tmp", "--", "/bin/sh", "-c", ""]);
        let env =
            vec![("PATH".to_owned(), "/usr/bin".to_owned()), ("EMPTY".to_owned(), String::new())];
        let call = Call { args: &args, env: &env };
        let decoded =
            round_trip(&Request { call: Some(call), own_group: true, cgroup: None }).unwrap();
        assert!(decoded.own_group);
        let given = Given {
            args: args.clone(),
            env: vec![
                (OsString::from("PATH"), OsString::from("/usr/bin")),
                (OsString::from("EMPTY"), OsString::new()),
            ],
        };
        assert_eq!(decoded.call, Some(given));
        let none = Call { args: &[], env: &[] };
        let none = round_trip(&Request { call: Some(none), own_group: false, cgroup: None });
        assert_eq!(
            none,
            Some(Decoded {
                own_group: false,
                cgroup: false,
                call: Some(Given { args: Vec::new(), env: Vec::new() })
            })
        );
        let ahead = round_trip(&Request { call: None, own_group: true, cgroup: None });
        assert_eq!(ahead, Some(Decoded { own_group: true, cgroup: false, call: None }));
    }

    #[test]
    fn a_call_sent_later_reads_back_whole_and_alone() {
        let args = strings(&["--cwd", "/tmp", "--", "true"]);
        let env = vec![("HOME".to_owned(), "/root".to_owned())];
        let mut stream = call_message(Call { args: &args, env: &env }).unwrap();
        // What follows on the control socket (a descriptor's marker byte) stays there.
        stream.extend_from_slice(b"D");
        let mut reader = &stream[..];
        let given = read_call(&mut reader).unwrap();
        assert_eq!(given.args, args);
        assert_eq!(given.env, vec![(OsString::from("HOME"), OsString::from("/root"))]);
        assert_eq!(reader, b"D");
        // Cut short, or claiming more than a request may hold: refused.
        let whole = call_message(Call { args: &args, env: &env }).unwrap();
        assert!(read_call(&whole[..whole.len() - 1]).is_err());
        let huge = u32::try_from(REQUEST_MAX + 1).unwrap().to_le_bytes();
        assert!(read_call(&huge[..]).is_err());
    }

    #[test]
    fn a_nul_or_an_oversized_request_goes_the_direct_way() {
        let nul = [OsString::from("a\0b")];
        let call = Call { args: &nul, env: &[] };
        assert!(encode(&Request { call: Some(call), own_group: false, cgroup: None }).is_none());
        assert!(call_message(call).is_none());
        let big = vec![("X".to_owned(), "y".repeat(REQUEST_MAX))];
        let call = Call { args: &[], env: &big };
        assert!(encode(&Request { call: Some(call), own_group: false, cgroup: None }).is_none());
        assert!(call_message(call).is_none());
    }

    #[test]
    fn a_damaged_request_is_refused() {
        assert!(decode(&[]).is_none());
        assert!(decode(&[0, 2, 0, 0, 0, b'a', 0]).is_none()); // says 2 arguments, has 1
        assert!(decode(&[0, 0, 0, 0, 0, b'N', 0]).is_none()); // a name without a value
        assert!(decode(&[4, 0, 0, 0, 0]).is_none()); // a call where it comes later
    }
}
