//! Spawning commands and supervising their whole process tree, shared by run_command,
//! command hooks and upstream servers.
//!
//! The promise this module keeps is that **no process started for a call outlives the
//! call**: not on a normal exit that leaves `sleep 100 &` behind, not on a timeout or a
//! cancellation, not when the caller's future is dropped, and not when the daemon
//! itself dies — including children that call `setsid` or double-fork, which leave the
//! process group and so escape a plain `killpg`.
//!
//! How: every command runs under a small per-call *supervisor*, this same binary's
//! code in a process of its own: forked, as the daemon's child, by the long-lived
//! single-threaded spawner ([`spawner`]), or, where that cannot be used, the
//! binary re-executed in a hidden mode ([`SUPERVISE_ARG`]). Never a fork of the
//! multi-threaded daemon itself. The supervisor
//! 1. makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`), so every orphaned
//!    descendant re-parents to it instead of to init, and stays findable;
//! 2. starts the command with the daemon-chosen cwd, environment and stdin, handing it
//!    its own stdout and stderr (the daemon's pipes) directly — or, for a background
//!    process with live input ([`terminal`]), a pipe the daemon keeps writing
//!    to as stdin, or a terminal as stdin, stdout, stderr and controlling terminal;
//! 3. when the command exits, or the daemon asks, or the daemon goes away, SIGKILLs
//!    every process whose ancestry leads back to it (found by walking `/proc`), again
//!    and again until none is left, reaping them all;
//! 4. reports the command's exit status and that the tree is gone.
//!
//! Where the daemon can create cgroups ([`crate::sandbox::cgroup`]), the supervisor
//! first moves itself into a cgroup of its own for the call, and the daemon kills that
//! cgroup when the call ends. That covers what the walk cannot: a supervisor killed
//! (by the command, or from outside as the OOM killer would) leaves orphans that no
//! longer descend from it, but they are still in the cgroup. A supervisor found
//! stopped (it gets SIGSTOP from the command) is killed with its tree. The supervisor
//! is not dumpable and, under a root daemon, drops the capabilities that reach into
//! other processes before it starts the command ([`crate::sandbox::harden`]).
//!
//! The daemon talks to the supervisor over a Unix socket pair installed as the
//! supervisor's stdin (`fd 0`). The daemon sends the command's stdin bytes, then
//! nothing: closing (or shutting down) its end means "kill everything now". Because the
//! kernel closes that socket when the daemon dies for any reason, even SIGKILL, the
//! tree cannot survive the daemon; `PR_SET_PDEATHSIG` is a second line of defence. The
//! supervisor learns the daemon's pid from the socket (`SO_PEERCRED`), never from its
//! command line, which any command can read. The
//! supervisor answers with newline-terminated report lines (`spawned PID`, `exit code
//! N`, `done`, ...). If the daemon's future is dropped mid-call, a guard also sweeps
//! the supervisor's descendants itself, so the kill does not wait for the supervisor.
//!
//! Outside the `toolgate` binary (integration tests, above all), the supervisor
//! binary must be named with [`Supervisor::install`]: `/proc/self/exe` is then a test
//! harness, which fails the handshake with [`ProcessError::Handshake`].
//!
//! The daemon side ([`run`]) reads stdout and stderr as they arrive, forwards every
//! chunk (never splitting a UTF-8 character) to the live [`OutputSink`], keeps the head
//! and the tail of each stream within the output budget, and enforces the deadline and
//! the cancellation token.
//!
//! The files: the live output's types here; the request ([`Spec`]), its outcome, the
//! daemon side and the spares a call takes in `run.rs`; the supervisor side in
//! `supervisor.rs`; the spawner in `spawner.rs`; the command's start in `launch.rs`;
//! descriptor passing in `fd_pass.rs` and `cwd.rs`; live input in `terminal.rs`.

pub mod cwd;
pub(crate) mod fd_pass;
pub(crate) mod launch;
mod run;
pub(crate) mod spawner;
mod supervisor;
pub mod terminal;

use std::sync::Arc;

pub(crate) use run::protect_git;
pub use run::*;
pub use supervisor::{supervise_if_requested, supervise_main};

/// Captured command output kept per call (head and tail together).
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 1024 * 1024;

/// Which stream a chunk of live output came from (a wire type: `tool_output` events
/// carry it).
pub use crate::wire::OutputStream;

/// Receives live output of a running call (the agent layer numbers the chunks and
/// turns them into `tool_output` events). Must not block: it is called from the task
/// that reads the child's pipes.
#[derive(Clone)]
pub struct OutputSink(Option<Arc<OutputFn>>);

/// The callback behind an active [`OutputSink`].
type OutputFn = dyn Fn(OutputStream, &str) + Send + Sync;

impl OutputSink {
    /// A sink that drops everything.
    pub fn discard() -> OutputSink {
        OutputSink(None)
    }

    pub fn new(f: impl Fn(OutputStream, &str) + Send + Sync + 'static) -> OutputSink {
        OutputSink(Some(Arc::new(f)))
    }

    pub fn is_active(&self) -> bool {
        self.0.is_some()
    }

    pub fn emit(&self, stream: OutputStream, text: &str) {
        if let Some(f) = &self.0 {
            f(stream, text);
        }
    }
}

impl std::fmt::Debug for OutputSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_active() { "OutputSink(active)" } else { "OutputSink(discard)" })
    }
}
