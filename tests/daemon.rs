//! End-to-end tests of the daemon: the real `toolgate serve` binary on a temporary
//! socket, spoken to as an editor plugin would (NDJSON, or WebSocket on the same socket).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod support;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use support::{TestDaemon, processes_with};

/// A daemon whose workspace holds `hello.txt`.
fn start(config: &str) -> TestDaemon {
    TestDaemon::start_with(config, |dir| {
        std::fs::write(dir.join("workspace/hello.txt"), "hello\nworld\n").unwrap();
    })
}

/// A marker that makes this test's processes findable in /proc.
fn marker() -> String {
    format!("{}.{}", 900 + std::process::id() % 97, std::process::id())
}

/// Waits (bounded) until no live process carries `needle`.
fn assert_gone(needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_with(needle).is_empty() {
        assert!(
            Instant::now() < deadline,
            "processes outlived their call: {:?}",
            processes_with(needle)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (bounded) until a process carrying `needle` runs.
fn wait_started(needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes_with(needle).is_empty() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    }
}

const BYPASS: &str = "[permissions]\nmode = \"bypass\"\n";

#[test]
fn lists_and_calls_tools() {
    let daemon = start("");
    let mut client = daemon.connect();
    let tools = client.result("tools/list", json!({}));
    let names: Vec<&str> =
        tools["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "apply_patch",
            "edit_file",
            "exit_plan_mode",
            "find_files",
            "notebook_edit",
            "process_kill",
            "process_list",
            "process_read",
            "process_resize",
            "process_write",
            "read_file",
            "run_command",
            "search_code",
            "todo_write",
            "write_file"
        ]
    );
    let result = client
        .result("tools/call", json!({"name": "read_file", "arguments": {"path": "hello.txt"}}));
    assert_eq!(result["ok"], true, "{result}");
    assert!(result["content"].as_str().unwrap().contains("hello"));
    assert_eq!(result["metadata"]["call_id"], "2");
    // Raw argument text from a model is accepted as a string.
    let result = client.result(
        "tools/call",
        json!({"name": "read_file", "arguments": "{\"path\": \"hello.txt\"}"}),
    );
    assert_eq!(result["ok"], true, "{result}");
}

#[test]
fn call_batch_keeps_order() {
    let daemon = start("");
    let mut client = daemon.connect();
    let result = client.result(
        "tools/call_batch",
        json!({"calls": [
            {"id": "a", "name": "read_file", "arguments": {"path": "hello.txt"}},
            {"id": "b", "name": "nope", "arguments": {}},
            {"id": "c", "name": "find_files", "arguments": {"pattern": "*.txt"}},
            {"id": "d", "name": "run_command", "arguments": {"command": "cargo test"}}
        ]}),
    );
    let results = result["results"].as_array().unwrap();
    let ids: Vec<&str> =
        results.iter().map(|r| r["metadata"]["call_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["a", "b", "c", "d"]);
    assert_eq!(results[1]["error_type"], "unknown_tool");
    // Nobody subscribed, so nobody can approve the command in the default mode.
    assert_eq!(results[3]["error_type"], "permission_denied");
    assert!(
        results[3]["error"]
            .as_str()
            .unwrap()
            .contains("add an allow rule such as run_command(cargo"),
        "{}",
        results[3]
    );
}

#[test]
fn events_come_in_order_per_call() {
    let daemon = start(BYPASS);
    let mut client = daemon.connect();
    client.result("events/subscribe", json!({}));
    let id = client.send("tools/call", json!({"name": "run_command", "arguments": {"command": "echo one; echo two >&2"}, "call_id": "e1"}));
    let response = client.response(id);
    assert_eq!(response["result"]["ok"], true, "{response}");
    let mut kinds = Vec::new();
    loop {
        let event = client.event(|event| event["call_id"] == "e1");
        let kind = event["type"].as_str().unwrap().to_owned();
        kinds.push(kind.clone());
        if kind == "tool_call_done" {
            break;
        }
    }
    assert_eq!(kinds.first().map(String::as_str), Some("tool_call_start"));
    assert_eq!(&kinds[kinds.len() - 2..], ["tool_result", "tool_call_done"]);
    assert!(kinds[1..kinds.len() - 2].iter().all(|kind| kind == "tool_output"), "{kinds:?}");
    assert!(kinds.len() >= 3, "{kinds:?}");
}

#[test]
fn events_before_subscribing_are_not_lost() {
    let daemon = start("");
    let mut client = daemon.connect();
    client.result(
        "tools/call",
        json!({"name": "read_file", "arguments": {"path": "hello.txt"}, "call_id": "early"}),
    );
    client.result("events/subscribe", json!({}));
    let start = client.event(|event| event["call_id"] == "early");
    assert_eq!(start["type"], "tool_call_start");
    let done =
        client.event(|event| event["call_id"] == "early" && event["type"] == "tool_call_done");
    assert_eq!(done["session_id"], start["session_id"]);
}

#[test]
fn tools_cancel_kills_the_running_command() {
    let daemon = start(BYPASS);
    let mark = marker();
    let mut client = daemon.connect();
    let id = client.send("tools/call", json!({"name": "run_command", "arguments": {"command": format!("sleep {mark}")}, "call_id": "slow"}));
    wait_started(&format!("sleep {mark}"));
    let mut other = daemon.connect();
    // Another connection cannot reach this connection's calls.
    assert_eq!(other.result("tools/cancel", json!({"call_id": "slow"}))["canceled"], 0);
    assert!(!processes_with(&format!("sleep {mark}")).is_empty());
    let canceled = client.result("tools/cancel", json!({"call_id": "slow"}));
    assert_eq!(canceled["canceled"], 1);
    let response = client.response(id);
    assert_eq!(response["result"]["error_type"], "canceled", "{response}");
    assert_gone(&format!("sleep {mark}"));
}

#[test]
fn cancel_request_notification_cancels_by_request_id() {
    let daemon = start(BYPASS);
    let mark = marker();
    let mut client = daemon.connect();
    let id = client.send(
        "tools/call",
        json!({"name": "run_command", "arguments": {"command": format!("sleep {mark}")}}),
    );
    wait_started(&format!("sleep {mark}"));
    client.send_line(
        &json!({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": id}}).to_string(),
    );
    let response = client.response(id);
    assert_eq!(response["result"]["error_type"], "canceled", "{response}");
    assert_gone(&format!("sleep {mark}"));
}

#[test]
fn disconnect_mid_call_kills_the_command() {
    let daemon = start(BYPASS);
    let mark = marker();
    let mut client = daemon.connect();
    client.send(
        "tools/call",
        json!({"name": "run_command", "arguments": {"command": format!("sleep {mark}")}}),
    );
    wait_started(&format!("sleep {mark}"));
    drop(client);
    assert_gone(&format!("sleep {mark}"));
    // The daemon is fine.
    let mut again = daemon.connect();
    assert!(again.result("daemon/status", json!({}))["version"].is_string());
}

#[test]
fn approval_round_trip_over_the_socket() {
    let daemon = start("");
    let mut client = daemon.connect();
    client.result("events/subscribe", json!({}));
    let id = client.send(
        "tools/call",
        json!({"name": "write_file", "arguments": {"path": "new.txt", "content": "hi"}}),
    );
    let request = client.event(|event| event["type"] == "permission_request");
    assert_eq!(request["tool"], "write_file");
    assert!(request["suggestions"].as_array().is_some_and(|s| !s.is_empty()), "{request}");
    let answered = client.result(
        "permission/respond",
        json!({"request_id": request["request_id"], "decision": "allow", "scope": "once"}),
    );
    assert_eq!(answered["resolved"], true);
    let response = client.response(id);
    assert_eq!(response["result"]["ok"], true, "{response}");
    assert_eq!(std::fs::read_to_string(daemon.workspace().join("new.txt")).unwrap(), "hi");
    let resolved = client.event(|event| event["type"] == "permission_resolved");
    assert_eq!(resolved["decision"], "allow");

    // A denial.
    let id = client.send(
        "tools/call",
        json!({"name": "write_file", "arguments": {"path": "other.txt", "content": "x"}}),
    );
    let request = client.event(|event| event["type"] == "permission_request");
    client.result(
        "permission/respond",
        json!({"request_id": request["request_id"], "decision": "deny"}),
    );
    let response = client.response(id);
    assert_eq!(response["result"]["error_type"], "permission_denied", "{response}");
    assert!(!daemon.workspace().join("other.txt").exists());
}

#[test]
fn dont_ask_denies_without_an_approver() {
    let daemon = start("[permissions]\nmode = \"dont_ask\"\nallow = [\"run_command(echo:*)\"]\n");
    let mut client = daemon.connect();
    client.result("events/subscribe", json!({}));
    let denied = client
        .result("tools/call", json!({"name": "run_command", "arguments": {"command": "touch x"}}));
    assert_eq!(denied["error_type"], "permission_denied", "{denied}");
    assert!(!daemon.workspace().join("x").exists());
    let allowed = client
        .result("tools/call", json!({"name": "run_command", "arguments": {"command": "echo ok"}}));
    assert_eq!(allowed["ok"], true, "{allowed}");
}

#[test]
fn more_waiting_calls_than_a_connection_runs_at_once_are_all_answered() {
    // 356 pipelined calls that each wait (a short sleep, 64 at a time per session): past
    // the 256 requests a connection runs at once, it stops reading and goes on
    // writing answers until calls end; every call is answered.
    let daemon = start("[server]\nmax_calls_per_session = 64\n[permissions]\nmode = \"bypass\"\n");
    let mut client = daemon.connect();
    let count = 356u64;
    let mut lines = String::new();
    for id in 1..=count {
        let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "run_command", "arguments": {"command": "sleep 0.2"}}});
        lines.push_str(&request.to_string());
        lines.push('\n');
    }
    let mut writer = client.writer.try_clone().unwrap();
    let writing = std::thread::spawn(move || writer.write_all(lines.as_bytes()).unwrap());
    let mut answered = Vec::new();
    while answered.len() < count as usize {
        let message = client.read();
        let Some(id) = message.get("id").and_then(Value::as_u64) else { continue };
        assert_eq!(message["result"]["ok"], true, "{message}");
        answered.push(id);
    }
    writing.join().unwrap();
    answered.sort_unstable();
    assert_eq!(answered, (1..=count).collect::<Vec<_>>());
    let status = client.result("daemon/status", json!({}));
    assert_eq!(status["calls_in_flight"], 0, "{status}");
}

#[test]
fn malformed_lines_and_unknown_methods_keep_the_connection() {
    let daemon = start("");
    let mut client = daemon.connect();
    client.send_line("{this is not json");
    let error = client.read();
    assert_eq!(error["error"]["code"], -32700, "{error}");
    let unknown = client.request("tools/teleport", json!({}));
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    let bad_params = client.request("tools/call", json!({"arguments": {}}));
    assert_eq!(bad_params["error"]["code"], -32602, "{bad_params}");
    assert!(client.result("daemon/status", json!({}))["uptime_ms"].is_u64());
}

#[test]
fn a_huge_line_is_refused_and_the_daemon_lives() {
    let daemon = start("");
    let mut client = daemon.connect();
    let huge = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{{\"x\":\"{}\"}}}}",
        "a".repeat(100 * 1024 * 1024)
    );
    let writer = client.writer.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let mut writer = writer;
        writer.write_all(huge.as_bytes())?;
        writer.write_all(b"\n")
    });
    let error = client.read();
    assert_eq!(error["error"]["code"], -32600, "{error}");
    sender.join().unwrap().unwrap();
    assert!(client.result("daemon/status", json!({}))["version"].is_string());
}

#[test]
fn a_client_cannot_widen_its_roots_or_mode() {
    let daemon = start("");
    let mut client = daemon.connect();
    let outside = daemon.dir.path().to_string_lossy().into_owned();
    let refused = client.request("session/open", json!({"roots": [outside]}));
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let refused = client.request("session/open", json!({"cwd": "/"}));
    assert!(refused.get("error").is_some(), "{refused}");
    let mode = client.request("session/open", json!({"mode": "bypass"}));
    // The configured mode (default) is the ceiling: bypass is narrowed to it.
    assert_eq!(mode["result"]["mode"], "default", "{mode}");
    std::fs::create_dir(daemon.workspace().join("sub")).unwrap();
    let narrowed = client.result("session/open", json!({"roots": ["sub"], "mode": "plan"}));
    assert_eq!(narrowed["roots"][0], daemon.workspace().join("sub").to_string_lossy().as_ref());
    let session = narrowed["session_id"].clone();
    let outside_root = client.result(
        "tools/call",
        json!({"name": "read_file", "arguments": {"path": "../hello.txt"}, "session_id": session}),
    );
    assert_eq!(outside_root["error_type"], "access_denied", "{outside_root}");
    let tools = client.result("tools/list", json!({"session_id": session}));
    let names: Vec<&str> =
        tools["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(!names.contains(&"write_file"), "{names:?}");
}

#[test]
fn a_second_client_is_unaffected_by_the_first_ones_cancel() {
    let daemon = start(BYPASS);
    let mark_a = format!("{}1", marker());
    let mark_b = format!("{}2", marker());
    let mut first = daemon.connect();
    let mut second = daemon.connect();
    let first_id = first.send("tools/call", json!({"name": "run_command", "arguments": {"command": format!("sleep {mark_a}")}, "call_id": "same"}));
    let second_id = second.send("tools/call", json!({"name": "run_command", "arguments": {"command": format!("sleep {mark_b}; echo survived"), "timeout_ms": 100000}, "call_id": "same"}));
    wait_started(&format!("sleep {mark_a}"));
    wait_started(&format!("sleep {mark_b}"));
    assert_eq!(first.result("tools/cancel", json!({"call_id": "same"}))["canceled"], 1);
    assert_eq!(first.response(first_id)["result"]["error_type"], "canceled");
    assert_gone(&format!("sleep {mark_a}"));
    assert!(
        !processes_with(&format!("sleep {mark_b}")).is_empty(),
        "the other client's call died too"
    );
    drop(second.writer.shutdown(std::net::Shutdown::Write));
    let _ = second_id;
    assert_gone(&format!("sleep {mark_b}"));
}

#[test]
fn sigterm_with_a_call_in_flight_exits_cleanly() {
    let mut daemon = start(&format!("{BYPASS}[server]\nshutdown_grace_ms = 200\n"));
    let mark = marker();
    let mut client = daemon.connect();
    client.send(
        "tools/call",
        json!({"name": "run_command", "arguments": {"command": format!("sleep {mark}")}}),
    );
    wait_started(&format!("sleep {mark}"));
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait_exit(), Some(0));
    assert_gone(&format!("sleep {mark}"));
    assert!(!daemon.socket.exists(), "the socket file was left behind");
}

#[test]
fn sighup_with_a_broken_config_keeps_the_old_one() {
    let daemon = start("[permissions]\nmode = \"dont_ask\"\nallow = [\"run_command(echo:*)\"]\n");
    let mut client = daemon.connect();
    std::fs::write(daemon.dir.path().join("config.toml"), "[permissions\nmode = ").unwrap();
    daemon.signal(Signal::SIGHUP);
    // Give the reload a moment, then prove the old rules still hold and the
    // connection survived.
    std::thread::sleep(Duration::from_millis(300));
    let allowed = client.result(
        "tools/call",
        json!({"name": "run_command", "arguments": {"command": "echo still"}}),
    );
    assert_eq!(allowed["ok"], true, "{allowed}");

    // A good config is picked up without dropping the connection.
    std::fs::write(
        daemon.dir.path().join("config.toml"),
        "[permissions]\nmode = \"dont_ask\"\ndeny = [\"run_command(echo:*)\"]\n",
    )
    .unwrap();
    daemon.signal(Signal::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let result = client.result(
            "tools/call",
            json!({"name": "run_command", "arguments": {"command": "echo now"}}),
        );
        if result["error_type"] == "permission_denied" {
            break;
        }
        assert!(Instant::now() < deadline, "the new config was never applied: {result}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_socket_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let daemon = start("");
    let socket_mode = std::fs::metadata(&daemon.socket).unwrap().permissions().mode() & 0o777;
    let dir_mode =
        std::fs::metadata(daemon.socket.parent().unwrap()).unwrap().permissions().mode() & 0o777;
    assert_eq!((socket_mode, dir_mode), (0o600, 0o700));
}

#[test]
fn websocket_on_the_unix_socket() {
    use tokio_tungstenite::tungstenite::{Message, client};
    let daemon = start("");
    let stream = UnixStream::connect(&daemon.socket).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let (mut socket, _) = client::client("ws://localhost/", stream).unwrap();
    let request = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "read_file", "arguments": {"path": "hello.txt"}}});
    socket.send(Message::text(request.to_string())).unwrap();
    loop {
        let message = socket.read().unwrap();
        if let Message::Text(text) = message {
            let value: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(value["id"], 1);
            assert_eq!(value["result"]["ok"], true, "{value}");
            break;
        }
    }
}

#[test]
fn the_audit_log_records_calls_with_secrets_redacted() {
    let daemon = start(BYPASS);
    let mut client = daemon.connect();
    client.result("tools/call", json!({"name": "run_command", "arguments": {"command": "true", "api_token": "s3cr3t"}, "call_id": "audited"}));
    let log = daemon.dir.path().join("state/toolgate/audit.jsonl");
    let deadline = Instant::now() + Duration::from_secs(10);
    let record = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(line) = text.lines().find(|line| line.contains("\"audited\"")) {
            break serde_json::from_str::<Value>(line).unwrap();
        }
        assert!(Instant::now() < deadline, "no audit record appeared in {}", log.display());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(record["tool"], "run_command");
    assert_eq!(record["client"], format!("uid:{}", current_uid()));
    assert_eq!(record["arguments"]["api_token"], "[redacted]");
    assert_eq!(record["error_type"], "invalid_arguments");
}

fn current_uid() -> u32 {
    let output = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&output.stdout).trim().parse().unwrap()
}

/// One HTTP/1.1 request over a fresh connection; returns the status and the body.
fn http_post(addr: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let auth = token.map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    (status, body)
}

#[test]
fn tcp_requires_the_bearer_token() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "ci:correct-horse-battery\n").unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let daemon =
        start(&format!("[server]\ntcp = \"{addr}\"\ntoken_file = \"{}\"\n", tokens.display()));
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "the TCP listener never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(http_post(&addr, "/rpc", None, body).0, 401);
    assert_eq!(http_post(&addr, "/rpc", Some("wrong"), body).0, 401);
    let (status, answer) = http_post(&addr, "/rpc", Some("correct-horse-battery"), body);
    assert_eq!(status, 200, "{answer}");
    let answer: Value = serde_json::from_str(answer.trim()).unwrap();
    assert!(
        answer["result"]["tools"].as_array().is_some_and(|tools| !tools.is_empty()),
        "{answer}"
    );
    drop(daemon);
}
