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
use toolgate::tools::process::Supervisor;
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
