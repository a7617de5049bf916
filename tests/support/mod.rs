//! What the integration tests share: the real `toolgate serve` binary started on a
//! temporary socket and root (stopped on drop), a blocking NDJSON client for its native
//! protocol, and bounded waits on processes, files and futures.
//!
//! Each test binary includes it with `mod support;` and uses the part it needs.

#![allow(dead_code, reason = "each test binary uses part of the support module")]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// How long a test waits for something that normally takes milliseconds: a safety
/// net that turns "never" into a failure, never a measurement.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// A `toolgate serve` started for one test in a directory of its own; killed (and
/// reaped) on drop. The directory holds `workspace/` (the daemon's root and working
/// directory), `config.toml`, and the daemon's home, state and runtime directories.
pub(crate) struct TestDaemon {
    child: Option<Child>,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) socket: PathBuf,
    /// Added to the daemon's environment.
    envs: Vec<(String, String)>,
}

impl TestDaemon {
    pub(crate) fn start(config: &str) -> TestDaemon {
        TestDaemon::start_with(config, |_| {})
    }

    /// Starts a daemon after `prepare` has set up its directory.
    pub(crate) fn start_with(config: &str, prepare: impl FnOnce(&Path)) -> TestDaemon {
        let dir = tempfile::tempdir().unwrap();
        // Configuration directories and files must be their owner's alone.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::create_dir_all(dir.path().join("workspace")).unwrap();
        let config_path = dir.path().join("config.toml");
        std::fs::write(&config_path, config).unwrap();
        std::fs::set_permissions(&config_path, std::fs::Permissions::from_mode(0o600)).unwrap();
        prepare(dir.path());
        TestDaemon::start_in(dir)
    }

    /// Starts a daemon in a directory the test has laid out: its `config.toml` and
    /// `workspace/` (`state/`, `run/` and `config-home/` are the daemon's).
    pub(crate) fn start_in(dir: tempfile::TempDir) -> TestDaemon {
        TestDaemon::start_in_env(dir, &[])
    }

    /// [`TestDaemon::start_in`], with `envs` added to the daemon's environment.
    pub(crate) fn start_in_env(dir: tempfile::TempDir, envs: &[(&str, &str)]) -> TestDaemon {
        let socket = dir.path().join("run").join("toolgate.sock");
        let envs = envs.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect();
        let mut daemon = TestDaemon { child: None, dir, socket, envs };
        daemon.spawn();
        daemon
    }

    /// Starts the daemon (again, after [`TestDaemon::wait_exit`]) and waits until it
    /// listens.
    pub(crate) fn spawn(&mut self) {
        let child = self
            .command()
            .args(["serve", "--socket"])
            .arg(&self.socket)
            .arg("--config")
            .arg(self.path("config.toml"))
            .env("TOOLGATE_LOG", "warn")
            .envs(self.envs.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + PATIENCE;
        while UnixStream::connect(&self.socket).is_err() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("the daemon exited at start-up: {status}");
            }
            assert!(Instant::now() < deadline, "the daemon did not start listening");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The toolgate binary, run in this daemon's workspace with its environment.
    pub(crate) fn command(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate"));
        command
            .current_dir(self.path("workspace"))
            .envs(isolated_env(self.dir.path()))
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env_remove("TOOLGATE_SESSION");
        command
    }

    pub(crate) fn path(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }

    /// The workspace, canonical (as the daemon reports paths).
    pub(crate) fn workspace(&self) -> PathBuf {
        std::fs::canonicalize(self.path("workspace")).unwrap()
    }

    pub(crate) fn connect(&self) -> Client {
        Client::new(UnixStream::connect(&self.socket).unwrap())
    }

    pub(crate) fn pid(&self) -> i32 {
        i32::try_from(self.child.as_ref().unwrap().id()).unwrap()
    }

    pub(crate) fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal).unwrap();
    }

    /// Waits (bounded) for the daemon to exit; returns its exit code.
    pub(crate) fn wait_exit(&mut self) -> Option<i32> {
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.code();
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the daemon did not exit");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL, and waits for the end.
    pub(crate) fn kill(&mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Starts the daemon again in the same directory, after it was killed (the socket
    /// it left behind removed first).
    pub(crate) fn restart(&mut self) {
        assert!(self.child.is_none(), "the daemon still runs");
        let _ = std::fs::remove_file(&self.socket);
        self.spawn();
    }

    /// SIGTERM, and waits for the exit; returns its exit code.
    pub(crate) fn terminate(&mut self) -> Option<i32> {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        self.wait_exit()
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

/// The environment of a toolgate process confined to a test directory.
pub(crate) fn isolated_env(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    vec![
        ("HOME", dir.to_path_buf()),
        ("XDG_CONFIG_HOME", dir.join("config-home")),
        ("XDG_STATE_HOME", dir.join("state")),
        ("XDG_RUNTIME_DIR", dir.join("run")),
    ]
}

/// A blocking NDJSON client of the native protocol.
pub(crate) struct Client {
    reader: BufReader<UnixStream>,
    pub(crate) writer: UnixStream,
    /// The id the next request gets.
    pub(crate) next_id: u64,
    /// Messages read while waiting for another: notifications, and responses to
    /// requests not yet asked about.
    pub(crate) notifications: Vec<Value>,
    /// The session every [`Client::call`] names, once [`Client::open`] has opened one.
    pub(crate) session: Option<String>,
}

impl Client {
    pub(crate) fn new(stream: UnixStream) -> Client {
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Client {
            reader: BufReader::new(stream.try_clone().unwrap()),
            writer: stream,
            next_id: 1,
            notifications: Vec::new(),
            session: None,
        }
    }

    pub(crate) fn send_line(&mut self, line: &str) {
        self.writer.write_all(format!("{line}\n").as_bytes()).unwrap();
    }

    /// Sends a request; returns its id.
    pub(crate) fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send_line(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        );
        id
    }

    /// The next message.
    pub(crate) fn read(&mut self) -> Value {
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).unwrap();
        assert!(n > 0, "the daemon closed the connection");
        serde_json::from_str(&line).unwrap()
    }

    /// Reads until the response to `id`, keeping what comes before it.
    pub(crate) fn response(&mut self, id: u64) -> Value {
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

    pub(crate) fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        self.response(id)
    }

    /// The result of a request that must succeed.
    pub(crate) fn result(&mut self, method: &str, params: Value) -> Value {
        let response = self.request(method, params);
        assert!(response.get("error").is_none(), "{response}");
        response["result"].clone()
    }

    /// The first event (already read or still to come) that satisfies `matches`.
    pub(crate) fn event(&mut self, matches: impl Fn(&Value) -> bool) -> Value {
        if let Some(position) = self
            .notifications
            .iter()
            .position(|n| n["method"] == "events" && matches(&n["params"]["result"]))
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

    /// Opens a session that every later [`Client::call`] names; returns its answer
    /// (with the resume token).
    pub(crate) fn open(&mut self) -> Value {
        let info = self.result("session/open", json!({}));
        self.session = Some(info["session_id"].as_str().unwrap().to_owned());
        info
    }

    fn call_params(&self, name: &str, arguments: Value) -> Value {
        let mut params = json!({"name": name, "arguments": arguments});
        if let Some(session) = &self.session {
            params["session_id"] = json!(session);
        }
        params
    }

    /// One `tools/call` that must be answered without a protocol error; returns the
    /// tool result.
    pub(crate) fn call(&mut self, name: &str, arguments: Value) -> Value {
        let params = self.call_params(name, arguments);
        self.result("tools/call", params)
    }

    /// Sends every call before reading any answer (the daemon runs pipelined calls
    /// side by side); returns the results in the order of the calls.
    pub(crate) fn call_all(&mut self, calls: &[(&str, Value)]) -> Vec<Value> {
        let first = self.next_id;
        let mut batch = String::new();
        for (name, arguments) in calls {
            let params = self.call_params(name, arguments.clone());
            let line = json!({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
                "params": params});
            batch.push_str(&format!("{line}\n"));
            self.next_id += 1;
        }
        self.writer.write_all(batch.as_bytes()).unwrap();
        (first..self.next_id)
            .map(|id| {
                let response = self.response(id);
                assert!(response.get("error").is_none(), "{response}");
                response["result"].clone()
            })
            .collect()
    }
}

/// Pids of live (not zombie) processes whose command line contains `marker`.
pub(crate) fn processes_with(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let zombie = std::fs::read_to_string(entry.path().join("stat"))
            .map(|stat| stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
            .unwrap_or(true);
        if cmdline.contains(marker) && !zombie {
            found.push(pid);
        }
    }
    found
}

/// Whether `pid` is a live (not zombie) process.
pub(crate) fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        .unwrap_or(false)
}

/// Waits (bounded) until `pid` is gone; fails if it outlives the patience.
pub(crate) async fn wait_until_dead(pid: i32) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while alive(pid) {
        assert!(tokio::time::Instant::now() < deadline, "process {pid} still alive");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (bounded) until `path` holds a complete line (or lines); returns its text.
pub(crate) async fn wait_for_file(path: &Path) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        assert!(tokio::time::Instant::now() < deadline, "{} never appeared", path.display());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `future`'s output, or a failure if it takes longer than the patience.
pub(crate) async fn within<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future).await.expect("answered in time")
}

/// The body of a chunked HTTP response (what follows its headers).
pub(crate) fn dechunk(mut raw: &str) -> String {
    let mut out = String::new();
    loop {
        let Some((size, rest)) = raw.split_once("\r\n") else { return out };
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            return out;
        }
        out.push_str(&rest[..size]);
        raw = rest[size..].strip_prefix("\r\n").unwrap_or(&rest[size..]);
    }
}
