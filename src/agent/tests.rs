//! Agent-layer tests: batching, ordering, plan mode, approvals, hooks and events,
//! driven in-process with small test tools. Concurrency is proven by rendezvous (two
//! tools that can only finish together), never by timing.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::{Barrier, Notify};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::hooks::{HookConfig, Hooks, OnError};
use crate::permission::{Mode, PermissionEngine, Policy};
use crate::tools::{
    Call, Definition, Env, ErrorType, OutputStream, Registry, Safety, Tool, ToolContext, ToolResult,
};

/// What a test tool does when called.
#[derive(Clone)]
enum Act {
    /// Waits at the barrier (both halves of a rendezvous must run at once).
    Rendezvous(Arc<Barrier>),
    /// Waits until notified, then logs.
    WaitFor(Arc<Notify>),
    /// Logs, then notifies.
    Signal(Arc<Notify>),
    /// Emits two output chunks.
    Output,
    Plain,
}

struct TestTool {
    definition: Definition,
    act: Act,
    log: Arc<Mutex<Vec<String>>>,
    runs: Arc<AtomicUsize>,
}

#[async_trait]
impl Tool for TestTool {
    fn definition(&self) -> &Definition {
        &self.definition
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let name = &self.definition.name;
        self.log.lock().unwrap().push(format!("start {name}"));
        match &self.act {
            Act::Rendezvous(barrier) => {
                if tokio::time::timeout(Duration::from_secs(10), barrier.wait()).await.is_err() {
                    return ToolResult::failure(ErrorType::InternalError, "ran alone");
                }
            }
            Act::WaitFor(notify) => notify.notified().await,
            Act::Signal(notify) => notify.notify_one(),
            Act::Output => {
                ctx.output.emit(OutputStream::Stdout, "one\n");
                ctx.output.emit(OutputStream::Stderr, "two\n");
            }
            Act::Plain => {}
        }
        self.log.lock().unwrap().push(format!("end {name}"));
        ToolResult::success(format!("{name} {args}"))
    }
}

/// Collects events in memory.
#[derive(Default)]
struct Recorder(Mutex<Vec<Event>>);

impl EventSink for Recorder {
    fn emit(&self, event: Event) {
        self.0.lock().unwrap().push(event);
    }
}

impl Recorder {
    fn kinds_for(&self, call_id: &str) -> Vec<&'static str> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|event| event.call_id() == Some(call_id))
            .map(Event::kind)
            .collect()
    }

    fn all(&self) -> Vec<Event> {
        self.0.lock().unwrap().clone()
    }
}

/// A broker answering from a script; `None` in the script means "never answer".
#[derive(Default)]
struct ScriptedBroker {
    answers: Mutex<VecDeque<Option<ApprovalAnswer>>>,
    asked: Mutex<Vec<PermissionRequest>>,
    /// Set when the waiter dropped its question (timeout/cancel).
    withdrawn: Arc<AtomicUsize>,
}

struct DropCounter(Arc<AtomicUsize>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl ApprovalBroker for ScriptedBroker {
    fn begin(
        &self,
        request: &PermissionRequest,
    ) -> Result<BoxFuture<'static, ApprovalAnswer>, Unavailable> {
        self.asked.lock().unwrap().push(request.clone());
        let answer = self.answers.lock().unwrap().pop_front().ok_or(Unavailable::NoApprover)?;
        let counter = DropCounter(self.withdrawn.clone());
        Ok(Box::pin(async move {
            let _counter = counter;
            match answer {
                Some(answer) => answer,
                None => std::future::pending().await,
            }
        }))
    }
}

struct Harness {
    session: Arc<Session>,
    events: Arc<Recorder>,
    broker: Arc<ScriptedBroker>,
    log: Arc<Mutex<Vec<String>>>,
    runs: Vec<(String, Arc<AtomicUsize>)>,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn runs(&self, name: &str) -> usize {
        self.runs.iter().find(|(tool, _)| tool == name).unwrap().1.load(Ordering::SeqCst)
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

struct Setup {
    tools: Vec<(&'static str, Safety, Act)>,
    mode: Mode,
    allowlist: Vec<String>,
    hooks: Hooks,
    answers: Vec<Option<ApprovalAnswer>>,
    approval_timeout: Duration,
}

impl Default for Setup {
    fn default() -> Setup {
        Setup {
            tools: Vec::new(),
            mode: Mode::Default,
            allowlist: Vec::new(),
            hooks: Hooks::default(),
            answers: Vec::new(),
            approval_timeout: Duration::from_secs(30),
        }
    }
}

fn harness(setup: Setup) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut runs = Vec::new();
    for (name, safety, act) in setup.tools {
        let counter = Arc::new(AtomicUsize::new(0));
        runs.push((name.to_owned(), counter.clone()));
        registry
            .register(Some(Arc::new(TestTool {
                definition: Definition {
                    name: name.to_owned(),
                    description: String::new(),
                    input_schema: json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
                    safety,
                    system: false,
                    timeout: None,
                    facts: Default::default(),
                },
                act,
                log: log.clone(),
                runs: counter,
            })))
            .unwrap();
    }
    for tool in system_tools::all() {
        registry.register(Some(tool)).unwrap();
    }
    let events = Arc::new(Recorder::default());
    let broker = Arc::new(ScriptedBroker::default());
    broker.answers.lock().unwrap().extend(setup.answers);
    let session = Session::new(
        Arc::new(registry),
        SessionOptions {
            id: "s1".to_owned(),
            client: "test".to_owned(),
            env: Env::for_root(dir.path()).unwrap(),
            engine: PermissionEngine::new(Policy::default(), Mode::Bypass),
            mode: setup.mode,
            allowlist: setup.allowlist,
            hooks: Arc::new(setup.hooks),
            approval_timeout: setup.approval_timeout,
            max_concurrent_calls: 8,
            events: events.clone(),
            approvals: broker.clone(),
            observer: None,
            cancel: CancellationToken::new(),
        },
    );
    Harness { session, events, broker, log, runs, _dir: dir }
}

fn call(id: &str, name: &str) -> Call {
    Call::new(id, name, "{}")
}

fn ids(results: &[ToolResult]) -> Vec<String> {
    results.iter().map(|res| res.call_id().unwrap_or("?").to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_calls_run_concurrently() {
    let barrier = Arc::new(Barrier::new(2));
    let h = harness(Setup {
        tools: vec![
            ("read_a", Safety::ReadOnly, Act::Rendezvous(barrier.clone())),
            ("read_b", Safety::ReadOnly, Act::Rendezvous(barrier)),
        ],
        ..Setup::default()
    });
    let results = h
        .session
        .execute_calls(&[call("a", "read_a"), call("b", "read_b")], &CancellationToken::new())
        .await;
    assert!(results.iter().all(|res| res.ok), "{results:#?}");
    assert_eq!(ids(&results), ["a", "b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_batch_runs_in_batches_and_keeps_call_order() {
    // read(A) waits for read(B) to finish first: only possible if they run together.
    let b_done = Arc::new(Notify::new());
    let h = harness(Setup {
        tools: vec![
            ("read_a", Safety::ReadOnly, Act::WaitFor(b_done.clone())),
            ("read_b", Safety::ReadOnly, Act::Signal(b_done)),
            ("write_c", Safety::SideEffect, Act::Plain),
            ("read_d", Safety::ReadOnly, Act::Plain),
        ],
        mode: Mode::Bypass,
        ..Setup::default()
    });
    let calls =
        [call("A", "read_a"), call("B", "read_b"), call("C", "write_c"), call("D", "read_d")];
    assert_eq!(
        calls.iter().map(|c| h.session.may_run_concurrently(c)).collect::<Vec<_>>(),
        [true, true, false, true]
    );
    let results = h.session.execute_calls(&calls, &CancellationToken::new()).await;
    assert!(results.iter().all(|res| res.ok), "{results:#?}");
    assert_eq!(ids(&results), ["A", "B", "C", "D"]);
    let log = h.log();
    let position = |entry: &str| log.iter().position(|line| line == entry).unwrap();
    // B finished before A (second read first), both before C started; D after C.
    assert!(position("end read_b") < position("end read_a"), "{log:?}");
    assert!(position("end read_a") < position("start write_c"), "{log:?}");
    assert!(position("end write_c") < position("start read_d"), "{log:?}");
}

#[tokio::test]
async fn events_of_a_call_come_in_order() {
    let h = harness(Setup {
        tools: vec![("speak", Safety::ReadOnly, Act::Output)],
        ..Setup::default()
    });
    let res = h.session.execute_one(&call("x", "speak"), &CancellationToken::new()).await;
    assert!(res.ok);
    assert_eq!(
        h.events.kinds_for("x"),
        ["tool_call_start", "tool_output", "tool_output", "tool_result", "tool_call_done"]
    );
    let seqs: Vec<u64> = h
        .events
        .all()
        .iter()
        .filter_map(|event| match event {
            Event::ToolOutput { seq, .. } => Some(*seq),
            _ => None,
        })
        .collect();
    assert_eq!(seqs, [0, 1]);
}

#[tokio::test]
async fn plan_mode_hides_and_refuses_side_effect_tools() {
    let h = harness(Setup {
        tools: vec![
            ("read_a", Safety::ReadOnly, Act::Plain),
            ("write_c", Safety::SideEffect, Act::Plain),
        ],
        mode: Mode::Plan,
        ..Setup::default()
    });
    let names: Vec<String> = h.session.definitions().into_iter().map(|def| def.name).collect();
    assert_eq!(names, ["exit_plan_mode", "read_a", "todo_write"]);
    let res = h.session.execute_one(&call("f", "write_c"), &CancellationToken::new()).await;
    assert_eq!(res.error_type, Some(ErrorType::ToolNotAllowed));
    assert_eq!(res.call_id(), Some("f"));
    assert_eq!(h.runs("write_c"), 0);
    // Still closes with the usual events.
    assert_eq!(h.events.kinds_for("f"), ["tool_call_start", "tool_result", "tool_call_done"]);
}

#[tokio::test]
async fn allowlist_limits_tools_but_never_system_tools() {
    let h = harness(Setup {
        tools: vec![
            ("read_a", Safety::ReadOnly, Act::Plain),
            ("read_b", Safety::ReadOnly, Act::Plain),
        ],
        allowlist: vec!["read_a".to_owned()],
        ..Setup::default()
    });
    let names: Vec<String> = h.session.definitions().into_iter().map(|def| def.name).collect();
    assert_eq!(names, ["exit_plan_mode", "read_a", "todo_write"]);
    let res = h.session.execute_one(&call("b", "read_b"), &CancellationToken::new()).await;
    assert_eq!(res.error_type, Some(ErrorType::ToolNotAllowed));
    assert_eq!(h.runs("read_b"), 0);
    let todo = Call::new("t", "todo_write", r#"{"todos":[{"content":"x","status":"pending"}]}"#);
    assert!(h.session.execute_one(&todo, &CancellationToken::new()).await.ok);
}

#[tokio::test]
async fn approval_allow_once_asks_every_time() {
    let allow = Some(ApprovalAnswer::allow(ApprovalScope::Once));
    let h = harness(Setup {
        tools: vec![("write_c", Safety::SideEffect, Act::Plain)],
        answers: vec![allow.clone(), allow],
        ..Setup::default()
    });
    for id in ["1", "2"] {
        let res = h.session.execute_one(&call(id, "write_c"), &CancellationToken::new()).await;
        assert!(res.ok, "{res:?}");
    }
    assert_eq!(h.broker.asked.lock().unwrap().len(), 2);
    assert_eq!(h.runs("write_c"), 2);
    assert_eq!(
        h.events.kinds_for("1"),
        [
            "tool_call_start",
            "permission_request",
            "permission_resolved",
            "tool_result",
            "tool_call_done"
        ]
    );
}

#[tokio::test]
async fn approval_for_the_session_is_asked_once() {
    let h = harness(Setup {
        tools: vec![("write_c", Safety::SideEffect, Act::Plain)],
        answers: vec![Some(ApprovalAnswer::allow(ApprovalScope::Session))],
        ..Setup::default()
    });
    for id in ["1", "2", "3"] {
        let res = h.session.execute_one(&call(id, "write_c"), &CancellationToken::new()).await;
        assert!(res.ok, "{res:?}");
    }
    assert_eq!(h.broker.asked.lock().unwrap().len(), 1);
    assert_eq!(h.runs("write_c"), 3);
}

#[tokio::test]
async fn approval_denied() {
    let h = harness(Setup {
        tools: vec![("write_c", Safety::SideEffect, Act::Plain)],
        answers: vec![Some(ApprovalAnswer::deny("not today"))],
        ..Setup::default()
    });
    let res = h.session.execute_one(&call("1", "write_c"), &CancellationToken::new()).await;
    assert_eq!(res.error_type, Some(ErrorType::PermissionDenied));
    assert_eq!(res.error.as_deref(), Some("not today"));
    assert_eq!(h.runs("write_c"), 0);
}

#[tokio::test(start_paused = true)]
async fn approval_timeout_denies_and_withdraws_the_question() {
    let h = harness(Setup {
        tools: vec![("write_c", Safety::SideEffect, Act::Plain)],
        answers: vec![None],
        approval_timeout: Duration::from_secs(5),
        ..Setup::default()
    });
    let res = h.session.execute_one(&call("1", "write_c"), &CancellationToken::new()).await;
    assert_eq!(res.error_type, Some(ErrorType::PermissionDenied));
    assert!(res.error.as_deref().unwrap().contains("no answer"), "{res:?}");
    assert_eq!(h.broker.withdrawn.load(Ordering::SeqCst), 1);
    assert_eq!(h.runs("write_c"), 0);
}

#[tokio::test]
async fn cancel_while_waiting_for_approval() {
    let h = harness(Setup {
        tools: vec![("write_c", Safety::SideEffect, Act::Plain)],
        answers: vec![None],
        ..Setup::default()
    });
    let session = h.session.clone();
    let cancel = CancellationToken::new();
    let waiting = {
        let cancel = cancel.clone();
        tokio::spawn(async move { session.execute_one(&call("1", "write_c"), &cancel).await })
    };
    // Cancel by call id once the question is out.
    while h.broker.asked.lock().unwrap().is_empty() {
        tokio::task::yield_now().await;
    }
    assert_eq!(h.session.cancel_call("1"), 1);
    let res = waiting.await.unwrap();
    assert_eq!(res.error_type, Some(ErrorType::PermissionCanceled));
    assert_eq!(h.broker.withdrawn.load(Ordering::SeqCst), 1);
    assert_eq!(h.runs("write_c"), 0);
    assert_eq!(h.session.calls_in_flight(), 0);
}

#[tokio::test]
async fn no_approver_denies_with_a_rule_to_add() {
    let h = harness(Setup {
        tools: vec![("write_c", Safety::SideEffect, Act::Plain)],
        ..Setup::default()
    });
    let res = h.session.execute_one(&call("1", "write_c"), &CancellationToken::new()).await;
    assert_eq!(res.error_type, Some(ErrorType::PermissionDenied));
    let message = res.error.unwrap();
    assert!(message.contains("no approver"), "{message}");
    assert!(message.contains("add an allow rule"), "{message}");
}

#[tokio::test]
async fn dont_ask_denies_without_asking() {
    let h = harness(Setup {
        tools: vec![("write_c", Safety::SideEffect, Act::Plain)],
        mode: Mode::DontAsk,
        answers: vec![Some(ApprovalAnswer::allow(ApprovalScope::Once))],
        ..Setup::default()
    });
    let res = h.session.execute_one(&call("1", "write_c"), &CancellationToken::new()).await;
    assert_eq!(res.error_type, Some(ErrorType::PermissionDenied));
    assert!(h.broker.asked.lock().unwrap().is_empty());
}

#[tokio::test]
async fn unknown_tools_and_bad_json_still_close_the_call() {
    let h = harness(Setup::default());
    let res = h.session.execute_one(&call("u", "nope"), &CancellationToken::new()).await;
    assert_eq!(res.error_type, Some(ErrorType::UnknownTool));
    assert_eq!(h.events.kinds_for("u"), ["tool_call_start", "tool_result", "tool_call_done"]);
    let res = h
        .session
        .execute_one(&Call::new("j", "todo_write", "{oops"), &CancellationToken::new())
        .await;
    assert_eq!(res.error_type, Some(ErrorType::InvalidArguments));
    assert_eq!(res.call_id(), Some("j"));
}

#[tokio::test]
async fn todo_write_updates_the_session_and_emits_an_event() {
    let h = harness(Setup::default());
    let args = r#"{"todos":[{"content":"a","status":"completed"},{"content":"b","status":"in_progress"}]}"#;
    let res =
        h.session.execute_one(&Call::new("t", "todo_write", args), &CancellationToken::new()).await;
    assert!(res.ok, "{res:?}");
    assert_eq!(h.session.todos().len(), 2);
    assert!(
        h.events
            .all()
            .iter()
            .any(|event| matches!(event, Event::TodosUpdated { todos, .. } if todos.len() == 2))
    );
}

#[tokio::test]
async fn exit_plan_mode_asks_and_switches_to_default() {
    let h = harness(Setup {
        mode: Mode::Plan,
        answers: vec![Some(ApprovalAnswer::allow(ApprovalScope::Once))],
        ..Setup::default()
    });
    let res = h
        .session
        .execute_one(
            &Call::new("p", "exit_plan_mode", r#"{"plan":"do it"}"#),
            &CancellationToken::new(),
        )
        .await;
    assert!(res.ok, "{res:?}");
    assert_eq!(h.session.mode(), Mode::Default);
    let asked = h.broker.asked.lock().unwrap();
    assert_eq!(asked[0].kind, RequestKind::ExitPlanMode);
}

fn hook(matcher: &str, command: &str) -> HookConfig {
    HookConfig {
        matcher: matcher.to_owned(),
        command: command.to_owned(),
        timeout_ms: 10_000,
        on_error: OnError::Allow,
        format: Default::default(),
    }
}

#[tokio::test]
async fn a_blocking_hook_still_closes_the_call_and_runs_post_hooks() {
    let dir = tempfile::tempdir().unwrap();
    let post_log = dir.path().join("post.json");
    let hooks = Hooks::new(
        &[hook("read_a", "echo 'no reads today' >&2; exit 2")],
        &[hook("*", &format!("cat > '{}'", post_log.display()))],
    )
    .unwrap();
    let h = harness(Setup {
        tools: vec![("read_a", Safety::ReadOnly, Act::Plain)],
        hooks,
        ..Setup::default()
    });
    let res = h.session.execute_one(&call("h", "read_a"), &CancellationToken::new()).await;
    assert_eq!(res.error_type, Some(ErrorType::HookBlocked));
    assert_eq!(res.error.as_deref(), Some("no reads today"));
    assert_eq!(h.runs("read_a"), 0);
    assert_eq!(h.events.kinds_for("h"), ["tool_call_start", "tool_result", "tool_call_done"]);
    let post: Value = serde_json::from_str(&std::fs::read_to_string(&post_log).unwrap()).unwrap();
    assert_eq!(post["hook_event_name"], "PostToolUse");
    assert_eq!(post["tool_result"]["error_type"], "hook_blocked");
}

#[tokio::test]
async fn updated_input_from_a_hook_is_validated_again() {
    let bad =
        Hooks::new(&[hook("read_a", r#"echo '{"updated_input": {"n": "not a number"}}'"#)], &[])
            .unwrap();
    let h = harness(Setup {
        tools: vec![("read_a", Safety::ReadOnly, Act::Plain)],
        hooks: bad,
        ..Setup::default()
    });
    let res = h.session.execute_one(&call("1", "read_a"), &CancellationToken::new()).await;
    assert_eq!(res.error_type, Some(ErrorType::InvalidArguments));
    assert_eq!(h.runs("read_a"), 0);

    let good = Hooks::new(&[hook("read_a", r#"echo '{"updated_input": {"n": 7}}'"#)], &[]).unwrap();
    let h = harness(Setup {
        tools: vec![("read_a", Safety::ReadOnly, Act::Plain)],
        hooks: good,
        ..Setup::default()
    });
    let res = h.session.execute_one(&call("2", "read_a"), &CancellationToken::new()).await;
    assert!(res.ok, "{res:?}");
    assert_eq!(res.content, r#"read_a {"n":7}"#);
}

#[tokio::test]
async fn a_hook_ask_makes_an_allowed_call_ask() {
    let hooks =
        Hooks::new(&[hook("read_a", r#"echo '{"decision": "ask", "reason": "check"}'"#)], &[])
            .unwrap();
    let h = harness(Setup {
        tools: vec![("read_a", Safety::ReadOnly, Act::Plain)],
        hooks,
        answers: vec![Some(ApprovalAnswer::deny("no"))],
        ..Setup::default()
    });
    let res = h.session.execute_one(&call("1", "read_a"), &CancellationToken::new()).await;
    assert_eq!(res.error_type, Some(ErrorType::PermissionDenied));
    assert_eq!(h.broker.asked.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn closing_the_session_cancels_its_calls() {
    let never = Arc::new(Notify::new());
    let h = harness(Setup {
        tools: vec![("read_a", Safety::ReadOnly, Act::WaitFor(never))],
        ..Setup::default()
    });
    let session = h.session.clone();
    let running = tokio::spawn(async move {
        session.execute_one(&call("1", "read_a"), &CancellationToken::new()).await
    });
    while h.runs("read_a") == 0 {
        tokio::task::yield_now().await;
    }
    h.session.close();
    let res = running.await.unwrap();
    assert_eq!(res.error_type, Some(ErrorType::Canceled));
}

/// The decision the `tool_call_done` event of a call carries.
fn decision_of(h: &Harness, call_id: &str) -> crate::permission::CallDecision {
    let done: Vec<crate::permission::CallDecision> = h
        .events
        .all()
        .into_iter()
        .filter_map(|event| match event {
            Event::ToolCallDone { call_id: id, decision, .. } if *id == *call_id => Some(decision),
            _ => None,
        })
        .collect();
    assert_eq!(done.len(), 1, "one tool_call_done per call");
    done[0].clone()
}

#[tokio::test]
async fn every_decision_names_who_decided() {
    use crate::permission::{DecidedBy, Layer, Outcome};
    let block = Hooks::new(&[hook("blocked", "echo nope >&2; exit 2")], &[]).unwrap();
    // (setup, tool called, outcome, decided by, asked)
    let allow_once = Some(ApprovalAnswer::allow(ApprovalScope::Once));
    let cases: Vec<(Setup, &str, Outcome, DecidedBy, bool)> = vec![
        (
            Setup { answers: vec![allow_once.clone()], ..Setup::default() },
            "write_c",
            Outcome::Allow,
            DecidedBy::Person,
            true,
        ),
        (
            Setup { answers: vec![Some(ApprovalAnswer::deny("no"))], ..Setup::default() },
            "write_c",
            Outcome::Deny,
            DecidedBy::Person,
            true,
        ),
        (
            Setup {
                answers: vec![None],
                approval_timeout: Duration::from_millis(20),
                ..Setup::default()
            },
            "write_c",
            Outcome::Deny,
            DecidedBy::Timeout,
            true,
        ),
        (Setup::default(), "write_c", Outcome::Deny, DecidedBy::Unavailable, true),
        (
            Setup { mode: Mode::DontAsk, ..Setup::default() },
            "write_c",
            Outcome::Deny,
            DecidedBy::Mode,
            false,
        ),
        (
            Setup { mode: Mode::Plan, ..Setup::default() },
            "write_c",
            Outcome::Deny,
            DecidedBy::Mode,
            false,
        ),
        (
            Setup { allowlist: vec!["read_a".to_owned()], ..Setup::default() },
            "write_c",
            Outcome::Deny,
            DecidedBy::Allowlist,
            false,
        ),
        (Setup::default(), "read_a", Outcome::Allow, DecidedBy::Mode, false),
        (Setup::default(), "nonexistent", Outcome::Allow, DecidedBy::Registry, false),
        (
            Setup { hooks: block, ..Setup::default() },
            "blocked",
            Outcome::Deny,
            DecidedBy::Hook,
            false,
        ),
    ];
    for (mut setup, tool, outcome, decided_by, asked) in cases {
        setup.tools = vec![
            ("read_a", Safety::ReadOnly, Act::Plain),
            ("write_c", Safety::SideEffect, Act::Plain),
            ("blocked", Safety::ReadOnly, Act::Plain),
        ];
        let h = harness(setup);
        let res = h.session.execute_one(&call("1", tool), &CancellationToken::new()).await;
        let decision = decision_of(&h, "1");
        assert_eq!(
            (decision.outcome, decision.decided_by, decision.asked),
            (outcome, decided_by, asked),
            "{tool}: {decision:?} {res:?}"
        );
        if decided_by == DecidedBy::Person || decided_by == DecidedBy::Timeout {
            assert_eq!(decision.layer, Some(Layer::Mode), "{decision:?}");
        }
    }
}

#[tokio::test]
async fn a_question_from_preflight_is_answered_later_and_the_call_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("hook-runs");
    let hooks = Hooks::new(
        &[hook(
            "read_a",
            &format!(
                r#"echo run >> '{}'; echo '{{"decision": "ask", "reason": "check"}}'"#,
                runs.display()
            ),
        )],
        &[],
    )
    .unwrap();
    let h = harness(Setup {
        tools: vec![("read_a", Safety::ReadOnly, Act::Plain)],
        hooks,
        ..Setup::default()
    });
    let cancel = CancellationToken::new();
    let question = match h.session.preflight(&call("1", "read_a"), &cancel).await {
        Preflight::Ask(question) => question,
        Preflight::Run(_) => panic!("a hook asked: the call must not run yet"),
        Preflight::Refuse(res) => panic!("refused: {res:?}"),
    };
    assert_eq!(question.request().explanation.layer, crate::permission::Layer::Hook);
    assert_eq!(h.runs("read_a"), 0);
    assert!(h.broker.asked.lock().unwrap().is_empty(), "the caller asks, not the broker");
    // Nothing is closed (or audited) before the answer.
    assert_eq!(h.events.kinds_for("1"), ["tool_call_start"]);

    let res = h.session.resume(question, ApprovalAnswer::allow(ApprovalScope::Once), &cancel).await;
    assert!(res.ok, "{res:?}");
    assert_eq!(h.runs("read_a"), 1);
    assert_eq!(std::fs::read_to_string(&runs).unwrap().lines().count(), 1, "hooks ran once");
    let decision = decision_of(&h, "1");
    assert_eq!(
        (decision.outcome, decision.decided_by, decision.asked, decision.layer),
        (
            crate::permission::Outcome::Allow,
            crate::permission::DecidedBy::Person,
            true,
            Some(crate::permission::Layer::Hook)
        )
    );

    // A refusal from preflight is finished at once.
    let h = harness(Setup {
        tools: vec![("write_c", Safety::SideEffect, Act::Plain)],
        mode: Mode::DontAsk,
        ..Setup::default()
    });
    match h.session.preflight(&call("2", "write_c"), &cancel).await {
        Preflight::Refuse(res) => assert_eq!(res.error_type, Some(ErrorType::PermissionDenied)),
        _ => panic!("dont_ask refuses a call that would ask"),
    }
    assert_eq!(h.events.kinds_for("2").last(), Some(&"tool_call_done"));
}

#[test]
fn system_tool_schemas_compile_and_are_valid_schemas() {
    // They are compiled on first call (`Registry::register_built_in`): checked here.
    let tools = system_tools::all();
    assert!(!tools.is_empty());
    for tool in tools {
        let definition = tool.definition();
        let schema = &definition.input_schema;
        assert!(crate::tools::schema::compile(schema).is_ok(), "{}", definition.name);
        assert!(jsonschema::meta::is_valid(schema), "{}", definition.name);
    }
}
