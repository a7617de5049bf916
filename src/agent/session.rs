//! A session: the Env, mode, rules, grants, hooks, in-flight calls and approvals of one
//! client conversation, and the pipeline that runs its calls.

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
use crate::hooks::{HookVerdict, Hooks, ToolCallInput};
use crate::permission::{
    CallContext, Decision, Explanation, Layer, Mode, PermissionEngine, Policy, ToolFacts, Verdict,
};
use crate::tools::{
    Call, Control, Definition, Env, ErrorType, OutputSink, Registry, SessionControl, Todo,
    ToolResult,
};

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
    pub session_id: String,
    pub client: String,
    pub call_id: String,
    pub tool: String,
    pub arguments: Value,
    /// `allow`, `deny`, `ask→allow`, `ask→deny`, `hook_blocked`, `not_allowed`.
    pub decision: String,
    /// The layer and rule that decided.
    pub explanation: Option<Explanation>,
    pub result_ok: bool,
    pub error_type: Option<ErrorType>,
    pub elapsed: Duration,
}

pub trait CallObserver: Send + Sync {
    fn call_finished(&self, record: &CallRecord);
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
    id: String,
    client: String,
    registry: Arc<Registry>,
    env: Arc<Env>,
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
    in_flight: DashMap<String, Vec<(u64, CancellationToken)>>,
    next_call: AtomicU64,
    next_request: AtomicU64,
}

/// What the policy stage concluded about one call.
struct Verdicts {
    decision: String,
    explanation: Option<Explanation>,
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
                id: options.id,
                client: options.client,
                registry,
                env: Arc::new(env),
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
            }
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn env(&self) -> &Arc<Env> {
        &self.env
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

    /// Narrows the allowlist (a client may narrow, never widen).
    pub fn set_allowlist(&self, allowlist: Vec<String>) {
        self.lock().allowlist = allowlist;
    }

    /// Swaps rules, the mode ceiling and hooks (configuration reload); session
    /// grants survive and the mode is re-capped by the new ceiling.
    pub fn reload(&self, policy: Policy, configured: Mode, hooks: Arc<Hooks>) {
        let mut state = self.lock();
        state.engine.reload(policy, configured);
        state.hooks = hooks;
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

    /// Ends the session: every call canceled, processes killed, approvals dropped.
    pub fn close(&self) {
        self.cancel.cancel();
    }

    /// Explains, without running anything, which layer and rule would decide a call.
    pub fn explain(&self, call: &Call) -> (String, Option<Explanation>) {
        let (verdict, explanation, _) = self.explain_layers(call);
        (verdict, explanation)
    }

    /// Like [`Session::explain`], with the sentence of every layer consulted, in the
    /// pipeline's order: the permission engine, then confinement of the call's paths
    /// (which refuses what the permission engine would let through).
    pub fn explain_layers(&self, call: &Call) -> (String, Option<Explanation>, Vec<Explanation>) {
        let Some(tool) = self.registry.get(&call.name) else {
            return ("unknown_tool".to_owned(), None, Vec::new());
        };
        let args = serde_json::from_str(&call.arguments).unwrap_or(Value::Null);
        let decision = self.decide(tool.definition(), &args);
        let mut verdict = verdict_name(&decision.verdict).to_owned();
        let mut deciding = decision.explanation.clone();
        let mut layers = vec![decision.explanation];
        if let Some((refused, explanation)) =
            super::confinement::check(&call.name, &args, &self.env)
        {
            if refused && decision.verdict != Verdict::Deny {
                verdict = "deny".to_owned();
                deciding = explanation.clone();
            }
            layers.push(explanation);
        }
        (verdict, Some(deciding), layers)
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
        let args = match serde_json::from_str::<Value>(&call.arguments) {
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
        Arc::unwrap_or_clone(self.execute_shared(call, cancel).await)
    }

    /// [`Session::execute_one`], with the result shared with the `tool_result` event
    /// rather than copied for it (for callers that only serialize it).
    pub async fn execute_shared(&self, call: &Call, cancel: &CancellationToken) -> Arc<ToolResult> {
        let started = Instant::now();
        let call_cancel = cancel.child_token();
        // A call also dies with its session.
        let session_cancel = self.cancel.clone();
        let _permit = tokio::select! {
            permit = self.limiter.acquire() => permit.ok(),
            () = call_cancel.cancelled() => None,
            () = session_cancel.cancelled() => None,
        };
        let call_number = self.next_call.fetch_add(1, Ordering::Relaxed);
        self.in_flight.entry(call.id.clone()).or_default().push((call_number, call_cancel.clone()));
        let _in_flight = InFlightGuard { session: self, call_id: &call.id, number: call_number };

        let arguments_value = parse_or_raw(&call.arguments);
        self.events.emit(Event::ToolCallStart {
            session_id: self.id.clone(),
            call_id: call.id.clone(),
            name: call.name.clone(),
            arguments: arguments_value.clone(),
        });

        // The call also dies with its session, whatever token the caller passed.
        let pipeline = self.run_pipeline(call, arguments_value, &call_cancel);
        tokio::pin!(pipeline);
        let (result, verdicts, final_arguments) = tokio::select! {
            out = &mut pipeline => out,
            () = session_cancel.cancelled() => {
                call_cancel.cancel();
                pipeline.await
            }
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
        self.events.emit(Event::ToolCallDone {
            session_id: self.id.clone(),
            call_id: call.id.clone(),
            elapsed_ms,
        });
        if let Some(observer) = &self.observer {
            observer.call_finished(&CallRecord {
                session_id: self.id.clone(),
                client: self.client.clone(),
                call_id: call.id.clone(),
                tool: call.name.clone(),
                arguments: final_arguments,
                decision: verdicts.decision,
                explanation: verdicts.explanation,
                result_ok: result.ok,
                error_type: result.error_type,
                elapsed,
            });
        }
        result
    }

    /// Hooks, permission, re-check, registry, post hooks. Returns the stamped result,
    /// what decided, and the arguments that finally ran (after a hook's update).
    async fn run_pipeline(
        &self,
        call: &Call,
        arguments_value: Value,
        cancel: &CancellationToken,
    ) -> (ToolResult, Verdicts, Value) {
        let hooks = self.lock().hooks.clone();
        let mut call = call.clone();
        let mut arguments_value = arguments_value;

        // PreToolUse hooks.
        let mut hook_verdict = HookVerdict::Continue;
        if hooks.has_pre(&call.name) {
            let input = ToolCallInput::new(
                &self.env,
                call.id.clone(),
                call.name.clone(),
                arguments_value.clone(),
            )
            .with_permission_mode(self.mode().to_string());
            let outcome = hooks.run_pre(&input, &self.env.env_policy.build(), cancel).await;
            for error in &outcome.errors {
                tracing::warn!(session = %self.id, call_id = %call.id, %error, "PreToolUse hook failed");
            }
            if let Some(updated) = outcome.updated_input {
                let text = updated.to_string();
                if let Err(res) = self.registry.validate_arguments(&call.name, &text) {
                    let res = res.with_meta("source", "hook_updated_input");
                    return self
                        .finish(
                            &call,
                            &hooks,
                            res,
                            verdict("hook_invalid_input", None),
                            updated,
                            cancel,
                        )
                        .await;
                }
                call.arguments = text;
                arguments_value = updated;
            }
            match outcome.verdict {
                HookVerdict::Block | HookVerdict::Deny => {
                    let reason = outcome.reason.unwrap_or_else(|| "blocked by a hook".to_owned());
                    let res = ToolResult::failure(ErrorType::HookBlocked, reason);
                    return self
                        .finish(
                            &call,
                            &hooks,
                            res,
                            verdict("hook_blocked", None),
                            arguments_value,
                            cancel,
                        )
                        .await;
                }
                other => hook_verdict = other,
            }
        }

        // Permission (unknown tools go straight to the registry, which names them).
        let mut verdicts = verdict("allow", None);
        if let Some(tool) = self.registry.get(&call.name) {
            let definition = tool.definition();
            if let Some(res) = self.not_allowed(definition) {
                return self
                    .finish(
                        &call,
                        &hooks,
                        res,
                        verdict("not_allowed", None),
                        arguments_value,
                        cancel,
                    )
                    .await;
            }
            let decision = self.decide(definition, &arguments_value);
            let explanation = decision.explanation.clone();
            let outcome = match decision.verdict {
                Verdict::Allow if hook_verdict == HookVerdict::Ask => {
                    self.ask(&call, definition, &arguments_value, decision, cancel).await
                }
                Verdict::Allow => Ok(verdict("allow", Some(explanation))),
                Verdict::Deny => Err((
                    ToolResult::failure(ErrorType::PermissionDenied, explanation.reason.clone()),
                    verdict("deny", Some(explanation)),
                )),
                Verdict::NotAllowedInMode => Err((
                    ToolResult::failure(ErrorType::ToolNotAllowed, explanation.reason.clone()),
                    verdict("not_allowed", Some(explanation)),
                )),
                // A hook's allow skips the question, never a deny rule.
                Verdict::Ask if hook_verdict == HookVerdict::Allow => Ok(verdict(
                    "allow",
                    Some(Explanation {
                        layer: Layer::Hook,
                        rule: None,
                        list: None,
                        reason: "allowed by a PreToolUse hook".to_owned(),
                    }),
                )),
                Verdict::Ask => {
                    self.ask(&call, definition, &arguments_value, decision, cancel).await
                }
            };
            match outcome {
                Ok(allowed) => verdicts = allowed,
                Err((res, denied)) => {
                    return self.finish(&call, &hooks, res, denied, arguments_value, cancel).await;
                }
            }

            // Re-check right before execution: the mode may have changed while a
            // person was deciding, and a forged call must never slip through.
            if let Some(res) = self.not_allowed(definition) {
                return self
                    .finish(
                        &call,
                        &hooks,
                        res,
                        verdict("not_allowed", None),
                        arguments_value,
                        cancel,
                    )
                    .await;
            }
        }

        let sink = self.output_sink(&call.id);
        let res = self.registry.execute_streaming(&call, &self.env, cancel, sink).await;
        self.finish(&call, &hooks, res, verdicts, arguments_value, cancel).await
    }

    /// Stamps the result, runs the PostToolUse hooks (they see every outcome, blocks
    /// and denials included) and attaches their feedback.
    async fn finish(
        &self,
        call: &Call,
        hooks: &Hooks,
        res: ToolResult,
        verdicts: Verdicts,
        arguments: Value,
        cancel: &CancellationToken,
    ) -> (ToolResult, Verdicts, Value) {
        let mut res = res.stamp(&call.name, &call.id);
        if hooks.has_post(&call.name) {
            let input = ToolCallInput::new(
                &self.env,
                call.id.clone(),
                call.name.clone(),
                arguments.clone(),
            )
            .with_permission_mode(self.mode().to_string());
            // Post hooks run for a canceled call too (they observe every outcome), so
            // they are bounded by their own timeouts and by the session, not the call.
            let _ = cancel;
            let outcome =
                hooks.run_post(&input, &res, &self.env.env_policy.build(), &self.cancel).await;
            for error in &outcome.errors {
                tracing::warn!(session = %self.id, call_id = %call.id, %error, "PostToolUse hook failed");
            }
            if let Some(feedback) = outcome.feedback {
                res.metadata.insert("hook_feedback".to_owned(), Value::String(feedback));
            }
        }
        (res, verdicts, arguments)
    }

    /// `Some(tool_not_allowed)` when the allowlist or the mode rules the tool out.
    fn not_allowed(&self, definition: &Definition) -> Option<ToolResult> {
        if definition.system {
            return None;
        }
        let state = self.lock();
        if !state.allowlist.is_empty()
            && !state.allowlist.iter().any(|name| name == &definition.name)
        {
            return Some(ToolResult::failure(
                ErrorType::ToolNotAllowed,
                format!("{} is not in this session's tool allowlist", definition.name),
            ));
        }
        if state.engine.mode() == Mode::Plan && !definition.safety.is_read_only() {
            return Some(ToolResult::failure(
                ErrorType::ToolNotAllowed,
                format!(
                    "{} has side effects and the session is in plan mode; call exit_plan_mode \
                     first",
                    definition.name
                ),
            ));
        }
        None
    }

    fn decide(&self, definition: &Definition, args: &Value) -> Decision {
        // A clone is a few Arc bumps; deciding outside the lock keeps it short.
        let engine = self.lock().engine.clone();
        engine.decide(&ToolFacts::of(definition), args, &CallContext::of(&self.env))
    }

    /// Puts a question to the approver and waits, bounded by the approval timeout and
    /// the call's cancellation. `Ok` = allowed; `Err` = the result to return.
    async fn ask(
        &self,
        call: &Call,
        definition: &Definition,
        arguments: &Value,
        decision: Decision,
        cancel: &CancellationToken,
    ) -> Result<Verdicts, (ToolResult, Verdicts)> {
        // A hook can make an allowed call ask; then no later grant settles it.
        let asked_by_rules = decision.verdict == Verdict::Ask;
        let suggestions = decision.suggestions;
        let explanation = decision.explanation;
        if self.mode() == Mode::DontAsk {
            let reason = format!(
                "{} requires approval and the session is in dont_ask mode{}",
                definition.name,
                suggest(&suggestions)
            );
            return Err((
                ToolResult::failure(ErrorType::PermissionDenied, reason),
                verdict("deny", Some(explanation)),
            ));
        }

        // One question at a time per session.
        let _gate = tokio::select! {
            gate = self.ask_gate.lock() => gate,
            () = cancel.cancelled() => {
                return Err((
                    ToolResult::failure(ErrorType::PermissionCanceled, "the call was canceled while waiting for approval"),
                    verdict("ask→canceled", Some(explanation)),
                ));
            }
        };
        // A session grant given while we waited for the gate may settle it now.
        let fresh = self.decide(definition, arguments);
        if asked_by_rules && fresh.verdict == Verdict::Allow {
            return Ok(verdict("allow", Some(fresh.explanation)));
        }

        let request = PermissionRequest {
            session_id: self.id.clone(),
            request_id: format!(
                "p-{}-{}",
                self.id,
                self.next_request.fetch_add(1, Ordering::Relaxed)
            ),
            call_id: call.id.clone(),
            tool: definition.name.clone(),
            arguments: arguments.clone(),
            explanation: explanation.clone(),
            suggestions: suggestions.clone(),
            kind: RequestKind::RunTool,
        };
        let answer = self.put_question(&request, cancel).await;
        match answer {
            Asked::Answer(ApprovalAnswer { decision: ApprovalDecision::Allow, scope, .. }) => {
                if scope == ApprovalScope::Session {
                    self.grant_for_session(definition, &suggestions);
                }
                Ok(verdict("ask→allow", Some(explanation)))
            }
            Asked::Answer(ApprovalAnswer { decision: ApprovalDecision::Deny, reason, .. }) => {
                let reason =
                    reason.unwrap_or_else(|| format!("the user denied {}", definition.name));
                Err((
                    ToolResult::failure(ErrorType::PermissionDenied, reason),
                    verdict("ask→deny", Some(explanation)),
                ))
            }
            Asked::TimedOut => Err((
                ToolResult::failure(
                    ErrorType::PermissionDenied,
                    format!(
                        "no answer to the approval request within {} s{}",
                        self.approval_timeout.as_secs(),
                        suggest(&suggestions)
                    ),
                ),
                verdict("ask→timeout", Some(explanation)),
            )),
            Asked::Canceled => Err((
                ToolResult::failure(
                    ErrorType::PermissionCanceled,
                    "the call was canceled while waiting for approval",
                ),
                verdict("ask→canceled", Some(explanation)),
            )),
            Asked::Unavailable(why) => Err((
                ToolResult::failure(
                    ErrorType::PermissionDenied,
                    format!(
                        "{} requires approval; {why}{}",
                        definition.name,
                        suggest(&suggestions)
                    ),
                ),
                verdict("ask→unavailable", Some(explanation)),
            )),
        }
    }

    /// Remembers an "allow for this session" answer as session rules: the suggested
    /// rules when there are any, else the bare tool name.
    fn grant_for_session(&self, definition: &Definition, suggestions: &[String]) {
        let mut state = self.lock();
        let rules: Vec<&str> = if suggestions.is_empty() {
            vec![definition.name.as_str()]
        } else {
            suggestions.iter().map(String::as_str).collect()
        };
        for rule in rules {
            if let Err(err) = state.engine.add_session_rule(rule) {
                tracing::warn!(session = %self.id, %err, "could not record a session grant");
            }
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
    fn output_sink(&self, call_id: &str) -> OutputSink {
        let events = self.events.clone();
        let session_id = self.id.clone();
        let call_id = call_id.to_owned();
        let seq = AtomicU64::new(0);
        OutputSink::new(move |stream, text| {
            events.emit(Event::ToolOutput {
                session_id: session_id.clone(),
                call_id: call_id.clone(),
                seq: seq.fetch_add(1, Ordering::Relaxed),
                stream,
                text: text.to_owned(),
            });
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Mutable> {
        // Every critical section is a few field reads or writes; a poisoned lock can
        // only come from a panic between them and leaves the fields consistent.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait::async_trait]
impl SessionControl for Session {
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
            session_id: self.id.clone(),
            request_id: format!(
                "p-{}-{}",
                self.id,
                self.next_request.fetch_add(1, Ordering::Relaxed)
            ),
            call_id: call_id.to_owned(),
            tool: "exit_plan_mode".to_owned(),
            arguments: serde_json::json!({ "plan": plan }),
            explanation: Explanation {
                layer: Layer::Mode,
                rule: None,
                list: None,
                reason: "leaving plan mode needs the user's approval".to_owned(),
            },
            suggestions: Vec::new(),
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

fn verdict(decision: &str, explanation: Option<Explanation>) -> Verdicts {
    Verdicts { decision: decision.to_owned(), explanation }
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

fn parse_or_raw(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return Value::Object(serde_json::Map::new());
    }
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_owned()))
}
