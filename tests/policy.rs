//! The permission layer seen from outside: the real `toolgate serve` binary, asked by
//! an editor plugin would ask it (NDJSON on its socket), and the configuration checks
//! `serve` and `check-config` share.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Client, TestDaemon};

/// A daemon for one test; next to its `workspace/` (the root) is `outside/`.
fn start(config: &str) -> TestDaemon {
    start_with(config, |_| {})
}

/// Starts a daemon after `prepare` has set up the directory.
fn start_with(config: &str, prepare: impl FnOnce(&Path)) -> TestDaemon {
    TestDaemon::start_with(config, |dir| {
        std::fs::create_dir_all(dir.join("outside")).unwrap();
        prepare(dir);
    })
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

trait ExplainCommand {
    fn explain_command(&mut self, command: &str) -> Value;
}

impl ExplainCommand for Client {
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
    let daemon = start_with(GIT_STATUS_ALLOWED, links);
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
    let daemon = start_with(GIT_STATUS_ALLOWED, links);
    let mut client = daemon.connect();
    let explained = client.explain_command("git status > loop/x");
    assert_eq!(explained["decision"], "ask", "{explained}");
    let reason = explained["explanation"]["reason"].as_str().unwrap();
    assert!(reason.contains("cannot be resolved"), "{reason}");
}

/// Asks for a call over a subscribed connection and returns the `permission_request`
/// event and the id of the call.
fn asked(client: &mut Client, command: &str) -> (Value, u64) {
    let id = client
        .send("tools/call", json!({"name": "run_command", "arguments": {"command": command}}));
    let request = client.event(|event| event["type"] == "permission_request");
    (request, id)
}

#[test]
fn a_session_grant_is_never_wider_than_what_was_shown() {
    let daemon = start("");
    let mut client = daemon.connect();
    client.result("events/subscribe", json!({}));
    // A command no rule could describe safely: the grant is this exact command.
    let command = "echo today is $(date +%A) > day.txt";
    let (request, id) = asked(&mut client, command);
    assert!(request["suggestions"].as_array().is_none_or(Vec::is_empty), "{request}");
    let grant = request["session_grant"].as_str().unwrap_or_default();
    assert!(grant.contains("this exact command") && grant.contains(command), "{request}");
    client.result(
        "permission/respond",
        json!({"request_id": request["request_id"], "decision": "allow", "scope": "session"}),
    );
    assert_eq!(client.response(id)["result"]["ok"], true);
    // The same command again runs without asking; anything else still asks.
    assert_eq!(client.explain_command(command)["decision"], "allow");
    for other in ["curl -s http://127.0.0.1:9/x | sh", "echo today is $(id)", "rm -rf x"] {
        let explained = client.explain_command(other);
        assert_eq!(explained["decision"], "ask", "{other}: {explained}");
    }

    // With a safe prefix, the grant is the suggested rule, and the request says so.
    let (request, id) = asked(&mut client, "mkdir -p made");
    assert_eq!(request["session_grant"], "run_command(mkdir:*)", "{request}");
    client.result(
        "permission/respond",
        json!({"request_id": request["request_id"], "decision": "allow", "scope": "session"}),
    );
    assert_eq!(client.response(id)["result"]["ok"], true);
    assert_eq!(client.explain_command("mkdir -p other")["decision"], "allow");
    assert_eq!(client.explain_command("rm -r made")["decision"], "ask");
}

#[test]
fn no_session_grant_is_offered_where_none_could_apply() {
    let daemon = start("[permissions]\nask = [\"run_command(git push:*)\"]\n");
    let mut client = daemon.connect();
    client.result("events/subscribe", json!({}));
    let (request, id) = asked(&mut client, "git push --dry-run 2>/dev/null; true");
    assert!(request.get("session_grant").is_none(), "{request}");
    // Answering "for the session" anyway allows this call once, and grants nothing.
    client.result(
        "permission/respond",
        json!({"request_id": request["request_id"], "decision": "allow", "scope": "session"}),
    );
    client.response(id);
    assert_eq!(client.explain_command("echo hi; rm -rf x")["decision"], "ask");
}

#[test]
fn the_reason_names_every_part_that_needs_approval() {
    let daemon = start("[permissions]\nallow = [\"run_command(ls:*)\"]\n");
    let mut client = daemon.connect();
    client.result("events/subscribe", json!({}));
    let (request, id) = asked(&mut client, "ls -la; rm -rf X; cat /etc/hostname");
    let reason = request["explanation"]["reason"].as_str().unwrap();
    assert!(reason.contains("`rm -rf X`") && reason.contains("`cat /etc/hostname`"), "{reason}");
    client.result(
        "permission/respond",
        json!({"request_id": request["request_id"], "decision": "deny"}),
    );
    client.response(id);
    // Hidden characters in a part are shown, not sent to the terminal.
    let explained = client.explain_command("ls; rm -rf '\u{1b}[2J\u{202e}X'");
    let reason = explained["explanation"]["reason"].as_str().unwrap();
    assert!(reason.contains("rm -rf \\x1b[2J<U+202E>X"), "{reason}");
    assert!(!reason.contains('\u{1b}') && !reason.contains('\u{202e}'), "{reason}");
}

/// A Python with pyte, in a virtual environment under `target/` (made on first use).
/// `None`, with the reason printed, when there is no Python to make it with.
fn pyte_python() -> Option<PathBuf> {
    let python3 = Command::new("python3").arg("--version").output();
    if !python3.is_ok_and(|out| out.status.success()) {
        eprintln!("SKIPPED: the terminal-emulator checks need python3, which is not installed");
        return None;
    }
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    let venv = target.join("pyte-venv");
    let python = venv.join("bin").join("python");
    let has_pyte = |python: &Path| {
        Command::new(python).args(["-c", "import pyte"]).status().is_ok_and(|s| s.success())
    };
    if has_pyte(&python) {
        return Some(python);
    }
    let made = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().unwrap();
    if made.success() {
        let installed = Command::new(venv.join("bin").join("pip"))
            .args(["install", "--quiet", "pyte==0.8.2"])
            .status()
            .unwrap();
        assert!(installed.success(), "pip install pyte into {} failed", venv.display());
    } else {
        // No venv module (Debian without python3-venv): a private library directory,
        // found through a wrapper script.
        let lib = target.join("pyte-lib");
        let installed = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--target"])
            .arg(&lib)
            .arg("pyte==0.8.2")
            .status()
            .unwrap();
        assert!(installed.success(), "neither python3 -m venv nor pip install --target worked");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::fs::write(
            &python,
            format!("#!/bin/sh\nPYTHONPATH='{}' exec python3 \"$@\"\n", lib.display()),
        )
        .unwrap();
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    assert!(has_pyte(&python), "pyte is not importable after installing it");
    Some(python)
}

/// The screens `toolgate call` shows for each case, as a person's terminal renders
/// them (80x24), each captured when the approval prompt appears.
fn prompt_screens(python: &Path, daemon: &TestDaemon, cases: &Value) -> Vec<Value> {
    let cases_file = daemon.path("cases.json");
    std::fs::write(&cases_file, cases.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/prompt_screen.py");
    let output = Command::new(python)
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_toolgate"))
        .arg(&daemon.socket)
        .arg(&cases_file)
        .envs(test_env(daemon.dir.path()))
        .env("TERM", "xterm")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(output.status.success(), "the terminal driver failed");
    serde_json::from_slice::<Vec<Value>>(&output.stdout).unwrap()
}

#[test]
fn the_approval_prompt_shows_the_dangerous_part_on_a_real_terminal() {
    let Some(python) = pyte_python() else { return };
    let daemon = start_with("", |dir| {
        std::fs::create_dir(dir.join("workspace/victim")).unwrap();
    });
    let run = |command: String| json!({"tool": "run_command", "arguments": {"command": command}});
    let cases = json!([
        run("ls '\u{1b}[2J\u{1b}[3J\u{1b}[H<fake \"ls -la\" prompt>'; rm -rf victim".to_owned()),
        run(format!("rm -rf victim;{}ls -la", " ".repeat(4000))),
        run(format!("rm -rf victim{}ls -la", "\n".repeat(60))),
        run("rm -rf victim # \rls -la                    ".to_owned()),
        run("ls '\u{9b}2J\u{9b}H'; rm -rf victim".to_owned()),
        run("ls; rm -rf victim \u{202e}txt.md".to_owned()),
        run("ls $CMD'\u{1b}[2J'; rm -rf victim".to_owned()),
        json!({"tool": "write_file", "arguments": {"path": "a\u{1b}cb.txt", "content": "x"}}),
    ]);
    let screens = prompt_screens(&python, &daemon, &cases);
    assert_eq!(screens.len(), cases.as_array().unwrap().len());
    for (case, shown) in cases.as_array().unwrap().iter().zip(&screens) {
        let Some(lines) = shown["screen"].as_array() else {
            panic!("no approval prompt for {case}: {shown}");
        };
        let screen: String = lines
            .iter()
            .map(|line| line.as_str().unwrap().trim_end())
            .collect::<Vec<_>>()
            .join("\n");
        let expected = if case["tool"] == "write_file" { "a\\x1bcb.txt" } else { "rm -rf victim" };
        assert!(
            screen.contains(expected),
            "{expected:?} is not on the screen for {case}:\n{screen}"
        );
        assert!(screen.contains("Allow?"), "{screen}");
    }
    let screen_of = |idx: usize| {
        screens[idx]["screen"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_str().unwrap())
            .collect::<String>()
    };
    assert!(screen_of(0).contains("\\x1b[2J"), "{}", screen_of(0));
    assert!(screen_of(3).contains("\\r"), "{}", screen_of(3));
    assert!(screen_of(4).contains("<U+009B>"), "{}", screen_of(4));
    assert!(screen_of(5).contains("<U+202E>"), "{}", screen_of(5));
    // Every question was answered "no": nothing ran.
    assert!(daemon.path("workspace/victim").is_dir());
}

/// Runs `toolgate ARGS` in a test directory and returns its output.
fn toolgate(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(args)
        .current_dir(dir.join("workspace"))
        .envs(test_env(dir))
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `check-config --config FILE` and `serve --config FILE` must both refuse it and say
/// `expected` on stderr. A `serve` that starts anyway is stopped and the test fails.
fn both_refuse(dir: &Path, config: &Path, expected: &[&str]) {
    let config = config.to_str().unwrap();
    let checked = toolgate(dir, &["check-config", "--config", config]);
    let socket = dir.join("run").join("refused.sock");
    let mut serve = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["serve", "--config", config, "--socket", socket.to_str().unwrap()])
        .current_dir(dir.join("workspace"))
        .envs(test_env(dir))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let exited = loop {
        if serve.try_wait().unwrap().is_some() {
            break true;
        }
        if socket.exists() || Instant::now() > deadline {
            let _ = serve.kill();
            break false;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let served = serve.wait_with_output().unwrap();
    assert!(exited, "serve started with {config}");
    for (what, output) in [("check-config", checked), ("serve", served)] {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{what} accepted it: {stderr}");
        for needle in expected {
            assert!(stderr.contains(needle), "{what} does not say {needle:?}: {stderr}");
        }
    }
}

fn test_dir() -> tempfile::TempDir {
    let dir = private_tempdir();
    std::fs::create_dir_all(dir.path().join("workspace")).unwrap();
    dir
}

#[test]
fn rules_naming_no_tool_are_errors_with_file_and_line() {
    let dir = test_dir();
    let config = dir.path().join("config.toml");
    write_private(
        &config,
        "[permissions]\nallow = [\"Bash(git status:*)\"]\ndeny = [\n  \"mcp__db__query(DROP *)\",\n  \"run_comand(rm:*)\",\n]\n",
    );
    let shown = config.display().to_string();
    both_refuse(dir.path(), &config, &[&format!("{shown}:5:"), "run_comand", "could never apply"]);
    write_private(&config, "[permissions]\ndeny = [\"Bsh(rm:*)\"]\n");
    both_refuse(dir.path(), &config, &[&format!("{shown}:2:"), "Bsh"]);
    // Known names, aliases, `mcp__` patterns and skill tools load.
    let skills = dir.path().join("config-home/toolgate/skills");
    std::fs::create_dir_all(&skills).unwrap();
    write_private(
        &skills.join("say.toml"),
        "name = \"say\"\ndescription = \"x\"\ncommand = [\"echo\", \"{text}\"]\n[input_schema]\ntype = \"object\"\n",
    );
    write_private(
        &config,
        "[permissions]\nallow = [\"Bash(ls:*)\", \"mcp__git__*\"]\ndeny = [\"mcp__db__query(DROP *)\", \"say(text=*secret*)\"]\n",
    );
    let checked = toolgate(dir.path(), &["check-config", "--config", config.to_str().unwrap()]);
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
}

#[test]
fn a_specifier_on_a_skill_tool_matches_its_arguments() {
    let daemon = start_with(
        "[permissions]\nmode = \"bypass\"\ndeny = [\"say(text=*secret*)\"]\n",
        |dir| {
            let skills = dir.join("config-home/toolgate/skills");
            std::fs::create_dir_all(&skills).unwrap();
            write_private(
                &skills.join("say.toml"),
                "name = \"say\"\ndescription = \"Echoes.\"\ncommand = [\"echo\", \"{text}\"]\n\
                 [input_schema]\ntype = \"object\"\n[input_schema.properties]\ntext = { type = \"string\", kind = \"text\" }\n",
            );
        },
    );
    let mut client = daemon.connect();
    let call = |client: &mut Client, text: &str| {
        client.result("tools/call", json!({"name": "say", "arguments": {"text": text}}))
    };
    let denied = call(&mut client, "the SECRET plan");
    assert_eq!(denied["error_type"], "permission_denied", "{denied}");
    let allowed = call(&mut client, "hello");
    assert_eq!(allowed["ok"], true, "{allowed}");
}

#[test]
fn check_config_makes_every_check_serve_makes() {
    let dir = test_dir();
    let config = dir.path().join("config.toml");
    let missing = dir.path().join("no-such-tokens");
    write_private(
        &config,
        &format!("[server]\ntcp = \"127.0.0.1:0\"\ntoken_file = \"{}\"\n", missing.display()),
    );
    both_refuse(dir.path(), &config, &[missing.to_str().unwrap()]);
}

#[test]
fn configuration_others_can_write_is_refused() {
    let dir = test_dir();
    let config = dir.path().join("config.toml");
    write_private(&config, "[permissions]\nmode = \"bypass\"\n");
    let shown = config.to_str().unwrap();
    let chmod = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };

    chmod(&config, 0o666);
    both_refuse(dir.path(), &config, &[shown, "writable by every user", "chmod go-w"]);
    chmod(&config, 0o620);
    both_refuse(dir.path(), &config, &[shown, "writable by its group"]);
    chmod(&config, 0o600);

    // A directory on its path that others can write.
    let open_dir = dir.path().join("open");
    std::fs::create_dir(&open_dir).unwrap();
    let inside = open_dir.join("config.toml");
    write_private(&inside, "");
    chmod(&open_dir, 0o777);
    both_refuse(
        dir.path(),
        &inside,
        &[inside.to_str().unwrap(), open_dir.to_str().unwrap(), "chmod go-w"],
    );

    // The user's own config.toml, found without --config.
    let user_dir = dir.path().join("config-home/toolgate");
    std::fs::create_dir_all(&user_dir).unwrap();
    let user_config = user_dir.join("config.toml");
    write_private(&user_config, "");
    chmod(&user_config, 0o666);
    let checked = toolgate(dir.path(), &["check-config"]);
    let stderr = String::from_utf8_lossy(&checked.stderr);
    assert!(!checked.status.success(), "{stderr}");
    assert!(stderr.contains(user_config.to_str().unwrap()), "{stderr}");
    chmod(&user_config, 0o600);

    // Owned by another user: only root can set that up.
    if rustix::process::geteuid().is_root() {
        std::os::unix::fs::chown(&config, Some(65534), None).unwrap();
        both_refuse(dir.path(), &config, &[shown, "owned by uid 65534", "chown"]);
        std::os::unix::fs::chown(&config, Some(0), None).unwrap();
    } else {
        eprintln!("SKIPPED: a configuration owned by another user needs root to set up");
    }
    let checked = toolgate(dir.path(), &["check-config", "--config", shown]);
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
}

#[test]
fn skill_files_others_can_write_do_not_load() {
    let skill = "name = \"NAME\"\ndescription = \"x\"\ncommand = [\"true\"]\n[input_schema]\ntype = \"object\"\n";
    let daemon = start_with("", |dir| {
        let skills = dir.join("config-home/toolgate/skills");
        std::fs::create_dir_all(&skills).unwrap();
        write_private(&skills.join("kept.toml"), &skill.replace("NAME", "kept"));
        let writable = skills.join("writable.toml");
        write_private(&writable, &skill.replace("NAME", "writable"));
        std::fs::set_permissions(&writable, std::fs::Permissions::from_mode(0o666)).unwrap();
        let open = dir.join("open-skills");
        std::fs::create_dir(&open).unwrap();
        write_private(&open.join("in_open_dir.toml"), &skill.replace("NAME", "in_open_dir"));
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let config = dir.join("config.toml");
        write_private(
            &config,
            &format!("[skills]\ndirs = [\"{}\", \"{}\"]\n", skills.display(), open.display()),
        );
    });
    let mut client = daemon.connect();
    let listed = client.result("tools/list", json!({}));
    let names: Vec<&str> =
        listed["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"kept"), "{names:?}");
    assert!(!names.contains(&"writable") && !names.contains(&"in_open_dir"), "{names:?}");
}

#[test]
fn a_repository_planted_by_file_edits_runs_nothing_through_an_allowed_git_command() {
    let daemon =
        start("[permissions]\nmode = \"accept_edits\"\nallow = [\"run_command(git branch:*)\"]\n");
    let mut client = daemon.connect();
    let mut call = |name: &str, arguments: Value| {
        client.result("tools/call", json!({"name": name, "arguments": arguments}))
    };
    // A directory that looks like a bare repository, no `.git` in any path, whose
    // configuration names commands (a pager, a file system monitor): written by edits
    // alone, in a mode that accepts them.
    let config = "[core]\n\tpager = \"touch planted-ran; cat\"\n\
                  \tfsmonitor = \"touch planted-ran; false\"\n";
    for (path, content) in [
        ("sub/HEAD", "ref: refs/heads/main\n"),
        ("sub/config", config),
        ("sub/objects/info/.keep", ""),
        ("sub/refs/heads/.keep", ""),
    ] {
        let written = call("write_file", json!({"path": path, "content": content}));
        assert_eq!(written["ok"], json!(true), "{path}: {written}");
    }
    // An allowed git command on a terminal (where git pages its output) in it.
    let branch = call("run_command", json!({"command": "git branch", "cwd": "sub", "tty": true}));
    assert!(branch["error_type"] != json!("permission_denied"), "{branch}");
    assert!(!daemon.path("workspace/sub/planted-ran").exists(), "the planted pager ran: {branch}");
    assert!(!daemon.path("workspace/planted-ran").exists(), "the planted pager ran: {branch}");

    // A `.git` file pointing at a planted directory is an edit of git's files.
    let gitfile = call("write_file", json!({"path": "other/.git", "content": "gitdir: ../sub\n"}));
    assert_eq!(gitfile["ok"], json!(false), "{gitfile}");
    assert!(!daemon.path("workspace/other/.git").exists());
}

/// accept_edits with a `deny` list of the user's own: the `deny` list of the built-in
/// defaults is replaced, and the protection of git's files must hold all the same.
const OWN_DENY_LIST: &str =
    "[permissions]\nmode = \"accept_edits\"\ndeny = [\"run_command(rm:*)\"]\n";

/// `workspace/sub/.git/config`: a nested repository's configuration.
fn nested_repository(dir: &Path) {
    let git = dir.join("workspace/sub/.git");
    std::fs::create_dir_all(&git).unwrap();
    std::fs::write(git.join("config"), "[core]\n\tbare = false\n").unwrap();
}

/// Tries write_file, edit_file and apply_patch on `sub/.git/config` (`config` on
/// disk), each on the file as [`nested_repository`] made it and after reading it;
/// returns the three results.
fn edit_git_config(client: &mut Client, config: &Path) -> Vec<Value> {
    let planted = "[core]\n\tfsmonitor = \"touch planted-ran; false\"\n";
    let mut call = |name: &str, arguments: Value| {
        std::fs::write(config, "[core]\n\tbare = false\n").unwrap();
        let read = client.result(
            "tools/call",
            json!({"name": "read_file", "arguments": {"path": "sub/.git/config"}}),
        );
        assert_eq!(read["ok"], true, "{read}");
        client.result("tools/call", json!({"name": name, "arguments": arguments}))
    };
    let patch = "*** Begin Patch\n*** Update File: sub/.git/config\n@@\n-\tbare = false\n\
                 +\tfsmonitor = \"touch planted-ran; false\"\n*** End Patch\n";
    vec![
        call("write_file", json!({"path": "sub/.git/config", "content": planted})),
        call(
            "edit_file",
            json!({"path": "sub/.git/config", "old_string": "bare = false",
                   "new_string": "fsmonitor = \"touch planted-ran; false\""}),
        ),
        call("apply_patch", json!({"patch": patch})),
    ]
}

#[test]
fn git_files_stay_protected_when_the_deny_list_is_replaced() {
    let daemon = start_with(OWN_DENY_LIST, nested_repository);
    let mut client = daemon.connect();
    for (tool, result) in ["write_file", "edit_file", "apply_patch"]
        .iter()
        .zip(edit_git_config(&mut client, &daemon.path("workspace/sub/.git/config")))
    {
        assert_eq!(result["error_type"], "permission_denied", "{tool}: {result}");
    }
    let config = std::fs::read_to_string(daemon.path("workspace/sub/.git/config")).unwrap();
    assert_eq!(config, "[core]\n\tbare = false\n");
    // Through a symlink, and as a `.git` file planted beside a directory.
    symlink("sub/.git", &daemon.path("workspace/gitlink"));
    // (On the resolved path the file layer refuses: access_denied, naming the rule.)
    for (path, refusal) in
        [("gitlink/config", "access_denied"), ("other/.git", "permission_denied")]
    {
        let refused = client.result(
            "tools/call",
            json!({"name": "write_file", "arguments": {"path": path, "content": "gitdir: ../sub\n"}}),
        );
        assert_eq!(refused["error_type"], refusal, "{path}: {refused}");
        assert!(refused.to_string().contains("Edit(**/.git/**)"), "{path}: {refused}");
    }
    assert!(!daemon.path("workspace/other/.git").exists());
    let config = std::fs::read_to_string(daemon.path("workspace/sub/.git/config")).unwrap();
    assert_eq!(config, "[core]\n\tbare = false\n");
    // Other edits in the same mode still run without asking.
    let other = client.result(
        "tools/call",
        json!({"name": "write_file", "arguments": {"path": "sub/notes.txt", "content": "x"}}),
    );
    assert_eq!(other["ok"], true, "{other}");
}

#[test]
fn a_named_switch_turns_the_git_protection_off() {
    let config = format!("{OWN_DENY_LIST}unprotect = [\"git\"]\n");
    let daemon = start_with(&config, nested_repository);
    let mut client = daemon.connect();
    for (tool, result) in ["write_file", "edit_file", "apply_patch"]
        .iter()
        .zip(edit_git_config(&mut client, &daemon.path("workspace/sub/.git/config")))
    {
        assert_eq!(result["ok"], true, "{tool}: {result}");
    }
}

#[test]
fn check_config_lists_the_protections_in_force() {
    let dir = test_dir();
    let config = dir.path().join("config.toml");
    write_private(&config, OWN_DENY_LIST);
    let checked = toolgate(dir.path(), &["check-config", "--config", config.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
    assert!(stdout.contains("# built-in protections in force"), "{stdout}");
    assert!(stdout.lines().any(|line| line.starts_with("#   git: Edit(**/.git/**)")), "{stdout}");

    write_private(&config, &format!("{OWN_DENY_LIST}unprotect = [\"git\"]\n"));
    let checked = toolgate(dir.path(), &["check-config", "--config", config.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
    assert!(!stdout.contains("Edit(**/.git/**)"), "{stdout}");
    assert!(stdout.contains("# built-in protections in force: none"), "{stdout}");

    // A name that is no protection is an error naming the file and line.
    write_private(&config, "[permissions]\nunprotect = [\n  \"gti\",\n]\n");
    let shown = config.display().to_string();
    both_refuse(dir.path(), &config, &[&format!("{shown}:3:"), "gti", "git"]);
}

#[test]
fn a_deny_rule_on_a_git_subcommand_sees_through_global_options() {
    let daemon = start("[permissions]\nmode = \"bypass\"\ndeny = [\"run_command(git push:*)\"]\n");
    let mut client = daemon.connect();
    for command in ["git -C . push", "git --no-pager push origin", "nice -n 5 git -c k=v push"] {
        let explained = client.explain_command(command);
        assert_eq!(explained["decision"], "deny", "{command}: {explained}");
        assert_eq!(explained["explanation"]["rule"], "run_command(git push:*)", "{explained}");
    }
    // The call itself is refused before anything runs.
    let refused = client.result(
        "tools/call",
        json!({"name": "run_command", "arguments": {"command": "git -C . push; touch ran"}}),
    );
    assert_eq!(refused["error_type"], "permission_denied", "{refused}");
    assert!(!daemon.path("workspace/ran").exists());
    assert_eq!(client.explain_command("git -C . status")["decision"], "allow");
}

/// Rules that load but can never do what they look like, one a line (line numbers
/// are what the warnings must name).
const MISLEADING_RULES: &str = "[permissions]
deny = [
  \"Bash(git push)\",
  \"run_command(path=*.env)\",
  \"Edit(//etc/**)\",
  \"process_write(text=*rm*)\",
]
allow = [
  \"run_command(git status:*)\",
  \"Edit(//etc/**)\",
  \"Read(src/**)\",
  \"process_write(input=ls*)\",
  \"write_file(**/.git/**)\",
]
";

#[test]
fn check_config_warns_about_rules_that_never_do_what_they_look_like() {
    let dir = test_dir();
    let config = dir.path().join("config.toml");
    write_private(&config, MISLEADING_RULES);
    let shown = config.display().to_string();
    let checked = toolgate(dir.path(), &["check-config", "--config", config.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&checked.stderr);
    assert!(checked.status.success(), "warnings are not errors: {stderr}");
    let line = |number: usize| {
        let at = format!("{shown}:{number}:");
        stderr.lines().filter(|line| line.contains(&at)).collect::<Vec<_>>().join("\n")
    };
    for (number, needles) in [
        (
            3,
            &["warning", "[permissions] deny #1", "only the exact command", "Bash(git push:*)"][..],
        ),
        (4, &["path=*.env", "only sets a variable"]),
        (5, &["Edit(//etc/**)", "/etc", "outside every workspace root"]),
        (6, &["never applies: process_write has no argument `text`", "input"]),
        (10, &["outside every workspace root"]),
        (10, &["[permissions] deny #3", "never allows anything"]),
        (13, &["built-in protection", "never allows anything"]),
    ] {
        let found = line(number);
        for needle in needles {
            assert!(found.contains(needle), "line {number} lacks {needle:?}: {stderr}");
        }
    }
    // Rules that do what they say draw no warning.
    for number in [9, 11, 12] {
        assert!(line(number).is_empty(), "line {number}: {stderr}");
    }

    // serve starts all the same, and logs the same warnings.
    let log = dir.path().join("serve.log");
    let socket = dir.path().join("run").join("warned.sock");
    let mut serve = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["serve", "--config", config.to_str().unwrap(), "--socket"])
        .arg(&socket)
        .current_dir(dir.path().join("workspace"))
        .envs(test_env(dir.path()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let started = loop {
        if UnixStream::connect(&socket).is_ok() {
            break true;
        }
        if serve.try_wait().unwrap().is_some() || Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = serve.kill();
    let _ = serve.wait();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(started, "serve did not start: {logged}");
    assert!(
        logged.contains(&format!("{shown}:3:")) && logged.contains("only the exact command"),
        "{logged}"
    );
    assert!(logged.contains(&format!("{shown}:13:")), "{logged}");

    // A configuration without such rules draws none.
    write_private(&config, OWN_DENY_LIST);
    let checked = toolgate(dir.path(), &["check-config", "--config", config.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&checked.stderr);
    assert!(checked.status.success() && !stderr.contains("warning"), "{stderr}");
}

/// `explain` checks every path a file tool's call names against the roots, as the
/// tool would: `notebook_edit`'s notebook and every file of an `apply_patch` patch, as
/// well as `read_file`'s path. Outside the roots, the confinement layer denies.
#[test]
fn explain_confines_the_paths_of_every_file_tool() {
    let daemon = start("");
    let mut client = daemon.connect();
    let explain = |client: &mut Client, tool: &str, arguments: Value| {
        client.result("tools/explain", json!({"name": tool, "arguments": arguments}))
    };
    let confinement = |explained: &Value| -> Value {
        let layers = explained["layers"].as_array().unwrap();
        layers.iter().find(|layer| layer["layer"] == "confinement").cloned().unwrap_or_default()
    };
    let patch = |path: &str| format!("*** Begin Patch\n*** Add File: {path}\n+x\n*** End Patch\n");
    let outside = [
        ("notebook_edit", json!({"path": "/etc/x.ipynb", "index": 0, "source": "x"})),
        ("notebook_edit", json!({"path": "../outside/x.ipynb", "index": 0, "source": "x"})),
        ("apply_patch", json!({"patch": patch("../outside/new.txt")})),
        ("read_file", json!({"path": "/etc/passwd"})),
    ];
    for (tool, arguments) in outside {
        let explained = explain(&mut client, tool, arguments.clone());
        assert_eq!(explained["decision"], "deny", "{tool} {arguments}: {explained}");
        assert_eq!(explained["explanation"]["layer"], "confinement", "{tool}: {explained}");
        assert!(confinement(&explained).is_object(), "{tool}: {explained}");
    }
    let inside = [
        ("notebook_edit", json!({"path": "new.ipynb", "index": 0, "source": "x"}), "new.ipynb"),
        ("apply_patch", json!({"patch": patch("sub/new.txt")}), "sub/new.txt"),
    ];
    for (tool, arguments, path) in inside {
        let explained = explain(&mut client, tool, arguments);
        assert_ne!(explained["decision"], "deny", "{tool}: {explained}");
        let reason = confinement(&explained)["reason"].as_str().unwrap_or_default().to_owned();
        assert_eq!(reason, format!("the path {path} stays inside the session roots"), "{tool}");
    }
}
