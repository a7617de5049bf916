//! run_command: runs a shell command line in the session's working directory and
//! returns its output, under the supervision of [`crate::exec`].
//!
//! The command gets `/dev/null` as stdin (or the `stdin` text), exactly the session's
//! [`EnvPolicy`] environment (secret-looking variables are not inherited), and a
//! deadline. Its stdout and stderr are streamed live to the call's output sink and
//! kept (head and tail) within the session's output budget. Whatever the command
//! starts — background jobs, `setsid` daemons, double-forked grandchildren — is killed
//! when the call ends.
//!
//! With `background`, `yield_ms` or `tty` (or a timeout under `on_timeout =
//! "background"`) the command runs as a background process of the session
//! ([`crate::tools::jobs`]): same supervisor, cgroup and sandbox, but its life is the
//! session's, its output is spooled, and the call can answer with a handle
//! (`process_id`) for `process_read`, `process_write`, `process_resize` and
//! `process_kill` while it runs. Such a process has a live stdin (a pipe, or a
//! terminal with `tty`) until `process_write` closes it.
//!
//! [`EnvPolicy`]: crate::tools::EnvPolicy

use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::exec::terminal::LiveInput;
use crate::exec::{self as process, ExitStatus, Outcome, Program, Spec, Stdin};
use crate::tools::duration::describe_duration;
use crate::tools::facts::{ClaudeCode, ClaudeTool, Subject};
use crate::tools::jobs::{Job, OnTimeout, Processes, StartError};
use crate::tools::{
    Definition, ErrorType, Facts, Safety, Tool, ToolContext, ToolResult, fs, parse_args, schema_for,
};

/// The longest part of a call's deadline that run_command keeps back for itself. The
/// registry enforces the same deadline and, when its timer wins, can only answer a
/// bare `timeout`; firing a little earlier lets the tool kill the tree and still hand
/// the model the output produced so far. A second is ample to kill and reap a tree.
const KILL_RESERVE_MAX: Duration = Duration::from_secs(1);

/// The arguments of a run_command call.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The command line, run with `/bin/sh -c`.
    #[schemars(length(min = 1))]
    command: String,
    /// Deadline in milliseconds (capped by the session's maximum). On timeout the
    /// command and everything it started are killed.
    #[serde(default)]
    #[schemars(range(min = 1))]
    #[expect(dead_code, reason = "the registry reads it through requested_timeout")]
    timeout_ms: Option<u64>,
    /// Working directory, relative to the session's working directory; must be inside
    /// the session's roots.
    #[serde(default)]
    cwd: Option<String>,
    /// Start the command as a background process and answer at once with its
    /// `process_id` (read its output with process_read, answer prompts with
    /// process_write, stop it with process_kill). It runs until it exits, is killed or
    /// its session ends; the deadline does not apply.
    #[serde(default)]
    background: Option<bool>,
    /// Wait at most this long (milliseconds): a command that ends sooner answers as
    /// usual; one still running answers with its `process_id` and the output so far,
    /// and goes on in the background.
    #[serde(default)]
    #[schemars(range(min = 0))]
    yield_ms: Option<u64>,
    /// Run the command on a pseudo-terminal (stdin, stdout and stderr), for REPLs,
    /// prompts and programs that behave differently on a terminal. Output then holds
    /// the terminal's bytes (echo, carriage returns, escape sequences).
    #[serde(default)]
    tty: Option<bool>,
    /// Terminal rows (with `tty`; default 24).
    #[serde(default)]
    #[schemars(range(min = 1, max = 1000))]
    rows: Option<u16>,
    /// Terminal columns (with `tty`; default 80).
    #[serde(default)]
    #[schemars(range(min = 1, max = 1000))]
    cols: Option<u16>,
    /// Text written to the command's stdin when it starts. Without `background`,
    /// `yield_ms` or `tty`, stdin then ends; with them it stays open for process_write.
    #[serde(default)]
    stdin: Option<String>,
    /// Leave the sandbox for this call only: more paths to write beneath, or the
    /// network. Only a person can approve it (asked in every mode). Ask for it after a
    /// result names what the sandbox denied.
    #[serde(default)]
    sandbox: Option<crate::sandbox::Widening>,
}

struct RunCommand {
    definition: Definition,
}

pub fn tool() -> Arc<dyn Tool> {
    Arc::new(RunCommand {
        definition: Definition {
            name: "run_command".to_owned(),
            description: "Run a shell command (/bin/sh -c) in the session's working directory \
                          (or `cwd`, which must be inside the workspace roots). stdin is \
                          closed unless `stdin` gives it text. Returns stdout, then stderr \
                          under a [stderr] header, then the exit code; long output keeps its \
                          beginning and end. A non-zero exit is an error that still carries \
                          the output. Every process the command starts, including background \
                          jobs, is killed when it ends or times out. For long or interactive \
                          commands: `background: true` answers at once with a process_id, \
                          `yield_ms` waits that long and then answers with the process_id and \
                          the output so far, `tty: true` runs it on a terminal; then use \
                          process_read, process_write, process_kill."
                .to_owned(),
            input_schema: schema_for::<Args>(),
            safety: Safety::SideEffect,
            system: false,
            timeout: None,
            facts: Facts {
                subject: Subject::Command { command: "command", cwd: "cwd" },
                edits: false,
                binds_access: false,
                claude_code: ClaudeCode::Tool(ClaudeTool {
                    name: "Bash",
                    aliases: &[],
                    fields: &[("timeout_ms", "timeout")],
                }),
            },
        },
    })
}

#[async_trait::async_trait]
impl Tool for RunCommand {
    fn definition(&self) -> &Definition {
        &self.definition
    }

    fn requested_timeout(&self, args: &Value) -> Option<Duration> {
        args.get("timeout_ms").and_then(Value::as_u64).map(Duration::from_millis)
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(res) => return res,
        };
        let cwd = match fs::open_dir(&ctx.env, args.cwd.as_deref()) {
            Ok(cwd) => cwd,
            Err(err) => return err.into(),
        };
        let command = args.command.clone();
        let mut spec = match Spec::for_call(Program::Shell(args.command), cwd.path, &ctx) {
            Ok(spec) => spec,
            Err(reason) => return ToolResult::failure(ErrorType::AccessDenied, reason),
        };
        spec.cwd_dir = Some(std::sync::Arc::new(cwd.fd));
        spec.stdin = match &args.stdin {
            Some(text) => Stdin::Bytes(text.clone().into_bytes()),
            None => Stdin::Closed,
        };
        spec.timeout = Some(own_deadline(ctx.timeout));
        if let Some(widening) = &args.sandbox {
            if let Err(message) = widening.check() {
                return ToolResult::failure(ErrorType::InvalidArguments, message);
            }
            if let Some(profile) = &mut spec.sandbox {
                profile.widen(widening);
            }
        }
        let profile = spec.sandbox.clone();
        let background = args.background.unwrap_or(false);
        let tty = args.tty.unwrap_or(false);
        let processes = ctx.env.control.get().and_then(|session| session.processes());
        let on_timeout = processes.as_ref().map_or(OnTimeout::Kill, |p| p.settings().on_timeout);
        let as_process =
            background || tty || args.yield_ms.is_some() || on_timeout == OnTimeout::Background;
        if !as_process {
            return match process::run(spec).await {
                Ok(outcome) => crate::tools::confined::annotate(
                    result_for(&outcome, ctx.timeout),
                    &outcome,
                    profile.as_ref(),
                ),
                Err(err) => ToolResult::failure(ErrorType::IoError, err.to_string()),
            };
        }
        let Some(processes) = processes else {
            return ToolResult::failure(
                ErrorType::InvalidArguments,
                "background processes need a session that keeps them; this call has none",
            );
        };
        let live = if tty {
            Some(LiveInput::terminal(args.rows.unwrap_or(24), args.cols.unwrap_or(80)))
        } else if background || args.yield_ms.is_some() {
            Some(LiveInput::pipe())
        } else {
            None
        };
        let live = match live.transpose() {
            Ok(live) => live.map(Arc::new),
            Err(err) => {
                return ToolResult::failure(
                    ErrorType::IoError,
                    format!("cannot create the command's input: {err}"),
                );
            }
        };
        if live.is_some() {
            spec.stdin = Stdin::Closed;
        }
        if background {
            // Never rendered from memory: its output is read from the spool.
            spec.output_cap = 0;
        }
        let job = match processes.start(spec, &command, &ctx.call_id, live.clone()) {
            Ok(job) => job,
            Err(err) => {
                let error_type = match err {
                    // A limit: the message names it.
                    StartError::TooManyRunning(_) | StartError::OutputLimit { .. } => {
                        ErrorType::TooLarge
                    }
                    StartError::Spool { .. } => ErrorType::IoError,
                    StartError::Closing => ErrorType::Canceled,
                };
                return ToolResult::failure(error_type, err.to_string());
            }
        };
        if let (Some(live), Some(text)) = (live, args.stdin) {
            // In a task of its own: a command that does not read yet must not hold
            // the call.
            tokio::spawn(async move {
                if let Err(err) = live.write(text.as_bytes()).await {
                    tracing::debug!(%err, "writing a background process's initial stdin");
                }
            });
        }
        if background {
            return handle_result(&job, &ctx, "started in the background").await;
        }
        let wait = match args.yield_ms {
            Some(yield_ms) => Duration::from_millis(yield_ms).min(own_deadline(ctx.timeout)),
            None => own_deadline(ctx.timeout),
        };
        let exited = job.wait_for(wait, &ctx.cancel).await;
        if exited {
            return finished_result(&processes, &job, ctx.timeout, false, profile.as_ref());
        }
        if ctx.cancel.is_cancelled() {
            job.kill("the call was canceled").await;
            processes.forget(&job.id);
            return ToolResult::failure(
                ErrorType::Canceled,
                "the command was canceled; it and every process it started were killed",
            );
        }
        if args.yield_ms.is_none() && on_timeout == OnTimeout::Kill {
            job.kill("it timed out").await;
            return finished_result(&processes, &job, ctx.timeout, true, profile.as_ref());
        }
        let why = if args.yield_ms.is_some() {
            "still running after yield_ms; it goes on in the background"
        } else {
            "still running at the deadline; it goes on in the background (on_timeout = \"background\")"
        };
        handle_result(&job, &ctx, why).await
    }
}

/// The answer for a process that goes on: its handle, and the output so far (the
/// tail, within the session's output budget).
async fn handle_result(job: &Job, ctx: &ToolContext, why: &str) -> ToolResult {
    let budget = ctx.env.max_output_bytes;
    let limit = i64::try_from(budget).unwrap_or(i64::MAX);
    let read = job.read(-limit, budget, Duration::ZERO, &ctx.cancel).await;
    let (text, next_offset, dropped) = match &read {
        Ok(read) => (read.page.text.clone(), read.page.next_offset, read.page.offset),
        Err(_) => (String::new(), 0, 0),
    };
    let mut content = format!(
        "[process {} {why}; read its output with process_read {{\"id\": \"{}\", \"offset\": {next_offset}}}]\n",
        job.id, job.id
    );
    if dropped > 0 {
        content.push_str(&format!("... [{dropped} earlier bytes not shown] ...\n"));
    }
    content.push_str(&text);
    ToolResult::success(content)
        .with_meta("process_id", job.id.as_str())
        .with_meta("running", job.is_running())
        .with_meta("next_offset", next_offset)
        .with_meta("tty", job.has_terminal())
}

/// The answer for a process that ended within the call: the usual command result; the
/// process is forgotten (its output is in the answer).
fn finished_result(
    processes: &Processes,
    job: &Job,
    timeout: Duration,
    timed_out: bool,
    profile: Option<&crate::sandbox::Profile>,
) -> ToolResult {
    let exit = job.exit();
    processes.forget(&job.id);
    match exit {
        Some(exit) => match (exit.outcome, &exit.error) {
            (Some(outcome), _) => {
                let mut outcome = Outcome::clone(&outcome);
                if timed_out {
                    // Killed by this call at its deadline, not canceled by anyone.
                    outcome.timed_out = true;
                    outcome.canceled = false;
                }
                crate::tools::confined::annotate(result_for(&outcome, timeout), &outcome, profile)
            }
            (None, Some(error)) => ToolResult::failure(ErrorType::IoError, error.clone()),
            (None, None) => ToolResult::failure(
                ErrorType::IoError,
                "the command's exit status could not be determined",
            ),
        },
        None => ToolResult::failure(ErrorType::InternalError, "the process has not ended"),
    }
}

/// The deadline the tool enforces itself: the call's, minus a reserve to kill the
/// tree and report before the registry's timer fires.
fn own_deadline(timeout: Duration) -> Duration {
    timeout.saturating_sub((timeout / 10).min(KILL_RESERVE_MAX))
}

/// Turns an outcome into the call's result: the rendering in `content`, the facts in
/// metadata, and the error code that says why it did not succeed.
fn result_for(outcome: &Outcome, timeout: Duration) -> ToolResult {
    let res = if outcome.timed_out {
        ToolResult::failure(
            ErrorType::Timeout,
            format!(
                "the command timed out after {}; it and every process it started were killed",
                describe_duration(timeout)
            ),
        )
        .with_meta("timeout_ms", millis(timeout))
    } else if outcome.canceled {
        ToolResult::failure(
            ErrorType::Canceled,
            "the command was canceled; it and every process it started were killed",
        )
    } else {
        match outcome.status {
            Some(ExitStatus::Code(0)) => ToolResult::success(String::new()),
            Some(ExitStatus::Code(code)) => ToolResult::failure(
                ErrorType::CommandFailed,
                format!("the command exited with code {code}"),
            ),
            Some(ExitStatus::Signal(signal)) => ToolResult::failure(
                ErrorType::CommandFailed,
                format!("the command was killed by signal {signal} ({})", signal_name(signal)),
            ),
            None => ToolResult::failure(
                ErrorType::IoError,
                "the command's exit status could not be determined",
            ),
        }
    };
    let res = match outcome.status {
        Some(ExitStatus::Code(code)) => res.with_meta("exit_code", code),
        Some(ExitStatus::Signal(signal)) => res.with_meta("signal", signal),
        None => res,
    };
    let res = res
        .with_content(render(outcome, timeout))
        .with_meta("stdout_bytes", outcome.stdout.total_bytes)
        .with_meta("stderr_bytes", outcome.stderr.total_bytes)
        .with_meta("truncated", outcome.truncated())
        .with_meta("omitted_bytes", outcome.stdout.omitted_bytes + outcome.stderr.omitted_bytes)
        .with_meta("duration_ms", millis(outcome.duration))
        .with_meta("containment", outcome.containment.as_str())
        .with_meta("sandbox", outcome.sandbox.as_deref().unwrap_or("none"));
    match &outcome.limit_hit {
        Some(limit) => res.with_meta("limit", limit.as_str()),
        None => res,
    }
}

/// stdout, then stderr under a `[stderr]` header, then one line saying how it ended.
fn render(outcome: &Outcome, timeout: Duration) -> String {
    let mut content = outcome.stdout.text.clone();
    if !outcome.stderr.text.is_empty() {
        end_line(&mut content);
        content.push_str("[stderr]\n");
        content.push_str(&outcome.stderr.text);
    }
    end_line(&mut content);
    let ending = if outcome.timed_out {
        format!("[timed out after {}]", describe_duration(timeout))
    } else if outcome.canceled {
        "[canceled]".to_owned()
    } else {
        match outcome.status {
            Some(ExitStatus::Code(code)) => format!("[exit code {code}]"),
            Some(ExitStatus::Signal(signal)) => {
                format!("[killed by signal {signal} ({})]", signal_name(signal))
            }
            None => "[exit status unknown]".to_owned(),
        }
    };
    content.push_str(&ending);
    content
}

fn end_line(text: &mut String) {
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
}

fn signal_name(signal: i32) -> &'static str {
    nix::sys::signal::Signal::try_from(signal).map_or("unknown signal", |signal| signal.as_str())
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::Captured;

    fn outcome(status: Option<ExitStatus>, stdout: &str, stderr: &str) -> Outcome {
        let captured = |text: &str| Captured {
            text: text.to_owned(),
            total_bytes: text.len() as u64,
            omitted_bytes: 0,
        };
        Outcome {
            status,
            stdout: captured(stdout),
            stderr: captured(stderr),
            timed_out: false,
            canceled: false,
            duration: Duration::from_millis(12),
            containment: crate::sandbox::Containment::Supervisor,
            sandbox: None,
            limit_hit: None,
        }
    }

    #[test]
    fn rendering_puts_stderr_under_a_header_and_the_exit_code_last() {
        let out = outcome(Some(ExitStatus::Code(3)), "out\nno newline", "err\n");
        assert_eq!(
            render(&out, Duration::from_secs(1)),
            "out\nno newline\n[stderr]\nerr\n[exit code 3]"
        );
        assert_eq!(
            render(&outcome(Some(ExitStatus::Code(0)), "", ""), Duration::ZERO),
            "[exit code 0]"
        );
    }

    #[test]
    fn rendering_names_signals_and_timeouts() {
        let killed = outcome(Some(ExitStatus::Signal(15)), "x\n", "");
        assert_eq!(render(&killed, Duration::ZERO), "x\n[killed by signal 15 (SIGTERM)]");
        let mut timed_out = outcome(Some(ExitStatus::Signal(9)), "partial", "");
        timed_out.timed_out = true;
        assert_eq!(
            render(&timed_out, Duration::from_millis(1500)),
            "partial\n[timed out after 1500ms]"
        );
    }

    #[test]
    fn results_carry_the_code_and_the_metadata() {
        let failed = result_for(&outcome(Some(ExitStatus::Code(2)), "o", "e"), Duration::ZERO);
        assert_eq!(failed.error_type, Some(ErrorType::CommandFailed));
        assert_eq!(failed.metadata["exit_code"], 2);
        assert_eq!(failed.metadata["stdout_bytes"], 1);
        assert_eq!(failed.metadata["stderr_bytes"], 1);
        assert_eq!(failed.metadata["truncated"], false);
        assert_eq!(failed.metadata["duration_ms"], 12);
        assert_eq!(failed.content, "o\n[stderr]\ne\n[exit code 2]");

        let signaled = result_for(&outcome(Some(ExitStatus::Signal(9)), "", ""), Duration::ZERO);
        assert_eq!(signaled.error_type, Some(ErrorType::CommandFailed));
        assert_eq!(signaled.metadata["signal"], 9);
        assert!(!signaled.metadata.contains_key("exit_code"));

        let ok = result_for(&outcome(Some(ExitStatus::Code(0)), "fine\n", ""), Duration::ZERO);
        assert!(ok.ok);
        assert_eq!(ok.content, "fine\n[exit code 0]");
    }

    #[test]
    fn the_own_deadline_fires_before_the_registry_deadline() {
        assert_eq!(own_deadline(Duration::from_secs(120)), Duration::from_secs(119));
        assert_eq!(own_deadline(Duration::from_secs(2)), Duration::from_millis(1800));
        assert_eq!(own_deadline(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn the_schema_rejects_unknown_fields_and_empty_commands() {
        let schema = schema_for::<Args>();
        let validator = jsonschema::validator_for(&schema).unwrap();
        assert!(
            validator.is_valid(&serde_json::json!({"command": "ls", "timeout_ms": 5, "cwd": "."}))
        );
        assert!(!validator.is_valid(&serde_json::json!({"command": ""})));
        assert!(!validator.is_valid(&serde_json::json!({"command": "ls", "shell": "bash"})));
        assert!(!validator.is_valid(&serde_json::json!({"command": "ls", "timeout_ms": 0})));
    }
}
