//! The tools that work with a session's background processes (started by
//! `run_command` with `background`, `yield_ms` or `tty`): `process_read`,
//! `process_write`, `process_resize`, `process_kill` and `process_list`.
//!
//! A process is named by its `id` (`p1`, ...) within its session: no session can see
//! or touch another's processes. Output is one byte stream (stdout and stderr in
//! arrival order, or the terminal's bytes) addressed by offset, the same number that
//! `tool_output` events carry, so a client that lost its connection reads on from
//! the last offset it saw.

use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::exec::ExitStatus;
use crate::tools::facts::{ClaudeCode, Subject};
use crate::tools::jobs::{Exit, Job, Processes, parse_signal};
use crate::tools::{
    Definition, ErrorType, Facts, Safety, Tool, ToolContext, ToolResult, parse_args, schema_for,
};

/// The default page of `process_read`.
const DEFAULT_READ_LIMIT: usize = 16 * 1024;
/// The longest `wait_ms` a read may ask for (the call's deadline still applies).
const MAX_WAIT: Duration = Duration::from_secs(300);

pub const READ: &str = "process_read";
pub const WRITE: &str = "process_write";
pub const RESIZE: &str = "process_resize";
pub const KILL: &str = "process_kill";
pub const LIST: &str = "process_list";

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    /// The process (`process_id` from run_command).
    #[schemars(length(min = 1))]
    id: String,
    /// Byte offset in the process's output to read from; a negative one counts back
    /// from the end (-2000: the last 2000 bytes). Default 0. Output older than what
    /// the spool keeps is reported as dropped.
    #[serde(default)]
    offset: Option<i64>,
    /// Bytes to return at most (default 16384; at most the session's output budget).
    #[serde(default)]
    #[schemars(range(min = 1))]
    limit: Option<usize>,
    /// When there is no output past `offset` yet and the process runs, wait this long
    /// (milliseconds) for some, or for the process to end.
    #[serde(default)]
    #[schemars(range(min = 0))]
    wait_ms: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    #[schemars(length(min = 1))]
    id: String,
    /// Text written to the process's stdin or terminal as it is (add "\n" to end a
    /// line). Checked by the permission rules as a command line, like run_command's.
    input: String,
    /// Then close stdin (on a terminal: send end-of-file, Ctrl-D).
    #[serde(default)]
    close_stdin: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ResizeArgs {
    #[schemars(length(min = 1))]
    id: String,
    #[schemars(range(min = 1, max = 1000))]
    rows: u16,
    #[schemars(range(min = 1, max = 1000))]
    cols: u16,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct KillArgs {
    #[schemars(length(min = 1))]
    id: String,
    /// Without it (or with KILL) the process and everything it started are killed.
    /// Another signal (TERM, INT, HUP, QUIT, USR1, USR2, STOP, CONT, WINCH) goes to
    /// the command itself; when it exits, whatever it left behind is killed.
    #[serde(default)]
    signal: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListArgs {}

struct ProcessTool {
    definition: Definition,
}

fn definition(name: &str, description: &str, input_schema: Value, safety: Safety) -> Definition {
    Definition {
        name: name.to_owned(),
        description: description.to_owned(),
        input_schema,
        safety,
        system: false,
        timeout: None,
        facts: Facts {
            subject: Subject::Arguments,
            edits: false,
            binds_access: false,
            claude_code: ClaudeCode::NoCounterpart,
        },
    }
}

pub fn tools() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(ProcessTool {
            definition: definition(
                READ,
                "Read a background process's output (started by run_command with background, \
                 yield_ms or tty) from a byte offset: the answer ends with the offset to read \
                 on from, and whether the process still runs or how it ended. A negative \
                 offset reads the tail; wait_ms waits for new output.",
                schema_for::<ReadArgs>(),
                Safety::ReadOnly,
            ),
        }),
        Arc::new(ProcessTool {
            definition: definition(
                WRITE,
                "Write text to a background process's stdin or terminal (e.g. answer a \
                 prompt: \"yes\\n\"); close_stdin ends its input.",
                schema_for::<WriteArgs>(),
                Safety::SideEffect,
            ),
        }),
        Arc::new(ProcessTool {
            definition: definition(
                RESIZE,
                "Resize a background process's terminal (started with tty).",
                schema_for::<ResizeArgs>(),
                Safety::SideEffect,
            ),
        }),
        Arc::new(ProcessTool {
            definition: definition(
                KILL,
                "Stop a background process and everything it started (or send it one signal).",
                schema_for::<KillArgs>(),
                Safety::SideEffect,
            ),
        }),
        Arc::new(ProcessTool {
            definition: definition(
                LIST,
                "List this session's background processes: id, command, running or how it \
                 ended, runtime, output size.",
                schema_for::<ListArgs>(),
                Safety::ReadOnly,
            ),
        }),
    ]
}

fn processes(ctx: &ToolContext) -> Result<Arc<Processes>, ToolResult> {
    ctx.env.control.get().and_then(|session| session.processes()).ok_or_else(|| {
        ToolResult::failure(ErrorType::NotFound, "this session keeps no background processes")
    })
}

fn find(processes: &Processes, id: &str) -> Result<Arc<Job>, ToolResult> {
    processes.get(id).ok_or_else(|| {
        ToolResult::failure(
            ErrorType::NotFound,
            format!("no process {id:?} in this session (process_list shows them)"),
        )
    })
}

#[async_trait::async_trait]
impl Tool for ProcessTool {
    fn definition(&self) -> &Definition {
        &self.definition
    }

    fn requested_timeout(&self, args: &Value) -> Option<Duration> {
        // A read that waits needs the time it asks for, plus a little.
        let wait = args.get("wait_ms").and_then(Value::as_u64)?;
        Some(Duration::from_millis(wait).min(MAX_WAIT) + Duration::from_secs(5))
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let result = match self.definition.name.as_str() {
            READ => read(args, &ctx).await,
            WRITE => write(args, &ctx).await,
            RESIZE => resize(args, &ctx),
            KILL => kill(args, &ctx).await,
            _ => list(&ctx),
        };
        result.unwrap_or_else(|refused| refused)
    }
}

async fn read(args: Value, ctx: &ToolContext) -> Result<ToolResult, ToolResult> {
    let args: ReadArgs = parse_args(args)?;
    let processes = processes(ctx)?;
    let job = find(&processes, &args.id)?;
    let limit = args.limit.unwrap_or(DEFAULT_READ_LIMIT).min(ctx.env.max_output_bytes).max(1);
    // Never past the call's own deadline: answer with what there is instead.
    let wait = Duration::from_millis(args.wait_ms.unwrap_or(0))
        .min(MAX_WAIT)
        .min(ctx.timeout.saturating_sub(Duration::from_secs(1)));
    let read = job
        .read(args.offset.unwrap_or(0), limit, wait, &ctx.cancel)
        .await
        .map_err(|err| ToolResult::failure(ErrorType::IoError, err.to_string()))?;
    let mut content = String::new();
    if read.page.dropped > 0 && args.offset.unwrap_or(0) >= 0 {
        content.push_str(&format!(
            "[{} bytes before offset {} are no longer kept ([limits] process_output_bytes)]\n",
            read.page.dropped, read.page.offset
        ));
    }
    let text_start = content.len();
    content.push_str(&read.page.text);
    let more = read.end > read.page.next_offset;
    let status_line = match &read.exit {
        None if more => format!("[running; more output from offset {}]", read.page.next_offset),
        None => format!("[running; read on from offset {}]", read.page.next_offset),
        Some(_) if more => format!("[exited; more output from offset {}]", read.page.next_offset),
        Some(exit) => format!("[{}]", describe_exit(exit)),
    };
    if !content.is_empty() && !content.ends_with('\n') {
        content.push('\n');
    }
    content.push_str(&status_line);
    let mut res = ToolResult::success(content)
        .with_meta("process_id", job.id.as_str())
        .with_meta("offset", read.page.offset)
        .with_meta("next_offset", read.page.next_offset)
        .with_meta("end_offset", read.end)
        .with_meta("dropped_bytes", read.page.dropped)
        // Where the output itself lies in `content` (for clients that print it).
        .with_meta("text_start", text_start)
        .with_meta("text_bytes", read.page.text.len())
        .with_meta("running", read.exit.is_none());
    if let Some(exit) = &read.exit {
        res = with_exit(res, exit);
    }
    Ok(res)
}

async fn write(args: Value, ctx: &ToolContext) -> Result<ToolResult, ToolResult> {
    let args: WriteArgs = parse_args(args)?;
    let processes = processes(ctx)?;
    let job = find(&processes, &args.id)?;
    let close = args.close_stdin.unwrap_or(false);
    let written = tokio::select! {
        written = job.write(args.input.as_bytes(), close) => written,
        () = ctx.cancel.cancelled() => Err(format!(
            "process {} did not read its input before the deadline", job.id
        )),
    };
    written.map_err(|err| ToolResult::failure(ErrorType::IoError, err))?;
    Ok(ToolResult::success(format!(
        "[wrote {} bytes to {}{}]",
        args.input.len(),
        job.id,
        if close { " and closed its input" } else { "" }
    ))
    .with_meta("process_id", job.id.as_str())
    .with_meta("bytes", args.input.len())
    .with_meta("next_offset", job.output_bytes()))
}

fn resize(args: Value, ctx: &ToolContext) -> Result<ToolResult, ToolResult> {
    let args: ResizeArgs = parse_args(args)?;
    let processes = processes(ctx)?;
    let job = find(&processes, &args.id)?;
    job.resize(args.rows, args.cols)
        .map_err(|err| ToolResult::failure(ErrorType::InvalidArguments, err))?;
    Ok(ToolResult::success(format!("[{} resized to {}x{}]", job.id, args.rows, args.cols))
        .with_meta("process_id", job.id.as_str()))
}

async fn kill(args: Value, ctx: &ToolContext) -> Result<ToolResult, ToolResult> {
    let args: KillArgs = parse_args(args)?;
    let processes = processes(ctx)?;
    let job = find(&processes, &args.id)?;
    let signal = match args.signal.as_deref() {
        None => None,
        Some(name) => Some(parse_signal(name).ok_or_else(|| {
            ToolResult::failure(
                ErrorType::InvalidArguments,
                format!("unknown signal {name:?} (KILL, TERM, INT, HUP, QUIT, USR1, USR2, STOP, CONT, WINCH)"),
            )
        })?),
    };
    if !job.is_running() {
        let exit = job.exit();
        let mut res = ToolResult::success(format!(
            "[{} had already ended: {}]",
            job.id,
            exit.as_ref().map_or_else(String::new, describe_exit)
        ))
        .with_meta("process_id", job.id.as_str())
        .with_meta("running", false);
        if let Some(exit) = &exit {
            res = with_exit(res, exit);
        }
        return Ok(res);
    }
    match signal {
        Some(signal) if signal != rustix::process::Signal::KILL => {
            let sent = job.signal(signal);
            Ok(ToolResult::success(format!(
                "[{} {}]",
                job.id,
                if sent { "was sent the signal" } else { "is no longer running" }
            ))
            .with_meta("process_id", job.id.as_str())
            .with_meta("signaled", sent))
        }
        _ => {
            job.kill("process_kill").await;
            let exit = job.exit();
            let mut res = ToolResult::success(format!(
                "[{} and every process it started were killed]",
                job.id
            ))
            .with_meta("process_id", job.id.as_str())
            .with_meta("running", false);
            if let Some(exit) = &exit {
                res = with_exit(res, exit);
            }
            Ok(res)
        }
    }
}

fn list(ctx: &ToolContext) -> Result<ToolResult, ToolResult> {
    let processes = processes(ctx)?;
    let jobs = processes.list();
    let mut content = String::new();
    let mut entries = Vec::with_capacity(jobs.len());
    for job in &jobs {
        let exit = job.exit();
        let state = match &exit {
            None => "running".to_owned(),
            Some(exit) => describe_exit(exit),
        };
        content.push_str(&format!(
            "{}\t{}\t{}ms\t{} bytes\t{}\n",
            job.id,
            state,
            job.runtime().as_millis(),
            job.output_bytes(),
            job.command.replace(['\n', '\r'], " ")
        ));
        let mut entry = json!({
            "id": job.id,
            "command": job.command,
            "call_id": job.call_id,
            "running": exit.is_none(),
            "tty": job.has_terminal(),
            "runtime_ms": u64::try_from(job.runtime().as_millis()).unwrap_or(u64::MAX),
            "output_bytes": job.output_bytes(),
            "started_at": job.started_at
                .duration_since(std::time::UNIX_EPOCH)
                .map(|since| since.as_secs())
                .unwrap_or(0),
        });
        if let Some(pid) = job.pid().filter(|_| exit.is_none()) {
            entry["pid"] = json!(pid);
        }
        if let Some(exit) = &exit {
            match exit.status {
                Some(ExitStatus::Code(code)) => entry["exit_code"] = json!(code),
                Some(ExitStatus::Signal(signal)) => entry["signal"] = json!(signal),
                None => {}
            }
        }
        entries.push(entry);
    }
    if jobs.is_empty() {
        content.push_str("[no background processes]");
    }
    Ok(ToolResult::success(content).with_meta("processes", Value::Array(entries)))
}

/// One phrase for how a process ended.
pub fn describe_exit(exit: &Exit) -> String {
    let how = match (exit.status, &exit.error) {
        (Some(ExitStatus::Code(code)), _) => format!("exited with code {code}"),
        (Some(ExitStatus::Signal(signal)), _) => format!("killed by signal {signal}"),
        (None, Some(error)) => format!("failed: {error}"),
        (None, None) => "ended".to_owned(),
    };
    match &exit.killed {
        Some(reason) => format!("{how} (killed: {reason})"),
        None => how,
    }
}

fn with_exit(res: ToolResult, exit: &Exit) -> ToolResult {
    let res =
        res.with_meta("runtime_ms", u64::try_from(exit.runtime.as_millis()).unwrap_or(u64::MAX));
    let res = match exit.status {
        Some(ExitStatus::Code(code)) => res.with_meta("exit_code", code),
        Some(ExitStatus::Signal(signal)) => res.with_meta("signal", signal),
        None => res,
    };
    match &exit.killed {
        Some(reason) => res.with_meta("killed", reason.as_str()),
        None => res,
    }
}
