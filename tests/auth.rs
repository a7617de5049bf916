//! Authentication of the network faces of the real binary beyond the checks every
//! face shares (those are rows of the one faces table, tests/faces.rs): the token's
//! name as the client's identity, no OAuth metadata served, and the token file
//! generated for an MCP HTTP listener that was given none.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod auth_support;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use auth_support::{
    Home, NetFace, PATIENCE, Running, TOKENS, exchange, free_port, run_to_end, start_every_face,
    wait_for_file,
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
