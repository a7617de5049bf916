//! The kernel sandbox in every permission mode, as root and as a normal user, through
//! both ways a model runs a program: `run_command` and a skill command.
//!
//! One real daemon (`toolgate mcp` over pipes) per user and mode, with `network =
//! false`, an allow rule for both tools (so modes that ask still run them unasked),
//! a token file, an audit log and a skill in toolgate's own configuration directory.
//! Each row is an attack (or a legitimate use) and its expected outcome:
//! writing outside the roots fails (`/tmp`, `$HOME`, the audit log, the configuration
//! directory), writing inside works, `/etc/hostname` is readable, the token file is
//! not, `kill -9` of the daemon fails and the daemon lives on, a connection to a
//! loopback listener fails. One more daemon per user with `network = true` shows the
//! connection working. In plan mode neither tool runs at all.
//!
//! The normal user is `toolgate-matrix` (created with `useradd` when missing, which
//! needs root); the daemon runs as that user through `setpriv`. A test that cannot run
//! (no Landlock, not root) says what it skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(30);

/// The normal user the daemon runs as in the non-root half.
const USER: &str = "toolgate-matrix";

const MODES: [&str; 5] = ["default", "accept_edits", "plan", "bypass", "dont_ask"];

/// Who the daemon runs as.
#[derive(Clone, Debug)]
struct Identity {
    /// `None`: as this process (root).
    user: Option<(u32, u32)>,
    home: PathBuf,
}

impl Identity {
    /// This process's own identity.
    fn current() -> Identity {
        Identity { user: None, home: PathBuf::from(std::env::var("HOME").unwrap()) }
    }

    /// The normal user, created if missing; `Err` says why it cannot be had.
    fn normal() -> Result<Identity, String> {
        if nix::unistd::User::from_name(USER).ok().flatten().is_none() {
            let status = Command::new("useradd")
                .args(["--create-home", "--shell", "/bin/sh", "--user-group", USER])
                .status()
                .map_err(|err| format!("useradd: {err}"))?;
            // Another test of this file may have created it meanwhile.
            if !status.success() && nix::unistd::User::from_name(USER).ok().flatten().is_none() {
                return Err(format!("useradd {USER} failed: {status}"));
            }
        }
        let user = nix::unistd::User::from_name(USER)
            .ok()
            .flatten()
            .ok_or_else(|| format!("no user {USER}"))?;
        std::fs::create_dir_all(&user.dir).map_err(|err| err.to_string())?;
        nix::unistd::chown(&user.dir, Some(user.uid), Some(user.gid))
            .map_err(|err| err.to_string())?;
        Ok(Identity { user: Some((user.uid.as_raw(), user.gid.as_raw())), home: user.dir })
    }

    fn name(&self) -> &'static str {
        if self.user.is_some() { USER } else { "root" }
    }
}

/// One daemon and the files around it.
struct Daemon {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next_id: u64,
    dir: PathBuf,
    _tmp: tempfile::TempDir,
    token: String,
}

impl Daemon {
    fn start(who: &Identity, mode: &str, network: bool) -> Daemon {
        let tmp = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(tmp.path()).unwrap();
        let root = dir.join("root");
        let config_home = dir.join("config");
        let skills = config_home.join("toolgate/skills");
        for sub in [&root, &skills, &dir.join("state"), &dir.join("run"), &dir.join("secret")] {
            std::fs::create_dir_all(sub).unwrap();
        }
        let token = format!("tok{}", std::process::id());
        let token_file = dir.join("secret/tokens");
        std::fs::write(&token_file, format!("me:{token}-secret-value\n")).unwrap();
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(
            skills.join("sh_skill.toml"),
            "name = \"sh_skill\"\ndescription = \"Runs a script.\"\n\
             command = [\"./run.sh\", \"{script}\"]\n\
             input_schema = { type = \"object\", required = [\"script\"], \
             properties = { script = { type = \"string\", kind = \"text\" } } }\n",
        )
        .unwrap();
        let script = skills.join("run.sh");
        std::fs::write(&script, "#!/bin/sh\nexec /bin/sh -c \"$1\"\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let config = dir.join("toolgate.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\ntoken_file = {token_file:?}\n\n\
                 [permissions]\nallow = [\"run_command\", \"sh_skill\"]\n\n\
                 [sandbox]\nnetwork = {network}\n"
            ),
        )
        .unwrap();
        if let Some((uid, gid)) = who.user {
            chown_tree(&dir, uid, gid);
        }
        let binary = env!("CARGO_BIN_EXE_toolgate");
        let mut command = match who.user {
            None => Command::new(binary),
            Some((uid, gid)) => {
                let mut command = Command::new("setpriv");
                command
                    .arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .arg("--clear-groups")
                    .arg("--")
                    .arg(binary);
                command
            }
        };
        command
            .arg("mcp")
            .arg("--root")
            .arg(&root)
            .arg("--mode")
            .arg(mode)
            .arg("--config")
            .arg(&config)
            .current_dir(&root)
            .env("HOME", &who.home)
            .env("XDG_CONFIG_HOME", &config_home)
            .env("XDG_STATE_HOME", dir.join("state"))
            .env("XDG_RUNTIME_DIR", dir.join("run"))
            .env("TOOLGATE_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = command.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if send.send(line).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut daemon = Daemon { child, stdin, lines, next_id: 1, dir, _tmp: tmp, token };
        let answer = daemon.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "sandbox-matrix", "version": "1"}}),
        );
        assert!(answer.get("result").is_some(), "{answer}");
        daemon.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        daemon
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(format!("{message}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let start = Instant::now();
        loop {
            let left = PATIENCE.saturating_sub(start.elapsed());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => panic!("no answer to {method} (id {id})"),
                Err(RecvTimeoutError::Disconnected) => panic!("toolgate mcp exited"),
            };
            if let Ok(message) = serde_json::from_str::<Value>(&line)
                && message["id"] == json!(id)
            {
                return message;
            }
        }
    }

    /// Runs a shell script through `tool` and returns the structured result.
    fn run(&mut self, tool: Tool, script: &str) -> Value {
        let (name, arguments) = match tool {
            Tool::RunCommand => ("run_command", json!({"command": script, "timeout_ms": 20_000})),
            Tool::Skill => ("sh_skill", json!({"script": script})),
        };
        let answer = self.request("tools/call", json!({"name": name, "arguments": arguments}));
        let result = &answer["result"];
        if result["structuredContent"].is_object() {
            result["structuredContent"].clone()
        } else {
            json!({"ok": false, "content": result["content"].to_string(), "answer": answer})
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Daemon {
    /// Closes the daemon's stdin and waits for it to exit (it flushes its audit log).
    fn stop(&mut self) {
        drop(self.stdin.take());
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chown_tree(path: &Path, uid: u32, gid: u32) {
    let uid = nix::unistd::Uid::from_raw(uid);
    let gid = nix::unistd::Gid::from_raw(gid);
    nix::unistd::chown(path, Some(uid), Some(gid)).unwrap();
    if path.is_dir() && !path.is_symlink() {
        for entry in std::fs::read_dir(path).unwrap() {
            chown_tree(&entry.unwrap().path(), uid.as_raw(), gid.as_raw());
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tool {
    RunCommand,
    Skill,
}

/// What a row expects of its script.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Runs and succeeds.
    Works,
    /// Fails, and `path` (if any) does not exist afterwards.
    Fails,
}

/// One row: what it is, the script (with `{marker}`, `{home}`, `{audit}`, `{config}`,
/// `{token_file}`, `{daemon}`, `{port}` filled in), the expectation, and a text the
/// output must not contain (`{marker}`: a secret).
struct Row {
    what: &'static str,
    script: &'static str,
    expect: Expect,
    /// A file the row must not have created.
    must_not_exist: Option<&'static str>,
    /// Output that must not appear (a secret).
    must_not_show: Option<&'static str>,
}

const ROWS: &[Row] = &[
    Row {
        what: "write /tmp/x",
        script: "echo x > /tmp/toolgate-matrix-{marker}",
        expect: Expect::Fails,
        must_not_exist: Some("/tmp/toolgate-matrix-{marker}"),
        must_not_show: None,
    },
    Row {
        what: "write $HOME/x",
        script: "echo x > {home}/toolgate-matrix-{marker}",
        expect: Expect::Fails,
        must_not_exist: Some("{home}/toolgate-matrix-{marker}"),
        must_not_show: None,
    },
    Row {
        what: "write the audit log",
        script: "echo {marker} >> {audit}",
        expect: Expect::Fails,
        must_not_exist: None,
        must_not_show: None,
    },
    Row {
        what: "write the configuration directory",
        script: "echo x > {config}/toolgate/x-{marker}",
        expect: Expect::Fails,
        must_not_exist: Some("{config}/toolgate/x-{marker}"),
        must_not_show: None,
    },
    Row {
        what: "write inside the root",
        script: "echo inside > written-{marker} && cat written-{marker}",
        expect: Expect::Works,
        must_not_exist: None,
        must_not_show: None,
    },
    Row {
        what: "read /etc/hostname",
        script: "cat /etc/hostname",
        expect: Expect::Works,
        must_not_exist: None,
        must_not_show: None,
    },
    Row {
        what: "read the token file",
        script: "cat {token_file}",
        expect: Expect::Fails,
        must_not_exist: None,
        must_not_show: Some("{token}-secret-value"),
    },
    Row {
        what: "kill -9 the daemon",
        script: "kill -9 {daemon}",
        expect: Expect::Fails,
        must_not_exist: None,
        must_not_show: None,
    },
    Row {
        what: "connect to a loopback listener with the network off",
        script: "exec /bin/bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' && echo connected",
        expect: Expect::Fails,
        must_not_exist: None,
        must_not_show: Some("connected"),
    },
];

/// Whether the kernel sandbox is in force for a daemon, from a first call.
fn sandbox_in_force(daemon: &mut Daemon) -> Result<(), String> {
    let probe = daemon.run(Tool::RunCommand, "true");
    match probe["metadata"]["sandbox"].as_str() {
        Some(sandbox) if sandbox.starts_with("landlock") => Ok(()),
        other => Err(format!("no Landlock sandbox in force here (metadata says {other:?})")),
    }
}

/// Every row in every mode for one identity.
fn matrix(who: &Identity) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    {
        let mut probe = Daemon::start(who, "bypass", true);
        if let Err(reason) = sandbox_in_force(&mut probe) {
            eprintln!("skipped the matrix as {}: {reason}", who.name());
            return;
        }
    }
    for mode in MODES {
        let mut daemon = Daemon::start(who, mode, false);
        // The audit log exists once a call was recorded.
        let first = daemon.run(Tool::RunCommand, "true");
        let audit = std::fs::read_dir(daemon.dir.join("state/toolgate"))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .find(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
            .unwrap_or_else(|| panic!("no audit log after {first}"));
        for tool in [Tool::RunCommand, Tool::Skill] {
            for row in ROWS {
                let marker = format!("{}-{mode}-{tool:?}", who.name());
                let values = [
                    ("{marker}", marker.clone()),
                    ("{home}", who.home.display().to_string()),
                    ("{audit}", audit.display().to_string()),
                    ("{config}", daemon.dir.join("config").display().to_string()),
                    ("{token_file}", daemon.dir.join("secret/tokens").display().to_string()),
                    ("{token}", daemon.token.clone()),
                    ("{daemon}", daemon.pid().to_string()),
                    ("{port}", port.clone()),
                ];
                let fill = |text: &str| {
                    values
                        .iter()
                        .fold(text.to_owned(), |text, (key, value)| text.replace(key, value))
                };
                let script = fill(row.script);
                let result = daemon.run(tool, &script);
                let at = format!("{} / {mode} / {tool:?} / {}: {result}", who.name(), row.what);
                let content = result["content"].as_str().unwrap_or_default().to_owned();
                if mode == "plan" {
                    // Plan mode runs no side effects at all: nothing below can happen.
                    assert_eq!(result["ok"], json!(false), "{at}");
                    assert_eq!(result["error_type"], json!("tool_not_allowed"), "{at}");
                    continue;
                }
                match row.expect {
                    Expect::Works => assert_eq!(result["ok"], json!(true), "{at}"),
                    Expect::Fails => assert_eq!(result["ok"], json!(false), "{at}"),
                }
                if let Some(path) = row.must_not_exist {
                    let path = fill(path);
                    assert!(!Path::new(&path).exists(), "{at}: {path} was written");
                }
                if let Some(secret) = row.must_not_show {
                    assert!(!content.contains(&fill(secret)), "{at}: the output shows it");
                }
                assert!(daemon.alive(), "{at}: the daemon died");
            }
        }
        // Every record of a command names the sandbox it ran in.
        daemon.stop();
        let audit_text = std::fs::read_to_string(&audit).unwrap();
        let last: Value = serde_json::from_str(audit_text.lines().last().unwrap()).unwrap();
        if mode != "plan" {
            assert_eq!(last["sandbox"]["network"], json!(false), "{last}");
            assert!(
                last["sandbox"]["in_force"].as_str().unwrap_or_default().starts_with("landlock"),
                "{last}"
            );
        }
    }
    // The same connection with the network on.
    let mut open = Daemon::start(who, "bypass", true);
    for tool in [Tool::RunCommand, Tool::Skill] {
        let script =
            format!("exec /bin/bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' && echo connected");
        let result = open.run(tool, &script);
        assert_eq!(result["ok"], json!(true), "{} / {tool:?} / network on: {result}", who.name());
    }
    drop(listener);
}

#[test]
fn the_sandbox_holds_in_every_mode_as_root() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped the root matrix: the tests do not run as root");
        return;
    }
    matrix(&Identity::current());
}

#[test]
fn the_sandbox_holds_in_every_mode_as_a_normal_user() {
    if !nix::unistd::Uid::effective().is_root() {
        // This process is a normal user: the daemon runs as it.
        matrix(&Identity::current());
        return;
    }
    match Identity::normal() {
        Ok(who) => matrix(&who),
        Err(reason) => eprintln!("skipped the normal-user matrix: {reason}"),
    }
}
