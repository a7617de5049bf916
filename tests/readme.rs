//! README.md's examples, copied as written: every fenced block of the README is either
//! run or checked here against the real binary, or named in [`BLOCKS`] as exempt with
//! the reason. A block that is neither (one added later) fails
//! `every_block_is_checked_or_exempt`, naming its line.
//!
//! Shell examples run in bash in a fresh home directory, runtime directory and
//! workspace (a copy of README.md and a `src/main.rs`), with `cargo run --release --`
//! standing for the `toolgate` this build made, which is first on `PATH`. Where an
//! example needs a person to approve a call at the terminal, the user's
//! `config.toml` holds the allow rule that person's answer would give (the prompt
//! itself is tested in `tests/cli.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// One fenced code block of README.md.
#[derive(Debug, Clone)]
struct Block {
    /// The line of its opening fence.
    line: usize,
    lang: String,
    text: String,
}

impl Block {
    /// What names the block in [`BLOCKS`]: its first line with a letter or digit in it,
    /// trimmed (a lone `{` or `[` would not tell blocks apart).
    fn key(&self) -> &str {
        self.text
            .lines()
            .map(str::trim)
            .find(|line| line.chars().any(char::is_alphanumeric))
            .unwrap_or("")
    }
}

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap()
}

fn blocks() -> Vec<Block> {
    let text = readme();
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String, String)> = None;
    for (index, line) in text.lines().enumerate() {
        match open.take() {
            None => {
                if let Some(lang) = line.strip_prefix("```") {
                    open = Some((index + 1, lang.trim().to_owned(), String::new()));
                }
            }
            Some((start, lang, mut body)) => {
                if line.trim_start().starts_with("```") {
                    blocks.push(Block { line: start, lang, text: body });
                } else {
                    body.push_str(line);
                    body.push('\n');
                    open = Some((start, lang, body));
                }
            }
        }
    }
    assert!(open.is_none(), "README.md: a code block is not closed");
    blocks
}

/// The block of this language whose key is `key`; there must be exactly one.
fn block(lang: &str, key: &str) -> Block {
    let found: Vec<Block> =
        blocks().into_iter().filter(|block| block.lang == lang && block.key() == key).collect();
    assert_eq!(found.len(), 1, "README.md must have one `{lang}` block starting {key:?}");
    found.into_iter().next().unwrap()
}

/// How a block is dealt with.
enum How {
    /// Run or checked by the named test of this file.
    Checked(&'static str),
    /// Not run, for this reason.
    Exempt(&'static str),
}

const HOST_CLI: &str = "needs an MCP host's own CLI; tests/interop/run.sh runs it";
const CLIENT_API: &str = "checked by tests/rpc_api.rs";

/// Every fenced block of README.md, by language and key ([`Block::key`]).
const BLOCKS: &[(&str, &str, How)] = &[
    ("sh", QUICK_START, How::Checked("the_quick_start_serves_and_calls")),
    ("sh", "cargo run --release -- serve", How::Checked("the_commands_of_run_and_command_line")),
    (
        "sh",
        "cargo run --release -- list                                   # the tools",
        How::Checked("the_commands_of_run_and_command_line"),
    ),
    (
        "sh",
        "cargo install --locked --path .",
        How::Checked("the_install_commands_write_completions_and_manual_pages"),
    ),
    (
        "sh",
        "toolgate call read_file '{\"path\": \"src/main.rs\", \"limit\": 20}'",
        How::Checked("the_commands_of_run_and_command_line"),
    ),
    (
        "sh",
        "export TOOLGATE_SESSION=$$        # one session per shell",
        How::Checked("a_named_session_lets_one_command_edit_what_another_read"),
    ),
    ("sh", "./scripts/test", How::Exempt("it runs this test")),
    (
        "sh",
        "export TOOLGATE_SESSION=build",
        How::Checked("a_background_build_is_followed_from_the_command_line"),
    ),
    ("toml", "[workspace]", How::Checked("the_hook_example_is_accepted_once_its_script_exists")),
    (
        "sh",
        "mkdir -p ~/.config/toolgate/hooks",
        How::Checked("the_hook_example_is_accepted_once_its_script_exists"),
    ),
    ("toml", "deny = [", How::Checked("configuration_examples_are_valid_without_warnings")),
    ("toml", "[[mcp_servers]]", How::Checked("configuration_examples_are_valid_without_warnings")),
    ("toml", "name = \"git_log\"", How::Checked("the_skill_example_becomes_a_tool")),
    ("python", "import json, os, socket", How::Checked("the_commands_of_run_and_command_line")),
    ("toml", "[server]", How::Checked("the_tcp_example_is_valid_with_the_token_file_it_makes")),
    (
        "sh",
        "umask 077 && mkdir -p ~/.config/toolgate",
        How::Checked("the_tcp_example_is_valid_with_the_token_file_it_makes"),
    ),
    (
        "python",
        "import json, websockets.sync.client as ws   # pip install websockets",
        How::Exempt(CLIENT_API),
    ),
    ("toml", "[dependencies]", How::Exempt(CLIENT_API)),
    ("rust", "use serde_json::json;", How::Exempt(CLIENT_API)),
    (
        "sh",
        "claude mcp add toolgate -- toolgate mcp --root . --mode accept_edits",
        How::Exempt(HOST_CLI),
    ),
    (
        "json",
        "{\"mcpServers\": {\"toolgate\": {\"command\": \"toolgate\", \"args\": [\"mcp\", \"--root\", \".\", \"--mode\", \"accept_edits\"]}}}",
        How::Checked("host_configurations_start_toolgate_mcp"),
    ),
    ("toml", "[mcp_servers.toolgate]", How::Checked("host_configurations_start_toolgate_mcp")),
    (
        "sh",
        "TOKEN=$(sed -n 's/^mcp://p' \"$XDG_RUNTIME_DIR/toolgate/mcp-http-7811.tokens\")",
        How::Checked("mcp_over_http_takes_the_token_it_wrote"),
    ),
    (
        "json",
        "{\"mcpServers\": {\"toolgate\": {\"type\": \"http\", \"url\": \"http://127.0.0.1:7811/mcp\",",
        How::Checked("mcp_over_http_takes_the_token_it_wrote"),
    ),
    (
        "sh",
        "npx @modelcontextprotocol/inspector --cli http://127.0.0.1:7811/mcp --method tools/list \\",
        How::Exempt(HOST_CLI),
    ),
    (
        "json",
        "\"permissions\": {",
        How::Checked("the_lockdown_settings_are_what_doctor_prints_and_accepts"),
    ),
    (
        "toml",
        "sandbox_mode = \"read-only\"",
        How::Checked("the_lockdown_settings_are_what_doctor_prints_and_accepts"),
    ),
    (
        "json",
        "{\"permissions\": {\"allow\": [], \"deny\": [\"Read(**)\", \"Read(/**)\", \"Write(**)\", \"Write(/**)\", \"Shell(rm)\"]}}",
        How::Checked("host_configurations_start_toolgate_mcp"),
    ),
    ("json", "\"context_servers\": {", How::Checked("host_configurations_start_toolgate_mcp")),
    (
        "sh",
        "sudo install -m 0755 target/release/toolgate /usr/local/bin/toolgate",
        How::Checked("the_service_blocks_install_what_the_repository_has"),
    ),
    (
        "sh",
        "# the token the agent will present, readable by the service user alone:",
        How::Checked("the_service_blocks_install_what_the_repository_has"),
    ),
    (
        "text",
        "$ toolgate audit verify",
        How::Checked("audit_verify_names_a_broken_record_as_the_sample_shows"),
    ),
];

#[test]
fn every_block_is_checked_or_exempt() {
    let blocks = blocks();
    let mut problems = Vec::new();
    for block in &blocks {
        let matching = BLOCKS
            .iter()
            .filter(|(lang, key, _)| *lang == block.lang && *key == block.key())
            .count();
        if matching != 1 {
            problems.push(format!(
                "README.md:{}: the `{}` block starting {:?} is {} in BLOCKS of tests/readme.rs: \
                 check it there, or exempt it with the reason",
                block.line,
                block.lang,
                block.key(),
                if matching == 0 { "neither checked nor exempt" } else { "listed more than once" },
            ));
        }
    }
    for (lang, key, how) in BLOCKS {
        if !blocks.iter().any(|block| block.lang == *lang && block.key() == *key) {
            problems.push(format!(
                "BLOCKS names a `{lang}` block starting {key:?} that README.md no longer has"
            ));
        }
        if let How::Exempt(reason) = how {
            assert!(!reason.is_empty());
        }
    }
    // Every test named as checking a block exists in this file.
    let source = include_str!("readme.rs");
    for (_, _, how) in BLOCKS {
        if let How::Checked(test) = how
            && !source.contains(&format!("fn {test}()"))
        {
            problems.push(format!("BLOCKS names the test {test}, which this file does not have"));
        }
    }
    // Whatever is done with them, JSON and TOML blocks parse.
    for block in &blocks {
        let error = match block.lang.as_str() {
            "json" => serde_json::from_str::<Value>(&block.text).err().map(|err| err.to_string()),
            "toml" => toml::from_str::<toml::Table>(&block.text).err().map(|err| err.to_string()),
            _ => None,
        };
        if let Some(error) = error {
            problems.push(format!(
                "README.md:{}: the `{}` block does not parse: {error}",
                block.line, block.lang
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------
// A fresh machine: home, runtime directory, workspace.

/// A process started by a test: killed and reaped on drop, whatever the test's end.
struct Running(Child);

impl Running {
    /// Stops it as systemd or a person would (SIGTERM) and waits for its end.
    fn terminate(mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.0.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.0.wait().unwrap();
        assert!(status.success(), "it ended with {status} on SIGTERM");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Machine {
    dir: tempfile::TempDir,
}

impl Machine {
    fn new() -> Machine {
        let dir = tempfile::tempdir().unwrap();
        let machine = Machine { dir };
        for sub in ["home/.config", "home/.local/state", "home/.local/bin", "bin", "workspace/src"]
        {
            std::fs::create_dir_all(machine.path(sub)).unwrap();
        }
        std::fs::create_dir(machine.path("run")).unwrap();
        std::fs::set_permissions(machine.path("run"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_toolgate"), machine.path("bin/toolgate"))
            .unwrap();
        std::fs::write(machine.workspace().join("README.md"), readme()).unwrap();
        std::fs::write(machine.workspace().join("src/main.rs"), "fn main() {}\n").unwrap();
        machine
    }

    fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    fn home(&self) -> PathBuf {
        self.path("home")
    }

    fn config_dir(&self) -> PathBuf {
        self.path("home/.config/toolgate")
    }

    fn workspace(&self) -> PathBuf {
        self.path("workspace")
    }

    fn socket(&self) -> PathBuf {
        self.path("run/toolgate/toolgate.sock")
    }

    /// The user's own configuration file, as `serve` and `check-config` read it.
    fn write_user_config(&self, text: &str) {
        std::fs::create_dir_all(self.config_dir()).unwrap();
        std::fs::write(self.config_dir().join("config.toml"), text).unwrap();
    }

    /// `program` in the workspace, with this machine's environment and stdin empty.
    fn command(&self, program: &str) -> Command {
        let path = format!(
            "{}:{}:{}",
            self.path("home/.local/bin").display(),
            self.path("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = Command::new(program);
        command
            .current_dir(self.workspace())
            .env("PATH", path)
            .env("HOME", self.home())
            .env("XDG_CONFIG_HOME", self.path("home/.config"))
            .env("XDG_STATE_HOME", self.path("home/.local/state"))
            .env("XDG_RUNTIME_DIR", self.path("run"))
            .env("TOOLGATE_LOG", "warn")
            .env_remove("TOOLGATE_SESSION")
            .env_remove("NO_COLOR")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env_remove("CODEX_HOME")
            .stdin(Stdio::null());
        command
    }

    /// A shell script run by bash in a session of its own (no terminal to ask on).
    fn bash(&self, script: &str) -> Output {
        self.bash_in(&self.workspace(), script)
    }

    /// [`Machine::bash`] in the directory `cwd`.
    fn bash_in(&self, cwd: &Path, script: &str) -> Output {
        let mut command = self.command("setsid");
        command.current_dir(cwd);
        command.args(["--wait", "bash", "-c", script]);
        command.output().unwrap()
    }

    /// `toolgate ARGS`.
    fn toolgate(&self, args: &[&str]) -> Output {
        self.command("toolgate").args(args).output().unwrap()
    }

    /// Starts the README's daemon command (a line of a shell block) and waits until it
    /// listens on the default socket.
    fn serve(&self, line: &str) -> Running {
        let line = as_built(line);
        let mut command = self.command("bash");
        command.args(["-c", &format!("exec {line}")]).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut daemon = Running(command.spawn().unwrap());
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(self.socket()).is_err() {
            if let Some(status) = daemon.0.try_wait().unwrap() {
                let mut stderr = String::new();
                daemon.0.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
                panic!("`{line}` ended ({status}) without listening: {stderr}");
            }
            assert!(Instant::now() < deadline, "`{line}` did not start listening");
            std::thread::sleep(Duration::from_millis(10));
        }
        daemon
    }
}

/// `cargo run --release --` is the binary this build made.
fn as_built(line: &str) -> String {
    line.replace("cargo run --release -- ", "toolgate ")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// What a command line of a shell block must do.
enum Line {
    /// Exits with this status, and its stdout holds this text.
    Prints(i32, &'static str),
    /// Not run, for this reason.
    Exempt(&'static str),
    /// The daemon the test has started from this line.
    Daemon,
}

const CLI_TESTS: &str = "what the command does there is tested in tests/cli.rs";

/// Runs a shell block's command lines in one bash (so that `export` carries over), each
/// checked against `expected`, keyed by the line as the README writes it. A line
/// `expected` does not name fails the test.
fn run_lines(machine: &Machine, block: &Block, expected: &[(&str, Line)]) -> Vec<Output> {
    run_lines_in(machine, &machine.workspace(), block, expected)
}

/// [`run_lines`] in the directory `cwd`.
fn run_lines_in(
    machine: &Machine,
    cwd: &Path,
    block: &Block,
    expected: &[(&str, Line)],
) -> Vec<Output> {
    for (line, _) in expected {
        assert!(
            block.text.lines().any(|written| written == *line),
            "README.md:{}: the block no longer has the line `{line}`",
            block.line
        );
    }
    let out = tempfile::tempdir().unwrap();
    let mut script = String::from("set -u\n");
    let mut lines = Vec::new();
    for (offset, line) in block.text.lines().enumerate() {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let Some((_, check)) = expected.iter().find(|(text, _)| *text == line) else {
            panic!(
                "README.md:{}: the command `{line}` is not checked by tests/readme.rs: add it \
                 to the lines of its block",
                block.line + 1 + offset
            );
        };
        match check {
            Line::Exempt(reason) => eprintln!("not run: `{line}`: {reason}"),
            Line::Daemon => {}
            Line::Prints(..) => {
                let n = lines.len();
                let dir = out.path().display();
                script.push_str(&format!(
                    "{{ {}\n}} >{dir}/{n}.out 2>{dir}/{n}.err </dev/null; echo $? >{dir}/{n}.rc\n",
                    as_built(line)
                ));
                lines.push((block.line + 1 + offset, line, check));
            }
        }
    }
    let output = machine.bash_in(cwd, &script);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let mut outputs = Vec::new();
    for (n, (number, line, check)) in lines.into_iter().enumerate() {
        let read = |ext: &str| std::fs::read(out.path().join(format!("{n}.{ext}"))).unwrap();
        let status: i32 = text(&read("rc")).trim().parse().unwrap();
        let (stdout, stderr) = (read("out"), read("err"));
        let Line::Prints(want, needle) = check else { unreachable!() };
        assert!(
            status == *want && text(&stdout).contains(needle),
            "README.md:{number}: `{line}` exited with {status} (expected {want}), and its \
             stdout must hold {needle:?}\nstdout: {}\nstderr: {}",
            text(&stdout),
            text(&stderr)
        );
        outputs.push(Output {
            status: std::process::ExitStatus::from_raw_status(status),
            stdout,
            stderr,
        });
    }
    outputs
}

/// `ExitStatus` from a shell's `$?`.
trait FromRawStatus {
    fn from_raw_status(status: i32) -> Self;
}

impl FromRawStatus for std::process::ExitStatus {
    fn from_raw_status(status: i32) -> Self {
        use std::os::unix::process::ExitStatusExt;
        std::process::ExitStatus::from_raw(status << 8)
    }
}

// ---------------------------------------------------------------------------------------
// Run, Command line, Talking to the daemon.

/// What a person at the prompt would allow for the README's command examples.
const APPROVALS: &str = r#"[permissions]
allow = ["run_command(ls)", "run_command(cargo build:*)", "Edit(README.md)"]
"#;

#[test]
fn the_commands_of_run_and_command_line() {
    let machine = Machine::new();
    machine.write_user_config(APPROVALS);
    let serve = block("sh", "cargo run --release -- serve");
    assert_eq!(serve.text.trim(), "cargo run --release -- serve");
    let _daemon = machine.serve(serve.text.trim());

    // "No configuration file is needed": the current directory is the only root, the
    // mode is `default`.
    let effective = machine.toolgate(&["check-config"]);
    let effective: toml::Table = toml::from_str(&text(&effective.stdout)).unwrap();
    let workspace = machine.workspace().to_str().unwrap().to_owned();
    assert_eq!(effective["workspace"]["roots"], toml::Value::Array(vec![workspace.into()]));
    assert_eq!(effective["permissions"]["mode"].as_str(), Some("default"));

    // The socket the README names, only for this uid.
    let socket = machine.socket();
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&socket), 0o600);
    assert_eq!(mode(socket.parent().unwrap()), 0o700);

    run_lines(
        &machine,
        &block("sh", "cargo run --release -- list                                   # the tools"),
        &[
            (
                "cargo run --release -- list                                   # the tools",
                Line::Prints(0, "\"read_file\""),
            ),
            (
                "cargo run --release -- call read_file '{\"path\": \"README.md\", \"limit\": 5}'",
                Line::Prints(0, "1\\t# toolgate"),
            ),
            (
                "cargo run --release -- call run_command '{\"command\": \"ls\"}'   # asks you on the terminal",
                Line::Prints(0, "README.md"),
            ),
            (
                "cargo run --release -- explain run_command '{\"command\": \"git push\"}'",
                Line::Prints(0, "\"decision\": \"ask\""),
            ),
            ("cargo run --release -- status", Line::Prints(0, "\"sessions\"")),
        ],
    );

    let outputs = run_lines(
        &machine,
        &block("sh", "toolgate call read_file '{\"path\": \"src/main.rs\", \"limit\": 20}'"),
        &[
            (
                "toolgate call read_file '{\"path\": \"src/main.rs\", \"limit\": 20}'",
                Line::Prints(0, "fn main() {}"),
            ),
            (
                "echo '{\"command\": \"cargo test\"}' | toolgate call run_command -   # arguments from stdin",
                Line::Exempt(CLI_TESTS),
            ),
            ("toolgate status --json | jq .sessions", Line::Prints(0, "")),
        ],
    );
    let sessions = text(&outputs[1].stdout);
    assert!(sessions.trim().parse::<u64>().is_ok(), "jq .sessions printed {sessions:?}");

    // The editor plugin, with python3, prints the first lines of README.md.
    let plugin = block("python", "import json, os, socket");
    let output = machine.command("python3").args(["-c", &plugin.text]).output().unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let printed = text(&output.stdout);
    assert!(
        printed.contains("     1\t# toolgate\n     2\t\n     3\ttoolgate is"),
        "the editor plugin printed {printed:?}"
    );
}

const QUICK_START: &str = "cargo run --release -- serve     # builds toolgate (minutes, the first time), then runs the daemon";

#[test]
fn the_quick_start_serves_and_calls() {
    let machine = Machine::new();
    let quick = block("sh", QUICK_START);
    let _daemon = machine.serve(QUICK_START);
    run_lines(
        &machine,
        &quick,
        &[
            (QUICK_START, Line::Daemon),
            (
                "cargo run --release -- call read_file '{\"path\": \"README.md\", \"limit\": 5}'   # in another terminal, same directory",
                Line::Prints(0, "1\\t# toolgate"),
            ),
        ],
    );
}

#[test]
fn a_named_session_lets_one_command_edit_what_another_read() {
    let machine = Machine::new();
    machine.write_user_config(APPROVALS);
    let _daemon = machine.serve("toolgate serve");
    let session = block("sh", "export TOOLGATE_SESSION=$$        # one session per shell");
    let read = "toolgate call read_file '{\"path\": \"README.md\"}'";
    let edit = "toolgate call edit_file '{\"path\": \"README.md\", \"old_string\": \"teh\", \"new_string\": \"the\"}'";
    assert!(session.text.contains(read) && session.text.contains(edit));

    // Without the name, the edit is refused as the README says.
    let unnamed = machine.bash(&format!("{read} >/dev/null && {edit}"));
    assert_eq!(unnamed.status.code(), Some(1), "{}", text(&unnamed.stderr));
    assert!(
        text(&unnamed.stdout).contains("\"error_type\": \"stale_file\""),
        "{}",
        text(&unnamed.stdout)
    );

    run_lines(
        &machine,
        &session,
        &[
            ("export TOOLGATE_SESSION=$$        # one session per shell", Line::Prints(0, "")),
            (read, Line::Prints(0, "\"ok\": true")),
            (edit, Line::Prints(0, "\"ok\": true")),
        ],
    );
}

#[test]
fn a_background_build_is_followed_from_the_command_line() {
    let machine = Machine::new();
    machine.write_user_config(APPROVALS);
    // A stand-in for cargo in ~/.local/bin: the sandbox keeps commands out of the
    // toolchain of the person running the tests, whose home is not this one.
    let cargo = machine.path("home/.local/bin/cargo");
    std::fs::write(&cargo, "#!/bin/sh\necho '   Compiling example v0.1.0'\nexit 3\n").unwrap();
    std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).unwrap();
    let _daemon = machine.serve("toolgate serve");
    run_lines(
        &machine,
        &block("sh", "export TOOLGATE_SESSION=build"),
        &[
            ("export TOOLGATE_SESSION=build", Line::Prints(0, "")),
            (
                "toolgate call run_command '{\"command\": \"cargo build 2>&1\", \"background\": true}'",
                Line::Prints(
                    0,
                    "[process p1 started in the background; read its output with process_read",
                ),
            ),
            (
                "toolgate process follow p1        # streams the output until it ends; exits with its code",
                Line::Prints(3, "Compiling example v0.1.0"),
            ),
            (
                "toolgate process list             # every process of the session, running or ended",
                Line::Prints(0, "p1\\texited with code 3"),
            ),
            (
                "toolgate process kill p1          # the whole tree (or --signal INT)",
                Line::Exempt(CLI_TESTS),
            ),
        ],
    );
}

// ---------------------------------------------------------------------------------------
// Configuration.

/// `toolgate check-config` on what the machine has (and `--config FILE`): valid, and
/// no warning.
fn check_config_clean(machine: &Machine, config: Option<&str>) -> Output {
    let mut args = vec!["check-config"];
    let file = machine.path("extra.toml");
    if let Some(config) = config {
        std::fs::write(&file, config).unwrap();
        args.extend(["--config", file.to_str().unwrap()]);
    }
    let output = machine.toolgate(&args);
    assert!(
        output.status.success() && !text(&output.stderr).contains("warning"),
        "check-config of {config:?}: {}",
        text(&output.stderr)
    );
    assert!(
        text(&output.stdout).starts_with("# configuration is valid"),
        "{}",
        text(&output.stdout)
    );
    output
}

#[test]
fn configuration_examples_are_valid_without_warnings() {
    let machine = Machine::new();
    // The patterns over other tools' arguments are lists of [permissions].
    let patterns = block("toml", "deny = [");
    check_config_clean(&machine, Some(&format!("[permissions]\n{}", patterns.text)));
    check_config_clean(&machine, Some(&block("toml", "[[mcp_servers]]").text));
}

#[test]
fn the_hook_example_is_accepted_once_its_script_exists() {
    let machine = Machine::new();
    machine.write_user_config(&block("toml", "[workspace]").text);
    // Before the script exists, the configuration is refused, naming the program.
    let refused = machine.toolgate(&["check-config"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        text(&refused.stderr).contains("check-command.sh does not exist"),
        "{}",
        text(&refused.stderr)
    );

    let script = block("sh", "mkdir -p ~/.config/toolgate/hooks");
    assert!(
        script.text.ends_with("toolgate check-config           # valid once the script is there\n")
    );
    let output = machine.bash(&format!("set -e\n{}", script.text));
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).starts_with("# configuration is valid"),
        "{}",
        text(&output.stdout)
    );
    assert!(!text(&output.stderr).contains("warning"), "{}", text(&output.stderr));

    // The daemon with it: the hook refuses `rm -rf` with its message.
    let _daemon = machine.serve("toolgate serve");
    let refused = machine.toolgate(&["call", "run_command", r#"{"command": "echo rm -rf x"}"#]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stdout).contains("rm -rf is not allowed here"),
        "{}",
        text(&refused.stdout)
    );
    // Everything else goes through it: `git status`, allowed by the rules, runs.
    let ran = machine.toolgate(&["call", "run_command", r#"{"command": "git status"}"#]);
    let ran: Value = serde_json::from_slice(&ran.stdout).unwrap();
    assert!(ran["metadata"]["exit_code"].is_i64(), "git status did not run: {ran}");
}

#[test]
fn the_skill_example_becomes_a_tool() {
    let machine = Machine::new();
    let skills = machine.config_dir().join("skills");
    std::fs::create_dir_all(&skills).unwrap();
    std::fs::write(skills.join("git_log.toml"), block("toml", "name = \"git_log\"").text).unwrap();
    let _daemon = machine.serve("toolgate serve");
    let list = machine.toolgate(&["list", "--json"]);
    assert!(list.status.success(), "{}", text(&list.stderr));
    let list: Value = serde_json::from_slice(&list.stdout).unwrap();
    let source = list["sources"]["git_log"].as_str().unwrap_or_default();
    assert!(source.starts_with("skill:"), "git_log is not a skill's tool: {}", list["sources"]);
    let tool = list["tools"].as_array().unwrap().iter().find(|tool| tool["name"] == "git_log");
    // Declared in the user's own skill directory, trusted: read-only as it says.
    assert_eq!(tool.unwrap()["safety"], "read_only");
}

#[test]
fn the_tcp_example_is_valid_with_the_token_file_it_makes() {
    let machine = Machine::new();
    let tokens = block("sh", "umask 077 && mkdir -p ~/.config/toolgate");
    let output = machine.bash(&format!("set -e\n{}", tokens.text));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let file = machine.config_dir().join("tokens");
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    let server = block("toml", "[server]").text;
    check_config_clean(&machine, Some(&server));

    // The daemon with it (on a free port): nothing without the token, everything with
    // the secret that follows `ci:` in the file.
    let port = free_port();
    machine.write_user_config(&server.replace("127.0.0.1:7810", &format!("127.0.0.1:{port}")));
    let _daemon = machine.serve("toolgate serve");
    let list = r#"{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}"#;
    let denied = http_post(port, "/rpc", list, None);
    assert!(denied.starts_with("HTTP/1.1 401"), "{denied}");
    assert!(denied.contains("Authorization: Bearer <token>"), "the 401 says how: {denied}");
    // The health check the service section curls answers `ok` without a token.
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(stream, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut health = String::new();
    stream.read_to_string(&mut health).unwrap();
    assert!(health.starts_with("HTTP/1.1 200") && health.ends_with("\r\n\r\nok\n"), "{health:?}");
    let tokens = std::fs::read_to_string(&file).unwrap();
    let secret = tokens.trim().strip_prefix("ci:").unwrap();
    let accepted = http_post(port, "/rpc", list, Some(&format!("Bearer {secret}")));
    assert!(
        accepted.starts_with("HTTP/1.1 200") && accepted.contains("\"read_file\""),
        "{accepted}"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One HTTP/1.1 POST of a JSON body to loopback; the whole response.
fn http_post(port: u16, path: &str, body: &str, authorization: Option<&str>) -> String {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(authorization) = authorization {
        request.push_str(&format!("Authorization: {authorization}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

// ---------------------------------------------------------------------------------------
// MCP hosts.

/// Starts `command args` as an MCP server on stdio in the workspace, sends
/// `initialize` and returns the result.
fn mcp_initialize(machine: &Machine, command: &str, args: &[String]) -> Value {
    assert_eq!(command, "toolgate", "an MCP host starts toolgate");
    let mut child = machine.command(command);
    let log = machine.path("mcp.log");
    let stderr = std::fs::File::create(&log).unwrap();
    child.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(stderr);
    let mut server = Running(child.spawn().unwrap());
    let request = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "readme", "version": "0"}}});
    let mut stdin = server.0.stdin.take().unwrap();
    writeln!(stdin, "{request}").unwrap();
    let mut line = String::new();
    BufReader::new(server.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
    drop(stdin);
    drop(server);
    let response: Value = serde_json::from_str(&line).unwrap_or_else(|err| {
        let stderr = std::fs::read_to_string(&log).unwrap_or_default();
        panic!("`{command} {args:?}` answered {line:?} ({err}); stderr: {stderr}")
    });
    response["result"].clone()
}

fn strings(value: &Value) -> Vec<String> {
    value.as_array().unwrap().iter().map(|arg| arg.as_str().unwrap().to_owned()).collect()
}

fn json_block(key: &str) -> Value {
    let block = block("json", key);
    serde_json::from_str(&block.text)
        .unwrap_or_else(|err| panic!("README.md:{}: not JSON: {err}", block.line))
}

#[test]
fn host_configurations_start_toolgate_mcp() {
    let machine = Machine::new();
    let mut servers = Vec::new();
    let claude = json_block(
        "{\"mcpServers\": {\"toolgate\": {\"command\": \"toolgate\", \"args\": [\"mcp\", \"--root\", \".\", \"--mode\", \"accept_edits\"]}}}",
    );
    servers.push(claude["mcpServers"]["toolgate"].clone());
    let codex: toml::Table = toml::from_str(&block("toml", "[mcp_servers.toolgate]").text).unwrap();
    servers.push(serde_json::to_value(&codex["mcp_servers"]["toolgate"]).unwrap());
    let zed = json_block("\"context_servers\": {");
    servers.push(zed["context_servers"]["toolgate"].clone());
    for server in servers {
        let result = mcp_initialize(
            &machine,
            server["command"].as_str().unwrap(),
            &strings(&server["args"]),
        );
        assert_eq!(result["serverInfo"]["name"], "toolgate", "{server}: {result}");
    }
    // Zed's profile turns every context server's tools on.
    assert_eq!(zed["agent"]["profiles"]["toolgate"]["enable_all_context_servers"], true);
    assert_eq!(zed["agent"]["default_profile"], "toolgate");
    // Cursor's CLI permissions: no toolgate to start, but valid JSON with deny rules.
    let cursor = json_block(
        "{\"permissions\": {\"allow\": [], \"deny\": [\"Read(**)\", \"Read(/**)\", \"Write(**)\", \"Write(/**)\", \"Shell(rm)\"]}}",
    );
    assert!(cursor["permissions"]["deny"].as_array().is_some_and(|deny| !deny.is_empty()));
}

/// The sections of `toolgate doctor --print-config`: `# file` header, then its text.
fn printed_config(machine: &Machine, host: &str) -> BTreeMap<String, String> {
    let output = machine.toolgate(&["doctor", "--host", host, "--print-config"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let mut sections = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text(&output.stdout).lines() {
        if let Some(name) = line.strip_prefix("# ").filter(|name| name.starts_with(['.', '~'])) {
            current = Some(name.to_owned());
            sections.insert(name.to_owned(), String::new());
            continue;
        }
        if let Some(name) = &current {
            let section: &mut String = sections.get_mut(name).unwrap();
            section.push_str(line);
            section.push('\n');
        }
    }
    sections
}

#[test]
fn the_lockdown_settings_are_what_doctor_prints_and_accepts() {
    let machine = Machine::new();
    let claude_settings = json_block("\"permissions\": {");
    let mcp_json = json_block(
        "{\"mcpServers\": {\"toolgate\": {\"command\": \"toolgate\", \"args\": [\"mcp\", \"--root\", \".\", \"--mode\", \"accept_edits\"]}}}",
    );
    let printed = printed_config(&machine, "claude-code");
    let parse = |name: &str| -> Value { serde_json::from_str(&printed[name]).unwrap() };
    assert_eq!(claude_settings, parse(".claude/settings.json"));
    assert_eq!(mcp_json, parse(".mcp.json"));

    let codex_text = block("toml", "sandbox_mode = \"read-only\"").text;
    let codex: toml::Table = toml::from_str(&codex_text).unwrap();
    let printed = printed_config(&machine, "codex");
    let printed: toml::Table =
        toml::from_str(&printed["~/.codex/config.toml (or $CODEX_HOME/config.toml)"]).unwrap();
    assert_eq!(codex, printed);
    // Codex's MCP entry alone, earlier in the README, is the same entry.
    let entry: toml::Table = toml::from_str(&block("toml", "[mcp_servers.toolgate]").text).unwrap();
    assert_eq!(entry["mcp_servers"], printed["mcp_servers"]);

    // Written where the README says, doctor finds both hosts locked down.
    let workspace = machine.workspace();
    std::fs::create_dir_all(workspace.join(".claude")).unwrap();
    std::fs::write(
        workspace.join(".claude/settings.json"),
        block("json", "\"permissions\": {").text,
    )
    .unwrap();
    std::fs::write(workspace.join(".mcp.json"), block("json", "{\"mcpServers\": {\"toolgate\": {\"command\": \"toolgate\", \"args\": [\"mcp\", \"--root\", \".\", \"--mode\", \"accept_edits\"]}}}").text).unwrap();
    std::fs::create_dir_all(machine.home().join(".codex")).unwrap();
    std::fs::write(machine.home().join(".codex/config.toml"), &codex_text).unwrap();
    for host in ["claude-code", "codex"] {
        let output = machine.toolgate(&["doctor", "--host", host]);
        assert!(output.status.success(), "doctor --host {host}: {}", text(&output.stdout));
        assert!(text(&output.stdout).contains("is locked down"), "{}", text(&output.stdout));
    }
}

#[test]
fn mcp_over_http_takes_the_token_it_wrote() {
    let machine = Machine::new();
    let port = free_port();
    let mut command = machine.command("toolgate");
    command
        .args(["mcp", "--http", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut server = Running(command.spawn().unwrap());
    // It says on stderr where the token is, once it listens.
    let mut stderr = BufReader::new(server.0.stderr.take().unwrap());
    let tokens = format!("mcp-http-{port}.tokens");
    let mut said = String::new();
    while !said.contains(&tokens) {
        said.clear();
        assert!(
            stderr.read_line(&mut said).unwrap() > 0,
            "`toolgate mcp --http` ended without naming {tokens}"
        );
    }
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));

    // The README's lines, on this port.
    let token_line = block(
        "sh",
        "TOKEN=$(sed -n 's/^mcp://p' \"$XDG_RUNTIME_DIR/toolgate/mcp-http-7811.tokens\")",
    );
    let first = token_line.text.lines().next().unwrap().replace("7811", &port.to_string());
    let output = machine.bash(&format!("{first}\nprintf %s \"$TOKEN\""));
    let token = text(&output.stdout);
    assert!(token.len() >= 16, "TOKEN={token:?}: {}", text(&output.stderr));
    let file = machine.path("run/toolgate").join(&tokens);
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);

    let host = json_block(
        "{\"mcpServers\": {\"toolgate\": {\"type\": \"http\", \"url\": \"http://127.0.0.1:7811/mcp\",",
    );
    let entry = &host["mcpServers"]["toolgate"];
    assert_eq!(entry["type"], "http");
    let url = entry["url"].as_str().unwrap().replace("7811", &port.to_string());
    let header = entry["headers"]["Authorization"].as_str().unwrap().replace("<token>", &token);
    let path = url.strip_prefix(&format!("http://127.0.0.1:{port}")).unwrap();
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"readme","version":"0"}}}"#;
    let denied = http_post(port, path, initialize, None);
    assert!(denied.starts_with("HTTP/1.1 401"), "{denied}");
    let accepted = http_post(port, path, initialize, Some(&header));
    assert!(accepted.starts_with("HTTP/1.1 200"), "{accepted}");
    assert!(accepted.contains("\"serverInfo\""), "{accepted}");
    drop(server);
}

// ---------------------------------------------------------------------------------------
// Audit log.

#[test]
fn audit_verify_names_a_broken_record_as_the_sample_shows() {
    let machine = Machine::new();
    let daemon = machine.serve("toolgate serve");
    for limit in 1..=3 {
        let args = format!(r#"{{"path": "README.md", "limit": {limit}}}"#);
        assert!(machine.toolgate(&["call", "read_file", &args]).status.success());
    }
    // Records are written behind the calls; a daemon that stops writes what it holds.
    daemon.terminate();
    // The second record removed: the third no longer follows the one before it.
    let log = machine.path("home/.local/state/toolgate/audit.jsonl");
    let records = std::fs::read_to_string(&log).unwrap();
    let records: Vec<&str> = records.lines().collect();
    assert_eq!(records.len(), 3, "{records:?}");
    std::fs::write(&log, format!("{}\n{}\n", records[0], records[2])).unwrap();
    let named: Value = serde_json::from_str(records[2]).unwrap();

    let sample = block("text", "$ toolgate audit verify");
    let mut lines = sample.text.lines();
    let command = lines.next().unwrap().strip_prefix("$ ").unwrap();
    let shown = lines.next().unwrap();
    let output = machine.bash(&format!("exec {command}"));
    assert_eq!(output.status.code(), Some(1), "the README's exit status 1");
    // The sample, with this machine's file, call and time, up to where it elides.
    let expected = shown
        .replace("/home/me/.local/state/toolgate/audit.jsonl", log.to_str().unwrap())
        .replace("\"c3\"", &format!("\"{}\"", named["call_id"].as_str().unwrap()))
        .replace("2026-12-01T15:02:11.250Z", named["ts"].as_str().unwrap());
    let expected = expected.strip_suffix("…").unwrap();
    let printed = text(&output.stdout);
    // And how far the chain held, counted in words that agree with the number.
    assert!(printed.ends_with("\n1 record before it links up (1 file)\n"), "{printed}");
    // And how far the chain held, counted in words that agree with the number.
    assert!(printed.ends_with("\n1 record before it links up (1 file)\n"), "{printed}");
    assert!(
        printed.starts_with(expected),
        "README.md:{}: the sample reads\n{expected}\nbut audit verify printed\n{printed}",
        sample.line
    );
}

// ---------------------------------------------------------------------------------------
// Installing.

const INSTALL: &str = "cargo install --locked --path .";

#[test]
fn the_install_commands_write_completions_and_manual_pages() {
    let machine = Machine::new();
    let install = block("sh", INSTALL);
    let mkdir =
        "mkdir -p ~/.local/share/bash-completion/completions ~/.zfunc ~/.config/fish/completions";
    let man_dir = "sudo mkdir -p /usr/local/share/man/man1";
    let man = "sudo \"$(command -v toolgate)\" man --dir /usr/local/share/man/man1   # toolgate(1), toolgate-call(1), ...";
    let sudo =
        "with sudo it writes /usr/local; run below without sudo into a directory of the test";
    run_lines(
        &machine,
        &install,
        &[
            (
                INSTALL,
                Line::Exempt(
                    "a release build of minutes into ~/.cargo/bin; this build's toolgate is first on PATH",
                ),
            ),
            (mkdir, Line::Prints(0, "")),
            (
                "toolgate completions bash > ~/.local/share/bash-completion/completions/toolgate",
                Line::Prints(0, ""),
            ),
            (
                "toolgate completions zsh > ~/.zfunc/_toolgate     # with fpath+=(~/.zfunc) before compinit in ~/.zshrc",
                Line::Prints(0, ""),
            ),
            (
                "toolgate completions fish > ~/.config/fish/completions/toolgate.fish   # also elvish, powershell",
                Line::Prints(0, ""),
            ),
            (man_dir, Line::Exempt(sudo)),
            (man, Line::Exempt(sudo)),
        ],
    );
    for (file, mark) in [
        (".local/share/bash-completion/completions/toolgate", "complete -F _toolgate"),
        (".zfunc/_toolgate", "#compdef toolgate"),
        (".config/fish/completions/toolgate.fish", "complete -c toolgate"),
    ] {
        let script = std::fs::read_to_string(machine.home().join(file)).unwrap();
        assert!(script.contains(mark), "~/{file} is not toolgate's completion script");
    }

    // The manual pages, into a directory of the test instead of /usr/local.
    let pages = machine.path("usr-local-share/man/man1");
    let lines = [man_dir, man].map(|line| {
        line.strip_prefix("sudo ")
            .unwrap()
            .replace("/usr/local/share/man/man1", pages.to_str().unwrap())
    });
    let output = machine.bash(&format!("set -e\n{}\n{}\n", lines[0], lines[1]));
    assert!(output.status.success(), "{}", text(&output.stderr));
    for page in ["toolgate.1", "toolgate-call.1"] {
        assert!(pages.join(page).is_file(), "no {page} in {}", pages.display());
    }
}

// ---------------------------------------------------------------------------------------
// Running as a service: what needs sudo and systemd is not run; what the blocks name
// and write is checked.

#[test]
fn the_service_blocks_install_what_the_repository_has() {
    let machine = Machine::new();
    let repository = Path::new(env!("CARGO_MANIFEST_DIR"));
    let install =
        block("sh", "sudo install -m 0755 target/release/toolgate /usr/local/bin/toolgate");
    let tcp =
        block("sh", "# the token the agent will present, readable by the service user alone:");
    // Every unit and configuration file the blocks copy is in the repository.
    for block in [&install, &tcp] {
        for word in block.text.split_whitespace().filter(|word| word.starts_with("systemd/")) {
            assert!(repository.join(word).is_file(), "README.md:{}: no file {word}", block.line);
        }
    }

    // The user's units go where systemd looks for them, in a fresh home.
    let system = "installs into the system with sudo and systemd; tests/systemd_units.rs \
                  checks the units";
    run_lines_in(
        &machine,
        repository,
        &install,
        &[
            (
                "sudo install -m 0755 target/release/toolgate /usr/local/bin/toolgate",
                Line::Exempt(system),
            ),
            (
                "sudo cp systemd/toolgate.service systemd/toolgate.socket /etc/systemd/system/",
                Line::Exempt(system),
            ),
            (
                "sudo cp systemd/sysusers.d/toolgate.conf /etc/sysusers.d/ && sudo systemd-sysusers",
                Line::Exempt(system),
            ),
            (
                "sudo cp systemd/tmpfiles.d/toolgate.conf /etc/tmpfiles.d/ && sudo systemd-tmpfiles --create",
                Line::Exempt(system),
            ),
            (
                "sudo systemctl daemon-reload && sudo systemctl enable --now toolgate.socket",
                Line::Exempt(system),
            ),
            ("mkdir -p ~/.config/systemd/user", Line::Prints(0, "")),
            (
                "cp systemd/user/toolgate.service systemd/user/toolgate.socket ~/.config/systemd/user/",
                Line::Prints(0, ""),
            ),
            (
                "systemctl --user daemon-reload && systemctl --user enable --now toolgate.socket",
                Line::Exempt("needs a user's systemd; tests/systemd_units.rs checks the units"),
            ),
        ],
    );
    for unit in ["toolgate.service", "toolgate.socket"] {
        let copied = machine.home().join(".config/systemd/user").join(unit);
        assert!(copied.is_file(), "{} was not copied", copied.display());
    }

    // The token line's secret, in a file of the test: a token check-config accepts.
    let token_line = tcp.text.lines().find(|line| line.starts_with("echo \"agent:")).unwrap();
    let (echo, _) = token_line.split_once(" | sudo tee ").unwrap();
    let tokens = machine.path("tokens");
    let output = machine.bash(&format!("umask 077\n{echo} > {}", tokens.display()));
    assert!(output.status.success(), "{}", text(&output.stderr));
    // The configuration the heredoc appends, with that file for /etc/toolgate/tokens.
    let heredoc: String = tcp
        .text
        .lines()
        .skip_while(|line| !line.ends_with("<<'EOF'"))
        .skip(1)
        .take_while(|line| *line != "EOF")
        .map(|line| format!("{line}\n"))
        .collect();
    assert!(heredoc.contains("token_file = \"/etc/toolgate/tokens\""), "{heredoc}");
    let config = heredoc.replace("/etc/toolgate/tokens", tokens.to_str().unwrap());
    check_config_clean(&machine, Some(&config));
}

// ---------------------------------------------------------------------------------------
// Links.

/// GitHub's anchor of a heading: lower case, punctuation other than `-` and `_` dropped,
/// spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn every_link_of_the_readme_leads_somewhere() {
    let text = readme();
    let mut anchors = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            anchors.push(anchor(line.trim_start_matches('#')));
        }
    }
    let repository = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut broken = Vec::new();
    let mut links = 0;
    for (index, line) in text.lines().enumerate() {
        for (at, _) in line.match_indices("](") {
            let target = &line[at + 2..];
            let target = &target[..target.find(')').unwrap_or(target.len())];
            links += 1;
            let found = match target.strip_prefix('#') {
                Some(name) => anchors.iter().any(|anchor| anchor == name),
                None if target.contains("://") => true,
                None => repository.join(target).exists(),
            };
            if !found {
                broken.push(format!("README.md:{}: {target}", index + 1));
            }
        }
    }
    assert!(links > 10, "only {links} links found");
    assert!(broken.is_empty(), "links that lead nowhere:\n{}", broken.join("\n"));
}
