//! When the sandbox says no: a command that fails on a path the sandbox denies gets a
//! result naming it (inferred from its error output, and labelled so) with the
//! widening to ask for; the same command with that widening (`run_command`'s `sandbox`
//! argument) is put to a person in every mode, bypass included, runs with the path
//! writable for that call only when the person allows it, and is refused unasked in
//! `dont_ask` mode. Against the real `toolgate serve` on a temporary socket.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A daemon started for one test, in its own directory; killed on drop.
struct TestDaemon {
    child: Option<Child>,
    dir: tempfile::TempDir,
    socket: PathBuf,
}

impl TestDaemon {
    fn start(config: &str) -> TestDaemon {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("workspace");
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::write(workspace.join("hello.txt"), "hello\nworld\n").unwrap();
        std::fs::write(dir.path().join("config.toml"), config).unwrap();
        let socket = dir.path().join("run").join("toolgate.sock");
        let mut daemon = TestDaemon { child: None, dir, socket };
        daemon.spawn();
        daemon
    }

    fn spawn(&mut self) {
        let dir = self.dir.path();
        let child = Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["serve", "--socket"])
            .arg(&self.socket)
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
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(&self.socket).is_err() {
            assert!(Instant::now() < deadline, "the daemon did not start listening");
            std::thread::sleep(Duration::from_millis(10));
        }
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

/// A blocking NDJSON client.
struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
    /// Notifications read while waiting for a response.
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

    fn send_line(&mut self, line: &str) {
        self.writer.write_all(line.as_bytes()).unwrap();
        self.writer.write_all(b"\n").unwrap();
    }

    fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send_line(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        );
        id
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).unwrap();
        assert!(n > 0, "the daemon closed the connection");
        serde_json::from_str(&line).unwrap()
    }

    /// Reads until the response to `id`, keeping notifications.
    fn response(&mut self, id: u64) -> Value {
        // Another request's response may have come first and been kept.
        if let Some(position) =
            self.notifications.iter().position(|message| message.get("id") == Some(&json!(id)))
        {
            return self.notifications.remove(position);
        }
        loop {
            let message = self.read();
            if message.get("id") == Some(&json!(id)) {
                return message;
            }
            self.notifications.push(message);
        }
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        self.response(id)
    }

    fn result(&mut self, method: &str, params: Value) -> Value {
        let response = self.request(method, params);
        assert!(response.get("error").is_none(), "{response}");
        response["result"].clone()
    }

    /// Reads notifications until one satisfies `matches`.
    fn event(&mut self, matches: impl Fn(&Value) -> bool) -> Value {
        if let Some(position) =
            self.notifications.iter().position(|n| matches(&n["params"]["result"]))
        {
            return self.notifications.remove(position)["params"]["result"].clone();
        }
        loop {
            let message = self.read();
            if message["method"] == "events" && matches(&message["params"]["result"]) {
                return message["params"]["result"].clone();
            }
            self.notifications.push(message);
        }
    }
}

fn marker() -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{}-{nanos}", std::process::id())
}

fn run(client: &mut Client, arguments: Value) -> u64 {
    client.send("tools/call", json!({"name": "run_command", "arguments": arguments}))
}

/// Removes a directory the test made, whatever happens.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a command to its answer.
fn call(client: &mut Client, arguments: Value) -> Value {
    let id = run(client, arguments);
    client.response(id)
}

#[test]
fn a_denied_write_is_named_and_a_person_can_widen_that_call_only() {
    let daemon = TestDaemon::start("[permissions]\nmode = \"bypass\"\n");
    let mut client = daemon.connect();
    client.result("events/subscribe", json!({}));
    let probe = call(&mut client, json!({"command": "true"}));
    let in_force = probe["result"]["metadata"]["sandbox"].as_str().unwrap_or_default().to_owned();
    if !in_force.starts_with("landlock") {
        eprintln!("skipped: no Landlock sandbox in force here ({in_force:?})");
        return;
    }
    // Outside the roots and away from the daemon's own files (which live in /tmp
    // here, and would keep /tmp itself from being widened as a whole).
    let outside = PathBuf::from(format!("/var/tmp/toolgate-escalation-{}", marker()));
    std::fs::create_dir(&outside).unwrap();
    let _cleanup = RemoveOnDrop(outside.clone());
    let target = outside.join("x");
    let command = format!("echo x > {}", target.display());
    let ask = json!({"writable": [outside.display().to_string()]});

    // The sandbox says no, and the result says what and how to ask.
    let denied = call(&mut client, json!({"command": command}));
    let result = &denied["result"];
    assert_eq!(result["ok"], false, "{denied}");
    assert!(!target.exists());
    let named = &result["metadata"]["sandbox_denied"];
    assert_eq!(named["source"], "inferred from the command's error output", "{denied}");
    assert_eq!(named["denied"][0]["path"], target.display().to_string(), "{denied}");
    assert_eq!(named["denied"][0]["access"], "write", "{denied}");
    let content = result["content"].as_str().unwrap();
    assert!(content.contains(&format!("\"sandbox\": {ask}")), "{content}");

    // Asking for the widening asks a person, even in bypass mode; a "no" runs nothing.
    let widened = json!({"command": command, "sandbox": ask});
    let id = run(&mut client, widened.clone());
    let request = client.event(|event| event["type"] == "permission_request");
    let reason = request["explanation"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("leave its sandbox") && reason.contains("/var/tmp"), "{request}");
    client.result(
        "permission/respond",
        json!({"request_id": request["request_id"], "decision": "deny"}),
    );
    let refused = client.response(id);
    assert_eq!(refused["result"]["error_type"], "permission_denied", "{refused}");
    assert!(!target.exists());

    // A "yes" runs it with /tmp writable for this call.
    let id = run(&mut client, widened);
    let request = client.event(|event| event["type"] == "permission_request");
    client.result(
        "permission/respond",
        json!({"request_id": request["request_id"], "decision": "allow", "scope": "once"}),
    );
    let allowed = client.response(id);
    assert_eq!(allowed["result"]["ok"], true, "{allowed}");
    assert!(target.exists());
    let granted = &allowed["result"]["metadata"]["sandbox_profile"]["write"];
    assert!(granted.as_array().unwrap().contains(&ask["writable"][0]), "{allowed}");
    std::fs::remove_file(&target).unwrap();

    // For that call only: the next one without the widening is confined again.
    let again = call(&mut client, json!({"command": command}));
    assert_eq!(again["result"]["ok"], false, "{again}");
    assert!(!target.exists());
}

#[test]
fn a_widening_is_refused_unasked_in_dont_ask_mode_and_never_covered_by_rules() {
    let daemon =
        TestDaemon::start("[permissions]\nmode = \"dont_ask\"\nallow = [\"run_command\"]\n");
    let mut client = daemon.connect();
    let target = PathBuf::from(format!("/tmp/toolgate-escalation-{}", marker()));
    let response = call(
        &mut client,
        json!({"command": format!("echo x > {}", target.display()),
               "sandbox": {"writable": ["/tmp"], "network": true}}),
    );
    assert_eq!(response["result"]["error_type"], "permission_denied", "{response}");
    let error = response["result"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("leave its sandbox"), "{response}");
    assert!(!target.exists());
    // The rule still lets the command itself run.
    let plain = call(&mut client, json!({"command": "true"}));
    assert_eq!(plain["result"]["ok"], true, "{plain}");
}

#[test]
fn a_widening_names_absolute_paths_only() {
    let daemon = TestDaemon::start("[permissions]\nmode = \"bypass\"\n");
    let mut client = daemon.connect();
    client.result("events/subscribe", json!({}));
    let id = run(&mut client, json!({"command": "true", "sandbox": {"writable": ["rel"]}}));
    let request = client.event(|event| event["type"] == "permission_request");
    client.result(
        "permission/respond",
        json!({"request_id": request["request_id"], "decision": "allow", "scope": "once"}),
    );
    let response = client.response(id);
    assert_eq!(response["result"]["error_type"], "invalid_arguments", "{response}");
}
