//! run_command end to end through the Registry, and the process supervisor beneath it.
//!
//! The process-tree tests look at the process table (`/proc`), never at the clock:
//! each test marks its processes with a unique `sleep 1000.<marker>` argument, proves
//! they were running (and had escaped the shell's process group) before the call
//! ended, and then checks that no process carrying the marker is left. Polling loops
//! are bounded by [`PATIENCE`], a safety net rather than a measurement.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;
use toolgate::exec::{
    self as process, ExitStatus, ProcessError, Program, SUPERVISE_ARG, Spec, Stdin, Supervisor,
};
use toolgate::tools::builtin::run_command;
use toolgate::tools::{
    Call, Env, ErrorType, OutputSink, OutputStream, Registry, ToolContext, ToolResult,
};

/// How long a test waits for something that normally takes milliseconds.
const PATIENCE: Duration = Duration::from_secs(20);

/// Runs a test on the one runtime of this test binary, owning the process tree while
/// it runs. The tests share the process's one spawner of supervisors (started on the
/// runtime of its first use, as the daemon's is on its only runtime) and its
/// supervisors started ahead, and look at the processes and cgroups of the whole
/// machine. `cargo test` runs them as threads of one process, so they share one
/// runtime and take turns; nextest runs each in a process of its own, where this
/// costs nothing.
fn on_the_shared_runtime<F: Future>(test: F) -> F::Output {
    static RUNTIME: std::sync::LazyLock<tokio::runtime::Runtime> = std::sync::LazyLock::new(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
    });
    static TREE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    RUNTIME.block_on(async {
        let _tree = TREE.lock().await;
        test.await
    })
}

const TOOLGATE: &str = env!("CARGO_BIN_EXE_toolgate");

struct Fixture {
    dir: tempfile::TempDir,
    env: Arc<Env>,
    registry: Registry,
}

fn fixture() -> Fixture {
    fixture_with(|_| {})
}

fn fixture_with(adjust: impl FnOnce(&mut Env)) -> Fixture {
    // Integration tests run a test binary, not `toolgate`: point the supervisor at it.
    Supervisor::install(TOOLGATE);
    let dir = tempfile::tempdir().unwrap();
    let mut env = Env::for_root(dir.path()).unwrap();
    adjust(&mut env);
    Fixture { dir, env: Arc::new(env), registry: Registry::with_builtins() }
}

impl Fixture {
    fn path(&self) -> &Path {
        &self.env.cwd
    }

    fn call(&self, args: &Value) -> Call {
        Call::from_value(format!("call-{}", next_number()), "run_command", args)
    }

    async fn run(&self, args: Value) -> ToolResult {
        self.registry.execute(&self.call(&args), &self.env, &CancellationToken::new()).await
    }
}

fn next_number() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// Digits only (it becomes the fraction of a `sleep` argument), unique across tests
/// and across concurrently running test processes.
fn unique_marker() -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{}{:04}{nanos:09}", std::process::id(), next_number())
}

/// A script that leaves behind a `setsid` sleep (a new session, so out of the shell's
/// process group) and a double-forked sleep (its parents exit, so it is re-parented),
/// waits until both run, and then runs `then`.
fn escaping_script(marker: &str, then: &str) -> String {
    format!(
        r#"setsid sh -c 'echo $$ > setsid.pid; exec sleep 1000.{marker}1' &
(sh -c 'sh -c "echo \$\$ > double.pid; exec sleep 1000.{marker}2" &' &)
while [ ! -s setsid.pid ] || [ ! -s double.pid ]; do sleep 0.01; done
{then}
"#
    )
}

fn cmdline(pid: i32) -> Option<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&bytes).replace('\0', " "))
}

/// Live processes whose command line carries the marker (zombies have an empty
/// command line, so they do not count: they are dead).
fn processes_with(marker: &str) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else {
            continue;
        };
        if let Some(line) = cmdline(pid).filter(|line| line.contains(marker)) {
            found.push((pid, line));
        }
    }
    found
}

/// Waits (bounded) until nothing carrying the marker is alive, and fails otherwise.
async fn assert_tree_gone(marker: &str) {
    let start = Instant::now();
    loop {
        let left = processes_with(marker);
        if left.is_empty() {
            return;
        }
        if start.elapsed() > PATIENCE {
            // Fail, but leave no stray processes behind: they carry this test's marker.
            for (pid, _) in &left {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            panic!("processes outlived the call: {left:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Field 6 of `/proc/PID/stat`: the session id.
fn session_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 1..];
    after_comm.split_whitespace().nth(3).unwrap().parse().unwrap()
}

/// Awaits a call that must end promptly; a hang fails the test instead of stalling it.
async fn within_patience<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future).await.expect("the call did not end in time")
}

/// Polls the call until both escaping sleeps of [`escaping_script`] run, failing if
/// the call ends first. Returns their pids.
async fn until_escapees_run<F: Future<Output = ToolResult>>(
    call: &mut Pin<&mut F>,
    dir: &Path,
    marker: &str,
) -> Vec<i32> {
    let start = Instant::now();
    loop {
        tokio::select! {
            res = call.as_mut() => panic!("the call ended before its processes started: {res:?}"),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        let pids: Vec<i32> = ["setsid.pid", "double.pid"]
            .iter()
            .filter_map(|file| std::fs::read_to_string(dir.join(file)).ok())
            .filter_map(|text| text.trim().parse().ok())
            .collect();
        let running = pids.len() == 2
            && pids.iter().all(|pid| cmdline(*pid).is_some_and(|line| line.contains(marker)));
        if running {
            // The setsid sleep really left the shell's session (and process group).
            assert_eq!(session_of(pids[0]), pids[0]);
            return pids;
        }
        assert!(start.elapsed() < PATIENCE, "the escaping processes never started");
    }
}

#[test]
fn escaped_processes_die_when_the_shell_exits() {
    on_the_shared_runtime(async {
        let fx = fixture();
        let marker = unique_marker();
        let script =
            escaping_script(&marker, "while [ ! -e go ]; do sleep 0.01; done; echo finished");
        let call = fx.call(&json!({ "command": script }));
        let cancel = CancellationToken::new();
        let future = fx.registry.execute(&call, &fx.env, &cancel);
        tokio::pin!(future);

        until_escapees_run(&mut future, fx.path(), &marker).await;
        std::fs::write(fx.path().join("go"), "").unwrap();
        let res = within_patience(future).await;

        assert!(res.ok, "{res:?}");
        assert_eq!(res.content, "finished\n[exit code 0]");
        assert_eq!(res.metadata["exit_code"], 0);
        // The call waited for the tree to be killed: nothing may be left even now.
        assert_eq!(processes_with(&marker), vec![]);
        assert_tree_gone(&marker).await;
    })
}

#[test]
fn escaped_processes_die_on_timeout() {
    on_the_shared_runtime(async {
        let fx = fixture();
        let marker = unique_marker();
        let script = escaping_script(&marker, &format!("echo waiting; sleep 1000.{marker}3"));
        let call = fx.call(&json!({ "command": script, "timeout_ms": 4000 }));
        let cancel = CancellationToken::new();
        let future = fx.registry.execute(&call, &fx.env, &cancel);
        tokio::pin!(future);

        until_escapees_run(&mut future, fx.path(), &marker).await;
        let res = within_patience(future).await;

        assert_eq!(res.error_type, Some(ErrorType::Timeout), "{res:?}");
        assert_eq!(res.metadata["timeout_ms"], 4000);
        assert_tree_gone(&marker).await;
    })
}

#[test]
fn escaped_processes_die_on_cancel() {
    on_the_shared_runtime(async {
        let fx = fixture();
        let marker = unique_marker();
        let script = escaping_script(&marker, &format!("sleep 1000.{marker}3"));
        let call = fx.call(&json!({ "command": script }));
        let cancel = CancellationToken::new();
        let future = fx.registry.execute(&call, &fx.env, &cancel);
        tokio::pin!(future);

        until_escapees_run(&mut future, fx.path(), &marker).await;
        cancel.cancel();
        let res = within_patience(future).await;

        assert_eq!(res.error_type, Some(ErrorType::Canceled), "{res:?}");
        assert_tree_gone(&marker).await;
    })
}

#[test]
fn dropping_the_call_kills_the_tree() {
    on_the_shared_runtime(async {
        let fx = fixture();
        let marker = unique_marker();
        let script = escaping_script(&marker, &format!("sleep 1000.{marker}3"));
        let call = fx.call(&json!({ "command": script }));
        let cancel = CancellationToken::new();
        let future = Box::pin(fx.registry.execute(&call, &fx.env, &cancel));
        let mut future = future;

        let pids = until_escapees_run(&mut future.as_mut(), fx.path(), &marker).await;
        drop(future);

        assert_tree_gone(&marker).await;
        for pid in pids {
            assert!(cmdline(pid).is_none_or(|line| !line.contains(&marker)));
        }
    })
}

/// Starts a supervisor by hand, as the daemon does, running [`escaping_script`] with
/// `then`; returns it with the daemon's end of the control socket once the escaping
/// processes run.
async fn supervise_by_hand(
    dir: &Path,
    marker: &str,
    spawn: impl FnOnce(std::process::Command) -> std::process::Child,
) -> (std::process::Child, tokio::io::Lines<BufReader<tokio::net::UnixStream>>) {
    let (daemon_end, supervisor_end) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut command = std::process::Command::new(TOOLGATE);
    command
        .arg(SUPERVISE_ARG)
        .arg("--cwd")
        .arg(dir)
        .arg("--")
        .args(["/bin/sh", "-c", &escaping_script(marker, &format!("sleep 1000.{marker}3"))])
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(supervisor_end)))
        .stdout(std::process::Stdio::null());
    let supervisor = spawn(command);
    daemon_end.set_nonblocking(true).unwrap();
    let daemon_end = tokio::net::UnixStream::from_std(daemon_end).unwrap();
    let mut reports = BufReader::new(daemon_end).lines();
    let first = next_report(&mut reports).await.unwrap();
    assert!(first.starts_with("spawned "), "{first}");
    let start = Instant::now();
    while processes_with(&format!("sleep 1000.{marker}")).len() < 3 {
        assert!(start.elapsed() < PATIENCE, "the escaping processes never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (supervisor, reports)
}

/// A supervisor told that its command's Landlock ruleset comes over the control socket
/// (`--sandbox-ruleset`) starts nothing until it holds it: with the daemon's end closed
/// first, the command never runs. Handed the ruleset, the command runs inside it.
#[test]
fn a_supervisor_starts_its_command_only_inside_the_ruleset_handed_to_it() {
    on_the_shared_runtime(async {
        let dir = tempfile::tempdir().unwrap();
        let allowed = dir.path().join("allowed");
        std::fs::create_dir(&allowed).unwrap();
        let script =
            format!("touch {}/written; touch {}/written", allowed.display(), dir.path().display());
        let start = || {
            let (daemon_end, supervisor_end) = std::os::unix::net::UnixStream::pair().unwrap();
            let supervisor = std::process::Command::new(TOOLGATE)
                .arg(SUPERVISE_ARG)
                .arg("--cwd")
                .arg(dir.path())
                .args(["--sandbox", "the test's", "--sandbox-ruleset", "--", "/bin/sh", "-c"])
                .arg(&script)
                .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(supervisor_end)))
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            (daemon_end, supervisor)
        };

        let (daemon_end, mut supervisor) = start();
        drop(daemon_end);
        assert!(supervisor.wait().unwrap().success());
        assert!(!allowed.join("written").exists() && !dir.path().join("written").exists());

        let profile = writing_only_to(&allowed);
        if toolgate::sandbox::confine::landlock_abi() == 0 {
            eprintln!("skipped the half with a ruleset: this kernel has no Landlock");
            return;
        }
        let ruleset = toolgate::sandbox::confine::build_ruleset(&profile).unwrap().unwrap();
        let (daemon_end, mut supervisor) = start();
        process::hand_over_ruleset(&daemon_end, &ruleset).unwrap();
        daemon_end.set_nonblocking(true).unwrap();
        let mut reports =
            BufReader::new(tokio::net::UnixStream::from_std(daemon_end).unwrap()).lines();
        assert_eq!(next_report(&mut reports).await.as_deref(), Some("sandbox the test's"));
        assert!(next_report(&mut reports).await.unwrap().starts_with("spawned "));
        assert_eq!(next_report(&mut reports).await.as_deref(), Some("exit code 1"));
        assert_eq!(next_report(&mut reports).await.as_deref(), Some("done"));
        assert!(supervisor.wait().unwrap().success());
        assert!(allowed.join("written").exists(), "the allowed write failed");
        assert!(!dir.path().join("written").exists(), "a write outside the ruleset succeeded");
    })
}

/// What happens when the daemon dies, even by SIGKILL: the kernel closes its end of
/// the control socket, and the supervisor kills the tree.
#[test]
fn closing_the_control_socket_kills_the_tree() {
    on_the_shared_runtime(async {
        let dir = tempfile::tempdir().unwrap();
        let marker = unique_marker();
        let (mut supervisor, reports) =
            supervise_by_hand(dir.path(), &marker, |mut command| command.spawn().unwrap()).await;

        drop(reports);

        assert_tree_gone(&marker).await;
        assert!(supervisor.wait().unwrap().success());
    })
}

#[test]
fn a_terminated_supervisor_kills_the_tree_and_reports() {
    on_the_shared_runtime(async {
        let dir = tempfile::tempdir().unwrap();
        let marker = unique_marker();
        let (mut supervisor, mut reports) =
            supervise_by_hand(dir.path(), &marker, |mut command| command.spawn().unwrap()).await;

        let pid = nix::unistd::Pid::from_raw(i32::try_from(supervisor.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();

        assert_eq!(next_report(&mut reports).await.as_deref(), Some("exit signal 9"));
        assert_eq!(next_report(&mut reports).await.as_deref(), Some("done"));
        assert!(supervisor.wait().unwrap().success());
        // Reported done, and reaped: nothing of the tree is left, not even the supervisor.
        assert_eq!(processes_with(&marker), vec![]);
    })
}

/// The death signal fires when the thread that started the supervisor ends, even
/// though the control socket is still open.
#[test]
fn the_supervisor_dies_with_its_parent() {
    on_the_shared_runtime(async {
        let dir = tempfile::tempdir().unwrap();
        let marker = unique_marker();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let mut parent = None;
        let (mut supervisor, mut reports) =
            supervise_by_hand(dir.path(), &marker, |mut command| {
                let (child_sender, child) = std::sync::mpsc::channel();
                parent = Some(std::thread::spawn(move || {
                    child_sender.send(command.spawn().unwrap()).unwrap();
                    // Live on until the supervisor is surely running (its death signal armed).
                    let _ = released.recv();
                }));
                child.recv().unwrap()
            })
            .await;

        drop(release);
        parent.unwrap().join().unwrap();

        assert_eq!(next_report(&mut reports).await.as_deref(), Some("exit signal 9"));
        assert_eq!(next_report(&mut reports).await.as_deref(), Some("done"));
        assert_tree_gone(&marker).await;
        assert!(supervisor.wait().unwrap().success());
    })
}

async fn next_report(
    reports: &mut tokio::io::Lines<BufReader<tokio::net::UnixStream>>,
) -> Option<String> {
    tokio::time::timeout(PATIENCE, reports.next_line()).await.expect("a report in time").unwrap()
}

#[test]
fn the_tool_reports_its_own_timeout_with_the_partial_output() {
    on_the_shared_runtime(async {
        // Driven without the Registry, so the tool's own deadline is the only one.
        let fx = fixture();
        let marker = unique_marker();
        let command = format!("echo before; echo complaint >&2; sleep 1000.{marker}");
        let ctx = ToolContext {
            call_id: "t".into(),
            env: fx.env.clone(),
            cancel: CancellationToken::new(),
            timeout: Duration::from_millis(3000),
            output: OutputSink::discard(),
        };
        let res = run_command::tool().execute(json!({ "command": command }), ctx).await;

        assert_eq!(res.error_type, Some(ErrorType::Timeout), "{res:?}");
        assert_eq!(res.content, "before\n[stderr]\ncomplaint\n[timed out after 3s]");
        assert_eq!(res.metadata["timeout_ms"], 3000);
        assert_eq!(res.metadata["signal"], 9);
        assert_tree_gone(&marker).await;
    })
}

#[test]
fn long_output_keeps_its_head_and_tail() {
    on_the_shared_runtime(async {
        let cap = 64 * 1024;
        let fx = fixture_with(|env| env.max_output_bytes = cap);
        let expected: String = (1..=700_000).map(|n| format!("{n}\n")).collect();
        assert!(expected.len() > 4_000_000);

        let res = fx.run(json!({ "command": "seq 1 700000" })).await;

        assert!(res.ok, "{}", res.error.unwrap_or_default());
        assert_eq!(res.metadata["stdout_bytes"], expected.len());
        assert_eq!(res.metadata["stderr_bytes"], 0);
        assert_eq!(res.metadata["truncated"], true);
        let omitted = expected.len() - cap;
        assert_eq!(res.metadata["omitted_bytes"], omitted);

        let marker = format!("... [{omitted} bytes omitted] ...\n");
        let (head, rest) = res.content.split_once(&marker).expect("an omission marker");
        let tail = rest.strip_suffix("[exit code 0]").expect("the exit code last");
        // The marker sits on its own line: a newline may have been added after the head.
        let head = if expected.starts_with(head) { head } else { head.strip_suffix('\n').unwrap() };
        assert!(expected.starts_with(head));
        assert!(expected.ends_with(tail));
        assert!(head.starts_with("1\n2\n3\n"));
        assert!(tail.ends_with("699999\n700000\n"));
        assert_eq!(head.len() + omitted + tail.len(), expected.len());
    })
}

#[test]
fn a_non_zero_exit_is_command_failed_with_the_output() {
    on_the_shared_runtime(async {
        let fx = fixture();
        let res = fx.run(json!({ "command": "echo out; echo err >&2; exit 3" })).await;

        assert!(!res.ok);
        assert_eq!(res.error_type, Some(ErrorType::CommandFailed));
        assert_eq!(res.error.as_deref(), Some("the command exited with code 3"));
        assert_eq!(res.content, "out\n[stderr]\nerr\n[exit code 3]");
        assert_eq!(res.metadata["exit_code"], 3);
        assert_eq!(res.metadata["stdout_bytes"], 4);
        assert_eq!(res.metadata["stderr_bytes"], 4);
        assert_eq!(res.metadata["truncated"], false);
        assert!(res.metadata["duration_ms"].is_u64());
        assert_eq!(res.tool, "run_command");
    })
}

#[test]
fn death_by_signal_is_command_failed_with_the_signal() {
    on_the_shared_runtime(async {
        let fx = fixture();
        let res = fx.run(json!({ "command": "echo dying; kill -TERM $$" })).await;

        assert_eq!(res.error_type, Some(ErrorType::CommandFailed), "{res:?}");
        assert_eq!(res.metadata["signal"], 15);
        assert_eq!(res.content, "dying\n[killed by signal 15 (SIGTERM)]");
    })
}

const ENV_PROBE: &str = "TOOLGATE_TEST_ENV_PROBE";

/// Needs variables in the daemon's own environment, which a test cannot set safely
/// while other threads run: so it re-runs itself in a child test process that gets
/// them from the start, and checks what that process's command saw.
#[test]
fn secret_variables_are_not_inherited() {
    on_the_shared_runtime(async {
        if std::env::var_os(ENV_PROBE).is_some() {
            let fx = fixture_with(|env| {
                env.env_policy
                    .set
                    .push(("TOOLGATE_TEST_EXPLICIT".to_owned(), "set-value".to_owned()));
            });
            let res = fx.run(json!({ "command": "env" })).await;
            println!("PROBE-RESULT {}", serde_json::to_string(&res).unwrap());
            return;
        }
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "secret_variables_are_not_inherited", "--nocapture"])
            .env(ENV_PROBE, "1")
            .env("TOOLGATE_TEST_API_TOKEN", "hunter2-token")
            .env("TOOLGATE_TEST_CLIENT_SECRET", "hunter2-secret")
            .env("TOOLGATE_TEST_SIGNING_KEY", "hunter2-key")
            .env("TOOLGATE_TEST_DB_PASSWORD", "hunter2-password")
            .env("TOOLGATE_TEST_ORDINARY", "plain-value")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line =
            stdout.lines().find_map(|line| line.strip_prefix("PROBE-RESULT ")).unwrap_or_else(
                || panic!("no probe result: {stdout}\n{}", String::from_utf8_lossy(&output.stderr)),
            );
        let res: ToolResult = serde_json::from_str(line).unwrap();

        assert!(res.ok, "{res:?}");
        let vars: Vec<&str> = res.content.lines().collect();
        assert!(vars.contains(&"TOOLGATE_TEST_ORDINARY=plain-value"), "{vars:?}");
        assert!(vars.contains(&"TOOLGATE_TEST_EXPLICIT=set-value"), "{vars:?}");
        assert!(!res.content.contains("hunter2"), "a secret leaked: {vars:?}");
    })
}

#[test]
fn stdin_is_closed() {
    on_the_shared_runtime(async {
        let fx = fixture();
        let res = fx.run(json!({ "command": "cat; readlink /proc/$$/fd/0" })).await;
        assert_eq!(res.content, "/dev/null\n[exit code 0]", "{res:?}");
    })
}

#[test]
fn cwd_is_confined_to_the_roots() {
    on_the_shared_runtime(async {
        let fx = fixture();
        std::fs::create_dir(fx.path().join("sub")).unwrap();
        let outside = tempfile::tempdir().unwrap();

        let res = fx.run(json!({ "command": "pwd", "cwd": "sub" })).await;
        assert_eq!(res.content, format!("{}\n[exit code 0]", fx.path().join("sub").display()));
        let res = fx.run(json!({ "command": "pwd" })).await;
        assert_eq!(res.content, format!("{}\n[exit code 0]", fx.path().display()));

        std::os::unix::fs::symlink(outside.path(), fx.path().join("escape")).unwrap();
        for cwd in [outside.path().to_str().unwrap(), "..", "sub/../..", "escape", "/"] {
            let res = fx.run(json!({ "command": "touch escaped", "cwd": cwd })).await;
            assert_eq!(res.error_type, Some(ErrorType::AccessDenied), "{cwd}: {res:?}");
        }
        assert!(!outside.path().join("escaped").exists());
        let res = fx.run(json!({ "command": "pwd", "cwd": "missing" })).await;
        assert_eq!(res.error_type, Some(ErrorType::NotFound));
        std::fs::write(fx.path().join("file"), "").unwrap();
        let res = fx.run(json!({ "command": "pwd", "cwd": "file" })).await;
        assert_eq!(res.error_type, Some(ErrorType::InvalidArguments));
        drop(fx.dir);
    })
}

#[test]
fn live_output_reaches_the_sink_in_order() {
    on_the_shared_runtime(async {
        let fx = fixture();
        let chunks: Arc<Mutex<Vec<(OutputStream, String)>>> = Arc::default();
        let sink = {
            let chunks = chunks.clone();
            OutputSink::new(move |stream, text| {
                chunks.lock().unwrap().push((stream, text.to_owned()))
            })
        };
        // Two-byte characters after one ASCII byte: pipe reads cut inside characters.
        let command = "i=1; while [ $i -le 3000 ]; do echo \"line $i\"; i=$((i+1)); done; \
                   printf x; printf 'é%.0s' $(seq 1 40000); echo; echo problem >&2";
        let call = fx.call(&json!({ "command": command }));
        let res =
            fx.registry.execute_streaming(&call, &fx.env, &CancellationToken::new(), sink).await;
        assert!(res.ok, "{res:?}");

        let mut expected: String = (1..=3000).map(|i| format!("line {i}\n")).collect();
        expected.push('x');
        expected.push_str(&"é".repeat(40_000));
        expected.push('\n');
        let chunks = chunks.lock().unwrap();
        let stdout: String = chunks
            .iter()
            .filter(|(stream, _)| *stream == OutputStream::Stdout)
            .map(|c| c.1.as_str())
            .collect();
        let stderr: String = chunks
            .iter()
            .filter(|(stream, _)| *stream == OutputStream::Stderr)
            .map(|c| c.1.as_str())
            .collect();
        assert!(stdout == expected, "the live stdout differs from what the command wrote");
        assert_eq!(stderr, "problem\n");
        assert!(chunks.iter().all(|(_, text)| !text.is_empty()));
        assert!(res.content.starts_with("line 1\nline 2\n"));
    })
}

#[test]
fn arguments_are_validated_before_anything_runs() {
    on_the_shared_runtime(async {
        let fx = fixture();
        let res = fx.run(json!({ "command": "touch ran", "shell": "bash" })).await;
        assert_eq!(res.error_type, Some(ErrorType::InvalidArguments));
        let res = fx.run(json!({ "command": "" })).await;
        assert_eq!(res.error_type, Some(ErrorType::InvalidArguments));
        assert!(!fx.path().join("ran").exists());
    })
}

// The process API on its own.

fn spec(program: Program, dir: &Path) -> Spec {
    let mut spec = Spec::new(program, dir);
    spec.supervisor = Supervisor::new(TOOLGATE);
    spec.env = vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())];
    spec
}

/// A sandbox that may read everything and write only beneath `dir`.
fn writing_only_to(dir: &Path) -> toolgate::sandbox::Profile {
    toolgate::sandbox::Profile {
        read: vec!["/".into()],
        write: vec![dir.to_owned()],
        network: true,
        ..Default::default()
    }
}

fn exec(program: &str, args: &[&str]) -> Program {
    Program::Exec { program: program.into(), args: args.iter().map(Into::into).collect() }
}

#[test]
fn stdin_bytes_reach_the_command() {
    on_the_shared_runtime(async {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = spec(exec("cat", &[]), dir.path());
        let payload: Vec<u8> = (0..200_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        spec.stdin = Stdin::Bytes(payload.clone());

        let outcome = process::run(spec).await.unwrap();

        assert_eq!(outcome.status, Some(ExitStatus::Code(0)));
        assert_eq!(outcome.stdout.text.as_bytes(), payload.as_slice());
        assert_eq!(outcome.stdout.total_bytes, 200_000);
        assert!(!outcome.timed_out && !outcome.canceled && !outcome.truncated());
    })
}

#[test]
fn the_environment_is_exactly_the_one_given() {
    on_the_shared_runtime(async {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = spec(exec("/usr/bin/env", &[]), dir.path());
        spec.env = vec![("ONLY".to_owned(), "this".to_owned())];
        let outcome = process::run(spec).await.unwrap();
        assert_eq!(outcome.stdout.text, "ONLY=this\n");
    })
}

#[test]
fn a_timeout_kills_the_tree_and_keeps_the_partial_output() {
    on_the_shared_runtime(async {
        let dir = tempfile::tempdir().unwrap();
        let marker = unique_marker();
        let mut spec = spec(
            Program::Shell(format!("echo before; sleep 1000.{marker} & sleep 1000.{marker}")),
            dir.path(),
        );
        spec.timeout = Some(Duration::from_secs(2));

        let outcome = process::run(spec).await.unwrap();

        assert!(outcome.timed_out);
        assert!(!outcome.canceled);
        // The whole tree gets SIGKILL; the shell either dies of it or, when its child
        // went first, reports the child's death as 128 + 9 before dying itself.
        assert!(
            matches!(outcome.status, Some(ExitStatus::Signal(9)) | Some(ExitStatus::Code(137))),
            "{:?}",
            outcome.status
        );
        assert_eq!(outcome.stdout.text, "before\n");
        assert_eq!(processes_with(&marker), vec![]);
    })
}

#[test]
fn a_missing_program_is_a_spawn_error() {
    on_the_shared_runtime(async {
        let dir = tempfile::tempdir().unwrap();
        let err =
            process::run(spec(exec("/nonexistent/program", &[]), dir.path())).await.unwrap_err();
        assert!(
            matches!(&err, ProcessError::Spawn { program, .. } if program == "/nonexistent/program"),
            "{err}"
        );

        let mut gone_cwd = spec(exec("true", &[]), &dir.path().join("gone"));
        gone_cwd.cwd = dir.path().join("gone");
        let err = process::run(gone_cwd).await.unwrap_err();
        assert!(matches!(err, ProcessError::Spawn { .. }), "{err}");
    })
}

#[test]
fn a_broken_supervisor_is_an_error_not_a_hang() {
    on_the_shared_runtime(async {
        let dir = tempfile::tempdir().unwrap();
        let mut missing = spec(exec("true", &[]), dir.path());
        missing.supervisor = Supervisor::new("/nonexistent/toolgate");
        let err = process::run(missing).await.unwrap_err();
        assert!(matches!(err, ProcessError::StartSupervisor { .. }), "{err}");

        // A binary that is not a supervisor never answers the handshake.
        let mut impostor = spec(exec("true", &[]), dir.path());
        impostor.supervisor = Supervisor::new("/bin/true");
        let err = process::run(impostor).await.unwrap_err();
        assert!(matches!(err, ProcessError::Handshake { .. }), "{err}");
    })
}

#[test]
fn a_call_canceled_before_it_starts_runs_nothing() {
    on_the_shared_runtime(async {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec(Program::Shell("touch ran".to_owned()), dir.path());
        spec.cancel.cancel();
        let outcome = process::run(spec).await.unwrap();
        assert!(outcome.canceled);
        assert_eq!(outcome.status, None);
        assert!(!dir.path().join("ran").exists());
    })
}

#[test]
fn supervisors_are_forked_children_of_the_caller() {
    on_the_shared_runtime(async {
        // The supervisor is forked by the long-lived spawner (its command line is the
        // spawner's), yet it is the caller's own child, as a re-executed one would be, and
        // it is in the call's cgroup from its first instruction on.
        let dir = tempfile::tempdir().unwrap();
        let show = "tr '\\0' ' ' < /proc/$PPID/cmdline; echo; cut -d' ' -f4 /proc/$PPID/stat; \
                grep '^0::' /proc/$PPID/cgroup";
        for _ in 0..3 {
            let outcome =
                process::run(spec(Program::Shell(show.to_owned()), dir.path())).await.unwrap();
            assert_eq!(outcome.status, Some(ExitStatus::Code(0)), "{:?}", outcome.stderr.text);
            let mut lines = outcome.stdout.text.lines();
            let cmdline = lines.next().unwrap_or_default();
            assert!(cmdline.contains("__spawner"), "not forked by the spawner: {cmdline:?}");
            assert_eq!(lines.next(), Some(std::process::id().to_string().as_str()));
            let cgroup = lines.next().unwrap_or_default();
            match outcome.containment {
                toolgate::sandbox::Containment::Cgroup => {
                    let call = format!("/toolgate/{}-", std::process::id());
                    assert!(
                        cgroup.contains(&call),
                        "the supervisor is not in the call's cgroup: {cgroup:?}"
                    );
                }
                toolgate::sandbox::Containment::Supervisor => {
                    eprintln!("skipped the cgroup check: no per-call cgroups here");
                }
            }
        }
    })
}

#[test]
fn a_call_is_answered_once_its_tree_is_gone_and_its_supervisor_and_cgroup_follow() {
    on_the_shared_runtime(async {
        // The answer leaves when the supervisor reports the tree gone (it has let go of
        // the output pipes by then, so all the output is in); reaping the supervisor and
        // removing the call's cgroup come after, and leave nothing behind.
        let dir = tempfile::tempdir().unwrap();
        let show = "echo $PPID; grep '^0::' /proc/$PPID/cgroup | cut -d: -f3-; printf last";
        for _ in 0..3 {
            let outcome =
                process::run(spec(Program::Shell(show.to_owned()), dir.path())).await.unwrap();
            assert_eq!(outcome.status, Some(ExitStatus::Code(0)), "{:?}", outcome.stderr.text);
            let mut lines = outcome.stdout.text.lines();
            let supervisor: u32 = lines.next().and_then(|pid| pid.parse().ok()).unwrap();
            let cgroup = lines.next().unwrap_or_default().to_owned();
            assert_eq!(lines.next(), Some("last"), "{:?}", outcome.stdout.text);
            let cgroup = match outcome.containment {
                toolgate::sandbox::Containment::Cgroup => Some(cgroup_dir(&cgroup)),
                toolgate::sandbox::Containment::Supervisor => {
                    eprintln!("skipped the cgroup check: no per-call cgroups here");
                    None
                }
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                // Our child until it is reaped: its `/proc` entry goes with the reaping.
                let reaped = !Path::new(&format!("/proc/{supervisor}")).exists();
                // Removed, or kept empty for a later call.
                let emptied = cgroup.as_ref().is_none_or(|cgroup| {
                    std::fs::read_to_string(cgroup.join("cgroup.procs"))
                        .map_or(true, |procs| procs.trim().is_empty())
                });
                if reaped && emptied {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "left behind: supervisor {supervisor} reaped {reaped}, cgroup {cgroup:?} emptied \
                 {emptied}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    })
}

/// The directory of a call's cgroup, from its path as `/proc/PID/cgroup` gives it.
fn cgroup_dir(path: &str) -> std::path::PathBuf {
    let name = Path::new(path).file_name().unwrap();
    toolgate::sandbox::CallCgroups::get().unwrap().parent().join(name)
}

/// Waits (within [`PATIENCE`]) until nothing is at `path`.
async fn until_removed(path: &Path) {
    let deadline = Instant::now() + PATIENCE;
    while path.exists() {
        assert!(Instant::now() < deadline, "{path:?} was not removed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A call's cgroup goes to a later call only as good as new: one that was given a
/// limit is removed when its call ends.
#[test]
fn a_calls_cgroup_goes_to_a_later_call_only_as_good_as_new() {
    on_the_shared_runtime(async {
        let dir = tempfile::tempdir().unwrap();
        let show = "grep '^0::' /proc/$PPID/cgroup | cut -d: -f3-; grep -c . /proc/$PPID/cgroup";
        let call = |max_processes: u64| {
            let dir = dir.path().to_owned();
            async move {
                let mut spec = spec(Program::Shell(show.to_owned()), &dir);
                spec.limits.max_processes = max_processes;
                let outcome = process::run(spec).await.unwrap();
                assert_eq!(outcome.status, Some(ExitStatus::Code(0)), "{:?}", outcome.stderr.text);
                let cgroup = outcome.stdout.text.lines().next().unwrap_or_default().to_owned();
                (cgroup, outcome.containment)
            }
        };
        let (first, containment) = call(0).await;
        if containment != toolgate::sandbox::Containment::Cgroup {
            eprintln!("skipped: no per-call cgroups here");
            return;
        }
        // Its processes gone, a call's cgroup is handed on (the clean-up follows the
        // answer, so a call or two may get one made meanwhile first).
        let mut seen = vec![first];
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (cgroup, _) = call(0).await;
            if seen.contains(&cgroup) {
                break;
            }
            assert!(Instant::now() < deadline, "no cgroup was handed on: {seen:?}");
            seen.push(cgroup);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // One given a process limit is removed.
        let (limited, _) = call(100).await;
        until_removed(&cgroup_dir(&limited)).await;
        for _ in 0..3 {
            assert_ne!(call(0).await.0, limited);
        }
        // Calls whose trees were killed go on being followed by calls that run: one
        // timed out (its supervisor kills the tree), one whose command never started
        // (the daemon kills the cgroup: on some kernels a cgroup once killed kills what is
        // born in it later, so that one is never handed on).
        let mut timed = spec(Program::Shell(format!("{show}; sleep 30")), dir.path());
        timed.timeout = Some(Duration::from_millis(300));
        let outcome = process::run(timed).await.unwrap();
        assert!(outcome.timed_out, "{:?}", outcome.stdout.text);
        for _ in 0..3 {
            call(0).await;
        }
        let missing = spec(exec("/nonexistent/program", &[]), dir.path());
        assert!(matches!(process::run(missing).await, Err(ProcessError::Spawn { .. })));
        for _ in 0..3 {
            call(0).await;
        }
        process::release_spares();
    })
}

/// Children of this process forked by the spawner and waiting as supervisors (their
/// command line is the spawner's; unlike the spawner, they block the signals a
/// supervisor reads from its signalfd: SIGTERM and SIGCHLD).
fn waiting_supervisors() -> Vec<u32> {
    let ours = std::process::id().to_string();
    let blocks_supervisor_signals = |status: &str| {
        let mask = status
            .lines()
            .find_map(|line| line.strip_prefix("SigBlk:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .unwrap_or(0);
        mask & (1 << (15 - 1)) != 0 && mask & (1 << (17 - 1)) != 0
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            status.lines().any(|line| line.split_whitespace().eq(["PPid:", ours.as_str()]))
                && String::from_utf8_lossy(&cmdline).contains("__spawner")
                && blocks_supervisor_signals(&status)
        })
        .collect()
}

/// The one supervisor waiting ahead of the next call, but for those named (the calls'
/// own, perhaps not yet reaped), and its cgroup v2 path; waits for it to appear.
async fn one_waiting_supervisor(not: &[u32]) -> (u32, String) {
    let deadline = Instant::now() + PATIENCE;
    let pid = loop {
        match waiting_supervisors().into_iter().filter(|pid| !not.contains(pid)).collect::<Vec<_>>()
            [..]
        {
            [pid] => break pid,
            [] if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(10)).await,
            ref other => panic!("no single supervisor started ahead of the next call: {other:?}"),
        }
    };
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    (pid, cgroup.lines().find_map(|line| line.strip_prefix("0::")).unwrap().to_owned())
}

#[test]
fn the_next_call_takes_a_supervisor_started_ahead_in_its_own_cgroup() {
    on_the_shared_runtime(async {
        // Once a command runs, the spawner forks the next call's supervisor into a cgroup
        // of its own, where it sets itself up and waits. The next call is handed that very
        // process and cgroup; letting the spares go ends it and removes its cgroup.
        let dir = tempfile::tempdir().unwrap();
        let show = "echo $PPID; grep '^0::' /proc/$PPID/cgroup | cut -d: -f3-";
        let supervisor_and_cgroup = || async {
            let outcome =
                process::run(spec(Program::Shell(show.to_owned()), dir.path())).await.unwrap();
            assert_eq!(outcome.status, Some(ExitStatus::Code(0)), "{:?}", outcome.stderr.text);
            let mut lines = outcome.stdout.text.lines();
            let supervisor: u32 = lines.next().and_then(|pid| pid.parse().ok()).unwrap();
            let cgroup = lines.next().unwrap_or_default().to_owned();
            let contained = outcome.containment == toolgate::sandbox::Containment::Cgroup;
            (supervisor, contained.then_some(cgroup))
        };

        let (first, _) = supervisor_and_cgroup().await;
        let (ready, ready_cgroup) = one_waiting_supervisor(&[first]).await;

        let (second, cgroup) = supervisor_and_cgroup().await;
        assert_eq!(second, ready, "the next call did not take the supervisor started ahead");
        match cgroup {
            Some(cgroup) => {
                assert!(cgroup.contains("/toolgate/"), "not in a call's cgroup: {cgroup:?}");
                assert_eq!(cgroup, ready_cgroup, "the call's cgroup is not the one it was born in");
            }
            None => eprintln!("skipped the cgroup check: no per-call cgroups here"),
        }

        // The second call had the next one started behind it; letting it go ends it.
        let (next, next_cgroup) = one_waiting_supervisor(&[first, second]).await;
        process::release_spares();
        let deadline = Instant::now() + PATIENCE;
        loop {
            // Our child until it is reaped: its `/proc` entry goes with the reaping.
            let reaped = !Path::new(&format!("/proc/{next}")).exists();
            let removed = !next_cgroup.contains("/toolgate/")
                || !Path::new("/sys/fs/cgroup").join(next_cgroup.trim_start_matches('/')).exists();
            if reaped && removed {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "left behind: supervisor {next} reaped {reaped}, cgroup {next_cgroup:?} removed {removed}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

#[test]
fn the_command_starts_with_no_signal_blocked_or_ignored() {
    on_the_shared_runtime(async {
        // The supervisor blocks the signals it waits for; none of that reaches the command.
        let dir = tempfile::tempdir().unwrap();
        // No shell: a shell may clear its mask itself.
        let show = ["-E", "^Sig(Blk|Ign):", "/proc/self/status"];
        let outcome = process::run(spec(exec("grep", &show), dir.path())).await.unwrap();
        assert_eq!(outcome.status, Some(ExitStatus::Code(0)), "{:?}", outcome.stderr.text);
        let mask = |name: &str| {
            let line = outcome.stdout.text.lines().find(|line| line.starts_with(name)).unwrap();
            u64::from_str_radix(line[name.len()..].trim(), 16).unwrap()
        };
        assert_eq!(mask("SigBlk:"), 0);
        // Signals 1 to 31 (glibc's own real-time signals above them are its business).
        assert_eq!(mask("SigIgn:") & 0x7fff_ffff, 0);
    })
}

/// A sandboxed call's private temporary directory was made ahead of it: the call that
/// takes the spare (or makes its own) has the next one made once its supervisor is on
/// its way, and the next call is handed exactly that one, empty.
#[test]
fn a_sandboxed_call_has_the_next_calls_temporary_directory_made_behind_it() {
    on_the_shared_runtime(async {
        let dir = tempfile::tempdir().unwrap();
        let profile = writing_only_to(dir.path());
        let temp_dir_of_a_call = || async {
            let mut spec = spec(exec("/bin/sh", &["-c", "printf %s \"$TMPDIR\""]), dir.path());
            spec.sandbox = Some(profile.clone());
            let outcome = process::run(spec).await.unwrap();
            assert_eq!(outcome.status, Some(ExitStatus::Code(0)), "{}", outcome.stderr.text);
            std::path::PathBuf::from(outcome.stdout.text)
        };
        // Every call's directory is named for this process.
        let ours = format!("toolgate-call-{}-", std::process::id());
        let spares = |taken: &[&Path]| -> Vec<std::path::PathBuf> {
            std::fs::read_dir(std::env::temp_dir())
                .unwrap()
                .flatten()
                .map(|entry| entry.path())
                .filter(|path| {
                    path.file_name().is_some_and(|name| name.to_string_lossy().starts_with(&ours))
                        && !taken.contains(&path.as_path())
                })
                .collect()
        };

        let first = temp_dir_of_a_call().await;
        assert!(first.file_name().unwrap().to_string_lossy().starts_with(&ours), "{first:?}");
        let deadline = Instant::now() + PATIENCE;
        let spare = loop {
            match spares(&[&first]).as_slice() {
                [spare] => break spare.clone(),
                [] if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                other => panic!("no single spare made behind the call: {other:?}"),
            }
        };
        assert!(std::fs::read_dir(&spare).unwrap().next().is_none());
        // Handed the spare, or the first call's own where that was given back already.
        let second = temp_dir_of_a_call().await;
        assert!(
            second == spare || second == first,
            "the next call was not handed a spare: {second:?}"
        );
        process::release_spares();
    })
}

/// A call's private temporary directory is handed to a later call only as it was
/// made: empty, private, the same directory. One a command left something in, or
/// opened to others, is removed; and every call finds its own empty.
#[test]
fn a_temporary_directory_goes_to_a_later_call_only_as_it_was_made() {
    on_the_shared_runtime(async {
        let dir = tempfile::tempdir().unwrap();
        let profile = writing_only_to(dir.path());
        // Prints its TMPDIR, then anything in it, then runs `then`.
        let call = |then: &'static str| {
            let profile = profile.clone();
            let dir = dir.path().to_owned();
            async move {
                let script = format!("printf '%s\\n' \"$TMPDIR\"; ls -A \"$TMPDIR\"; {then}");
                let mut spec = spec(exec("/bin/sh", &["-c", &script]), &dir);
                spec.sandbox = Some(profile);
                let outcome = process::run(spec).await.unwrap();
                assert_eq!(outcome.status, Some(ExitStatus::Code(0)), "{}", outcome.stderr.text);
                let mut lines = outcome.stdout.text.lines().map(str::to_owned);
                let temp = std::path::PathBuf::from(lines.next().unwrap());
                let found: Vec<String> = lines.collect();
                assert!(found.is_empty(), "{temp:?} was not empty: {found:?}");
                (temp, outcome.containment)
            }
        };
        let (first, containment) = call("").await;
        if containment != toolgate::sandbox::Containment::Cgroup {
            eprintln!("skipped: no cgroup for calls here, so no directory is handed on");
            process::release_spares();
            return;
        }
        // Left empty: handed to a later call (the clean-up follows the answer, so a call
        // or two may get a spare made meanwhile first).
        let mut seen = vec![first];
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (temp, _) = call("").await;
            if seen.contains(&temp) {
                break;
            }
            assert!(Instant::now() < deadline, "no directory was handed on: {seen:?}");
            seen.push(temp);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Something left in it, or opened to others: removed, never handed on.
        for then in ["touch \"$TMPDIR/.left\"", "chmod 755 \"$TMPDIR\""] {
            let (used, _) = call(then).await;
            until_removed(&used).await;
            for _ in 0..3 {
                assert_ne!(call("").await.0, used, "{then}");
            }
        }
        process::release_spares();
    })
}
