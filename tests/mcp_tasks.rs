//! The MCP tasks extension (`io.modelcontextprotocol/tasks`): a call that outlives
//! the face's task threshold is answered with a task, polled with `tasks/get`,
//! canceled with `tasks/cancel` (the same cancellation as `notifications/cancelled`:
//! the process tree dies), and is the same call as a plain one (decided once, one
//! audit record). The threshold is zero here, so a call still running at its first
//! wait becomes a task; every command waits on a file the test creates, never on time.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod mcp_support;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
