//! The daemon side of a command's supervision: [`run`] prepares a call (its cgroup,
//! temporary directory, sandbox and the supervisor's arguments), starts its supervisor
//! (a ready one, one the spawner forks, or the binary re-executed), waits while it
//! drives the control socket and reads the output, and collects the outcome. Also the
//! spares a call takes (cgroup, temporary directory, a ready supervisor) and the guard
//! that kills the tree when the caller's future is dropped.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::RwLock;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::supervisor::{read_stat, signal_descendants};
use super::terminal::LiveInput;
use super::{DEFAULT_MAX_OUTPUT_BYTES, OutputSink, OutputStream};
use crate::sandbox::{CallCgroup, CallCgroups, Containment, Limits, Profile, confine};

/// The hidden first argument that turns the `toolgate` binary into a supervisor.
pub const SUPERVISE_ARG: &str = "__supervise";

/// The shell every [`Program::Shell`] command runs under. Fixed rather than `$SHELL`:
/// the model writes POSIX shell, and permission rules parse it as such.
pub const SHELL: &str = "/bin/sh";

/// Size of one read from a child's pipe. 64 KiB matches the default Linux pipe
/// capacity, so one read usually drains the pipe, and live chunks stay readable.
const READ_CHUNK: usize = 64 * 1024;

/// How long the daemon waits for the supervisor to confirm the tree is gone after it
/// asked for a kill. Killing and reaping takes milliseconds; this bound only matters
/// if something is stuck in the kernel (an uninterruptible sleep on a dead NFS mount),
/// and keeps such a call from hanging forever.
const SUPERVISOR_EXIT_GRACE: Duration = Duration::from_secs(10);
/// How long a call waits for the supervisor being started ahead of it (a fork: well
/// under a millisecond) before it starts one of its own.
const READY_WAIT: Duration = Duration::from_millis(100);

/// How long the daemon keeps reading stdout/stderr after the supervisor has reported.
/// Every writer is dead by then, so the pipes close at once; the bound only protects
/// against a descendant that escaped supervision (say, by handing the pipe to an
/// unrelated process over a socket) holding a pipe open.
const PIPE_DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Bytes of the supervisor's own stderr quoted when it fails to start a command; enough
/// for an error line, not a flood.
const HANDSHAKE_DETAIL_BYTES: usize = 1000;

/// The byte that carries a call's Landlock ruleset to its supervisor.
pub(super) const RULESET_MARKER: u8 = b'L';

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Program {
    /// A shell command line, run as `/bin/sh -c LINE`.
    Shell(String),
    /// A program and its arguments, without a shell. A program name without a slash
    /// is looked up in the `PATH` of the spec's environment.
    Exec { program: OsString, args: Vec<OsString> },
}

impl Program {
    fn argv(&self) -> Vec<OsString> {
        match self {
            Program::Shell(line) => vec![SHELL.into(), "-c".into(), line.into()],
            Program::Exec { program, args } => {
                let mut argv = Vec::with_capacity(args.len() + 1);
                argv.push(program.clone());
                argv.extend(args.iter().cloned());
                argv
            }
        }
    }

    /// A short human rendering for error messages.
    pub fn display(&self) -> String {
        match self {
            Program::Shell(_) => SHELL.to_owned(),
            Program::Exec { program, .. } => program.to_string_lossy().into_owned(),
        }
    }
}

/// What the command reads on stdin.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Stdin {
    /// `/dev/null`: a read returns end-of-file at once, so nothing waits for input
    /// that will never come.
    #[default]
    Closed,
    /// These bytes, then end-of-file (hooks get their JSON this way).
    Bytes(Vec<u8>),
    /// A pipe or a terminal the caller keeps writing to while the command runs
    /// ([`LiveInput`]). With a terminal, the command's stdout and stderr are the
    /// terminal too, read as stdout.
    Live(std::sync::Arc<LiveInput>),
}

/// Set when this process's `main` checks for the supervisor mode, i.e. its own
/// executable can supervise.
pub(super) static SELF_SUPERVISES: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// A `toolgate` binary next to the running executable or one directory above it.
fn sibling_binary() -> Option<PathBuf> {
    static FOUND: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            let exe = std::env::current_exe().ok()?;
            let dir = exe.parent()?;
            [dir.join("toolgate"), dir.parent()?.join("toolgate")]
                .into_iter()
                .find(|candidate| candidate.is_file() && *candidate != exe)
        })
        .clone()
}

/// Serializes the process-wide supervisor override; see [`Supervisor::install`].
static INSTALLED_SUPERVISOR: RwLock<Option<PathBuf>> = RwLock::new(None);

/// Where the supervisor binary lives.
///
/// In the daemon this is the daemon's own executable (`/proc/self/exe`, which keeps
/// working even if the file on disk was replaced by an upgrade). Anything else that
/// links the library — integration tests, most of all — must point it at a `toolgate`
/// binary with [`Supervisor::install`] or per spec with [`Supervisor::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Supervisor {
    program: PathBuf,
}

impl Supervisor {
    pub fn new(program: impl Into<PathBuf>) -> Supervisor {
        Supervisor { program: program.into() }
    }

    /// Sets the process-wide default supervisor binary (what [`Supervisor::current`]
    /// returns from now on).
    pub fn install(program: impl Into<PathBuf>) {
        let mut installed =
            INSTALLED_SUPERVISOR.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        *installed = Some(program.into());
    }

    /// The installed supervisor binary; else this process's own executable when it
    /// is one that supervises (its `main` called [`supervise_if_requested`]); else a
    /// `toolgate` binary beside this executable or one directory up (where cargo puts
    /// it for the library's own tests); else this process's executable all the same,
    /// which then fails the handshake with a clear error.
    pub fn current() -> Supervisor {
        let installed =
            INSTALLED_SUPERVISOR.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(program) = installed.as_ref() {
            return Supervisor::new(program.clone());
        }
        if !SELF_SUPERVISES.load(std::sync::atomic::Ordering::Relaxed)
            && let Some(program) = sibling_binary()
        {
            return Supervisor::new(program);
        }
        Supervisor::new("/proc/self/exe")
    }

    pub fn program(&self) -> &Path {
        &self.program
    }
}

impl Default for Supervisor {
    fn default() -> Supervisor {
        Supervisor::current()
    }
}

/// Everything needed to run one command under supervision.
#[derive(Clone, Debug)]
pub struct Spec {
    pub program: Program,
    /// Absolute working directory of the command. Callers confine it to the session's
    /// roots; the daemon's own cwd is never used.
    pub cwd: PathBuf,
    /// `cwd` already opened beneath a root: the supervisor enters it by descriptor and
    /// never looks `cwd` up by name (see [`super::cwd`]).
    pub cwd_dir: Option<std::sync::Arc<OwnedFd>>,
    /// The command's complete environment: nothing else is inherited.
    pub env: Vec<(String, String)>,
    pub stdin: Stdin,
    /// When to give up, measured from the start of [`run`]; `None` waits forever (the
    /// cancel token still applies).
    pub timeout: Option<Duration>,
    /// Cancels the command: its whole tree is killed and [`run`] returns promptly.
    pub cancel: CancellationToken,
    /// Bytes of output kept, stdout and stderr together (head and tail of each).
    pub output_cap: usize,
    /// Receives every chunk of output as it arrives.
    pub output: OutputSink,
    pub supervisor: Supervisor,
    /// The kernel sandbox the command enters before `exec`; `None` runs it without.
    /// With one, the command also gets a private temporary directory (`TMPDIR`),
    /// writable, removed when the call ends.
    pub sandbox: Option<Profile>,
    /// Limits of the call's cgroup, where one is created with the controllers.
    pub limits: Limits,
    /// Where the pids of the supervisor and the command are put once known, for a
    /// caller that signals a running command (`process_kill`).
    pub pids: Option<std::sync::Arc<Pids>>,
}

/// The pids of a running command and of its supervisor (0 while unknown).
#[derive(Debug, Default)]
pub struct Pids {
    supervisor: std::sync::atomic::AtomicU32,
    command: std::sync::atomic::AtomicU32,
}

impl Pids {
    /// Sends `signal` to the command itself (not its tree) while it is still the
    /// supervisor's child: a pidfd pins it, and its parent is checked after, so a pid
    /// reused since cannot be hit. False when it is no longer there.
    pub fn signal_command(&self, signal: rustix::process::Signal) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let (supervisor, command) = (self.supervisor.load(Relaxed), self.command.load(Relaxed));
        let (Ok(supervisor), Ok(command)) = (i32::try_from(supervisor), i32::try_from(command))
        else {
            return false;
        };
        let Some(target) = rustix::process::Pid::from_raw(command) else {
            return false;
        };
        let Ok(pidfd) = rustix::process::pidfd_open(target, rustix::process::PidfdFlags::empty())
        else {
            return false;
        };
        supervisor != 0
            && read_stat(command).is_some_and(|entry| entry.ppid == supervisor && !entry.zombie)
            && rustix::process::pidfd_send_signal(&pidfd, signal).is_ok()
    }

    /// The command's pid, once started.
    pub fn command(&self) -> Option<u32> {
        Some(self.command.load(std::sync::atomic::Ordering::Relaxed)).filter(|pid| *pid != 0)
    }
}

impl Spec {
    /// A spec with the defaults: empty environment, stdin closed, no timeout, a fresh
    /// cancel token, the default output cap, no live output, the current supervisor.
    pub fn new(program: Program, cwd: impl Into<PathBuf>) -> Spec {
        Spec {
            program,
            cwd: cwd.into(),
            cwd_dir: None,
            env: Vec::new(),
            stdin: Stdin::Closed,
            timeout: None,
            cancel: CancellationToken::new(),
            output_cap: DEFAULT_MAX_OUTPUT_BYTES,
            output: OutputSink::discard(),
            supervisor: Supervisor::current(),
            sandbox: None,
            limits: Limits::default(),
            pids: None,
        }
    }
}

/// The git settings every command's git runs with, above any configuration file
/// (they are given as `git -c` would give them, through `GIT_CONFIG_COUNT`): a file
/// edit can plant a repository, and a command the rules allow (`git status`) must not
/// run what its configuration names. A directory that merely looks like a bare
/// repository (`HEAD`, `config`, `objects/`, `refs/`, no `.git`) is not taken for one,
/// and no file system monitor command runs. (A planted `.git`, file or directory, is
/// what the built-in `git` protection, `Edit(**/.git/**)`, refuses to write.)
pub const GIT_PROTECTIONS: &[(&str, &str)] =
    &[("safe.bareRepository", "explicit"), ("core.fsmonitor", "false")];

/// Adds [`GIT_PROTECTIONS`] to a command's environment, after any `GIT_CONFIG_KEY_n`
/// it already has.
pub(crate) fn protect_git(env: &mut Vec<(String, String)>) {
    let given = env
        .iter()
        .find(|(name, _)| name == "GIT_CONFIG_COUNT")
        .and_then(|(_, count)| count.trim().parse::<usize>().ok())
        .unwrap_or(0);
    env.retain(|(name, _)| name != "GIT_CONFIG_COUNT");
    for (index, (key, value)) in GIT_PROTECTIONS.iter().enumerate() {
        let at = given + index;
        env.push((format!("GIT_CONFIG_KEY_{at}"), (*key).to_owned()));
        env.push((format!("GIT_CONFIG_VALUE_{at}"), (*value).to_owned()));
    }
    env.push(("GIT_CONFIG_COUNT".to_owned(), (given + GIT_PROTECTIONS.len()).to_string()));
}

/// How the command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this code.
    Code(i32),
    /// It was terminated by this signal (number).
    Signal(i32),
}

impl ExitStatus {
    pub fn success(self) -> bool {
        self == ExitStatus::Code(0)
    }
}

/// One output stream as kept: the text (head, an omission marker, tail) and the byte
/// counts behind it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Captured {
    /// Lossily decoded UTF-8. When bytes were cut, the head and the tail are separated
    /// by a line `... [N bytes omitted] ...`.
    pub text: String,
    /// Bytes the command wrote to this stream in total.
    pub total_bytes: u64,
    /// Bytes cut from the middle.
    pub omitted_bytes: u64,
}

/// What happened to a supervised command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// `None` when the command never started (canceled first) or its status could
    /// not be learned (the supervisor did not confirm the kill in time).
    pub status: Option<ExitStatus>,
    pub stdout: Captured,
    pub stderr: Captured,
    /// The deadline passed and the tree was killed.
    pub timed_out: bool,
    /// The cancel token fired and the tree was killed.
    pub canceled: bool,
    pub duration: Duration,
    /// How the call's process tree was held.
    pub containment: Containment,
    /// The kernel sandbox the command ran in, as the supervisor put it in force
    /// (`None`: none was asked for).
    pub sandbox: Option<String>,
    /// A cgroup limit the call ran into (`max_processes`, `max_memory_mb`).
    pub limit_hit: Option<String>,
}

impl Outcome {
    pub fn truncated(&self) -> bool {
        self.stdout.omitted_bytes > 0 || self.stderr.omitted_bytes > 0
    }
}

/// Why a command could not be run at all (as opposed to running and failing).
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("could not set up the command's control channel: {0}")]
    Setup(#[source] std::io::Error),
    #[error("could not start the process supervisor {}: {source}", program.display())]
    StartSupervisor {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the process supervisor {} did not start the command{detail}", program.display())]
    Handshake { program: PathBuf, detail: String },
    #[error("could not start {program}: {message}")]
    Spawn { program: String, message: String },
    #[error(
        "the command's process supervisor was {} before the command finished; {}",
        if *stopped { "stopped" } else { "killed" },
        if *contained {
            "every process of the command was killed with its cgroup"
        } else {
            "its process tree was killed as far as it could still be found"
        }
    )]
    SupervisorLost { stopped: bool, contained: bool },
}

/// Runs one command under a supervisor and waits until it and everything it started
/// are gone. A timeout or a cancellation is an [`Outcome`] (with the partial output),
/// not an error. If this future is dropped early, the tree is killed all the same.
pub async fn run(spec: Spec) -> Result<Outcome, ProcessError> {
    let started = Instant::now();
    if spec.cancel.is_cancelled() {
        return Ok(Outcome {
            status: None,
            stdout: Captured::default(),
            stderr: Captured::default(),
            timed_out: false,
            canceled: true,
            duration: started.elapsed(),
            containment: Containment::available().0,
            sandbox: None,
            limit_hit: None,
        });
    }
    let deadline = spec.timeout.map(|timeout| started + timeout);
    let prepared = prepare(&spec).await?;
    let running = start(&spec, prepared).await?;
    let waited = wait(&spec, running, deadline).await;
    collect(&spec, waited, started)
}

/// A call made ready to start: its cgroup, temporary directory and sandbox, and the
/// supervisor's arguments and environment.
struct PreparedCall<'a> {
    /// The supervisor binary.
    program: &'a Path,
    /// Stdin bytes sent down the control socket.
    payload: Option<Vec<u8>>,
    live: Option<std::sync::Arc<LiveInput>>,
    tty: bool,
    /// Whether the call could take a supervisor started ahead of it.
    takes_ready: bool,
    ready: Option<StartedAhead>,
    /// The call took the spare cgroup (which is then made again).
    took_spare_cgroup: bool,
    cgroup: Option<CallCgroup>,
    containment: Containment,
    temp_dir: Option<CallTempDir>,
    sandbox: Option<Profile>,
    env: Vec<(String, String)>,
    args: Vec<OsString>,
}

/// Prepares a call: takes a ready supervisor where it can, else the call's cgroup,
/// and gives the sandbox the call's temporary directory and terminal.
async fn prepare(spec: &Spec) -> Result<PreparedCall<'_>, ProcessError> {
    let payload = match &spec.stdin {
        Stdin::Closed | Stdin::Live(_) => None,
        Stdin::Bytes(bytes) => Some(bytes.clone()),
    };
    let live = match &spec.stdin {
        Stdin::Live(live) => Some(live.clone()),
        _ => None,
    };
    let tty = live.as_ref().is_some_and(|live| live.is_terminal());
    let program = spec.supervisor.program();
    // A call with a limit carried by a cgroup v1 hierarchy (a hybrid one's `pids` or
    // `memory`) has cgroups of its own there.
    let process_limit = spec.limits.max_processes > 0
        || CallCgroups::get().is_ok_and(|cgroups| {
            cgroups.needs_v1(spec.limits.max_processes, spec.limits.max_memory_mb)
        });
    // A supervisor started ahead of the call takes it where it can: one that leads a
    // process group of its own (no terminal's session) in a cgroup like any other (no
    // process limit, no cgroup v1 of its own). Its cgroup is the call's.
    let takes_ready = !tty && !process_limit;
    let ready = match takes_ready {
        true => ReadySupervisor::take(program).await,
        false => None,
    };
    let (ready, cgroup) = match ready {
        Some(ReadySupervisor { started, cgroup, .. }) => (Some(started), cgroup.map(Ok)),
        None => (None, call_cgroup(process_limit)),
    };
    let took_spare_cgroup = ready.is_none() && !process_limit;
    let cgroup = match cgroup {
        Some(Ok(cgroup)) => Some(cgroup),
        Some(Err(err)) => {
            tracing::warn!(%err, "cannot create the call's cgroup; the supervisor alone holds it");
            None
        }
        None => None,
    };
    let containment = if cgroup.is_some() { Containment::Cgroup } else { Containment::Supervisor };
    if let Some(cgroup) = &cgroup {
        apply_limits(cgroup, spec.limits);
    }
    let mut env = spec.env.clone();
    let temp_dir = match &spec.sandbox {
        Some(_) => {
            Some(SPARE_TEMP_DIR.take_or_make(CallTempDir::create).map_err(ProcessError::Setup)?)
        }
        None => None,
    };
    let sandbox = spec.sandbox.as_ref().map(|profile| {
        let mut profile = profile.clone();
        // A terminal's command may open its own terminal by name; no other.
        if let Some(device) = live.as_ref().and_then(|live| live.device()) {
            profile.write.push(device.to_path_buf());
        }
        if let Some(temp) = &temp_dir {
            profile.write.push(temp.path.clone());
            env.retain(|(name, _)| !matches!(name.as_str(), "TMPDIR" | "TMP" | "TEMP"));
            env.push(("TMPDIR".to_owned(), temp.path.to_string_lossy().into_owned()));
        }
        profile
    });
    let args = supervisor_args(spec, cgroup.as_ref(), sandbox.as_ref(), payload.as_deref(), &live);
    Ok(PreparedCall {
        program,
        payload,
        live,
        tty,
        takes_ready,
        ready,
        took_spare_cgroup,
        cgroup,
        containment,
        temp_dir,
        sandbox,
        env,
        args,
    })
}

/// The supervisor's arguments; the daemon's pid is not among them: a command reads
/// its supervisor's, and the supervisor learns its parent from the control socket.
fn supervisor_args(
    spec: &Spec,
    cgroup: Option<&CallCgroup>,
    sandbox: Option<&Profile>,
    payload: Option<&[u8]>,
    live: &Option<std::sync::Arc<LiveInput>>,
) -> Vec<OsString> {
    let tty = live.as_ref().is_some_and(|live| live.is_terminal());
    let mut args: Vec<OsString> = vec!["--cwd".into(), spec.cwd.clone().into_os_string()];
    if spec.cwd_dir.is_some() {
        args.push("--cwd-fd".into());
    }
    for dir in cgroup.into_iter().flat_map(CallCgroup::dirs) {
        args.push("--cgroup".into());
        args.push(dir.into());
    }
    if let Some(limit) = crate::sandbox::commands_descriptor_limit() {
        args.push("--nofile".into());
        args.push(limit.to_string().into());
    }
    if let Some(profile) = sandbox {
        args.push("--sandbox".into());
        args.push(confine::describe(profile).into());
        if confine::has_ruleset(profile) {
            args.push("--sandbox-ruleset".into());
        }
        if !profile.network {
            args.push("--sandbox-no-network".into());
        }
    }
    if let Some(bytes) = payload {
        args.push("--stdin-bytes".into());
        args.push(bytes.len().to_string().into());
    }
    if live.is_some() {
        args.push(if tty { "--tty" } else { "--live-stdin" }.into());
    }
    args.push("--".into());
    args.extend(spec.program.argv());
    args
}

/// A call whose supervisor runs: what [`wait`] drives and reads.
struct RunningCall {
    control: tokio::net::UnixStream,
    payload: Option<Vec<u8>>,
    stdout: tokio::net::unix::pipe::Receiver,
    stderr: tokio::net::unix::pipe::Receiver,
    /// A terminal's output, read as the command's stdout.
    terminal_output: Option<tokio::net::unix::pipe::Receiver>,
    child: SupervisorProcess,
    guard: TreeGuard,
    supervisor_pid: Option<Pid>,
    /// The supervisor binary, when the next ready supervisor is to be forked once
    /// this call's command runs.
    refill_ready: Option<PathBuf>,
    containment: Containment,
}

/// Starts the call's supervisor (the ready one, or one of its own), hands it the
/// working directory, the live input and the sandbox's ruleset, and has the spares
/// this call took made again.
async fn start(spec: &Spec, call: PreparedCall<'_>) -> Result<RunningCall, ProcessError> {
    let PreparedCall { program, payload, live, tty, takes_ready, ready, .. } = call;
    let (cgroup, temp_dir, sandbox) = (call.cgroup, call.temp_dir, call.sandbox);
    // A ready supervisor's call goes first on its control socket; one that cannot be
    // sent that way (too large) lets the supervisor go, and the call starts its own in
    // the cgroup it had.
    let message = super::spawner::Call { args: &call.args, env: &call.env };
    let ready = ready.and_then(|ready| Some((ready, super::spawner::call_message(message)?)));
    let (start, daemon_end, stdout, stderr) = match ready {
        Some((StartedAhead { control, process, stdout, stderr }, message)) => {
            (&control).write_all(&message).map_err(|source| ProcessError::StartSupervisor {
                program: program.to_owned(),
                source,
            })?;
            (Start::Ready(process), control, stdout, stderr)
        }
        None => {
            let (daemon_end, supervisor_end) = UnixStream::pair().map_err(ProcessError::Setup)?;
            let (stdout, stdout_end) = std::io::pipe().map_err(ProcessError::Setup)?;
            let (stderr, stderr_end) = std::io::pipe().map_err(ProcessError::Setup)?;
            let ends = [supervisor_end.into(), stdout_end.into(), stderr_end.into()];
            (Start::New(ends), daemon_end, stdout.into(), stderr.into())
        }
    };
    let stdout = output_receiver(stdout)?;
    let stderr = output_receiver(stderr)?;
    if let Some(dir) = &spec.cwd_dir {
        super::cwd::send_dir(&daemon_end, dir).map_err(ProcessError::Setup)?;
    }
    let terminal_output = match &live {
        Some(live) => {
            // Sent now and closed here at once: only the command holds its end.
            let child_end = live.take_child_end().ok_or_else(|| {
                ProcessError::Setup(std::io::Error::other("the live input was already used"))
            })?;
            super::terminal::send_fd(&daemon_end, &child_end).map_err(ProcessError::Setup)?;
            drop(child_end);
            live.take_output().map_err(ProcessError::Setup)?
        }
        None => None,
    };
    daemon_end.set_nonblocking(true).map_err(ProcessError::Setup)?;
    let control = tokio::net::UnixStream::from_std(daemon_end).map_err(ProcessError::Setup)?;

    let mut ruleset_sent = None;
    let child = match start {
        Start::Ready(mut process) => {
            // Set up already, it enters the working directory while this builds the
            // ruleset.
            ruleset_sent = Some(send_ruleset(&control, sandbox.as_ref()));
            process.watch();
            SupervisorProcess::Forked(process)
        }
        Start::New(ends) => {
            let new = NewSupervisor { program, args: &call.args, env: &call.env, tty };
            let send = || send_ruleset(&control, sandbox.as_ref());
            start_new_supervisor(new, message, cgroup.as_ref(), ends, send, &mut ruleset_sent)
                .await?
        }
    };
    let ruleset_sent = ruleset_sent.unwrap_or_else(|| send_ruleset(&control, sandbox.as_ref()));
    // The supervisor sets itself up on the other core meanwhile: this one has time to
    // have the spares this call took made again.
    if temp_dir.is_some() {
        SPARE_TEMP_DIR.refill(CallTempDir::create);
    }
    if cgroup.is_some() && call.took_spare_cgroup {
        SPARE_CGROUP.refill(make_spare_cgroup);
    }
    if let Some(profile) = sandbox.as_ref().filter(|profile| confine::wants_base(profile)) {
        refill_ruleset_base(profile.clone());
    }
    // Where a ready supervisor was taken, or could have been and the spawner is there
    // to fork one, the next is forked once this call's command runs: meanwhile the
    // command's start would have to share a core with the fork.
    let refill_ready =
        (takes_ready && matches!(child, SupervisorProcess::Forked(_))).then(|| program.to_owned());
    let supervisor_pid = pid_from_u32(child.id());
    if let Some(pids) = &spec.pids {
        pids.supervisor.store(child.id(), std::sync::atomic::Ordering::Relaxed);
    }
    let guard = TreeGuard { supervisor: supervisor_pid, cgroup, temp_dir };
    if let Err(message) = ruleset_sent {
        guard.kill_now();
        let_go(child, guard).await;
        return Err(ProcessError::Spawn {
            program: spec.program.display(),
            message: format!("the sandbox: {message}"),
        });
    }
    let containment = call.containment;
    Ok(RunningCall {
        control,
        payload,
        stdout,
        stderr,
        terminal_output,
        child,
        guard,
        supervisor_pid,
        refill_ready,
        containment,
    })
}

/// What a supervisor of the call's own is started with.
struct NewSupervisor<'a> {
    program: &'a Path,
    args: &'a [OsString],
    env: &'a [(String, String)],
    tty: bool,
}

/// Starts a supervisor for this call: forked by the spawner, born in the call's
/// cgroup where it can be, or else the binary re-executed. `send_ruleset` runs while
/// the spawner forks (its result lands in `ruleset_sent`).
async fn start_new_supervisor(
    new: NewSupervisor<'_>,
    call: super::spawner::Call<'_>,
    cgroup: Option<&CallCgroup>,
    [supervisor_end, stdout_end, stderr_end]: [OwnedFd; 3],
    send_ruleset: impl FnOnce() -> Result<(), String>,
    ruleset_sent: &mut Option<Result<(), String>>,
) -> Result<SupervisorProcess, ProcessError> {
    let NewSupervisor { program, args, env, tty } = new;
    // Its own process group: a terminal's signals aimed at the daemon's group must
    // not hit commands, the daemon decides when they die. (On a terminal the
    // supervisor starts a session of its own instead, which it can only do as no
    // group's leader.)
    let own_group = !tty;
    // The supervisor is born in the call's cgroup where it can be: entering one later
    // waits for the kernel (see `CallCgroup::create`).
    let request = super::spawner::Request {
        call: Some(call),
        own_group,
        cgroup: cgroup.and_then(CallCgroup::handle),
    };
    // The sandbox's Landlock ruleset is built here, while the spawner forks and the
    // supervisor sets itself up on the other core; it waits for it on the control
    // socket.
    let forked = super::spawner::launch(
        program,
        &request,
        [supervisor_end.as_fd(), stdout_end.as_fd(), stderr_end.as_fd()],
        || *ruleset_sent = Some(send_ruleset()),
    )
    .await
    .map_err(|source| ProcessError::StartSupervisor { program: program.to_owned(), source })?;
    let child = match forked {
        Some(pid) => SupervisorProcess::Forked(super::spawner::Forked::adopt(pid)),
        None => {
            let mut command = tokio::process::Command::new(program);
            command.arg0("toolgate-supervise").arg(SUPERVISE_ARG).args(args);
            if own_group {
                command.process_group(0);
            }
            command
                .env_clear()
                .envs(env.iter().map(|(name, value)| (name, value)))
                .current_dir("/")
                .stdin(Stdio::from(supervisor_end))
                .stdout(Stdio::from(stdout_end))
                .stderr(Stdio::from(stderr_end));
            // No `kill_on_drop`: a SIGKILLed supervisor could not kill the tree, and its
            // orphans would escape to init. Dropping the control socket is the kill.
            let child = command.spawn().map_err(|source| ProcessError::StartSupervisor {
                program: program.to_owned(),
                source,
            })?;
            SupervisorProcess::Started(child)
        }
    };
    // Either way, the daemon's copies of the supervisor's socket end and of the pipes'
    // write ends are closed by now: only the supervisor holds them.
    Ok(child)
}

/// A call that has ended, its tree killed or gone: what [`collect`] makes the outcome
/// of.
struct EndedCall {
    control: ControlOutcome,
    stdout: Capture,
    stderr: Capture,
    limit_hit: Option<String>,
    containment: Containment,
}

/// Drives the control socket (stdin, deadline, cancellation, the cgroup's limits)
/// while the output is read, until the supervisor reports the tree gone or is found
/// gone itself; then lets the supervisor go.
async fn wait(spec: &Spec, call: RunningCall, deadline: Option<Instant>) -> EndedCall {
    let RunningCall { control, payload, stdout, stderr, terminal_output, child, guard, .. } = call;
    let mut refill_ready = call.refill_ready;
    let mut on_spawned = || {
        if let Some(program) = refill_ready.take() {
            ReadySupervisor::refill(program);
        }
    };
    let mut stdout_capture = Capture::new(spec.output_cap);
    let mut stderr_capture = Capture::new(spec.output_cap);
    let control_finished = CancellationToken::new();
    // Canceled by the caller, or when the call runs into a cgroup limit.
    let cancel = spec.cancel.child_token();
    let (control_outcome, ()) = tokio::join!(
        async {
            let outcome = tokio::select! {
                outcome = drive_control(
                    control,
                    payload,
                    &cancel,
                    deadline,
                    call.supervisor_pid,
                    spec.pids.as_deref(),
                    &mut on_spawned,
                ) => outcome,
                never = watch_limits(guard.cgroup.as_ref(), spec.limits, &cancel) => match never {},
            };
            if !outcome.finished {
                // The supervisor is gone, stopped or unresponsive: kill the tree from
                // here, which also closes the output pipes its processes hold.
                guard.kill_now();
            }
            control_finished.cancel();
            outcome
        },
        async {
            let mut terminal_capture = Capture::new(0);
            let pumps = async {
                match terminal_output {
                    // The supervisor's own stdout and stderr only carry its complaints.
                    Some(terminal) => {
                        tokio::join!(
                            pump(terminal, OutputStream::Stdout, &mut stdout_capture, &spec.output),
                            pump(stdout, OutputStream::Stderr, &mut terminal_capture, &spec.output),
                            pump(stderr, OutputStream::Stderr, &mut stderr_capture, &spec.output),
                        );
                    }
                    None => {
                        tokio::join!(
                            pump(stdout, OutputStream::Stdout, &mut stdout_capture, &spec.output),
                            pump(stderr, OutputStream::Stderr, &mut stderr_capture, &spec.output),
                        );
                    }
                }
            };
            let grace = async {
                control_finished.cancelled().await;
                tokio::time::sleep(PIPE_DRAIN_GRACE).await;
            };
            tokio::select! {
                _ = pumps => {}
                () = grace => {
                    tracing::warn!("output pipes still open after the command tree was killed");
                }
            }
        },
    );

    let limit_hit = guard.cgroup.as_ref().and_then(|cgroup| limit_hit(cgroup, spec.limits));
    // The supervisor exits right after its last report, or was killed above. Once it
    // has reported the tree gone and reaped (and let go of the output pipes, whose end
    // was read), nothing of the command is left: the call is answered while the
    // supervisor finishes exiting, and reaping it and removing the call's cgroup and
    // temporary directory happen after.
    let cleanup = let_go(child, guard);
    if control_outcome.finished {
        tokio::spawn(cleanup);
    } else {
        cleanup.await;
    }
    EndedCall {
        control: control_outcome,
        stdout: stdout_capture,
        stderr: stderr_capture,
        limit_hit,
        containment: call.containment,
    }
}

/// The outcome of an ended call, or why it could not be run.
fn collect(spec: &Spec, call: EndedCall, started: Instant) -> Result<Outcome, ProcessError> {
    let EndedCall { control: control_outcome, stdout: stdout_capture, .. } = call;
    let stderr_capture = call.stderr;
    if let Some(message) = control_outcome.spawn_error {
        return Err(ProcessError::Spawn { program: spec.program.display(), message });
    }
    let killed = control_outcome.timed_out || control_outcome.canceled;
    if !control_outcome.spawned && !killed {
        let detail = handshake_detail(&stderr_capture);
        return Err(ProcessError::Handshake {
            program: spec.supervisor.program().to_owned(),
            detail,
        });
    }
    if !control_outcome.finished && !killed {
        return Err(ProcessError::SupervisorLost {
            stopped: control_outcome.supervisor_stopped,
            contained: call.containment == Containment::Cgroup,
        });
    }

    let (stdout_budget, stderr_budget) =
        split_budget(spec.output_cap, stdout_capture.total, stderr_capture.total);
    Ok(Outcome {
        status: control_outcome.status,
        stdout: stdout_capture.render(stdout_budget),
        stderr: stderr_capture.render(stderr_budget),
        timed_out: control_outcome.timed_out,
        canceled: control_outcome.canceled,
        duration: started.elapsed(),
        containment: call.containment,
        sandbox: control_outcome.sandbox,
        limit_hit: call.limit_hit,
    })
}

/// How a call's supervisor starts: taken ready, or started for it with these ends of
/// its control socket, stdout and stderr.
enum Start {
    Ready(super::spawner::Forked),
    New([OwnedFd; 3]),
}

/// The per-call supervisor process, started directly or forked by the spawner; either
/// way the daemon's unreaped child.
enum SupervisorProcess {
    Started(tokio::process::Child),
    Forked(super::spawner::Forked),
}

impl SupervisorProcess {
    fn id(&self) -> u32 {
        match self {
            // Unreaped, so the pid is there.
            SupervisorProcess::Started(child) => child.id().unwrap_or(0),
            SupervisorProcess::Forked(forked) => forked.id(),
        }
    }

    /// Waits for the supervisor to exit, and reaps it.
    async fn wait(&mut self) {
        match self {
            SupervisorProcess::Started(child) => {
                let _ = child.wait().await;
            }
            SupervisorProcess::Forked(forked) => forked.wait().await,
        }
    }
}

/// Builds the Landlock ruleset of the command's sandbox, if it has one, and sends it
/// to the supervisor over `control`.
fn send_ruleset(control: &impl AsFd, sandbox: Option<&Profile>) -> Result<(), String> {
    let Some(profile) = sandbox.filter(|profile| confine::has_ruleset(profile)) else {
        return Ok(());
    };
    let ruleset = confine::build_ruleset(profile)?.ok_or("landlock was not enforced")?;
    hand_over_ruleset(control, &ruleset).map_err(|err| err.to_string())
}

/// Has the system part of the next command's ruleset made in the background, by the
/// runtime's blocking pool (when this runs on a runtime), like the spares below.
fn refill_ruleset_base(profile: Profile) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn_blocking(move || confine::make_next_base(&profile));
    }
}

/// Sends a supervisor started with `--sandbox-ruleset` its command's Landlock ruleset
/// over the daemon's end of its control socket, before any stdin payload.
pub fn hand_over_ruleset(control: impl AsFd, ruleset: impl AsFd) -> std::io::Result<()> {
    super::fd_pass::send(control, ruleset, RULESET_MARKER, "the ruleset")
}

/// Reaps the supervisor (within [`SUPERVISOR_EXIT_GRACE`]) and removes the call's
/// cgroup and temporary directory, killing whatever is still in the cgroup.
async fn let_go(mut child: SupervisorProcess, mut guard: TreeGuard) {
    match tokio::time::timeout(SUPERVISOR_EXIT_GRACE, child.wait()).await {
        Ok(()) => guard.disarm(),
        Err(_) => tracing::warn!("the process supervisor did not exit"),
    }
    drop(guard);
}

/// The daemon's reading end of the supervisor's stdout or stderr pipe, on the current
/// runtime.
fn output_receiver(fd: OwnedFd) -> Result<tokio::net::unix::pipe::Receiver, ProcessError> {
    tokio::net::unix::pipe::Receiver::from_owned_fd(fd).map_err(ProcessError::Setup)
}

/// Sets the call cgroup's limits where its controllers are there.
fn apply_limits(cgroup: &CallCgroup, limits: Limits) {
    let cgroups = crate::sandbox::CallCgroups::get().ok();
    let has = |name: &str| cgroups.is_some_and(|cgroups| cgroups.has_controller(name));
    if limits.max_processes > 0
        && has("pids")
        && let Err(err) = cgroup.limit_processes(limits.max_processes)
    {
        tracing::warn!(%err, "cannot set the call's process limit");
    }
    if limits.max_memory_mb > 0
        && has("memory")
        && let Err(err) = cgroup.limit_memory(limits.max_memory_mb.saturating_mul(1024 * 1024))
    {
        tracing::warn!(%err, "cannot set the call's memory limit");
    }
}

/// How often a call with cgroup limits is checked for having run into one.
const LIMIT_POLL: Duration = Duration::from_millis(10);

/// Ends the call (through `cancel`) once it runs into a limit of its cgroup; never
/// returns.
async fn watch_limits(
    cgroup: Option<&CallCgroup>,
    limits: Limits,
    cancel: &CancellationToken,
) -> std::convert::Infallible {
    if let Some(cgroup) = cgroup
        && (limits.max_processes > 0 || limits.max_memory_mb > 0)
    {
        let mut tick = tokio::time::interval(LIMIT_POLL);
        loop {
            tick.tick().await;
            if limit_hit(cgroup, limits).is_some() {
                cancel.cancel();
                break;
            }
        }
    }
    std::future::pending().await
}

/// Which limit the call ran into, if any.
fn limit_hit(cgroup: &CallCgroup, limits: Limits) -> Option<String> {
    if limits.max_memory_mb > 0 && cgroup.oom_kills() > 0 {
        return Some(format!(
            "a process was killed at the memory limit ({} MiB)",
            limits.max_memory_mb
        ));
    }
    if limits.max_processes > 0 && cgroup.process_limit_hits() > 0 {
        return Some(format!(
            "starting a process failed at the process limit ({})",
            limits.max_processes
        ));
    }
    None
}

/// Something a call makes before it starts its command, made ahead of the call that
/// takes it: making a directory (a temporary directory on the disk's file system, a
/// cgroup) costs the kernel tens of microseconds that the call would otherwise wait
/// for. One made ahead is kept; the call that takes it, or that made its own, has the
/// next one made in the background once its supervisor is on its way (before, the
/// making would take a core from the spawner's fork), unless spares given back are
/// ready (up to [`SPARES_KEPT`]). A second call at the same moment makes its own. A
/// spare is as fresh as one made by the call: never handed to anyone, or given back
/// ([`Spare::give_back`]) only as it was made.
struct Spare<T>(std::sync::Mutex<Vec<T>>);

/// What a spare can be: something that can tell whether it is still as it was made.
trait SpareItem {
    /// Whether it is still there as made. A directory can be removed behind the
    /// daemon's back while it waits (a clean-up of old files in `/tmp`), and another
    /// user may then take its name.
    fn still_as_made(&self) -> bool;
}

/// How many spares given back are kept: one per call running at the same moment,
/// for a few.
const SPARES_KEPT: usize = 3;

impl<T: SpareItem + Send + 'static> Spare<T> {
    const fn new() -> Spare<T> {
        Spare(std::sync::Mutex::new(Vec::new()))
    }

    /// The spare if one is ready and still as made (the last given back first), else
    /// what `make` makes now. A spare found changed is not ours to remove any more:
    /// whatever is at its name now is left alone.
    fn take_or_make(&'static self, make: fn() -> std::io::Result<T>) -> std::io::Result<T> {
        loop {
            let Some(spare) = self.lock().pop() else {
                return make();
            };
            if spare.still_as_made() {
                return Ok(spare);
            }
            std::mem::forget(spare);
        }
    }

    /// Has the next spare made in the background, by the runtime's blocking pool (when
    /// this runs on a runtime), unless one is ready; one made while another became
    /// ready is dropped (removed).
    fn refill(&'static self, make: fn() -> std::io::Result<T>) {
        if !self.lock().is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn_blocking(move || {
                if let Ok(made) = make() {
                    let mut spares = self.lock();
                    if spares.is_empty() {
                        spares.push(made);
                    }
                }
            });
        }
    }

    /// Keeps `spare`, which a call had and has given back as it was made, for the
    /// next call, unless enough are kept (then it is dropped: removed).
    fn give_back(&self, spare: T) {
        let mut spares = self.lock();
        if spares.len() < SPARES_KEPT {
            spares.push(spare);
        }
    }

    /// Drops the spares (removing them).
    fn release(&self) {
        drop(std::mem::take(&mut *self.lock()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<T>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl SpareItem for CallTempDir {
    fn still_as_made(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(&self.path).is_ok_and(|metadata| {
            metadata.is_dir()
                && metadata.uid() == rustix::process::geteuid().as_raw()
                && metadata.mode() & 0o7777 == 0o700
        })
    }
}

impl SpareItem for CallCgroup {
    fn still_as_made(&self) -> bool {
        self.still_there()
    }
}

static SPARE_TEMP_DIR: Spare<CallTempDir> = Spare::new();
static SPARE_CGROUP: Spare<CallCgroup> = Spare::new();

/// A supervisor forked by the spawner ahead of the call that takes it, in a cgroup of
/// its own: it has set itself up (signals, death signal, hardening, subreaper) and
/// waits for its call on its control socket. A call that takes it hands it its
/// arguments and goes on at once, where it would have waited for the spawner's fork
/// and the new process's set-up (most of it page faults of a fresh copy), and for its
/// launching thread to start. One is kept, for one supervisor binary; the call that
/// takes it, or that could have and forked its own, has the next one forked once its
/// command runs.
struct ReadySupervisor {
    program: PathBuf,
    started: StartedAhead,
    /// The cgroup it was born in, the taking call's.
    cgroup: Option<CallCgroup>,
}

/// A ready supervisor's process and the daemon's ends of its descriptors. Dropped, its
/// control socket closes first, which ends it; then it is reaped.
struct StartedAhead {
    control: UnixStream,
    process: super::spawner::Forked,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

static READY: std::sync::Mutex<Option<ReadySupervisor>> = std::sync::Mutex::new(None);
/// Whether a ready supervisor is being made, and when that ends.
static READY_MAKING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static READY_MADE: tokio::sync::Notify = tokio::sync::Notify::const_new();
/// Counts [`release_spares`]: one made across it is let go, not kept.
static READY_RELEASES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl ReadySupervisor {
    /// The ready supervisor of `program`, if there is one still waiting in its cgroup,
    /// or one being made (the spawner forks one request at a time: starting another
    /// would wait for it anyway). One that is not usable (of another binary, gone, its
    /// cgroup removed) is let go.
    async fn take(program: &Path) -> Option<ReadySupervisor> {
        use std::sync::atomic::Ordering;
        let made = READY_MADE.notified();
        tokio::pin!(made);
        made.as_mut().enable();
        if Self::slot().is_none() && READY_MAKING.load(Ordering::Acquire) {
            let _ = tokio::time::timeout(READY_WAIT, made).await;
        }
        let ready = Self::slot().take()?;
        let usable = ready.program == program
            && !ready.started.process.has_exited()
            && ready.cgroup.as_ref().is_none_or(CallCgroup::still_there);
        usable.then_some(ready)
    }

    /// Has the spawner fork the next one for `program` in the background (when this
    /// runs on a runtime, no other is being made, and there is a spawner).
    fn refill(program: PathBuf) {
        use std::sync::atomic::Ordering;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if READY_MAKING.swap(true, Ordering::AcqRel) {
            return;
        }
        let releases = READY_RELEASES.load(Ordering::Acquire);
        runtime.spawn(async move {
            match ReadySupervisor::make(program).await {
                Ok(Some(made)) => {
                    let mut slot = Self::slot();
                    // Kept unless the spares were let go meanwhile; none is there before
                    // (one is made at a time, and taken before). Dropped unlocked.
                    let unkept = match READY_RELEASES.load(Ordering::Acquire) == releases {
                        true => slot.replace(made),
                        false => Some(made),
                    };
                    drop(slot);
                    drop(unkept);
                }
                Ok(None) => {}
                Err(err) => tracing::debug!(%err, "cannot start a supervisor ahead of its call"),
            }
            READY_MAKING.store(false, Ordering::Release);
            READY_MADE.notify_waiters();
        });
    }

    async fn make(program: PathBuf) -> std::io::Result<Option<ReadySupervisor>> {
        let cgroup = match CallCgroups::get() {
            Ok(_) => Some(SPARE_CGROUP.take_or_make(make_spare_cgroup)?),
            Err(_) => None,
        };
        let (control, supervisor_end) = UnixStream::pair()?;
        let (stdout, stdout_end) = std::io::pipe()?;
        let (stderr, stderr_end) = std::io::pipe()?;
        let request = super::spawner::Request {
            call: None,
            own_group: true,
            cgroup: cgroup.as_ref().and_then(CallCgroup::handle),
        };
        let ends = [supervisor_end.as_fd(), stdout_end.as_fd(), stderr_end.as_fd()];
        let Some(pid) = super::spawner::launch(&program, &request, ends, || {}).await? else {
            return Ok(None);
        };
        let process = super::spawner::Forked::unwatched(pid);
        let started =
            StartedAhead { control, process, stdout: stdout.into(), stderr: stderr.into() };
        Ok(Some(ReadySupervisor { program, started, cgroup }))
    }

    fn slot() -> std::sync::MutexGuard<'static, Option<ReadySupervisor>> {
        READY.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A call's cgroup (see [`CallCgroup::create`]). Without a process limit every call's
/// cgroup is alike: the spare, or one made now. Where none can be made (no cgroups
/// here), nothing is tried behind the call.
fn call_cgroup(process_limit: bool) -> Option<std::io::Result<CallCgroup>> {
    if process_limit || CallCgroups::get().is_err() {
        return CallCgroup::create(process_limit);
    }
    Some(SPARE_CGROUP.take_or_make(make_spare_cgroup))
}

fn make_spare_cgroup() -> std::io::Result<CallCgroup> {
    CallCgroup::create(false).unwrap_or_else(|| Err(std::io::ErrorKind::Unsupported.into()))
}

/// Removes the directories made ahead of calls, at the end of a process that ran
/// commands (left behind, they are swept by the next start, as those of a daemon that
/// was killed).
pub fn release_spares() {
    SPARE_TEMP_DIR.release();
    SPARE_CGROUP.release();
    let mut ready = ReadySupervisor::slot();
    READY_RELEASES.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    let released = ready.take();
    drop(ready);
    drop(released);
}

/// A command's private temporary directory (mode 0700), removed with everything in
/// it when the call ends, or kept for the next call where it is as it was made
/// ([`CallTempDir::reusable`]).
struct CallTempDir {
    path: PathBuf,
    /// Its device and inode number, as made.
    dev: u64,
    ino: u64,
}

impl CallTempDir {
    fn create() -> std::io::Result<CallTempDir> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(remove_stale_temp_dirs);
        let number = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("toolgate-call-{}-{number}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        let mut made = CallTempDir { path, dev: 0, ino: 0 };
        // Exactly 0700 whatever the umask: what a spare is checked against.
        std::fs::set_permissions(&made.path, std::fs::Permissions::from_mode(0o700))?;
        let metadata = std::fs::symlink_metadata(&made.path)?;
        (made.dev, made.ino) = (metadata.dev(), metadata.ino());
        Ok(made)
    }

    /// Whether the next call can have it as a fresh one: the same directory (not a
    /// link, not another one at its name), still ours with mode 0700, empty, and with
    /// no extended attribute a command could have set (an ACL would let others in).
    /// Only for a directory no process of the call can reach any more.
    fn reusable(&self) -> bool {
        use rustix::fs::{Mode, OFlags};
        let Ok(dir) = rustix::fs::open(
            &self.path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return false;
        };
        let Ok(stat) = rustix::fs::fstat(&dir) else {
            return false;
        };
        let as_made = stat.st_dev == self.dev
            && stat.st_ino == self.ino
            && stat.st_uid == rustix::process::geteuid().as_raw()
            && stat.st_mode & 0o7777 == 0o700;
        let mut names = [0u8; 512];
        let no_attributes = match rustix::fs::flistxattr(&dir, &mut names[..]) {
            // The security module's label is the system's, not a command's.
            Ok(len) => names[..len]
                .split(|byte| *byte == 0)
                .all(|name| name.is_empty() || name.starts_with(b"security.")),
            Err(errno) => errno == rustix::io::Errno::NOTSUP,
        };
        as_made && no_attributes && is_empty_dir(dir)
    }
}

/// Whether the directory open as `dir` has no entry but `.` and `..`.
fn is_empty_dir(dir: OwnedFd) -> bool {
    let Ok(entries) = rustix::fs::Dir::new(dir) else {
        return false;
    };
    for entry in entries {
        match entry {
            Ok(entry) if matches!(entry.file_name().to_bytes(), b"." | b"..") => {}
            _ => return false,
        }
    }
    true
}

/// Removes the temporary directories of daemons that died mid-call (a SIGKILL runs
/// no destructor): `toolgate-call-<pid>-<n>` directories of this user whose pid is
/// gone.
fn remove_stale_temp_dirs() {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    let own_uid = rustix::process::getuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix("toolgate-call-"))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let ours = entry.metadata().is_ok_and(|metadata| metadata.uid() == own_uid);
        if ours && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for CallTempDir {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_dir_all(&self.path)
            && err.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(%err, dir = %self.path.display(), "cannot remove a call's temporary directory");
        }
    }
}

/// Kills the supervisor's descendants if [`run`] ends without the supervisor having
/// confirmed the tree is gone — above all when the future is dropped mid-call. The
/// closing control socket makes the supervisor finish the job; this sweep makes the
/// kill synchronous with the drop instead of a few milliseconds later. The call's
/// cgroup, if any, is killed and removed in every case.
struct TreeGuard {
    /// The supervisor while it is our unreaped child (so its pid cannot be reused).
    supervisor: Option<Pid>,
    cgroup: Option<CallCgroup>,
    /// Removed after the tree is gone.
    temp_dir: Option<CallTempDir>,
}

impl TreeGuard {
    /// The supervisor has been reaped: only the cgroup is left to clean up.
    fn disarm(&mut self) {
        self.supervisor = None;
    }

    /// Kills everything now: the cgroup at once, the supervisor's tree (as far as
    /// `/proc` still links it), and the supervisor itself.
    fn kill_now(&self) {
        if let Some(cgroup) = &self.cgroup {
            cgroup.kill();
        }
        if let Some(supervisor) = self.supervisor {
            signal_descendants(supervisor);
            let _ = nix::sys::signal::kill(supervisor, Signal::SIGKILL);
        }
    }
}

impl Drop for TreeGuard {
    fn drop(&mut self) {
        if let Some(supervisor) = self.supervisor {
            signal_descendants(supervisor);
        }
        // The call's processes are all gone once its cgroup is found empty, and only
        // then: without a cgroup, one that left the supervisor's tree may live on. A
        // cgroup as good as new is handed on with its temporary directory.
        let reaped = self.supervisor.is_none();
        let all_gone = match self.cgroup.take() {
            Some(cgroup) if reaped && cgroup.reusable() => {
                SPARE_CGROUP.give_back(cgroup);
                true
            }
            Some(mut cgroup) => cgroup.kill_and_remove(),
            None => false,
        };
        if let Some(temp_dir) = self.temp_dir.take()
            && all_gone
            && reaped
            && temp_dir.reusable()
        {
            SPARE_TEMP_DIR.give_back(temp_dir);
        }
    }
}

fn pid_from_u32(pid: u32) -> Option<Pid> {
    i32::try_from(pid).ok().map(Pid::from_raw)
}

/// The supervisor's stderr before it started anything: its complaint, if any.
fn handshake_detail(stderr: &Capture) -> String {
    let text = String::from_utf8_lossy(&stderr.head);
    let text = text.trim();
    if text.is_empty() {
        return String::new();
    }
    let mut end = text.len().min(HANDSHAKE_DETAIL_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(": {}", &text[..end])
}

/// What the daemon learned over the control socket.
#[derive(Debug, Default)]
struct ControlOutcome {
    spawned: bool,
    spawn_error: Option<String>,
    status: Option<ExitStatus>,
    /// The supervisor reported that the whole tree is gone.
    finished: bool,
    timed_out: bool,
    canceled: bool,
    /// The supervisor was found stopped (SIGSTOP from a command, say).
    supervisor_stopped: bool,
    /// The sandbox the supervisor put in force.
    sandbox: Option<String>,
}

/// Talks to the supervisor: sends the stdin payload, turns the deadline and the
/// cancel token into a kill request, and collects the reports until the supervisor
/// says it is done (or goes away).
async fn drive_control(
    control: tokio::net::UnixStream,
    payload: Option<Vec<u8>>,
    cancel: &CancellationToken,
    deadline: Option<Instant>,
    supervisor: Option<Pid>,
    pids: Option<&Pids>,
    on_spawned: &mut impl FnMut(),
) -> ControlOutcome {
    let (reader, writer) = control.into_split();
    let mut writer = Some(writer);
    let mut lines = BufReader::new(reader).lines();
    let mut outcome = ControlOutcome::default();
    let deadline_passed = sleep_until_opt(deadline);
    tokio::pin!(deadline_passed);
    let mut kill_requested_at: Option<Instant> = None;
    let stopped = supervisor_stopped(supervisor);
    tokio::pin!(stopped);

    if let (Some(bytes), Some(sink)) = (payload, writer.as_mut()) {
        tokio::select! {
            res = sink.write_all(&bytes) => {
                // A failed write means the supervisor is gone; the read below sees it.
                if let Err(err) = res {
                    tracing::debug!(%err, "could not hand stdin to the supervisor");
                }
            }
            () = cancel.cancelled() => {
                outcome.canceled = true;
                request_kill(&mut writer).await;
                kill_requested_at = Some(Instant::now());
            }
            () = &mut deadline_passed => {
                outcome.timed_out = true;
                request_kill(&mut writer).await;
                kill_requested_at = Some(Instant::now());
            }
        }
    }

    loop {
        let give_up = sleep_until_opt(kill_requested_at.map(|at| at + SUPERVISOR_EXIT_GRACE));
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(line)) => match Report::parse(&line) {
                    Some(Report::Spawned(pid)) => {
                        outcome.spawned = true;
                        on_spawned();
                        if let Some(pids) = pids {
                            pids.command.store(pid, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    Some(Report::Sandbox(description)) => outcome.sandbox = Some(description),
                    Some(Report::SpawnError(message)) => outcome.spawn_error = Some(message),
                    Some(Report::Exited(status)) => outcome.status = Some(status),
                    Some(Report::Done) => {
                        outcome.finished = true;
                        break;
                    }
                    None => tracing::warn!(%line, "unexpected line from the process supervisor"),
                },
                Ok(None) => break,
                Err(err) => {
                    tracing::warn!(%err, "lost the process supervisor's control channel");
                    break;
                }
            },
            () = cancel.cancelled(), if kill_requested_at.is_none() => {
                outcome.canceled = true;
                request_kill(&mut writer).await;
                kill_requested_at = Some(Instant::now());
            }
            () = &mut deadline_passed, if kill_requested_at.is_none() => {
                outcome.timed_out = true;
                request_kill(&mut writer).await;
                kill_requested_at = Some(Instant::now());
            }
            () = give_up => {
                tracing::warn!("the process supervisor did not confirm the kill in time");
                break;
            }
            () = &mut stopped => {
                // A stopped supervisor reports nothing and kills nothing: the caller
                // kills the tree and the supervisor.
                outcome.supervisor_stopped = true;
                break;
            }
        }
    }
    outcome
}

/// Resolves when the supervisor is found stopped, checked whenever a child of the
/// daemon changes state (the kernel sends SIGCHLD when one stops) and once right
/// after listening starts, so a stop just before is not missed.
async fn supervisor_stopped(supervisor: Option<Pid>) {
    let Some(pid) = supervisor else {
        return std::future::pending().await;
    };
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) {
        Ok(mut changes) => loop {
            if is_stopped(pid) {
                return;
            }
            if changes.recv().await.is_none() {
                return std::future::pending().await;
            }
        },
        // No SIGCHLD stream (no runtime signal driver): look now and then.
        Err(_) => loop {
            if is_stopped(pid) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        },
    }
}

/// Whether `pid`, an unreaped child of this process, is stopped: what `waitid`
/// tells a parent, left for the next look (`WNOWAIT`). One system call, where reading
/// `/proc/PID/stat` opens, reads and closes a file. A stop under a tracer other than
/// this process is the tracer's to report, and to end.
fn is_stopped(pid: Pid) -> bool {
    use rustix::process::{WaitId, WaitIdOptions, waitid};
    let Some(pid) = rustix::process::Pid::from_raw(pid.as_raw()) else {
        return false;
    };
    let options = WaitIdOptions::STOPPED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
    matches!(waitid(WaitId::Pid(pid), options), Ok(Some(status)) if status.stopped() || status.trapped())
}

/// Shuts down the daemon's side of the control socket: the supervisor reads
/// end-of-file and kills the whole tree.
async fn request_kill(writer: &mut Option<tokio::net::unix::OwnedWriteHalf>) {
    if let Some(mut half) = writer.take()
        && let Err(err) = half.shutdown().await
    {
        tracing::debug!(%err, "shutting down the control socket failed");
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Reads one output stream to its end, keeping what the budget allows and forwarding
/// every chunk to the live sink.
async fn pump<R: AsyncRead + Unpin>(
    mut reader: R,
    stream: OutputStream,
    capture: &mut Capture,
    sink: &OutputSink,
) {
    let mut decoder = Utf8Chunker::default();
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => {
                tracing::debug!(%err, ?stream, "reading command output failed");
                break;
            }
        };
        let chunk = &buf[..n];
        capture.push(chunk);
        if sink.is_active() {
            let text = decoder.push(chunk);
            if !text.is_empty() {
                sink.emit(stream, &text);
            }
        }
    }
    if sink.is_active() {
        let rest = decoder.finish();
        if !rest.is_empty() {
            sink.emit(stream, &rest);
        }
    }
}

/// Turns a byte stream cut at arbitrary points into text chunks that never split a
/// UTF-8 character: an incomplete sequence at the end of a chunk is carried over to
/// the next one; bytes that can never be valid become U+FFFD.
#[derive(Debug, Default)]
struct Utf8Chunker {
    pending: Vec<u8>,
}

impl Utf8Chunker {
    fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut text = String::with_capacity(self.pending.len());
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(valid) => {
                    text.push_str(valid);
                    start = self.pending.len();
                    break;
                }
                Err(err) => {
                    let valid_end = start + err.valid_up_to();
                    text.push_str(&String::from_utf8_lossy(&self.pending[start..valid_end]));
                    match err.error_len() {
                        Some(invalid_len) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            start = valid_end + invalid_len;
                        }
                        // An incomplete character at the end: wait for the rest.
                        None => {
                            start = valid_end;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        text
    }

    /// Whatever is still pending when the stream ends (an incomplete character that
    /// will never be completed becomes U+FFFD).
    fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// One stream's kept bytes: the head as it came, and a sliding window over the tail.
///
/// Each stream keeps up to the *whole* cap (half head, half tail) while the command
/// runs, because how the cap is shared between stdout and stderr is only known at
/// the end (a quiet stderr leaves its share to stdout); see [`split_budget`].
#[derive(Debug)]
struct Capture {
    head_limit: usize,
    tail_limit: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl Capture {
    fn new(cap: usize) -> Capture {
        Capture {
            head_limit: cap.div_ceil(2),
            tail_limit: cap / 2,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let head_room = self.head_limit - self.head.len();
        let (to_head, rest) = bytes.split_at(head_room.min(bytes.len()));
        self.head.extend_from_slice(to_head);
        if rest.len() >= self.tail_limit {
            self.tail.clear();
            self.tail.extend(&rest[rest.len() - self.tail_limit..]);
        } else {
            self.tail.extend(rest);
            let excess = self.tail.len().saturating_sub(self.tail_limit);
            self.tail.drain(..excess);
        }
    }

    /// The stream within `budget` bytes (at most the cap given to [`Capture::new`]):
    /// all of it if it fits, else its first and last bytes around an omission marker.
    /// Cuts never split a UTF-8 character; the marker counts exactly the bytes cut.
    fn render(&self, budget: usize) -> Captured {
        let tail = self.tail.iter().copied().collect::<Vec<u8>>();
        let complete = (self.head.len() + tail.len()) as u64 == self.total;
        let head_want = budget.div_ceil(2);
        let tail_want = budget / 2;
        let joined;
        let (head_part, tail_part): (&[u8], &[u8]) = if complete {
            // Nothing was dropped yet: head and tail are contiguous.
            joined = [self.head.as_slice(), tail.as_slice()].concat();
            if joined.len() <= budget {
                return Captured {
                    text: String::from_utf8_lossy(&joined).into_owned(),
                    total_bytes: self.total,
                    omitted_bytes: 0,
                };
            }
            (&joined[..head_want], &joined[joined.len() - tail_want..])
        } else {
            // Bytes were dropped, so head and tail are full, and the budget (at most
            // the cap) fits in them.
            let head_end = head_want.min(self.head.len());
            let tail_start = tail.len().saturating_sub(tail_want);
            (&self.head[..head_end], &tail[tail_start..])
        };
        let head_part = &head_part[..utf8_cut_before(head_part)];
        let tail_part = &tail_part[utf8_skip_continuation(tail_part)..];
        let omitted = self.total - head_part.len() as u64 - tail_part.len() as u64;
        let mut text = String::from_utf8_lossy(head_part).into_owned();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        let _ = writeln!(text, "... [{omitted} bytes omitted] ...");
        text.push_str(&String::from_utf8_lossy(tail_part));
        Captured { text, total_bytes: self.total, omitted_bytes: omitted }
    }
}

/// The length of `bytes` without a UTF-8 character cut off at its end.
fn utf8_cut_before(bytes: &[u8]) -> usize {
    let len = bytes.len();
    // A character is at most 4 bytes: look for its lead byte among the last 4.
    for back in 1..=len.min(4) {
        let idx = len - back;
        let byte = bytes[idx];
        if byte & 0b1100_0000 == 0b1000_0000 {
            continue; // a continuation byte: keep looking for the lead
        }
        let char_len = match byte {
            0x00..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => return len, // not UTF-8 at all: cut where asked
        };
        return if idx + char_len > len { idx } else { len };
    }
    len
}

/// How many leading continuation bytes (the rest of a character whose start was cut
/// off) to drop; at most 3.
fn utf8_skip_continuation(bytes: &[u8]) -> usize {
    bytes.iter().take(3).take_while(|byte| *byte & 0b1100_0000 == 0b1000_0000).count()
}

/// Shares `cap` bytes between stdout and stderr: both whole if they fit; otherwise a
/// stream smaller than half keeps all of it and the other gets the rest; otherwise
/// half each.
fn split_budget(cap: usize, stdout_total: u64, stderr_total: u64) -> (usize, usize) {
    let cap_u64 = cap as u64;
    if stdout_total.saturating_add(stderr_total) <= cap_u64 {
        // Both fit, so both are at most `cap` and convert losslessly.
        return (stdout_total as usize, stderr_total as usize);
    }
    let half = cap / 2;
    if stdout_total <= half as u64 {
        let stdout_budget = stdout_total as usize;
        return (stdout_budget, cap - stdout_budget);
    }
    if stderr_total <= half as u64 {
        let stderr_budget = stderr_total as usize;
        return (cap - stderr_budget, stderr_budget);
    }
    (cap - half, half)
}

/// One line the supervisor sends the daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Report {
    /// The command started with this pid.
    Spawned(u32),
    /// The command runs in this sandbox (sent before `Spawned`).
    Sandbox(String),
    /// The command could not be started; nothing is running.
    SpawnError(String),
    /// The command itself ended this way.
    Exited(ExitStatus),
    /// The command and every descendant are gone and reaped; the supervisor exits.
    Done,
}

impl Report {
    pub(super) fn to_line(&self) -> String {
        match self {
            Report::Spawned(pid) => format!("spawned {pid}\n"),
            Report::Sandbox(description) => {
                format!("sandbox {}\n", description.replace(['\n', '\r'], " "))
            }
            // One line: the message must not be able to forge another report.
            Report::SpawnError(message) => {
                format!("spawn-error {}\n", message.replace(['\n', '\r'], " "))
            }
            Report::Exited(ExitStatus::Code(code)) => format!("exit code {code}\n"),
            Report::Exited(ExitStatus::Signal(signal)) => format!("exit signal {signal}\n"),
            Report::Done => "done\n".to_owned(),
        }
    }

    pub(super) fn parse(line: &str) -> Option<Report> {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "spawned" => rest.parse().ok().map(Report::Spawned),
            "sandbox" => Some(Report::Sandbox(rest.to_owned())),
            "spawn-error" => Some(Report::SpawnError(rest.to_owned())),
            "exit" => match rest.split_once(' ')? {
                ("code", code) => {
                    code.parse().ok().map(|code| Report::Exited(ExitStatus::Code(code)))
                }
                ("signal", signal) => {
                    signal.parse().ok().map(|signal| Report::Exited(ExitStatus::Signal(signal)))
                }
                _ => None,
            },
            "done" if rest.is_empty() => Some(Report::Done),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------
// The supervisor process.

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
