//! Nothing a daemon starts is a client of it. A command runs as the daemon's user,
//! so the Unix socket's uid check would admit it, Landlock does not mediate
//! `connect()` on a pathname socket, and with the network on it reaches the loopback
//! listeners; with a token it found it would pass their authentication. Were it let
//! in, it could call tools itself, widen its own sandbox and answer its own approval,
//! or take over a person's named session.
//!
//! Each test runs a probe as a `run_command` command of a real daemon: it connects to
//! every face of the daemon that runs it (the Unix socket, the `tcp` listener's HTTP
//! and WebSocket, `mcp_http`, and `toolgate mcp --http`) with a valid token and sends
//! a request that would be answered. Every attempt must be refused, while the same
//! probe run from outside (the test itself) gets every answer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod auth_support;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use auth_support::{Home, NetFace, Running, TOKENS, exchange, free_port};
use serde_json::{Value, json};

/// Connects to each target of the JSON list on stdin, sends its request, and prints
/// one line per target: its name, then `ANSWER <first line>` when something came
/// back, `CLOSED` when the connection ended without a byte, or `ERROR <kind>`.
const PROBE: &str = r#"
import json, socket, sys
for target in json.load(sys.stdin):
    try:
        if target["unix"]:
            c = socket.socket(socket.AF_UNIX)
            c.connect(target["unix"])
        else:
            c = socket.create_connection(("127.0.0.1", target["port"]), timeout=10)
        c.settimeout(10)
        c.sendall(target["request"].encode())
        data = c.recv(200)
        line = data.decode(errors="replace").splitlines()[0] if data else ""
        print(target["name"], "ANSWER " + line if data else "CLOSED", flush=True)
    except Exception as err:
        print(target["name"], "ERROR", type(err).__name__, flush=True)
"#;

/// The probe's targets: every face of the daemon, each with a request it answers.
fn targets(socket: &Path, faces: &[(NetFace, u16)]) -> Value {
    let bearer = format!("Bearer {}", TOKENS[0].1);
    let mut targets = vec![json!({
        "name": "unix",
        "unix": socket,
        "request": "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"session/open\",\"params\":{\"name\":\"build\"}}\n",
    })];
    for (face, port) in faces {
        targets.push(json!({
            "name": format!("{face:?}"),
            "unix": null,
            "port": port,
            "request": face.request(*port, Some(&bearer)),
        }));
    }
    Value::Array(targets)
}

/// Runs the probe from this process (not a descendant of any daemon).
fn probe_from_outside(dir: &Path, targets: &Value) -> String {
    let script = dir.join("probe.py");
    std::fs::write(&script, PROBE).unwrap();
    let mut child = Command::new("python3")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(targets.to_string().as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// What the probe printed for `name`.
fn line_of<'a>(output: &'a str, name: &str) -> &'a str {
    output
        .lines()
        .find(|line| line.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no line for {name} in {output}"))
}

/// Asserts that every target answered (from outside) or none did (from a command).
fn assert_every(output: &str, targets: &Value, answered: bool) {
    for target in targets.as_array().unwrap() {
        let name = target["name"].as_str().unwrap();
        let line = line_of(output, name);
        assert_eq!(line.contains(" ANSWER "), answered, "{name}: {line}\n{output}");
    }
}

#[test]
fn a_command_is_no_client_of_the_daemon_that_runs_it_on_any_face() {
    let home = Home::new();
    let lines: String = TOKENS.iter().map(|(name, secret)| format!("{name}:{secret}\n")).collect();
    let tokens = home.token_file(&lines, 0o600);
    let (tcp, mcp_http, mcp_command) = (free_port(), free_port(), free_port());
    let config = home.config(&format!(
        "[server]\ntcp = \"127.0.0.1:{tcp}\"\nmcp_http = \"127.0.0.1:{mcp_http}\"\n\
         token_file = \"{}\"\n\n[permissions]\nmode = \"bypass\"\n",
        tokens.display()
    ));
    let config = config.to_str().unwrap().to_owned();
    let socket = home.path().join("run").join("toolgate").join("toolgate.sock");
    let serve = home.command(&["serve", "--config", &config, "--socket", socket.to_str().unwrap()]);
    let _daemon = Running::start(serve, &[tcp, mcp_http]);
    let address = format!("127.0.0.1:{mcp_command}");
    let mcp = home.command(&["mcp", "--config", &config, "--http", &address]);
    let _mcp = Running::start(mcp, &[mcp_command]);
    let workspace = home.path().join("workspace");
    std::fs::write(workspace.join("probe.py"), PROBE).unwrap();

    // The daemon's own faces, from outside: every one answers the probe.
    let faces = [(NetFace::TcpHttp, tcp), (NetFace::TcpWs, tcp), (NetFace::McpServe, mcp_http)];
    let targets = targets(&socket, &faces);
    let outside = probe_from_outside(home.path(), &targets);
    assert_every(&outside, &targets, true);

    // The same probe as a command of that daemon: every one refuses it.
    let arguments =
        json!({"command": "python3 probe.py", "stdin": targets.to_string(), "timeout_ms": 60_000});
    let mut call = home.command(&[
        "call",
        "--json",
        "--socket",
        socket.to_str().unwrap(),
        "run_command",
        &arguments.to_string(),
    ]);
    let output = call.stdout(Stdio::piped()).output().unwrap();
    let result: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("{err}: {}", String::from_utf8_lossy(&output.stderr)));
    let content = result["content"].as_str().unwrap_or_default();
    assert_every(content, &targets, false);

    // `toolgate mcp --http`: its command cannot call back into it either.
    let own = json!([{
        "name": "McpCommand",
        "unix": null,
        "port": mcp_command,
        "request": NetFace::McpCommand.request(mcp_command, Some(&format!("Bearer {}", TOKENS[1].1))),
    }]);
    assert_every(&probe_from_outside(home.path(), &own), &own, true);
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "probe", "version": "1"}
    });
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "run_command",
        "arguments": {"command": "python3 probe.py", "stdin": own.to_string(), "timeout_ms": 60_000},
        "_meta": meta,
    }})
    .to_string();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{mcp_command}\r\nConnection: close\r\n\
         Authorization: Bearer {}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: tools/call\r\nMcp-Name: run_command\r\nContent-Length: {}\r\n\r\n{body}",
        TOKENS[0].1,
        body.len()
    );
    let reply = exchange(mcp_command, &request);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.body.contains("McpCommand"), "{}", reply.body);
    assert!(!reply.body.contains("McpCommand ANSWER"), "{}", reply.body);
}

#[test]
fn a_normal_users_command_is_no_client_of_its_daemon() {
    if !nix::unistd::Uid::effective().is_root() {
        return eprintln!("skipped: the tests run as a normal user (the test above is that case)");
    }
    let user = "toolgate-dev";
    if nix::unistd::User::from_name(user).ok().flatten().is_none() {
        let status = Command::new("useradd")
            .args(["--no-create-home", "--home-dir", "/nonexistent", "--shell", "/bin/sh"])
            .args(["--user-group", user])
            .status()
            .unwrap();
        if !status.success() && nix::unistd::User::from_name(user).ok().flatten().is_none() {
            return eprintln!("skipped: useradd {user} failed");
        }
    }
    let user = nix::unistd::User::from_name(user).unwrap().unwrap();
    let home = Home::new();
    home.config("[permissions]\nmode = \"bypass\"\n");
    std::fs::write(home.path().join("workspace").join("probe.py"), PROBE).unwrap();
    for entry in walk(home.path()) {
        std::os::unix::fs::lchown(&entry, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
            .unwrap();
    }
    let as_user = |command: &mut Command| {
        let mut wrapped = Command::new("setpriv");
        wrapped
            .arg(format!("--reuid={}", user.uid))
            .arg(format!("--regid={}", user.gid))
            .args(["--clear-groups", "--"])
            .arg(command.get_program())
            .args(command.get_args())
            .current_dir(command.get_current_dir().unwrap())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (key, value) in command.get_envs() {
            match value {
                Some(value) => wrapped.env(key, value),
                None => wrapped.env_remove(key),
            };
        }
        wrapped
    };
    let socket = home.path().join("run").join("toolgate").join("toolgate.sock");
    let config = home.path().join("config.toml");
    let mut serve = home.command(&[
        "serve",
        "--config",
        config.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
    ]);
    let mut daemon = as_user(&mut serve).spawn().unwrap();
    let deadline = std::time::Instant::now() + auth_support::PATIENCE;
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if let Some(status) = daemon.try_wait().unwrap() {
            let mut stderr = String::new();
            daemon.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
            panic!("the daemon exited with {status}: {stderr}");
        }
        assert!(std::time::Instant::now() < deadline, "the daemon did not listen");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let targets = targets(&socket, &[]);
    let arguments =
        json!({"command": "python3 probe.py", "stdin": targets.to_string(), "timeout_ms": 60_000});
    let mut call = home.command(&[
        "call",
        "--json",
        "--socket",
        socket.to_str().unwrap(),
        "run_command",
        &arguments.to_string(),
    ]);
    let output = as_user(&mut call).output().unwrap();
    let _ = daemon.kill();
    let _ = daemon.wait();
    let result: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("{err}: {}", String::from_utf8_lossy(&output.stderr)));
    let content = result["content"].as_str().unwrap_or_default();
    assert_every(content, &targets, false);
}

/// `dir` and everything beneath it.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    if dir.is_dir() && !dir.is_symlink() {
        for entry in std::fs::read_dir(dir).unwrap() {
            all.extend(walk(&entry.unwrap().path()));
        }
    }
    all
}
