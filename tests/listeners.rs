//! The listeners themselves: what `--socket` may do to the file system (the real
//! binary), and that clients which never authenticate cannot starve those that do
//! (the library's listeners with short deadlines and small pools, so that a few dozen
//! loopback connections fill them; and the real binary with fewer descriptors than
//! connections).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod auth_support;
mod support;

use std::io::Read as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{PATIENCE, within};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use toolgate::admission::Limits;
use toolgate::auth::TokenSet;
use toolgate::daemon::{Daemon, Settings};
use toolgate::mcp::McpOptions;
use toolgate::rpc::tcp::{self, TcpOptions};
use toolgate::tools::Registry;

const TOKEN: &str = "listener-7Hq2xLp9Vw4Zr8Nb3Kd6";

// --- `--socket` and the file system (the real binary) -------------------------------

/// A directory for one `toolgate serve`, with its environment.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("workspace")).unwrap();
        std::fs::write(dir.path().join("config.toml"), "").unwrap();
        Home { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn serve(&self, socket: &Path) -> Command {
        let dir = self.path();
        let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate"));
        command
            .arg("serve")
            .arg("--socket")
            .arg(socket)
            .arg("--config")
            .arg(dir.join("config.toml"))
            .current_dir(dir.join("workspace"))
            .env("HOME", dir)
            .env("XDG_CONFIG_HOME", dir.join("config-home"))
            .env("XDG_STATE_HOME", dir.join("state"))
            .env("XDG_RUNTIME_DIR", dir.join("run"))
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env("TOOLGATE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command
    }
}

/// Runs a `serve` that must refuse to start; returns its output.
fn refused(mut command: Command) -> Output {
    let mut child = command.spawn().unwrap();
    let deadline = Instant::now() + PATIENCE;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("toolgate started where it should have refused to");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    assert!(!output.status.success());
    output
}

/// A daemon that must start; killed (and reaped) on drop.
struct Running(Child);

impl Running {
    fn start(mut command: Command, socket: &Path) -> Running {
        let mut child = command.spawn().unwrap();
        let deadline = Instant::now() + PATIENCE;
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                let mut stderr = String::new();
                child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
                panic!("toolgate exited with {status}: {stderr}");
            }
            assert!(Instant::now() < deadline, "the daemon never listened");
            std::thread::sleep(Duration::from_millis(10));
        }
        Running(child)
    }

    /// Stops the daemon the way a service manager does and waits for it.
    fn stop(mut self) {
        let status = Command::new("kill").arg(self.0.id().to_string()).status().unwrap();
        assert!(status.success());
        let deadline = Instant::now() + PATIENCE;
        while self.0.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the daemon did not stop");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_regular_file_at_the_socket_path_survives() {
    let home = Home::new();
    let notes = home.path().join("notes.txt");
    std::fs::write(&notes, "my notes\n").unwrap();
    let output = refused(home.serve(&notes));
    let stderr = stderr_of(&output);
    assert!(stderr.contains("is not a socket"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "my notes\n");
    // A directory is not replaced either.
    let directory = home.path().join("a-directory");
    std::fs::create_dir(&directory).unwrap();
    let stderr = stderr_of(&refused(home.serve(&directory)));
    assert!(stderr.contains("is not a socket"), "{stderr}");
    assert!(directory.is_dir());
}

#[test]
fn an_existing_directory_keeps_its_mode() {
    let home = Home::new();
    let shared = home.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let socket = shared.join("toolgate.sock");
    let daemon = Running::start(home.serve(&socket), &socket);
    let mode = std::fs::metadata(&shared).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o1777, "the directory's mode was changed");
    let socket_mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(socket_mode, 0o600);
    daemon.stop();
    assert!(!socket.exists(), "the socket outlived the daemon");
    assert_eq!(std::fs::metadata(&shared).unwrap().permissions().mode() & 0o7777, 0o1777);

    // A directory toolgate creates is its own: 0700.
    let created = home.path().join("new").join("dir");
    let socket = created.join("toolgate.sock");
    let daemon = Running::start(home.serve(&socket), &socket);
    assert_eq!(std::fs::metadata(&created).unwrap().permissions().mode() & 0o777, 0o700);
    daemon.stop();

    // A directory everyone may write to without the sticky bit is refused, untouched.
    let open = home.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let stderr = stderr_of(&refused(home.serve(&open.join("toolgate.sock"))));
    assert!(stderr.contains("sticky"), "{stderr}");
    assert_eq!(std::fs::metadata(&open).unwrap().permissions().mode() & 0o7777, 0o777);
}

#[test]
fn a_failed_start_leaves_no_socket() {
    let home = Home::new();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    std::fs::write(
        home.path().join("config.toml"),
        format!("[server]\ntcp = \"127.0.0.1:{port}\"\n"),
    )
    .unwrap();
    let socket = home.path().join("run").join("toolgate.sock");
    let stderr = stderr_of(&refused(home.serve(&socket)));
    assert!(stderr.contains("cannot listen on"), "{stderr}");
    assert!(!socket.exists(), "a failed start left its socket behind");
    drop(busy);
}

#[test]
fn only_a_stale_socket_is_replaced() {
    let home = Home::new();
    let socket = home.path().join("toolgate.sock");
    // A socket nobody listens on: what a daemon that died leaves.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let first = Running::start(home.serve(&socket), &socket);
    // A live one stops a second daemon, which leaves it in place.
    let stderr = stderr_of(&refused(home.serve(&socket)));
    assert!(stderr.contains("already listening"), "{stderr}");
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_ok());
    first.stop();
}

// --- Starvation (the library's listeners) ---------------------------------------------

fn test_daemon() -> (tempfile::TempDir, Arc<Daemon>) {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let daemon =
        Daemon::new(Arc::new(Registry::with_builtins()), Settings::for_roots(vec![root]), None);
    (dir, daemon)
}

/// Small pools and short deadlines.
fn small_limits() -> Limits {
    Limits {
        max_authenticated: 8,
        max_pending: 8,
        auth_deadline: Duration::from_millis(300),
        header_timeout: Duration::from_millis(300),
    }
}

/// Waits until the peer closes `stream` (reads to its end).
async fn closed_by_peer(stream: &mut TcpStream) {
    let mut sink = Vec::new();
    within(stream.read_to_end(&mut sink)).await.unwrap_or(0);
}

/// One HTTP/1.1 request on a fresh connection; the status and the body.
async fn http(addr: std::net::SocketAddr, request: &str) -> (u16, String) {
    let mut stream = within(TcpStream::connect(addr)).await.unwrap();
    within(stream.write_all(request.as_bytes())).await.unwrap();
    let mut raw = Vec::new();
    within(stream.read_to_end(&mut raw)).await.unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let status = raw.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    let body = raw.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    (status, body)
}

fn rpc_post(token: Option<&str>) -> String {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
    let auth = token.map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
    format!(
        "POST /rpc HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{auth}\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

async fn start_tcp(daemon: &Arc<Daemon>, limits: Limits) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut options = TcpOptions::new(TokenSet::from_pairs([("ci", TOKEN)]).unwrap());
    options.limits = limits;
    tokio::spawn(tcp::serve(daemon.clone(), listener, options));
    addr
}

#[tokio::test]
async fn half_open_tcp_connections_do_not_lock_out_an_authenticated_client() {
    let (_dir, daemon) = test_daemon();
    let mut limits = small_limits();
    // Deadlines far away: only the pools can let the client in.
    limits.auth_deadline = PATIENCE * 2;
    limits.header_timeout = PATIENCE * 2;
    let addr = start_tcp(&daemon, limits).await;
    let mut silent = Vec::new();
    for index in 0..64 {
        let mut stream = within(TcpStream::connect(addr)).await.unwrap();
        if index % 2 == 0 {
            // Half a request line, then nothing.
            within(stream.write_all(b"POST /rpc HT")).await.unwrap();
        }
        silent.push(stream);
    }
    let (status, body) = http(addr, &rpc_post(Some(TOKEN))).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("read_file"), "{body}");
    daemon.begin_shutdown();
}

#[tokio::test]
async fn unauthenticated_keep_alive_clients_do_not_hold_authenticated_capacity() {
    let (_dir, daemon) = test_daemon();
    let mut limits = small_limits();
    limits.auth_deadline = PATIENCE * 2;
    limits.header_timeout = PATIENCE * 2;
    let addr = start_tcp(&daemon, limits).await;
    // More keep-alive clients than there are slots, each sending an unauthenticated
    // request: each gets its 401 and is closed, holding nothing.
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let keep_alive = format!(
        "POST /rpc HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer wrong-but-long-enough-x\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut clients = Vec::new();
    for _ in 0..16 {
        let mut stream = within(TcpStream::connect(addr)).await.unwrap();
        within(stream.write_all(keep_alive.as_bytes())).await.unwrap();
        clients.push(stream);
    }
    for stream in &mut clients {
        let mut raw = Vec::new();
        within(stream.read_to_end(&mut raw)).await.unwrap();
        assert!(raw.starts_with(b"HTTP/1.1 401"), "{}", String::from_utf8_lossy(&raw));
    }
    for _ in 0..3 {
        let (status, body) = http(addr, &rpc_post(Some(TOKEN))).await;
        assert_eq!(status, 200, "{body}");
    }
    daemon.begin_shutdown();
}

#[tokio::test]
async fn a_tcp_connection_that_never_authenticates_is_cut() {
    let (_dir, daemon) = test_daemon();
    let addr = start_tcp(&daemon, small_limits()).await;
    // Silent from the start.
    let mut silent = within(TcpStream::connect(addr)).await.unwrap();
    // Sends headers slower than the header timeout allows.
    let mut slow = within(TcpStream::connect(addr)).await.unwrap();
    within(slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")).await.unwrap();
    closed_by_peer(&mut silent).await;
    closed_by_peer(&mut slow).await;
    let (status, _) = http(addr, &rpc_post(Some(TOKEN))).await;
    assert_eq!(status, 200);
    daemon.begin_shutdown();
}

#[tokio::test]
async fn an_idle_authenticated_keep_alive_connection_gives_its_slot_back() {
    let (_dir, daemon) = test_daemon();
    let mut limits = small_limits();
    limits.max_authenticated = 1;
    limits.auth_deadline = PATIENCE * 2;
    let addr = start_tcp(&daemon, limits).await;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let keep_alive = format!(
        "POST /rpc HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut idle = within(TcpStream::connect(addr)).await.unwrap();
    within(idle.write_all(keep_alive.as_bytes())).await.unwrap();
    let mut head = [0u8; 12];
    within(idle.read_exact(&mut head)).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    // The connection holds the only slot while it is kept alive; once it has idled
    // past the header timeout it is closed and the slot is free again.
    closed_by_peer(&mut idle).await;
    let (status, body) = http(addr, &rpc_post(Some(TOKEN))).await;
    assert_eq!(status, 200, "{body}");
    daemon.begin_shutdown();
}

async fn start_mcp(daemon: &Arc<Daemon>, limits: Limits) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let tokens = TokenSet::from_pairs([("ci", TOKEN)]).unwrap();
    let options = McpOptions { tokens, ..McpOptions::default() };
    let shutdown = daemon.shutdown_token().clone();
    tokio::spawn(toolgate::mcp::serve_http(daemon.clone(), listener, options, limits, shutdown));
    addr
}

fn mcp_initialize(addr: std::net::SocketAddr) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "listeners", "version": "1"}}})
    .to_string();
    format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn mcp_http_cuts_half_open_connections() {
    let (_dir, daemon) = test_daemon();
    let addr = start_mcp(&daemon, small_limits()).await;
    let mut silent = within(TcpStream::connect(addr)).await.unwrap();
    let mut partial = within(TcpStream::connect(addr)).await.unwrap();
    within(partial.write_all(b"POST /mcp HTTP/1.1\r\nHost: localhost\r\n")).await.unwrap();
    closed_by_peer(&mut silent).await;
    closed_by_peer(&mut partial).await;
    let (status, body) = http(addr, &mcp_initialize(addr)).await;
    assert_eq!(status, 200, "{body}");
    daemon.begin_shutdown();
}

#[tokio::test]
async fn a_flood_of_half_open_mcp_connections_does_not_lock_out_a_client() {
    let (_dir, daemon) = test_daemon();
    let mut limits = small_limits();
    limits.auth_deadline = PATIENCE * 2;
    limits.header_timeout = PATIENCE * 2;
    let addr = start_mcp(&daemon, limits).await;
    let mut silent = Vec::new();
    for _ in 0..64 {
        silent.push(within(TcpStream::connect(addr)).await.unwrap());
    }
    let (status, body) = http(addr, &mcp_initialize(addr)).await;
    assert_eq!(status, 200, "{body}");
    daemon.begin_shutdown();
}

/// The real binary with few descriptors, soft and hard limit alike: a flood of
/// half-open connections, more than the process may open, does not keep a client with
/// a token waiting for the flood's deadline. The oldest pending connections are closed
/// before accepting would fail, so the client's connection is accepted and answered.
#[test]
fn more_half_open_mcp_connections_than_descriptors_do_not_lock_out_a_client() {
    use std::io::Write as _;
    const DESCRIPTORS: u32 = 256;
    const FLOOD: usize = 400;
    const SECRET: &str = "flood-7Hq2xLp9Vw4Zr8Nb3Kd6";
    let home = auth_support::Home::new();
    let tokens = [("ci", SECRET)];
    let (port, mut running) =
        auth_support::start_mcp_http_with(&home, &tokens, "", Some(DESCRIPTORS));
    let pid = running.child.id();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let open_files = limits.lines().find(|line| line.starts_with("Max open files")).unwrap();
    let open_files: Vec<&str> = open_files.split_whitespace().skip(3).take(2).collect();
    assert_eq!(open_files, ["256", "256"], "{limits}");

    let flooded = Instant::now();
    let mut flood = Vec::new();
    for _ in 0..FLOOD {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n").unwrap();
        flood.push(stream);
    }
    let reply = auth_support::NetFace::McpCommand.attempt(port, Some(&format!("Bearer {SECRET}")));
    assert_eq!(reply.status, 200, "{}", reply.body);
    // Every connection of the flood was accepted after it began; one still open would
    // have held the client until 10 s after its accept (the pending deadline).
    let waited = flooded.elapsed();
    assert!(waited < Duration::from_secs(8), "answered {waited:?} after the flood began");
    drop(flood);

    let _ = running.child.kill();
    let _ = running.child.wait();
    let mut stderr = String::new();
    running.child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(!stderr.contains("Too many open files"), "{stderr}");
}

/// The socket in a fresh private directory, served with `limits`.
async fn start_unix(daemon: &Arc<Daemon>, dir: &Path, limits: Limits) -> PathBuf {
    let socket = dir.join("run").join("toolgate.sock");
    let listener = toolgate::rpc::unix::bind(&socket).unwrap();
    let max = toolgate::rpc::DEFAULT_MAX_MESSAGE_BYTES;
    tokio::spawn(toolgate::rpc::unix::serve_with_limits(daemon.clone(), listener, limits, max));
    socket
}

/// Sends one `tools/list` and reads the answer line.
async fn unix_request(stream: UnixStream) -> Value {
    let (reader, mut writer) = stream.into_split();
    let request = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
    within(writer.write_all(format!("{request}\n").as_bytes())).await.unwrap();
    let mut line = String::new();
    within(BufReader::new(reader).read_line(&mut line)).await.unwrap();
    serde_json::from_str(&line).unwrap()
}

#[tokio::test]
async fn idle_unix_connections_do_not_lock_out_new_clients() {
    let (dir, daemon) = test_daemon();
    let mut limits = small_limits();
    limits.auth_deadline = PATIENCE * 2;
    let socket = start_unix(&daemon, dir.path(), limits).await;
    // Far more idle connections than the daemon serves at once.
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(within(UnixStream::connect(&socket)).await.unwrap());
    }
    let answer = unix_request(within(UnixStream::connect(&socket)).await.unwrap()).await;
    assert!(answer["result"]["tools"].is_array(), "{answer}");
    daemon.begin_shutdown();
}

#[tokio::test]
async fn a_silent_unix_connection_is_cut_and_a_client_past_the_cap_is_told() {
    let (dir, daemon) = test_daemon();
    let mut limits = small_limits();
    limits.max_authenticated = 2;
    let socket = start_unix(&daemon, dir.path(), limits).await;
    let mut silent = within(UnixStream::connect(&socket)).await.unwrap();
    let mut sink = Vec::new();
    within(silent.read_to_end(&mut sink)).await.unwrap();

    // Two clients that spoke hold the two slots; a third is told, not left hanging.
    let mut active = Vec::new();
    for _ in 0..2 {
        let stream = within(UnixStream::connect(&socket)).await.unwrap();
        let (reader, mut writer) = stream.into_split();
        let request = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
        within(writer.write_all(format!("{request}\n").as_bytes())).await.unwrap();
        let mut reader = BufReader::new(reader);
        let mut line = String::new();
        within(reader.read_line(&mut line)).await.unwrap();
        assert!(line.contains("\"result\""), "{line}");
        active.push((reader, writer));
    }
    let answer = unix_request(within(UnixStream::connect(&socket)).await.unwrap()).await;
    assert_eq!(answer["error"]["code"], -32000, "{answer}");
    // When one leaves, the next client gets in.
    active.pop();
    within(async {
        loop {
            let answer = unix_request(UnixStream::connect(&socket).await.unwrap()).await;
            if answer["result"]["tools"].is_array() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    daemon.begin_shutdown();
}

/// The daemon raises its own limit on open files; its commands start with the one it
/// was started with, as they would in the user's shell (a program that walks every
/// possible descriptor, or sizes a table by the limit, is not slowed by the daemon's).
#[test]
fn commands_keep_the_limit_on_open_files_the_daemon_was_started_with() {
    use std::io::{BufRead as _, Write as _};
    let home = auth_support::Home::new();
    home.config("[permissions]\nmode = \"bypass\"\n");
    let config = home.path().join("config.toml");
    let command = home.command(&["mcp", "--config", config.to_str().unwrap()]);
    let script = "ulimit -Sn 512 && ulimit -Hn 4096 && exec \"$0\" \"$@\"";
    let mut shell = Command::new("sh");
    shell
        .arg("-c")
        .arg(script)
        .arg(command.get_program())
        .args(command.get_args())
        .current_dir(command.get_current_dir().unwrap())
        .envs(command.get_envs().filter_map(|(key, value)| Some((key, value?))))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = shell.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    let requests = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "limits", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "run_command", "arguments": {"command": "ulimit -Sn; ulimit -Hn"}}}),
    ];
    for request in requests {
        writeln!(input, "{request}").unwrap();
    }
    let mut answer = Value::Null;
    for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
        let message: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if message["id"] == 2 {
            answer = message;
            break;
        }
    }
    let daemon_limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    drop(input);
    let _ = child.kill();
    let _ = child.wait();
    let open_files = daemon_limits.lines().find(|line| line.starts_with("Max open files")).unwrap();
    assert!(open_files.split_whitespace().nth(3) == Some("4096"), "{open_files}");
    let content = answer["result"]["structuredContent"]["content"].as_str().unwrap_or_default();
    assert!(content.starts_with("512\n4096\n"), "{answer}");
}

/// A reload cannot open or move a listener: SIGHUP after `[server] socket`, `tcp` and
/// `mcp_http` changed reloads the rest, opens nothing, and warns about each of the
/// three, naming it and saying it needs a restart.
#[test]
fn a_reload_names_each_listener_setting_it_did_not_apply() {
    use std::io::BufRead as _;
    let home = Home::new();
    let dir = home.path();
    let socket = dir.join("run").join("toolgate.sock");
    let config = dir.join("config.toml");
    std::fs::write(&config, format!("[server]\nsocket = {:?}\n", socket.display().to_string()))
        .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate"));
    command
        .args(["serve", "--config"])
        .arg(&config)
        .current_dir(dir.join("workspace"))
        .env("HOME", dir)
        .env("XDG_CONFIG_HOME", dir.join("config-home"))
        .env("XDG_STATE_HOME", dir.join("state"))
        .env("XDG_RUNTIME_DIR", dir.join("run"))
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .env("TOOLGATE_LOG", "info")
        .env("TOOLGATE_LOG_FORMAT", "text")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut running = Running::start(command, &socket);
    let (lines, received) = std::sync::mpsc::channel();
    let stderr = running.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });

    let free_port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (tcp, mcp_http) = (free_port(), free_port());
    let moved = dir.join("run").join("moved.sock");
    std::fs::write(
        &config,
        format!(
            "[server]\nsocket = {:?}\ntcp = \"{tcp}\"\nmcp_http = \"{mcp_http}\"\n",
            moved.display().to_string()
        ),
    )
    .unwrap();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(running.0.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let mut log = Vec::new();
    loop {
        let line = received.recv_timeout(PATIENCE).expect("no \"configuration reloaded\"");
        let done = line.contains("configuration reloaded");
        log.push(line);
        if done {
            break;
        }
    }
    let log = log.join("\n");
    for (setting, value) in [
        ("socket", moved.display().to_string()),
        ("tcp", tcp.to_string()),
        ("mcp_http", mcp_http.to_string()),
    ] {
        let warning = log
            .lines()
            .find(|line| line.contains(&format!("did not apply [server] {setting}:")))
            .unwrap_or_else(|| panic!("no warning about {setting}:\n{log}"));
        assert!(warning.contains("WARN"), "{warning}");
        assert!(warning.contains(&value), "{warning}");
        assert!(warning.contains("restart"), "{warning}");
    }
    // What the warnings say holds: nothing was opened, the old socket still answers.
    assert!(!moved.exists(), "the reload bound the new socket");
    assert!(std::net::TcpStream::connect(tcp).is_err(), "the reload opened {tcp}");
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_ok());
    running.stop();
}

/// `GET /healthz` on `addr`: the status line, or why there is none.
fn healthz(addr: &str) -> Result<String, std::io::Error> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(PATIENCE))?;
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer.lines().next().unwrap_or_default().to_owned())
}

/// The system service's TCP path: a socket the service manager opened and named `tcp`
/// (toolgate-tcp.socket) is the one the daemon serves.
#[test]
fn a_tcp_socket_passed_by_the_service_manager_is_served() {
    use std::io::{BufRead as _, Write as _};
    let activate = ["/usr/bin/systemd-socket-activate", "/bin/systemd-socket-activate"]
        .into_iter()
        .find(|path| Path::new(path).is_file())
        .expect("systemd-socket-activate not found: install the `systemd` package");
    let home = Home::new();
    let dir = home.path();
    let native = dir.join("native.sock");
    let mut attempt = 0;
    let (mut running, addr) = loop {
        attempt += 1;
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let mut child = Command::new(activate)
            .arg(format!("--listen={}", native.display()))
            .arg(format!("--listen={port}"))
            .arg("--fdname=native:tcp")
            .arg(env!("CARGO_BIN_EXE_toolgate"))
            .args(["serve", "--config"])
            .arg(dir.join("config.toml"))
            .current_dir(dir.join("workspace"))
            .env("HOME", dir)
            .env("XDG_CONFIG_HOME", dir.join("config-home"))
            .env("XDG_STATE_HOME", dir.join("state"))
            .env("XDG_RUNTIME_DIR", dir.join("run"))
            .env_remove("NOTIFY_SOCKET")
            .env("TOOLGATE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The first connection starts the daemon; its answer says it is serving.
        let deadline = Instant::now() + PATIENCE;
        let connected = loop {
            if let Ok(stream) = std::os::unix::net::UnixStream::connect(&native) {
                break Some(stream);
            }
            if child.try_wait().unwrap().is_some() {
                break None;
            }
            assert!(Instant::now() < deadline, "systemd-socket-activate never listened");
            std::thread::sleep(Duration::from_millis(10));
        };
        let Some(mut stream) = connected else {
            assert!(attempt < 5, "systemd-socket-activate kept failing");
            let _ = std::fs::remove_file(&native);
            continue;
        };
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        stream.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"daemon/status\"}\n").unwrap();
        let mut line = String::new();
        std::io::BufReader::new(stream).read_line(&mut line).unwrap();
        assert!(line.contains("\"id\":1"), "no answer on the native socket: {line}");
        break (Running(child), port.to_string());
    };
    let status = healthz(&addr);
    let _ = running.0.kill();
    let mut stderr = String::new();
    let _ = running.0.stderr.take().unwrap().read_to_string(&mut stderr);
    let status = status.unwrap_or_else(|err| panic!("{addr}: {err}; daemon log: {stderr}"));
    assert!(status.starts_with("HTTP/1.1 200"), "{status}; daemon log: {stderr}");
}

/// A listener for other machines in a network namespace with only the loopback (as
/// under `PrivateNetwork=yes`) reaches nobody, and the daemon says so at start.
#[test]
fn a_tcp_listener_nobody_can_reach_is_warned_about() {
    let home = Home::new();
    let dir = home.path();
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("agent:{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(
        dir.join("config.toml"),
        format!(
            "[server]\ntcp = \"0.0.0.0:7810\"\ntoken_file = {:?}\n",
            tokens.display().to_string()
        ),
    )
    .unwrap();
    let socket = dir.join("run").join("toolgate.sock");
    let serve = home.serve(&socket);
    // The same command in a new network namespace: only `lo`, as systemd gives it.
    let mut command = Command::new("unshare");
    command.args(["--net", "--map-root-user", "--"]).arg(serve.get_program());
    command.args(serve.get_args());
    command.current_dir(dir.join("workspace"));
    for (name, value) in serve.get_envs() {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let running = Running::start(command, &socket);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(running.0.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let mut running = running;
    let mut stderr = String::new();
    running.0.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(stderr.contains("[server] tcp = 0.0.0.0:7810: no client can reach it"), "{stderr}");
    assert!(stderr.contains("toolgate-tcp.socket"), "{stderr}");

    // `toolgate mcp --http` says the same of the address it was given.
    let mut mcp = Command::new("unshare");
    mcp.args(["--net", "--map-root-user", "--"]).arg(serve.get_program());
    mcp.args(["mcp", "--http", "0.0.0.0:7811", "--config"]).arg(dir.join("config.toml"));
    mcp.current_dir(dir.join("workspace"));
    for (name, value) in serve.get_envs() {
        match value {
            Some(value) => mcp.env(name, value),
            None => mcp.env_remove(name),
        };
    }
    let mut mcp = Running(
        mcp.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap(),
    );
    let (lines, received) = std::sync::mpsc::channel();
    let stderr = mcp.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let warning = loop {
        let line = received.recv_timeout(PATIENCE).expect("mcp --http warned about nothing");
        if line.contains("mcp --http") {
            break line;
        }
    };
    drop(mcp);
    assert!(warning.contains("mcp --http 0.0.0.0:7811: no client can reach it"), "{warning}");
}
