//! Upstream MCP servers proxied end to end: a fixture server (plain python3, stdio or
//! Streamable HTTP) supervised by `Upstreams`, its tools driven through the Registry
//! exactly as a session would.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use support::TestDaemon;
use tokio_util::sync::CancellationToken;
use toolgate::config::McpServerConfig;
use toolgate::tools::{
    Attachment, Call, Env, EnvPolicy, ErrorType, OutputSink, OutputStream, Registry, Safety,
    ToolResult, ToolSource,
};
use toolgate::upstream::{UpstreamOptions, UpstreamState, UpstreamStatus, Upstreams};

/// A safety net only: every wait below ends as soon as its condition holds.
const PATIENCE: Duration = Duration::from_secs(30);

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_server.py")
}

/// One fixture server's configuration and the directory it records into.
struct Fixture {
    state: tempfile::TempDir,
    config: McpServerConfig,
}

impl Fixture {
    fn stdio(name: &str, trust_annotations: bool) -> Fixture {
        let state = tempfile::tempdir().unwrap();
        let mut env = BTreeMap::new();
        env.insert("FIXTURE_STATE_DIR".to_owned(), state.path().display().to_string());
        env.insert("FIXTURE_NAME".to_owned(), name.to_owned());
        let config = McpServerConfig {
            name: name.to_owned(),
            command: Some("python3".to_owned()),
            args: vec![fixture().display().to_string()],
            env,
            cwd: None,
            url: None,
            headers: BTreeMap::new(),
            startup_timeout_ms: 20_000,
            call_timeout_ms: None,
            trust_annotations,
            sandbox: true,
            writable: Vec::new(),
            readable: Vec::new(),
            network: None,
        };
        Fixture { state, config }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.state.path().join(file)
    }

    fn lines(&self, file: &str) -> Vec<String> {
        std::fs::read_to_string(self.path(file))
            .map(|text| text.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }
}

/// Supervision timings for tests: quick restarts, no pings unless asked for.
fn options() -> UpstreamOptions {
    UpstreamOptions {
        backoff_initial: Duration::from_millis(50),
        backoff_max: Duration::from_millis(200),
        backoff_reset_after: Duration::from_secs(600),
        ping_interval: Duration::from_secs(3600),
        ping_timeout: Duration::from_secs(10),
        stop_grace: Duration::from_millis(500),
        ..UpstreamOptions::default()
    }
}

fn env() -> Arc<Env> {
    Arc::new(Env::for_root(std::env::temp_dir()).unwrap())
}

async fn call(registry: &Registry, name: &str, args: serde_json::Value) -> ToolResult {
    registry.execute(&Call::from_value("c1", name, &args), &env(), &CancellationToken::new()).await
}

/// Polls `check` until it holds; panics with `what` after [`PATIENCE`].
async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn status_of(upstreams: &Upstreams, name: &str) -> UpstreamStatus {
    upstreams.status().into_iter().find(|status| status.name == name).unwrap()
}

async fn wait_ready(upstreams: &Upstreams, name: &str) {
    wait_for(&format!("{name} to be ready"), || {
        status_of(upstreams, name).state == UpstreamState::Ready
    })
    .await;
}

/// Whether a process exists and is not a zombie.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            let state = stat.rsplit(')').next().and_then(|rest| rest.trim_start().chars().next());
            state != Some('Z')
        }
    }
}

fn started(registry: &Arc<Registry>, fixtures: &[&Fixture]) -> Arc<Upstreams> {
    let upstreams = Upstreams::new(registry.clone(), options());
    let configs: Vec<McpServerConfig> = fixtures.iter().map(|f| f.config.clone()).collect();
    upstreams.apply(&configs, &EnvPolicy::default());
    upstreams
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxied_tools_are_listed_with_the_prefix_and_called() {
    let registry = Arc::new(Registry::with_builtins());
    let trusted = Fixture::stdio("fx", true);
    let untrusted = Fixture::stdio("other", false);
    let upstreams = started(&registry, &[&trusted, &untrusted]);
    wait_ready(&upstreams, "fx").await;
    wait_ready(&upstreams, "other").await;

    let proxied: Vec<String> =
        registry.names().into_iter().filter(|name| name.starts_with("mcp__fx__")).collect();
    assert_eq!(
        proxied,
        [
            "mcp__fx__crash",
            "mcp__fx__echo",
            "mcp__fx__fail",
            "mcp__fx__freeze",
            "mcp__fx__media",
            "mcp__fx__slow",
            "mcp__fx__spawn_child",
            "mcp__fx__toggle"
        ]
    );
    assert_eq!(registry.source("mcp__fx__echo"), Some(ToolSource::Mcp("fx".to_owned())));
    assert_eq!(registry.source("read_file"), Some(ToolSource::Builtin));
    assert_eq!(
        status_of(&upstreams, "fx"),
        UpstreamStatus {
            name: "fx".to_owned(),
            state: UpstreamState::Ready,
            reason: None,
            restarts: 0,
            tools: 8
        }
    );

    // Annotations: believed only for a trusted server, and only readOnlyHint = true.
    assert_eq!(registry.safety("mcp__fx__echo"), Some(Safety::ReadOnly));
    assert_eq!(registry.safety("mcp__fx__slow"), Some(Safety::SideEffect));
    assert_eq!(registry.safety("mcp__fx__fail"), Some(Safety::SideEffect));
    assert_eq!(registry.safety("mcp__other__echo"), Some(Safety::SideEffect));

    let echoed = call(&registry, "mcp__fx__echo", json!({"text": "hello; $(touch x)"})).await;
    assert!(echoed.ok, "{echoed:?}");
    assert_eq!(echoed.content, "hello; $(touch x)");
    assert_eq!(echoed.tool, "mcp__fx__echo");

    // The registry checks the upstream's schema before anything is sent.
    let invalid = call(&registry, "mcp__fx__echo", json!({"text": 5})).await;
    assert_eq!(invalid.error_type, Some(ErrorType::InvalidArguments));

    let failed = call(&registry, "mcp__fx__fail", json!({})).await;
    assert!(!failed.ok);
    assert_eq!(failed.error_type, Some(ErrorType::UpstreamError));
    assert_eq!(failed.error.as_deref(), Some("it failed on purpose"));

    let media = call(&registry, "mcp__fx__media", json!({})).await;
    assert!(media.ok, "{media:?}");
    assert_eq!(media.content, "here is a picture");
    assert_eq!(
        media.attachments,
        vec![
            Attachment::Image {
                mime_type: "image/png".to_owned(),
                data: "iVBORw0KGgo=".to_owned()
            },
            Attachment::Audio { mime_type: "audio/wav".to_owned(), data: "UklGRg==".to_owned() },
            Attachment::Resource {
                uri: "file:///notes.txt".to_owned(),
                mime_type: Some("text/plain".to_owned()),
                text: "resource text".to_owned()
            },
        ]
    );
    upstreams.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_is_forwarded_as_live_output() {
    let registry = Arc::new(Registry::new());
    let fixture = Fixture::stdio("fx", false);
    let upstreams = started(&registry, &[&fixture]);
    wait_ready(&upstreams, "fx").await;

    let chunks = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let chunks = chunks.clone();
        OutputSink::new(move |stream, text| chunks.lock().unwrap().push((stream, text.to_owned())))
    };
    let res = registry
        .execute_streaming(
            &Call::from_value("c1", "mcp__fx__slow", &json!({"steps": 3, "delay_ms": 10})),
            &env(),
            &CancellationToken::new(),
            sink,
        )
        .await;
    assert!(res.ok, "{res:?}");
    assert_eq!(res.content, "done after 3 steps");
    assert_eq!(
        *chunks.lock().unwrap(),
        vec![
            (OutputStream::Stdout, "step 1 of 3\n".to_owned()),
            (OutputStream::Stdout, "step 2 of 3\n".to_owned()),
            (OutputStream::Stdout, "step 3 of 3\n".to_owned()),
        ]
    );
    upstreams.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canceled_call_is_canceled_upstream() {
    let registry = Arc::new(Registry::new());
    let fixture = Fixture::stdio("fx", false);
    let upstreams = started(&registry, &[&fixture]);
    wait_ready(&upstreams, "fx").await;

    // Cancel once the first progress shows the call is running upstream.
    let cancel = CancellationToken::new();
    let sink = {
        let cancel = cancel.clone();
        OutputSink::new(move |_, _| cancel.cancel())
    };
    let res = registry
        .execute_streaming(
            &Call::from_value("c1", "mcp__fx__slow", &json!({"steps": 1000, "delay_ms": 50})),
            &env(),
            &cancel,
            sink,
        )
        .await;
    assert_eq!(res.error_type, Some(ErrorType::Canceled), "{res:?}");
    wait_for("the server to record the cancellation", || {
        !fixture.lines("cancelled.log").is_empty()
    })
    .await;
    let recorded = fixture.lines("cancelled.log");
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert!(recorded[0].ends_with("canceled by the client or past its deadline"), "{recorded:?}");

    // The connection is still good afterwards.
    let echoed = call(&registry, "mcp__fx__echo", json!({"text": "still here"})).await;
    assert_eq!(echoed.content, "still here");
    upstreams.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_call_timeout_applies_and_cancels_upstream() {
    let registry = Arc::new(Registry::new());
    let mut fixture = Fixture::stdio("fx", false);
    fixture.config.call_timeout_ms = Some(300);
    let upstreams = started(&registry, &[&fixture]);
    wait_ready(&upstreams, "fx").await;
    assert_eq!(
        registry.get("mcp__fx__slow").unwrap().definition().timeout,
        Some(Duration::from_millis(300))
    );

    let res = call(&registry, "mcp__fx__slow", json!({"steps": 1000, "delay_ms": 50})).await;
    assert_eq!(res.error_type, Some(ErrorType::Timeout), "{res:?}");
    wait_for("the server to record the cancellation", || {
        !fixture.lines("cancelled.log").is_empty()
    })
    .await;
    upstreams.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_server_answers_upstream_error_then_comes_back_resynced() {
    let registry = Arc::new(Registry::new());
    let fixture = Fixture::stdio("fx", false);
    let upstreams = started(&registry, &[&fixture]);
    wait_ready(&upstreams, "fx").await;
    assert!(!registry.contains("mcp__fx__extra"));

    // Restarts fail until the test lets them through, so "down" is observable; the
    // next successful start lists one more tool.
    std::fs::write(fixture.path("block_start"), "").unwrap();
    std::fs::write(fixture.path("extra_on"), "").unwrap();
    let crashed = call(&registry, "mcp__fx__crash", json!({})).await;
    assert_eq!(crashed.error_type, Some(ErrorType::UpstreamError), "{crashed:?}");

    wait_for("a failed restart", || {
        let status = status_of(&upstreams, "fx");
        status.state == UpstreamState::Failed && status.restarts >= 1
    })
    .await;
    // Its tools stay listed but answer at once.
    let down = call(&registry, "mcp__fx__echo", json!({"text": "x"})).await;
    assert_eq!(down.error_type, Some(ErrorType::UpstreamError), "{down:?}");
    assert!(down.error.as_deref().unwrap().contains("not available"), "{down:?}");

    let changes = registry.subscribe_changes();
    let before = *changes.borrow();
    std::fs::remove_file(fixture.path("block_start")).unwrap();
    wait_ready(&upstreams, "fx").await;
    assert!(registry.contains("mcp__fx__extra"));
    assert!(*changes.borrow() > before);
    let echoed = call(&registry, "mcp__fx__echo", json!({"text": "back"})).await;
    assert_eq!(echoed.content, "back");
    assert_eq!(fixture.lines("starts.log").len(), 2);
    upstreams.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_changed_resyncs_the_tools() {
    let registry = Arc::new(Registry::new());
    let fixture = Fixture::stdio("fx", true);
    let upstreams = started(&registry, &[&fixture]);
    wait_ready(&upstreams, "fx").await;
    let changes = registry.subscribe_changes();
    let before = *changes.borrow();

    let toggled = call(&registry, "mcp__fx__toggle", json!({})).await;
    assert_eq!(toggled.content, "extra is True");
    // The change notification follows the change itself: wait for both, not for one
    // and then assert the other.
    wait_for("the new tool and its notification", || {
        registry.contains("mcp__fx__extra") && *changes.borrow() > before
    })
    .await;
    assert_eq!(registry.safety("mcp__fx__extra"), Some(Safety::ReadOnly));
    // The status and the registry change in one step: whoever sees one sees the other.
    assert_eq!(status_of(&upstreams, "fx").tools, 9);
    assert_eq!(call(&registry, "mcp__fx__extra", json!({})).await.content, "extra");

    call(&registry, "mcp__fx__toggle", json!({})).await;
    wait_for("the tool to go away", || !registry.contains("mcp__fx__extra")).await;
    assert_eq!(status_of(&upstreams, "fx").tools, 8);
    upstreams.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_is_restarted() {
    let registry = Arc::new(Registry::new());
    let fixture = Fixture::stdio("fx", false);
    let upstreams = Upstreams::new(
        registry.clone(),
        UpstreamOptions {
            ping_interval: Duration::from_millis(100),
            ping_timeout: Duration::from_millis(500),
            ..options()
        },
    );
    upstreams.apply(std::slice::from_ref(&fixture.config), &EnvPolicy::default());
    wait_ready(&upstreams, "fx").await;
    let first_pid: i32 = fixture.lines("starts.log")[0].parse().unwrap();

    // The frozen call never gets an answer; giving up the hung server ends it.
    let frozen = call(&registry, "mcp__fx__freeze", json!({})).await;
    assert_eq!(frozen.error_type, Some(ErrorType::UpstreamError), "{frozen:?}");
    wait_for("a restart", || {
        let status = status_of(&upstreams, "fx");
        status.state == UpstreamState::Ready && status.restarts >= 1
    })
    .await;
    let echoed = call(&registry, "mcp__fx__echo", json!({"text": "alive"})).await;
    assert_eq!(echoed.content, "alive");
    wait_for("the hung process to be killed", || !alive(first_pid)).await;
    upstreams.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_server_removes_its_tools_and_kills_its_processes() {
    let registry = Arc::new(Registry::with_builtins());
    let kept = Fixture::stdio("kept", false);
    let removed = Fixture::stdio("gone", false);
    let upstreams = started(&registry, &[&kept, &removed]);
    wait_ready(&upstreams, "kept").await;
    wait_ready(&upstreams, "gone").await;
    let server_pid: i32 = removed.lines("starts.log")[0].parse().unwrap();
    let grandchild: i32 =
        call(&registry, "mcp__gone__spawn_child", json!({})).await.content.parse().unwrap();
    assert!(alive(grandchild));

    upstreams.apply(std::slice::from_ref(&kept.config), &EnvPolicy::default());
    assert!(registry.names().iter().all(|name| !name.starts_with("mcp__gone__")));
    assert!(registry.contains("mcp__kept__echo"));
    assert!(registry.contains("read_file"));
    assert_eq!(upstreams.status().len(), 1);
    wait_for("the removed server to die", || !alive(server_pid)).await;
    wait_for("its grandchild to die", || !alive(grandchild)).await;
    assert_eq!(kept.lines("starts.log").len(), 1, "an unchanged server is not restarted");

    // Shutdown: every child goes, the tools with it.
    let kept_pid: i32 = kept.lines("starts.log")[0].parse().unwrap();
    upstreams.shutdown().await;
    assert!(!alive(kept_pid));
    assert!(registry.names().iter().all(|name| !name.starts_with("mcp__")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_initializes_fails_with_a_reason() {
    let registry = Arc::new(Registry::new());
    let mut config = Fixture::stdio("mute", false).config;
    config.command = Some("sleep".to_owned());
    config.args = vec!["60".to_owned()];
    config.startup_timeout_ms = 300;
    let upstreams = Upstreams::new(registry.clone(), options());
    upstreams.apply(&[config], &EnvPolicy::default());
    // `apply` returned at once; the server is being started in the background.
    wait_for("the startup timeout", || {
        status_of(&upstreams, "mute").reason.as_deref() == Some("did not start within 300 ms")
    })
    .await;
    assert!(registry.names().is_empty());
    upstreams.shutdown().await;
    assert_eq!(status_of_all(&upstreams), Vec::<String>::new());
}

fn status_of_all(upstreams: &Upstreams) -> Vec<String> {
    upstreams.status().into_iter().map(|status| status.name).collect()
}

/// The fixture in Streamable HTTP mode, killed on drop.
struct HttpFixture {
    child: std::process::Child,
    state: tempfile::TempDir,
    port: u16,
}

impl HttpFixture {
    async fn start() -> HttpFixture {
        let state = tempfile::tempdir().unwrap();
        let port_file = state.path().join("port");
        let child = std::process::Command::new("python3")
            .arg(fixture())
            .arg("--http")
            .arg(&port_file)
            .env("FIXTURE_STATE_DIR", state.path())
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut port = None;
        wait_for("the HTTP fixture to listen", || {
            port = std::fs::read_to_string(&port_file).ok().and_then(|text| text.parse().ok());
            port.is_some()
        })
        .await;
        HttpFixture { child, state, port: port.unwrap() }
    }
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamable_http_server_is_proxied_with_its_headers() {
    let server = HttpFixture::start().await;
    let registry = Arc::new(Registry::new());
    let mut headers = BTreeMap::new();
    headers.insert("X-Fixture-Token".to_owned(), "sesame".to_owned());
    let config = McpServerConfig {
        name: "web".to_owned(),
        command: None,
        args: Vec::new(),
        env: BTreeMap::new(),
        cwd: None,
        url: Some(format!("http://127.0.0.1:{}/mcp", server.port)),
        headers,
        startup_timeout_ms: 20_000,
        call_timeout_ms: None,
        trust_annotations: true,
        sandbox: true,
        writable: Vec::new(),
        readable: Vec::new(),
        network: None,
    };
    let upstreams = Upstreams::new(registry.clone(), options());
    upstreams.apply(&[config], &EnvPolicy::default());
    wait_ready(&upstreams, "web").await;
    assert_eq!(registry.safety("mcp__web__echo"), Some(Safety::ReadOnly));
    let echoed = call(&registry, "mcp__web__echo", json!({"text": "over http"})).await;
    assert!(echoed.ok, "{echoed:?}");
    assert_eq!(echoed.content, "over http");
    let failed = call(&registry, "mcp__web__fail", json!({})).await;
    assert_eq!(failed.error_type, Some(ErrorType::UpstreamError));
    let seen = std::fs::read_to_string(server.state.path().join("headers.log")).unwrap();
    assert!(seen.lines().all(|line| line == "sesame"), "{seen}");
    upstreams.shutdown().await;
}

/// The interpreter behind `python3`, resolved once, so that the daemon test does not
/// depend on how `python3` is found (shims, a different `HOME`).
fn python() -> String {
    static PYTHON: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let out = std::process::Command::new("python3")
                .args(["-c", "import sys; print(sys.executable)"])
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        })
        .clone()
}

fn poll_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + PATIENCE;
    while !check() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The real daemon: upstreams start after it listens, their tools and the skills are
/// listed with their sources, `daemon/status` shows them, SIGHUP without the server
/// removes its tools (and tells the session), SIGTERM kills the upstream.
#[test]
fn the_daemon_serves_upstreams_and_skills_and_reloads_them() {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let workspace = root.join("workspace");
    let skills = root.join("skills");
    // The fixture's own state (`state/` is the daemon's).
    let state = root.join("fixture-state");
    for dir in [&workspace, &skills, &state] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(
        skills.join("greet.toml"),
        "name = \"greet\"\ndescription = \"Greets.\"\ncommand = [\"echo\", \"hi\"]\n",
    )
    .unwrap();
    let base = format!(
        "[workspace]\nroots = [{workspace:?}]\n\n[skills]\ndirs = [{skills:?}]\n",
        workspace = workspace.display().to_string(),
        skills = skills.display().to_string(),
    );
    let with_server = format!(
        "{base}\n[[mcp_servers]]\nname = \"fx\"\ncommand = {python:?}\nargs = [{fixture:?}]\nenv = {{ FIXTURE_STATE_DIR = {state:?} }}\ntrust_annotations = true\nwritable = [{state:?}]\n",
        python = python(),
        fixture = fixture().display().to_string(),
        state = state.display().to_string(),
    );
    let config = root.join("config.toml");
    std::fs::write(&config, &with_server).unwrap();
    let mut daemon = TestDaemon::start_in(tmp);
    let mut client = daemon.connect();
    client.result("events/subscribe", json!({}));

    poll_until("the upstream to be ready", || {
        let status = client.result("daemon/status", json!({}));
        status["upstreams"][0]["state"] == "ready"
    });
    let status = client.result("daemon/status", json!({}));
    assert_eq!(
        status["upstreams"],
        json!([{"name": "fx", "state": "ready", "restarts": 0, "tools": 8}])
    );
    let listed = client.result("tools/list", json!({}));
    let sources = &listed["sources"];
    assert_eq!(sources["mcp__fx__echo"], "mcp:fx");
    assert_eq!(sources["read_file"], "builtin");
    assert_eq!(sources["greet"], format!("skill:{}", skills.join("greet.toml").display()));
    let echoed = client.result(
        "tools/call",
        json!({"name": "mcp__fx__echo", "arguments": {"text": "through the daemon"}}),
    );
    assert_eq!(echoed["content"], "through the daemon", "{echoed}");
    let server_pid: i32 = std::fs::read_to_string(state.join("starts.log"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();

    // Reload without the server: its tools go, the session hears about it.
    client.notifications.clear();
    std::fs::write(&config, &base).unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    client.event(|event| event["type"] == "tools_list_changed");
    poll_until("the proxied tools to go", || {
        let listed = client.result("tools/list", json!({}));
        listed["tools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|tool| !tool["name"].as_str().unwrap().starts_with("mcp__"))
    });
    assert_eq!(client.result("daemon/status", json!({}))["upstreams"], json!([]));
    poll_until("the removed server to die", || !alive(server_pid));
    assert_eq!(
        client.result("tools/list", json!({}))["sources"]["greet"],
        format!("skill:{}", skills.join("greet.toml").display())
    );

    // Back again, then SIGTERM: the daemon exits cleanly and takes the server along.
    std::fs::write(&config, &with_server).unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    poll_until("the server to be back", || {
        client.result("daemon/status", json!({}))["upstreams"][0]["state"] == "ready"
    });
    let second_pid: i32 = std::fs::read_to_string(state.join("starts.log"))
        .unwrap()
        .lines()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    drop(client);
    assert_eq!(daemon.terminate(), Some(0));
    poll_until("the upstream to die with the daemon", || !alive(second_pid));
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogBuffer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

// A single-threaded runtime: every task runs on this thread, under its subscriber.
#[tokio::test(flavor = "current_thread")]
async fn the_servers_stderr_goes_to_the_log_line_by_line() {
    let logs = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .with_ansi(false)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let registry = Arc::new(Registry::new());
    let fixture = Fixture::stdio("fx", false);
    let upstreams = started(&registry, &[&fixture]);
    wait_ready(&upstreams, "fx").await;
    call(&registry, "mcp__fx__crash", json!({})).await;
    wait_for("the stderr lines in the log", || logs.text().contains("crashing on request")).await;
    let text = logs.text();
    let started_line = text.lines().find(|line| line.contains("fixture fx started")).unwrap();
    assert!(started_line.contains("server=fx"), "{started_line}");
    let crash_line = text.lines().find(|line| line.contains("crashing on request")).unwrap();
    assert!(crash_line.contains("server=fx"), "{crash_line}");
    upstreams.shutdown().await;
}

/// Waits until the server is failed with a reason containing `needle`; returns it.
async fn wait_failed_with(upstreams: &Upstreams, name: &str, needle: &str) -> UpstreamStatus {
    let mut last = None;
    wait_for(&format!("{name} to fail because {needle}"), || {
        let status = status_of(upstreams, name);
        let failed = status.state == UpstreamState::Failed
            && status.reason.as_deref().is_some_and(|reason| reason.contains(needle));
        last = Some(status);
        failed
    })
    .await;
    last.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_pages_forever_is_failed_after_the_page_limit() {
    let registry = Arc::new(Registry::new());
    let mut fixture = Fixture::stdio("pager", false);
    fixture.config.env.insert("FIXTURE_ENDLESS_PAGES".to_owned(), "1".to_owned());
    let upstreams = started(&registry, &[&fixture]);
    let limit = UpstreamOptions::default().max_list_pages;
    let status = wait_failed_with(&upstreams, "pager", &format!("more than {limit} pages")).await;
    assert_eq!(status.tools, 0, "{status:?}");
    assert!(registry.names().is_empty(), "{:?}", registry.names());
    // The first listing stopped at the limit (later lines belong to restarts, each
    // starting again at page 0).
    let pages = fixture.lines("pages.log");
    let first: Vec<&str> = pages
        .iter()
        .enumerate()
        .take_while(|(index, page)| *index == 0 || *page != "0")
        .map(|(_, page)| page.as_str())
        .collect();
    let expected: Vec<String> = (0..limit).map(|page| page.to_string()).collect();
    assert_eq!(first, expected);
    upstreams.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_too_many_tools_or_bytes_is_failed() {
    let registry = Arc::new(Registry::new());
    let mut many = Fixture::stdio("many", false);
    many.config.env.insert("FIXTURE_MANY_TOOLS".to_owned(), "50".to_owned());
    let mut big = Fixture::stdio("big", false);
    big.config.env.insert("FIXTURE_BIG_DESCRIPTION".to_owned(), "70000".to_owned());
    let fine = Fixture::stdio("fine", false);
    let upstreams = Upstreams::new(
        registry.clone(),
        UpstreamOptions { max_tools: 40, max_tool_bytes: 64 * 1024, ..options() },
    );
    upstreams.apply(
        &[many.config.clone(), big.config.clone(), fine.config.clone()],
        &EnvPolicy::default(),
    );
    wait_failed_with(&upstreams, "many", "more than 40 tools").await;
    wait_failed_with(&upstreams, "big", "more than 65536 bytes").await;
    wait_ready(&upstreams, "fine").await;
    // Nothing of a refused server is registered; the others are unaffected.
    let names = registry.names();
    assert!(names.iter().all(|name| name.starts_with("mcp__fine__")), "{names:?}");
    assert_eq!(status_of(&upstreams, "fine").tools, 8);
    upstreams.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_name_with_a_double_underscore_is_never_started() {
    let registry = Arc::new(Registry::new());
    // `gh__enterprise` would own `mcp__gh__enterprise__*`, which is server gh's tool
    // `enterprise__*`: the squatter is refused, gh keeps its namespace.
    let squatter = Fixture::stdio("gh__enterprise", false);
    let mut gh = Fixture::stdio("gh", false);
    gh.config.env.insert("FIXTURE_EXTRA_TOOL".to_owned(), "enterprise__create_issue".to_owned());
    let upstreams = started(&registry, &[&squatter, &gh]);
    wait_failed_with(&upstreams, "gh__enterprise", "may not contain `__`").await;
    wait_ready(&upstreams, "gh").await;
    assert!(squatter.lines("starts.log").is_empty(), "the squatter was started");
    assert_eq!(
        registry.source("mcp__gh__enterprise__create_issue"),
        Some(ToolSource::Mcp("gh".to_owned()))
    );
    assert_eq!(toolgate::upstream::server_of("mcp__gh__enterprise__create_issue"), Some("gh"));
    for name in ["gh__enterprise", "_gh", "gh_", "a b", ""] {
        assert!(toolgate::upstream::check_server_name(name).is_err(), "{name:?}");
    }
    for name in ["gh", "git-hub", "my_server", "s3"] {
        assert!(toolgate::upstream::check_server_name(name).is_ok(), "{name:?}");
    }
    upstreams.shutdown().await;
}

/// Configuration loading refuses the name too, with the file and line.
#[test]
fn check_config_refuses_a_server_name_with_a_double_underscore() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.toml");
    std::fs::write(
        &config,
        "[workspace]\nroots = [\".\"]\n\n[[mcp_servers]]\nname = \"gh__enterprise\"\ncommand = \"true\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .arg("check-config")
        .arg("--config")
        .arg(&config)
        .current_dir(tmp.path())
        .env("XDG_CONFIG_HOME", tmp.path().join("config-home"))
        .env("XDG_STATE_HOME", tmp.path().join("state-home"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("{}:5", config.display())), "{stderr}");
    assert!(stderr.contains("may not contain `__`"), "{stderr}");
}

/// Whoever reads the registry and then the status (or the other way round) never sees
/// them disagree, while the server's tools change under them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_never_disagrees_with_the_registry() {
    let registry = Arc::new(Registry::new());
    let fixture = Fixture::stdio("fx", false);
    let upstreams = started(&registry, &[&fixture]);
    wait_ready(&upstreams, "fx").await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let observer = {
        let (registry, upstreams, done) = (registry.clone(), upstreams.clone(), done.clone());
        tokio::spawn(async move {
            let changes = registry.subscribe_changes();
            let mut compared = 0u32;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                // A reading between two equal generations saw no change in between.
                let before = *changes.borrow();
                let extra = registry.contains("mcp__fx__extra");
                let status = status_of(&upstreams, "fx");
                let after = *changes.borrow();
                if before == after && status.state == UpstreamState::Ready {
                    assert_eq!(status.tools, 8 + usize::from(extra), "{status:?}");
                    compared += 1;
                }
                tokio::task::yield_now().await;
            }
            compared
        })
    };
    for round in 0..20 {
        call(&registry, "mcp__fx__toggle", json!({})).await;
        let present = round % 2 == 0;
        wait_for("the toggled tool", || registry.contains("mcp__fx__extra") == present).await;
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let compared = observer.await.unwrap();
    assert!(compared > 0, "the observer never compared");
    upstreams.shutdown().await;
}

/// A minimal stdio MCP server with one tool that writes, reads or connects where it
/// is told, and answers what happened: the probe of an upstream server's sandbox.
const PROBE_SERVER: &str = r#"
import json, socket, sys

def reply(request_id, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
    sys.stdout.flush()

for line in sys.stdin:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if method == "initialize":
        reply(request_id, {"protocolVersion": message["params"]["protocolVersion"],
                           "capabilities": {"tools": {}},
                           "serverInfo": {"name": "probe", "version": "1"}})
    elif method == "tools/list":
        reply(request_id, {"tools": [{"name": "probe", "inputSchema": {"type": "object"}}]})
    elif method == "tools/call":
        arguments = message["params"]["arguments"]
        try:
            if arguments["action"] == "write":
                with open(arguments["target"], "w") as f:
                    f.write("x")
                text = "done"
            elif arguments["action"] == "read":
                with open(arguments["target"]) as f:
                    text = "read:" + f.read()
            else:
                socket.create_connection(("127.0.0.1", int(arguments["target"])), 5)
                text = "connected"
        except OSError as err:
            text = "error: %s" % err
        reply(request_id, {"content": [{"type": "text", "text": text}]})
    elif request_id is not None:
        reply(request_id, {})
"#;

/// An upstream stdio server runs in the kernel sandbox unless its entry opts out: it
/// cannot write outside the roots and its own paths, read toolgate's token file, or
/// (with `network = false`) connect anywhere; the same server with `sandbox = false`
/// can, which is what the sandbox takes away.
#[test]
fn upstream_stdio_servers_run_in_the_sandbox_unless_they_opt_out() {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let workspace = root.join("workspace");
    let outside = root.join("outside");
    let secret = root.join("secret");
    for dir in [&workspace, &outside, &secret] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let token_file = secret.join("tokens");
    std::fs::write(&token_file, "me:probe-secret-value\n").unwrap();
    std::fs::set_permissions(&token_file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .unwrap();
    let server = root.join("probe.py");
    std::fs::write(&server, PROBE_SERVER).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let entry = |name: &str, extra: &str| {
        format!(
            "[[mcp_servers]]\nname = \"{name}\"\ncommand = {python:?}\nargs = [{server:?}]\n{extra}\n",
            python = python(),
            server = server.display().to_string(),
        )
    };
    let config = root.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ntoken_file = {token:?}\n\n[workspace]\nroots = [{workspace:?}]\n\n\
             [permissions]\nallow = [\"mcp__probe__probe\", \"mcp__open__probe\"]\n\n{}{}",
            entry("probe", "network = false"),
            entry("open", "sandbox = false"),
            token = token_file.display().to_string(),
            workspace = workspace.display().to_string(),
        ),
    )
    .unwrap();
    let daemon = TestDaemon::start_in(tmp);
    let mut client = daemon.connect();
    let status = client.result("daemon/status", json!({}));
    if status["sandbox"]["landlock_abi"].as_i64().unwrap_or(0) == 0 {
        eprintln!("skipped: no Landlock in this kernel ({})", status["sandbox"]);
        return;
    }
    poll_until("both servers to be ready", || {
        let status = client.result("daemon/status", json!({}));
        status["upstreams"].as_array().is_some_and(|servers| {
            servers.len() == 2 && servers.iter().all(|server| server["state"] == "ready")
        })
    });
    let mut probe = |server: &str, action: &str, target: &str| -> String {
        let result = client.result(
            "tools/call",
            json!({"name": format!("mcp__{server}__probe"),
                   "arguments": {"action": action, "target": target}}),
        );
        result["content"].as_str().unwrap_or_default().to_owned()
    };
    let outside_file = outside.join("written");
    let outside_path = outside_file.display().to_string();
    let inside_path = workspace.join("written").display().to_string();
    let token_path = token_file.display().to_string();
    let port = port.to_string();

    let denied = probe("probe", "write", &outside_path);
    assert!(denied.contains("Permission denied"), "{denied}");
    assert!(!outside_file.exists());
    assert_eq!(probe("probe", "write", &inside_path), "done");
    let token = probe("probe", "read", &token_path);
    assert!(!token.contains("probe-secret-value") && token.starts_with("error"), "{token}");
    let connect = probe("probe", "connect", &port);
    assert!(connect.starts_with("error"), "{connect}");

    // The same server outside the sandbox: everything above works.
    assert_eq!(probe("open", "write", &outside_path), "done");
    assert!(outside_file.exists());
    assert!(probe("open", "read", &token_path).contains("probe-secret-value"));
    assert_eq!(probe("open", "connect", &port), "connected");
    drop(listener);
}
