//! A human's client on the daemon's socket (`toolgate list|call|status|explain`) and
//! `toolgate check-config`. It speaks the same NDJSON protocol as an editor plugin.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::permission::display;
use crate::protocol::method;

mod render;
mod socket;
pub use render::Output;
pub use socket::{connect_first, socket_candidates};

/// Why a client command failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{}", connect_message(path, error))]
    Connect { path: PathBuf, error: std::io::Error },
    #[error("the daemon closed the connection")]
    Closed,
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("the daemon answered with an error: {0}")]
    Rpc(String),
    #[error("invalid JSON arguments: {0}")]
    Arguments(serde_json::Error),
    #[error(transparent)]
    Config(#[from] crate::server::ServeError),
}

/// Says once why the daemon cannot be reached and, when none is running, how to start
/// one.
fn connect_message(path: &std::path::Path, error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => format!(
            "no toolgate daemon is listening on {} ({error}); start one with \
             `toolgate serve`, or as a service with \
             `systemctl --user enable --now toolgate.socket`",
            path.display()
        ),
        _ => format!("cannot connect to {}: {error}", path.display()),
    }
}

/// Writes to stdout like `println!`, but hands a failure back (a closed pipe,
/// `toolgate list | head -1`) instead of panicking; `main` ends quietly on it.
macro_rules! outln {
    ($($arg:tt)*) => { writeln!(std::io::stdout(), $($arg)*) };
}

/// A minimal NDJSON JSON-RPC client.
pub struct Client {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    next_id: u64,
}

impl Client {
    /// Connects to `socket`, or else to the configured socket, or else, when nothing
    /// listens there, to the system service's socket.
    pub async fn connect(socket: Option<PathBuf>) -> Result<Client, ClientError> {
        let candidates = match socket {
            Some(path) => vec![path],
            None => socket_candidates(default_socket()?, Path::new(SYSTEM_SOCKET)),
        };
        let stream = connect_first(candidates).await?;
        let (read, write) = stream.into_split();
        Ok(Client { reader: BufReader::new(read), writer: write, next_id: 1 })
    }

    /// The id of the session a command uses: the named one (opened, or found again
    /// when an earlier command left it), else the connection's default session.
    pub async fn session(&mut self, name: Option<&str>) -> Result<Option<String>, ClientError> {
        let Some(name) = name.filter(|name| !name.is_empty()) else {
            return Ok(None);
        };
        let info = self.request(method::SESSION_OPEN, json!({"name": name})).await?;
        match info["session_id"].as_str() {
            Some(id) => Ok(Some(id.to_owned())),
            None => Err(ClientError::Rpc("session/open answered without a session id".into())),
        }
    }

    /// Sends a request and returns its id.
    pub async fn send(&mut self, method: &str, params: Value) -> Result<u64, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let line =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        self.writer.write_all(line.as_bytes()).await?;
        self.writer.write_all(b"\n").await?;
        Ok(id)
    }

    /// The next message from the daemon.
    pub async fn next_message(&mut self) -> Result<Value, ClientError> {
        let mut line = String::new();
        if self.reader.read_line(&mut line).await? == 0 {
            return Err(ClientError::Closed);
        }
        serde_json::from_str(&line)
            .map_err(|err| ClientError::Rpc(format!("unreadable message: {err}")))
    }

    /// Sends a request and waits for its response, ignoring notifications.
    pub async fn request(&mut self, method: &str, params: Value) -> Result<Value, ClientError> {
        let id = self.send(method, params).await?;
        loop {
            let message = self.next_message().await?;
            if message.get("id") == Some(&json!(id)) {
                return result_of(message);
            }
        }
    }
}

fn result_of(message: Value) -> Result<Value, ClientError> {
    if let Some(error) = message.get("error") {
        return Err(ClientError::Rpc(
            error.get("message").and_then(Value::as_str).unwrap_or("unknown error").to_owned(),
        ));
    }
    Ok(message.get("result").cloned().unwrap_or(Value::Null))
}

/// The system service's socket (systemd/toolgate.socket).
pub const SYSTEM_SOCKET: &str = "/run/toolgate/toolgate.sock";

/// The socket the daemon listens on by default (the configured one).
fn default_socket() -> Result<PathBuf, ClientError> {
    let (config, _) = crate::server::load_config(None)?;
    Ok(config.server.socket)
}

/// The arguments of `call` and `explain`: JSON text, or `-` to read it from stdin.
fn read_arguments(text: &str) -> Result<Value, ClientError> {
    if text == "-" {
        let mut input = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut input)?;
        return parse_arguments(&input);
    }
    parse_arguments(text)
}

fn parse_arguments(text: &str) -> Result<Value, ClientError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_str(text).map_err(ClientError::Arguments)
}

fn print_json(value: &Value) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut stdout, value)?;
    writeln!(stdout)?;
    stdout.flush()
}

fn print_text(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()
}

/// `value` with every hidden character of its strings made visible: what the daemon
/// sends (file contents, command output, reasons) is shown to a person only this way,
/// so it can never redraw the terminal; the renderer's own colours come after.
fn visible(value: &Value) -> Value {
    match value {
        Value::String(text) => Value::String(display::visible_lines(text)),
        Value::Array(items) => Value::Array(items.iter().map(visible).collect()),
        Value::Object(fields) => {
            Value::Object(fields.iter().map(|(key, field)| (key.clone(), visible(field))).collect())
        }
        other => other.clone(),
    }
}

fn with_session(mut params: Value, session: Option<&str>) -> Value {
    if let Some(id) = session {
        params["session_id"] = json!(id);
    }
    params
}

pub async fn list(socket: Option<PathBuf>, output: Output) -> anyhow::Result<ExitCode> {
    let mut client = Client::connect(socket).await?;
    let result = client.request(method::TOOLS_LIST, json!({})).await?;
    match output {
        Output::Json => print_json(&result)?,
        Output::Human { color } => {
            print_text(&render::list(&visible(&result), render::Style { color }))?
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn status(socket: Option<PathBuf>, output: Output) -> anyhow::Result<ExitCode> {
    let mut client = Client::connect(socket).await?;
    let result = client.request(method::DAEMON_STATUS, json!({})).await?;
    match output {
        Output::Json => print_json(&result)?,
        Output::Human { color } => {
            print_text(&render::status(&visible(&result), render::Style { color }))?
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn explain(
    socket: Option<PathBuf>,
    session: Option<&str>,
    name: &str,
    arguments: &str,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let arguments = read_arguments(arguments)?;
    let mut client = Client::connect(socket).await?;
    let session = client.session(session).await?;
    let params = with_session(json!({"name": name, "arguments": arguments}), session.as_deref());
    let result = client.request(method::TOOLS_EXPLAIN, params).await?;
    match output {
        Output::Json => print_json(&result)?,
        Output::Human { color } => {
            print_text(&render::explain(name, &visible(&result), render::Style { color }))?
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Calls one tool. On a terminal it subscribes to the session's events, shows live
/// output (on stdout and stderr as the command wrote it for a person, all on stderr
/// when stdout carries JSON) and answers permission requests by asking the person;
/// elsewhere nobody can approve and calls that need approval are denied.
pub async fn call(
    socket: Option<PathBuf>,
    session: Option<&str>,
    name: &str,
    arguments: &str,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let arguments = read_arguments(arguments)?;
    let mut client = Client::connect(socket).await?;
    let session = client.session(session).await?;
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        client
            .request(method::EVENTS_SUBSCRIBE, with_session(json!({}), session.as_deref()))
            .await?;
    }
    // A call id of its own, so that events of other calls in a shared session are
    // told apart.
    let call_id = format!("cli-{}", std::process::id());
    let params = with_session(
        json!({"name": name, "arguments": arguments, "call_id": call_id}),
        session.as_deref(),
    );
    let id = client.send(method::TOOLS_CALL, params).await?;
    let mut streamed = false;
    let result = loop {
        let message = client.next_message().await?;
        if message.get("id") == Some(&json!(id)) {
            break result_of(message)?;
        }
        if message.get("method").and_then(Value::as_str) != Some(method::EVENTS) {
            continue;
        }
        let event = &message["params"]["result"];
        if event["call_id"].as_str().is_some_and(|other| other != call_id) {
            continue;
        }
        match event["type"].as_str() {
            Some("tool_output") => {
                // A command's output must not be able to redraw the terminal (and so
                // fake the next question).
                let text = display::visible_lines(event["text"].as_str().unwrap_or(""));
                streamed = true;
                if output != Output::Json && event["stream"].as_str() == Some("stdout") {
                    print_text(&text)?;
                } else {
                    write!(std::io::stderr(), "{text}")?;
                }
            }
            Some("permission_request") => {
                let (decision, scope) = ask_on_terminal(event)?;
                // Not waited for: output that arrives before its answer is shown, and
                // the answer itself is passed over like any other message.
                client
                    .send(
                        method::PERMISSION_RESPOND,
                        json!({"request_id": event["request_id"], "decision": decision, "scope": scope}),
                    )
                    .await?;
            }
            _ => {}
        }
    };
    match output {
        Output::Json => print_json(&result)?,
        Output::Human { color } => {
            let rendered =
                render::call_result(&visible(&result), streamed, render::Style { color });
            print_text(&rendered.stdout)?;
            write!(std::io::stderr(), "{}", rendered.stderr)?;
        }
    }
    Ok(if result["ok"].as_bool() == Some(true) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Shows a permission request (rendered as every face renders it: the whole command,
/// folded, every hidden character visible) and reads the person's answer.
/// How long one `process_read` of `follow` waits for new output.
const FOLLOW_WAIT_MS: u64 = 30_000;

/// `toolgate process follow`: prints a background process's output as it arrives
/// (reading on by offset, so nothing is printed twice or lost), until it has ended
/// and everything it wrote was printed. Exits with the process's code.
pub async fn follow(
    socket: Option<PathBuf>,
    session: Option<&str>,
    id: &str,
    offset: i64,
) -> anyhow::Result<ExitCode> {
    if session.is_none_or(str::is_empty) {
        anyhow::bail!(
            "a process belongs to the session that started it: name that session with \
             --session NAME (or TOOLGATE_SESSION) here and in the `toolgate call` that \
             started it"
        );
    }
    let mut client = Client::connect(socket).await?;
    let session = client.session(session).await?;
    let mut offset = offset;
    loop {
        let params = with_session(
            json!({
                "name": "process_read",
                "arguments": {"id": id, "offset": offset, "wait_ms": FOLLOW_WAIT_MS, "limit": 65536},
                "call_id": format!("cli-follow-{}", std::process::id()),
            }),
            session.as_deref(),
        );
        let result = client.request(method::TOOLS_CALL, params).await?;
        if result["ok"].as_bool() != Some(true) {
            let error = result["error"].as_str().unwrap_or("process_read failed");
            anyhow::bail!("{}", display::visible_lines(error));
        }
        let meta = &result["metadata"];
        let content = result["content"].as_str().unwrap_or("");
        let start = meta["text_start"].as_u64().unwrap_or(0) as usize;
        let len = meta["text_bytes"].as_u64().unwrap_or(0) as usize;
        if let Some(dropped) =
            meta["dropped_bytes"].as_u64().filter(|bytes| *bytes > 0 && offset >= 0)
        {
            writeln!(
                std::io::stderr(),
                "toolgate: {dropped} bytes of earlier output are no longer kept"
            )?;
        }
        if let Some(text) = content.get(start..start + len) {
            print_text(&display::visible_lines(text))?;
        }
        let next = meta["next_offset"].as_i64().unwrap_or(offset);
        let end = meta["end_offset"].as_i64().unwrap_or(next);
        offset = next;
        if meta["running"].as_bool() == Some(false) && next >= end {
            let code = meta["exit_code"].as_i64();
            if let Some(reason) = meta["killed"].as_str() {
                writeln!(std::io::stderr(), "toolgate: {id} was killed ({reason})")?;
            }
            return Ok(match code {
                Some(0) => ExitCode::SUCCESS,
                Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
                None => ExitCode::FAILURE,
            });
        }
    }
}

fn ask_on_terminal(event: &Value) -> Result<(&'static str, &'static str), ClientError> {
    let suggestions: Vec<String> = event["suggestions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|rule| rule.as_str().map(str::to_owned))
        .collect();
    let session_grant = event["session_grant"].as_str();
    let text = display::question(&display::Question {
        tool: event["tool"].as_str().unwrap_or("?"),
        arguments: &event["arguments"],
        reason: event["explanation"]["reason"].as_str().unwrap_or(""),
        suggestions: &suggestions,
        session_grant,
    });
    let mut stderr = std::io::stderr();
    writeln!(stderr, "\n{text}")?;
    if session_grant.is_some() {
        write!(stderr, "Allow? [y]es once / [a]lways this session / [N]o: ")?;
    } else {
        write!(stderr, "Allow? [y]es once / [N]o: ")?;
    }
    stderr.flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => ("allow", "once"),
        "a" | "always" if session_grant.is_some() => ("allow", "session"),
        _ => ("deny", "once"),
    })
}

/// Loads every configuration layer, makes every check `serve` makes before it starts
/// ([`crate::server::preflight`]), and prints the effective result.
pub fn check_config(explicit: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    match crate::server::load_config(explicit)
        .and_then(|(config, options)| crate::server::preflight(&config, &options).map(|_| config))
    {
        Ok(config) => {
            let sources: Vec<String> =
                config.sources.iter().map(|path| path.display().to_string()).collect();
            outln!(
                "# configuration is valid; files read: {}",
                if sources.is_empty() {
                    "none (embedded defaults)".to_owned()
                } else {
                    sources.join(", ")
                }
            )?;
            write!(std::io::stdout(), "{}", config.to_toml_string()?)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            eprintln!("toolgate: {err}");
            Ok(ExitCode::from(2))
        }
    }
}
