//! Starting a long-lived program (an upstream stdio server) in the sandbox.
//!
//! A server is not a call: it talks over its stdin and stdout for as long as it
//! lives, so it does not run under a per-call supervisor. It is started through this
//! same binary re-executed in a hidden mode ([`EXEC_ARG`]) that builds the sandbox from
//! the profile on its command line, enters it itself (it is single-threaded, before
//! any runtime), drops the capabilities a root daemon's commands lose, and `exec`s the
//! server in place: same process, same pipes, same process group.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::Path;

use super::Profile;

/// The hidden first argument that turns the `toolgate` binary into a sandboxed `exec`.
pub const EXEC_ARG: &str = "__sandbox_exec";

/// What a failure to start reports as exit code (as a shell does for a program it
/// cannot run).
const CANNOT_RUN: i32 = 126;

/// A command that starts `program args` in `profile` through `launcher` (the
/// `toolgate` binary). The caller sets the environment, pipes and directory.
pub fn command(
    launcher: &Path,
    profile: &Profile,
    program: &str,
    args: &[String],
) -> Result<tokio::process::Command, String> {
    let profile = serde_json::to_string(profile).map_err(|err| err.to_string())?;
    let mut command = tokio::process::Command::new(launcher);
    command
        .arg0("toolgate-sandbox")
        .arg(EXEC_ARG)
        .arg("--profile")
        .arg(profile)
        .arg("--")
        .arg(program)
        .args(args);
    Ok(command)
}

/// Runs the sandboxed `exec` if this process was started as one (`argv[1]` is
/// [`EXEC_ARG`]): returns only when it failed, with the exit code; `None` when this
/// process is something else. The `toolgate` binary calls this first thing in `main`.
pub fn exec_if_requested() -> Option<i32> {
    let mut args = std::env::args_os();
    let _program = args.next();
    if args.next().as_deref() != Some(OsStr::new(EXEC_ARG)) {
        return None;
    }
    crate::sys::schedule_commands_normally();
    let message = match exec(args) {
        Ok(never) => match never {},
        Err(message) => message,
    };
    eprintln!("toolgate {EXEC_ARG}: {message}");
    Some(CANNOT_RUN)
}

/// `--profile JSON -- PROGRAM [ARGS...]`: enters the sandbox and becomes PROGRAM.
fn exec(mut args: impl Iterator<Item = OsString>) -> Result<std::convert::Infallible, String> {
    if args.next().as_deref() != Some(OsStr::new("--profile")) {
        return Err("expected --profile".to_owned());
    }
    let profile = args.next().ok_or("--profile needs a value")?;
    let profile = profile.into_string().map_err(|_| "--profile is not UTF-8")?;
    if args.next().as_deref() != Some(OsStr::new("--")) {
        return Err("expected -- before the program".to_owned());
    }
    let program = args.next().ok_or("no program to run")?;
    let profile: Profile = serde_json::from_str(&profile).map_err(|err| err.to_string())?;
    let prepared = super::confine::prepare(&profile)?;
    super::harden::drop_reaching_capabilities()
        .map_err(|err| format!("dropping capabilities: {err}"))?;
    super::confine::enter_self(prepared).map_err(|err| format!("the sandbox: {err}"))?;
    let err = std::process::Command::new(&program).args(args).exec();
    Err(format!("cannot run {}: {err}", program.to_string_lossy()))
}
