//! Authentication of the network faces of the real binary beyond the checks every
//! face shares (those are rows of the one faces table, tests/faces.rs): the token's
//! name as the client's identity (an MCP HTTP session answers only its own token), no
//! OAuth metadata served, and the token file generated for an MCP HTTP listener that
//! was given none.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod auth_support;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use auth_support::{
    Home, NetFace, PATIENCE, Running, TOKENS, exchange, free_port, mcp_exchange, mcp_session,
    run_to_end, start_every_face, start_mcp_http, tools_call, wait_for_file,
};
use serde_json::{Value, json};

#[test]
fn mcp_http_publishes_no_oauth_metadata() {
    let home = Home::new();
    let (faces, _running) = start_every_face(&home);
    for (face, port) in faces {
        if !matches!(face, NetFace::McpServe | NetFace::McpCommand) {
            continue;
        }
        for path in [
            "/.well-known/oauth-protected-resource",
            "/.well-known/oauth-protected-resource/mcp",
            "/.well-known/oauth-authorization-server",
            "/.well-known/openid-configuration",
            "/register",
        ] {
            let reply = exchange(
                port,
                &format!(
                    "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
                ),
            );
            assert_eq!(reply.status, 404, "{face:?} {path}: {}", reply.head);
            // A client that tried OAuth anyway ends on such a 404 (registration is
            // the last step): its body says how to authenticate instead.
            assert!(
                reply.body.contains("Authorization: Bearer"),
                "{face:?} {path}: {}",
                reply.body
            );
        }
    }
}

/// Initializes an MCP session with `secret` and reads `hello.txt` through it.
fn mcp_read_file(port: u16, secret: &str) {
    let auth = format!("Authorization: Bearer {secret}\r\n");
    let post = |session: Option<&str>, body: Value| {
        let body = body.to_string();
        let session = session
            .map(|id| format!("Mcp-Session-Id: {id}\r\nMCP-Protocol-Version: 2025-11-25\r\n"));
        exchange(
            port,
            &format!(
                "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n{auth}{}\
                 Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                session.unwrap_or_default(),
                body.len()
            ),
        )
    };
    let reply = post(
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "auth-test", "version": "1"}}}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    let session = reply.header("mcp-session-id").unwrap();
    let reply =
        post(Some(&session), json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    assert_eq!(reply.status, 202, "{}", reply.body);
    let reply = post(
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "read_file", "arguments": {"path": "hello.txt"}}}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.body.contains("hello"), "{}", reply.body);
}

#[test]
fn the_token_name_identifies_the_client_in_the_audit_log() {
    let home = Home::new();
    let (faces, running) = start_every_face(&home);
    let tcp = faces.iter().find(|(face, _)| matches!(face, NetFace::TcpHttp)).unwrap().1;
    let mcp = faces.iter().find(|(face, _)| matches!(face, NetFace::McpServe)).unwrap().1;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "read_file", "arguments": {"path": "hello.txt"}}})
    .to_string();
    let reply = exchange(
        tcp,
        &format!(
            "POST /rpc HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer {}\r\n\
             Content-Length: {}\r\n\r\n{body}",
            TOKENS[1].1,
            body.len()
        ),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    mcp_read_file(mcp, TOKENS[2].1);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let clients: Vec<String> = home
            .audit_records()
            .iter()
            .map(|record| record["client"].as_str().unwrap_or_default().to_owned())
            .collect();
        if clients.contains(&"token:laptop".to_owned())
            && clients.contains(&"token:editor".to_owned())
        {
            break;
        }
        assert!(Instant::now() < deadline, "audit clients: {clients:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(running);
}

#[test]
fn mcp_http_without_a_token_file_generates_a_private_token() {
    let home = Home::new();
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let config = home.config("");
    let mut command =
        home.command(&["mcp", "--config", config.to_str().unwrap(), "--http", &address]);
    command.stderr(Stdio::piped());
    let mut running = Running::start(command, &[port]);
    let dir = home.path().join("run").join("toolgate");
    // The port accepts connections once bound, a moment before the token is written.
    let expected = dir.join(format!("mcp-http-{port}.tokens"));
    wait_for_file(&expected);
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.file_name().is_some_and(|name| name.to_string_lossy().contains("mcp")))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let mode = std::fs::metadata(&files[0]).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let lines: Vec<&str> = text.lines().filter(|line| !line.starts_with('#')).collect();
    assert_eq!(lines.len(), 1, "{text}");
    let (name, secret) = lines[0].split_once(':').unwrap();
    assert_eq!(name, "mcp");
    assert!(secret.len() >= 32, "{secret}");

    assert_eq!(NetFace::McpCommand.attempt(port, None).status, 401);
    let reply = NetFace::McpCommand.attempt(port, Some(&format!("Bearer {secret}")));
    assert_eq!(reply.status, 200, "{}", reply.body);

    // The user is told where the token is and how to send it (never the secret).
    let _ = running.child.kill();
    let _ = running.child.wait();
    let mut stderr = String::new();
    running.child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(stderr.contains(&files[0].display().to_string()), "{stderr}");
    assert!(stderr.contains("Authorization: Bearer"), "{stderr}");
    assert!(!stderr.contains(secret), "the secret reached the log: {stderr}");
}

#[test]
fn mcp_http_beyond_loopback_needs_a_token_file() {
    let home = Home::new();
    let config = home.config("");
    let address = format!("0.0.0.0:{}", free_port());
    let output = run_to_end(home.command(&[
        "mcp",
        "--config",
        config.to_str().unwrap(),
        "--http",
        &address,
    ]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("token_file"), "{stderr}");
    // Nothing was generated for an address that is refused.
    let generated = home.path().join("run").join("toolgate");
    assert!(!generated.exists() || std::fs::read_dir(&generated).unwrap().next().is_none());
}

#[test]
fn the_daemons_mcp_http_without_a_token_file_generates_one_too() {
    let home = Home::new();
    let port = free_port();
    let config = home.config(&format!("[server]\nmcp_http = \"127.0.0.1:{port}\"\n"));
    let socket = home.path().join("run").join("toolgate").join("toolgate.sock");
    let serve = home.command(&[
        "serve",
        "--config",
        config.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
    ]);
    let _daemon = Running::start(serve, &[port]);
    let path = home.path().join("run").join("toolgate").join(format!("mcp-http-{port}.tokens"));
    wait_for_file(&path);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    let text = std::fs::read_to_string(&path).unwrap();
    let secret = text.lines().find_map(|line| line.strip_prefix("mcp:")).unwrap();
    assert_eq!(NetFace::McpServe.attempt(port, None).status, 401);
    let reply = NetFace::McpServe.attempt(port, Some(&format!("Bearer {secret}")));
    assert_eq!(reply.status, 200, "{}", reply.body);
}

/// An MCP session over HTTP belongs to the token that opened it: another token that
/// learns its id is answered exactly as for a session that does not exist, and
/// reaches nothing of it (not its background processes).
#[test]
fn an_mcp_session_answers_only_the_token_that_opened_it() {
    const ALICE: &str = "alice-7Hq2xLp9Vw4Zr8Nb3Kd6";
    const BOB: &str = "bob-Xc5Tg1Mv8Qs2Jy7Fh4Re";
    let home = Home::new();
    let (port, running) = start_mcp_http(&home, &[("alice", ALICE), ("bob", BOB)], "");
    let session = mcp_session(port, ALICE, "2025-11-25", json!({}));
    let command = json!({"command": "echo $$ > bg.pid; exec sleep 300", "background": true});
    let started = mcp_exchange(
        port,
        ALICE,
        "POST",
        Some(&session),
        Some(&tools_call(1, "run_command", command)),
    );
    let started = started.answer(1);
    let process = started["result"]["structuredContent"]["metadata"]["process_id"].clone();
    assert!(process.is_string(), "{started}");
    let pid_file = home.path().join("workspace").join("bg.pid");
    wait_for_file(&pid_file);
    let pid = loop {
        let text = std::fs::read_to_string(&pid_file).unwrap_or_default();
        if let Ok(pid) = text.trim().parse::<i32>() {
            break pid;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _stopped = KillOnDrop(pid);
    let alive = |pid: i32| std::path::Path::new(&format!("/proc/{pid}")).exists();

    // Bob, with his own valid token and Alice's session id, next to Bob with an id
    // nobody was given: the same answers, whatever he asks.
    let made_up = "0123456789abcdef0123456789abcdef";
    let list = tools_call(2, "process_list", json!({}));
    let kill = tools_call(3, "process_kill", json!({"id": process}));
    let ping = json!({"jsonrpc": "2.0", "id": 4, "method": "ping"});
    for (method, body) in
        [("POST", Some(&list)), ("POST", Some(&kill)), ("POST", Some(&ping)), ("GET", None)]
    {
        let foreign = mcp_exchange(port, BOB, method, Some(&session), body);
        let unknown = mcp_exchange(port, BOB, method, Some(made_up), body);
        assert_eq!(foreign.status, 404, "{method} {body:?}: {} {}", foreign.head, foreign.body);
        assert_eq!((foreign.status, &foreign.body), (unknown.status, &unknown.body));
    }
    let foreign = mcp_exchange(port, BOB, "DELETE", Some(&session), None);
    let unknown = mcp_exchange(port, BOB, "DELETE", Some(made_up), None);
    assert_eq!((foreign.status, &foreign.body), (unknown.status, &unknown.body));
    assert!(alive(pid), "another token's request reached the session's process");

    // Alice's session is untouched: her process is listed, and she ends it.
    let listed = mcp_exchange(port, ALICE, "POST", Some(&session), Some(&list)).answer(2);
    let processes = &listed["result"]["structuredContent"]["metadata"]["processes"];
    assert_eq!(processes[0]["id"], process, "{listed}");
    let killed = mcp_exchange(port, ALICE, "POST", Some(&session), Some(&kill)).answer(3);
    assert_eq!(killed["result"]["structuredContent"]["ok"], json!(true), "{killed}");
    let deadline = Instant::now() + PATIENCE;
    while alive(pid) {
        assert!(Instant::now() < deadline, "the background process outlived process_kill");
        std::thread::sleep(Duration::from_millis(10));
    }
    let deleted = mcp_exchange(port, ALICE, "DELETE", Some(&session), None);
    assert_eq!(deleted.status, 200, "{}", deleted.body);
    let gone = mcp_exchange(port, ALICE, "POST", Some(&session), Some(&ping));
    assert_eq!(gone.status, 404, "{}", gone.body);
    drop(running);
}

/// Kills a `sleep` the test made the daemon start, whatever the test's outcome (and
/// only while that pid is still a `sleep`).
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", self.0)).unwrap_or_default();
        if comm.trim() != "sleep" {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(self.0);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
}
