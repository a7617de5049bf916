use super::*;

use proptest::prelude::*;

fn chunk_all(pieces: &[&[u8]]) -> Vec<String> {
    let mut chunker = Utf8Chunker::default();
    let mut out: Vec<String> = pieces.iter().map(|piece| chunker.push(piece)).collect();
    out.push(chunker.finish());
    out
}

#[test]
fn chunker_carries_a_character_split_across_reads() {
    let text = "aé€😀z".as_bytes();
    // Every possible split point, including ones inside each multi-byte character.
    for cut in 0..=text.len() {
        let chunks = chunk_all(&[&text[..cut], &text[cut..]]);
        assert_eq!(chunks.concat(), "aé€😀z", "cut at {cut}");
        assert!(chunks.iter().all(|chunk| !chunk.contains('\u{FFFD}')), "cut at {cut}");
    }
    // One byte at a time: nothing is emitted until a character is complete.
    let bytes = "😀".as_bytes();
    let pieces: Vec<&[u8]> = bytes.chunks(1).collect();
    assert_eq!(chunk_all(&pieces), vec!["", "", "", "😀", ""]);
}

#[test]
fn chunker_replaces_invalid_bytes_and_flushes_an_unfinished_character() {
    assert_eq!(chunk_all(&[b"a\xffb", b"\xe2\x82"]), vec!["a\u{FFFD}b", "", "\u{FFFD}"]);
    assert_eq!(chunk_all(&[b"\xc3", b"(x"]), vec!["", "\u{FFFD}(x", ""]);
}

fn capture_of(cap: usize, pieces: &[&[u8]]) -> Capture {
    let mut capture = Capture::new(cap);
    for piece in pieces {
        capture.push(piece);
    }
    capture
}

#[test]
fn capture_keeps_everything_that_fits() {
    let capture = capture_of(10, &[b"hello", b" you"]);
    assert_eq!(
        capture.render(10),
        Captured { text: "hello you".to_owned(), total_bytes: 9, omitted_bytes: 0 }
    );
}

#[test]
fn capture_keeps_head_and_tail_and_counts_the_cut() {
    let data: Vec<u8> = (0..1000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let pieces: Vec<&[u8]> = data.chunks(7).collect();
    let capture = capture_of(100, &pieces);
    let rendered = capture.render(100);
    let head = String::from_utf8(data[..50].to_vec()).unwrap();
    let tail = String::from_utf8(data[950..].to_vec()).unwrap();
    assert_eq!(rendered.text, format!("{head}\n... [900 bytes omitted] ...\n{tail}"));
    assert_eq!(rendered.total_bytes, 1000);
    assert_eq!(rendered.omitted_bytes, 900);
    // A smaller share of the cap (the other stream needed the rest).
    let rendered = capture.render(10);
    assert_eq!(rendered.omitted_bytes, 990);
    assert!(rendered.text.starts_with(&head[..5]));
    assert!(rendered.text.ends_with(&tail[45..]));
}

#[test]
fn capture_squeezes_a_complete_stream_into_a_small_budget() {
    let capture = capture_of(100, &[b"0123456789"]);
    let rendered = capture.render(4);
    assert_eq!(rendered.text, "01\n... [6 bytes omitted] ...\n89");
    assert_eq!(rendered.omitted_bytes, 6);
    let rendered = capture.render(0);
    assert_eq!(rendered.text, "... [10 bytes omitted] ...\n");
}

#[test]
fn capture_never_cuts_inside_a_character() {
    // 'é' is two bytes; an odd budget half would land inside one.
    let data = "é".repeat(100);
    let capture = capture_of(11, &[data.as_bytes()]);
    let rendered = capture.render(11);
    assert!(!rendered.text.contains('\u{FFFD}'), "{}", rendered.text);
    let kept: usize =
        rendered.text.lines().filter(|line| !line.starts_with("...")).map(str::len).sum();
    assert_eq!(rendered.omitted_bytes, 200 - kept as u64);
    assert_eq!(rendered.text, "ééé\n... [190 bytes omitted] ...\néé");
}

proptest! {
    #[test]
    fn capture_render_is_an_exact_head_and_tail(
        data in proptest::collection::vec(any::<u8>(), 0..600),
        cap in 0usize..200,
        budget_fraction in 0.0f64..=1.0,
        chunk in 1usize..50,
    ) {
        let budget = (cap as f64 * budget_fraction) as usize;
        let pieces: Vec<&[u8]> = data.chunks(chunk).collect();
        let capture = capture_of(cap, &pieces);
        let rendered = capture.render(budget);
        prop_assert_eq!(rendered.total_bytes, data.len() as u64);
        if data.len() <= budget {
            prop_assert_eq!(rendered.omitted_bytes, 0);
            prop_assert_eq!(rendered.text, String::from_utf8_lossy(&data).into_owned());
        } else {
            let kept = data.len() as u64 - rendered.omitted_bytes;
            prop_assert!(kept <= budget as u64);
            prop_assert!(kept + 6 >= budget as u64, "at most 3 bytes lost per cut");
            let marker = format!("... [{} bytes omitted] ...\n", rendered.omitted_bytes);
            prop_assert!(rendered.text.contains(&marker));
        }
    }
}

#[test]
fn budget_goes_to_the_stream_that_needs_it() {
    assert_eq!(split_budget(100, 30, 40), (30, 40));
    assert_eq!(split_budget(100, 500, 10), (90, 10));
    assert_eq!(split_budget(100, 10, 500), (10, 90));
    assert_eq!(split_budget(100, 500, 500), (50, 50));
    assert_eq!(split_budget(101, 500, 500), (51, 50));
    assert_eq!(split_budget(0, 5, 0), (0, 0));
}

#[test]
fn reports_round_trip_and_cannot_be_forged() {
    for report in [
        Report::Spawned(42),
        Report::SpawnError("No such file or directory (os error 2)".to_owned()),
        Report::Exited(ExitStatus::Code(3)),
        Report::Exited(ExitStatus::Signal(9)),
        Report::Done,
    ] {
        let line = report.to_line();
        assert_eq!(line.matches('\n').count(), 1);
        assert_eq!(Report::parse(line.trim_end_matches('\n')), Some(report));
    }
    let forged = Report::SpawnError("bad\ndone".to_owned()).to_line();
    assert_eq!(forged, "spawn-error bad done\n");
    assert_eq!(Report::parse("exit code x"), None);
    assert_eq!(Report::parse("done now"), None);
    assert_eq!(Report::parse("hello"), None);
}

#[test]
fn reports_sent_together_leave_in_one_write() {
    /// Keeps what each call to `write` was given.
    #[derive(Default)]
    struct Writes(Vec<Vec<u8>>);
    impl Write for &mut Writes {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.push(bytes.to_vec());
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut writes = Writes::default();
    send_reports(&mut writes, [&Report::Exited(ExitStatus::Code(0)), &Report::Done]);
    let sandbox = Report::Sandbox("landlock v7".to_owned());
    send_reports(&mut writes, [&sandbox, &Report::Spawned(7)]);
    assert_eq!(
        writes.0,
        [b"exit code 0\ndone\n".to_vec(), b"sandbox landlock v7\nspawned 7\n".to_vec()]
    );
}

#[test]
fn supervise_args_parse() {
    let args = |list: &[&str]| list.iter().map(OsString::from).collect::<Vec<_>>();
    assert_eq!(
        SuperviseArgs::parse(args(&[
            "--cwd",
            "/tmp",
            "--cgroup",
            "/sys/fs/cgroup/toolgate/1-2",
            "--stdin-bytes",
            "5",
            "--sandbox",
            "landlock v6",
            "--sandbox-ruleset",
            "--nofile",
            "1024",
            "--",
            "/bin/sh",
            "-c",
            "x"
        ])),
        Ok(SuperviseArgs {
            cwd: Some(PathBuf::from("/tmp")),
            cwd_fd: false,
            cgroup: vec![PathBuf::from("/sys/fs/cgroup/toolgate/1-2")],
            sandbox: Some("landlock v6".to_owned()),
            sandbox_ruleset: true,
            sandbox_no_network: false,
            stdin_bytes: Some(5),
            live_stdin: false,
            tty: false,
            nofile: Some(1024),
            argv: args(&["/bin/sh", "-c", "x"]),
            env: None,
        })
    );
    // Options after `--` belong to the command.
    assert_eq!(
        SuperviseArgs::parse(args(&["--", "ls", "--cwd"])).unwrap().argv,
        args(&["ls", "--cwd"])
    );
    assert!(SuperviseArgs::parse(args(&["--",])).is_err());
    assert!(SuperviseArgs::parse(args(&["/bin/sh"])).is_err());
    assert!(SuperviseArgs::parse(args(&["--parent", "12", "--", "ls"])).is_err());
    assert!(SuperviseArgs::parse(args(&["--cgroup"])).is_err());
    assert!(SuperviseArgs::parse(args(&["--stdin-bytes"])).is_err());
    assert!(SuperviseArgs::parse(args(&["--nofile", "many", "--", "ls"])).is_err());
    assert!(SuperviseArgs::parse(args(&["--sandbox"])).is_err());
    let network_off = SuperviseArgs::parse(args(&["--sandbox-no-network", "--", "ls"])).unwrap();
    assert!(network_off.sandbox_no_network && !network_off.sandbox_ruleset);
}

#[test]
fn stat_lines_parse_even_with_hostile_command_names() {
    assert_eq!(
        parse_stat("123 (sleep) S 45 123 45 0 -1 4194304"),
        Some(ProcEntry { pid: 123, ppid: 45, zombie: false })
    );
    assert_eq!(
        parse_stat("7 (a) Z 1 (b)) R 99 7 7 0"),
        Some(ProcEntry { pid: 7, ppid: 99, zombie: false })
    );
    assert_eq!(parse_stat("8 (x y) Z 3 8"), Some(ProcEntry { pid: 8, ppid: 3, zombie: true }));
    assert_eq!(parse_stat("garbage"), None);
}

#[test]
fn descendants_follow_every_generation_and_nothing_else() {
    let entry = |pid, ppid| ProcEntry { pid, ppid, zombie: false };
    let table = [
        entry(1, 0),
        entry(10, 1),
        entry(11, 10),
        entry(12, 11),
        entry(13, 10),
        entry(20, 1),
        entry(21, 20),
    ];
    let mut found: Vec<i32> = descendants(&table, 10).iter().map(|entry| entry.pid).collect();
    found.sort_unstable();
    assert_eq!(found, vec![11, 12, 13]);
    assert!(descendants(&table, 12).is_empty());
}

/// Pids whose whole command line is `command`.
fn pids_running(command: &str) -> Vec<i32> {
    read_process_table()
        .into_iter()
        .filter(|entry| {
            std::fs::read(format!("/proc/{}/cmdline", entry.pid)).is_ok_and(|cmdline| {
                String::from_utf8_lossy(&cmdline).replace('\0', " ").trim_end() == command
            })
        })
        .map(|entry| entry.pid)
        .collect()
}

/// Kills a test's process tree even when an assertion fails half-way: the tree, and
/// anything running the test's unique command (the test process is no subreaper, so
/// an orphan may have left the tree).
struct TreeCleanup(Option<std::process::Child>, String);

impl Drop for TreeCleanup {
    fn drop(&mut self) {
        if let Some(mut root) = self.0.take() {
            kill_tree(Pid::from_raw(i32::try_from(root.id()).unwrap()));
            let _ = root.kill();
            let _ = root.wait();
        }
        for pid in pids_running(&self.1) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

#[test]
fn kill_tree_kills_every_descendant_but_not_the_root() {
    let marker = format!("1000.{}{}", std::process::id(), 4242);
    // Two generations below the root: a sleep, and a shell with its own sleep.
    let script = format!("sleep {marker} & sh -c 'sleep {marker} & wait' & wait");
    let root = std::process::Command::new("/bin/sh").arg("-c").arg(&script).spawn().unwrap();
    let root_pid = Pid::from_raw(i32::try_from(root.id()).unwrap());
    let mut cleanup = TreeCleanup(Some(root), format!("sleep {marker}"));
    let family_sleeps = || {
        let table = read_process_table();
        let family: HashSet<i32> =
            descendants(&table, root_pid.as_raw()).iter().map(|entry| entry.pid).collect();
        pids_running(&format!("sleep {marker}"))
            .into_iter()
            .filter(|pid| family.contains(pid))
            .count()
    };
    // Wait (bounded) until both sleeps run; only then is the test meaningful.
    let start = std::time::Instant::now();
    while family_sleeps() < 2 && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(family_sleeps(), 2, "the sleeps never started");
    // The kernel's child lists and a full scan agree on who is in the tree.
    let mut walked: Vec<i32> =
        walk_children(root_pid.as_raw()).unwrap().iter().map(|entry| entry.pid).collect();
    let mut scanned: Vec<i32> = descendants(&read_process_table(), root_pid.as_raw())
        .iter()
        .map(|entry| entry.pid)
        .collect();
    walked.sort_unstable();
    scanned.sort_unstable();
    assert_eq!(walked, scanned);
    assert_eq!(walked.len(), 3, "two sleeps and the inner shell");

    kill_tree(root_pid);
    assert_eq!(family_sleeps(), 0);
    let table = read_process_table();
    let live: Vec<_> =
        descendants(&table, root_pid.as_raw()).into_iter().filter(|entry| !entry.zombie).collect();
    assert!(live.is_empty(), "still alive: {live:?}");
    // The root was spared: its `wait` returned and it exited normally.
    let mut root = cleanup.0.take().unwrap();
    assert!(root.wait().unwrap().success());
    assert!(pids_running(&format!("sleep {marker}")).is_empty());
}

/// The path of the spare once the background has made one.
async fn spare_made(spare: &'static Spare<CallTempDir>) -> PathBuf {
    for _ in 0..500 {
        if let Some(made) = spare.lock().last() {
            return made.path.clone();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no spare was made in the background");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_directory_is_handed_out_fresh_and_the_next_made_in_the_background() {
    use std::os::unix::fs::PermissionsExt;
    static SPARE: Spare<CallTempDir> = Spare::new();
    // None ready: the first call makes its own, and has a spare made behind it.
    let first = SPARE.take_or_make(CallTempDir::create).unwrap();
    SPARE.refill(CallTempDir::create);
    let spare = spare_made(&SPARE).await;
    assert_ne!(spare, first.path);
    // The next call gets that spare, empty and private, and another is made.
    let second = SPARE.take_or_make(CallTempDir::create).unwrap();
    SPARE.refill(CallTempDir::create);
    assert_eq!(second.path, spare);
    assert!(std::fs::read_dir(&second.path).unwrap().next().is_none());
    assert_eq!(std::fs::metadata(&second.path).unwrap().permissions().mode() & 0o777, 0o700);
    let next = spare_made(&SPARE).await;
    assert_ne!(next, second.path);
    // Released, the spare is gone; the calls' own go when they end.
    SPARE.release();
    assert!(!next.exists());
    let taken = [first.path.clone(), second.path.clone()];
    drop((first, second));
    assert!(taken.iter().all(|path| !path.exists()));

    // Taking tries nothing behind the call: a call that got nothing has nothing
    // made again.
    static NEVER: Spare<CallTempDir> = Spare::new();
    static TRIED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    fn cannot() -> std::io::Result<CallTempDir> {
        TRIED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Err(std::io::Error::other("no room"))
    }
    assert!(NEVER.take_or_make(cannot).is_err());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(TRIED.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_that_changed_behind_the_daemon_is_not_handed_out() {
    use std::os::unix::fs::PermissionsExt;
    static SPARE: Spare<CallTempDir> = Spare::new();
    let first = SPARE.take_or_make(CallTempDir::create).unwrap();
    SPARE.refill(CallTempDir::create);
    // Removed while it waited (a clean-up of old files in /tmp): the next call gets a
    // directory of its own that exists.
    let removed = spare_made(&SPARE).await;
    std::fs::remove_dir(&removed).unwrap();
    let second = SPARE.take_or_make(CallTempDir::create).unwrap();
    SPARE.refill(CallTempDir::create);
    assert_ne!(second.path, removed);
    assert!(second.path.is_dir());
    // Found changed (here, opened to everyone): not handed out, and not removed either,
    // since what is at that name may no longer be the daemon's.
    let changed = spare_made(&SPARE).await;
    std::fs::set_permissions(&changed, std::fs::Permissions::from_mode(0o755)).unwrap();
    let third = SPARE.take_or_make(CallTempDir::create).unwrap();
    SPARE.refill(CallTempDir::create);
    assert_ne!(third.path, changed);
    assert!(changed.is_dir());
    std::fs::remove_dir(&changed).unwrap();
    let last = spare_made(&SPARE).await;
    SPARE.release();
    assert!(!last.exists());
    drop((first, second, third));
}

#[test]
fn a_temporary_directory_is_reusable_only_empty_private_plain_and_the_same() {
    use std::os::unix::fs::PermissionsExt;
    let made = CallTempDir::create().unwrap();
    let path = made.path.clone();
    assert!(made.reusable());
    // Something left in it, even a hidden file or an empty directory.
    for left in [".hidden", "sub"] {
        let inside = path.join(left);
        if left == "sub" {
            std::fs::create_dir(&inside).unwrap();
        } else {
            std::fs::write(&inside, "x").unwrap();
        }
        assert!(!made.reusable(), "{left} was left in it");
        if left == "sub" {
            std::fs::remove_dir(&inside).unwrap();
        } else {
            std::fs::remove_file(&inside).unwrap();
        }
        assert!(made.reusable());
    }
    // Opened to others.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(!made.reusable());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(made.reusable());
    // An attribute set on it (as an ACL would be), where the file system has them.
    match rustix::fs::setxattr(&path, "user.left", b"x", rustix::fs::XattrFlags::empty()) {
        Ok(()) => {
            assert!(!made.reusable());
            rustix::fs::removexattr(&path, "user.left").unwrap();
            assert!(made.reusable());
        }
        Err(errno) => eprintln!("skipped the attribute: the file system refuses it ({errno})"),
    }
    // Another directory at its name (the first moved aside), or a link to it.
    let aside = path.with_extension("aside");
    std::fs::rename(&path, &aside).unwrap();
    std::fs::create_dir(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(!made.reusable());
    std::fs::remove_dir(&path).unwrap();
    std::os::unix::fs::symlink(&aside, &path).unwrap();
    assert!(!made.reusable());
    std::fs::remove_file(&path).unwrap();
    std::fs::rename(&aside, &path).unwrap();
    assert!(made.reusable());
    drop(made);
    assert!(!path.exists());
}

#[test]
fn spares_given_back_are_handed_out_last_first_and_only_a_few_are_kept() {
    static SPARE: Spare<CallTempDir> = Spare::new();
    let made: Vec<CallTempDir> =
        (0..SPARES_KEPT + 1).map(|_| CallTempDir::create().unwrap()).collect();
    let paths: Vec<PathBuf> = made.iter().map(|made| made.path.clone()).collect();
    for made in made {
        SPARE.give_back(made);
    }
    // One too many: removed.
    assert!(!paths[SPARES_KEPT].exists());
    let taken = SPARE.take_or_make(CallTempDir::create).unwrap();
    assert_eq!(taken.path, paths[SPARES_KEPT - 1]);
    SPARE.release();
    assert!(paths[..SPARES_KEPT - 1].iter().all(|path| !path.exists()));
    drop(taken);
}

#[test]
fn a_stopped_child_is_seen_stopped_and_left_waitable() {
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let pid = pid_from_u32(child.id()).unwrap();
    let until = |want: bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while is_stopped(pid) != want {
            assert!(Instant::now() < deadline, "never seen stopped = {want}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    assert!(!is_stopped(pid));
    nix::sys::signal::kill(pid, Signal::SIGSTOP).unwrap();
    until(true);
    // Looking leaves the report for the next look.
    assert!(is_stopped(pid) && is_stopped(pid));
    nix::sys::signal::kill(pid, Signal::SIGCONT).unwrap();
    until(false);
    child.kill().unwrap();
    child.wait().unwrap();
}
