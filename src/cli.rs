//! A human's client on the daemon's socket (`toolgate list|call|status|explain`),
//! `toolgate check-config` and `toolgate doctor` (an MCP host's settings, [`hosts`]). It is the native API's typed client
//! ([`crate::rpc::api::NativeApiClient`]) over the Unix socket's NDJSON, the same
//! protocol as an editor plugin.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Serialize;
use serde_json::{Value, json};

use crate::agent::{ApprovalDecision, ApprovalScope, Event};
use crate::permission::display;
use crate::protocol::{
    EventsSubscribeParams, PermissionRespondParams, SessionOpenParams, ToolsCallParams,
    ToolsExplainParams, ToolsListParams,
};
use crate::rpc::api::{self, NativeApiClient, NoParams};
use crate::tools::OutputStream;

pub mod hosts;
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

impl From<jsonrpsee::core::client::Error> for ClientError {
    fn from(err: jsonrpsee::core::client::Error) -> ClientError {
        use jsonrpsee::core::client::Error;
        match err {
            Error::Call(error) => ClientError::Rpc(error.message().to_owned()),
            Error::RestartNeeded(_) | Error::ServiceDisconnect => ClientError::Closed,
            other => ClientError::Rpc(other.to_string()),
        }
    }
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

/// The native API's typed client on the daemon's socket.
pub struct Client {
    rpc: jsonrpsee::core::client::Client,
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
        Ok(Client { rpc: api::unix_client(stream) })
    }

    /// The typed client, for every method of the native API.
    pub fn api(&self) -> &impl NativeApiClient {
        &self.rpc
    }

    /// The id of the session a command uses: the named one (opened, or found again
    /// when an earlier command left it), else the connection's default session.
    pub async fn session(&self, name: Option<&str>) -> Result<Option<String>, ClientError> {
        let Some(name) = name.filter(|name| !name.is_empty()) else {
            return Ok(None);
        };
        let params = SessionOpenParams { name: Some(name.to_owned()), ..Default::default() };
        let info = self.rpc.session_open(params).await?;
        Ok(Some(info.session_id))
    }
}

/// A typed answer as the JSON the renderers and `--json` print.
fn json_of<T: Serialize>(value: &T) -> Result<Value, ClientError> {
    serde_json::to_value(value).map_err(|err| ClientError::Rpc(format!("unreadable answer: {err}")))
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

pub async fn list(socket: Option<PathBuf>, output: Output) -> anyhow::Result<ExitCode> {
    let client = Client::connect(socket).await?;
    let result =
        client.api().tools_list(ToolsListParams::default()).await.map_err(ClientError::from)?;
    let result = json_of(&result)?;
    match output {
        Output::Json => print_json(&result)?,
        Output::Human { color } => {
            let width = terminal_width();
            print_text(&render::list(&visible(&result), width, render::Style { color }))?
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The width to fit text for a person into: the terminal's, else `COLUMNS`, else 80.
fn terminal_width() -> usize {
    let terminal = rustix::termios::tcgetwinsize(std::io::stdout())
        .ok()
        .map(|size| usize::from(size.ws_col))
        .filter(|&columns| columns > 0);
    terminal
        .or_else(|| std::env::var("COLUMNS").ok()?.trim().parse().ok().filter(|&n: &usize| n > 0))
        .unwrap_or(80)
}

pub async fn status(socket: Option<PathBuf>, output: Output) -> anyhow::Result<ExitCode> {
    let client = Client::connect(socket).await?;
    let result = client.api().daemon_status(NoParams {}).await.map_err(ClientError::from)?;
    let result = json_of(&result)?;
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
    let client = Client::connect(socket).await?;
    let session_id = client.session(session).await?;
    let params = ToolsExplainParams { name: name.to_owned(), arguments, session_id };
    let result = client.api().tools_explain(params).await.map_err(ClientError::from)?;
    let result = json_of(&result)?;
    // What a call of it would get: an unknown tool's call fails (exit status 1).
    let known = result["decision"] != "unknown_tool";
    match output {
        Output::Json => print_json(&result)?,
        Output::Human { color } => {
            print_text(&render::explain(name, &visible(&result), render::Style { color }))?
        }
    }
    Ok(if known { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Calls one tool. It subscribes to the session's events, shows live output when a
/// person reads it (on stdout and stderr as the command wrote it, all on stderr when
/// stdout carries JSON) and answers permission requests by asking the person: on
/// stdin when it is a terminal, else on the controlling terminal (`/dev/tty`, when the
/// arguments come on stdin). Without any terminal nobody can approve: a call that
/// needs approval is denied, saying why and what would allow it.
pub async fn call(
    socket: Option<PathBuf>,
    session: Option<&str>,
    name: &str,
    arguments: &str,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let arguments = read_arguments(arguments)?;
    let client = Client::connect(socket).await?;
    let api = client.api();
    let session_id = client.session(session).await?;
    // A session outlives this command only when it is named.
    let lasting = session_id.is_some();
    let mut terminal = Terminal::find();
    let params = EventsSubscribeParams { session_id: session_id.clone() };
    let mut events = Some(api.subscribe_events(params).await.map_err(ClientError::from)?);
    // A call id of its own, so that events of other calls in a shared session are
    // told apart.
    let call_id = format!("cli-{}", std::process::id());
    let params = ToolsCallParams {
        name: name.to_owned(),
        arguments,
        session_id,
        call_id: Some(call_id.clone()),
    };
    let call = api.tools_call(params);
    tokio::pin!(call);
    let mut streamed = false;
    let result = loop {
        let event = tokio::select! {
            result = &mut call => break result.map_err(ClientError::from)?,
            event = next_event(&mut events) => event,
        };
        let Some(event) = event else {
            // The subscription ended (the daemon stopped sending): the answer remains.
            events = None;
            continue;
        };
        if event.call_id().is_some_and(|other| other != call_id) {
            continue;
        }
        match event {
            Event::ToolOutput { stream, text, .. } if terminal.is_some() => {
                // A command's output must not be able to redraw the terminal (and so
                // fake the next question).
                let text = display::visible_lines(&text);
                streamed = true;
                if output != Output::Json && stream == OutputStream::Stdout {
                    print_text(&text)?;
                } else {
                    write!(std::io::stderr(), "{text}")?;
                }
            }
            Event::PermissionRequest {
                request_id,
                ref tool,
                ref arguments,
                ref explanation,
                ref suggestions,
                ref session_grant,
                ..
            } => {
                let question = display::Question {
                    tool,
                    arguments,
                    reason: &explanation.reason,
                    suggestions,
                    // "Always this session" only where the session outlives the command.
                    session_grant: session_grant.as_deref().filter(|_| lasting),
                };
                let (decision, scope, reason) = match terminal.as_mut() {
                    Some(terminal) => {
                        let (decision, scope) = terminal.ask(&question, lasting)?;
                        (decision, scope, None)
                    }
                    None => {
                        (ApprovalDecision::Deny, ApprovalScope::Once, Some(no_terminal(&question)))
                    }
                };
                // The call's answer and its events keep arriving meanwhile; the
                // subscription holds them until they are read.
                let params = PermissionRespondParams { request_id, decision, scope, reason };
                api.permission_respond(params).await.map_err(ClientError::from)?;
            }
            _ => {}
        }
    };
    let ok = result.ok;
    let result = json_of(&result)?;
    match output {
        Output::Json => print_json(&result)?,
        Output::Human { color } => {
            let rendered =
                render::call_result(&visible(&result), streamed, render::Style { color });
            print_text(&rendered.stdout)?;
            write!(std::io::stderr(), "{}", rendered.stderr)?;
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Why a call that needs approval is denied when no terminal is there to ask on, and
/// what would let it run.
fn no_terminal(question: &display::Question<'_>) -> String {
    let rule = match question.suggestions.first() {
        Some(rule) => format!("an allow rule such as {}", display::inline(rule)),
        None => format!("an allow rule for {}", display::inline(question.tool)),
    };
    format!(
        "{} requires approval ({}), and there is no terminal to ask on: stdin is not a \
         terminal and the command has no controlling terminal; to allow it without \
         asking, add {rule} to [permissions] allow, or run the daemon in a permission \
         mode that allows it ([permissions] mode)",
        display::inline(question.tool),
        display::inline(question.reason),
    )
}

/// Where a person answers approval questions: stdin when it is a terminal, else the
/// controlling terminal.
enum Terminal {
    Stdin,
    Controlling(std::io::BufReader<std::fs::File>),
}

impl Terminal {
    fn find() -> Option<Terminal> {
        if std::io::stdin().is_terminal() {
            return Some(Terminal::Stdin);
        }
        let tty = std::fs::OpenOptions::new().read(true).write(true).open("/dev/tty").ok()?;
        Some(Terminal::Controlling(std::io::BufReader::new(tty)))
    }

    /// Shows a permission request (rendered as every face renders it: the whole
    /// command, folded, every hidden character visible) and reads the person's answer.
    /// `lasting`: the session outlives this command, so "always this session" may be
    /// offered.
    fn ask(
        &mut self,
        question: &display::Question<'_>,
        lasting: bool,
    ) -> Result<(ApprovalDecision, ApprovalScope), ClientError> {
        let mut text = format!("\n{}\n", display::question(question));
        if !lasting {
            text.push_str(
                "(this command's session ends with it; --session NAME keeps one, and its \
                 grants, between commands)\n",
            );
        }
        let session = question.session_grant.is_some();
        if session {
            text.push_str("Allow? [y]es once / [a]lways this session / [N]o: ");
        } else {
            text.push_str("Allow? [y]es once / [N]o: ");
        }
        let mut answer = String::new();
        match self {
            Terminal::Stdin => {
                let mut stderr = std::io::stderr();
                stderr.write_all(text.as_bytes())?;
                stderr.flush()?;
                std::io::stdin().lock().read_line(&mut answer)?;
            }
            Terminal::Controlling(tty) => {
                let file = tty.get_mut();
                file.write_all(text.as_bytes())?;
                file.flush()?;
                tty.read_line(&mut answer)?;
            }
        }
        Ok(match answer.trim().to_ascii_lowercase().as_str() {
            "y" | "yes" => (ApprovalDecision::Allow, ApprovalScope::Once),
            "a" | "always" if session => (ApprovalDecision::Allow, ApprovalScope::Session),
            _ => (ApprovalDecision::Deny, ApprovalScope::Once),
        })
    }
}

/// The next event of a subscription, skipping events this client cannot read (a newer
/// daemon's); `None` when it ended, and never when there is none.
async fn next_event(
    events: &mut Option<jsonrpsee::core::client::Subscription<Event>>,
) -> Option<Event> {
    let Some(subscription) = events else {
        return std::future::pending().await;
    };
    loop {
        match subscription.next().await? {
            Ok(event) => return Some(event),
            Err(err) => tracing::debug!(%err, "an event this client does not know"),
        }
    }
}

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
    let client = Client::connect(socket).await?;
    let session_id = client.session(session).await?;
    let mut offset = offset;
    loop {
        let params = ToolsCallParams {
            name: "process_read".to_owned(),
            arguments: json!({"id": id, "offset": offset, "wait_ms": FOLLOW_WAIT_MS, "limit": 65536}),
            session_id: session_id.clone(),
            call_id: Some(format!("cli-follow-{}", std::process::id())),
        };
        let result = client.api().tools_call(params).await.map_err(ClientError::from)?;
        let result = json_of(&result)?;
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

/// Loads every configuration layer, makes every check `serve` makes before it starts
/// ([`crate::server::preflight`]), and prints the effective result.
pub fn check_config(explicit: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    match crate::server::load_config(explicit)
        .and_then(|(config, options)| crate::server::preflight(&config, &options).map(|_| config))
    {
        Ok(config) => {
            for warning in &config.warnings {
                eprintln!("toolgate: warning: {warning}");
            }
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
            let protections =
                crate::permission::protections_in_force(&config.permissions.unprotect);
            if protections.is_empty() {
                outln!("# built-in protections in force: none ([permissions] unprotect)")?;
            } else {
                outln!(
                    "# built-in protections in force ([permissions] unprotect = [\"<name>\"] \
                     turns one off):"
                )?;
                for protection in protections {
                    outln!(
                        "#   {}: {} ({})",
                        protection.name,
                        protection.rules.join(", "),
                        protection.why
                    )?;
                }
            }
            write!(std::io::stdout(), "{}", config.to_toml_string()?)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            eprintln!("toolgate: {err}");
            Ok(ExitCode::from(2))
        }
    }
}

/// `toolgate doctor --host`: one line per finding about the host's settings files, then
/// the verdict; exit status 0 when the host is locked down, 1 when not. With
/// `print_config`, the settings that lock it down instead.
pub fn doctor(
    host: hosts::Host,
    project: Option<PathBuf>,
    print_config: bool,
) -> anyhow::Result<ExitCode> {
    if print_config {
        print_text(&hosts::lockdown_config(host))?;
        return Ok(ExitCode::SUCCESS);
    }
    let places = hosts::Places::of_this_process(project)?;
    let report = hosts::check(host, &places);
    print_text(&report.render(host))?;
    Ok(if report.locked_down() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
