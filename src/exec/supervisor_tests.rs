use super::*;

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
