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
