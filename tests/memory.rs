//! Memory under one hostile client, against the real daemon: what one request costs is
//! bounded by a small multiple of its size and given back afterwards; a client that
//! stops reading costs a bounded queue, not the output it is not reading; sessions
//! with large task lists give their memory back when they end; reads of large files
//! that follow each other share one buffer, given back once they stop; edits that
//! would grow a file past the read limit are refused before the text is built, and an
//! edit whose call timed out stops working and lets go of its file.
//!
//! The daemon's memory is read from `/proc/<pid>/status` (`VmHWM`, the peak resident
//! set, and `VmRSS`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use support::{Client, TestDaemon};

const MIB: u64 = 1024 * 1024;

/// `toolgate serve` on a private socket with `config`, its workspace holding
/// `small.txt`.
fn start(config: &str) -> TestDaemon {
    TestDaemon::start_with(config, |dir| {
        std::fs::write(dir.join("workspace/small.txt"), "hello\n").unwrap();
    })
}

/// The daemon's memory, read from `/proc/<pid>`.
trait Memory {
    /// Page faults the daemon has taken that needed no reading from disk (a page of
    /// memory handed to it for the first time, mostly).
    fn minor_faults(&self) -> u64;
    /// The highest RSS seen, sampled every 100 ms for 4 s (at least `idle`), printed
    /// next to `idle`.
    fn highest_rss_over_four_seconds(&self, idle: u64) -> u64;
    /// A `/proc/<pid>/status` field in bytes (`VmRSS`, `VmHWM`).
    fn status(&self, field: &str) -> u64;
}

impl Memory for TestDaemon {
    fn minor_faults(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        // The fields after the command's name, which ends with the last ')'.
        let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
        fields[7].parse().unwrap()
    }

    fn highest_rss_over_four_seconds(&self, idle: u64) -> u64 {
        let mut highest = idle;
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(100));
            highest = highest.max(self.status("VmRSS:"));
        }
        println!("idle {} MiB, highest {} MiB while not reading", idle / MIB, highest / MIB);
        highest
    }

    fn status(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = status.lines().find(|line| line.starts_with(field)).unwrap();
        let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kib * 1024
    }
}

/// Requests whose parameters are already serialized (the probes are too large to go
/// through a `Value` twice).
trait Raw {
    /// Sends one request line (already serialized) and returns its id.
    fn send_raw(&mut self, method: &str, params: &str) -> u64;
    /// Reads until the response to `id`; its `result` (an error fails the test).
    fn answer(&mut self, id: u64) -> Value;
}

impl Raw for Client {
    fn send_raw(&mut self, method: &str, params: &str) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send_line(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#
        ));
        id
    }

    fn answer(&mut self, id: u64) -> Value {
        let message = self.response(id);
        assert!(message.get("error").is_none(), "{message}");
        message["result"].clone()
    }
}

/// A client whose reads wait as long as a daemon handling the largest probe may take.
fn connect(daemon: &TestDaemon) -> Client {
    let client = daemon.connect();
    client.writer.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    client
}

/// The ~15 MB argument text of the probe: 440,000 small objects.
fn hostile_todos() -> String {
    let item = r#"{"content":"","status":"pending"}"#;
    let mut text = String::with_capacity(440_000 * (item.len() + 1) + 16);
    text.push_str(r#"{"todos":["#);
    for i in 0..440_000 {
        if i > 0 {
            text.push(',');
        }
        text.push_str(item);
    }
    text.push_str("]}");
    text
}

/// Waits (bounded) for the daemon's resident set to come within `slack` of `target`;
/// returns the last reading. Freed memory goes back to the system as the allocator
/// gets to it, not necessarily before the answer is written.
fn settle(daemon: &TestDaemon, target: u64, slack: u64) -> u64 {
    let mut rss = daemon.status("VmRSS:");
    for _ in 0..50 {
        if rss <= target + slack {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        rss = daemon.status("VmRSS:");
    }
    rss
}

#[test]
fn one_huge_call_costs_a_small_multiple_of_its_size_and_is_given_back() {
    let daemon = start("[permissions]\nmode = \"plan\"\n");
    let mut client = connect(&daemon);
    // Warm up what every call uses (threads, the audit writer, the registry's paths).
    let warm = client.result(
        "tools/call",
        json!({"name": "todo_write", "arguments": {"todos": [{"content": "a", "status": "pending"}]}}),
    );
    assert_eq!(warm["ok"], true, "{warm}");
    let idle = daemon.status("VmRSS:");

    let todos = hostile_todos();
    let size = todos.len() as u64;
    assert!(size > 14_000_000, "{size}");
    // Through todo_write (no approval in any mode), and through a read_file whose
    // schema refuses the extra property.
    let read_file = format!(r#"{{"path":"small.txt","junk":{todos}}}"#);
    for (tool, arguments) in [("todo_write", &todos), ("read_file", &read_file)] {
        let params = format!(r#"{{"name":"{tool}","arguments":{arguments}}}"#);
        let id = client.send_raw("tools/call", &params);
        let result = client.answer(id);
        assert_eq!(result["ok"], false, "{tool}: {result}");
        assert_eq!(result["error_type"], "invalid_arguments", "{tool}: {result}");
    }
    let peak = daemon.status("VmHWM:");
    println!(
        "idle {} MiB, peak {} MiB for {} MiB of arguments",
        idle / MIB,
        peak / MIB,
        size / MIB
    );
    assert!(
        peak.saturating_sub(idle) <= 6 * size,
        "peak {peak} for {size} bytes of arguments (idle {idle})"
    );
    // The session is still usable, and its list was not replaced.
    let state = client.result("session/update", json!({}));
    assert_eq!(state["todos"].as_array().map(Vec::len), Some(1), "{state}");
    drop(client);
    let after = settle(&daemon, idle, 8 * MIB);
    println!("after {} MiB", after / MIB);
    assert!(after <= idle + 8 * MIB, "RSS {after} after the calls, {idle} before");
}

#[test]
fn sessions_with_large_task_lists_give_their_memory_back_when_they_end() {
    let daemon = start("");
    let mut client = connect(&daemon);
    let small = client.result(
        "tools/call",
        json!({"name": "todo_write", "arguments": {"todos": [{"content": "a", "status": "pending"}]}}),
    );
    assert_eq!(small["ok"], true, "{small}");
    let idle = daemon.status("VmRSS:");

    // A list over the limit is refused, and the session keeps its list.
    let too_long: Vec<Value> =
        (0..1001).map(|_| json!({"content": "x", "status": "pending"})).collect();
    let refused = client
        .result("tools/call", json!({"name": "todo_write", "arguments": {"todos": too_long}}));
    assert_eq!(refused["ok"], false, "{refused}");
    let too_big: Vec<Value> =
        (0..300).map(|_| json!({"content": "y".repeat(1000), "status": "pending"})).collect();
    let refused =
        client.result("tools/call", json!({"name": "todo_write", "arguments": {"todos": too_big}}));
    assert_eq!(refused["error_type"], "too_large", "{refused}");

    // As many sessions as one connection may open, each with the largest list allowed.
    let content = "z".repeat(250);
    let list: Vec<Value> =
        (0..1000).map(|_| json!({"content": content, "status": "pending"})).collect();
    let arguments = json!({"todos": list});
    let mut sessions = 0;
    loop {
        let id = client.send_raw("session/open", "{}");
        let line = client.response(id);
        let Some(session) = line["result"]["session_id"].as_str() else {
            // The connection's limit of sessions.
            assert!(line["error"].is_object(), "{line}");
            break;
        };
        let result = client.result(
            "tools/call",
            json!({"name": "todo_write", "session_id": session, "arguments": arguments}),
        );
        assert_eq!(result["ok"], true, "{result}");
        sessions += 1;
    }
    assert!(sessions >= 32, "{sessions}");
    let loaded = daemon.status("VmRSS:");
    println!("idle {} MiB, {sessions} sessions {} MiB", idle / MIB, loaded / MIB);
    drop(client);
    let after = settle(&daemon, idle, 8 * MIB);
    println!("after they closed {} MiB", after / MIB);
    assert!(after <= idle + 8 * MIB, "RSS {after} after the sessions closed, {idle} before");
}

#[test]
fn a_subscriber_that_stops_reading_costs_a_bounded_queue() {
    let daemon = start("[permissions]\nmode = \"bypass\"\n");
    let mut client = connect(&daemon);
    let warm = client.result(
        "tools/call",
        json!({"name": "run_command", "arguments": {"command": "echo warm"}}),
    );
    assert_eq!(warm["ok"], true, "{warm}");
    let idle = daemon.status("VmRSS:");
    client.result("events/subscribe", json!({}));
    // Output as fast as a command can make it, for a few seconds, while this client
    // reads nothing.
    let id = client.send_raw(
        "tools/call",
        &json!({"name": "run_command",
                "arguments": {"command": "cat /dev/zero", "timeout_ms": 4000}})
        .to_string(),
    );
    let highest = daemon.highest_rss_over_four_seconds(idle);
    let result = client.answer(id);
    assert_eq!(result["error_type"], "timeout", "{result}");
    assert!(
        highest <= idle + 64 * MIB,
        "RSS grew from {idle} to {highest} while a subscriber did not read"
    );
    drop(client);
}

#[test]
fn an_upstream_flooding_progress_to_a_subscriber_that_stops_reading_costs_a_bounded_queue() {
    let state = tempfile::tempdir().unwrap();
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_server.py");
    let config = format!(
        "[permissions]\nmode = \"bypass\"\n\n[[mcp_servers]]\nname = \"fx\"\n\
         command = \"python3\"\nargs = [{fixture:?}]\nsandbox = false\n\
         env = {{ FIXTURE_STATE_DIR = {state:?}, FIXTURE_NAME = \"fx\" }}\n",
        fixture = fixture.display().to_string(),
        state = state.path().display().to_string(),
    );
    let daemon = start(&config);
    let mut client = connect(&daemon);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let listed = client.result("tools/list", json!({}));
        if listed.to_string().contains("mcp__fx__slow") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the upstream never listed its tools");
        std::thread::sleep(Duration::from_millis(50));
    }
    let warm = client.result(
        "tools/call",
        json!({"name": "mcp__fx__slow", "arguments": {"steps": 1, "delay_ms": 0}}),
    );
    assert_eq!(warm["ok"], true, "{warm}");
    let idle = daemon.status("VmRSS:");
    client.result("events/subscribe", json!({}));
    // 400 progress messages of 300 KB each (120 MB), while this client reads nothing.
    let id = client.send_raw(
        "tools/call",
        &json!({"name": "mcp__fx__slow",
                "arguments": {"steps": 400, "delay_ms": 0, "message_bytes": 300_000}})
        .to_string(),
    );
    let highest = daemon.highest_rss_over_four_seconds(idle);
    let result = client.answer(id);
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["content"], "done after 400 steps", "{result}");
    assert!(
        highest <= idle + 64 * MIB,
        "RSS grew from {idle} to {highest} while a subscriber did not read upstream progress"
    );
    drop(client);
}

#[test]
fn large_reads_that_follow_each_other_share_one_buffer_given_back_once_they_stop() {
    let daemon = start("");
    let text = "a line of a large file, read whole again and again\n".repeat(180_000);
    let pages = text.len() as u64 / 4096;
    std::fs::write(daemon.workspace().join("large.txt"), &text).unwrap();
    let mut client = connect(&daemon);
    let mut read = |path: &str| {
        let result =
            client.result("tools/call", json!({"name": "read_file", "arguments": {"path": path}}));
        assert_eq!(result["ok"], true, "{result}");
    };
    read("small.txt");
    let idle = daemon.status("VmRSS:");
    read("large.txt");
    // Each read after the first writes the file's bytes into the pages the first one
    // faulted in: four of them take fewer faults than one read of fresh memory.
    let before = daemon.minor_faults();
    for _ in 0..4 {
        read("large.txt");
    }
    let faults = daemon.minor_faults() - before;
    println!("{} pages per read, {faults} faults over four reads", pages);
    assert!(faults < pages, "{faults} page faults over four reads of {pages} pages");
    // The client stays connected: the buffer goes because the reads stopped.
    let after = settle(&daemon, idle, 6 * MIB);
    println!("idle {} MiB, after {} MiB", idle / MIB, after / MIB);
    assert!(after <= idle + 6 * MIB, "RSS {after} after the reads stopped, {idle} before");
}

/// `edits` that each double a file with `replace_all`: what the edits would make is
/// computed from the match counts and refused before the text is built.
fn doubling(edits: usize) -> Vec<Value> {
    (0..edits)
        .map(|_| json!({"old_string": "x", "new_string": "xx", "replace_all": true}))
        .collect()
}

#[test]
fn edits_that_would_grow_a_file_past_the_read_limit_are_refused_before_they_are_made() {
    let daemon = start("[permissions]\nmode = \"bypass\"\n\n[limits]\nmax_read_bytes = 1048576\n");
    let original = "x".repeat(64 * 1024);
    let path = daemon.workspace().join("grow.txt");
    std::fs::write(&path, &original).unwrap();
    let mut client = connect(&daemon);
    let read = client
        .result("tools/call", json!({"name": "read_file", "arguments": {"path": "grow.txt"}}));
    assert_eq!(read["ok"], true, "{read}");
    let idle = daemon.status("VmHWM:");

    // Eleven doublings ask for 128 MiB; the fifth already passes the 1 MiB limit.
    let refused = client.result(
        "tools/call",
        json!({"name": "edit_file", "arguments": {"path": "grow.txt", "edits": doubling(11)}}),
    );
    assert_eq!(refused["ok"], false, "{refused}");
    assert_eq!(refused["error_type"], "too_large", "{refused}");
    let error = refused["error"].as_str().unwrap();
    assert!(error.starts_with("edit 5 of 11: "), "{error}");
    assert!(error.contains("2097152 bytes") && error.contains("max_read_bytes"), "{error}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), original, "the file changed");

    // A new file built by its edits is bounded the same way, and not created.
    let mut edits = vec![json!({"old_string": "", "new_string": original})];
    edits.extend(doubling(11));
    let refused = client.result(
        "tools/call",
        json!({"name": "edit_file", "arguments": {"path": "new.txt", "edits": edits}}),
    );
    assert_eq!(refused["error_type"], "too_large", "{refused}");
    assert!(!daemon.workspace().join("new.txt").exists(), "the refused file was created");

    // Up to the limit, the same edits are made.
    let made = client.result(
        "tools/call",
        json!({"name": "edit_file", "arguments": {"path": "grow.txt", "edits": doubling(4)}}),
    );
    assert_eq!(made["ok"], true, "{made}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 1024 * 1024);

    let peak = daemon.status("VmHWM:");
    println!("peak {} MiB, {} MiB before the edits", peak / MIB, idle / MIB);
    assert!(
        peak <= idle + 32 * MIB,
        "peak {peak} after edits that asked for 128 MiB were refused (idle {idle})"
    );
}

#[test]
fn an_edit_whose_call_timed_out_stops_and_lets_go_of_its_file() {
    // The default deadline only ends the test early should the file stay locked.
    let daemon =
        start("[permissions]\nmode = \"bypass\"\n\n[limits]\ndefault_timeout_ms = 30000\n");
    let mut text = "a".repeat(8 * 1024 * 1024);
    text.push_str("\nend\n");
    let path = daemon.workspace().join("work.txt");
    std::fs::write(&path, &text).unwrap();
    let mut client = connect(&daemon);
    let hasty = client.result("session/open", json!({}));
    let hasty = hasty["session_id"].as_str().unwrap().to_owned();
    for session in [Value::Null, json!(hasty)] {
        let read = client.result(
            "tools/call",
            json!({"name": "read_file", "session_id": session, "arguments": {"path": "work.txt"}}),
        );
        assert_eq!(read["ok"], true, "{read}");
    }
    client.result("session/update", json!({"session_id": hasty, "timeout_ms": 300}));
    // A thousand edits, each over eight million matches: far more work than the
    // call's deadline leaves it.
    let edits: Vec<Value> = (0..1200)
        .map(|idx| {
            let (old, new) = if idx % 2 == 0 { ("a", "b") } else { ("b", "a") };
            json!({"old_string": old, "new_string": new, "replace_all": true})
        })
        .collect();
    let slow = client.result(
        "tools/call",
        json!({"name": "edit_file", "session_id": hasty,
               "arguments": {"path": "work.txt", "edits": edits}}),
    );
    assert_eq!(slow["error_type"], "timeout", "{slow}");
    // The next edit of the file gets its lock: the edits behind the answer stopped.
    let next = client.result(
        "tools/call",
        json!({"name": "edit_file",
               "arguments": {"path": "work.txt", "old_string": "end", "new_string": "done"}}),
    );
    assert_eq!(next["ok"], true, "{next}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text.replace("end", "done"));
}

#[test]
fn a_notebook_edit_that_would_grow_past_the_read_limit_is_refused_before_it_is_made() {
    let daemon = start("[permissions]\nmode = \"bypass\"\n\n[limits]\nmax_read_bytes = 1048576\n");
    // A notebook whose keys are indented 300,000 columns: a cell written in its style
    // repeats twice that on every line of its source.
    let indent = " ".repeat(300_000);
    let notebook = format!(
        "{{\n{indent}\"cells\": [\n{indent}{{\"cell_type\": \"code\", \"execution_count\": null, \
         \"id\": \"c1\", \"metadata\": {{}}, \"outputs\": [],\n{indent}\"source\": [\n\"x\\n\"\n]}}\n\
         ],\n\"metadata\": {{}},\n\"nbformat\": 4,\n\"nbformat_minor\": 5\n}}\n"
    );
    assert!(notebook.len() < 1024 * 1024);
    let path = daemon.workspace().join("deep.ipynb");
    std::fs::write(&path, &notebook).unwrap();
    let mut client = connect(&daemon);
    let read = client
        .result("tools/call", json!({"name": "read_file", "arguments": {"path": "deep.ipynb"}}));
    assert_eq!(read["ok"], true, "{read}");
    let idle = daemon.status("VmHWM:");

    // 200 lines of source in a request of a few hundred bytes: 120 MB of notebook.
    let source = "\n".repeat(200);
    for arguments in [
        json!({"path": "deep.ipynb", "cell_id": "c1", "source": source}),
        json!({"path": "deep.ipynb", "action": "insert", "index": 1, "cell_type": "markdown",
               "source": source}),
    ] {
        let refused =
            client.result("tools/call", json!({"name": "notebook_edit", "arguments": arguments}));
        let now = std::fs::metadata(&path).unwrap().len();
        assert_eq!(refused["ok"], false, "{refused}: the notebook is now {now} bytes");
        assert_eq!(refused["error_type"], "too_large", "{refused}");
        let error = refused["error"].as_str().unwrap();
        assert!(error.contains("max_read_bytes"), "{error}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), notebook, "the notebook changed");
    }
    let peak = daemon.status("VmHWM:");
    println!("peak {} MiB, {} MiB before the edits", peak / MIB, idle / MIB);
    assert!(
        peak <= idle + 32 * MIB,
        "peak {peak} after notebook edits that asked for 120 MB were refused (idle {idle})"
    );

    // An edit that stays within the limit is made.
    let emptied = client.result(
        "tools/call",
        json!({"name": "notebook_edit", "arguments": {"path": "deep.ipynb", "cell_id": "c1", "source": ""}}),
    );
    assert_eq!(emptied["ok"], true, "{emptied}");
}
