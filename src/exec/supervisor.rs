//! The supervisor side: the process that holds one call's command and every process
//! it starts, reporting to the daemon over its control socket and killing the whole
//! tree when the command ends, the daemon asks, or the daemon goes away.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;

use super::run::{ExitStatus, RULESET_MARKER, Report, SELF_SUPERVISES, SUPERVISE_ARG};
use crate::sandbox::confine;

/// The first and the longest pause between two sweeps of the supervisor's kill loop.
/// A killed process vanishes from `/proc` within microseconds unless it is in an
/// uninterruptible sleep; the backoff keeps such a wait from spinning a core.
const KILL_SWEEP_FIRST_PAUSE: Duration = Duration::from_millis(1);
const KILL_SWEEP_MAX_PAUSE: Duration = Duration::from_millis(50);

/// Runs the supervisor if this process was started as one (`argv[1]` is
/// [`SUPERVISE_ARG`]), returning its exit code; `None` otherwise. The `toolgate`
/// binary calls this first thing in `main`.
pub fn supervise_if_requested() -> Option<i32> {
    SELF_SUPERVISES.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut args = std::env::args_os();
    let _program = args.next();
    match args.next() {
        Some(arg) if arg == SUPERVISE_ARG => {
            crate::sys::schedule_commands_normally();
            Some(supervise_main(args))
        }
        Some(arg) if arg == super::spawner::SPAWNER_ARG => {
            crate::sys::schedule_commands_normally();
            Some(super::spawner::serve(supervise_forked))
        }
        _ => None,
    }
}

/// The supervisor's entry point, given the arguments after [`SUPERVISE_ARG`]:
/// `[--cwd DIR] [--cgroup DIR]... [--stdin-bytes N] -- PROGRAM [ARGS...]`, with the
/// control socket as stdin. Returns the process exit code.
pub fn supervise_main(args: impl IntoIterator<Item = OsString>) -> i32 {
    supervise_with_env(args, None, 0)
}

/// The supervisor's entry point in a child forked by the spawner: the same arguments,
/// and the command's environment given here rather than inherited; or neither, for a
/// supervisor started ahead of its call ([`supervise_when_called`]).
/// `entered`: how many of its `--cgroup`s (the first ones) it was born in.
fn supervise_forked(call: Option<super::spawner::Given>, entered: usize) -> i32 {
    match call {
        Some(call) => supervise_with_env(call.args, Some(call.env), entered),
        None => supervise_when_called(entered),
    }
}

/// A supervisor started ahead of its call: it sets itself up, then waits for the call
/// on its control socket (the same arguments and environment a spawned one is given),
/// and supervises it. It ends quietly when the daemon lets it go (closing the socket)
/// or a kill signal arrives first.
fn supervise_when_called(entered: usize) -> i32 {
    let failed = |err: SuperviseError| {
        eprintln!("toolgate {SUPERVISE_ARG}: {err}");
        1
    };
    let mut prepared = match prepare(false) {
        Ok(Some(prepared)) => prepared,
        Ok(None) => return 0,
        Err(err) => return failed(err),
    };
    // Started now, it waits too; without it, a sandboxed command starts one.
    prepared.launcher = super::launch::Launcher::start().ok();
    let Some(call) = await_call(&prepared) else {
        return 0;
    };
    let mut args = match SuperviseArgs::parse(call.args) {
        Ok(args) if args.tty => {
            // It leads a process group, so it cannot start a terminal's session.
            eprintln!("toolgate {SUPERVISE_ARG}: a supervisor started ahead takes no terminal");
            return 2;
        }
        Ok(args) => args,
        Err(message) => {
            eprintln!("toolgate {SUPERVISE_ARG}: {message}");
            return 2;
        }
    };
    args.env = Some(call.env);
    args.cgroup.drain(..entered.min(args.cgroup.len()));
    supervise_prepared(prepared, args).map_or_else(failed, |()| 0)
}

/// Waits for the call of a supervisor started ahead; `None` when the daemon let it go
/// or a kill signal came first.
fn await_call(prepared: &Prepared) -> Option<super::spawner::Given> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        let mut fds = [
            PollFd::new(prepared.signals.as_fd(), PollFlags::POLLIN),
            PollFd::new(prepared.control.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return None,
        }
        let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|events| !events.is_empty());
        if ready(&fds[0]) {
            while let Ok(Some(info)) = prepared.signals.read_signal() {
                if info.ssi_signo != Signal::SIGCHLD as u32 {
                    return None;
                }
            }
        }
        if ready(&fds[1]) {
            return super::spawner::read_call(&prepared.control).ok();
        }
    }
}

fn supervise_with_env(
    args: impl IntoIterator<Item = OsString>,
    env: Option<Vec<(OsString, OsString)>>,
    entered: usize,
) -> i32 {
    let mut args = match SuperviseArgs::parse(args) {
        Ok(args) => args,
        Err(message) => {
            // Goes to the daemon's stderr pipe, which it quotes in its error.
            eprintln!("toolgate {SUPERVISE_ARG}: {message}");
            return 2;
        }
    };
    args.env = env;
    args.cgroup.drain(..entered.min(args.cgroup.len()));
    match supervise(args) {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("toolgate {SUPERVISE_ARG}: {err}");
            1
        }
    }
}

/// The supervisor's command line.
#[derive(Debug, PartialEq, Eq)]
struct SuperviseArgs {
    cwd: Option<PathBuf>,
    /// `--cwd-fd`: the working directory arrives as a descriptor on the control socket.
    cwd_fd: bool,
    /// The call's cgroups (v2, and v1 `pids` on a hybrid hierarchy), entered before
    /// anything is started.
    cgroup: Vec<PathBuf>,
    /// The sandbox the command enters, as described in its report (`--sandbox`).
    sandbox: Option<String>,
    /// `--sandbox-ruleset`: its Landlock ruleset arrives on the control socket.
    sandbox_ruleset: bool,
    /// `--sandbox-no-network`: the command enters the seccomp filter without the
    /// network.
    sandbox_no_network: bool,
    /// Bytes of stdin payload to read from the control socket before starting.
    stdin_bytes: Option<usize>,
    /// `--live-stdin`: the command's stdin (a pipe) arrives on the control socket.
    live_stdin: bool,
    /// `--tty`: a terminal arrives on the control socket; it becomes the command's
    /// controlling terminal, stdin, stdout and stderr.
    tty: bool,
    /// `--nofile N`: the soft limit on open files the command starts with (the one the
    /// daemon was started with, before it raised its own).
    nofile: Option<u64>,
    argv: Vec<OsString>,
    /// The command's environment, when it is not the supervisor's own (a supervisor
    /// forked by the spawner).
    env: Option<Vec<(OsString, OsString)>>,
}

impl SuperviseArgs {
    fn parse(args: impl IntoIterator<Item = OsString>) -> Result<SuperviseArgs, String> {
        let mut args = args.into_iter();
        let mut parsed = SuperviseArgs {
            cwd: None,
            cwd_fd: false,
            cgroup: Vec::new(),
            sandbox: None,
            sandbox_ruleset: false,
            sandbox_no_network: false,
            stdin_bytes: None,
            live_stdin: false,
            tty: false,
            nofile: None,
            argv: vec![],
            env: None,
        };
        loop {
            let Some(arg) = args.next() else {
                return Err("missing `--` before the command".to_owned());
            };
            let arg = arg.to_str().map(str::to_owned).ok_or("option is not UTF-8")?;
            match arg.as_str() {
                "--" => break,
                "--cgroup" => {
                    let dir = args.next().ok_or("--cgroup needs a value")?;
                    parsed.cgroup.push(PathBuf::from(dir));
                }
                "--sandbox" => {
                    let described = args.next().ok_or("--sandbox needs a value")?;
                    let described =
                        described.into_string().map_err(|_| "--sandbox is not UTF-8")?;
                    parsed.sandbox = Some(described);
                }
                "--sandbox-ruleset" => parsed.sandbox_ruleset = true,
                "--sandbox-no-network" => parsed.sandbox_no_network = true,
                "--stdin-bytes" => {
                    parsed.stdin_bytes = Some(parse_number(args.next(), "--stdin-bytes")?);
                }
                "--nofile" => parsed.nofile = Some(parse_number(args.next(), "--nofile")?),
                "--cwd-fd" => parsed.cwd_fd = true,
                "--live-stdin" => parsed.live_stdin = true,
                "--tty" => parsed.tty = true,
                "--cwd" => {
                    let dir = args.next().ok_or("--cwd needs a value")?;
                    parsed.cwd = Some(PathBuf::from(dir));
                }
                other => return Err(format!("unknown option {other:?}")),
            }
        }
        parsed.argv = args.collect();
        if parsed.argv.is_empty() {
            return Err("no command given".to_owned());
        }
        Ok(parsed)
    }
}

fn parse_number<T: std::str::FromStr>(value: Option<OsString>, option: &str) -> Result<T, String> {
    value
        .as_deref()
        .and_then(OsStr::to_str)
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| format!("{option} needs a number"))
}

/// Why the supervisor itself failed (as opposed to the command).
#[derive(Debug, thiserror::Error)]
enum SuperviseError {
    #[error("{what}: {source}")]
    Sys { what: &'static str, source: Errno },
    #[error("{what}: {source}")]
    Io { what: &'static str, source: std::io::Error },
}

/// Takes over the signals that make the supervisor kill the tree — the daemon's death
/// signal (SIGTERM) and whatever an operator might send — and the children's changes
/// (SIGCHLD): they are blocked, and arrive on the returned descriptor, which the
/// supervisor's one loop reads ([`watch`]). Taken first thing, so that a signal can only
/// kill the supervisor outright before it has started anything.
///
/// A blocked mask is inherited by a child, so the command starts with it cleared
/// (see [`supervise`]); nothing is left blocked for the command and what it starts.
///
/// On a terminal, the keyboard's signals (Ctrl-C, Ctrl-\\, Ctrl-Z and background
/// terminal access) reach the whole foreground group, the supervisor included: they
/// stay blocked, and so only act on the command.
fn take_signals(tty: bool) -> nix::Result<nix::sys::signalfd::SignalFd> {
    use nix::sys::signal::{SigSet, SigmaskHow, pthread_sigmask};
    use nix::sys::signalfd::{SfdFlags, SignalFd};

    let (kill, keyboard): (&[Signal], &[Signal]) = if tty {
        (
            &[Signal::SIGTERM, Signal::SIGHUP],
            &[Signal::SIGINT, Signal::SIGQUIT, Signal::SIGTSTP, Signal::SIGTTIN, Signal::SIGTTOU],
        )
    } else {
        (&[Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT], &[])
    };
    let mut delivered = SigSet::empty();
    for signal in kill.iter().chain([&Signal::SIGCHLD]) {
        delivered.add(*signal);
    }
    let mut blocked = delivered;
    for signal in keyboard {
        blocked.add(*signal);
    }
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&blocked), None)?;
    SignalFd::with_flags(&delivered, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
}

/// What a supervisor sets up before it knows its call (one started ahead of its call
/// does it while it waits).
struct Prepared {
    signals: nix::sys::signalfd::SignalFd,
    control: UnixStream,
    /// The thread that will start a sandboxed command, started ahead with the process.
    launcher: Option<super::launch::Launcher>,
}

/// Takes the signals, starts a terminal's session (`tty`), arms the death signal,
/// checks the control socket comes from its parent, and hardens the process. `None`
/// when the daemon is gone already: nothing is to be started.
fn prepare(tty: bool) -> Result<Option<Prepared>, SuperviseError> {
    let signals =
        take_signals(tty).map_err(|source| SuperviseError::Sys { what: "signals", source })?;
    if tty {
        super::terminal::new_session()
            .map_err(|source| SuperviseError::Io { what: "setsid", source })?;
    }
    // The death signal is SIGTERM, not SIGKILL: a SIGKILLed supervisor could not kill
    // the tree, and its orphans would escape to init.
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)
        .map_err(|source| SuperviseError::Sys { what: "PR_SET_PDEATHSIG", source })?;
    let control = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map(UnixStream::from)
        .map_err(|source| SuperviseError::Io { what: "control channel", source })?;
    // The daemon created the control socket: if our parent is someone else now, the
    // daemon died before the death signal was armed. Start nothing.
    match nix::sys::socket::getsockopt(&control, nix::sys::socket::sockopt::PeerCredentials) {
        Ok(creds) if nix::unistd::getppid() == Pid::from_raw(creds.pid()) => {}
        Ok(_) => return Ok(None),
        Err(source) => return Err(SuperviseError::Sys { what: "SO_PEERCRED", source }),
    }
    // Commands must not reach into the supervisor (forging reports) or, through its
    // parent link, into the daemon; see `sandbox::harden`.
    crate::sandbox::harden::make_not_dumpable()
        .map_err(|source| SuperviseError::Io { what: "PR_SET_DUMPABLE", source })?;
    crate::sandbox::harden::drop_reaching_capabilities()
        .map_err(|source| SuperviseError::Io { what: "dropping capabilities", source })?;
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|source| SuperviseError::Sys { what: "PR_SET_CHILD_SUBREAPER", source })?;
    Ok(Some(Prepared { signals, control, launcher: None }))
}

fn supervise(args: SuperviseArgs) -> Result<(), SuperviseError> {
    match prepare(args.tty)? {
        Some(prepared) => supervise_prepared(prepared, args),
        None => Ok(()),
    }
}

/// What the daemon hands a supervisor over its control socket before the command
/// starts.
struct HandedOver {
    /// The live input (a pipe's read end or the terminal).
    live: Option<OwnedFd>,
    /// The sandbox's Landlock ruleset.
    ruleset: Option<OwnedFd>,
    /// The command's stdin bytes.
    payload: Option<Vec<u8>>,
}

/// Enters the call's cgroups and working directory and takes what the daemon hands
/// over (live input, ruleset, stdin bytes). `None` when the command is not to start:
/// the reason is reported already, or the daemon gave up.
fn take_over(
    control: &UnixStream,
    args: &SuperviseArgs,
) -> Result<Option<HandedOver>, SuperviseError> {
    for cgroup in &args.cgroup {
        std::fs::write(cgroup.join("cgroup.procs"), "0")
            .map_err(|source| SuperviseError::Io { what: "entering the call's cgroup", source })?;
    }

    if args.cwd_fd
        && let Err(err) = super::cwd::enter_received_dir(control)
    {
        send_report(control, &Report::SpawnError(format!("cannot enter the directory: {err}")));
        return Ok(None);
    }
    let live = if args.tty || args.live_stdin {
        match super::terminal::receive_fd(control) {
            Ok(fd) => Some(fd),
            Err(err) => {
                send_report(control, &Report::SpawnError(format!("no input channel: {err}")));
                return Ok(None);
            }
        }
    } else {
        None
    };
    // Sent by the daemon once this process was started, before any stdin payload.
    let ruleset = if args.sandbox_ruleset {
        match super::fd_pass::receive(control, RULESET_MARKER, "the sandbox's ruleset") {
            Ok(ruleset) => Some(ruleset),
            Err(_) => return Ok(None), // the daemon gave up before the command started
        }
    } else {
        None
    };
    if args.tty
        && let Some(terminal) = &live
        && let Err(err) = super::terminal::become_terminal_session(terminal)
    {
        send_report(control, &Report::SpawnError(format!("cannot take the terminal: {err}")));
        return Ok(None);
    }
    let payload = match args.stdin_bytes {
        None => None,
        Some(len) => {
            let mut bytes = vec![0u8; len];
            if (&*control).read_exact(&mut bytes).is_err() {
                return Ok(None); // the daemon gave up before the command started
            }
            Some(bytes)
        }
    };

    if let Some(cwd) = args.cwd.as_ref().filter(|_| !args.cwd_fd)
        && let Err(err) = std::env::set_current_dir(cwd)
    {
        send_report(control, &Report::SpawnError(format!("{err} (in {})", cwd.display())));
        return Ok(None);
    }
    Ok(Some(HandedOver { live, ruleset, payload }))
}

fn supervise_prepared(prepared: Prepared, args: SuperviseArgs) -> Result<(), SuperviseError> {
    let Prepared { signals, control, launcher } = prepared;
    let Some(HandedOver { live, ruleset, payload }) = take_over(&control, &args)? else {
        return Ok(());
    };
    let io = |what: &'static str| move |source| SuperviseError::Io { what, source };
    // The command's stdin, the write end of its payload pipe, and its output when it
    // is not the supervisor's own (a terminal).
    let (stdin, payload_pipe, output) = match live {
        Some(fd) if args.tty => (fd.try_clone().map_err(io("the terminal"))?, None, Some(fd)),
        Some(fd) => (fd, None, None),
        None if payload.is_some() => {
            let (read, write) = std::io::pipe().map_err(io("the stdin pipe"))?;
            (read.into(), Some(write), None)
        }
        None => {
            let null = std::fs::File::open("/dev/null").map_err(io("/dev/null"))?;
            (OwnedFd::from(null), None, None)
        }
    };
    // The sandbox in force goes out with the spawn's own report: one write, one
    // wake-up of the daemon.
    let (described, sandbox) = match args.sandbox {
        Some(described) => match confine::entry(ruleset, args.sandbox_no_network, args.tty) {
            Ok(entry) => (Some(Report::Sandbox(described)), Some(entry)),
            Err(message) => {
                send_report(&control, &Report::SpawnError(format!("the sandbox: {message}")));
                return Ok(());
            }
        },
        None => (None, None),
    };
    // The supervisor serves one command: its own limit on open files becomes the
    // command's.
    if let Some(soft) = args.nofile {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        let limit = getrlimit(Resource::Nofile);
        let _ = setrlimit(Resource::Nofile, Rlimit { current: Some(soft), ..limit });
    }
    let launch = super::launch::Launch {
        argv: &args.argv,
        env: args.env.as_deref(),
        stdin,
        output,
        sandbox,
        new_session: !args.tty,
    };
    let launched = super::launch::spawn(launch, launcher);
    let command_pid = match launched {
        Ok(pid) => pid,
        Err(failed) => {
            let message = match failed {
                super::launch::Failed::Sandbox(message) => format!("the sandbox: {message}"),
                super::launch::Failed::Spawn(err) => err.to_string(),
            };
            send_reports(&control, described.iter().chain([&Report::SpawnError(message)]));
            return Ok(());
        }
    };
    let spawned = Report::Spawned(command_pid.as_raw().unsigned_abs());
    send_reports(&control, described.iter().chain([&spawned]));
    let command_pid = Some(command_pid);
    let own_pid = nix::unistd::getpid();

    if let (Some(bytes), Some(mut stdin)) = (payload, payload_pipe) {
        // Fails with EPIPE if the command stops reading, which is its right.
        std::thread::spawn(move || {
            let _ = stdin.write_all(&bytes);
        });
    }
    let status = watch(&control, &signals, command_pid, own_pid).map(Report::Exited);
    // The tree is gone: the ends of the output pipes (and of the terminal) this
    // process still holds go before the last report, so that the daemon has read to
    // their end when it learns the tree is gone, and need not wait for this process
    // to finish exiting.
    release_output();
    send_reports(&control, status.iter().chain([&Report::Done]));
    Ok(())
}

/// Points the supervisor's stdout and stderr at `/dev/null`, letting go of the output
/// pipes the daemon reads (left as they are if `/dev/null` cannot be opened: the pipes
/// then end with this process).
fn release_output() {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdout(&null);
        let _ = nix::unistd::dup2_stderr(&null);
    }
}

fn send_report(control: &UnixStream, report: &Report) {
    send_reports(control, [report]);
}

/// Sends reports in one write, so that the daemon wakes once for all of them.
fn send_reports<'a>(mut control: impl Write, reports: impl IntoIterator<Item = &'a Report>) {
    let lines: String = reports.into_iter().map(Report::to_line).collect();
    // A failed write means the daemon is gone, which the reader thread notices too.
    let _ = control.write_all(lines.as_bytes());
}

/// The supervisor's loop once the command runs: reaps children (the command and every
/// orphan re-parented to it) until there are none, and kills the whole tree when the
/// command exits (whatever it left behind), when a kill signal arrives, and when the
/// daemon closes its end of the control socket (or sends anything after the payload,
/// which is reserved to mean the same). Returns how the command ended.
fn watch(
    control: &UnixStream,
    signals: &nix::sys::signalfd::SignalFd,
    command: Option<Pid>,
    own_pid: Pid,
) -> Option<ExitStatus> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::wait::{WaitPidFlag, waitpid};

    let mut status = None;
    let mut daemon_listening = true;
    loop {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(WaitStatus::Exited(pid, code)) if Some(pid) == command => {
                    status = Some(ExitStatus::Code(code));
                    kill_tree_if_any(own_pid);
                }
                Ok(WaitStatus::Signaled(pid, signal, _)) if Some(pid) == command => {
                    status = Some(ExitStatus::Signal(signal as i32));
                    kill_tree_if_any(own_pid);
                }
                Ok(_) | Err(Errno::EINTR) => {}
                Err(Errno::ECHILD) => return status,
                Err(err) => {
                    // Cannot happen for `waitpid` with valid arguments; never leave a tree.
                    eprintln!("toolgate {SUPERVISE_ARG}: wait failed: {err}");
                    kill_tree(own_pid);
                    return status;
                }
            }
        }
        let mut fds = [
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
            PollFd::new(control.as_fd(), PollFlags::POLLIN),
        ];
        let watched = if daemon_listening { 2 } else { 1 };
        match poll(&mut fds[..watched], PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(err) => {
                eprintln!("toolgate {SUPERVISE_ARG}: poll failed: {err}");
                kill_tree(own_pid);
                daemon_listening = false;
                continue;
            }
        }
        let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|events| !events.is_empty());
        let (signal_ready, control_ready) = (ready(&fds[0]), watched == 2 && ready(&fds[1]));
        if signal_ready {
            let mut kill = false;
            while let Ok(Some(info)) = signals.read_signal() {
                kill |= info.ssi_signo != Signal::SIGCHLD as u32;
            }
            if kill {
                kill_tree(own_pid);
            }
        }
        if control_ready {
            let mut buf = [0u8; 64];
            match (&*control).read(&mut buf) {
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                // Data, the end, or an error: the daemon wants the tree gone.
                _ => {
                    daemon_listening = false;
                    kill_tree(own_pid);
                }
            }
        }
    }
}

/// [`kill_tree`] for the supervisor (`root`) once its command is reaped: with no child
/// left at all, alive or not, there is no descendant to look for (as the subreaper it
/// inherits every orphan of the tree), so the common case of a command that started
/// nothing that outlived it costs one system call instead of a walk of `/proc`.
fn kill_tree_if_any(root: Pid) {
    use nix::sys::wait::{Id, WaitPidFlag, waitid};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    if waitid(Id::All, flags) != Err(Errno::ECHILD) {
        kill_tree(root);
    }
}

/// SIGKILLs every descendant of `root`, sweep after sweep, until none is alive.
fn kill_tree(root: Pid) {
    let mut pause = KILL_SWEEP_FIRST_PAUSE;
    while signal_descendants(root) > 0 {
        std::thread::sleep(pause);
        pause = (pause * 2).min(KILL_SWEEP_MAX_PAUSE);
    }
}

/// One sweep: sends SIGKILL to every current descendant of `root` and returns how
/// many of them were alive (not yet zombies).
pub(super) fn signal_descendants(root: Pid) -> usize {
    let family = family_of(root.as_raw());
    let mut members: HashSet<i32> = family.iter().map(|entry| entry.pid).collect();
    members.insert(root.as_raw());
    let mut alive = 0;
    // Frozen first, then killed deepest first (both walks list a parent before its
    // children). A stopped shell runs no more code, so it cannot see a child die and
    // print a "Killed" line of its own into the output; and a child killed before its
    // parent is never orphaned into a part of the process tree outside the family.
    for entry in &family {
        signal_verified(entry.pid, &members, TreeSignal::Stop);
    }
    for entry in family.iter().rev() {
        if signal_verified(entry.pid, &members, TreeSignal::Kill) && !entry.zombie {
            alive += 1;
        }
    }
    alive
}

/// The two signals a sweep sends.
#[derive(Clone, Copy)]
enum TreeSignal {
    Stop,
    Kill,
}

/// Sends `signal` to `pid` if it is still a member of the family. A pidfd pins the
/// process first, so that a pid reused since the scan can never hit an unrelated
/// process. Returns whether the signal was sent.
fn signal_verified(pid: i32, members: &HashSet<i32>, signal: TreeSignal) -> bool {
    let Some(target) = rustix::process::Pid::from_raw(pid) else {
        return false;
    };
    let still_ours = || read_stat(pid).is_some_and(|entry| members.contains(&entry.ppid));
    match rustix::process::pidfd_open(target, rustix::process::PidfdFlags::empty()) {
        Ok(pidfd) => {
            let signal = match signal {
                TreeSignal::Stop => rustix::process::Signal::STOP,
                TreeSignal::Kill => rustix::process::Signal::KILL,
            };
            still_ours() && rustix::process::pidfd_send_signal(&pidfd, signal).is_ok()
        }
        Err(rustix::io::Errno::SRCH) => false,
        // Kernels before 5.3 have no pidfd: a plain kill, with the (tiny) reuse race.
        Err(_) => {
            let signal = match signal {
                TreeSignal::Stop => Signal::SIGSTOP,
                TreeSignal::Kill => Signal::SIGKILL,
            };
            still_ours() && nix::sys::signal::kill(Pid::from_raw(pid), signal).is_ok()
        }
    }
}

/// The current descendants of `root`: by following the kernel's child lists down the
/// tree, which touches only the tree itself, or, where the kernel has no child lists
/// (built without `CONFIG_PROC_CHILDREN`), by scanning every process.
fn family_of(root: i32) -> Vec<ProcEntry> {
    match walk_children(root) {
        Some(found) => found,
        None => descendants(&read_process_table(), root),
    }
}

/// Breadth-first over `/proc/PID/task/TID/children` (every thread's list: an orphan
/// is re-parented to whichever thread of the subreaper the kernel picks). `None` when
/// the root's lists cannot be read at all.
fn walk_children(root: i32) -> Option<Vec<ProcEntry>> {
    let mut found = Vec::new();
    let mut seen = HashSet::from([root]);
    let mut queue = VecDeque::from([root]);
    while let Some(parent) = queue.pop_front() {
        let tasks = match std::fs::read_dir(format!("/proc/{parent}/task")) {
            Ok(tasks) => tasks,
            Err(_) if parent == root => return None,
            Err(_) => continue, // exited meanwhile
        };
        let mut read_any = false;
        for task in tasks.flatten() {
            let Ok(list) = std::fs::read_to_string(task.path().join("children")) else {
                continue;
            };
            read_any = true;
            for child in list.split_whitespace().filter_map(|pid| pid.parse::<i32>().ok()) {
                if seen.insert(child) {
                    if let Some(entry) = read_stat(child) {
                        found.push(entry);
                    }
                    queue.push_back(child);
                }
            }
        }
        if !read_any && parent == root {
            return None;
        }
    }
    Some(found)
}

/// What `/proc/PID/stat` says about one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ProcEntry {
    pub(super) pid: i32,
    pub(super) ppid: i32,
    /// Dead and waiting to be reaped (state `Z`, or `X` while being reaped).
    pub(super) zombie: bool,
}

fn read_process_table() -> Vec<ProcEntry> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let name = entry.ok()?.file_name();
        let pid: i32 = name.to_str()?.parse().ok()?;
        read_stat(pid)
    })
    .collect()
}

pub(super) fn read_stat(pid: i32) -> Option<ProcEntry> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Parses `PID (COMM) STATE PPID ...`. The command name may contain spaces and
/// parentheses, so the fields are found after its *last* `)`.
fn parse_stat(text: &str) -> Option<ProcEntry> {
    let (pid, _) = text.split_once(' ')?;
    let pid = pid.parse().ok()?;
    let after_comm = &text[text.rfind(')')? + 1..];
    let mut fields = after_comm.split_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some(ProcEntry { pid, ppid, zombie: matches!(state, "Z" | "X" | "x") })
}

/// Every entry whose chain of parents leads to `root` (excluding `root`).
fn descendants(table: &[ProcEntry], root: i32) -> Vec<ProcEntry> {
    let mut children: HashMap<i32, Vec<&ProcEntry>> = HashMap::new();
    for entry in table {
        children.entry(entry.ppid).or_default().push(entry);
    }
    let mut found = Vec::new();
    let mut seen = HashSet::from([root]);
    let mut queue = vec![root];
    while let Some(parent) = queue.pop() {
        for child in children.get(&parent).into_iter().flatten() {
            if seen.insert(child.pid) {
                found.push(**child);
                queue.push(child.pid);
            }
        }
    }
    found
}

#[cfg(test)]
#[path = "supervisor_tests.rs"]
mod tests;
