//! One live connection to an upstream server, and the state its proxied tools share
//! with its supervisor.
//!
//! A stdio server is a child process of ours in its own process group: its stdin and
//! stdout carry the protocol, its stderr goes line by line to the daemon log. Closing
//! the connection closes its stdin (MCP's stdio shutdown), then escalates to SIGTERM
//! and SIGKILL of the whole group; dropping it kills the group at once. A Streamable
//! HTTP server is reached with rmcp's client transport (plain `http://`; this build
//! links no TLS stack).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use rmcp::model::{
    ClientCapabilities, ClientConfig, ClientRequest, Implementation, PaginatedRequestParams,
    PingRequest, ProgressNotificationParam, ProgressToken, ProtocolVersion, ServerResult,
    Tool as McpTool,
};
use rmcp::model::{JsonRpcMessage, JsonRpcNotification, ServerNotification};
use rmcp::service::{NotificationContext, Peer, RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, Transport};
use rmcp::{ClientHandler, ServiceExt};
use tokio::process::{Child, Command};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::codec::{FramedRead, LinesCodec};
use tokio_util::sync::CancellationToken;

use super::{UpstreamState, UpstreamStatus};
use crate::config::{McpServerConfig, McpTransport};
use crate::tools::{EnvPolicy, OutputSink, OutputStream};

/// Longest stderr line of an upstream logged as it is; longer lines are cut (a server
/// dumping a binary blob must not flood the log or grow our memory).
const MAX_STDERR_LINE: usize = 8 * 1024;

/// How much of a server's tool list is accepted (see [`Connection::list_tools`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ListLimits {
    pub(crate) max_pages: usize,
    pub(crate) max_tools: usize,
    /// Bytes of tool definitions (names, descriptions and schemas as JSON).
    pub(crate) max_bytes: usize,
}

/// The length of a value's JSON encoding, without building it.
fn json_size(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(bytes.len());
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

/// The state of one configured server that its proxied tools and its supervisor share.
pub(crate) struct Link {
    name: String,
    /// The live connection, while the server is ready. Calls take a clone of the peer;
    /// `None` makes every proxied tool answer `upstream_error` at once.
    live: RwLock<Option<Live>>,
    /// Where the progress of each running call goes.
    progress: Mutex<Progress>,
    /// Set by the server's `notifications/tools/list_changed` (a permit is kept, so a
    /// notification arriving while the supervisor is busy is not lost).
    tools_changed: Notify,
    status: Mutex<UpstreamStatus>,
}

/// A ready connection as the proxied tools see it.
#[derive(Clone)]
pub(crate) struct Live {
    pub(crate) peer: Peer<RoleClient>,
    /// Canceled when the connection is given up, so that calls in flight end at once
    /// with `upstream_error` instead of waiting for their deadline.
    pub(crate) gone: CancellationToken,
}

impl Link {
    pub(crate) fn new(name: &str) -> Arc<Link> {
        Arc::new(Link {
            name: name.to_owned(),
            live: RwLock::new(None),
            progress: Mutex::new(Progress::default()),
            tools_changed: Notify::new(),
            status: Mutex::new(UpstreamStatus {
                name: name.to_owned(),
                state: UpstreamState::Starting,
                reason: None,
                restarts: 0,
                tools: 0,
            }),
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn live(&self) -> Option<Live> {
        self.live.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    pub(crate) fn go_live(&self, peer: Peer<RoleClient>) {
        let mut live = self.live.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if live.is_none() {
            *live = Some(Live { peer, gone: CancellationToken::new() });
        }
    }

    /// The connection is no longer usable: calls in flight end, new calls fail fast.
    pub(crate) fn go_down(&self) {
        let previous = self.live.write().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(live) = previous {
            live.gone.cancel();
        }
    }

    pub(crate) fn status(&self) -> UpstreamStatus {
        self.status_lock().clone()
    }

    pub(crate) fn set_state(&self, state: UpstreamState, reason: Option<String>) {
        let mut status = self.status_lock();
        status.state = state;
        // A restart keeps the last failure visible until the server is ready again.
        if reason.is_some() || state != UpstreamState::Starting {
            status.reason = reason;
        }
    }

    pub(crate) fn count_restart(&self) {
        let mut status = self.status_lock();
        status.restarts = status.restarts.saturating_add(1);
    }

    /// Changes the Registry and this server's status as one step: `change` runs with
    /// the status locked and returns the new status fields, so a reader that saw the
    /// Registry change and then asks for the status sees the status of that change
    /// (and one that saw the status first finds the Registry already changed). The
    /// Registry never locks a status, so the lock order is always status → Registry.
    pub(crate) fn publish<R>(&self, change: impl FnOnce(&mut UpstreamStatus) -> R) -> R {
        let mut status = self.status_lock();
        change(&mut status)
    }

    pub(crate) async fn tools_changed(&self) {
        self.tools_changed.notified().await;
    }

    /// Routes the progress of one call to its output sink until the guard drops. The
    /// call is sent before its token is known here, so a quick server's first
    /// progress can come first: what came for the token is delivered now, in order.
    pub(crate) fn route_progress(
        self: &Arc<Link>,
        token: ProgressToken,
        sink: OutputSink,
    ) -> ProgressRoute {
        let mut progress = self.progress_lock();
        progress.early.retain(|(for_token, text)| {
            let ours = *for_token == token;
            if ours {
                sink.emit(OutputStream::Stdout, text);
            }
            !ours
        });
        progress.routes.insert(token.clone(), sink);
        ProgressRoute { link: self.clone(), token }
    }

    /// Delivers one progress notification to its call, or keeps it for a call about
    /// to route it. Delivered under the lock, so that what was kept goes first.
    fn progress(&self, params: &ProgressNotificationParam) {
        let mut text = match (&params.message, params.total) {
            (Some(message), _) => message.clone(),
            (None, Some(total)) => format!("progress {} of {}", params.progress, total),
            (None, None) => format!("progress {}", params.progress),
        };
        if !text.ends_with('\n') {
            text.push('\n');
        }
        let mut progress = self.progress_lock();
        match progress.routes.get(&params.progress_token) {
            Some(sink) => sink.emit(OutputStream::Stdout, &text),
            None => {
                if progress.early.len() == EARLY_PROGRESS_KEPT {
                    progress.early.pop_front();
                }
                progress.early.push_back((params.progress_token.clone(), text));
            }
        }
    }

    fn status_lock(&self) -> std::sync::MutexGuard<'_, UpstreamStatus> {
        self.status.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn progress_lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The progress routes of running calls, by the progress token sent with each, and
/// the last notifications that came for no route (yet).
#[derive(Default)]
struct Progress {
    routes: HashMap<ProgressToken, OutputSink>,
    early: VecDeque<(ProgressToken, String)>,
}

/// How many notifications for no route are kept: enough for the first lines of the
/// calls being sent at one moment; a stray token's are let go first.
const EARLY_PROGRESS_KEPT: usize = 32;

/// Removes a call's progress route when the call ends, however it ends.
pub(crate) struct ProgressRoute {
    link: Arc<Link>,
    token: ProgressToken,
}

impl Drop for ProgressRoute {
    fn drop(&mut self) {
        self.link.progress_lock().routes.remove(&self.token);
    }
}

/// What the server can send us outside of answers: progress and changed tools.
struct Handler {
    link: Arc<Link>,
}

impl ClientHandler for Handler {
    // Progress is delivered by `ProgressTap`, in the order the messages arrive.

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.link.tools_changed.notify_one();
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("toolgate", env!("CARGO_PKG_VERSION")),
        )
        // The `initialize` handshake is the one every server generation answers.
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }
}

/// Hands the server's progress notifications to their calls as the transport reads
/// them. rmcp runs each notification's handler as a task of its own, so a handler
/// could run after the answer that followed it and find its call gone, losing the
/// last lines of live output; here a notification is delivered before the next
/// message (the answer among them) is even read.
struct ProgressTap<T> {
    inner: T,
    link: Arc<Link>,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for ProgressTap<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let message = self.inner.receive().await?;
        if let JsonRpcMessage::Notification(JsonRpcNotification {
            notification: ServerNotification::ProgressNotification(progress),
            ..
        }) = &message
        {
            self.link.progress(&progress.params);
        }
        Some(message)
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// One initialized connection to a server.
pub(crate) struct Connection {
    peer: Peer<RoleClient>,
    /// Cancels the client's service loop (which closes the transport).
    service: CancellationToken,
    /// Canceled when the service loop has ended, for whatever reason.
    ended: CancellationToken,
    /// Why it ended, once it has.
    end_reason: Arc<Mutex<Option<String>>>,
    /// The service loop, awaited on close.
    task: JoinHandle<()>,
    child: Option<ChildGroup>,
}

impl Connection {
    /// Starts (stdio) or reaches (HTTP) the server and runs the `initialize`
    /// handshake.
    pub(crate) async fn open(
        config: &McpServerConfig,
        env_policy: &EnvPolicy,
        link: &Arc<Link>,
    ) -> Result<Connection, String> {
        let handler = Handler { link: link.clone() };
        let service = CancellationToken::new();
        match config.transport() {
            McpTransport::Stdio { command, args, env, cwd } => {
                let sandbox = crate::sandbox::ServerSandbox {
                    enabled: config.sandbox,
                    writable: &config.writable,
                    readable: &config.readable,
                    network: config.network,
                };
                let mut server_env = env_policy.build();
                server_env.extend(env.iter().map(|(name, value)| (name.clone(), value.clone())));
                let search_path = server_env
                    .iter()
                    .rev()
                    .find(|(name, _)| name == "PATH")
                    .map(|(_, value)| value.as_str());
                let profile =
                    crate::sandbox::server_profile(sandbox, command, args, cwd, search_path)?;
                let mut cmd = match profile {
                    Some(profile) => {
                        let launcher = crate::exec::Supervisor::current();
                        crate::sandbox::exec::command(launcher.program(), &profile, command, args)?
                    }
                    None => {
                        let mut cmd = Command::new(command);
                        cmd.args(args);
                        cmd
                    }
                };
                cmd.env_clear()
                    .envs(server_env)
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .process_group(0)
                    .kill_on_drop(true);
                if let Some(cwd) = cwd {
                    cmd.current_dir(cwd);
                }
                let mut child =
                    cmd.spawn().map_err(|err| format!("cannot start {command:?}: {err}"))?;
                let (Some(stdin), Some(stdout), Some(stderr)) =
                    (child.stdin.take(), child.stdout.take(), child.stderr.take())
                else {
                    return Err("the child's pipes are missing".to_owned());
                };
                let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) else {
                    return Err("the child exited before it could be watched".to_owned());
                };
                let group = ChildGroup {
                    child,
                    pgid: Pid::from_raw(pid),
                    stderr: Some(tokio::spawn(log_stderr(link.name().to_owned(), stderr))),
                    reaped: false,
                };
                // rmcp's line transport caps one message (16 MiB by default), so a
                // server that never sends a newline cannot grow our memory.
                let transport = ProgressTap {
                    inner: AsyncRwTransport::new_client(stdout, stdin),
                    link: link.clone(),
                };
                let running = handler
                    .serve_with_ct(transport, service.clone())
                    .await
                    .map_err(|err| format!("initialize failed: {err}"));
                match running {
                    Ok(running) => Ok(Connection::started(running, service, Some(group))),
                    Err(reason) => {
                        group.terminate(Duration::ZERO).await;
                        Err(reason)
                    }
                }
            }
            McpTransport::StreamableHttp { url, headers } => {
                if !url.starts_with("http://") {
                    return Err(format!(
                        "{url:?}: only plain http:// servers can be reached by this build"
                    ));
                }
                let mut custom = HashMap::new();
                for (name, value) in headers {
                    let header = axum::http::HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| format!("{name:?} is not a valid HTTP header name"))?;
                    let value = axum::http::HeaderValue::from_str(value)
                        .map_err(|_| format!("the value of header {name:?} is not valid"))?;
                    custom.insert(header, value);
                }
                let transport = ProgressTap {
                    inner: StreamableHttpClientTransport::from_config(
                        StreamableHttpClientTransportConfig::with_uri(url).custom_headers(custom),
                    ),
                    link: link.clone(),
                };
                let running = handler
                    .serve_with_ct(transport, service.clone())
                    .await
                    .map_err(|err| format!("initialize failed: {err}"))?;
                Ok(Connection::started(running, service, None))
            }
        }
    }

    fn started(
        running: rmcp::service::RunningService<RoleClient, Handler>,
        service: CancellationToken,
        child: Option<ChildGroup>,
    ) -> Connection {
        let peer = running.peer().clone();
        let ended = CancellationToken::new();
        let end_reason = Arc::new(Mutex::new(None));
        let (ended_signal, reason_slot) = (ended.clone(), end_reason.clone());
        let task = tokio::spawn(async move {
            let reason = match running.waiting().await {
                Ok(rmcp::service::QuitReason::Cancelled) => "the connection was closed",
                Ok(rmcp::service::QuitReason::Closed) => "the server closed the connection",
                Ok(_) => "the connection ended",
                Err(_) => "the connection failed",
            };
            *reason_slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some(reason.to_owned());
            ended_signal.cancel();
        });
        Connection { peer, service, ended, end_reason, task, child }
    }

    pub(crate) fn peer(&self) -> &Peer<RoleClient> {
        &self.peer
    }

    /// Every tool the server offers (all pages), within `limits`: a server that
    /// pages forever, or offers more tools or definition bytes than a prompt could
    /// ever use, is refused as a whole (a partial list would change meaning silently).
    pub(crate) async fn list_tools(&self, limits: &ListLimits) -> Result<Vec<McpTool>, String> {
        let mut tools = Vec::new();
        let mut bytes = 0usize;
        let mut cursor = None;
        let mut pages = 0usize;
        loop {
            if pages == limits.max_pages {
                return Err(format!(
                    "tools/list goes on for more than {} pages (the limit per server)",
                    limits.max_pages
                ));
            }
            pages += 1;
            let params = PaginatedRequestParams::default().with_cursor(cursor.take());
            let page = self
                .peer
                .list_tools(Some(params))
                .await
                .map_err(|err| format!("tools/list failed: {err}"))?;
            for tool in page.tools {
                if tools.len() == limits.max_tools {
                    return Err(format!(
                        "tools/list offers more than {} tools (the limit per server)",
                        limits.max_tools
                    ));
                }
                bytes = bytes.saturating_add(json_size(&tool));
                if bytes > limits.max_bytes {
                    return Err(format!(
                        "tools/list offers more than {} bytes of tool definitions (the limit per server)",
                        limits.max_bytes
                    ));
                }
                tools.push(tool);
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(tools),
            }
        }
    }

    pub(crate) async fn ping(&self) -> Result<(), String> {
        match self.peer.send_request(ClientRequest::PingRequest(PingRequest::default())).await {
            Ok(ServerResult::EmptyResult(_)) | Ok(_) => Ok(()),
            Err(err) => Err(format!("ping failed: {err}")),
        }
    }

    /// Resolves once the connection is gone, with why.
    pub(crate) async fn closed(&self) -> String {
        self.ended.cancelled().await;
        self.end_reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "the connection ended".to_owned())
    }

    /// Closes the connection and stops the child: stdin closed, then SIGTERM and
    /// SIGKILL of its process group, `grace` apart.
    pub(crate) async fn close(self, grace: Duration) {
        self.service.cancel();
        let _ = tokio::time::timeout(grace.max(Duration::from_millis(100)), self.task).await;
        if let Some(group) = self.child {
            group.terminate(grace).await;
        }
    }
}

/// A child process leading its own process group.
struct ChildGroup {
    child: Child,
    pgid: Pid,
    stderr: Option<JoinHandle<()>>,
    /// Set once the leader was reaped and the group killed; after that the group id
    /// may belong to someone else, so Drop must not signal it.
    reaped: bool,
}

impl ChildGroup {
    /// Waits up to `grace` for the leader to exit on its own (its stdin is closed),
    /// then SIGTERM, then SIGKILL; finally kills whatever is left of its group.
    async fn terminate(mut self, grace: Duration) {
        let mut exited =
            tokio::time::timeout(grace, self.child.wait()).await.ok().and_then(Result::ok);
        if exited.is_none() {
            let _ = killpg(self.pgid, Signal::SIGTERM);
            exited = tokio::time::timeout(grace, self.child.wait()).await.ok().and_then(Result::ok);
        }
        // Every member of the group, the leader included if it is still there: no
        // process the server started outlives it.
        let _ = killpg(self.pgid, Signal::SIGKILL);
        if exited.is_none() {
            exited = self.child.wait().await.ok();
        }
        self.reaped = true;
        if let Some(status) = exited {
            tracing::debug!(pid = self.pgid.as_raw(), %status, "MCP server process exited");
        }
        if let Some(stderr) = self.stderr.take() {
            // The pipe closes once every writer is dead; a generous bound all the same.
            let _ = tokio::time::timeout(Duration::from_secs(2), stderr).await;
        }
    }
}

impl Drop for ChildGroup {
    fn drop(&mut self) {
        if !self.reaped {
            // The leader is not reaped yet (at worst a zombie), so the group id is
            // still ours to signal.
            let _ = killpg(self.pgid, Signal::SIGKILL);
        }
        if let Some(stderr) = self.stderr.take() {
            stderr.abort();
        }
    }
}

/// Copies a server's stderr to the daemon log, one line per event.
async fn log_stderr(server: String, stderr: tokio::process::ChildStderr) {
    let mut lines = FramedRead::new(stderr, LinesCodec::new_with_max_length(MAX_STDERR_LINE));
    while let Some(line) = lines.next().await {
        match line {
            Ok(line) => tracing::info!(target: "toolgate::upstream::stderr", %server, "{line}"),
            Err(tokio_util::codec::LinesCodecError::MaxLineLengthExceeded) => {
                tracing::info!(target: "toolgate::upstream::stderr", %server, "(a line longer than {MAX_STDERR_LINE} bytes was cut)");
            }
            Err(tokio_util::codec::LinesCodecError::Io(_)) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(token: u32, message: &str) -> ProgressNotificationParam {
        let mut params = ProgressNotificationParam::new(
            ProgressToken(rmcp::model::NumberOrString::Number(i64::from(token))),
            1.0,
        );
        params.message = Some(message.to_owned());
        params
    }

    #[test]
    fn progress_that_comes_before_its_call_is_routed_is_delivered_first_and_in_order() {
        let link = Link::new("fx");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = {
            let seen = seen.clone();
            OutputSink::new(move |_, text| seen.lock().unwrap().push(text.to_owned()))
        };
        link.progress(&note(1, "step 1"));
        link.progress(&note(2, "another call's"));
        link.progress(&note(1, "step 2"));
        let route =
            link.route_progress(ProgressToken(rmcp::model::NumberOrString::Number(1)), sink);
        link.progress(&note(1, "step 3"));
        assert_eq!(*seen.lock().unwrap(), ["step 1\n", "step 2\n", "step 3\n"]);
        // The other call's stays for its own route; this one's is gone with its route.
        drop(route);
        link.progress(&note(1, "late"));
        let progress = link.progress_lock();
        assert!(progress.routes.is_empty());
        let kept: Vec<&str> = progress.early.iter().map(|(_, text)| text.as_str()).collect();
        assert_eq!(kept, ["another call's\n", "late\n"]);
    }
}
