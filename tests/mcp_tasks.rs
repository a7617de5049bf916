//! The MCP tasks extension (`io.modelcontextprotocol/tasks`): a call that outlives
//! the face's task threshold is answered with a task, polled with `tasks/get`,
//! canceled with `tasks/cancel` (the same cancellation as `notifications/cancelled`:
//! the process tree dies), and is the same call as a plain one (decided once, one
//! audit record). The threshold is zero here, so a call still running at its first
//! wait becomes a task; every command waits on a file the test creates, never on time.
//! The bounds of one identity's tasks are tried on the real binary, whose threshold is
//! two seconds: there, a command that must become a task waits for a file or sleeps
//! past the threshold.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod auth_support;
mod mcp_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use auth_support::{Home, mcp_exchange, mcp_session, start_mcp_http, tools_call};
use mcp_support::{PATIENCE, StdioClient, process_alive, read_pid};
use serde_json::{Value, json};
use toolgate::agent::{CallObserver, CallRecord};
use toolgate::daemon::{Daemon, Settings};
use toolgate::mcp::McpOptions;
use toolgate::permission::{DecidedBy, Mode};
use toolgate::tools::{ErrorType, Registry};

const LEGACY: &str = "2025-11-25";
const TASKS: &str = "io.modelcontextprotocol/tasks";
/// JSON-RPC: Missing Required Client Capability (2026-07-28).
const MISSING_CAPABILITY: i64 = -32021;

#[derive(Default)]
struct Records(Mutex<Vec<CallRecord>>);

impl CallObserver for Records {
    fn call_finished(&self, record: CallRecord) {
        self.0.lock().unwrap().push(record);
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    daemon: Arc<Daemon>,
    records: Arc<Records>,
}

/// A daemon in `mode` over a temporary root, recording every finished call.
fn setup(mode: Mode) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let mut settings = Settings::for_roots(vec![root.clone()]);
    settings.mode = mode;
    let records = Arc::new(Records::default());
    let observer: Arc<dyn CallObserver> = records.clone();
    let daemon = Daemon::new(Arc::new(Registry::with_builtins()), settings, Some(observer));
    Setup { _dir: dir, root, daemon, records }
}

impl Setup {
    fn client(&self) -> StdioClient {
        let options = McpOptions { task_after: Duration::ZERO, ..McpOptions::default() };
        StdioClient::start(&self.daemon, options)
    }

    fn records(&self, tool: &str) -> Vec<CallRecord> {
        self.records.0.lock().unwrap().iter().filter(|r| &*r.tool == tool).cloned().collect()
    }
}

fn with_tasks() -> Value {
    json!({"extensions": {TASKS: {}}})
}

/// A command that prints `started`, waits for `go` in the root, then prints
/// `finished-42`.
fn waits_for_go() -> Value {
    json!({"command": "echo started; while [ ! -e go ]; do sleep 0.01; done; echo finished-$((6 * 7))"})
}

/// Polls `tasks/get` until the task is terminal; its last state.
async fn settled(client: &mut StdioClient, id: &mut i64, task_id: &Value) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        *id += 1;
        let answer = client.request(*id, "tasks/get", json!({"taskId": task_id})).await;
        let status = answer["result"]["status"].as_str().unwrap_or_default().to_owned();
        if ["completed", "failed", "cancelled"].contains(&status.as_str()) {
            return answer["result"].clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "the task never settled: {answer}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_extension_is_advertised() {
    let test = setup(Mode::Bypass);
    let mut client = test.client();
    let answer = client.initialize(LEGACY, json!({})).await;
    assert_eq!(answer["result"]["capabilities"]["extensions"][TASKS], json!({}), "{answer}");
    assert!(answer["result"]["capabilities"].get("tasks").is_none(), "{answer}");
    client.close().await;
}

#[tokio::test]
async fn a_long_call_becomes_a_task_whose_result_is_polled() {
    let test = setup(Mode::Bypass);
    let mut client = test.client();
    client.initialize(LEGACY, with_tasks()).await;
    let created = client
        .request(1, "tools/call", json!({"name": "run_command", "arguments": waits_for_go()}))
        .await;
    let task = &created["result"];
    assert_eq!(task["resultType"], json!("task"), "{created}");
    assert_eq!(task["status"], json!("working"), "{created}");
    assert!(task["ttlMs"].as_u64().is_some_and(|ttl| ttl > 600_000), "{created}");
    assert!(task["pollIntervalMs"].as_u64().is_some(), "{created}");
    for absent in ["result", "content", "requestState", "task"] {
        assert!(task.get(absent).is_none(), "{absent} in {created}");
    }
    let task_id = task["taskId"].clone();

    // Still waiting for `go`: working, its output so far in the status message.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut id = 1;
    loop {
        id += 1;
        let working = client.request(id, "tasks/get", json!({"taskId": task_id})).await;
        assert_eq!(working["result"]["status"], json!("working"), "{working}");
        assert_eq!(working["result"]["resultType"], json!("complete"), "{working}");
        assert!(working["result"].get("result").is_none(), "{working}");
        if working["result"]["statusMessage"] == json!("started") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no output in the status: {working}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    std::fs::write(test.root.join("go"), "").unwrap();
    let done = settled(&mut client, &mut id, &task_id).await;
    assert_eq!(done["status"], json!("completed"), "{done}");
    let result = &done["result"];
    assert_eq!(result["structuredContent"]["ok"], json!(true), "{done}");
    assert_eq!(result["isError"], json!(false), "{done}");
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("finished-42"), "{done}");

    // One call, one record.
    let records = test.records("run_command");
    assert_eq!(records.len(), 1, "{records:?}");
    assert!(records[0].result_ok);
    client.close().await;
}

#[tokio::test]
async fn tasks_cancel_kills_the_command_and_settles_as_cancelled() {
    let test = setup(Mode::Bypass);
    let mut client = test.client();
    client.initialize(LEGACY, with_tasks()).await;
    let command = json!({"command": "echo $$ > pid; exec sleep 300"});
    let created =
        client.request(1, "tools/call", json!({"name": "run_command", "arguments": command})).await;
    assert_eq!(created["result"]["resultType"], json!("task"), "{created}");
    let task_id = created["result"]["taskId"].clone();
    let pid_file = test.root.join("pid");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let pid = loop {
        if let Some(pid) = read_pid(&pid_file) {
            break pid;
        }
        assert!(tokio::time::Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };

    let ack = client.request(2, "tasks/cancel", json!({"taskId": task_id})).await;
    assert_eq!(ack["result"], json!({"resultType": "complete"}), "{ack}");
    let mut id = 2;
    let done = settled(&mut client, &mut id, &task_id).await;
    assert_eq!(done["status"], json!("cancelled"), "{done}");
    assert!(done.get("result").is_none(), "{done}");
    while process_alive(pid) {
        assert!(tokio::time::Instant::now() < deadline, "the command outlived its task");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Cancelling a finished task is acknowledged the same way.
    let again = client.request(100, "tasks/cancel", json!({"taskId": task_id})).await;
    assert_eq!(again["result"], json!({"resultType": "complete"}), "{again}");
    // An unknown task is an invalid parameter.
    let unknown = client.request(101, "tasks/get", json!({"taskId": "no-such-task"})).await;
    assert_eq!(unknown["error"]["code"], json!(-32602), "{unknown}");

    let records = test.records("run_command");
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].error_type, Some(ErrorType::Canceled), "{records:?}");
    client.close().await;
}

#[tokio::test]
async fn without_the_extension_calls_are_answered_and_tasks_refused() {
    let test = setup(Mode::Bypass);
    let mut client = test.client();
    client.initialize(LEGACY, json!({})).await;
    std::fs::write(test.root.join("go"), "").unwrap();
    let answer = client
        .request(1, "tools/call", json!({"name": "run_command", "arguments": waits_for_go()}))
        .await;
    assert!(answer["result"].get("taskId").is_none(), "{answer}");
    assert_eq!(answer["result"]["structuredContent"]["ok"], json!(true), "{answer}");
    for (id, method) in [(2, "tasks/get"), (3, "tasks/cancel")] {
        let refused = client.request(id, method, json!({"taskId": "x"})).await;
        assert_eq!(refused["error"]["code"], json!(MISSING_CAPABILITY), "{method}: {refused}");
    }
    client.close().await;
}

#[tokio::test]
async fn closing_the_conversation_cancels_its_tasks() {
    let test = setup(Mode::Bypass);
    let mut client = test.client();
    client.initialize(LEGACY, with_tasks()).await;
    let command = json!({"command": "echo $$ > pid; exec sleep 300"});
    let created =
        client.request(1, "tools/call", json!({"name": "run_command", "arguments": command})).await;
    assert_eq!(created["result"]["resultType"], json!("task"), "{created}");
    let pid_file = test.root.join("pid");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let pid = loop {
        if let Some(pid) = read_pid(&pid_file) {
            break pid;
        }
        assert!(tokio::time::Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    client.close().await;
    while process_alive(pid) {
        assert!(tokio::time::Instant::now() < deadline, "the command outlived its conversation");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn modern_meta(capabilities: Value) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"}
    })
}

/// 2026-07-28: a call that asks is answered `input_required` first (no task yet);
/// the retry with the person's answer becomes the task, decided once.
#[tokio::test]
async fn an_approved_call_becomes_a_task_after_its_question() {
    let test = setup(Mode::Default);
    let mut client = test.client();
    let capabilities = json!({"elicitation": {"form": {}}, "extensions": {TASKS: {}}});
    let params = |extra: Value| {
        let mut params = json!({
            "name": "run_command",
            "arguments": waits_for_go(),
            "_meta": modern_meta(capabilities.clone()),
        });
        if let (Some(params), Some(extra)) = (params.as_object_mut(), extra.as_object()) {
            params.extend(extra.clone());
        }
        params
    };
    let first = client.request(1, "tools/call", params(json!({}))).await;
    assert_eq!(first["result"]["resultType"], json!("input_required"), "{first}");
    assert!(first["result"].get("taskId").is_none(), "{first}");
    let answer = json!({"action": "accept", "content": {"decision": "allow_once"}});
    let second = client
        .request(
            2,
            "tools/call",
            params(json!({
                "requestState": first["result"]["requestState"],
                "inputResponses": {"toolgate/approval": answer},
            })),
        )
        .await;
    assert_eq!(second["result"]["resultType"], json!("task"), "{second}");
    assert!(second["result"].get("requestState").is_none(), "{second}");
    let task_id = second["result"]["taskId"].clone();
    std::fs::write(test.root.join("go"), "").unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut id = 2;
    let done = loop {
        id += 1;
        let meta = modern_meta(capabilities.clone());
        let answer =
            client.request(id, "tasks/get", json!({"taskId": task_id, "_meta": meta})).await;
        if answer["result"]["status"] == json!("completed") {
            break answer["result"].clone();
        }
        assert_eq!(answer["result"]["status"], json!("working"), "{answer}");
        assert!(tokio::time::Instant::now() < deadline, "the task never settled: {answer}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(done["result"]["structuredContent"]["ok"], json!(true), "{done}");
    let records = test.records("run_command");
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].decision.decided_by, DecidedBy::Person, "{records:?}");
    client.close().await;
}

/// One stateless (2026-07-28) request over Streamable HTTP with `token`; the JSON-RPC
/// answer (from a JSON body or the SSE event that carries it).
async fn stateless(
    addr: std::net::SocketAddr,
    token: &str,
    method: &str,
    name: &str,
    params: Value,
) -> Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut params = params;
    params["_meta"] = modern_meta(with_tasks());
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Authorization: Bearer {token}\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: {method}\r\nMcp-Name: {name}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut raw)).await.unwrap().unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    raw.lines()
        .filter_map(|line| line.strip_prefix("data:").map(str::trim).or(Some(line.trim())))
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|value| value.get("id") == Some(&json!(1)))
        .unwrap_or_else(|| panic!("no answer in {raw}"))
}

/// Over HTTP, a task outlives the stateless request that started it, and belongs to
/// the token that started it: another token can neither read nor cancel it.
#[tokio::test]
async fn over_http_a_task_belongs_to_its_token() {
    const OWNER: &str = "owner-7Hq2xLp9Vw4Zr8Nb3Kd6";
    const OTHER: &str = "other-Xc5Tg1Mv8Qs2Jy7Fh4Re";
    let test = setup(Mode::Bypass);
    let options = McpOptions {
        tokens: toolgate::auth::TokenSet::from_pairs([("owner", OWNER), ("other", OTHER)]).unwrap(),
        task_after: Duration::ZERO,
        ..McpOptions::default()
    };
    let router = toolgate::mcp::http_router(test.daemon.clone(), options);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = test.daemon.shutdown_token().clone();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
    });

    let arguments = json!({"command": "echo $$ > pid; exec sleep 300"});
    let created = stateless(
        addr,
        OWNER,
        "tools/call",
        "run_command",
        json!({"name": "run_command", "arguments": arguments}),
    )
    .await;
    assert_eq!(created["result"]["resultType"], json!("task"), "{created}");
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    let pid_file = test.root.join("pid");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let pid = loop {
        if let Some(pid) = read_pid(&pid_file) {
            break pid;
        }
        assert!(tokio::time::Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };

    // The request is over; the call goes on, and only its owner sees it.
    let params = json!({"taskId": task_id});
    for method in ["tasks/get", "tasks/cancel"] {
        let refused = stateless(addr, OTHER, method, &task_id, params.clone()).await;
        assert_eq!(refused["error"]["code"], json!(-32602), "{method}: {refused}");
    }
    assert!(process_alive(pid), "another token's tasks/cancel reached the call");
    let seen = stateless(addr, OWNER, "tasks/get", &task_id, params.clone()).await;
    assert_eq!(seen["result"]["status"], json!("working"), "{seen}");

    let ack = stateless(addr, OWNER, "tasks/cancel", &task_id, params.clone()).await;
    assert_eq!(ack["result"]["resultType"], json!("complete"), "{ack}");
    while process_alive(pid) {
        assert!(tokio::time::Instant::now() < deadline, "the command outlived its task");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    test.daemon.begin_shutdown();
    let _ = tokio::time::timeout(PATIENCE, server).await;
}

// --- The bounds of one identity's tasks, on the real binary ----------------------

/// Running tasks per identity (`MAX_RUNNING_TASKS`).
const MAX_RUNNING_TASKS: usize = 64;
/// Bytes of finished tasks' results kept per identity (`MAX_FINISHED_BYTES`).
const MAX_FINISHED_BYTES: usize = 64 * 1024 * 1024;

/// Creates `go` in a workspace when dropped, so that commands waiting for it end
/// whatever the test's outcome.
struct Go<'a>(&'a Path);

impl Drop for Go<'_> {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("go"), "");
    }
}

/// A `run_command` call that creates `marker` and then waits for `go`.
fn marks_then_waits(marker: &str) -> Value {
    let command = format!("touch {marker}; while [ ! -e go ]; do sleep 0.3; done; echo done");
    json!({"name": "run_command", "arguments": {"command": command}})
}

/// Polls task `task_id` of `token` over stateless requests until it is terminal.
async fn settled_over_http(addr: SocketAddr, token: &str, task_id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let params = json!({"taskId": task_id});
        let answer = stateless(addr, token, "tasks/get", task_id, params).await;
        let status = answer["result"]["status"].as_str().unwrap_or_default().to_owned();
        if ["completed", "failed", "cancelled"].contains(&status.as_str()) {
            return answer["result"].clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "the task never settled: {answer}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The bound on running tasks holds for calls that start together: each takes its
/// place when it starts, not when it becomes a task, so the calls past the bound are
/// answered when they finish, however many were in flight before any became a task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_started_together_never_run_more_tasks_than_the_bound() {
    const FIRST: &str = "first-7Hq2xLp9Vw4Zr8Nb3Kd6";
    const SECOND: &str = "second-Xc5Tg1Mv8Qs2Jy7Fh4Re";
    const CALLS: usize = MAX_RUNNING_TASKS + 16;
    let home = Home::new();
    let (port, running) = start_mcp_http(&home, &[("first", FIRST), ("second", SECOND)], "");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let workspace = home.path().join("workspace");
    let _go = Go(&workspace);
    let calls: Vec<_> = (0..CALLS)
        .map(|index| {
            let call = marks_then_waits(&format!("started-{index}"));
            tokio::spawn(stateless(addr, FIRST, "tools/call", "run_command", call))
        })
        .collect();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while (0..CALLS).any(|index| !workspace.join(format!("started-{index}")).exists()) {
        assert!(tokio::time::Instant::now() < deadline, "not every call started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Another identity's call, started after every one of the first's, becomes a task
    // once it has run the threshold: by then each of the first's calls has run it too.
    let clock = stateless(addr, SECOND, "tools/call", "run_command", marks_then_waits("clock"));
    let clock = clock.await;
    assert_eq!(clock["result"]["resultType"], json!("task"), "{clock}");
    std::fs::write(workspace.join("go"), "").unwrap();

    let (mut tasks, mut answered) = (Vec::new(), 0);
    for call in calls {
        let answer = call.await.unwrap();
        if answer["result"]["resultType"] == json!("task") {
            tasks.push(answer["result"]["taskId"].as_str().unwrap().to_owned());
        } else {
            assert_eq!(answer["result"]["structuredContent"]["ok"], json!(true), "{answer}");
            answered += 1;
        }
    }
    assert_eq!((tasks.len(), answered), (MAX_RUNNING_TASKS, CALLS - MAX_RUNNING_TASKS));
    for task in &tasks {
        let done = settled_over_http(addr, FIRST, task).await;
        assert_eq!(done["status"], json!("completed"), "{done}");
    }
    let clock_task = clock["result"]["taskId"].as_str().unwrap();
    assert_eq!(settled_over_http(addr, SECOND, clock_task).await["status"], json!("completed"));
    drop(running);
}

/// Finished tasks are kept within a byte budget per identity: once their results
/// exceed it, those that finished first are forgotten (`tasks/get` says they do not
/// exist), and what is still readable fits the budget.
#[test]
fn finished_tasks_are_kept_within_a_byte_budget_per_identity() {
    const TOKEN: &str = "budget-7Hq2xLp9Vw4Zr8Nb3Kd6";
    // Twelve results of two copies (text and structured) of 4 MB each: 96 MB.
    const CALLS: u64 = 12;
    let home = Home::new();
    let config = "[limits]\nmax_output_bytes = 4194304\n";
    let (port, running) = start_mcp_http(&home, &[("budget", TOKEN)], config);
    // Before 2025-06-18 a client takes no resource links: a long result is kept whole.
    let capabilities = json!({"extensions": {TASKS: {}}});
    let session = mcp_session(port, TOKEN, "2025-03-26", capabilities);
    let session = session.as_str();
    // Each call outlives the threshold, so each becomes a task.
    let command = json!({"command": "head -c 4000000 /dev/zero | tr '\\0' x; sleep 3"});
    let tasks: Vec<String> = std::thread::scope(|scope| {
        let calls: Vec<_> = (0..CALLS)
            .map(|id| {
                let call = tools_call(id, "run_command", command.clone());
                scope.spawn(move || {
                    let reply = mcp_exchange(port, TOKEN, "POST", Some(session), Some(&call));
                    let answer = reply.answer(id);
                    let task = answer["result"]["taskId"].as_str();
                    task.unwrap_or_else(|| panic!("not a task: {answer}")).to_owned()
                })
            })
            .collect();
        calls.into_iter().map(|call| call.join().unwrap()).collect()
    });
    let mut next = CALLS;
    let mut get = |task: &str| {
        next += 1;
        let body = json!({"jsonrpc": "2.0", "id": next, "method": "tasks/get",
                          "params": {"taskId": task}});
        mcp_exchange(port, TOKEN, "POST", Some(session), Some(&body)).answer(next)
    };
    // Each task ends (or is already forgotten).
    let deadline = std::time::Instant::now() + PATIENCE;
    for task in &tasks {
        loop {
            let answer = get(task);
            if answer.get("error").is_some() || answer["result"]["status"] != json!("working") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the task never ended: {answer}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let (mut kept, mut kept_bytes, mut forgotten) = (0, 0, 0);
    for task in &tasks {
        let answer = get(task);
        if answer.get("error").is_some() {
            assert_eq!(answer["error"]["code"], json!(-32602), "{answer}");
            forgotten += 1;
            continue;
        }
        assert_eq!(answer["result"]["status"], json!("completed"), "{answer}");
        let result = &answer["result"]["result"];
        assert_eq!(result["structuredContent"]["ok"], json!(true));
        kept += 1;
        kept_bytes += result.to_string().len();
    }
    assert!(forgotten > 0, "all {kept} results kept: {kept_bytes} bytes");
    assert!(kept > 0 && kept_bytes <= MAX_FINISHED_BYTES, "{kept} results: {kept_bytes} bytes");
    drop(running);
}
