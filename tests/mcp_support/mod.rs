//! Shared helpers for the MCP integration tests: a daemon over a temporary root
//! with two test tools, and a line-based MCP client over an in-memory duplex.

#![allow(dead_code, unreachable_pub)]
// Test helpers: a failed setup step is a failed test, reported where it happened.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::mpsc;
use toolgate::daemon::{Daemon, Settings};
use toolgate::mcp::{McpOptions, serve_stream};
use toolgate::tools::{
    Definition, ErrorType, OutputStream, Registry, Safety, Tool, ToolContext, ToolResult,
};

/// A safety net only: every wait in these tests ends on an event, never on time.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Prints lines to live output, then writes its process group id to `pid_file` once
/// every line has been handed to the call's live output (so a test that sees the file
/// knows the lines are on their way), then sleeps until canceled (which kills the
/// group).
pub struct Streamer(Definition);

impl Streamer {
    pub fn tool() -> Arc<dyn Tool> {
        Arc::new(Streamer(Definition {
            name: "stream_lines".into(),
            description: "prints numbered lines, then waits".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"lines": {"type": "integer"}, "pid_file": {"type": "string"}},
                "required": ["lines", "pid_file"],
                "additionalProperties": false
            }),
            safety: Safety::ReadOnly,
            system: false,
            timeout: None,
            facts: Default::default(),
        }))
    }
}

#[async_trait::async_trait]
impl Tool for Streamer {
    fn definition(&self) -> &Definition {
        &self.0
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let lines = args["lines"].as_u64().unwrap_or(1);
        let pid_file = ctx.env.cwd.join(args["pid_file"].as_str().unwrap_or("pid"));
        let script = format!("for i in $(seq 1 {lines}); do echo line-$i; done; exec sleep 300");
        let mut child = match tokio::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdout(std::process::Stdio::piped())
            .stdin(std::process::Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
        {
            Ok(child) => child,
            Err(err) => return ToolResult::failure(ErrorType::IoError, err.to_string()),
        };
        let pgid = child.id().unwrap_or(0) as i32;
        let Some(stdout) = child.stdout.take() else {
            return ToolResult::failure(ErrorType::IoError, "no stdout");
        };
        let mut reader = BufReader::new(stdout).lines();
        let cancel = ctx.cancel.clone();
        let write_pid = || {
            let partial = pid_file.with_extension("partial");
            std::fs::write(&partial, format!("{pgid}\n"))
                .and_then(|()| std::fs::rename(&partial, &pid_file))
        };
        let mut emitted = 0;
        if lines == 0
            && let Err(err) = write_pid()
        {
            return ToolResult::failure(ErrorType::IoError, err.to_string());
        }
        loop {
            tokio::select! {
                line = reader.next_line() => match line {
                    Ok(Some(line)) => {
                        ctx.output.emit(OutputStream::Stdout, &format!("{line}\n"));
                        emitted += 1;
                        if emitted == lines && let Err(err) = write_pid() {
                            return ToolResult::failure(ErrorType::IoError, err.to_string());
                        }
                    }
                    _ => break,
                },
                () = cancel.cancelled() => {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pgid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    let _ = child.wait().await;
                    return ToolResult::failure(ErrorType::Canceled, "canceled");
                }
            }
        }
        let _ = child.wait().await;
        ToolResult::success("done")
    }
}

/// Writes `text` to `path` under the root: a side effect, so it asks in default mode.
pub struct Touch(Definition);

impl Touch {
    pub fn tool() -> Arc<dyn Tool> {
        Arc::new(Touch(Definition {
            name: "touch_file".into(),
            description: "writes a file".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
                "additionalProperties": false
            }),
            safety: Safety::SideEffect,
            system: false,
            timeout: None,
            facts: Default::default(),
        }))
    }
}

#[async_trait::async_trait]
impl Tool for Touch {
    fn definition(&self) -> &Definition {
        &self.0
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let path = ctx.env.cwd.join(args["path"].as_str().unwrap_or("x"));
        match std::fs::write(&path, "touched") {
            Ok(()) => ToolResult::success(format!("wrote {}", path.display())),
            Err(err) => ToolResult::failure(ErrorType::IoError, err.to_string()),
        }
    }
}

/// Sleeps `ms` milliseconds, then answers "slept" (a read-only call that is still
/// running for a while); canceled, it ends at once.
pub struct Pause(Definition);

impl Pause {
    pub fn tool() -> Arc<dyn Tool> {
        Arc::new(Pause(Definition {
            name: "pause".into(),
            description: "sleeps, then answers".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"ms": {"type": "integer"}},
                "required": ["ms"],
                "additionalProperties": false
            }),
            safety: Safety::ReadOnly,
            system: false,
            timeout: None,
            facts: Default::default(),
        }))
    }
}

#[async_trait::async_trait]
impl Tool for Pause {
    fn definition(&self) -> &Definition {
        &self.0
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let pause = Duration::from_millis(args["ms"].as_u64().unwrap_or(0));
        tokio::select! {
            () = tokio::time::sleep(pause) => ToolResult::success("slept"),
            () = ctx.cancel.cancelled() => ToolResult::failure(ErrorType::Canceled, "canceled"),
        }
    }
}

pub struct TestDaemon {
    pub dir: tempfile::TempDir,
    pub daemon: Arc<Daemon>,
}

impl TestDaemon {
    pub fn new() -> TestDaemon {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = std::fs::canonicalize(dir.path()).expect("canonical root");
        let registry = Registry::with_builtins();
        registry.register(Some(Streamer::tool())).expect("register stream_lines");
        registry.register(Some(Touch::tool())).expect("register touch_file");
        registry.register(Some(Pause::tool())).expect("register pause");
        let daemon = Daemon::new(Arc::new(registry), Settings::for_roots(vec![root]), None);
        TestDaemon { dir, daemon }
    }

    pub fn root(&self) -> PathBuf {
        std::fs::canonicalize(self.dir.path()).expect("canonical root")
    }
}

/// Whether a process still runs. A zombie (killed, not yet reaped by its parent)
/// counts as dead: it executes nothing and holds nothing but its table entry.
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

pub fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A line-level MCP client over an in-memory duplex with a server task behind it.
pub struct StdioClient {
    writer: tokio::io::WriteHalf<DuplexStream>,
    incoming: mpsc::UnboundedReceiver<Value>,
    /// Messages read while waiting for something else, in arrival order.
    pub seen: Vec<Value>,
    pub server: tokio::task::JoinHandle<Result<(), toolgate::mcp::McpServeError>>,
}

impl StdioClient {
    pub fn start(daemon: &Arc<Daemon>, options: McpOptions) -> StdioClient {
        let (client_side, server_side) = tokio::io::duplex(1 << 20);
        let (server_read, server_write) = tokio::io::split(server_side);
        let server = tokio::spawn(serve_stream(daemon.clone(), options, server_read, server_write));
        let (client_read, writer) = tokio::io::split(client_side);
        let (sender, incoming) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(client_read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let value = serde_json::from_str(&line)
                    .unwrap_or_else(|err| panic!("server wrote a non-JSON line {line:?}: {err}"));
                if sender.send(value).is_err() {
                    return;
                }
            }
        });
        StdioClient { writer, incoming, seen: Vec::new(), server }
    }

    pub async fn send_raw(&mut self, line: &str) {
        self.writer.write_all(line.as_bytes()).await.expect("write");
        self.writer.write_all(b"\n").await.expect("write");
        self.writer.flush().await.expect("flush");
    }

    pub async fn send(&mut self, message: Value) {
        self.send_raw(&message.to_string()).await;
    }

    /// The next message from the server.
    pub async fn next(&mut self) -> Value {
        tokio::time::timeout(PATIENCE, self.incoming.recv())
            .await
            .expect("the server answered in time")
            .expect("the server is still connected")
    }

    /// Reads until a message matches, keeping the others in `seen`.
    pub async fn until(&mut self, matches: impl Fn(&Value) -> bool) -> Value {
        loop {
            let message = self.next().await;
            if matches(&message) {
                return message;
            }
            self.seen.push(message);
        }
    }

    /// The response to request `id`, also when it came while something else was
    /// awaited (answers may come in any order).
    pub async fn response(&mut self, id: Value) -> Value {
        let answers = |m: &Value| m.get("id") == Some(&id) && m.get("method").is_none();
        if let Some(index) = self.seen.iter().position(answers) {
            return self.seen.remove(index);
        }
        self.until(answers).await
    }

    pub async fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        self.response(json!(id)).await
    }

    /// The initialize handshake with the given client capabilities.
    pub async fn initialize(&mut self, version: &str, capabilities: Value) -> Value {
        let answer = self
            .request(
                0,
                "initialize",
                json!({
                    "protocolVersion": version,
                    "capabilities": capabilities,
                    "clientInfo": {"name": "test", "version": "1"}
                }),
            )
            .await;
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        answer
    }

    /// Ends the server's input without waiting for it to end; what it still answers
    /// can be read as before.
    pub async fn end_input(&mut self) {
        self.writer.shutdown().await.expect("shutdown");
    }

    /// Waits for the server to end by itself (after [`StdioClient::end_input`]).
    pub async fn ended(self) {
        let outcome = tokio::time::timeout(PATIENCE, self.server).await;
        assert!(matches!(outcome, Ok(Ok(Ok(())))), "the server ended cleanly: {outcome:?}");
    }

    /// Closes the client's side; the server must end by itself.
    pub async fn close(mut self) -> Vec<Value> {
        self.writer.shutdown().await.expect("shutdown");
        drop(self.writer);
        let outcome = tokio::time::timeout(PATIENCE, self.server).await;
        assert!(matches!(outcome, Ok(Ok(Ok(())))), "the server ended cleanly: {outcome:?}");
        let mut rest = self.seen;
        while let Ok(message) = self.incoming.try_recv() {
            rest.push(message);
        }
        rest
    }
}
