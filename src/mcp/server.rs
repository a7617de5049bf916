//! The MCP server handler: one instance per MCP conversation (a stdio process, a
//! Streamable HTTP session, or one stateless 2026-07-28 HTTP request), driving one
//! agent [`Session`] of the daemon.
//!
//! Protocol mechanics (framing, the initialize handshake and version negotiation,
//! `server/discover`, per-request `_meta`, cancellation of a request by
//! `notifications/cancelled` with its response suppressed) come from `rmcp`. This
//! file maps them onto the one engine: `tools/list` is the session's definitions,
//! `tools/call` is [`Session::execute_one`], live output becomes
//! `notifications/progress`, and permission questions go through
//! [`super::approval::McpBroker`].

#![allow(deprecated)] // Logging and roots are deprecated in 2026-07-28 but served to older clients.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use rmcp::ErrorData as McpError;
use rmcp::RoleServer;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ErrorCode,
    GetTaskParams, GetTaskResult, InputRequiredResult, ListToolsResult, LoggingLevel,
    NumberOrString, PaginatedRequestParams, ProgressNotificationParam, ProgressToken,
    ProtocolVersion, RequestId, ServerConfig, SetLevelRequestParams, SubscriptionFilter, Tool,
    UpdateTaskParams,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, SubscriptionContext};
use rmcp::task_manager::{TaskContext, TaskExit, TaskFuture};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::approval::{APPROVAL_INPUT_KEY, Asker, McpBroker, answer_from_json, elicitation_json};
#[cfg(feature = "conformance")]
use super::fixtures;
use super::{Face, mapping};
use crate::agent::{Event, EventSink, Session};
use crate::agent::{Preflight, Question};
use crate::daemon::{Client, SessionSpec};
use crate::tools::registry::Listing;
use crate::tools::{Call, ErrorType, ToolResult};

/// Live-output chunks queued per call before they become progress notifications;
/// past this, chunks are dropped (progress is advisory: the full output is in the
/// result) rather than stalling the tool.
const PROGRESS_QUEUE: usize = 256;
/// How long the client gets to answer `roots/list` before the configured roots are
/// used as they are.
const ROOTS_TIMEOUT: Duration = Duration::from_secs(10);

/// The handler of one MCP conversation, as served in normal use.
#[derive(Clone)]
pub struct LiveHandler {
    face: Arc<Face>,
    state: Arc<HandlerState>,
}

struct HandlerState {
    /// The conversation as a client of the daemon; dropping it closes the agent
    /// session: calls canceled, processes killed.
    client: Client,
    /// Held while the session is being opened (asking the client for its roots, until
    /// it answers, the timeout, the request's cancellation or the conversation's end).
    opening: tokio::sync::Mutex<()>,
    events: Arc<McpEvents>,
    broker: Arc<McpBroker>,
    /// The level set by `logging/setLevel`; `None` until the client sets one.
    log_level: Mutex<Option<LoggingLevel>>,
    /// Canceled when the conversation ends; stops the registry watcher.
    closed: CancellationToken,
    watching: AtomicBool,
}

impl Drop for HandlerState {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

/// The event sink of an MCP session: live output of calls that asked for progress
/// goes to their forwarders; everything else is of no use to an MCP client.
#[derive(Default)]
struct McpEvents {
    progress: DashMap<String, mpsc::Sender<String>>,
}

impl EventSink for McpEvents {
    fn emit(&self, event: Event) {
        if let Event::ToolOutput { call_id, text, .. } = event
            && let Some(sender) = self.progress.get(&*call_id)
        {
            // Never block the tool: a full queue loses a chunk of advisory progress.
            let _ = sender.try_send(text);
        }
    }
}

/// Removes a per-call registration when the call ends, however it ends.
struct Registered<'a, V> {
    map: &'a DashMap<String, V>,
    key: String,
}

impl<V> Drop for Registered<'_, V> {
    fn drop(&mut self) {
        self.map.remove(&self.key);
    }
}

fn register<'a, V>(map: &'a DashMap<String, V>, key: &str, value: V) -> Registered<'a, V> {
    map.insert(key.to_owned(), value);
    Registered { map, key: key.to_owned() }
}

/// A task's live output forwarder, registered until the task ends.
struct OutputRegistration {
    events: Arc<McpEvents>,
    key: String,
}

impl OutputRegistration {
    fn new(events: &Arc<McpEvents>, key: &str, sender: mpsc::Sender<String>) -> OutputRegistration {
        events.progress.insert(key.to_owned(), sender);
        OutputRegistration { events: events.clone(), key: key.to_owned() }
    }
}

impl Drop for OutputRegistration {
    fn drop(&mut self) {
        self.events.progress.remove(&self.key);
    }
}

/// The longest status message a task's output becomes.
const STATUS_MESSAGE_CHARS: usize = 200;

/// The last non-empty line of a chunk of output, shortened for a status message.
fn last_line(text: &str) -> Option<String> {
    let line = text.lines().rev().map(str::trim).find(|line| !line.is_empty())?;
    Some(line.chars().take(STATUS_MESSAGE_CHARS).collect())
}

/// How a call's questions reach the client, registered for the call's whole life
/// (which may outlast its request when the call becomes a task).
struct AskerRegistration {
    broker: Arc<McpBroker>,
    key: Arc<str>,
}

impl AskerRegistration {
    fn new(broker: &Arc<McpBroker>, key: &Arc<str>, asker: Asker) -> AskerRegistration {
        broker.askers.insert(key.clone(), asker);
        AskerRegistration { broker: broker.clone(), key: key.clone() }
    }
}

impl Drop for AskerRegistration {
    fn drop(&mut self) {
        self.broker.askers.remove(&self.key);
    }
}

/// What a call runs with besides itself: how its questions reach the client, and
/// how long it may run before it is answered with a task.
struct HowToRun {
    asker: AskerRegistration,
    task_after: Duration,
}

/// A call's execution from its decision on, started with the token that cancels it
/// and owning all it needs, so that it can go on as a task after its request ended.
pub(crate) type Execution =
    std::pin::Pin<Box<dyn std::future::Future<Output = Arc<ToolResult>> + Send>>;

/// A call's answer as the handler gives it, before it takes rmcp's types: nearly
/// every call ends with its result sent as it is, which the stdio face writes
/// straight from the result (`stdio::direct`); a long result sent as a link, a task
/// and a question are rmcp's responses.
pub(crate) enum Answer {
    /// The tool's result, sent as [`mapping::call_result`] makes it.
    Plain(Arc<ToolResult>),
    Response(CallToolResponse),
}

impl Answer {
    pub(crate) fn into_response(self) -> Result<CallToolResponse, McpError> {
        match self {
            Answer::Plain(result) => {
                mapping::call_result(&result).map(CallToolResponse::Complete).map_err(internal)
            }
            Answer::Response(response) => Ok(response),
        }
    }
}

/// What became of a call within the task threshold.
enum Waited {
    Done(Arc<ToolResult>),
    Canceled,
    Long,
}

/// The registry's listing mapped to MCP tools once, reused until the tools change
/// (the listing is rebuilt, and so compares unequal, after every change).
static MCP_TOOLS: Mutex<Option<MappedListing>> = Mutex::new(None);

/// A listing and its tools mapped to MCP's type.
type MappedListing = (std::sync::Weak<Listing>, Arc<Vec<Tool>>);

fn mcp_tools(listing: &Arc<Listing>) -> Result<Arc<Vec<Tool>>, McpError> {
    let mut cached = MCP_TOOLS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((of, tools)) = cached.as_ref()
        && of.upgrade().is_some_and(|of| Arc::ptr_eq(&of, listing))
    {
        return Ok(tools.clone());
    }
    let tools = listing
        .tools
        .iter()
        .map(|listed| {
            let definition: crate::tools::Definition =
                serde_json::from_str(&listed.json).map_err(internal)?;
            mapping::tool(&definition).map_err(internal)
        })
        .collect::<Result<Vec<Tool>, McpError>>()?;
    let tools = Arc::new(tools);
    *cached = Some((Arc::downgrade(listing), tools.clone()));
    Ok(tools)
}

impl LiveHandler {
    pub(crate) fn new(face: Arc<Face>) -> LiveHandler {
        let client = Client::connect(&face.daemon, "mcp");
        LiveHandler {
            face,
            state: Arc::new(HandlerState {
                client,
                opening: tokio::sync::Mutex::new(()),
                events: Arc::new(McpEvents::default()),
                broker: Arc::new(McpBroker::default()),
                log_level: Mutex::new(None),
                closed: CancellationToken::new(),
                watching: AtomicBool::new(false),
            }),
        }
    }

    pub(crate) fn face(&self) -> &Arc<Face> {
        &self.face
    }

    /// Ends the conversation: every call canceled (process trees killed), pending
    /// questions withdrawn.
    pub(crate) async fn close(&self) {
        self.state.closed.cancel();
        let _opening = self.state.opening.lock().await;
        if let Some(entry) = self.state.client.default_session() {
            entry.session.close();
        }
    }

    /// Waits until no call of the conversation runs any more, at most `grace`.
    pub(crate) async fn drain(&self, grace: Duration) {
        let Some(session) = self.state.client.default_session().map(|entry| entry.session.clone())
        else {
            return;
        };
        let deadline = Instant::now() + grace;
        while session.calls_in_flight() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The agent session, opened on first use. For a client of the initialize era
    /// that offers `roots`, its roots narrow (never widen) the configured ones.
    pub(crate) async fn session(
        &self,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Arc<Session>, McpError> {
        if let Some(entry) = self.state.client.default_session() {
            return Ok(entry.session.clone());
        }
        let _opening = self.state.opening.lock().await;
        if let Some(entry) = self.state.client.default_session() {
            return Ok(entry.session.clone());
        }
        let roots = if !is_modern(ctx) && client_offers_roots(ctx) {
            // The lock is held while the client is asked, so that one session opens;
            // the conversation's end and the request's cancellation cut the wait
            // short, and neither a close nor the other requests wait out the timeout.
            tokio::select! {
                roots = self.client_roots(&ctx.peer) => roots,
                () = self.state.closed.cancelled() => {
                    return Err(McpError::internal_error("the conversation has ended", None));
                }
                () = ctx.ct.cancelled() => {
                    return Err(McpError::internal_error("the request was canceled", None));
                }
            }
        } else {
            None
        };
        let spec = SessionSpec { roots, ..SessionSpec::default() };
        let entry = self
            .state
            .client
            .open_default_as(
                &super::client_identity(ctx),
                &spec,
                self.state.events.clone(),
                self.state.broker.clone(),
            )
            .map_err(|err| {
                McpError::internal_error(format!("cannot open a session: {err}"), None)
            })?;
        Ok(entry.session.clone())
    }

    /// Asks the client for its roots and intersects them with the configured ones.
    /// `None` keeps the configured roots (no answer, or nothing in common).
    async fn client_roots(&self, peer: &Peer<RoleServer>) -> Option<Vec<String>> {
        let listed = match tokio::time::timeout(ROOTS_TIMEOUT, peer.list_roots()).await {
            Ok(Ok(listed)) => listed,
            Ok(Err(err)) => {
                tracing::debug!(%err, "roots/list failed; keeping the configured roots");
                return None;
            }
            Err(_) => {
                tracing::debug!("roots/list timed out; keeping the configured roots");
                return None;
            }
        };
        let configured = self.face.daemon.settings().roots.clone();
        let client: Vec<std::path::PathBuf> = listed
            .roots
            .iter()
            .filter_map(|root| super::roots::path_of_file_uri(&root.uri))
            .filter_map(|path| std::fs::canonicalize(path).ok())
            .collect();
        let narrowed = super::roots::intersect(&configured, &client);
        if narrowed.is_empty() {
            tracing::warn!(
                "the client's roots share nothing with the configured roots; keeping the \
                 configured roots"
            );
            return None;
        }
        Some(narrowed.iter().map(|path| path.display().to_string()).collect())
    }

    #[cfg(feature = "conformance")]
    pub(crate) fn log_level(&self) -> Option<LoggingLevel> {
        *self.state.log_level.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts telling the client when the set of tools changes (once per handler).
    fn watch_registry(&self, peer: Peer<RoleServer>) {
        if self.state.watching.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut changes = self.face.daemon.registry().subscribe_changes();
        changes.mark_unchanged();
        let closed = self.state.closed.clone();
        let shutdown = self.face.daemon.shutdown_token().clone();
        self.face.daemon.tasks().spawn(async move {
            loop {
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    () = closed.cancelled() => return,
                    () = shutdown.cancelled() => return,
                }
                if peer.notify_tool_list_changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// Runs (part of) a call with live output forwarded as progress notifications
    /// (on the request's own stream, since the forwarding runs inside the request's
    /// task).
    async fn with_progress<T>(
        &self,
        call_id: &str,
        ctx: &RequestContext<RoleServer>,
        execution: impl Future<Output = T>,
    ) -> T {
        let Some(token) = ctx.meta.get_progress_token() else {
            return execution.await;
        };
        let (sender, mut receiver) = mpsc::channel(PROGRESS_QUEUE);
        let _progress = register(&self.state.events.progress, call_id, sender);
        tokio::pin!(execution);
        let mut progress = Progress { peer: ctx.peer.clone(), token, count: 0 };
        let result = loop {
            tokio::select! {
                result = &mut execution => break result,
                Some(text) = receiver.recv() => progress.send(text).await,
            }
        };
        // Output that arrived just before the end still goes out before the result.
        while let Ok(text) = receiver.try_recv() {
            progress.send(text).await;
        }
        result
    }

    /// `tools/call`, answered with a task once the call has run `task_after` (the
    /// face's threshold when `None`) for a client that takes tasks.
    pub(crate) async fn call_tool_after(
        &self,
        mut params: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
        task_after: Option<Duration>,
    ) -> Result<Answer, McpError> {
        let task_after = task_after.unwrap_or(self.face.options.task_after);
        if !self.face.daemon.registry().contains(&params.name) {
            return Err(unknown_tool(&self.face.daemon.registry().unknown(&params.name)));
        }
        let session = self.session(&ctx).await?;
        let arguments = Value::Object(params.arguments.take().unwrap_or_default());
        let call = Call::from_value(call_id_text(&ctx), &*params.name, &arguments);

        let modern_asks =
            is_modern(&ctx) && (params.request_state.is_some() || client_elicits(&ctx));
        let asker = if !modern_asks && client_elicits(&ctx) {
            Asker::Elicit(ctx.peer.clone())
        } else {
            Asker::Unsupported
        };
        let asker = AskerRegistration::new(&self.state.broker, &call.id, asker);

        if modern_asks {
            return self
                .modern_call(
                    &session,
                    call,
                    arguments,
                    &params,
                    &ctx,
                    HowToRun { asker, task_after },
                )
                .await;
        }
        let call_id = call.id.clone();
        self.respond(&call_id, &ctx, task_after, move |cancel| {
            Box::pin(async move {
                let _asker = asker;
                session.execute_shared(call, &cancel).await
            })
        })
        .await
    }

    /// Answers a call: with its result, or, for a client that declared the tasks
    /// extension, with a task when the call is still running after
    /// [`super::McpOptions::task_after`] (the call then goes on, and `tasks/cancel`
    /// cancels the token it was started with, as `notifications/cancelled` cancels a
    /// plain call's). Live output is forwarded as progress while the request is open.
    async fn respond(
        &self,
        call_id: &str,
        ctx: &RequestContext<RoleServer>,
        task_after: Duration,
        start: impl FnOnce(CancellationToken) -> Execution,
    ) -> Result<Answer, McpError> {
        let delivery = Delivery::of(&self.face, ctx);
        // The place among the owner's running tasks is taken now, before the call runs,
        // and given back if it is answered within its request.
        let slot = client_takes_tasks(ctx).then(|| self.face.tasks.reserve(&delivery.owner));
        let Some(slot) = slot.flatten() else {
            let result = self.with_progress(call_id, ctx, start(ctx.ct.clone())).await;
            return delivery.complete(result);
        };
        // The call's live output goes to progress notifications when the request asked
        // for them, and is watched here otherwise, so that a task starts with the
        // last line already printed as its status message.
        let (sender, mut output) = mpsc::channel(PROGRESS_QUEUE);
        let mut watching = ctx
            .meta
            .get_progress_token()
            .is_none()
            .then(|| OutputRegistration::new(&self.state.events, call_id, sender.clone()));
        let mut status = None;
        let cancel = CancellationToken::new();
        let mut execution = start(cancel.clone());
        let waited = {
            let forwarded = self.with_progress(call_id, ctx, &mut execution);
            tokio::pin!(forwarded);
            let threshold = tokio::time::sleep(task_after);
            tokio::pin!(threshold);
            loop {
                tokio::select! {
                    result = &mut forwarded => break Waited::Done(result),
                    Some(text) = output.recv() => status = last_line(&text).or(status),
                    () = ctx.ct.cancelled() => break Waited::Canceled,
                    () = &mut threshold => break Waited::Long,
                }
            }
        };
        match waited {
            Waited::Done(result) => delivery.complete(result),
            Waited::Canceled => {
                cancel.cancel();
                delivery.complete(execution.await)
            }
            Waited::Long => {
                // The conversation (and so its session) lives as long as the task; the
                // call's live output becomes the task's status message.
                let conversation = self.clone();
                let watching = watching.take().unwrap_or_else(|| {
                    OutputRegistration::new(&self.state.events, call_id, sender)
                });
                let created = self.face.tasks.start(slot, move |task: TaskContext| {
                    let run = async move {
                        let _conversation = conversation;
                        let _watching = watching;
                        if let Some(line) = status {
                            task.set_status_message(line);
                        }
                        let result = loop {
                            tokio::select! {
                                result = &mut execution => break result,
                                Some(text) = output.recv() => {
                                    if let Some(line) = last_line(&text) {
                                        task.set_status_message(line);
                                    }
                                }
                                () = task.cancelled(), if !cancel.is_cancelled() => cancel.cancel(),
                            }
                        };
                        if cancel.is_cancelled() || result.error_type == Some(ErrorType::Canceled) {
                            return Err(TaskExit::Cancelled);
                        }
                        delivery.call_result(&result).map_err(TaskExit::Error)
                    };
                    Box::pin(run) as TaskFuture
                });
                Ok(Answer::Response(CallToolResponse::Task(created)))
            }
        }
    }

    /// A 2026-07-28 call from a client that can answer questions: either the answer
    /// to an earlier question comes with it (the call resumes where it stopped), or
    /// the call is decided up front and a question comes back as `input_required`
    /// before anything runs. Either way the call is decided once, runs once and is
    /// audited once.
    async fn modern_call(
        &self,
        session: &Arc<Session>,
        call: Call,
        arguments: Value,
        params: &CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
        how: HowToRun,
    ) -> Result<Answer, McpError> {
        let HowToRun { asker, task_after } = how;
        if let Some(state) = &params.request_state {
            let Some((_, pending)) = self.face.pending.remove(state) else {
                return Err(McpError::invalid_params(
                    "unknown or expired requestState; call the tool again without it",
                    None,
                ));
            };
            if *pending.tool != *call.name || pending.arguments != arguments {
                return Err(McpError::invalid_params(
                    "the requestState belongs to a different call",
                    None,
                ));
            }
            let Some(response) = params
                .input_responses
                .as_ref()
                .and_then(|responses| responses.get(APPROVAL_INPUT_KEY))
            else {
                return Err(McpError::invalid_params(
                    format!("inputResponses must answer {APPROVAL_INPUT_KEY:?}"),
                    None,
                ));
            };
            let answer = answer_from_json(response, &call.name)
                .map_err(|err| McpError::invalid_params(err, None))?;
            // The call runs under the id it was asked with: its live output carries that
            // id, so the progress forwarder is registered under it too.
            let asked_id = pending.question.call().id.clone();
            let session = session.clone();
            let question = pending.question;
            return self
                .respond(&asked_id, ctx, task_after, move |cancel| {
                    Box::pin(async move {
                        let _asker = asker;
                        session.resume(question, answer, &cancel).await
                    })
                })
                .await;
        }
        match session.preflight(&call, &ctx.ct).await {
            Preflight::Refuse(result) => Delivery::of(&self.face, ctx).complete(result),
            Preflight::Run(ready) => {
                let session = session.clone();
                self.respond(&call.id, ctx, task_after, move |cancel| {
                    Box::pin(async move {
                        let _asker = asker;
                        session.run(ready, &cancel).await
                    })
                })
                .await
            }
            Preflight::Ask(question) => Ok(Answer::Response(CallToolResponse::InputRequired(
                self.input_required(question, arguments)?,
            ))),
        }
    }

    /// Records a pending question and builds the `input_required` result for it.
    fn input_required(
        &self,
        question: Question,
        arguments: Value,
    ) -> Result<InputRequiredResult, McpError> {
        let handle = super::random_hex().map_err(internal)?;
        let elicitation = elicitation_json(question.request());
        self.face.remember_pending(
            handle.clone(),
            super::PendingInput {
                tool: question.call().name.to_string(),
                arguments,
                question,
                created: Instant::now(),
            },
        );
        let question = json!({"method": "elicitation/create", "params": elicitation});
        let mut requests = BTreeMap::new();
        match serde_json::from_value(question) {
            Ok(question) => {
                requests.insert(APPROVAL_INPUT_KEY.to_owned(), question);
            }
            Err(err) => tracing::error!(%err, "approval question rejected by the MCP model"),
        }
        Ok(InputRequiredResult::new(Some(requests), Some(handle)))
    }
}

/// Sends numbered progress notifications for one call.
struct Progress {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    count: u64,
}

impl Progress {
    async fn send(&mut self, text: String) {
        self.count += 1;
        let param = json!({
            "progressToken": self.token,
            "progress": self.count,
            "message": text,
        });
        match serde_json::from_value::<ProgressNotificationParam>(param) {
            Ok(param) => {
                if let Err(err) = self.peer.notify_progress(param).await {
                    tracing::debug!(%err, "progress notification not delivered");
                }
            }
            Err(err) => tracing::error!(%err, "progress notification rejected by the MCP model"),
        }
    }
}

/// Whether this request speaks the stateless revision (2026-07-28 or later).
pub(crate) fn is_modern(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version()
        .is_some_and(|version| version.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
}

fn client_elicits(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.client_capabilities().is_some_and(|caps| caps.elicitation.is_some())
}

/// Whether this request's client takes tasks (declared the tasks extension, at
/// `initialize` or in the request's own `_meta`).
fn client_takes_tasks(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.client_capabilities().is_some_and(|caps| caps.supports_tasks())
}

/// Whether this request's protocol version has `resource_link` content (2025-06-18
/// and later).
fn client_takes_links(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version()
        .is_some_and(|version| version.as_str() >= ProtocolVersion::V_2025_06_18.as_str())
}

/// How a call's result reaches the client that made it: a long text becomes an
/// excerpt and a link (when the client takes links), kept for `resources/read` by
/// the same identity.
#[derive(Clone)]
struct Delivery {
    face: Arc<Face>,
    owner: Cow<'static, str>,
    links: bool,
}

impl Delivery {
    fn of(face: &Arc<Face>, ctx: &RequestContext<RoleServer>) -> Delivery {
        Delivery {
            face: face.clone(),
            owner: super::client_identity(ctx),
            links: client_takes_links(ctx),
        }
    }

    fn call_result(&self, result: &ToolResult) -> Result<CallToolResult, McpError> {
        let linked = if self.links {
            let text = mapping::result_text(result);
            if self.face.results.is_long(&text) {
                self.face.results.keep(&self.owner, &text)
            } else {
                None
            }
        } else {
            None
        };
        mapping::call_result_with(result, linked.as_ref()).map_err(internal)
    }

    /// The answer of a call that ended within its request: its result as it is,
    /// unless the text goes as a link.
    fn complete(&self, result: Arc<ToolResult>) -> Result<Answer, McpError> {
        if self.links && self.face.results.is_long(&mapping::result_text(&result)) {
            return Ok(Answer::Response(CallToolResponse::Complete(self.call_result(&result)?)));
        }
        Ok(Answer::Plain(result))
    }
}

fn client_offers_roots(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.client_capabilities().is_some_and(|caps| caps.roots.is_some())
}

/// `message`: the registry's, naming the tool and a likely one meant.
fn unknown_tool(message: &str) -> McpError {
    McpError::new(
        ErrorCode::INVALID_PARAMS,
        message.to_owned(),
        Some(json!({"error_type": "unknown_tool"})),
    )
}

/// What the live handler answers for what it does not serve (resources, prompts,
/// completion: only the conformance fixtures have them).
fn not_served<T>(what: &'static str) -> Result<T, McpError> {
    Err(McpError::new(ErrorCode::METHOD_NOT_FOUND, format!("{what} is not served"), None))
}

fn internal(err: impl std::fmt::Display) -> McpError {
    McpError::internal_error(err.to_string(), None)
}

impl ServerHandler for LiveHandler {
    fn get_info(&self) -> ServerConfig {
        let capabilities = json!({
            "tools": {"listChanged": true},
            // Long results' whole texts are read with resources/read.
            "resources": {},
            "logging": {},
            "extensions": {(rmcp::model::TASKS_EXTENSION_ID): {}},
        });
        let info = json!({
            "protocolVersion": ProtocolVersion::LATEST,
            "capabilities": capabilities,
            "serverInfo": {
                "name": "toolgate",
                "title": "toolgate",
                "version": env!("CARGO_PKG_VERSION"),
            },
            "instructions": "toolgate runs a coding agent's tools (files, search, commands) \
                             inside configured roots, behind permission rules and hooks. \
                             Every result's structuredContent is toolgate's Result object \
                             with a stable error_type.",
        });
        serde_json::from_value(info).unwrap_or_default()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let session = self.session(&ctx).await?;
        let (listing, shown) = session.listed();
        let tools = mcp_tools(&listing)?;
        let tools = shown.iter().filter_map(|&index| tools.get(index).cloned()).collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        let definition = self.face.daemon.registry().get(name)?.definition().clone();
        mapping::tool(&definition).ok()
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        self.call_tool_after(params, ctx, None).await?.into_response()
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        self.face.tasks.get(&super::client_identity(&ctx), &request.task_id)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let owner = super::client_identity(&ctx);
        self.face.tasks.update(&owner, &request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.face.tasks.cancel(&super::client_identity(&ctx), &request.task_id)
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // rmcp keeps only what was requested *and* advertised in the capabilities.
        Some(requested.clone())
    }

    /// A 2026-07-28 `subscriptions/listen` stream: `tools/list_changed` whenever
    /// the registry changes, until the client cancels or the daemon stops.
    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), McpError> {
        let mut changes = self.face.daemon.registry().subscribe_changes();
        changes.mark_unchanged();
        let shutdown = self.face.daemon.shutdown_token().clone();
        loop {
            tokio::select! {
                () = subscription.cancelled() => return Ok(()),
                () = shutdown.cancelled() => return Ok(()),
                changed = changes.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    if subscription.accepted().tools_list_changed == Some(true)
                        && subscription.sink().notify_tool_list_changed().await.is_err()
                    {
                        return Ok(());
                    }
                }
            }
        }
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        *self.state.log_level.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(request.level);
        Ok(())
    }

    async fn on_initialized(&self, ctx: NotificationContext<RoleServer>) {
        self.watch_registry(ctx.peer);
    }

    async fn on_roots_list_changed(&self, _ctx: NotificationContext<RoleServer>) {
        // The session's roots are fixed once its first call ran (its Env is shared
        // by running calls); a session not opened yet will ask for the new list.
        tracing::debug!("the client's roots changed; they apply to sessions opened from now on");
    }
}

/// The call id of a request: its JSON-RPC id as text (`7`, or `abc` for a string id).
pub(crate) fn call_id_text(ctx: &RequestContext<RoleServer>) -> Arc<str> {
    match &ctx.id {
        NumberOrString::String(text) => text.clone(),
        NumberOrString::Number(number) => Arc::from(itoa::Buffer::new().format(*number)),
    }
}

/// The handler of one MCP conversation: the live handler, or, only in a build with
/// the `conformance` feature whose face serves the conformance suite's fixtures
/// (`--conformance-fixtures`), the same handler wrapped by `fixtures::Conformance`.
/// The live handler knows nothing of the fixtures; the shipped build has none.
#[derive(Clone)]
pub enum McpHandler {
    Live(LiveHandler),
    #[cfg(feature = "conformance")]
    Conformance(fixtures::Conformance),
}

impl McpHandler {
    pub(crate) fn new(face: Arc<Face>) -> McpHandler {
        let live = LiveHandler::new(face.clone());
        #[cfg(feature = "conformance")]
        if face.options.conformance_fixtures {
            return McpHandler::Conformance(fixtures::Conformance::new(live));
        }
        McpHandler::Live(live)
    }

    fn live(&self) -> &LiveHandler {
        match self {
            McpHandler::Live(live) => live,
            #[cfg(feature = "conformance")]
            McpHandler::Conformance(conformance) => conformance.live(),
        }
    }

    /// See [`LiveHandler::close`].
    pub(crate) async fn close(&self) {
        self.live().close().await;
    }

    /// See [`LiveHandler::drain`].
    pub(crate) async fn drain(&self, grace: Duration) {
        self.live().drain(grace).await;
    }

    /// `tools/call`, answered before the answer takes rmcp's types.
    pub(crate) async fn call_tool_answer(
        &self,
        params: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Answer, McpError> {
        match self {
            McpHandler::Live(live) => live.call_tool_after(params, ctx, None).await,
            #[cfg(feature = "conformance")]
            McpHandler::Conformance(conformance) => conformance.call_tool(params, ctx).await,
        }
    }
}

/// Runs a request's handler (the rest of it, when part ran elsewhere); a panic (a bug:
/// a tool's own panic is already its result) becomes the request's internal error, so
/// it costs that request and not the conversation. rmcp runs each request in a task of
/// its own and answers nothing when that task panics.
pub(crate) async fn caught<T, F>(work: F, id: &RequestId, what: &str) -> Result<T, McpError>
where
    F: Future<Output = Result<T, McpError>>,
{
    crate::rpc::requests::caught(work).await.unwrap_or_else(|_| panicked(id, what))
}

/// The error that answers a request whose handler panicked (a bug), logged.
pub(crate) fn panicked<T>(id: &RequestId, what: &str) -> Result<T, McpError> {
    tracing::error!(%id, "{what} panicked");
    Err(McpError::internal_error(format!("{what} failed"), None))
}

// The resource, prompt and completion requests are read by the conformance fixtures
// alone; the shipped build answers them without looking.
#[cfg_attr(
    not(feature = "conformance"),
    allow(unused_variables, reason = "only the conformance fixtures read these requests")
)]
impl ServerHandler for McpHandler {
    fn get_info(&self) -> ServerConfig {
        match self {
            McpHandler::Live(live) => live.get_info(),
            #[cfg(feature = "conformance")]
            McpHandler::Conformance(conformance) => conformance.get_info(),
        }
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let id = ctx.id.clone();
        caught(self.live().list_tools(request, ctx), &id, "tools/list").await
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.live().get_tool(name)
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let id = ctx.id.clone();
        caught(self.call_tool_answer(params, ctx), &id, "the call").await?.into_response()
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let id = ctx.id.clone();
        caught(self.live().get_task(request, ctx), &id, "tasks/get").await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let id = ctx.id.clone();
        caught(self.live().update_task(request, ctx), &id, "tasks/update").await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let id = ctx.id.clone();
        caught(self.live().cancel_task(request, ctx), &id, "tasks/cancel").await
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        self.live().accepted_subscription_filter(requested)
    }

    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), McpError> {
        match self {
            McpHandler::Live(live) => live.listen(subscription).await,
            #[cfg(feature = "conformance")]
            McpHandler::Conformance(conformance) => conformance.listen(subscription).await,
        }
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.live().set_level(request, ctx).await
    }

    async fn on_initialized(&self, ctx: NotificationContext<RoleServer>) {
        self.live().on_initialized(ctx).await;
    }

    async fn on_roots_list_changed(&self, ctx: NotificationContext<RoleServer>) {
        self.live().on_roots_list_changed(ctx).await;
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, McpError> {
        match self {
            // Kept results are reached by their links, not listed.
            McpHandler::Live(_) => {
                serde_json::from_value(json!({"resultType": "complete", "resources": []}))
                    .map_err(internal)
            }
            #[cfg(feature = "conformance")]
            McpHandler::Conformance(conformance) => conformance.list_resources(request, ctx),
        }
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourceTemplatesResult, McpError> {
        match self {
            McpHandler::Live(_) => {
                serde_json::from_value(json!({"resultType": "complete", "resourceTemplates": []}))
                    .map_err(internal)
            }
            #[cfg(feature = "conformance")]
            McpHandler::Conformance(conformance) => {
                conformance.list_resource_templates(request, ctx)
            }
        }
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, McpError> {
        if request.uri.starts_with(super::results::RESULT_URI_PREFIX) {
            let owner = super::client_identity(&ctx);
            let read = self.live().face().results.read_resource(&owner, &request.uri)?;
            return Ok(rmcp::model::ReadResourceResponse::Complete(read));
        }
        match self {
            McpHandler::Live(_) => Err(McpError::resource_not_found(
                format!("resource not found: {}", request.uri),
                Some(json!({"uri": request.uri})),
            )),
            #[cfg(feature = "conformance")]
            McpHandler::Conformance(conformance) => conformance.read_resource(request, ctx),
        }
    }

    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        match self {
            McpHandler::Live(_) => not_served("resources/subscribe"),
            #[cfg(feature = "conformance")]
            McpHandler::Conformance(conformance) => conformance.subscribe(&request.uri, ctx),
        }
    }

    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        match self {
            McpHandler::Live(_) => not_served("resources/unsubscribe"),
            #[cfg(feature = "conformance")]
            McpHandler::Conformance(conformance) => conformance.subscribe(&request.uri, ctx),
        }
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, McpError> {
        match self {
            McpHandler::Live(_) => not_served("prompts/list"),
            #[cfg(feature = "conformance")]
            McpHandler::Conformance(conformance) => conformance.list_prompts(request, ctx),
        }
    }

    async fn get_prompt(
        &self,
        request: rmcp::model::GetPromptRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetPromptResponse, McpError> {
        match self {
            McpHandler::Live(_) => not_served("prompts/get"),
            #[cfg(feature = "conformance")]
            McpHandler::Conformance(conformance) => conformance.get_prompt(request, ctx),
        }
    }

    async fn complete(
        &self,
        request: rmcp::model::CompleteRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CompleteResult, McpError> {
        match self {
            McpHandler::Live(_) => not_served("completion/complete"),
            #[cfg(feature = "conformance")]
            McpHandler::Conformance(conformance) => conformance.complete(request, ctx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_handler_that_panics_after_its_first_wait_is_answered_with_an_internal_error() {
        fn bug() -> Result<u8, McpError> {
            panic!("a bug after the first wait")
        }
        let id = RequestId::Number(7);
        let failing = async {
            // Past the first poll: the part of a call that runs in a task of its own.
            tokio::task::yield_now().await;
            bug()
        };
        let error = caught(failing, &id, "the call").await.expect_err("a panic is an error");
        assert_eq!(error.code, rmcp::model::ErrorCode::INTERNAL_ERROR);
        assert_eq!(error.message, "the call failed");

        // A handler that finishes is its own result.
        let finishing = async {
            tokio::task::yield_now().await;
            Ok::<u8, McpError>(3)
        };
        assert_eq!(caught(finishing, &id, "the call").await.expect("finished"), 3);
    }
}
