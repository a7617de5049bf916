//! Guarantees of the file-system layer that hold against an adversary racing the tools:
//! the walkers and a command's `cwd` never leave the roots while a directory inside is
//! being swapped with a symlink to outside (`renameat2(RENAME_EXCHANGE)` in a loop).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rustix::fs::{CWD, RenameFlags};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolgate::exec::Supervisor;
use toolgate::tools::{Call, Env, Registry, ToolResult};

/// Calls per tool while the swapper runs. `TOOLGATE_RACE_CALLS` raises it for a
/// longer run by hand.
fn race_calls(default: usize) -> usize {
    std::env::var("TOOLGATE_RACE_CALLS").ok().and_then(|n| n.parse().ok()).unwrap_or(default)
}

const OUTSIDE_MARK: &str = "OUTSIDE_SECRET_4711";
const INSIDE_MARK: &str = "INSIDE_TEXT_4711";

/// `base/root` (the session root) holding `d/` (a real directory) and `swap`, a
/// symlink to `base/outside`; a thread keeps exchanging the two.
struct Race {
    _dir: tempfile::TempDir,
    root: PathBuf,
    env: Arc<Env>,
    registry: Registry,
}

impl Race {
    fn new() -> Race {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let root = base.join("root");
        let outside = base.join("outside");
        std::fs::create_dir_all(root.join("d/sub")).unwrap();
        std::fs::create_dir_all(outside.join("sub")).unwrap();
        std::fs::write(root.join("d/inside.txt"), format!("{INSIDE_MARK}\n")).unwrap();
        std::fs::write(root.join("d/sub/inside.txt"), format!("{INSIDE_MARK}\n")).unwrap();
        std::fs::write(outside.join("leak.txt"), format!("{OUTSIDE_MARK}\n")).unwrap();
        std::fs::write(outside.join("sub/leak.txt"), format!("{OUTSIDE_MARK}\n")).unwrap();
        std::os::unix::fs::symlink("../outside", root.join("swap")).unwrap();
        let env = Arc::new(Env::for_root(&root).unwrap());
        Supervisor::install(env!("CARGO_BIN_EXE_toolgate"));
        Race { _dir: dir, root, env, registry: Registry::with_builtins() }
    }

    /// Whether this kernel and file system can exchange two names atomically.
    fn exchange_supported(&self) -> bool {
        let exchange = || {
            rustix::fs::renameat_with(
                CWD,
                self.root.join("d"),
                CWD,
                self.root.join("swap"),
                RenameFlags::EXCHANGE,
            )
        };
        match exchange() {
            Ok(()) => exchange().is_ok(),
            Err(errno) => {
                eprintln!("skipped: renameat2(RENAME_EXCHANGE) is not available here ({errno})");
                false
            }
        }
    }

    /// Starts swapping `d` and `swap` until the returned flag is raised.
    fn start_swapping(&self) -> (Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let (d, swap) = (self.root.join("d"), self.root.join("swap"));
        let handle = std::thread::spawn(move || {
            let mut swaps = 0;
            while !flag.load(Ordering::Relaxed) {
                rustix::fs::renameat_with(CWD, &d, CWD, &swap, RenameFlags::EXCHANGE).unwrap();
                swaps += 1;
                // Pacing, not synchronization: a swapper that never lets go keeps
                // every confined lookup retrying, and nothing would be tested.
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
            swaps
        });
        (stop, handle)
    }

    async fn call(&self, tool: &str, args: Value) -> ToolResult {
        let call = Call::from_value("race", tool, &args);
        self.registry.execute(&call, &self.env, &CancellationToken::new()).await
    }

    /// Runs `calls` calls of `tool` while the swapper runs and asserts that none of
    /// them showed anything of `outside` (and that the tool did work meanwhile).
    async fn leaks(&self, tool: &str, args: Value, calls: usize, leaked: impl Fn(&str) -> bool) {
        if !self.exchange_supported() {
            return;
        }
        let (stop, swapper) = self.start_swapping();
        let leaks = AtomicU64::new(0);
        let mut succeeded = 0;
        for _ in 0..calls {
            let res = self.call(tool, args.clone()).await;
            if res.ok {
                succeeded += 1;
            } else if std::env::var_os("TOOLGATE_RACE_DEBUG").is_some() {
                eprintln!("{res:?}");
            }
            let shown = format!("{}\n{}", res.content, res.error.clone().unwrap_or_default());
            if leaked(&shown) {
                leaks.fetch_add(1, Ordering::Relaxed);
            }
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().unwrap();
        let leaks = leaks.load(Ordering::Relaxed);
        eprintln!("{tool}: {leaks} of {calls} calls leaked ({succeeded} succeeded, {swaps} swaps)");
        assert_eq!(
            leaks, 0,
            "{tool} showed what lies outside the root in {leaks} of {calls} calls"
        );
        assert!(succeeded > 0, "{tool} never succeeded while racing");
    }
}

fn shows_outside(text: &str) -> bool {
    text.contains(OUTSIDE_MARK) || text.contains("leak.txt")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_code_never_follows_a_directory_swapped_for_a_symlink() {
    let race = Race::new();
    let args = json!({"pattern": "4711", "limit": 1000});
    race.leaks("search_code", args, race_calls(300), shows_outside).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_code_below_a_swapped_directory_stays_inside() {
    let race = Race::new();
    let args = json!({"pattern": "4711", "path": "d"});
    race.leaks("search_code", args, race_calls(300), shows_outside).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_files_never_follows_a_directory_swapped_for_a_symlink() {
    let race = Race::new();
    let args = json!({"pattern": "*.txt"});
    race.leaks("find_files", args, race_calls(300), shows_outside).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_command_cwd_never_enters_a_directory_swapped_for_a_symlink() {
    let race = Race::new();
    let args = json!({"command": "cat leak.txt sub/leak.txt 2>/dev/null; ls", "cwd": "d"});
    race.leaks("run_command", args, race_calls(200), shows_outside).await;
}

// ---------------------------------------------------------------------------------
// The real daemon: rules on resolved paths, toolgate's own files, hard links.

/// `toolgate serve` on a private socket; `home` (HOME, XDG_CONFIG_HOME and
/// XDG_STATE_HOME below it) is the workspace root. Killed on drop.
struct Daemon {
    child: Option<std::process::Child>,
    _dir: tempfile::TempDir,
    home: PathBuf,
    socket: PathBuf,
}

impl Daemon {
    fn start(config: &str) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let home = base.join("home");
        let config_dir = home.join(".config/toolgate");
        std::fs::create_dir_all(&config_dir).unwrap();
        std::fs::create_dir_all(home.join(".local/state")).unwrap();
        std::fs::create_dir_all(home.join("root")).unwrap();
        std::fs::write(config_dir.join("config.toml"), config).unwrap();
        let socket = base.join("run/toolgate.sock");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["serve", "--socket"])
            .arg(&socket)
            .current_dir(&home)
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("XDG_STATE_HOME", home.join(".local/state"))
            .env("XDG_RUNTIME_DIR", base.join("run"))
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env("TOOLGATE_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let daemon = Daemon { child: Some(child), _dir: dir, home, socket };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&daemon.socket).is_err() {
            assert!(std::time::Instant::now() < deadline, "the daemon did not start listening");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        daemon
    }

    /// Calls a tool over the socket and returns its result object.
    fn call(&self, tool: &str, arguments: Value) -> Value {
        use std::io::{BufRead, Write};
        let stream = std::os::unix::net::UnixStream::connect(&self.socket).unwrap();
        stream.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
        let request = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}});
        (&stream).write_all(format!("{request}\n").as_bytes()).unwrap();
        let mut reader = std::io::BufReader::new(&stream);
        loop {
            let mut line = String::new();
            assert!(reader.read_line(&mut line).unwrap() > 0, "the daemon closed the connection");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == json!(1) {
                assert!(message.get("error").is_none(), "{message}");
                return message["result"].clone();
            }
        }
    }

    /// Stops the daemon and returns what it wrote to stderr.
    fn stop(mut self) -> String {
        use std::io::Read;
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let mut stderr = String::new();
        child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        stderr
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[track_caller]
fn assert_refused(result: &Value, secret: &str) {
    assert_eq!(result["ok"], false, "{result}");
    assert_eq!(result["error_type"], "access_denied", "{result}");
    assert!(!result.to_string().contains(secret), "{result}");
}

#[test]
fn toolgate_own_files_inside_a_root_are_never_read_or_written() {
    let daemon = Daemon::start(
        "[workspace]\nroots = [\"~\"]\n[permissions]\nmode = \"bypass\"\n[server]\ntoken_file = \"~/tokens\"\n",
    );
    let home = daemon.home.clone();
    std::fs::write(home.join(".config/toolgate/tokens"), "TOKEN_SECRET_1\n").unwrap();
    std::fs::write(home.join("tokens"), "TOKEN_SECRET_2\n").unwrap();
    std::os::unix::fs::symlink(".config/toolgate/tokens", home.join("innocent.txt")).unwrap();
    // The audit log exists once a call was recorded.
    let first = daemon.call("read_file", json!({"path": "innocent.txt"}));
    assert_refused(&first, "TOKEN_SECRET_1");
    assert!(first["error"].as_str().unwrap().contains("toolgate's own files"), "{first}");
    for path in [".config/toolgate/tokens", "tokens", ".config/toolgate/config.toml"] {
        assert_refused(&daemon.call("read_file", json!({"path": path})), "TOKEN_SECRET");
        let written = daemon.call("write_file", json!({"path": path, "content": "mode = 1\n"}));
        assert_refused(&written, "TOKEN_SECRET");
    }
    let edit = daemon.call(
        "edit_file",
        json!({"path": ".config/toolgate/config.toml", "old_string": "bypass", "new_string": "x"}),
    );
    assert_refused(&edit, "TOKEN_SECRET");
    let audit = ".local/state/toolgate/audit.jsonl";
    assert_refused(&daemon.call("write_file", json!({"path": audit, "content": ""})), "NOT_SHOWN");
    let skill = ".config/toolgate/skills/x.toml";
    assert_refused(&daemon.call("write_file", json!({"path": skill, "content": "x"})), "NOT_SHOWN");
    let search =
        daemon.call("search_code", json!({"pattern": "TOKEN_SECRET|innocent", "hidden": true}));
    assert_eq!(search["ok"], true, "{search}");
    assert!(!search["content"].as_str().unwrap().contains("TOKEN_SECRET"), "{search}");
    let audit_search = daemon.call("search_code", json!({"pattern": ".", "hidden": true}));
    assert!(!audit_search["content"].as_str().unwrap().contains("audit.jsonl"), "{audit_search}");
    let found = daemon.call("find_files", json!({"pattern": "*", "hidden": true}));
    let listing = found["content"].as_str().unwrap();
    assert!(!listing.contains(".config/toolgate"), "{listing}");
    assert!(!listing.contains("audit.jsonl"), "{listing}");
    assert!(!listing.lines().any(|line| line == "tokens"), "{listing}");
    assert!(listing.contains("innocent.txt"), "{listing}");
    let below = daemon.call("find_files", json!({"pattern": "*", "path": ".config/toolgate"}));
    assert_refused(&below, "TOKEN_SECRET");
    assert_eq!(std::fs::read_to_string(home.join("tokens")).unwrap(), "TOKEN_SECRET_2\n");
    let stderr = daemon.stop();
    assert!(stderr.contains("lies inside a workspace root"), "no start-up warning: {stderr}");
}

#[test]
fn rules_match_the_resolved_path_and_read_rules_bind_the_walkers() {
    let daemon = Daemon::start(
        "[workspace]\nroots = [\"~\"]\n[permissions]\nmode = \"bypass\"\n\
         deny = [\"read_file(**/.env*)\", \"Edit(**/.git/**)\"]\n",
    );
    let home = daemon.home.clone();
    std::fs::write(home.join(".env"), "API_TOKEN=sk-live-secret\n").unwrap();
    std::os::unix::fs::symlink(".env", home.join("notenv.txt")).unwrap();
    std::fs::create_dir_all(home.join("sub/.git")).unwrap();
    std::fs::write(home.join("sub/.git/config"), "[core]\n").unwrap();
    std::os::unix::fs::symlink("sub/.git", home.join("gitlink")).unwrap();

    assert_refused(&daemon.call("read_file", json!({"path": "notenv.txt"})), "sk-live");
    let edit = daemon.call(
        "edit_file",
        json!({"path": "gitlink/config", "old_string": "[core]", "new_string": "[core]\nfsmonitor = x"}),
    );
    assert_eq!(edit["ok"], false, "{edit}");
    let write = daemon.call("write_file", json!({"path": "sub/.git/config", "content": "x"}));
    assert_eq!(write["ok"], false, "{write}");
    assert_eq!(std::fs::read_to_string(home.join("sub/.git/config")).unwrap(), "[core]\n");
    let search = daemon.call("search_code", json!({"pattern": "API_TOKEN", "hidden": true}));
    assert_eq!(search["ok"], true, "{search}");
    assert!(!search["content"].as_str().unwrap().contains("sk-live"), "{search}");
    // `.env`, and toolgate's configuration and state directories.
    assert_eq!(search["metadata"]["withheld"], 3, "{search}");
    let single = daemon.call("search_code", json!({"pattern": "API_TOKEN", "path": ".env"}));
    assert_refused(&single, "sk-live");
    let found = daemon.call("find_files", json!({"pattern": "*env*", "hidden": true}));
    let listing = found["content"].as_str().unwrap();
    assert!(!listing.lines().any(|line| line == ".env"), "{listing}");
    drop(daemon);
}

#[test]
fn files_with_several_hard_links_are_not_read() {
    let daemon =
        Daemon::start("[workspace]\nroots = [\"~/root\"]\n[permissions]\nmode = \"bypass\"\n");
    let home = daemon.home.clone();
    std::fs::write(home.join("outside.txt"), "HARDLINKED_SECRET\n").unwrap();
    std::fs::hard_link(home.join("outside.txt"), home.join("root/inside.txt")).unwrap();
    std::fs::write(home.join("root/plain.txt"), "HARDLINKED_SECRET is mentioned here\n").unwrap();
    assert_refused(&daemon.call("read_file", json!({"path": "inside.txt"})), "HARDLINKED_SECRET\n");
    let search = daemon.call("search_code", json!({"pattern": "HARDLINKED_SECRET"}));
    let content = search["content"].as_str().unwrap();
    assert!(content.contains("plain.txt"), "{search}");
    assert!(!content.contains("inside.txt"), "{search}");
    assert_eq!(search["metadata"]["withheld"], 1, "{search}");
    let edit = daemon.call(
        "edit_file",
        json!({"path": "inside.txt", "old_string": "HARDLINKED", "new_string": "changed"}),
    );
    assert_eq!(edit["ok"], false, "{edit}");
    assert_eq!(std::fs::read_to_string(home.join("outside.txt")).unwrap(), "HARDLINKED_SECRET\n");
    drop(daemon);
}

// ---------------------------------------------------------------------------------
// Memory under hostile input.

/// The peak resident set of this test process (`VmHWM`), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|line| line.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_searches_over_one_huge_line_stay_within_the_line_limit() {
    use std::io::Write;
    const LINE_BYTES: usize = 32 * 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    {
        // Written in chunks, so that making the file does not raise the peak itself.
        let mut file = std::fs::File::create(root.join("minified.js")).unwrap();
        let chunk = "a".repeat(64 * 1024);
        for _ in 0..LINE_BYTES / chunk.len() {
            file.write_all(chunk.as_bytes()).unwrap();
        }
        file.write_all(b"needle\n").unwrap();
    }
    std::fs::write(root.join("small.txt"), "a needle here\n").unwrap();
    let mut env = Env::for_root(&root).unwrap();
    env.max_read_bytes = 512 * 1024;
    let env = Arc::new(env);
    let registry = Arc::new(Registry::with_builtins());
    let search = |registry: Arc<Registry>, env: Arc<Env>| async move {
        let call = Call::from_value("long", "search_code", &json!({"pattern": "needle"}));
        registry.execute(&call, &env, &CancellationToken::new()).await
    };
    // Warm up (threads, pools, the regex engine) before taking the baseline.
    let warm = search(registry.clone(), env.clone()).await;
    assert!(warm.ok, "{warm:?}");
    let before = peak_rss();
    let runs: Vec<_> =
        (0..6).map(|_| tokio::spawn(search(registry.clone(), env.clone()))).collect();
    for run in runs {
        let res = run.await.unwrap();
        assert!(res.ok, "{res:?}");
        assert!(res.content.contains("small.txt:1:a needle here"), "{}", res.content);
        assert_eq!(res.metadata["unreadable"], 1, "the huge line is skipped: {res:?}");
    }
    let grown = peak_rss().saturating_sub(before);
    eprintln!("peak RSS grew by {} KiB over six concurrent searches", grown / 1024);
    assert!(grown < 16 * 1024 * 1024, "peak RSS grew by {grown} bytes");
}
