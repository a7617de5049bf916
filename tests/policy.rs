//! The permission layer seen from outside: the real `toolgate serve` binary, asked by
//! an editor plugin would ask it (NDJSON on its socket), and the configuration checks
//! `serve` and `check-config` share.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A daemon started for one test, in its own directory; killed on drop. The directory
/// holds `workspace/` (the root), `outside/` next to it, and the configuration.
struct TestDaemon {
    child: Option<Child>,
    dir: tempfile::TempDir,
    socket: PathBuf,
}

impl TestDaemon {
    /// Starts a daemon after `prepare` has set up the directory.
    fn start_with(config: &str, prepare: impl FnOnce(&Path)) -> TestDaemon {
        let dir = private_tempdir();
        std::fs::create_dir_all(dir.path().join("workspace")).unwrap();
        std::fs::create_dir_all(dir.path().join("outside")).unwrap();
        write_private(&dir.path().join("config.toml"), config);
        prepare(dir.path());
        let socket = dir.path().join("run").join("toolgate.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["serve", "--socket"])
            .arg(&socket)
            .arg("--config")
            .arg(dir.path().join("config.toml"))
            .current_dir(dir.path().join("workspace"))
            .envs(test_env(dir.path()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut daemon = TestDaemon { child: Some(child), dir, socket };
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(&daemon.socket).is_err() {
            if let Some(status) = daemon.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("the daemon exited at start-up: {status}");
            }
            assert!(Instant::now() < deadline, "the daemon did not start listening");
            std::thread::sleep(Duration::from_millis(10));
        }
        daemon
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }

    fn connect(&self) -> Client {
        Client::new(UnixStream::connect(&self.socket).unwrap())
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A temporary directory only its owner can write (configuration directories must be).
fn private_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

fn write_private(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// The environment of a toolgate process confined to the test directory.
fn test_env(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    vec![
        ("HOME", dir.to_path_buf()),
        ("XDG_CONFIG_HOME", dir.join("config-home")),
        ("XDG_STATE_HOME", dir.join("state")),
        ("XDG_RUNTIME_DIR", dir.join("run")),
        ("TOOLGATE_LOG", PathBuf::from("warn")),
    ]
}

/// A blocking NDJSON client.
struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
    notifications: Vec<Value>,
}

impl Client {
    fn new(stream: UnixStream) -> Client {
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Client {
            reader: BufReader::new(stream.try_clone().unwrap()),
            writer: stream,
            next_id: 1,
            notifications: Vec::new(),
        }
    }

    fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.writer.write_all(format!("{line}\n").as_bytes()).unwrap();
        id
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).unwrap();
        assert!(n > 0, "the daemon closed the connection");
        serde_json::from_str(&line).unwrap()
    }

    fn response(&mut self, id: u64) -> Value {
        loop {
            let message = self.read();
            if message.get("id") == Some(&json!(id)) {
                return message;
            }
            self.notifications.push(message);
        }
    }

    fn result(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        let response = self.response(id);
        assert!(response.get("error").is_none(), "{response}");
        response["result"].clone()
    }

    fn explain_command(&mut self, command: &str) -> Value {
        self.result(
            "tools/explain",
            json!({"name": "run_command", "arguments": {"command": command}}),
        )
    }
}

fn symlink(target: &str, link: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap();
}

const GIT_STATUS_ALLOWED: &str = "[permissions]\nallow = [\"run_command(git status:*)\"]\n";

/// `workspace/link_out -> ../outside`, a loop, and a dangling link to outside.
fn links(dir: &Path) {
    let workspace = dir.join("workspace");
    symlink("../outside", &workspace.join("link_out"));
    symlink("loop", &workspace.join("loop"));
    symlink("../outside/new.txt", &workspace.join("dangling"));
    std::fs::create_dir(workspace.join("sub")).unwrap();
}

#[test]
fn redirects_through_a_symlink_to_outside_are_not_auto_allowed() {
    let daemon = TestDaemon::start_with(GIT_STATUS_ALLOWED, links);
    let mut client = daemon.connect();
    // Still allowed: a redirection that stays inside.
    let inside = client.explain_command("git status > sub/x");
    assert_eq!(inside["decision"], "allow", "{inside}");
    for command in [
        "git status > link_out/x",
        "cd link_out && git status > x",
        "cd sub && git status > ../link_out/x",
        "git status > dangling",
        "git status > link_out/../x",
    ] {
        let explained = client.explain_command(command);
        assert_eq!(explained["decision"], "ask", "{command}: {explained}");
        let reason = explained["explanation"]["reason"].as_str().unwrap();
        assert!(reason.contains("outside the roots"), "{command}: {reason}");
    }
    // Nobody is subscribed, so nobody can approve: the call is refused and nothing is
    // written outside.
    let refused = client.result(
        "tools/call",
        json!({"name": "run_command", "arguments": {"command": "git status > link_out/x"}}),
    );
    assert_eq!(refused["error_type"], "permission_denied", "{refused}");
    assert!(!daemon.path("outside/x").exists());
}

#[test]
fn redirects_that_cannot_be_resolved_ask() {
    let daemon = TestDaemon::start_with(GIT_STATUS_ALLOWED, links);
    let mut client = daemon.connect();
    let explained = client.explain_command("git status > loop/x");
    assert_eq!(explained["decision"], "ask", "{explained}");
    let reason = explained["explanation"]["reason"].as_str().unwrap();
    assert!(reason.contains("cannot be resolved"), "{reason}");
}
