//! Commands and terminals: a daemon started from a person's terminal (its controlling
//! terminal) runs commands that must not reach that terminal nor any other but their
//! own: not by `/dev/tty`, not by pushing input with `TIOCSTI` (which would run in the
//! person's shell, outside every guard), not by opening `/dev/pts/N` by name (another
//! session's terminal, to read what is typed there or forge what it shows).
//!
//! The daemon is `toolgate mcp` with a pseudo-terminal made by the test as its
//! controlling terminal (`setsid --ctty`), its protocol on FIFOs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(30);

struct Daemon {
    child: Child,
    input: Option<std::fs::File>,
    lines: Receiver<String>,
    next_id: u64,
}

impl Daemon {
    /// Starts `toolgate mcp` in `dir` with `terminal` (a pseudo-terminal's device) as
    /// its controlling terminal.
    fn start(dir: &Path, terminal: &Path) -> Daemon {
        let root = dir.join("root");
        std::fs::create_dir_all(&root).unwrap();
        let (to_daemon, from_daemon) = (dir.join("in"), dir.join("out"));
        for fifo in [&to_daemon, &from_daemon] {
            nix::unistd::mkfifo(fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        }
        std::fs::write(dir.join("config.toml"), "[permissions]\nmode = \"bypass\"\n").unwrap();
        let script = format!(
            "exec {} mcp --root {} --config {} <{} >{}",
            env!("CARGO_BIN_EXE_toolgate"),
            root.display(),
            dir.join("config.toml").display(),
            to_daemon.display(),
            from_daemon.display()
        );
        let child = Command::new("setsid")
            .args(["--ctty", "sh", "-c", &script])
            .current_dir(&root)
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env("XDG_STATE_HOME", dir.join("state"))
            .env("XDG_RUNTIME_DIR", dir.join("run"))
            .env("TOOLGATE_LOG", "warn")
            .stdin(std::fs::File::options().read(true).write(true).open(terminal).unwrap())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let input = std::fs::File::options().write(true).open(&to_daemon).unwrap();
        let output = std::fs::File::open(&from_daemon).unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(output).lines() {
                let Ok(line) = line else { return };
                if send.send(line).is_err() {
                    return;
                }
            }
        });
        let mut daemon = Daemon { child, input: Some(input), lines, next_id: 1 };
        let answer = daemon.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "terminals", "version": "1"}}),
        );
        assert!(answer.get("result").is_some(), "{answer}");
        daemon.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        daemon
    }

    fn send(&mut self, message: &Value) {
        let input = self.input.as_mut().unwrap();
        input.write_all(format!("{message}\n").as_bytes()).unwrap();
        input.flush().unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let start = Instant::now();
        loop {
            let left = PATIENCE.saturating_sub(start.elapsed());
            let line =
                self.lines.recv_timeout(left).unwrap_or_else(|err| panic!("{method}: {err}"));
            if let Ok(message) = serde_json::from_str::<Value>(&line)
                && message["id"] == json!(id)
            {
                return message;
            }
        }
    }

    fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let answer = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        answer["result"]["structuredContent"].clone()
    }

    fn run(&mut self, command: &str) -> Value {
        self.call("run_command", json!({"command": command, "timeout_ms": 20_000}))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        drop(self.input.take());
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

/// A pseudo-terminal: its master (kept open) and its device.
fn pseudo_terminal() -> (std::os::fd::OwnedFd, PathBuf) {
    use rustix::pty::OpenptFlags;
    let master = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
    rustix::pty::grantpt(&master).unwrap();
    rustix::pty::unlockpt(&master).unwrap();
    let name = rustix::pty::ptsname(&master, Vec::new()).unwrap();
    (master, PathBuf::from(name.to_string_lossy().into_owned()))
}

fn content(result: &Value) -> String {
    result["content"].as_str().unwrap_or_default().to_owned()
}

/// What arrived on the person's terminal so far (its master's side), without waiting.
fn shown(master: &std::os::fd::OwnedFd) -> Vec<u8> {
    let mut fds = [nix::poll::PollFd::new(master.as_fd(), nix::poll::PollFlags::POLLIN)];
    let mut seen = Vec::new();
    while matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(200u16)), Ok(n) if n > 0)
    {
        let mut buffer = [0u8; 4096];
        match rustix::io::read(master, &mut buffer) {
            Ok(n) if n > 0 => seen.extend_from_slice(&buffer[..n]),
            _ => break,
        }
    }
    seen
}

#[test]
fn commands_reach_no_terminal_but_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(dir.path()).unwrap();
    let (master, person) = pseudo_terminal();
    let mut daemon = Daemon::start(&dir, &person);
    let probe = daemon.run("true");
    if !probe["metadata"]["sandbox"].as_str().is_some_and(|s| s.starts_with("landlock")) {
        return eprintln!("skipped: no Landlock sandbox in force here: {probe}");
    }
    let _ = shown(&master);

    // The daemon's controlling terminal is not the command's: /dev/tty leads nowhere,
    // so nothing can be pushed into it, drawn on it or read from it.
    let inject = daemon.run(
        "python3 -c \"import fcntl, os, termios\nfd = os.open('/dev/tty', os.O_RDWR)\n\
         fcntl.ioctl(fd, termios.TIOCSTI, b'x')\nprint('INJECTED')\"",
    );
    assert_eq!(inject["ok"], json!(false), "{inject}");
    assert!(!content(&inject).contains("INJECTED"), "{inject}");
    let draw = daemon.run("printf '\\033[2J\\033[HApprove? [y/N] ' > /dev/tty");
    assert_eq!(draw["ok"], json!(false), "{draw}");
    let session = daemon.run("ps -o sid= -p $$; ps -o tty= -p $$");
    let text = content(&session);
    let fields: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(fields.get(1), Some(&"?"), "the command has a controlling terminal: {session}");

    // Nor by its name.
    let by_name = format!("echo forged > {}", person.display());
    let forged = daemon.run(&by_name);
    assert_eq!(forged["ok"], json!(false), "{forged}");
    let read = daemon.run(&format!("head -c1 < {}", person.display()));
    assert_eq!(read["ok"], json!(false), "{read}");
    assert!(shown(&master).is_empty(), "something reached the person's terminal");

    // On a terminal of its own, TIOCSTI is refused even there.
    let own = daemon.call(
        "run_command",
        json!({"command": "python3 -c \"import fcntl, termios\nfcntl.ioctl(0, termios.TIOCSTI, b'x')\nprint('INJECTED')\"",
               "tty": true, "timeout_ms": 20_000}),
    );
    assert!(!content(&own).contains("INJECTED"), "{own}");
    assert!(content(&own).contains("PermissionError"), "{own}");

    // Another process's terminal (a REPL of the session, what is typed into it and
    // what it shows) cannot be opened by name.
    let repl = daemon.call(
        "run_command",
        json!({"command": "tty > repl-tty; exec cat", "tty": true, "background": true}),
    );
    let id = repl["metadata"]["process_id"].as_str().unwrap_or_else(|| panic!("{repl}")).to_owned();
    let tty_file = dir.join("root/repl-tty");
    let start = Instant::now();
    while std::fs::read_to_string(&tty_file).unwrap_or_default().trim().is_empty() {
        assert!(start.elapsed() < PATIENCE, "the REPL never said its terminal");
        std::thread::sleep(Duration::from_millis(20));
    }
    let repl_tty = std::fs::read_to_string(&tty_file).unwrap().trim().to_owned();
    assert!(repl_tty.starts_with("/dev/pts/"), "{repl_tty}");
    for script in [format!("head -c1 < {repl_tty}"), format!("echo forged > {repl_tty}")] {
        let result = daemon.run(&script);
        assert_eq!(result["ok"], json!(false), "{script}: {result}");
    }
    let listing = daemon.run("ls /dev/pts");
    assert_eq!(listing["ok"], json!(false), "{listing}");
    daemon.call("process_kill", json!({"id": id}));
}
