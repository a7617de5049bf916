//! The `toolgate` client commands as a person or a script runs them: the real binary
//! against a real daemon on a temporary socket.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod support;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::TestDaemon;

/// A daemon whose workspace holds `hello.txt`.
fn start(config: &str) -> TestDaemon {
    TestDaemon::start_with(config, |dir| {
        std::fs::write(dir.join("workspace/hello.txt"), "hello\nworld\n").unwrap();
    })
}

/// The client commands run against a daemon.
trait Commands {
    fn run(&self, args: &[&str]) -> Output;
    fn run_with_stdin(&self, args: &[&str], stdin: &str) -> Output;
}

impl Commands for TestDaemon {
    /// Runs `toolgate ARGS --socket S` with stdout and stderr captured (so stdout is
    /// not a terminal) and stdin empty.
    fn run(&self, args: &[&str]) -> Output {
        self.run_with_stdin(args, "")
    }

    /// Runs `toolgate ARGS --socket S` with `stdin` on its standard input.
    fn run_with_stdin(&self, args: &[&str], stdin: &str) -> Output {
        let mut child = isolated(Command::new(env!("CARGO_BIN_EXE_toolgate")), self.dir.path())
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .current_dir(self.workspace())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }
}

/// No configuration, runtime directory or session of the person running the tests.
fn isolated(mut command: Command, dir: &Path) -> Command {
    command
        .env("HOME", dir)
        .env("XDG_CONFIG_HOME", dir.join("config-home"))
        .env("XDG_STATE_HOME", dir.join("state"))
        .env("XDG_RUNTIME_DIR", dir.join("run"))
        .env_remove("TOOLGATE_SESSION")
        .env_remove("NO_COLOR")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS");
    command
}

fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|err| {
        panic!(
            "stdout is not JSON ({err}): {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

const ACCEPT_EDITS: &str = "[permissions]\nmode = \"accept_edits\"\n";

#[test]
fn stdout_that_is_not_a_terminal_gets_json_and_so_does_json() {
    let daemon = start("");
    for command in
        [&["status"][..], &["list"], &["explain", "read_file", r#"{"path":"hello.txt"}"#]]
    {
        for json in [false, true] {
            let mut args = command.to_vec();
            if json {
                args.push("--json");
            }
            let output = daemon.run(&args);
            assert!(output.status.success(), "{args:?}: {output:?}");
            let value = json_of(&output);
            assert!(value.is_object(), "{args:?}: {value}");
        }
    }
    let output = daemon.run(&["call", "read_file", r#"{"path":"hello.txt"}"#]);
    assert!(output.status.success(), "{output:?}");
    let result = json_of(&output);
    assert_eq!(result["ok"], true);
    assert!(result["content"].as_str().unwrap().contains("hello"), "{result}");
    let output = daemon.run(&["call", "read_file", r#"{"path":"hello.txt"}"#, "--json"]);
    assert_eq!(json_of(&output)["ok"], true);
}

#[test]
fn call_reads_its_arguments_from_stdin_with_a_dash() {
    let daemon = start("");
    let output = daemon.run_with_stdin(&["call", "read_file", "-"], r#"{"path": "hello.txt"}"#);
    assert!(output.status.success(), "{output:?}");
    let result = json_of(&output);
    assert!(result["content"].as_str().unwrap().contains("world"), "{result}");

    let output = daemon.run_with_stdin(&["explain", "read_file", "-"], r#"{"path": "hello.txt"}"#);
    assert_eq!(json_of(&output)["decision"], "allow");

    // Not JSON on stdin: a local error (exit 2), nothing sent.
    let output = daemon.run_with_stdin(&["call", "read_file", "-"], "{not json");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("invalid JSON arguments"));
}

#[test]
fn a_named_session_lets_one_command_edit_what_another_read() {
    let daemon = start(ACCEPT_EDITS);
    let edit = r#"{"path":"hello.txt","old_string":"world","new_string":"there"}"#;

    // Without a session every command is a session of its own: the edit is stale.
    let output = daemon.run(&["call", "read_file", r#"{"path":"hello.txt"}"#]);
    assert!(output.status.success(), "{output:?}");
    let output = daemon.run(&["call", "edit_file", edit]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(json_of(&output)["error_type"], "stale_file");

    // With one name, the second process finds what the first one read.
    let output = daemon.run(&["call", "--session", "work", "read_file", r#"{"path":"hello.txt"}"#]);
    assert!(output.status.success(), "{output:?}");
    // Another name is another session.
    let output = daemon.run(&["call", "--session", "other", "edit_file", edit]);
    assert_eq!(json_of(&output)["error_type"], "stale_file");
    let output = daemon.run(&["call", "--session", "work", "edit_file", edit]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(json_of(&output)["ok"], true);
    assert_eq!(
        std::fs::read_to_string(daemon.workspace().join("hello.txt")).unwrap(),
        "hello\nthere\n"
    );

    // TOOLGATE_SESSION names it too.
    let mut command = isolated(Command::new(env!("CARGO_BIN_EXE_toolgate")), daemon.dir.path());
    let output = command
        .args([
            "call",
            "edit_file",
            r#"{"path":"hello.txt","old_string":"there","new_string":"all"}"#,
        ])
        .arg("--socket")
        .arg(&daemon.socket)
        .env("TOOLGATE_SESSION", "work")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        std::fs::read_to_string(daemon.workspace().join("hello.txt")).unwrap(),
        "hello\nall\n"
    );
}

#[test]
fn explain_refuses_what_confinement_would_refuse() {
    let daemon = start("");
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "s").unwrap();
    std::os::unix::fs::symlink(outside.path(), daemon.workspace().join("link")).unwrap();

    for path in ["/etc/passwd", "../config.toml", "link/secret", "link/new-file"] {
        let arguments = serde_json::json!({ "path": path }).to_string();
        let call = json_of(&daemon.run(&["call", "read_file", &arguments]));
        if path != "link/new-file" {
            assert_eq!(call["error_type"], "access_denied", "{path}: {call}");
        }
        let explained = json_of(&daemon.run(&["explain", "read_file", &arguments]));
        assert_eq!(explained["decision"], "deny", "{path}: {explained}");
        assert_eq!(explained["explanation"]["layer"], "confinement", "{path}: {explained}");
        let layers: Vec<&str> = explained["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|layer| layer["layer"].as_str().unwrap())
            .collect();
        assert_eq!(layers, ["mode", "confinement"], "{path}: {explained}");
    }

    // Inside the roots, even a file that does not exist yet: the permission engine
    // decides, confinement agrees.
    for (tool, arguments) in [
        ("read_file", r#"{"path":"hello.txt"}"#),
        ("find_files", r#"{"pattern":"*.txt"}"#),
        ("write_file", r#"{"path":"new/dir/file.txt","content":"x"}"#),
    ] {
        let explained = json_of(&daemon.run(&["explain", tool, arguments]));
        assert_ne!(explained["decision"], "deny", "{tool}: {explained}");
        let last = explained["layers"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["layer"], "confinement", "{tool}: {explained}");
    }
    let explained =
        json_of(&daemon.run(&["explain", "run_command", r#"{"command":"ls","cwd":"/"}"#]));
    assert_eq!(explained["decision"], "deny", "{explained}");
}

#[test]
fn completions_and_the_manual_name_every_subcommand() {
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_toolgate")).args(args).output().unwrap();
        assert!(output.status.success(), "{args:?}: {output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let subcommands = [
        "serve",
        "mcp",
        "list",
        "call",
        "status",
        "check-config",
        "doctor",
        "explain",
        "completions",
        "man",
    ];
    for shell in ["bash", "zsh", "fish"] {
        let script = run(&["completions", shell]);
        for name in subcommands {
            assert!(script.contains(name), "{shell} completions lack {name}");
        }
    }
    // roff escapes the hyphens.
    let manual = run(&["man"]).replace("\\-", "-");
    assert!(manual.contains(".TH toolgate 1"), "{manual}");
    for name in subcommands {
        assert!(manual.contains(name), "the manual lacks {name}");
    }
    let dir = tempfile::tempdir().unwrap();
    run(&["man", "--dir", dir.path().to_str().unwrap()]);
    for name in subcommands {
        let page = std::fs::read_to_string(dir.path().join(format!("toolgate-{name}.1"))).unwrap();
        assert!(page.contains(".TH"), "toolgate-{name}.1: {page}");
    }
    assert!(dir.path().join("toolgate.1").is_file());
    assert!(run(&["--help"]).contains("NO_COLOR"));
}

#[test]
fn a_grant_for_the_session_outlives_the_command_that_gave_it() {
    let daemon = start("");
    let command = serde_json::json!({"command": "echo granted"});

    let mut first = daemon.connect();
    let session = first.result("session/open", serde_json::json!({"name": "shell"}));
    let id = session["session_id"].clone();
    first.result("events/subscribe", serde_json::json!({"session_id": id}));
    let call = first.send(
        "tools/call",
        serde_json::json!({"session_id": id, "name": "run_command", "arguments": command}),
    );
    let result = loop {
        let message = first.read();
        if message["id"] == call {
            break message["result"].clone();
        }
        let event = &message["params"]["result"];
        if event["type"] == "permission_request" {
            let respond = serde_json::json!({
                "request_id": event["request_id"], "decision": "allow", "scope": "session"
            });
            first.send("permission/respond", respond);
        }
    };
    assert_eq!(result["ok"], true, "{result}");
    drop(first);

    // A later connection opening the name gets the session, with its grant: the same
    // call runs without asking (nobody could answer here).
    let mut second = daemon.connect();
    let session = second.result("session/open", serde_json::json!({"name": "shell"}));
    assert_eq!(session["session_id"], id);
    let explained = second.result(
        "tools/explain",
        serde_json::json!({"session_id": id, "name": "run_command", "arguments": command}),
    );
    assert_eq!(explained["decision"], "allow", "{explained}");
    assert_eq!(explained["explanation"]["layer"], "session_grant", "{explained}");
    let result = second.result(
        "tools/call",
        serde_json::json!({"session_id": id, "name": "run_command", "arguments": command}),
    );
    assert_eq!(result["ok"], true, "{result}");

    // Another name starts from nothing.
    let other = second.result("session/open", serde_json::json!({"name": "other"}));
    assert_ne!(other["session_id"], id);
    let explained = second.result(
        "tools/explain",
        serde_json::json!({"session_id": other["session_id"], "name": "run_command", "arguments": command}),
    );
    assert_eq!(explained["decision"], "ask", "{explained}");
}

#[test]
fn status_and_explain_say_what_the_sandbox_grants_and_what_never() {
    let daemon = start("[sandbox]\ndeny_read = [\"~/private-notes\"]\n");
    let home = daemon.dir.path().to_owned();
    for dir in [".ssh", ".cache", "private-notes"] {
        std::fs::create_dir_all(home.join(dir)).unwrap();
    }
    std::fs::write(home.join(".netrc"), "machine x password y\n").unwrap();
    let status = json_of(&daemon.run(&["status", "--json"]));
    let grants = &status["sandbox"]["grants"];
    let paths = |parts: &Value| -> Vec<String> {
        parts
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|part| {
                assert!(part["why"].as_str().is_some_and(|why| !why.is_empty()), "{part}");
                part["paths"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_owned())
            })
            .collect()
    };
    let home_text = std::fs::canonicalize(&home).unwrap().display().to_string();
    let read = paths(&grants["read"]);
    assert!(read.contains(&"/usr".to_owned()) && read.contains(&home_text), "{grants}");
    assert!(!read.iter().any(|path| path == "/dev"), "{grants}");
    let write = paths(&grants["write"]);
    assert!(write.contains(&home.join(".cache").display().to_string()), "{grants}");
    let never: Vec<&str> =
        grants["never"]["secrets"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for secret in [".ssh", ".netrc", "private-notes"] {
        let path = home.join(secret).display().to_string();
        assert!(never.contains(&path.as_str()), "{secret} not in {grants}");
    }
    // Secret locations that do not exist here are not listed as if they did.
    assert!(!never.iter().any(|path| path.ends_with(".aws")), "{grants}");

    let explained = json_of(&daemon.run(&["explain", "run_command", r#"{"command":"ls"}"#]));
    let last = explained["layers"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["layer"], "sandbox", "{explained}");
    let reason = last["reason"].as_str().unwrap();
    assert!(reason.contains(&format!("the home directory {home_text}")), "{reason}");
    assert!(reason.contains("never the secret locations"), "{reason}");
    // The sandbox decides nothing before the call: the mode does.
    assert_eq!(explained["explanation"]["layer"], "mode", "{explained}");
}

/// `toolgate doctor --host` as a person runs it, against a temporary HOME and project:
/// nothing configured is reported tool by tool (exit status 1); what `--print-config`
/// prints, put where each host reads it, is locked down (0); and a settings file that
/// turns one tool back on is named (1).
#[test]
fn doctor_reads_a_hosts_files_and_print_config_locks_it_down() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let project = dir.path().join("project");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(project.join(".claude")).unwrap();
    let doctor = |args: &[&str]| {
        let output = isolated(Command::new(env!("CARGO_BIN_EXE_toolgate")), &home)
            .arg("doctor")
            .args(args)
            .env_remove("CODEX_HOME")
            .current_dir(&project)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8(output.stdout).unwrap();
        (output.status.code(), stdout)
    };

    for host in ["claude-code", "codex"] {
        let (code, stdout) = doctor(&["--host", host]);
        assert_eq!(code, Some(1), "{host}: {stdout}");
        assert!(stdout.contains("FAIL  toolgate is not an MCP server"), "{host}: {stdout}");
        assert!(stdout.contains("is not locked down"), "{host}: {stdout}");
    }
    let (_, stdout) = doctor(&["--host", "claude-code"]);
    for tool in ["Bash", "Read", "Edit", "Write", "Glob", "Grep"] {
        assert!(stdout.contains(&format!("FAIL  {tool} is on")), "{stdout}");
    }

    // Claude Code: the printed settings and server list, where it reads them.
    let (code, printed) = doctor(&["--host", "claude-code", "--print-config"]);
    assert_eq!(code, Some(0));
    let (settings, servers) = printed
        .strip_prefix("# .claude/settings.json\n")
        .and_then(|rest| rest.split_once("# .mcp.json\n"))
        .unwrap_or_else(|| panic!("{printed}"));
    std::fs::write(project.join(".claude/settings.json"), settings).unwrap();
    std::fs::write(project.join(".mcp.json"), servers).unwrap();
    let (code, stdout) = doctor(&["--host", "claude-code"]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("ok    Bash is off"), "{stdout}");
    assert!(stdout.contains("Claude Code is locked down"), "{stdout}");
    // The same from elsewhere, naming the project.
    let (code, _) = doctor(&["--host", "claude-code", "--project", project.to_str().unwrap()]);
    assert_eq!(code, Some(0));

    // A local settings file cannot turn a tool back on, but an allow rule is named
    // when a deny is missing: drop Bash from the project's deny list.
    let mut value: Value = serde_json::from_str(settings).unwrap();
    value["permissions"]["deny"].as_array_mut().unwrap().retain(|tool| tool != "Bash");
    std::fs::write(project.join(".claude/settings.json"), value.to_string()).unwrap();
    std::fs::write(
        project.join(".claude/settings.local.json"),
        r#"{"permissions": {"allow": ["Bash(make:*)"]}}"#,
    )
    .unwrap();
    let (code, stdout) = doctor(&["--host", "claude-code"]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("FAIL  Bash is on, and allowed in"), "{stdout}");
    assert!(stdout.contains("settings.local.json"), "{stdout}");

    // Codex: ~/.codex/config.toml as printed.
    let (_, printed) = doctor(&["--host", "codex", "--print-config"]);
    std::fs::create_dir_all(home.join(".codex")).unwrap();
    std::fs::write(home.join(".codex/config.toml"), &printed).unwrap();
    let (code, stdout) = doctor(&["--host", "codex"]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("ok    shell_tool is off"), "{stdout}");
    // A trusted project's file that turns the shell back on is the one that counts.
    std::fs::create_dir_all(project.join(".codex")).unwrap();
    std::fs::write(project.join(".codex/config.toml"), "[features]\nshell_tool = true\n").unwrap();
    let (code, stdout) = doctor(&["--host", "codex"]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("FAIL  shell_tool is on: features.shell_tool = true"), "{stdout}");
}

/// Runs `toolgate ARGS` isolated in `dir` with stdin empty and waits for it to end
/// (a daemon that starts instead of refusing is killed, and the test fails).
fn run_to_end(dir: &Path, args: &[&str]) -> Output {
    let mut child = isolated(Command::new(env!("CARGO_BIN_EXE_toolgate")), dir)
        .args(args)
        .current_dir(dir)
        .env("TOOLGATE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!("toolgate {args:?} kept running: {}", String::from_utf8_lossy(&output.stderr));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// A configuration whose hook names a script that is not there (or cannot be run) is
/// refused by `check-config`, `serve` and `mcp`, naming the file, the hook and the
/// script; once the script is there and executable, all of them accept it.
#[test]
fn a_hook_whose_program_cannot_run_is_refused_until_it_can() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[workspace]\nroots = [{:?}]\n\n[[hooks.pre_tool_use]]\nmatcher = \"Bash\"\n\
             command = \"~/.config/toolgate/hooks/check-command.sh\"\n",
            workspace.display().to_string()
        ),
    )
    .unwrap();
    let config_arg = config.to_str().unwrap();
    let socket = dir.path().join("run").join("toolgate.sock");
    let socket_arg = socket.to_str().unwrap();
    let script = dir.path().join(".config/toolgate/hooks/check-command.sh");
    let refused = |why: &str| {
        let check = run_to_end(dir.path(), &["check-config", "--config", config_arg]);
        let stderr = String::from_utf8_lossy(&check.stderr);
        assert!(!check.status.success(), "check-config accepted it: {stderr}");
        for part in [config_arg, "hooks.pre_tool_use", "check-command.sh", why] {
            assert!(stderr.contains(part), "check-config does not say {part:?}: {stderr}");
        }
        for args in [
            &["serve", "--config", config_arg, "--socket", socket_arg][..],
            &["mcp", "--config", config_arg],
        ] {
            let run = run_to_end(dir.path(), args);
            let stderr = String::from_utf8_lossy(&run.stderr);
            assert!(!run.status.success(), "{args:?} started: {stderr}");
            assert!(stderr.contains("check-command.sh"), "{args:?}: {stderr}");
            assert!(stderr.contains(why), "{args:?}: {stderr}");
        }
        assert!(!socket.exists(), "serve listened");
    };
    refused("does not exist");

    std::fs::create_dir_all(script.parent().unwrap()).unwrap();
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    refused("not executable");

    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let check = run_to_end(dir.path(), &["check-config", "--config", config_arg]);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let mut daemon = isolated(Command::new(env!("CARGO_BIN_EXE_toolgate")), dir.path())
        .args(["serve", "--config", config_arg, "--socket", socket_arg])
        .current_dir(&workspace)
        .env("TOOLGATE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let listening = loop {
        if UnixStream::connect(&socket).is_ok() {
            break true;
        }
        if daemon.try_wait().unwrap().is_some() || Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert!(listening, "serve did not start with the script in place");
}

/// `explain` names every hook that would run for the call, first, as a call meets
/// them, and says their answer is known only when the call runs: it runs none of them.
#[test]
fn explain_lists_the_hooks_a_call_would_run() {
    let daemon = start(
        "[permissions]\nallow = [\"run_command(git status:*)\"]\n\n\
         [[hooks.pre_tool_use]]\nmatcher = \"Bash\"\ncommand = \"touch pre-hook-ran\"\n\n\
         [[hooks.pre_tool_use]]\nmatcher = \"read_file\"\ncommand = \"touch other-hook-ran\"\n\n\
         [[hooks.post_tool_use]]\ncommand = \"true\"\n",
    );
    let explained =
        json_of(&daemon.run(&["explain", "run_command", r#"{"command":"git status"}"#]));
    assert_eq!(explained["decision"], "allow", "{explained}");
    let layers = explained["layers"].as_array().unwrap();
    let hooks: Vec<&str> = layers
        .iter()
        .filter(|layer| layer["layer"] == "hook")
        .map(|layer| layer["reason"].as_str().unwrap())
        .collect();
    assert_eq!(hooks.len(), 2, "{explained}");
    assert_eq!(layers[0]["layer"], "hook", "{explained}");
    assert!(hooks[0].contains("pre_tool_use hook #1 `touch pre-hook-ran`"), "{}", hooks[0]);
    assert!(hooks[0].contains("known only when the call runs"), "{}", hooks[0]);
    assert!(hooks[1].contains("post_tool_use hook #1 `true`"), "{}", hooks[1]);
    assert!(!daemon.workspace().join("pre-hook-ran").exists(), "explain ran the hook");

    // The call itself runs the hook explain named, and not the other.
    let call = json_of(&daemon.run(&["call", "run_command", r#"{"command":"git status"}"#]));
    assert_eq!(call["tool"], "run_command", "{call}");
    assert!(daemon.workspace().join("pre-hook-ran").exists(), "the call did not run the hook");
    assert!(!daemon.workspace().join("other-hook-ran").exists());
}

/// A reload whose hook cannot run is refused like a start: the daemon logs why, naming
/// the hook's script, and keeps the configuration it runs (no hook appears).
#[test]
fn a_reload_with_a_hook_that_cannot_run_keeps_the_running_configuration() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    let config = dir.path().join("config.toml");
    let base = format!("[workspace]\nroots = [{:?}]\n", workspace.display().to_string());
    std::fs::write(&config, &base).unwrap();
    let socket = dir.path().join("run").join("toolgate.sock");
    let mut daemon = isolated(Command::new(env!("CARGO_BIN_EXE_toolgate")), dir.path())
        .args(["serve", "--socket"])
        .arg(&socket)
        .arg("--config")
        .arg(&config)
        .current_dir(&workspace)
        .env("TOOLGATE_LOG", "info")
        .env("TOOLGATE_LOG_FORMAT", "text")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, received) = std::sync::mpsc::channel();
    let stderr = daemon.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(&socket).is_err() {
        if Instant::now() > deadline || daemon.try_wait().unwrap().is_some() {
            let _ = daemon.kill();
            let _ = daemon.wait();
            panic!("the daemon did not listen");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::write(
        &config,
        format!(
            "{base}\n[[hooks.pre_tool_use]]\nmatcher = \"Bash\"\n\
             command = \"~/.config/toolgate/hooks/check-command.sh\"\n"
        ),
    )
    .unwrap();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(daemon.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let reloaded = loop {
        match received.recv_timeout(Duration::from_secs(20)) {
            Ok(line) if line.contains("reload") => break Ok(line),
            Ok(_) => {}
            Err(err) => break Err(err),
        }
    };
    // The running configuration has no hook: explain lists none.
    let mut explain = isolated(Command::new(env!("CARGO_BIN_EXE_toolgate")), dir.path());
    let explained = explain
        .args(["explain", "run_command", r#"{"command":"git status"}"#, "--socket"])
        .arg(&socket)
        .current_dir(&workspace)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = daemon.kill();
    let _ = daemon.wait();
    let reloaded = reloaded.expect("the daemon logged nothing about the reload");
    assert!(reloaded.contains("keeping the running configuration"), "{reloaded}");
    assert!(reloaded.contains("check-command.sh"), "{reloaded}");
    assert!(reloaded.contains("does not exist"), "{reloaded}");
    let explained = json_of(&explained);
    let layers = explained["layers"].as_array().unwrap();
    assert!(layers.iter().all(|layer| layer["layer"] != "hook"), "{explained}");
}

/// A pseudo-terminal for a person at the keyboard: its master (what the person sees
/// and types) and the path of its device.
fn pseudo_terminal() -> (std::os::fd::OwnedFd, PathBuf) {
    use rustix::pty::OpenptFlags;
    let master = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
    rustix::pty::grantpt(&master).unwrap();
    rustix::pty::unlockpt(&master).unwrap();
    let name = rustix::pty::ptsname(&master, Vec::new()).unwrap();
    (master, PathBuf::from(name.to_string_lossy().into_owned()))
}

/// A `toolgate` command run in a session of its own whose controlling terminal is a
/// pseudo-terminal (`setsid --ctty`: its stdin and stderr are that terminal, unless
/// `script` pipes something else into stdin); stdout is captured.
struct AtTerminal {
    child: Option<Child>,
    master: std::os::fd::OwnedFd,
    seen: Vec<u8>,
}

impl AtTerminal {
    /// Runs `sh -c script` at a terminal; `$TOOLGATE` is the binary, `$SOCKET` the
    /// daemon's socket.
    fn start(daemon: &TestDaemon, script: &str, env: &[(&str, &str)]) -> AtTerminal {
        let (master, device) = pseudo_terminal();
        let terminal = std::fs::File::options().read(true).write(true).open(&device).unwrap();
        let mut command = isolated(Command::new("setsid"), daemon.dir.path());
        command
            .args(["--ctty", "--wait", "sh", "-c", script])
            .env("TOOLGATE", env!("CARGO_BIN_EXE_toolgate"))
            .env("SOCKET", &daemon.socket)
            .current_dir(daemon.workspace())
            .stderr(terminal.try_clone().unwrap())
            .stdin(terminal)
            .stdout(Stdio::piped());
        for (name, value) in env {
            command.env(name, value);
        }
        AtTerminal { child: Some(command.spawn().unwrap()), master, seen: Vec::new() }
    }

    /// Reads what the terminal shows until `text` appears; all of it shown so far.
    fn wait_for(&mut self, text: &str) -> String {
        use std::os::fd::AsFd;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let shown = String::from_utf8_lossy(&self.seen).into_owned();
            if shown.contains(text) {
                return shown;
            }
            assert!(Instant::now() < deadline, "the terminal never showed {text:?}: {shown}");
            let mut fds =
                [nix::poll::PollFd::new(self.master.as_fd(), nix::poll::PollFlags::POLLIN)];
            if matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(1000u16)), Ok(n) if n > 0)
            {
                let mut buffer = [0u8; 4096];
                match rustix::io::read(&self.master, &mut buffer) {
                    Ok(n) if n > 0 => self.seen.extend_from_slice(&buffer[..n]),
                    _ => panic!("the terminal closed before showing {text:?}: {shown}"),
                }
            }
        }
    }

    /// Types a line.
    fn type_line(&self, line: &str) {
        rustix::io::write(&self.master, format!("{line}\n").as_bytes()).unwrap();
    }

    fn finish(mut self) -> Output {
        self.child.take().unwrap().wait_with_output().unwrap()
    }
}

impl Drop for AtTerminal {
    /// A test that failed leaves no command waiting for an answer.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `toolgate ARGS --socket S` with `stdin` piped in, in a session of its own
/// without a controlling terminal: nobody at all can be asked.
fn run_without_terminal(daemon: &TestDaemon, args: &[&str], stdin: &str) -> Output {
    let mut child = isolated(Command::new("setsid"), daemon.dir.path())
        .arg("--wait")
        .arg(env!("CARGO_BIN_EXE_toolgate"))
        .args(args)
        .arg("--socket")
        .arg(&daemon.socket)
        .current_dir(daemon.workspace())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// Arguments on stdin leave the terminal free for the question: it is asked on the
/// controlling terminal, and the answer typed there is the one that counts. Without
/// any terminal the call is denied, saying why and what would allow it.
#[test]
fn arguments_from_stdin_are_approved_on_the_controlling_terminal() {
    let daemon = start("");
    let mut person = AtTerminal::start(
        &daemon,
        r#"printf '%s' "$ARGS" | exec "$TOOLGATE" call run_command - --socket "$SOCKET""#,
        &[("ARGS", r#"{"command": "touch made-at-the-terminal"}"#)],
    );
    let shown = person.wait_for("Allow?");
    assert!(shown.contains("touch made-at-the-terminal"), "{shown}");
    person.type_line("y");
    let output = person.finish();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(json_of(&output)["ok"], true);
    assert!(daemon.workspace().join("made-at-the-terminal").exists());

    let output = run_without_terminal(
        &daemon,
        &["call", "run_command", "-"],
        r#"{"command": "touch made-without-a-terminal"}"#,
    );
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let result = json_of(&output);
    assert_eq!(result["error_type"], "permission_denied", "{result}");
    let error = result["error"].as_str().unwrap();
    for part in
        ["no terminal to ask on", "[permissions] allow", "run_command(touch", "[permissions] mode"]
    {
        assert!(error.contains(part), "{part:?} not in {error}");
    }
    assert!(!daemon.workspace().join("made-without-a-terminal").exists());
}

/// "Always this session" is offered only where the session outlives the command: a
/// named one.
#[test]
fn always_this_session_is_offered_only_for_a_named_session() {
    let daemon = start("");
    let script =
        r#"exec "$TOOLGATE" call run_command '{"command": "touch once"}' --socket "$SOCKET""#;
    let mut person = AtTerminal::start(&daemon, script, &[]);
    let shown = person.wait_for("Allow?");
    let prompt = shown.lines().last().unwrap().to_owned();
    assert!(!prompt.contains("always"), "{prompt}");
    assert!(shown.contains("--session NAME"), "{shown}");
    person.type_line("a");
    let output = person.finish();
    // "a" is no answer here: the call is denied.
    assert_eq!(json_of(&output)["error_type"], "permission_denied", "{output:?}");
    assert!(!daemon.workspace().join("once").exists());

    let mut person = AtTerminal::start(&daemon, script, &[("TOOLGATE_SESSION", "kept")]);
    let shown = person.wait_for("Allow?");
    assert!(shown.lines().last().unwrap().contains("[a]lways this session"), "{shown}");
    person.type_line("a");
    let output = person.finish();
    assert!(output.status.success(), "{output:?}");
    assert!(daemon.workspace().join("once").exists());
}

/// `process kill` of a process the session started does not ask again (its start was
/// approved); one that names no process of the session fails as not found, asking
/// nobody, whatever the terminal.
#[test]
fn killing_a_process_asks_nobody_and_an_unknown_one_is_not_found() {
    let daemon = start("[permissions]\nallow = [\"run_command(sleep:*)\"]\n");
    let start = r#"{"command": "sleep 1000", "background": true}"#;
    let output =
        run_without_terminal(&daemon, &["call", "--session", "work", "run_command", start], "");
    assert!(output.status.success(), "{output:?}");
    let id = json_of(&output)["metadata"]["process_id"].as_str().unwrap().to_owned();

    let output =
        run_without_terminal(&daemon, &["process", "kill", "p99", "--session", "work"], "");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(json_of(&output)["error_type"], "not_found", "{output:?}");
    let explained =
        json_of(&daemon.run(&["explain", "process_kill", r#"{"id": "p99"}"#, "--session", "work"]));
    assert_eq!(explained["decision"], "allow", "{explained}");

    let output = run_without_terminal(&daemon, &["process", "kill", &id, "--session", "work"], "");
    assert!(output.status.success(), "{output:?}");
    let result = json_of(&output);
    assert_eq!(result["metadata"]["running"], false, "{result}");
}

/// A relative path that is not there: the error names the absolute path looked for.
#[test]
fn a_missing_relative_path_names_where_it_was_looked_for() {
    let daemon = start(ACCEPT_EDITS);
    let workspace = std::fs::canonicalize(daemon.workspace()).unwrap();
    for (tool, arguments) in [
        ("read_file", r#"{"path": "no-such-dir/notes.txt"}"#),
        ("find_files", r#"{"pattern": "*", "path": "no-such-dir"}"#),
        ("edit_file", r#"{"path": "no-such-dir", "old_string": "a", "new_string": "b"}"#),
        ("notebook_edit", r#"{"path": "no-such-dir.ipynb", "index": 0, "source": "x"}"#),
    ] {
        let result = json_of(&daemon.run(&["call", tool, arguments]));
        assert_eq!(result["error_type"], "not_found", "{result}");
        let error = result["error"].as_str().unwrap();
        let name = if tool == "notebook_edit" { "no-such-dir.ipynb" } else { "no-such-dir" };
        let looked = workspace.join(name).display().to_string();
        assert!(error.contains(&looked), "{tool}: {looked} not in {error}");
    }
}

/// An error's code and its message do not say the same thing twice, on the terminal
/// or in the JSON; a misspelled tool or argument name gets the likely one meant.
#[test]
fn errors_say_things_once_and_suggest_what_was_meant() {
    let daemon = start("");
    for (tool, arguments, code) in [
        ("read_file", r#"{"path": "/etc/passwd"}"#, "access_denied"),
        ("read_file", r#"{"path": "gone.txt"}"#, "not_found"),
        ("read_file", r#"{"path": 5}"#, "invalid_arguments"),
    ] {
        let result = json_of(&daemon.run(&["call", tool, arguments]));
        assert_eq!(result["error_type"], code, "{result}");
        let error = result["error"].as_str().unwrap().to_lowercase();
        let words = code.replace('_', " ");
        assert!(!error.contains(&words), "{code}: {error}");
    }

    let result = json_of(&daemon.run(&["call", "raed_file", r#"{"path": "hello.txt"}"#]));
    assert_eq!(result["error_type"], "unknown_tool", "{result}");
    let error = result["error"].as_str().unwrap();
    assert!(error.contains(r#"did you mean "read_file""#), "{error}");
    assert!(!error.to_lowercase().contains("unknown tool"), "{error}");

    let result = json_of(&daemon.run(&["call", "read_file", r#"{"pth": "hello.txt"}"#]));
    assert_eq!(result["error_type"], "invalid_arguments", "{result}");
    let error = result["error"].as_str().unwrap();
    assert!(error.contains(r#"did you mean "path" for "pth""#), "{error}");

    // Nothing near: no guess.
    let result = json_of(&daemon.run(&["call", "zzzzzzzz", "{}"]));
    assert!(!result["error"].as_str().unwrap().contains("did you mean"), "{result}");
}

/// `explain` of an unknown tool fails as a call of it does.
#[test]
fn explaining_an_unknown_tool_exits_as_calling_it_does() {
    let daemon = start("");
    let call = daemon.run(&["call", "no_such_tool", "{}"]);
    let explain = daemon.run(&["explain", "no_such_tool", "{}"]);
    assert_eq!(json_of(&explain)["decision"], "unknown_tool");
    assert_ne!(call.status.code(), Some(0), "{call:?}");
    assert_eq!(explain.status.code(), call.status.code(), "{explain:?}");
    assert!(daemon.run(&["explain", "read_file", r#"{"path": "hello.txt"}"#]).status.success());
}

/// `list` on a terminal fits the width it is given (`COLUMNS` on a terminal that does
/// not say its own), and names the system tools as such.
#[test]
fn list_on_a_terminal_wraps_to_its_width() {
    let daemon = start("");
    let script =
        r#""$TOOLGATE" list --socket "$SOCKET" >/dev/tty; printf '\nEND-OF-LIST\n' >/dev/tty"#;
    let mut person = AtTerminal::start(&daemon, script, &[("COLUMNS", "60"), ("NO_COLOR", "1")]);
    let shown = person.wait_for("END-OF-LIST");
    let output = person.finish();
    assert!(output.status.success(), "{output:?}");
    let lines: Vec<&str> = shown.lines().map(|line| line.trim_end_matches('\r')).collect();
    let listing: Vec<&str> = lines.iter().copied().take_while(|line| !line.is_empty()).collect();
    assert!(listing.len() > 14, "{shown}");
    for line in &listing {
        assert!(line.chars().count() <= 60, "wider than 60: {line:?}");
    }
    // A long description goes on under itself.
    assert!(listing.iter().any(|line| line.starts_with(&" ".repeat(30))), "{shown}");
    for tool in ["exit_plan_mode", "todo_write"] {
        let row = listing.iter().find(|line| line.starts_with(tool)).unwrap();
        assert_eq!(row.split_whitespace().nth(1), Some("system"), "{row}");
    }
    let row = listing.iter().find(|line| line.starts_with("read_file ")).unwrap();
    assert_eq!(row.split_whitespace().nth(1), Some("read_only"), "{row}");
}

/// `status` on a terminal shows what the daemon listens on, the roots, the mode and
/// whether the sandbox is enforced with what it grants; the JSON carries them too.
#[test]
fn status_on_a_terminal_shows_listeners_roots_mode_and_sandbox() {
    let daemon = start(ACCEPT_EDITS);
    let workspace = std::fs::canonicalize(daemon.workspace()).unwrap().display().to_string();
    let socket = daemon.socket.display().to_string();
    let status = json_of(&daemon.run(&["status"]));
    assert_eq!(status["mode"], "accept_edits", "{status}");
    assert_eq!(status["roots"], serde_json::json!([workspace]), "{status}");
    assert_eq!(status["listeners"], serde_json::json!([{"kind": "unix", "address": socket}]));

    let script =
        r#""$TOOLGATE" status --socket "$SOCKET" >/dev/tty; printf '\nEND-OF-STATUS\n' >/dev/tty"#;
    let mut person = AtTerminal::start(&daemon, script, &[("NO_COLOR", "1")]);
    let shown = person.wait_for("END-OF-STATUS");
    assert!(person.finish().status.success());
    let rows: Vec<&str> = shown.lines().map(|line| line.trim_end_matches('\r')).collect();
    let row = |key: &str| {
        rows.iter()
            .find(|row| row.split_whitespace().next() == Some(key))
            .unwrap_or_else(|| panic!("no {key} row: {shown}"))
            .split_once(' ')
            .unwrap()
            .1
            .trim()
            .to_owned()
    };
    assert_eq!(row("listening"), format!("unix {socket}"));
    assert_eq!(row("roots"), workspace);
    assert_eq!(row("mode"), "accept_edits");
    let sandbox = row("sandbox");
    assert!(
        sandbox.starts_with("enforced: ") || sandbox.starts_with("not enforced: "),
        "{sandbox}"
    );
    for key in ["reads", "writes", "never"] {
        assert!(!row(key).is_empty(), "{shown}");
    }
}

/// A value of the wrong type in the configuration is named in plain words, with the
/// file and line, by `check-config` and by `serve`.
#[test]
fn configuration_type_errors_read_in_plain_words() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolgate.toml");
    for (text, said) in [
        (
            "# limits\n[server]\nmax_connections = \"10\"\n",
            r#"toolgate.toml:3:1: [server] max_connections must be a whole number, not the text "10""#,
        ),
        (
            "[permissions]\nmode = 3\n",
            "toolgate.toml:2:1: [permissions] mode must be text in quotes, not the number 3",
        ),
        (
            "[limits]\ndefault_timeout_ms = true\n",
            "toolgate.toml:2:1: [limits] default_timeout_ms must be a whole number, not true",
        ),
    ] {
        std::fs::write(&config, text).unwrap();
        let config_arg = config.to_str().unwrap();
        let socket = dir.path().join("run").join("toolgate.sock");
        for args in [
            &["check-config", "--config", config_arg][..],
            &["serve", "--config", config_arg, "--socket", socket.to_str().unwrap()],
        ] {
            let output = run_to_end(dir.path(), args);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(stderr.contains(said), "{args:?}: {said:?} not in {stderr}");
            for rust in ["invalid type", "expected", "usize", "u64", "integer `"] {
                assert!(!stderr.contains(rust), "{args:?}: {rust:?} in {stderr}");
            }
        }
    }
}

/// The manual lists the exit codes in an EXIT STATUS section of their own.
#[test]
fn the_manual_has_an_exit_status_section() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_toolgate")).arg("man").output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let printed = String::from_utf8(output.stdout).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["man", "--dir"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let written = std::fs::read_to_string(dir.path().join("toolgate.1")).unwrap();
    assert!(dir.path().join("toolgate-process-kill.1").is_file());
    for page in [printed, written] {
        assert!(!page.contains(".SH EXTRA"), "{page}");
        let start = page.find(".SH \"EXIT STATUS\"\n").unwrap_or_else(|| panic!("{page}"));
        let section = &page[start + 1..];
        let section = &section[..section.find("\n.SH ").unwrap_or(section.len())];
        for code in ["0", "1", "2", "141"] {
            assert!(section.contains(&format!(".TP\n\\fB{code}\\fR\n")), "{code}: {section}");
        }
        assert!(section.contains("the tool call failed"), "{section}");
    }
}

/// Shell completions offer the built-in tools' names after `call` and `explain`.
#[test]
fn completions_offer_tool_names() {
    let output = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["completions", "bash"])
        .output()
        .unwrap();
    let script = String::from_utf8(output.stdout).unwrap();
    for command in ["call", "explain"] {
        let label = format!("toolgate__subcmd__{command})");
        let start = script.find(&label).unwrap_or_else(|| panic!("no {label}: {script}"));
        let case = &script[start..];
        let case = &case[..case.find(";;").unwrap()];
        let opts = case.lines().find(|line| line.trim_start().starts_with("opts=")).unwrap();
        for tool in ["read_file", "run_command", "process_kill", "todo_write"] {
            assert!(
                opts.split(['"', ' ']).any(|word| word == tool),
                "{command}: {tool} not in {opts}"
            );
        }
    }
    // Any name still goes through: the daemon may offer tools of its upstream servers.
    let output = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["explain", "upstream__tool", "{}", "--socket", "/nonexistent/toolgate.sock"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no toolgate daemon is listening"), "{stderr}");
}
