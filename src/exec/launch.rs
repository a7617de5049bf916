//! How the per-call supervisor starts its command: `posix_spawn`, from a short-lived
//! thread that entered the command's sandbox first ([`Launcher`]).
//!
//! `posix_spawn` starts the program without copying the supervisor (the C library
//! clones with the memory shared until `exec`), where a `fork` copies its page tables
//! and then takes a copy-on-write fault for every page the child touches before
//! `exec`. The sandbox needs no code between the two: the Landlock domain, the
//! seccomp filter and `no_new_privs` belong to the thread that enters them and pass to
//! every process it starts, so the thread enters them and starts the command, and
//! the supervisor's own thread — the one that watches, signals and reports — stays
//! outside, as before.
//!
//! The command starts with an empty signal mask (the supervisor blocks the signals
//! it reads from a signalfd) and SIGPIPE at its default (a Rust program ignores it),
//! its stdin (and, on a terminal, stdout and stderr) on the descriptors given, in the
//! supervisor's working directory. A program named without a `/` is looked for in the
//! `PATH` of the command's environment, and a file with neither a known format nor a
//! `#!` line runs under `/bin/sh`, as `execvp` would.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use nix::errno::Errno;
use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags, posix_spawn};
use nix::sys::signal::{SigSet, Signal};
use nix::unistd::Pid;

use crate::sandbox::confine;

/// The shell a program file without a known format runs under, as with `execvp`.
const SHELL: &CStr = c"/bin/sh";

/// `execvp`'s search path when the environment has no `PATH`.
const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";

/// What a command is started with.
pub(crate) struct Launch<'a> {
    pub argv: &'a [OsString],
    /// The command's environment; `None` passes the supervisor's own.
    pub env: Option<&'a [(OsString, OsString)]>,
    /// Becomes the command's stdin.
    pub stdin: OwnedFd,
    /// Becomes its stdout and stderr (a terminal); `None` keeps the supervisor's.
    pub output: Option<OwnedFd>,
    /// The sandbox the command starts in.
    pub sandbox: Option<confine::Entry>,
    /// Whether the command starts a session of its own, with no controlling terminal
    /// (every command but one on a terminal of its call's, whose supervisor made that
    /// terminal its session's): nothing it runs can open the terminal of the person
    /// who started the daemon (`/dev/tty`), inject input into it or draw on it.
    pub new_session: bool,
}

/// Starts the command and returns its pid, from `launcher` when one was started ahead
/// and the command has a sandbox to enter. An error is the sandbox's (it could not be
/// entered: nothing was started) or the one `exec` gave.
pub(crate) fn spawn(launch: Launch<'_>, launcher: Option<Launcher>) -> Result<Pid, Failed> {
    let argv = c_strings(launch.argv.iter().map(OsString::as_os_str))?;
    let env: Vec<CString> = match launch.env {
        Some(env) => {
            env.iter().map(|(name, value)| variable(name, value)).collect::<Result<_, _>>()
        }
        None => std::env::vars_os().map(|(name, value)| variable(&name, &value)).collect(),
    }?;
    let program = launch.argv.first().map(|program| program.as_bytes()).unwrap_or_default();
    let candidates = candidates(program, search_path(launch.env))?;
    let job = Job {
        argv,
        env,
        candidates,
        stdin: launch.stdin,
        output: launch.output,
        sandbox: launch.sandbox,
        new_session: launch.new_session,
    };
    if job.sandbox.is_none() {
        return job.start();
    }
    // The thread that enters the sandbox ends with the spawn: the supervisor's own
    // thread never does.
    match launcher {
        Some(launcher) => launcher.run(job),
        None => Launcher::start()?.run(job),
    }
}

/// A command ready to start, everything in it made by the caller.
struct Job {
    argv: Vec<CString>,
    env: Vec<CString>,
    candidates: Vec<CString>,
    stdin: OwnedFd,
    output: Option<OwnedFd>,
    sandbox: Option<confine::Entry>,
    new_session: bool,
}

impl Job {
    /// Enters the sandbox (the calling thread's for good) and starts the command.
    fn start(self) -> Result<Pid, Failed> {
        // Built by the thread that uses them: the C library's types are not `Sync`.
        let mut attr = PosixSpawnAttr::init().map_err(spawn_error)?;
        let mut signals = SigSet::empty();
        attr.set_sigmask(&signals).map_err(spawn_error)?;
        signals.add(Signal::SIGPIPE);
        attr.set_sigdefault(&signals).map_err(spawn_error)?;
        let mut flags =
            PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF;
        if self.new_session {
            // `setsid` in the child (glibc 2.26 and later, musl 1.1.24).
            flags |= PosixSpawnFlags::from_bits_retain(libc::c_int::from(libc::POSIX_SPAWN_SETSID));
        }
        attr.set_flags(flags).map_err(spawn_error)?;
        let mut actions = PosixSpawnFileActions::init().map_err(spawn_error)?;
        actions.add_dup2(self.stdin.as_raw_fd(), 0).map_err(spawn_error)?;
        if let Some(output) = &self.output {
            actions.add_dup2(output.as_raw_fd(), 1).map_err(spawn_error)?;
            actions.add_dup2(output.as_raw_fd(), 2).map_err(spawn_error)?;
        }
        if let Some(sandbox) = &self.sandbox {
            sandbox.enter_this_thread().map_err(|err| Failed::Sandbox(err.to_string()))?;
        }
        let (argv, env) = (&self.argv, &self.env);
        first_that_runs(&self.candidates, |path| {
            match posix_spawn(path.as_c_str(), &actions, &attr, argv, env) {
                // Neither a known format nor a `#!` line: a shell script, as `execvp`
                // takes it.
                Err(Errno::ENOEXEC) => {
                    let by_shell: Vec<&CStr> = [SHELL, path.as_c_str()]
                        .into_iter()
                        .chain(argv.iter().skip(1).map(CString::as_c_str))
                        .collect();
                    posix_spawn(SHELL, &actions, &attr, &by_shell, env)
                }
                started => started,
            }
        })
    }
}

/// A thread that enters one command's sandbox and starts it, then ends. A supervisor
/// started ahead of its call starts it while it waits: a thread started on the call's
/// path is a new task for the scheduler to place, which on an idle machine means
/// waking another core first, where waking a waiting thread goes to the core at hand.
pub(crate) struct Launcher {
    job: std::sync::mpsc::SyncSender<Job>,
    done: std::sync::mpsc::Receiver<Result<Pid, Failed>>,
}

impl Launcher {
    pub(crate) fn start() -> Result<Launcher, Failed> {
        let (job, jobs) = std::sync::mpsc::sync_channel::<Job>(1);
        let (report, done) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("toolgate-launch".to_owned())
            .stack_size(256 * 1024)
            .spawn(move || {
                // No job: the launcher was let go.
                if let Ok(job) = jobs.recv() {
                    let _ = report.send(job.start());
                }
            })
            .map_err(Failed::Spawn)?;
        Ok(Launcher { job, done })
    }

    fn run(self, job: Job) -> Result<Pid, Failed> {
        let gone = || Failed::Spawn(io::Error::other("the launching thread panicked"));
        self.job.send(job).map_err(|_| gone())?;
        self.done.recv().unwrap_or_else(|_| Err(gone()))
    }
}

/// Why a command did not start.
#[derive(Debug)]
pub(crate) enum Failed {
    /// The sandbox could not be entered.
    Sandbox(String),
    /// Starting the program failed (what `exec` said, or the arguments were unfit).
    Spawn(io::Error),
}

fn spawn_error(errno: Errno) -> Failed {
    Failed::Spawn(io::Error::from(errno))
}

/// Tries each candidate path in turn, as `execvp` does: on to the next when one is
/// missing or not permitted, and the permission error is the one returned if no
/// candidate runs and one was refused.
fn first_that_runs(
    candidates: &[CString],
    mut spawn: impl FnMut(&CString) -> nix::Result<Pid>,
) -> Result<Pid, Failed> {
    let mut refused = false;
    for path in candidates {
        match spawn(path) {
            Ok(pid) => return Ok(pid),
            Err(Errno::EACCES) => refused = true,
            Err(Errno::ENOENT | Errno::ENOTDIR) => {}
            Err(errno) => return Err(spawn_error(errno)),
        }
    }
    Err(spawn_error(if refused { Errno::EACCES } else { Errno::ENOENT }))
}

/// The paths the program may be at: itself when it names a path, else each `PATH`
/// directory with its name (an empty entry is the working directory).
fn candidates(program: &[u8], path: Vec<u8>) -> Result<Vec<CString>, Failed> {
    if program.is_empty() {
        return Ok(Vec::new());
    }
    let c_string = |bytes: Vec<u8>| CString::new(bytes).map_err(|_| nul_error());
    if program.contains(&b'/') {
        return Ok(vec![c_string(program.to_vec())?]);
    }
    path.split(|&byte| byte == b':')
        .map(|dir| {
            let mut candidate = if dir.is_empty() { b".".to_vec() } else { dir.to_vec() };
            candidate.push(b'/');
            candidate.extend_from_slice(program);
            c_string(candidate)
        })
        .collect()
}

/// The `PATH` the program is looked for in: the command's.
fn search_path(env: Option<&[(OsString, OsString)]>) -> Vec<u8> {
    let found = match env {
        Some(env) => {
            env.iter().rev().find(|(name, _)| name == "PATH").map(|(_, value)| value.clone())
        }
        None => std::env::var_os("PATH"),
    };
    found.map_or_else(|| DEFAULT_PATH.to_vec(), OsString::into_vec)
}

/// An environment entry, `NAME=value`.
fn variable(name: &OsStr, value: &OsStr) -> Result<CString, Failed> {
    let mut entry = Vec::with_capacity(name.len() + 1 + value.len());
    entry.extend_from_slice(name.as_bytes());
    entry.push(b'=');
    entry.extend_from_slice(value.as_bytes());
    CString::new(entry).map_err(|_| nul_error())
}

fn c_strings<'a>(items: impl Iterator<Item = &'a OsStr>) -> Result<Vec<CString>, Failed> {
    items.map(|item| CString::new(item.as_bytes()).map_err(|_| nul_error())).collect()
}

fn nul_error() -> Failed {
    Failed::Spawn(io::Error::new(io::ErrorKind::InvalidInput, "nul byte found in provided data"))
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::OwnedFd;
    use std::path::Path;

    use landlock::{
        ABI, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, path_beneath_rules,
    };
    use nix::sys::wait::{WaitStatus, waitpid};

    use super::*;

    /// Starts `argv` with its stdout and stderr on a pipe; returns what it wrote and
    /// how it ended.
    fn run(
        argv: &[&str],
        env: Option<&[(OsString, OsString)]>,
        sandbox: Option<confine::Entry>,
    ) -> Result<(String, WaitStatus), Failed> {
        run_from(argv, env, sandbox, None)
    }

    fn run_from(
        argv: &[&str],
        env: Option<&[(OsString, OsString)]>,
        sandbox: Option<confine::Entry>,
        launcher: Option<Launcher>,
    ) -> Result<(String, WaitStatus), Failed> {
        let argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
        let (mut read, write) = std::io::pipe().unwrap_or_else(|err| panic!("{err}"));
        let null = std::fs::File::open("/dev/null").unwrap_or_else(|err| panic!("{err}"));
        let pid = spawn(
            Launch {
                argv: &argv,
                env,
                stdin: OwnedFd::from(null),
                output: Some(OwnedFd::from(write)),
                sandbox,
                new_session: true,
            },
            launcher,
        )?;
        let mut output = String::new();
        read.read_to_string(&mut output).unwrap_or_else(|err| panic!("{err}"));
        Ok((output, waitpid(pid, None).unwrap_or_else(|err| panic!("{err}"))))
    }

    fn env_with_path(path: &Path) -> Vec<(OsString, OsString)> {
        vec![("PATH".into(), path.as_os_str().to_owned()), ("MARK".into(), "seen".into())]
    }

    #[test]
    fn a_command_starts_in_the_sandbox_and_the_caller_stays_outside() {
        if confine::landlock_abi() == 0 {
            eprintln!("skipped: this kernel has no Landlock");
            return;
        }
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        for (name, text) in [("allowed/a.txt", "allowed\n"), ("denied/b.txt", "denied\n")] {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap_or(dir.path()))
                .unwrap_or_else(|err| panic!("{err}"));
            std::fs::write(&path, text).unwrap_or_else(|err| panic!("{err}"));
        }
        let readable = ["/usr", "/bin", "/lib", "/lib64", "/etc"]
            .into_iter()
            .map(Path::new)
            .filter(|path| path.exists())
            .map(Path::to_path_buf)
            .chain([dir.path().join("allowed")]);
        let ruleset: Option<OwnedFd> = Ruleset::default()
            .handle_access(AccessFs::from_all(ABI::V1))
            .and_then(|ruleset| ruleset.create())
            .and_then(|created| {
                created.add_rules(path_beneath_rules(readable, AccessFs::from_read(ABI::V1)))
            })
            .unwrap_or_else(|err| panic!("{err}"))
            .into();
        let ruleset = ruleset.unwrap_or_else(|| panic!("no ruleset was made"));
        let script = format!(
            "cat {0}/allowed/a.txt; cat {0}/denied/b.txt 2>&- || echo refused",
            dir.path().display()
        );
        // From a thread started for it, and from one started ahead (as a supervisor
        // started ahead of its call does).
        for ahead in [false, true] {
            let ruleset = ruleset.try_clone().unwrap_or_else(|err| panic!("{err}"));
            let entry =
                confine::entry(Some(ruleset), false, false).unwrap_or_else(|err| panic!("{err}"));
            let launcher = ahead.then(|| Launcher::start().unwrap_or_else(|err| panic!("{err:?}")));
            let (output, status) =
                run_from(&["/bin/sh", "-c", &script], None, Some(entry), launcher)
                    .unwrap_or_else(|err| panic!("{err:?}"));
            assert_eq!(output, "allowed\nrefused\n");
            assert!(matches!(status, WaitStatus::Exited(_, 0)), "{status:?}");
            // The sandbox was the launching thread's: this one reads what the command
            // could not.
            assert_eq!(
                std::fs::read_to_string(dir.path().join("denied/b.txt")).ok().as_deref(),
                Some("denied\n")
            );
        }
    }

    #[test]
    fn a_command_starts_with_no_signal_blocked_and_sigpipe_at_its_default() {
        use nix::sys::signal::{SigmaskHow, pthread_sigmask};
        // Whatever the caller blocks (the supervisor blocks what its signalfd reads) and
        // ignores (a Rust program ignores SIGPIPE) is not passed on.
        let outcome = std::thread::spawn(|| {
            let mut blocked = SigSet::empty();
            blocked.add(Signal::SIGTERM);
            blocked.add(Signal::SIGCHLD);
            pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&blocked), None)
                .unwrap_or_else(|err| panic!("{err}"));
            let status =
                run(&["/bin/grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"], None, None);
            let killed = run(&["/bin/sh", "-c", "kill -TERM $$; echo survived"], None, None);
            (status, killed)
        })
        .join()
        .unwrap_or_else(|_| panic!("the test thread panicked"));
        let (status, _) = outcome.0.unwrap_or_else(|err| panic!("{err:?}"));
        let mask = |name: &str| {
            let line = status.lines().find(|line| line.starts_with(name));
            let hex = line.and_then(|line| line.split_whitespace().nth(1));
            hex.and_then(|hex| u64::from_str_radix(hex, 16).ok())
                .unwrap_or_else(|| panic!("no {name} in {status:?}"))
        };
        assert_eq!(mask("SigBlk:"), 0, "{status}");
        assert_eq!(mask("SigIgn:") & (1 << (Signal::SIGPIPE as u64 - 1)), 0, "{status}");
        let (output, ended) = outcome.1.unwrap_or_else(|err| panic!("{err:?}"));
        assert_eq!(output, "");
        assert!(matches!(ended, WaitStatus::Signaled(_, Signal::SIGTERM, _)), "{ended:?}");
    }

    #[test]
    fn a_program_without_a_slash_is_looked_for_in_the_commands_path() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let (first, second) = (dir.path().join("first"), dir.path().join("second"));
        for sub in [&first, &second] {
            std::fs::create_dir(sub).unwrap_or_else(|err| panic!("{err}"));
        }
        let script = |path: &Path, body: &str, mode: u32| {
            std::fs::write(path, format!("#!/bin/sh\n{body}\n"))
                .unwrap_or_else(|err| panic!("{err}"));
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .unwrap_or_else(|err| panic!("{err}"));
        };
        // Not executable in the first directory: passed over, as `execvp` does.
        script(&first.join("tool"), "echo first", 0o644);
        script(&second.join("tool"), "echo \"second $MARK\"", 0o755);
        script(&first.join("locked"), "echo locked", 0o644);
        std::fs::write(second.join("plain"), "echo \"plain $1 $MARK\"\n")
            .unwrap_or_else(|err| panic!("{err}"));
        std::fs::set_permissions(second.join("plain"), std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|err| panic!("{err}"));
        let mut path = first.clone().into_os_string();
        path.push(":/nonexistent:");
        path.push(&second);
        let env = env_with_path(Path::new(&path));

        let (output, status) =
            run(&["tool"], Some(&env), None).unwrap_or_else(|err| panic!("{err:?}"));
        assert_eq!(output, "second seen\n");
        assert!(matches!(status, WaitStatus::Exited(_, 0)), "{status:?}");
        // No `#!` line: run by the shell, with its arguments.
        let (output, _) =
            run(&["plain", "arg"], Some(&env), None).unwrap_or_else(|err| panic!("{err:?}"));
        assert_eq!(output, "plain arg seen\n");
        let error = |argv: &[&str]| match run(argv, Some(&env), None) {
            Err(Failed::Spawn(err)) => err.raw_os_error(),
            other => panic!("{other:?}"),
        };
        // Found only where it may not run: refused; found nowhere: missing.
        assert_eq!(error(&["locked"]), Some(libc::EACCES));
        assert_eq!(error(&["nowhere"]), Some(libc::ENOENT));
        assert_eq!(error(&[""]), Some(libc::ENOENT));
        assert_eq!(error(&["/nonexistent/tool"]), Some(libc::ENOENT));
    }

    #[test]
    fn candidates_follow_the_path_and_an_empty_entry_is_the_working_directory() {
        let names = |program: &str, path: &str| {
            candidates(program.as_bytes(), path.as_bytes().to_vec())
                .unwrap_or_else(|err| panic!("{err:?}"))
                .into_iter()
                .map(|candidate| candidate.into_string().unwrap_or_default())
                .collect::<Vec<_>>()
        };
        assert_eq!(names("ls", "/a::/b"), ["/a/ls", "./ls", "/b/ls"]);
        assert_eq!(names("./ls", "/a"), ["./ls"]);
        assert_eq!(names("sub/ls", "/a"), ["sub/ls"]);
        assert!(names("", "/a").is_empty());
        assert!(matches!(candidates(b"l\0s", b"/a".to_vec()), Err(Failed::Spawn(_))));
        assert_eq!(search_path(Some(&[])), DEFAULT_PATH);
        let env = [("PATH".into(), "/x:/y".into())];
        assert_eq!(search_path(Some(&env)), b"/x:/y");
    }
}
