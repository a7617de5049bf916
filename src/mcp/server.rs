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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use rmcp::ErrorData as McpError;
use rmcp::RoleServer;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ErrorCode, InputRequiredResult, ListToolsResult,
    LoggingLevel, PaginatedRequestParams, ProgressNotificationParam, ProgressToken,
    ProtocolVersion, ServerConfig, SetLevelRequestParams, SubscriptionFilter, Tool,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, SubscriptionContext};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::approval::{APPROVAL_INPUT_KEY, Asker, McpBroker, answer_from_json, elicitation_json};
use super::{Face, fixtures, mapping};
use crate::agent::{Event, EventSink, Session};
use crate::agent::{Preflight, Question};
use crate::daemon::{Client, SessionSpec};
use crate::tools::Call;
use crate::tools::registry::Listing;

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
    /// Held while the session is being opened (asking the client for its roots).
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
            && let Some(sender) = self.progress.get(&call_id)
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
            self.client_roots(&ctx.peer).await
        } else {
            None
        };
        let spec = SessionSpec { roots, ..SessionSpec::default() };
        let entry = self
            .state
            .client
            .open_default_as(
                &super::http::client_identity(ctx),
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

    /// A 2026-07-28 call from a client that can answer questions: either the answer
    /// to an earlier question comes with it (the call resumes where it stopped), or
    /// the call is decided up front and a question comes back as `input_required`
    /// before anything runs. Either way the call is decided once, runs once and is
    /// audited once.
    async fn modern_call(
        &self,
        session: &Session,
        call: Call,
        arguments: Value,
        params: &CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if let Some(state) = &params.request_state {
            let Some((_, pending)) = self.face.pending.remove(state) else {
                return Err(McpError::invalid_params(
                    "unknown or expired requestState; call the tool again without it",
                    None,
                ));
            };
            if pending.tool != call.name || pending.arguments != arguments {
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
            let resumed = session.resume(pending.question, answer, &ctx.ct);
            let result = self.with_progress(&asked_id, ctx, resumed).await;
            return Ok(CallToolResponse::Complete(
                mapping::call_result(&result).map_err(internal)?,
            ));
        }
        let result = match session.preflight(&call, &ctx.ct).await {
            Preflight::Refuse(result) => result,
            Preflight::Run(ready) => {
                self.with_progress(&call.id, ctx, session.run(ready, &ctx.ct)).await
            }
            Preflight::Ask(question) => {
                return Ok(CallToolResponse::InputRequired(
                    self.input_required(question, arguments)?,
                ));
            }
        };
        Ok(CallToolResponse::Complete(mapping::call_result(&result).map_err(internal)?))
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
                tool: question.call().name.clone(),
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

fn client_offers_roots(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.client_capabilities().is_some_and(|caps| caps.roots.is_some())
}

fn unknown_tool(name: &str) -> McpError {
    McpError::new(
        ErrorCode::INVALID_PARAMS,
        format!("unknown tool: {name:?}"),
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
            "logging": {},
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
        mut params: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if !self.face.daemon.registry().contains(&params.name) {
            return Err(unknown_tool(&params.name));
        }
        let session = self.session(&ctx).await?;
        let arguments = Value::Object(params.arguments.take().unwrap_or_default());
        let call = Call::from_value(call_id_text(&ctx), params.name.to_string(), &arguments);

        let modern_asks =
            is_modern(&ctx) && (params.request_state.is_some() || client_elicits(&ctx));
        let asker = if !modern_asks && client_elicits(&ctx) {
            Asker::Elicit(ctx.peer.clone())
        } else {
            Asker::Unsupported
        };
        let _asker = register(&self.state.broker.askers, &call.id, Arc::new(asker));

        if modern_asks {
            return self.modern_call(&session, call, arguments, &params, &ctx).await;
        }
        let result =
            self.with_progress(&call.id, &ctx, session.execute_shared(&call, &ctx.ct)).await;
        Ok(CallToolResponse::Complete(mapping::call_result(&result).map_err(internal)?))
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
pub(crate) fn call_id_text(ctx: &RequestContext<RoleServer>) -> String {
    match ctx.id.clone().into_json_value() {
        Value::String(text) => text,
        other => other.to_string(),
    }
}

/// The handler of one MCP conversation: the live handler, or, only when the face
/// serves the conformance suite's fixtures (`--conformance-fixtures`), the same
/// handler wrapped by [`fixtures::Conformance`]. The live handler knows nothing of
/// the fixtures.
#[derive(Clone)]
pub enum McpHandler {
    Live(LiveHandler),
    Conformance(fixtures::Conformance),
}

impl McpHandler {
    pub(crate) fn new(face: Arc<Face>) -> McpHandler {
        let live = LiveHandler::new(face.clone());
        if face.options.conformance_fixtures {
            McpHandler::Conformance(fixtures::Conformance::new(live))
        } else {
            McpHandler::Live(live)
        }
    }

    fn live(&self) -> &LiveHandler {
        match self {
            McpHandler::Live(live) => live,
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
}

impl ServerHandler for McpHandler {
    fn get_info(&self) -> ServerConfig {
        match self {
            McpHandler::Live(live) => live.get_info(),
            McpHandler::Conformance(conformance) => conformance.get_info(),
        }
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        self.live().list_tools(request, ctx).await
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.live().get_tool(name)
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        match self {
            McpHandler::Live(live) => live.call_tool(params, ctx).await,
            McpHandler::Conformance(conformance) => conformance.call_tool(params, ctx).await,
        }
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        self.live().accepted_subscription_filter(requested)
    }

    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), McpError> {
        self.live().listen(subscription).await
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
            McpHandler::Live(_) => not_served("resources/list"),
            McpHandler::Conformance(conformance) => conformance.list_resources(request, ctx),
        }
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourceTemplatesResult, McpError> {
        match self {
            McpHandler::Live(_) => not_served("resources/templates/list"),
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
        match self {
            McpHandler::Live(_) => not_served("resources/read"),
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
            McpHandler::Conformance(conformance) => conformance.complete(request, ctx),
        }
    }
}
