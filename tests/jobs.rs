//! Background processes end to end: the real `toolgate serve` binary on a temporary
//! socket, driven as a client would (NDJSON): run_command's `background`, `yield_ms`,
//! `tty` and `stdin`, the process_* tools, detached sessions and their resume tokens,
//! the limits, and the whole tree dying on kill, TTL expiry and shutdown.
//!
//! Processes are found in `/proc` by a marker on their command line; waits are bounded
//! polls (a safety net, never a measurement) or `process_read`'s own `wait_ms`.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Client, PATIENCE, TestDaemon, alive, processes_with};

/// What these tests ask of a client besides the common requests.
trait Processes {
    /// Starts a background process; returns its id.
    fn start(&mut self, arguments: Value) -> String;
    /// Reads the process's output from `offset` until `done` holds for all of it
    /// read so far (or it has ended); returns the text and the next offset.
    fn read_until(&mut self, id: &str, offset: u64, done: impl Fn(&str) -> bool) -> (String, u64);
    /// Waits (bounded) until the process has ended; returns process_read's metadata.
    fn wait_exit(&mut self, id: &str) -> Value;
}

impl Processes for Client {
    fn start(&mut self, arguments: Value) -> String {
        let result = self.call("run_command", arguments);
        assert_eq!(result["ok"], true, "{result}");
        result["metadata"]["process_id"].as_str().unwrap().to_owned()
    }

    fn read_until(&mut self, id: &str, offset: u64, done: impl Fn(&str) -> bool) -> (String, u64) {
        let deadline = Instant::now() + PATIENCE;
        let mut text = String::new();
        let mut offset = offset;
        loop {
            let read =
                self.call("process_read", json!({"id": id, "offset": offset, "wait_ms": 2000}));
            assert_eq!(read["ok"], true, "{read}");
            let meta = &read["metadata"];
            let content = read["content"].as_str().unwrap();
            let start = meta["text_start"].as_u64().unwrap() as usize;
            let len = meta["text_bytes"].as_u64().unwrap() as usize;
            text.push_str(&content[start..start + len]);
            offset = meta["next_offset"].as_u64().unwrap();
            if done(&text) {
                return (text, offset);
            }
            let ended = meta["running"] == false && offset >= meta["end_offset"].as_u64().unwrap();
            assert!(!ended, "the process ended without the expected output: {text:?}");
            assert!(Instant::now() < deadline, "no expected output in time: {text:?}");
        }
    }

    fn wait_exit(&mut self, id: &str) -> Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let read = self.call("process_read", json!({"id": id, "offset": -1, "wait_ms": 1000}));
            if read["metadata"]["running"] == false {
                return read["metadata"].clone();
            }
            assert!(Instant::now() < deadline, "the process did not end: {read}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A marker unique to one test, for finding its processes in /proc.
fn marker(test: u32) -> String {
    // Digits only: it becomes the fraction of a `sleep` argument.
    format!("{}{}{test}", 800 + std::process::id() % 97, std::process::id())
}

fn wait_started(needle: &str, count: usize) -> Vec<i32> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let found = processes_with(needle);
        if found.len() >= count {
            return found;
        }
        assert!(Instant::now() < deadline, "the processes never started: {found:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (bounded) until every pid is gone (or a zombie).
fn assert_gone(pids: &[i32]) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|&pid| alive(pid)).collect();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "processes outlived their end: {left:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

const BYPASS: &str = "[permissions]\nmode = \"bypass\"\n";

#[test]
fn a_python_repl_is_driven_through_a_terminal() {
    if !have("python3") {
        eprintln!("skipped: no python3 on this machine");
        return;
    }
    let daemon = TestDaemon::start(BYPASS);
    let mut client = daemon.connect();
    client.open();
    let id = client.start(json!({"command": "python3 -i -q", "tty": true, "background": true}));
    let (_, offset) = client.read_until(&id, 0, |text| text.contains(">>> "));
    let written = client.call("process_write", json!({"id": id, "input": "1+1\n"}));
    assert_eq!(written["ok"], true, "{written}");
    // The terminal echoes the input, then Python prints the value on a line of its own.
    let (text, offset) =
        client.read_until(&id, offset, |text| text.split("\r\n").skip(1).any(|line| line == "2"));
    assert!(text.starts_with("1+1\r\n"), "{text:?}");
    let resized = client.call("process_resize", json!({"id": id, "rows": 40, "cols": 120}));
    assert_eq!(resized["ok"], true, "{resized}");
    // One more line answered after the resize, so that the redraw its `SIGWINCH`
    // causes is over before the end-of-file comes: a Ctrl-D sent right after the
    // resize has, in rare runs, left Python waiting at its prompt.
    let written = client.call("process_write", json!({"id": id, "input": "2+2\n"}));
    assert_eq!(written["ok"], true, "{written}");
    client.read_until(&id, offset, |text| text.split("\r\n").any(|line| line == "4"));
    let ended = client.call("process_write", json!({"id": id, "input": "", "close_stdin": true}));
    assert_eq!(ended["ok"], true, "{ended}");
    assert_eq!(client.wait_exit(&id)["exit_code"], 0);
}

/// Ctrl-C on the terminal reaches the command (its foreground process group), while
/// the supervisor, in the same group, ignores it: the tree is not killed.
#[test]
fn ctrl_c_on_the_terminal_reaches_the_command_only() {
    let daemon = TestDaemon::start(BYPASS);
    let mut client = daemon.connect();
    client.open();
    let script =
        r#"trap 'echo caught' INT; echo ready; while :; do read line && echo "got $line"; done"#;
    let id = client.start(json!({"command": script, "tty": true, "background": true}));
    let (_, offset) = client.read_until(&id, 0, |text| text.contains("ready"));
    let interrupted = client.call("process_write", json!({"id": id, "input": "\u{3}"}));
    assert_eq!(interrupted["ok"], true, "{interrupted}");
    let (_, offset) = client.read_until(&id, offset, |text| text.contains("caught"));
    client.call("process_write", json!({"id": id, "input": "still here\n"}));
    client.read_until(&id, offset, |text| text.contains("got still here"));
    let killed = client.call("process_kill", json!({"id": id}));
    assert_eq!(killed["ok"], true, "{killed}");
}

#[test]
fn a_tty_command_past_its_deadline_is_killed_and_says_so() {
    let daemon = TestDaemon::start(BYPASS);
    let mut client = daemon.connect();
    client.open();
    let result = client.call(
        "run_command",
        json!({"command": "echo waiting; sleep 1000", "tty": true, "timeout_ms": 700}),
    );
    assert_eq!(result["ok"], false, "{result}");
    assert_eq!(result["error_type"], "timeout", "{result}");
    let content = result["content"].as_str().unwrap();
    assert!(content.starts_with("waiting"), "{content}");
    assert!(content.ends_with("[timed out after 700ms]"), "{content}");
    let listed = client.call("process_list", json!({}));
    assert_eq!(listed["metadata"]["processes"], json!([]), "{listed}");
    // The same containment and kernel sandbox as any command.
    let plain = client.call("run_command", json!({"command": "true"}));
    for key in ["containment", "sandbox"] {
        assert_eq!(result["metadata"][key], plain["metadata"][key], "{key}: {result} {plain}");
        assert!(result["metadata"][key].is_string(), "{result}");
    }
}

#[test]
fn a_read_prompt_is_answered_with_process_write() {
    if !have("bash") {
        eprintln!("skipped: no bash on this machine");
        return;
    }
    let daemon = TestDaemon::start(BYPASS);
    let mut client = daemon.connect();
    client.open();
    let command = r#"bash -c 'read -p "name? " name; echo "hello, $name"'"#;
    let id = client.start(json!({"command": command, "tty": true, "yield_ms": 0}));
    let (_, offset) = client.read_until(&id, 0, |text| text.contains("name? "));
    let written = client.call("process_write", json!({"id": id, "input": "toolgate\n"}));
    assert_eq!(written["ok"], true, "{written}");
    let (text, _) = client.read_until(&id, offset, |text| text.contains("hello, toolgate"));
    assert!(text.contains("hello, toolgate"), "{text:?}");
    assert_eq!(client.wait_exit(&id)["exit_code"], 0);
}

#[test]
fn a_background_command_answers_at_once_and_a_waiting_read_gets_its_output() {
    let daemon = TestDaemon::start(BYPASS);
    let mut client = daemon.connect();
    client.open();
    client.result("events/subscribe", json!({"session_id": client.session.clone()}));
    let result =
        client.call("run_command", json!({"command": "sleep 2; echo done", "background": true}));
    assert_eq!(result["ok"], true, "{result}");
    // Answered while the command still runs: the handle, not the output.
    assert_eq!(result["metadata"]["running"], true, "{result}");
    let id = result["metadata"]["process_id"].as_str().unwrap().to_owned();
    let read = client.call("process_read", json!({"id": id, "wait_ms": 15000}));
    assert_eq!(read["ok"], true, "{read}");
    assert!(read["content"].as_str().unwrap().starts_with("done\n"), "{read}");
    let exit = client.wait_exit(&id);
    assert_eq!(exit["exit_code"], 0, "{exit}");
    let listed = client.call("process_list", json!({}));
    assert_eq!(listed["metadata"]["processes"][0]["id"], json!(id), "{listed}");
    assert_eq!(listed["metadata"]["processes"][0]["exit_code"], 0, "{listed}");
    // Its output and its end were events, carrying the process and the offset.
    let output =
        client.event(|event| event["type"] == "tool_output" && event["process_id"] == json!(id));
    assert_eq!((output["text"].as_str(), output["offset"].as_u64()), (Some("done\n"), Some(0)));
    let exited = client.event(|event| event["type"] == "process_exited");
    assert_eq!(exited["process_id"], json!(id), "{exited}");
    assert_eq!(exited["exit_code"], 0, "{exited}");
    assert!(exited["runtime_ms"].as_u64().unwrap() >= 2000, "{exited}");
}

#[test]
fn yield_ms_answers_with_the_output_so_far_and_the_command_goes_on() {
    let daemon = TestDaemon::start(BYPASS);
    let mut client = daemon.connect();
    client.open();
    let gate = daemon.workspace().join("gate");
    let command = "echo started; while [ ! -e gate ]; do sleep 0.02; done; echo finished";
    let result = client.call("run_command", json!({"command": command, "yield_ms": 300}));
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["metadata"]["running"], true, "{result}");
    let id = result["metadata"]["process_id"].as_str().unwrap().to_owned();
    let next = result["metadata"]["next_offset"].as_u64().unwrap();
    // The answer's first line is the handle, the rest the output so far.
    let content = result["content"].as_str().unwrap();
    let so_far = content.split_once('\n').unwrap().1.to_owned();
    assert_eq!(so_far.len() as u64, next, "{result}");
    std::fs::write(&gate, "").unwrap();
    let (text, _) = client.read_until(&id, next, |text| text.contains("finished"));
    // Reading on from the offset neither repeats nor loses anything.
    assert_eq!(so_far + &text, "started\nfinished\n");
    // stdin text without a process: read, then end-of-file.
    let fed = client.call("run_command", json!({"command": "cat", "stdin": "fed\n"}));
    assert_eq!(fed["content"], "fed\n[exit code 0]");
    // A short command with yield_ms answers as a plain run_command.
    let quick = client.call("run_command", json!({"command": "echo quick", "yield_ms": 10000}));
    assert_eq!(quick["ok"], true, "{quick}");
    assert_eq!(quick["content"], "quick\n[exit code 0]");
    assert!(quick["metadata"].get("process_id").is_none(), "{quick}");
}

#[test]
fn a_client_reattaches_within_the_ttl_and_replays_from_its_offset() {
    let daemon = TestDaemon::start(BYPASS);
    let mut first = daemon.connect();
    let info = first.open();
    let token = info["resume_token"].as_str().unwrap().to_owned();
    let session = info["session_id"].as_str().unwrap().to_owned();
    let command = "echo first; while [ ! -e go ]; do sleep 0.02; done; echo second; echo third";
    let id = first.start(json!({"command": command, "background": true}));
    let (_, offset) = first.read_until(&id, 0, |text| text.contains("first\n"));
    drop(first);

    // The output goes on while nobody is connected: once the daemon has let the first
    // connection go (and detached its session, whose command still waits), the
    // command goes on to its end.
    let mut stranger = daemon.connect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while stranger.result("daemon/status", json!({}))["connections"] != json!(1) {
        assert!(Instant::now() < deadline, "the first connection was never let go");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::write(daemon.workspace().join("go"), "").unwrap();
    let refused = stranger.request("session/open", json!({"resume_token": "0123456789abcdef"}));
    assert!(refused.get("error").is_some(), "{refused}");

    let mut second = daemon.connect();
    let resumed = second.result("session/open", json!({"resume_token": token}));
    assert_eq!(resumed["session_id"], json!(session));
    second.session = Some(session);
    let (text, _) = second.read_until(&id, offset, |text| text.contains("third\n"));
    assert_eq!(text, "second\nthird\n");
    assert_eq!(second.wait_exit(&id)["exit_code"], 0);
}

#[test]
fn a_detached_session_past_its_ttl_loses_its_process_tree() {
    let daemon = TestDaemon::start(&format!("{BYPASS}[limits]\ndetached_session_ttl_ms = 500\n"));
    let mark = marker(1);
    let mut client = daemon.connect();
    let info = client.open();
    let token = info["resume_token"].as_str().unwrap().to_owned();
    let command = format!("setsid sleep 1000.{mark} & sleep 1000.{mark} & wait");
    client.start(json!({"command": command, "background": true}));
    let pids = wait_started(&mark, 2);
    drop(client);
    assert_gone(&pids);
    // The session went with them.
    let mut late = daemon.connect();
    let refused = late.request("session/open", json!({"resume_token": token}));
    assert!(refused.get("error").is_some(), "{refused}");
}

#[test]
fn closing_the_session_kills_its_processes() {
    let daemon = TestDaemon::start(BYPASS);
    let mark = marker(4);
    let mut client = daemon.connect();
    let info = client.open();
    client.start(json!({"command": format!("setsid sleep 1000.{mark} & sleep 1000.{mark}"), "background": true}));
    let pids = wait_started(&mark, 2);
    let spools = daemon.dir.path().join("run/toolgate/processes");
    assert_eq!(std::fs::read_dir(&spools).unwrap().count(), 1, "the session's spool directory");
    let closed = client.result("session/close", json!({"session_id": info["session_id"]}));
    assert_eq!(closed["closed"], true, "{closed}");
    assert_gone(&pids);
    // Its spool goes with it.
    let deadline = Instant::now() + PATIENCE;
    while std::fs::read_dir(&spools).unwrap().count() > 0 {
        assert!(Instant::now() < deadline, "the spool outlived its session");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn process_kill_kills_the_whole_tree() {
    let daemon = TestDaemon::start(BYPASS);
    let mark = marker(2);
    let mut client = daemon.connect();
    client.open();
    let command = format!("setsid sleep 1000.{mark} & (sleep 1000.{mark} &) ; sleep 1000.{mark}");
    let id = client.start(json!({"command": command, "background": true}));
    let pids = wait_started(&mark, 3);
    let killed = client.call("process_kill", json!({"id": id}));
    assert_eq!(killed["ok"], true, "{killed}");
    assert_eq!(killed["metadata"]["running"], false, "{killed}");
    assert_gone(&pids);
    let listed = client.call("process_list", json!({}));
    assert_eq!(listed["metadata"]["processes"][0]["running"], false, "{listed}");
}

#[test]
fn daemon_shutdown_kills_background_processes() {
    let mut daemon = TestDaemon::start(BYPASS);
    let mark = marker(3);
    let mut client = daemon.connect();
    client.open();
    client.start(json!({"command": format!("setsid sleep 1000.{mark} & sleep 1000.{mark}"), "background": true}));
    let pids = wait_started(&mark, 2);
    daemon.terminate();
    assert_gone(&pids);
}

#[test]
fn too_many_running_processes_are_refused_with_a_clear_error() {
    let daemon = TestDaemon::start(&format!("{BYPASS}[limits]\nmax_background_processes = 1\n"));
    let mut client = daemon.connect();
    client.open();
    let first = client.start(json!({"command": "while :; do sleep 1; done", "background": true}));
    let refused = client.call("run_command", json!({"command": "true", "background": true}));
    assert_eq!(refused["ok"], false, "{refused}");
    let error = refused["error"].as_str().unwrap();
    assert!(error.contains("max_background_processes"), "{error}");
    assert_eq!(refused["error_type"], "too_large", "{refused}");
    client.call("process_kill", json!({"id": first}));
    let again = client.call("run_command", json!({"command": "true", "background": true}));
    assert_eq!(again["ok"], true, "{again}");
}

/// Starts that arrive together are counted and given their place in the table in one
/// step: however many race for the last slots, no more than the limit run.
#[test]
fn concurrent_starts_never_run_more_than_the_limit() {
    let daemon = TestDaemon::start(&format!("{BYPASS}[limits]\nmax_background_processes = 3\n"));
    let mark = marker(20);
    let mut client = daemon.connect();
    client.open();
    let start = json!({"command": format!("sleep 1000.{mark}"), "background": true});
    let calls: Vec<(&str, Value)> = (0..48).map(|_| ("run_command", start.clone())).collect();
    for round in 0..50 {
        let results = client.call_all(&calls);
        let mut started = Vec::new();
        for result in &results {
            if result["ok"] == true {
                started.push(result["metadata"]["process_id"].as_str().unwrap().to_owned());
            } else {
                assert_eq!(result["error_type"], "too_large", "{result}");
                let error = result["error"].as_str().unwrap();
                assert!(error.contains("max_background_processes"), "{error}");
            }
        }
        let listed = client.call("process_list", json!({}));
        let running = listed["metadata"]["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|process| process["running"] == true)
            .count();
        assert_eq!(started.len(), 3, "round {round}: {} of 48 started: {started:?}", started.len());
        assert_eq!(running, 3, "round {round}: {listed}");
        let pids = processes_with(&mark);
        for id in &started {
            let killed = client.call("process_kill", json!({"id": id}));
            assert_eq!(killed["ok"], true, "{killed}");
        }
        assert_gone(&pids);
    }
}

#[test]
fn spooled_output_is_bounded_and_the_session_bound_refuses() {
    let daemon = TestDaemon::start(&format!(
        "{BYPASS}[limits]\nprocess_output_bytes = 1000\nsession_process_output_bytes = 2000\n"
    ));
    let mut client = daemon.connect();
    client.open();
    let chatty = client.start(json!({"command": "seq 1 3000", "background": true}));
    let exit = client.wait_exit(&chatty);
    assert_eq!(exit["exit_code"], 0);
    let read = client.call("process_read", json!({"id": chatty, "offset": 0}));
    let content = read["content"].as_str().unwrap();
    assert!(content.starts_with('['), "the cut is marked: {content}");
    assert!(content.contains("no longer kept"), "{content}");
    assert!(read["metadata"]["dropped_bytes"].as_u64().unwrap() > 10_000, "{read}");
    assert!(content.contains("3000\n"), "the newest output is kept: {content}");

    // The exited process gives way; two running ones fill the session's bound.
    let a = client.start(json!({"command": "while :; do sleep 1; done", "background": true}));
    let b = client.start(json!({"command": "while :; do sleep 1; done", "background": true}));
    let refused = client.call("run_command", json!({"command": "true", "background": true}));
    assert_eq!(refused["ok"], false, "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("session_process_output_bytes"),
        "{refused}"
    );
    assert_eq!(refused["error_type"], "too_large", "{refused}");
    for id in [a, b] {
        client.call("process_kill", json!({"id": id}));
    }
}

#[test]
fn process_write_is_judged_as_a_command() {
    let daemon = TestDaemon::start(&format!("{BYPASS}deny = [\"run_command(rm:*)\"]\n"));
    let mut client = daemon.connect();
    client.open();
    let id = client.start(json!({"command": "cat", "background": true}));
    let denied = client.call("process_write", json!({"id": id, "input": "rm -rf victim\n"}));
    assert_eq!(denied["ok"], false, "{denied}");
    assert_eq!(denied["error_type"], "permission_denied", "{denied}");
    let fine = client.call("process_write", json!({"id": id, "input": "echo fine\n"}));
    assert_eq!(fine["ok"], true, "{fine}");
    let (text, _) = client.read_until(&id, 0, |text| text.contains("echo fine"));
    assert!(!text.contains("rm -rf"), "{text}");
    client.call("process_kill", json!({"id": id}));
}

#[test]
fn the_cli_follows_a_background_build() {
    let daemon = TestDaemon::start(BYPASS);
    let toolgate = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(args)
            .arg("--socket")
            .arg(&daemon.socket)
            .env("TOOLGATE_SESSION", "build")
            .env("XDG_CONFIG_HOME", daemon.dir.path().join("config-home"))
            .env("HOME", daemon.dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let started = toolgate(&[
        "call",
        "run_command",
        r#"{"command": "for i in 1 2 3; do echo step $i; sleep 0.2; done", "background": true}"#,
        "--json",
    ]);
    assert!(started.status.success(), "{started:?}");
    let result: Value = serde_json::from_slice(&started.stdout).unwrap();
    let id = result["metadata"]["process_id"].as_str().unwrap().to_owned();
    let followed = toolgate(&["process", "follow", &id]);
    assert!(followed.status.success(), "{followed:?}");
    assert_eq!(String::from_utf8_lossy(&followed.stdout), "step 1\nstep 2\nstep 3\n");
    let listed = toolgate(&["process", "list", "--json"]);
    assert!(listed.status.success(), "{listed:?}");
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed["metadata"]["processes"][0]["exit_code"], 0, "{listed}");
}

#[test]
fn on_timeout_background_keeps_a_slow_command_running() {
    let daemon = TestDaemon::start(&format!("{BYPASS}[limits]\non_timeout = \"background\"\n"));
    let mut client = daemon.connect();
    client.open();
    let command = "echo begun; while [ ! -e gate ]; do sleep 0.02; done; echo over";
    let result = client.call("run_command", json!({"command": command, "timeout_ms": 500}));
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["metadata"]["running"], true, "{result}");
    assert!(result["content"].as_str().unwrap().contains("on_timeout"), "{result}");
    let id = result["metadata"]["process_id"].as_str().unwrap().to_owned();
    std::fs::write(daemon.workspace().join("gate"), "").unwrap();
    let (text, _) = client.read_until(&id, 0, |text| text.contains("over"));
    assert_eq!(text, "begun\nover\n");
    // A quick command still answers as it always did.
    let quick = client.call("run_command", json!({"command": "echo quick"}));
    assert_eq!(quick["content"], "quick\n[exit code 0]");
}

#[test]
fn the_default_session_is_resumable_too() {
    let daemon = TestDaemon::start(BYPASS);
    let mut first = daemon.connect();
    let info = first.result("session/update", json!({}));
    let token = info["resume_token"].as_str().unwrap().to_owned();
    let id = first.start(
        json!({"command": "while [ ! -e go ]; do sleep 0.02; done; echo went", "background": true}),
    );
    drop(first);
    std::fs::write(daemon.workspace().join("go"), "").unwrap();
    let mut second = daemon.connect();
    let resumed = second.result("session/open", json!({"resume_token": token}));
    second.session = Some(resumed["session_id"].as_str().unwrap().to_owned());
    let (text, _) = second.read_until(&id, 0, |text| text.contains("went"));
    assert_eq!(text, "went\n");
}

/// The process tools are ordinary tools: an MCP host lists them, with schemas that
/// carry no `null` types, and drives a background process through them.
#[test]
fn mcp_hosts_get_the_process_tools() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["mcp", "--mode", "bypass", "--root"])
        .arg(dir.path())
        .current_dir(dir.path())
        .env("HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path().join("config-home"))
        .env("XDG_STATE_HOME", dir.path().join("state"))
        .env("XDG_RUNTIME_DIR", dir.path().join("run"))
        .env("TOOLGATE_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut next = 0;
    let mut request = |method: &str, params: Value| -> Value {
        next += 1;
        let line = json!({"jsonrpc": "2.0", "id": next, "method": method, "params": params});
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        if method == "initialize" {
            let mut text = String::new();
            stdout.read_line(&mut text).unwrap();
            let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
            stdin.write_all(format!("{initialized}\n").as_bytes()).unwrap();
            return serde_json::from_str(&text).unwrap();
        }
        loop {
            let mut text = String::new();
            assert!(stdout.read_line(&mut text).unwrap() > 0, "toolgate mcp hung up");
            let message: Value = serde_json::from_str(&text).unwrap();
            if message["id"] == json!(next) {
                return message;
            }
        }
    };
    request(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    );
    let listed = request("tools/list", json!({}));
    let tools = listed["result"]["tools"].as_array().unwrap();
    for name in ["process_read", "process_write", "process_resize", "process_kill", "process_list"]
    {
        let tool = tools
            .iter()
            .find(|tool| tool["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing: {listed}"));
        let schema = tool["inputSchema"].to_string();
        assert!(!schema.contains("\"null\""), "{name}: {schema}");
    }
    let started = request(
        "tools/call",
        json!({"name": "run_command", "arguments": {"command": "echo from-mcp", "background": true}}),
    );
    let structured = started["result"]["structuredContent"].clone();
    let text = started["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned();
    let id = structured["metadata"]["process_id"]
        .as_str()
        .map(str::to_owned)
        .or_else(|| text.split_whitespace().nth(1).map(str::to_owned))
        .unwrap();
    let read = request(
        "tools/call",
        json!({"name": "process_read", "arguments": {"id": id, "wait_ms": 10000}}),
    );
    assert!(read["result"]["content"][0]["text"].as_str().unwrap().contains("from-mcp"), "{read}");
    drop(stdin);
    let _ = child.wait();
}

/// Under a deny rule, what an interactive shell reads is judged, not each write's
/// bytes: its line editing, a line typed over several writes, aliases and functions
/// that would rename a denied command, and editing keys nothing can follow.
#[test]
fn process_write_to_a_shell_is_judged_as_the_shell_will_read_it() {
    if !have("bash") {
        eprintln!("skipped: no bash on this machine");
        return;
    }
    let daemon =
        TestDaemon::start("[permissions]\nmode = \"bypass\"\ndeny = [\"run_command(touch:*)\"]\n");
    let workspace = daemon.dir.path().join("workspace");
    let mut client = daemon.connect();
    client.open();
    let id = client.start(json!({
        "command": "PS1='ready> ' exec bash --norc --noprofile -i", "tty": true, "background": true
    }));
    let (_, mut offset) = client.read_until(&id, 0, |text| text.contains("ready> "));
    let attempts: &[(&str, &[&str])] = &[
        ("erase", &["toucx\u{7f}h pw-erase\n"]),
        ("kill line", &["echo hi\u{15}touch pw-kill\n"]),
        ("word erase", &["echo hi\u{17}\u{17}touch pw-word\n"]),
        ("split", &["tou", "ch pw-split\n"]),
        ("alias", &["alias t=touch\n", "t pw-alias\n"]),
        ("function", &["f() { command touc\"\"h \"$@\"; }\n", "f pw-function\n"]),
        ("cursor keys", &["ouch pw-cursor\u{1}t\n"]),
        ("escape sequence", &["touc pw-escape\u{1b}[D\u{1b}[D\u{1b}[D\u{1b}[D\u{1b}[Dh\n"]),
    ];
    for (what, writes) in attempts {
        let mut refused = false;
        for input in *writes {
            let written = client.call("process_write", json!({"id": id, "input": input}));
            if written["ok"] == false {
                assert_eq!(written["error_type"], "permission_denied", "{what}: {written}");
                refused = true;
                break;
            }
        }
        assert!(refused, "{what}: every write was let through");
        // Whatever was left typed is dropped before the next attempt.
        client.call("process_write", json!({"id": id, "input": "\u{3}"}));
    }
    // The shell still reads what is allowed, and nothing denied ran.
    client.call("process_write", json!({"id": id, "input": "echo alive > alive.txt\n"}));
    let (_, next) = client.read_until(&id, offset, |_| workspace.join("alive.txt").exists());
    offset = next;
    let _ = offset;
    let planted: Vec<String> = std::fs::read_dir(&workspace)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("pw-"))
        .collect();
    assert!(planted.is_empty(), "denied commands ran: {planted:?}");
    client.call("process_kill", json!({"id": id}));
}
