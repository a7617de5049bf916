//! A session: the Env, mode, rules, grants, hooks, in-flight calls and approvals of one
//! client conversation, and the pipeline that runs its calls.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::approval::{
    ApprovalAnswer, ApprovalBroker, PermissionRequest, RequestKind, Unavailable,
};
use super::events::{ApprovalDecision, ApprovalScope, Event, EventSink};
use crate::exec::ExitStatus;
use crate::hooks::{HookVerdict, Hooks, ToolCallInput};
use crate::permission::{
    CallContext, CallDecision, DecidedBy, Decision, Explanation, Layer, Mode, Outcome,
    PermissionEngine, Policy, SessionGrant, ToolFacts, Verdict,
};
use crate::tools::jobs::{Exit, Job, ProcessObserver, ProcessSettings, Processes};
use crate::tools::registry::{Listing, parse_arguments};
use crate::tools::{
    Call, Control, Definition, Env, ErrorType, OutputSink, OutputStream, Registry, SessionControl,
    Todo, ToolResult,
};
use tokio_util::task::TaskTracker;

/// Everything a session is made from. Built by the daemon from its configuration
/// (already intersected with what the client asked for).
pub struct SessionOptions {
    pub id: String,
    /// Who is on the other end (`uid:1000`, `token:ci`), for the audit log.
    pub client: String,
    pub env: Env,
    /// The configured rules, with the configured mode as the ceiling.
    pub engine: PermissionEngine,
    /// The mode asked for; restricted by the engine's ceiling.
    pub mode: Mode,
    /// Empty = every tool; otherwise only these (system tools are always allowed).
    pub allowlist: Vec<String>,
    pub hooks: Arc<Hooks>,
    pub approval_timeout: Duration,
    /// How many calls of this session may run at once.
    pub max_concurrent_calls: usize,
    pub events: Arc<dyn EventSink>,
    pub approvals: Arc<dyn ApprovalBroker>,
    /// Sees every finished call (the audit log).
    pub observer: Option<Arc<dyn CallObserver>>,
    /// Canceled when the session ends (close, disconnect, shutdown).
    pub cancel: CancellationToken,
}

/// One finished call, for the audit log.
#[derive(Clone, Debug)]
pub struct CallRecord {
    pub session_id: Arc<str>,
    pub client: Arc<str>,
    pub call_id: Arc<str>,
    pub tool: Arc<str>,
    /// The arguments as they ran (shared with the call's events).
    pub arguments: Arc<Value>,
    /// Who decided, and how.
    pub decision: CallDecision,
    pub result_ok: bool,
    pub error_type: Option<ErrorType>,
    pub elapsed: Duration,
    /// The sandbox a command of the call ran in, from the result's metadata.
    pub sandbox: Option<Value>,
}

pub trait CallObserver: Send + Sync {
    /// Takes the record: an observer that keeps it (the audit log) moves its parts
    /// rather than copying them.
    fn call_finished(&self, record: CallRecord);

    /// Records of finished calls this observer took but could not keep (the audit
    /// log's queue was full, or its writer had stopped), for `daemon/status`.
    fn records_dropped(&self) -> u64 {
        0
    }
}

/// The parts of a session that change at runtime, under one short lock.
struct Mutable {
    /// Rules, mode and the grants of "allow for this session" answers.
    engine: PermissionEngine,
    allowlist: Vec<String>,
    hooks: Arc<Hooks>,
    todos: Vec<Todo>,
}

pub struct Session {
    id: Arc<str>,
    client: Arc<str>,
    registry: Arc<Registry>,
    /// Replaced whole when the session is narrowed; a call keeps the one it read.
    env: std::sync::RwLock<Arc<Env>>,
    approval_timeout: Duration,
    state: Mutex<Mutable>,
    events: Arc<dyn EventSink>,
    approvals: Arc<dyn ApprovalBroker>,
    observer: Option<Arc<dyn CallObserver>>,
    cancel: CancellationToken,
    limiter: Semaphore,
    /// Questions are put to a person one at a time, so calls that ask never run
    /// concurrently with each other.
    ask_gate: tokio::sync::Mutex<()>,
    /// In-flight calls by call id (several when a client reuses an id), each with a
    /// session-unique number so that its entry can be removed exactly.
    in_flight: DashMap<Arc<str>, Vec<(u64, CancellationToken)>>,
    next_call: AtomicU64,
    next_request: AtomicU64,
    /// The session's background processes, once configured ([`Session::keep_processes`]).
    processes: std::sync::OnceLock<Arc<Processes>>,
}

/// A call the policy stage let through, with what it knows about it.
pub struct Prepared {
    /// The call as it will run (with a PreToolUse hook's updated input).
    call: Call,
    arguments: Arc<Value>,
    started: Instant,
    /// The engine's decision (`None` for an unknown tool).
    decision: Option<Decision>,
}

/// A call [`Session::preflight`] allowed; run it with [`Session::run`].
pub struct Ready {
    prepared: Prepared,
    decision: CallDecision,
}

/// A call that needs a person's answer, and the question to put.
pub struct Question {
    prepared: Prepared,
    request: PermissionRequest,
}

impl Question {
    pub fn request(&self) -> &PermissionRequest {
        &self.request
    }

    /// The call as it will run.
    pub fn call(&self) -> &Call {
        &self.prepared.call
    }
}

/// What [`Session::preflight`] concluded.
// Made once per call and moved once into the face's answer; boxing the larger
// variants would only add an allocation to every call.
#[allow(clippy::large_enum_variant)]
pub enum Preflight {
    /// Allowed: run it.
    Run(Ready),
    /// A person must answer first (through the caller's own channel).
    Ask(Question),
    /// Refused; the call is finished (events sent, audited).
    Refuse(Arc<ToolResult>),
}

/// Where the policy stage left a call.
enum Stage {
    /// Refused before its tool ran (the call with a hook's update, and how it ended).
    Done(Call, Finished),
    Run(Prepared, CallDecision),
    Ask(Prepared),
}

/// How a call ended, before its closing events.
struct Finished {
    result: ToolResult,
    decision: CallDecision,
    /// The arguments that finally ran (after a hook's update).
    arguments: Arc<Value>,
}

/// A call holding its place among the session's running calls.
struct Admitted<'a> {
    cancel: CancellationToken,
    _permit: Option<tokio::sync::SemaphorePermit<'a>>,
    _in_flight: InFlightGuard<'a>,
}

const HOOK_ASKS: &str = "a PreToolUse hook asks for approval";

fn hook_explanation(reason: &str) -> Explanation {
    Explanation { layer: Layer::Hook, rule: None, list: None, reason: reason.to_owned() }
}

impl Session {
    pub fn new(registry: Arc<Registry>, options: SessionOptions) -> Arc<Session> {
        Arc::new_cyclic(|weak: &Weak<Session>| {
            let mut env = options.env;
            env.session_id = options.id.clone();
            let control: Weak<dyn SessionControl> = weak.clone();
            env.control = Control::new(control);
            let mut engine = options.engine;
            engine.set_mode(options.mode);
            Session {
                id: options.id.into(),
                client: options.client.into(),
                registry,
                env: std::sync::RwLock::new(Arc::new(env)),
                approval_timeout: options.approval_timeout,
                state: Mutex::new(Mutable {
                    engine,
                    allowlist: options.allowlist,
                    hooks: options.hooks,
                    todos: Vec::new(),
                }),
                events: options.events,
                approvals: options.approvals,
                observer: options.observer,
                cancel: options.cancel,
                limiter: Semaphore::new(options.max_concurrent_calls.max(1)),
                ask_gate: tokio::sync::Mutex::new(()),
                in_flight: DashMap::new(),
                next_call: AtomicU64::new(0),
                next_request: AtomicU64::new(1),
                processes: std::sync::OnceLock::new(),
            }
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The session's Env as it is now.
    pub fn env(&self) -> Arc<Env> {
        self.env.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Replaces the Env (a narrowing the daemon checked); calls already running keep
    /// the one they started with.
    pub fn replace_env(&self, mut env: Env) {
        env.session_id = self.id.to_string();
        *self.env.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(env);
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn mode(&self) -> Mode {
        self.lock().engine.mode()
    }

    /// The configured mode: no request can make the session more permissive.
    pub fn mode_ceiling(&self) -> Mode {
        self.lock().engine.configured_mode()
    }

    pub fn client(&self) -> &str {
        &self.client
    }

    pub fn allowlist(&self) -> Vec<String> {
        self.lock().allowlist.clone()
    }

    pub fn todos(&self) -> Vec<Todo> {
        self.lock().todos.clone()
    }

    /// Sends an event to the session's sink (the daemon's broadcasts).
    pub fn emit(&self, event: Event) {
        self.events.emit(event);
    }

    /// The session's cancellation token (a parent of every call's token).
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Changes the mode, never beyond the ceiling. Returns the mode now in force.
    pub fn set_mode(&self, mode: Mode) -> Mode {
        let (mode, changed) = {
            let mut state = self.lock();
            let before = state.engine.mode();
            let mode = state.engine.set_mode(mode);
            (mode, mode != before)
        };
        if changed {
            self.events.emit(Event::ModeChanged { session_id: self.id.clone(), mode });
        }
        mode
    }

    /// Whether an allowlist would narrow this session's: with an allowlist in force,
    /// every name must be in it (and an empty list, "every tool", would widen it).
    pub fn check_allowlist(&self, allowlist: &[String]) -> Result<(), String> {
        narrower(&self.lock().allowlist, allowlist)
    }

    /// Narrows the allowlist; a wider one is refused and changes nothing.
    pub fn set_allowlist(&self, allowlist: Vec<String>) -> Result<(), String> {
        let mut state = self.lock();
        narrower(&state.allowlist, &allowlist)?;
        state.allowlist = allowlist;
        Ok(())
    }

    /// Swaps rules, the mode ceiling and hooks (configuration reload); session
    /// grants survive and the mode is re-capped by the new ceiling.
    pub fn reload(&self, policy: Policy, configured: Mode, hooks: Arc<Hooks>) {
        let mut state = self.lock();
        state.engine.reload(policy, configured);
        state.hooks = hooks;
    }

    /// Which tools of the registry's listing this session may see (the same choice as
    /// [`Session::definitions`]), in name order.
    pub fn listed(&self) -> (Arc<Listing>, Vec<usize>) {
        let (allowlist, mode) = {
            let state = self.lock();
            (state.allowlist.clone(), state.engine.mode())
        };
        let listing = self.registry.listing();
        let shown = (0..listing.tools.len())
            .filter(|&index| {
                let tool = &listing.tools[index];
                (tool.system || allowlist.is_empty() || allowlist.contains(&tool.name))
                    && (mode != Mode::Plan || tool.system || tool.safety.is_read_only())
            })
            .collect();
        (listing, shown)
    }

    /// The definitions this session may see: the allowlist applied (system tools always
    /// kept), and in plan mode only read_only tools.
    pub fn definitions(&self) -> Vec<Definition> {
        let (allowlist, mode) = {
            let state = self.lock();
            (state.allowlist.clone(), state.engine.mode())
        };
        let mut definitions = self.registry.definitions_filtered(&allowlist);
        if mode == Mode::Plan {
            definitions.retain(|def| def.system || def.safety.is_read_only());
        }
        definitions
    }

    /// Cancels every in-flight call with this id. Returns how many were canceled.
    pub fn cancel_call(&self, call_id: &str) -> usize {
        match self.in_flight.get(call_id) {
            Some(tokens) => {
                tokens.iter().for_each(|(_, token)| token.cancel());
                tokens.len()
            }
            None => 0,
        }
    }

    pub fn calls_in_flight(&self) -> usize {
        self.in_flight.iter().map(|entry| entry.value().len()).sum()
    }

    /// Lets the session keep background processes, bounded by `settings`; their tasks
    /// are tracked by `tasks` (the daemon waits for them at shutdown). Their tokens are
    /// children of the session's, so closing the session kills them.
    pub fn keep_processes(&self, settings: ProcessSettings, tasks: TaskTracker) {
        let observer =
            Arc::new(ProcessEvents { session_id: self.id.clone(), events: self.events.clone() });
        let _ = self.processes.get_or_init(|| {
            Arc::new(Processes::new(settings, &self.id, observer, self.cancel.clone(), tasks))
        });
    }

    /// Background processes still running.
    pub fn running_processes(&self) -> usize {
        self.processes.get().map_or(0, |processes| processes.running())
    }

    /// Ends the session: every call canceled, processes killed, approvals dropped.
    pub fn close(&self) {
        self.cancel.cancel();
    }

    /// Explains, without running anything, which layer and rule would decide a call,
    /// with the sentence of every layer consulted, in the pipeline's order: the
    /// permission engine, then confinement of the call's paths (which refuses what the
    /// permission engine would let through), then for a command the kernel sandbox it
    /// would run in (what it may read and write; it decides nothing before the call).
    pub fn explain_layers(&self, call: &Call) -> (String, Option<Explanation>, Vec<Explanation>) {
        let Some(tool) = self.registry.get(&call.name) else {
            return ("unknown_tool".to_owned(), None, Vec::new());
        };
        let args = parse_arguments(&call.arguments).unwrap_or(Value::Null);
        let decision = self.decide(tool.definition(), &args);
        let mut verdict = verdict_name(&decision.verdict).to_owned();
        let mut deciding = decision.explanation.clone();
        // Hooks come first, as in a call; what they answer is not known before it runs.
        let hooks = self.lock().hooks.clone();
        let mut layers: Vec<Explanation> = hooks
            .explain(&call.name)
            .into_iter()
            .map(|reason| Explanation { layer: Layer::Hook, rule: None, list: None, reason })
            .collect();
        layers.push(decision.explanation);
        if let Some((refused, explanation)) =
            super::confinement::check(&call.name, &args, &self.env())
        {
            if refused && decision.verdict != Verdict::Deny {
                verdict = "deny".to_owned();
                deciding = explanation.clone();
            }
            layers.push(explanation);
        }
        if tool.definition().facts.command_argument().is_some()
            && let Some(reason) = crate::sandbox::explain()
        {
            layers.push(Explanation { layer: Layer::Sandbox, rule: None, list: None, reason });
        }
        (verdict, Some(deciding), layers)
    }

    /// The whole decision the engine would take on a call now (suggestions and the
    /// session grant included); `None` for an unknown tool.
    pub fn decision(&self, call: &Call) -> Option<Decision> {
        let tool = self.registry.get(&call.name)?;
        let args = parse_arguments(&call.arguments).unwrap_or(Value::Null);
        Some(self.decide(tool.definition(), &args))
    }

    /// Runs one model turn. Consecutive calls that are known, read_only, allowed in the
    /// current mode and cannot ask run as one concurrent batch; every other call is a
    /// batch of its own. Results come back in call order.
    pub async fn execute_calls(
        &self,
        calls: &[Call],
        cancel: &CancellationToken,
    ) -> Vec<ToolResult> {
        let mut results = Vec::with_capacity(calls.len());
        let mut start = 0;
        while start < calls.len() {
            let mut end = start + 1;
            if self.may_run_concurrently(&calls[start]) {
                while end < calls.len() && self.may_run_concurrently(&calls[end]) {
                    end += 1;
                }
            }
            let batch = &calls[start..end];
            if batch.len() == 1 {
                results.push(self.execute_one(&batch[0], cancel).await);
            } else {
                let runs = batch.iter().map(|call| self.execute_one(call, cancel));
                results.extend(futures::future::join_all(runs).await);
            }
            start = end;
        }
        results
    }

    /// Whether a call may share a batch with its neighbours: known, read_only, allowed
    /// in the mode and by the allowlist, and allowed outright by the rules.
    pub fn may_run_concurrently(&self, call: &Call) -> bool {
        let Some(tool) = self.registry.get(&call.name) else {
            return false;
        };
        let definition = tool.definition();
        if !definition.safety.is_read_only() {
            return false;
        }
        let args = match parse_arguments(&call.arguments) {
            Ok(args) => args,
            // It will fail validation without asking anyone; still, keep it simple.
            Err(_) => return false,
        };
        if self.not_allowed(definition).is_some() {
            return false;
        }
        matches!(self.decide(definition, &args).verdict, Verdict::Allow)
    }

    /// Runs one call through the whole pipeline and returns its result.
    pub async fn execute_one(&self, call: &Call, cancel: &CancellationToken) -> ToolResult {
        Arc::unwrap_or_clone(self.execute_shared(call.clone(), cancel).await)
    }

    /// [`Session::execute_one`], with the result shared with the `tool_result` event
    /// rather than copied for it (for callers that only serialize it). A question is
    /// put through the session's approval broker and waited for.
    /// The call is taken: hooks may rewrite it, and its arguments are not copied.
    pub async fn execute_shared(&self, call: Call, cancel: &CancellationToken) -> Arc<ToolResult> {
        let started = Instant::now();
        let call_id = call.id.clone();
        let admitted = self.admit(&call_id, cancel).await;
        let cancel = &admitted.cancel;
        let run = std::pin::pin!(async {
            let (call, finished) = match self.policy(call, started, cancel).await {
                Stage::Done(call, finished) => (call, finished),
                Stage::Run(prepared, decision) => {
                    let finished = self.run_prepared(&prepared, decision, cancel).await;
                    (prepared.call, finished)
                }
                Stage::Ask(prepared) => {
                    let finished = match self.ask_inline(&prepared, cancel).await {
                        Ok(decision) => self.run_prepared(&prepared, decision, cancel).await,
                        Err(refused) => refused,
                    };
                    (prepared.call, finished)
                }
            };
            self.complete(&call, started, finished).await
        });
        self.guarded(cancel, run).await
    }

    /// Decides a call without asking anyone: hooks, rules, mode and allowlist. A call
    /// that needs a person comes back as [`Preflight::Ask`], for the caller to put the
    /// question through its own channel and hand the answer to [`Session::resume`]; a
    /// refused call is finished here (events, PostToolUse hooks, audit). Either way
    /// the call is decided once and audited once.
    pub async fn preflight(&self, call: &Call, cancel: &CancellationToken) -> Preflight {
        let started = Instant::now();
        let admitted = self.admit(&call.id, cancel).await;
        let cancel = &admitted.cancel;
        let run = std::pin::pin!(async {
            match self.policy(call.clone(), started, cancel).await {
                Stage::Done(call, finished) => {
                    Preflight::Refuse(self.complete(&call, started, finished).await)
                }
                Stage::Run(prepared, decision) => Preflight::Run(Ready { prepared, decision }),
                Stage::Ask(prepared) => match self.dont_ask(&prepared) {
                    Some(refused) => {
                        Preflight::Refuse(self.complete(&prepared.call, started, refused).await)
                    }
                    None => {
                        let request = self.question(&prepared);
                        Preflight::Ask(Question { prepared, request })
                    }
                },
            }
        });
        self.guarded(cancel, run).await
    }

    /// Runs a call [`Session::preflight`] allowed.
    pub async fn run(&self, ready: Ready, cancel: &CancellationToken) -> Arc<ToolResult> {
        let Ready { prepared, decision } = ready;
        let admitted = self.admit(&prepared.call.id, cancel).await;
        let cancel = &admitted.cancel;
        let run = std::pin::pin!(async {
            let finished = self.run_prepared(&prepared, decision, cancel).await;
            self.complete(&prepared.call, prepared.started, finished).await
        });
        self.guarded(cancel, run).await
    }

    /// Finishes a call that [`Session::preflight`] sent to a person, with the answer
    /// that came back through the caller's channel: an allow runs it (the hooks are
    /// not run again), anything else refuses it. The rules are consulted once more,
    /// so that a deny rule added meanwhile still wins. The question may have been
    /// put by another session of the same face (a stateless client); the call then
    /// runs in this one.
    pub async fn resume(
        &self,
        question: Question,
        answer: ApprovalAnswer,
        cancel: &CancellationToken,
    ) -> Arc<ToolResult> {
        let prepared = question.prepared;
        let admitted = self.admit(&prepared.call.id, cancel).await;
        let cancel = &admitted.cancel;
        let run = std::pin::pin!(async {
            let finished = match self.answered(&prepared, answer) {
                Ok(decision) => self.run_prepared(&prepared, decision, cancel).await,
                Err(refused) => refused,
            };
            self.complete(&prepared.call, prepared.started, finished).await
        });
        self.guarded(cancel, run).await
    }

    /// Waits for room among the session's running calls and registers the call for
    /// `tools/cancel`. A call canceled while it waits goes on without a permit: the
    /// pipeline sees its canceled token at once and closes it like any call.
    async fn admit<'a>(
        &'a self,
        call_id: &'a Arc<str>,
        cancel: &CancellationToken,
    ) -> Admitted<'a> {
        let call_cancel = cancel.child_token();
        let permit = tokio::select! {
            permit = self.limiter.acquire() => permit.ok(),
            () = call_cancel.cancelled() => None,
            () = self.cancel.cancelled() => None,
        };
        let number = self.next_call.fetch_add(1, Ordering::Relaxed);
        self.in_flight.entry(call_id.clone()).or_default().push((number, call_cancel.clone()));
        Admitted {
            cancel: call_cancel,
            _permit: permit,
            _in_flight: InFlightGuard { session: self, call_id, number },
        }
    }

    /// Runs part of a call's pipeline; the call also dies with its session, whatever
    /// token the caller passed.
    ///
    /// `run` comes pinned where the caller made it: a future taken by value would be
    /// held twice in this one's state (an `async fn` keeps its arguments), and the
    /// pipeline's future is the largest part of a call's.
    async fn guarded<T>(
        &self,
        cancel: &CancellationToken,
        mut run: Pin<&mut impl Future<Output = T>>,
    ) -> T {
        tokio::select! {
            out = run.as_mut() => out,
            () = self.cancel.cancelled() => {
                cancel.cancel();
                run.await
            }
        }
    }

    /// Emits the closing events of a call and records it (once per call).
    async fn complete(&self, call: &Call, started: Instant, finished: Finished) -> Arc<ToolResult> {
        let hooks = self.lock().hooks.clone();
        let Finished { result, decision, arguments } = finished;
        let result = result.stamp(&call.name, &call.id);
        // Boxed, like the PreToolUse hooks: only calls that have hooks pay for them.
        let result = if hooks.has_post(&call.name) {
            Box::pin(self.post_hooks(call, &hooks, result, &arguments)).await
        } else {
            result
        };
        let elapsed = started.elapsed();
        let elapsed_ms = elapsed.as_secs_f64() * 1000.0;
        let result = Arc::new(result);
        self.events.emit(Event::ToolResult {
            session_id: self.id.clone(),
            call_id: call.id.clone(),
            elapsed_ms,
            result: result.clone(),
        });
        // The record's copy of the decision only when there is a record.
        let recorded = self.observer.as_ref().map(|observer| (observer, decision.clone()));
        self.events.emit(Event::ToolCallDone {
            session_id: self.id.clone(),
            call_id: call.id.clone(),
            elapsed_ms,
            decision,
        });
        if let Some((observer, decision)) = recorded {
            observer.call_finished(CallRecord {
                session_id: self.id.clone(),
                client: self.client.clone(),
                call_id: call.id.clone(),
                tool: call.name.clone(),
                arguments,
                decision,
                result_ok: result.ok,
                error_type: result.error_type,
                elapsed,
                sandbox: result
                    .metadata
                    .get("sandbox_profile")
                    .or_else(|| result.metadata.get("sandbox"))
                    .cloned(),
            });
        }
        result
    }

    /// `tool_call_start`, PreToolUse hooks, allowlist, mode and rules: what happens to
    /// the call short of asking a person.
    async fn policy(&self, mut call: Call, started: Instant, cancel: &CancellationToken) -> Stage {
        let hooks = self.lock().hooks.clone();
        let env = self.env();
        let mut arguments = Arc::new(parse_or_raw(&call.arguments));
        self.events.emit(Event::ToolCallStart {
            session_id: self.id.clone(),
            call_id: call.id.clone(),
            name: call.name.clone(),
            arguments: arguments.clone(),
        });

        // PreToolUse hooks.
        let mut hook_verdict = HookVerdict::Continue;
        if hooks.has_pre(&call.name) {
            let input = ToolCallInput::new(&env, &*call.id, &*call.name, Value::clone(&arguments))
                .with_permission_mode(self.mode().to_string());
            // Boxed: hooks are rare, and their future would otherwise make every call's
            // larger (and costlier to move) for the few that have them.
            let outcome = Box::pin(hooks.run_pre(&input, &env.env_policy.build(), cancel)).await;
            for error in &outcome.errors {
                tracing::warn!(session = %self.id, call_id = %call.id, %error, "PreToolUse hook failed");
            }
            if let Some(updated) = outcome.updated_input {
                let text = updated.to_string();
                if let Err(res) = self.registry.validate_arguments(&call.name, &text) {
                    let result = res.with_meta("source", "hook_updated_input");
                    let decision = CallDecision::new(Outcome::Deny, DecidedBy::Hook);
                    let arguments = Arc::new(updated);
                    return Stage::Done(call, Finished { result, decision, arguments });
                }
                call.arguments = text;
                arguments = Arc::new(updated);
            }
            match outcome.verdict {
                HookVerdict::Block | HookVerdict::Deny => {
                    let reason = outcome.reason.unwrap_or_else(|| {
                        "a PreToolUse hook refused the call without saying why".to_owned()
                    });
                    let result = ToolResult::failure(ErrorType::HookBlocked, reason);
                    let decision = CallDecision::new(Outcome::Deny, DecidedBy::Hook);
                    return Stage::Done(call, Finished { result, decision, arguments });
                }
                other => hook_verdict = other,
            }
        }

        // Permission (unknown tools go straight to the registry, which names them).
        let Some(tool) = self.registry.get(&call.name) else {
            let decision = CallDecision::new(Outcome::Allow, DecidedBy::Registry);
            let prepared = Prepared { call, arguments, started, decision: None };
            return Stage::Run(prepared, decision);
        };
        let definition = tool.definition();
        if let Some((result, decision)) = self.not_allowed(definition) {
            return Stage::Done(call, Finished { result, decision, arguments });
        }
        let decision = self.decide(definition, &arguments);
        let verdict = decision.verdict;
        let refuse = |error_type, decision: &Decision| {
            let result = ToolResult::failure(error_type, decision.explanation.reason.clone());
            (result, CallDecision::of(Outcome::Deny, &decision.explanation))
        };
        match verdict {
            Verdict::Deny => {
                let (result, decision) = refuse(ErrorType::PermissionDenied, &decision);
                Stage::Done(call, Finished { result, decision, arguments })
            }
            Verdict::NotAllowedInMode => {
                let (result, decision) = refuse(ErrorType::ToolNotAllowed, &decision);
                Stage::Done(call, Finished { result, decision, arguments })
            }
            Verdict::Allow if hook_verdict != HookVerdict::Ask => {
                let decided = CallDecision::of(Outcome::Allow, &decision.explanation);
                let prepared = Prepared { call, arguments, started, decision: Some(decision) };
                Stage::Run(prepared, decided)
            }
            // A hook's allow skips the question, never a deny rule.
            Verdict::Ask if hook_verdict == HookVerdict::Allow => {
                let decided = CallDecision::new(Outcome::Allow, DecidedBy::Hook)
                    .explained(&hook_explanation("allowed by a PreToolUse hook"));
                let prepared = Prepared { call, arguments, started, decision: Some(decision) };
                Stage::Run(prepared, decided)
            }
            // The rules ask, or a hook makes an allowed call ask.
            Verdict::Ask | Verdict::Allow => {
                Stage::Ask(Prepared { call, arguments, started, decision: Some(decision) })
            }
        }
    }

    /// The refusal of a call that must ask while the session is in `dont_ask` mode.
    fn dont_ask(&self, prepared: &Prepared) -> Option<Finished> {
        if self.mode() != Mode::DontAsk {
            return None;
        }
        let suggestions = match &prepared.decision {
            Some(decision) if decision.verdict == Verdict::Ask => suggest(&decision.suggestions),
            _ => String::new(),
        };
        let reason = format!(
            "{} requires approval and the session is in dont_ask mode{suggestions}",
            prepared.call.name,
        );
        let mut decision = self.asked_decision(prepared, Outcome::Deny, DecidedBy::Mode);
        decision.asked = false;
        Some(Finished {
            result: ToolResult::failure(ErrorType::PermissionDenied, reason),
            decision,
            arguments: prepared.arguments.clone(),
        })
    }

    /// The question for a call that must ask.
    fn question(&self, prepared: &Prepared) -> PermissionRequest {
        let (explanation, suggestions) = match &prepared.decision {
            Some(decision) if decision.verdict == Verdict::Ask => {
                (decision.explanation.clone(), decision.suggestions.clone())
            }
            _ => (hook_explanation(HOOK_ASKS), Vec::new()),
        };
        let session_grant = shown_grant(prepared).map(|grant| grant.description().to_owned());
        PermissionRequest {
            session_id: self.id.to_string(),
            request_id: format!(
                "p-{}-{}",
                self.id,
                self.next_request.fetch_add(1, Ordering::Relaxed)
            ),
            call_id: prepared.call.id.clone(),
            tool: prepared.call.name.to_string(),
            arguments: Value::clone(&prepared.arguments),
            explanation,
            suggestions,
            session_grant,
            kind: RequestKind::RunTool,
        }
    }

    /// Re-checks right before execution (the mode may have changed while a person was
    /// deciding, and a forged call must never slip through), then runs the tool.
    async fn run_prepared(
        &self,
        prepared: &Prepared,
        decision: CallDecision,
        cancel: &CancellationToken,
    ) -> Finished {
        let call = &prepared.call;
        if let Some(tool) = self.registry.get(&call.name)
            && let Some((result, refused)) = self.not_allowed(tool.definition())
        {
            return Finished { result, decision: refused, arguments: prepared.arguments.clone() };
        }
        let sink = self.output_sink(&call.id);
        let env = self.env();
        // The admitted token is this call's own: the tool gets it, not a child of it.
        let result = self.registry.execute_owned(call, &env, cancel.clone(), sink).await;
        Finished { result, decision, arguments: prepared.arguments.clone() }
    }

    /// Runs the call's PostToolUse hooks (they see every outcome, blocks and denials
    /// included) on the stamped result and attaches their feedback.
    async fn post_hooks(
        &self,
        call: &Call,
        hooks: &Hooks,
        mut res: ToolResult,
        arguments: &Value,
    ) -> ToolResult {
        let env = self.env();
        let input = ToolCallInput::new(&env, &*call.id, &*call.name, Value::clone(arguments))
            .with_permission_mode(self.mode().to_string());
        // Post hooks run for a canceled call too (they observe every outcome), so they
        // are bounded by their own timeouts and by the session, not the call.
        let outcome = hooks.run_post(&input, &res, &env.env_policy.build(), &self.cancel).await;
        for error in &outcome.errors {
            tracing::warn!(session = %self.id, call_id = %call.id, %error, "PostToolUse hook failed");
        }
        if let Some(feedback) = outcome.feedback {
            res.metadata.insert("hook_feedback", Value::String(feedback));
        }
        res
    }

    /// `Some` (the refusal and what decided it) when the allowlist or the mode rules
    /// the tool out.
    fn not_allowed(&self, definition: &Definition) -> Option<(ToolResult, CallDecision)> {
        if definition.system {
            return None;
        }
        let state = self.lock();
        if !state.allowlist.is_empty()
            && !state.allowlist.iter().any(|name| name == &definition.name)
        {
            return Some((
                ToolResult::failure(
                    ErrorType::ToolNotAllowed,
                    format!("{} is not in this session's tool allowlist", definition.name),
                ),
                CallDecision::new(Outcome::Deny, DecidedBy::Allowlist),
            ));
        }
        if state.engine.mode() == Mode::Plan && !definition.safety.is_read_only() {
            return Some((
                ToolResult::failure(
                    ErrorType::ToolNotAllowed,
                    format!(
                        "{} has side effects and the session is in plan mode; call \
                         exit_plan_mode first",
                        definition.name
                    ),
                ),
                CallDecision::new(Outcome::Deny, DecidedBy::Mode),
            ));
        }
        None
    }

    fn decide(&self, definition: &Definition, args: &Value) -> Decision {
        // A clone is a few Arc bumps; deciding outside the lock keeps it short.
        let engine = self.lock().engine.clone();
        let env = self.env();
        let ctx = CallContext::of(&env);
        let facts = ToolFacts::of(definition);
        // What a background process will read is judged, not the bytes of one write:
        // the line typed before it and, on a terminal, its line editing.
        if definition.name == crate::tools::builtin::process_tools::WRITE
            && !definition.system
            && let Some(typed) = self.typed_input(args)
        {
            return match typed {
                Ok(text) => {
                    let mut judged = args.clone();
                    judged["input"] = Value::String(text);
                    engine.decide(&facts, &judged, &ctx)
                }
                Err(unmodelled) => {
                    engine.decide_unmodelled_input(&facts, args, &ctx, &unmodelled.0)
                }
            };
        }
        if definition.name == crate::tools::builtin::process_tools::KILL && !definition.system {
            let started_here = self.names_own_process(args);
            return engine.decide_process_kill(&facts, args, &ctx, started_here);
        }
        engine.decide(&facts, args, &ctx)
    }

    /// Whether a call's `id` names one of this session's background processes.
    fn names_own_process(&self, args: &Value) -> bool {
        let id = args.get("id").and_then(Value::as_str);
        id.is_some_and(|id| self.processes().is_some_and(|processes| processes.get(id).is_some()))
    }

    /// The text a `process_write` call would have its process read, if it names one
    /// of the session's running processes.
    fn typed_input(
        &self,
        args: &Value,
    ) -> Option<Result<String, crate::tools::jobs::typed::Unmodelled>> {
        let id = args.get("id")?.as_str()?;
        let input = args.get("input")?.as_str()?;
        let job = self.processes()?.get(id)?;
        Some(job.typed(input).map(|typed| typed.text()))
    }

    /// Puts the question through the session's broker and waits, bounded by the
    /// approval timeout and the call's cancellation. `Ok` = allowed; `Err` = refused.
    async fn ask_inline(
        &self,
        prepared: &Prepared,
        cancel: &CancellationToken,
    ) -> Result<CallDecision, Finished> {
        if let Some(refused) = self.dont_ask(prepared) {
            return Err(refused);
        }
        let refuse = |error_type, reason: String, decided_by| {
            let decision = self.asked_decision(prepared, Outcome::Deny, decided_by);
            Finished {
                result: ToolResult::failure(error_type, reason),
                decision,
                arguments: prepared.arguments.clone(),
            }
        };
        let canceled = "the call was canceled while waiting for approval";
        // One question at a time per session.
        let _gate = tokio::select! {
            gate = self.ask_gate.lock() => gate,
            () = cancel.cancelled() => {
                return Err(refuse(ErrorType::PermissionCanceled, canceled.to_owned(), DecidedBy::Canceled));
            }
        };
        // A session grant given while we waited for the gate may settle it now (unless
        // a hook made the call ask: then no grant settles it).
        if let Some(decision) = &prepared.decision
            && decision.verdict == Verdict::Ask
            && let Some(tool) = self.registry.get(&prepared.call.name)
        {
            let fresh = self.decide(tool.definition(), &prepared.arguments);
            if fresh.verdict == Verdict::Allow {
                return Ok(CallDecision::of(Outcome::Allow, &fresh.explanation));
            }
        }

        let request = self.question(prepared);
        let suggestions = suggest(&request.suggestions);
        let name = &prepared.call.name;
        match self.put_question(&request, cancel).await {
            Asked::Answer(answer) => self.answered(prepared, answer),
            Asked::TimedOut => Err(refuse(
                ErrorType::PermissionDenied,
                format!(
                    "no answer to the approval request within {} s{suggestions}",
                    self.approval_timeout.as_secs(),
                ),
                DecidedBy::Timeout,
            )),
            Asked::Canceled => {
                Err(refuse(ErrorType::PermissionCanceled, canceled.to_owned(), DecidedBy::Canceled))
            }
            Asked::Unavailable(why) => Err(refuse(
                ErrorType::PermissionDenied,
                format!("{name} requires approval; {why}{suggestions}"),
                DecidedBy::Unavailable,
            )),
        }
    }

    /// Applies a person's answer: an allow for the session is remembered as a grant.
    /// A rule that now denies the call (or the mode) still wins over an allow.
    fn answered(
        &self,
        prepared: &Prepared,
        answer: ApprovalAnswer,
    ) -> Result<CallDecision, Finished> {
        let name = &prepared.call.name;
        let tool = self.registry.get(name);
        if let Some(tool) = &tool {
            let fresh = self.decide(tool.definition(), &prepared.arguments);
            let error_type = match fresh.verdict {
                Verdict::Deny => Some(ErrorType::PermissionDenied),
                Verdict::NotAllowedInMode => Some(ErrorType::ToolNotAllowed),
                Verdict::Allow | Verdict::Ask => None,
            };
            if let Some(error_type) = error_type {
                return Err(Finished {
                    result: ToolResult::failure(error_type, fresh.explanation.reason.clone()),
                    decision: CallDecision::of(Outcome::Deny, &fresh.explanation),
                    arguments: prepared.arguments.clone(),
                });
            }
        }
        match answer {
            ApprovalAnswer { decision: ApprovalDecision::Allow, scope, .. } => {
                if scope == ApprovalScope::Session
                    && let Some(grant) = shown_grant(prepared)
                {
                    self.grant_for_session(grant);
                }
                Ok(self.asked_decision(prepared, Outcome::Allow, DecidedBy::Person))
            }
            ApprovalAnswer { decision: ApprovalDecision::Deny, reason, .. } => {
                let reason = reason.unwrap_or_else(|| format!("the user denied {name}"));
                Err(Finished {
                    result: ToolResult::failure(ErrorType::PermissionDenied, reason),
                    decision: self.asked_decision(prepared, Outcome::Deny, DecidedBy::Person),
                    arguments: prepared.arguments.clone(),
                })
            }
        }
    }

    /// The decision about a call that asked, with the rule or layer that made it ask.
    fn asked_decision(
        &self,
        prepared: &Prepared,
        outcome: Outcome,
        decided_by: DecidedBy,
    ) -> CallDecision {
        let decision = CallDecision::new(outcome, decided_by).asked();
        match &prepared.decision {
            Some(engine) if engine.verdict == Verdict::Ask => {
                decision.explained(&engine.explanation)
            }
            _ => decision.explained(&hook_explanation(HOOK_ASKS)),
        }
    }

    /// Remembers an "allow for this session" answer: exactly the grant the request
    /// showed (the suggested rules, else this exact call). Without one, the answer
    /// allows this call once.
    fn grant_for_session(&self, grant: &SessionGrant) {
        if let Err(err) = self.lock().engine.add_session_grant(grant) {
            tracing::warn!(session = %self.id, %err, "could not record a session grant");
        }
    }

    /// Registers a question with the broker, announces it, and waits for the answer,
    /// the approval timeout or cancellation; announces how it was resolved.
    async fn put_question(&self, request: &PermissionRequest, cancel: &CancellationToken) -> Asked {
        let pending = match self.approvals.begin(request) {
            Ok(pending) => pending,
            Err(Unavailable::NoApprover) => {
                return Asked::Unavailable("no approver is connected".to_owned());
            }
            Err(Unavailable::Other(why)) => return Asked::Unavailable(why),
        };
        self.events.emit(Event::PermissionRequest {
            session_id: self.id.clone(),
            request_id: request.request_id.clone(),
            call_id: request.call_id.clone(),
            tool: request.tool.clone(),
            arguments: request.arguments.clone(),
            explanation: request.explanation.clone(),
            suggestions: request.suggestions.clone(),
            session_grant: request.session_grant.clone(),
        });
        let asked = tokio::select! {
            answer = pending => Asked::Answer(answer),
            () = tokio::time::sleep(self.approval_timeout) => Asked::TimedOut,
            () = cancel.cancelled() => Asked::Canceled,
        };
        let (decision, scope, reason) = match &asked {
            Asked::Answer(answer) => (answer.decision, answer.scope, answer.reason.clone()),
            Asked::TimedOut => {
                (ApprovalDecision::Deny, ApprovalScope::Once, Some("timeout".to_owned()))
            }
            Asked::Canceled => {
                (ApprovalDecision::Deny, ApprovalScope::Once, Some("canceled".to_owned()))
            }
            Asked::Unavailable(why) => {
                (ApprovalDecision::Deny, ApprovalScope::Once, Some(why.clone()))
            }
        };
        self.events.emit(Event::PermissionResolved {
            session_id: self.id.clone(),
            request_id: request.request_id.clone(),
            call_id: request.call_id.clone(),
            decision,
            scope,
            reason,
        });
        asked
    }

    /// Numbers live output chunks and turns them into `tool_output` events.
    fn output_sink(&self, call_id: &Arc<str>) -> OutputSink {
        let events = self.events.clone();
        let session_id = self.id.clone();
        let call_id = call_id.clone();
        let seq = AtomicU64::new(0);
        OutputSink::new(move |stream, text| {
            events.emit(Event::ToolOutput {
                session_id: session_id.clone(),
                call_id: call_id.clone(),
                seq: seq.fetch_add(1, Ordering::Relaxed),
                stream,
                text: text.to_owned(),
                process_id: None,
                offset: None,
            });
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Mutable> {
        // Every critical section is a few field reads or writes; a poisoned lock can
        // only come from a panic between them and leaves the fields consistent.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Turns a session's process output and ends into its events.
struct ProcessEvents {
    session_id: Arc<str>,
    events: Arc<dyn EventSink>,
}

impl ProcessObserver for ProcessEvents {
    fn output(&self, process: &Job, seq: u64, offset: u64, stream: OutputStream, text: &str) {
        self.events.emit(Event::ToolOutput {
            session_id: self.session_id.clone(),
            call_id: process.call_id.clone(),
            seq,
            stream,
            text: text.to_owned(),
            process_id: Some(process.id.clone()),
            offset: Some(offset),
        });
    }

    fn exited(&self, process: &Job, exit: &Exit) {
        let (exit_code, signal) = match exit.status {
            Some(ExitStatus::Code(code)) => (Some(code), None),
            Some(ExitStatus::Signal(signal)) => (None, Some(signal)),
            None => (None, None),
        };
        self.events.emit(Event::ProcessExited {
            session_id: self.session_id.clone(),
            process_id: process.id.clone(),
            call_id: process.call_id.clone(),
            exit_code,
            signal,
            runtime_ms: u64::try_from(exit.runtime.as_millis()).unwrap_or(u64::MAX),
            output_bytes: process.output_bytes(),
            killed: exit.killed.clone(),
            error: exit.error.clone(),
        });
    }
}

#[async_trait::async_trait]
impl SessionControl for Session {
    fn processes(&self) -> Option<Arc<Processes>> {
        self.processes.get().cloned()
    }

    fn set_todos(&self, todos: Vec<Todo>) {
        self.lock().todos = todos.clone();
        self.events.emit(Event::TodosUpdated { session_id: self.id.clone(), todos });
    }

    async fn request_exit_plan_mode(
        &self,
        call_id: &str,
        plan: &str,
        cancel: &CancellationToken,
    ) -> Result<(), String> {
        if self.mode() != Mode::Plan {
            return Err("the session is not in plan mode".to_owned());
        }
        if !Mode::Default.is_at_most(self.mode_ceiling()) {
            return Err("the configuration keeps this session in plan mode".to_owned());
        }
        let _gate = tokio::select! {
            gate = self.ask_gate.lock() => gate,
            () = cancel.cancelled() => return Err("canceled while waiting for approval".to_owned()),
        };
        let request = PermissionRequest {
            session_id: self.id.to_string(),
            request_id: format!(
                "p-{}-{}",
                self.id,
                self.next_request.fetch_add(1, Ordering::Relaxed)
            ),
            call_id: call_id.into(),
            tool: "exit_plan_mode".to_owned(),
            arguments: serde_json::json!({ "plan": plan }),
            explanation: Explanation {
                layer: Layer::Mode,
                rule: None,
                list: None,
                reason: "leaving plan mode needs the user's approval".to_owned(),
            },
            suggestions: Vec::new(),
            session_grant: None,
            kind: RequestKind::ExitPlanMode,
        };
        match self.put_question(&request, cancel).await {
            Asked::Answer(ApprovalAnswer { decision: ApprovalDecision::Allow, .. }) => {
                self.set_mode(Mode::Default);
                Ok(())
            }
            Asked::Answer(ApprovalAnswer { reason, .. }) => {
                Err(reason.unwrap_or_else(|| "the user rejected the plan".to_owned()))
            }
            Asked::TimedOut => Err("no answer to the plan within the approval timeout".to_owned()),
            Asked::Canceled => Err("canceled while waiting for approval".to_owned()),
            Asked::Unavailable(why) => Err(format!("cannot leave plan mode: {why}")),
        }
    }
}

enum Asked {
    Answer(ApprovalAnswer),
    TimedOut,
    Canceled,
    Unavailable(String),
}

/// Removes a call's token from the in-flight map when the call ends, however it ends.
struct InFlightGuard<'a> {
    session: &'a Session,
    call_id: &'a str,
    number: u64,
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        let now_empty = match self.session.in_flight.get_mut(self.call_id) {
            Some(mut tokens) => {
                tokens.retain(|(number, _)| *number != self.number);
                tokens.is_empty()
            }
            None => false,
        };
        if now_empty {
            self.session.in_flight.remove_if(self.call_id, |_, tokens| tokens.is_empty());
        }
    }
}

/// `Ok` when `asked` is no wider than `current` (empty = every tool).
fn narrower(current: &[String], asked: &[String]) -> Result<(), String> {
    if current.is_empty() {
        return Ok(());
    }
    if asked.is_empty() || asked.iter().any(|name| !current.contains(name)) {
        return Err("an allowlist can only be narrowed, not widened".to_owned());
    }
    Ok(())
}

fn verdict_name(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Allow => "allow",
        Verdict::Ask => "ask",
        Verdict::Deny => "deny",
        Verdict::NotAllowedInMode => "not_allowed",
    }
}

fn suggest(suggestions: &[String]) -> String {
    match suggestions.first() {
        Some(rule) => format!(" (add an allow rule such as {rule})"),
        None => String::new(),
    }
}

/// The arguments as hooks, the rules, events and the audit log see them: parsed (by
/// the registry's own parser, under its memory budget), else the raw text.
fn parse_or_raw(arguments: &str) -> Value {
    parse_arguments(arguments).unwrap_or_else(|_| Value::String(arguments.to_owned()))
}

/// The session grant a question offers: the one the rules' decision carries when the
/// rules asked (a hook's question offers none, so its answer allows the call once).
fn shown_grant(prepared: &Prepared) -> Option<&SessionGrant> {
    prepared
        .decision
        .as_ref()
        .filter(|decision| decision.verdict == Verdict::Ask)
        .and_then(|decision| decision.grant.as_ref())
}
