//! Confinement checked through both lookup strategies: the `openat2` path the kernel
//! confines, and the component walk used without it. Whatever path comes in, both
//! must agree, and nothing they open may lie outside the root.

use std::os::unix::fs::symlink;

use proptest::prelude::*;

use super::Strategy as Lookup;
use super::*;

/// A root with ordinary entries and symlinks of every kind, next to a directory that
/// must stay unreachable.
struct Tree {
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
    env: Env,
}

fn tree() -> Tree {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let root = base.join("root");
    let outside = base.join("outside");
    std::fs::create_dir_all(root.join("a/deep")).unwrap();
    std::fs::create_dir_all(root.join("b")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(root.join("a/file"), "inside\n").unwrap();
    std::fs::write(root.join("file"), "top\n").unwrap();
    std::fs::write(outside.join("secret"), "secret\n").unwrap();
    // Inside -> inside, relative.
    symlink("a", root.join("link_in")).unwrap();
    symlink("..", root.join("a/up")).unwrap();
    symlink("../link_in/deep", root.join("b/chain")).unwrap();
    // Inside -> inside, but absolute: refused like every absolute link.
    symlink(root.join("a"), root.join("link_in_abs")).unwrap();
    // Inside -> outside, relative and absolute, direct and through a chain.
    symlink("../outside", root.join("link_out")).unwrap();
    symlink(&outside, root.join("link_out_abs")).unwrap();
    symlink("../link_out", root.join("a/chain_out")).unwrap();
    symlink("../../outside/secret", root.join("a/secret_link")).unwrap();
    // Dangling.
    symlink("nowhere", root.join("dangling")).unwrap();
    let env = Env::for_root(&root).unwrap();
    Tree { _dir: dir, root, outside, env }
}

/// The outcome of a lookup reduced to what both strategies must agree on.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Opened(PathBuf),
    Failed(ErrorType),
}

fn lookup(tree: &Tree, path: &str, strategy: Lookup) -> Outcome {
    check_path(path).unwrap();
    match resolve_at(&tree.env, Path::new(path), path, OFlags::PATH, strategy) {
        Ok(resolved) => {
            // Ask the kernel independently where the descriptor points.
            let real =
                std::fs::read_link(format!("/proc/self/fd/{}", resolved.fd.as_raw_fd())).unwrap();
            assert!(real.starts_with(&tree.root), "{path:?} opened {real:?}, outside the root");
            assert_eq!(real, resolved.path);
            Outcome::Opened(real)
        }
        Err(err) => Outcome::Failed(err.error_type()),
    }
}

#[test]
fn both_strategies_confine_the_named_cases() {
    let tree = tree();
    let denied = Outcome::Failed(ErrorType::AccessDenied);
    let cases: Vec<(String, Outcome)> = vec![
        ("a/file".into(), Outcome::Opened(tree.root.join("a/file"))),
        ("link_in/file".into(), Outcome::Opened(tree.root.join("a/file"))),
        ("a/up/a/up/file".into(), Outcome::Opened(tree.root.join("file"))),
        ("b/chain".into(), Outcome::Opened(tree.root.join("a/deep"))),
        ("a/../b/./".into(), Outcome::Opened(tree.root.join("b"))),
        (".".into(), Outcome::Opened(tree.root.clone())),
        (tree.root.join("a").display().to_string(), Outcome::Opened(tree.root.join("a"))),
        ("..".into(), denied.clone()),
        ("a/../../outside/secret".into(), denied.clone()),
        (tree.outside.join("secret").display().to_string(), denied.clone()),
        ("link_out/secret".into(), denied.clone()),
        ("link_out_abs/secret".into(), denied.clone()),
        ("link_in_abs/file".into(), denied.clone()),
        ("a/chain_out/secret".into(), denied.clone()),
        ("a/secret_link".into(), denied.clone()),
        ("a/up/..".into(), denied.clone()),
        ("missing".into(), Outcome::Failed(ErrorType::NotFound)),
        ("dangling".into(), Outcome::Failed(ErrorType::NotFound)),
        ("file/".into(), Outcome::Failed(ErrorType::NotFound)),
        ("file/..".into(), Outcome::Failed(ErrorType::NotFound)),
    ];
    for (path, want) in cases {
        for strategy in [Lookup::Auto, Lookup::Walk] {
            assert_eq!(lookup(&tree, &path, strategy), want, "{path:?} via {strategy:?}");
        }
    }
}

#[test]
fn the_walk_opens_files_for_reading_and_refuses_a_final_symlink_with_nofollow() {
    let tree = tree();
    let root_fd = open_root(&tree.root, "root").unwrap();
    let flags = OFlags::RDONLY | OFlags::NONBLOCK;
    let (fd, walked) = walk_beneath(root_fd.as_fd(), Path::new("link_in/file"), flags).unwrap();
    assert_eq!(walked, Path::new("a/file"));
    let mut text = String::new();
    std::fs::File::from(fd).read_to_string(&mut text).unwrap();
    assert_eq!(text, "inside\n");
    let nofollow = OFlags::PATH | OFlags::NOFOLLOW;
    assert_eq!(
        walk_beneath(root_fd.as_fd(), Path::new("link_in"), nofollow).map(|_| ()),
        Err(Errno::LOOP)
    );
}

#[test]
fn parents_are_created_beneath_the_root_with_both_strategies() {
    let tree = tree();
    for (strategy, dir) in [(Lookup::Auto, "n1"), (Lookup::Walk, "n2")] {
        let path = format!("link_in/{dir}/x/y/new.txt");
        let parent =
            resolve_parent_at(&tree.env, Path::new(&path), &path, ParentDirs::Create, strategy)
                .unwrap();
        assert_eq!(parent.dir_path, tree.root.join("a").join(dir).join("x/y"));
        assert_eq!(parent.name, "new.txt");
        assert!(tree.root.join("a").join(dir).join("x/y").is_dir());
        // Through a link that leads out, nothing is created anywhere.
        let out = format!("link_out/{dir}/new.txt");
        let err = resolve_parent_at(&tree.env, Path::new(&out), &out, ParentDirs::Create, strategy)
            .unwrap_err();
        assert_eq!(err.error_type(), ErrorType::AccessDenied);
        assert!(!tree.outside.join(dir).exists());
    }
}

#[test]
fn final_names_must_be_real_names() {
    let tree = tree();
    for path in ["a/", "a/.", "a/..", "/"] {
        let err = resolve_parent(&tree.env, path, ParentDirs::MustExist).unwrap_err();
        assert_eq!(err.error_type(), ErrorType::InvalidArguments, "{path:?}");
    }
}

#[test]
fn bad_paths_are_invalid_arguments() {
    let tree = tree();
    let huge = "a/".repeat(MAX_PATH_BYTES);
    for path in ["", "a\0b", huge.as_str()] {
        let err = resolve(&tree.env, path).unwrap_err();
        assert_eq!(err.error_type(), ErrorType::InvalidArguments, "{:?}", shorten(path));
    }
}

#[tokio::test]
async fn path_locks_leave_no_entries_behind() {
    let path = PathBuf::from("/lock-test/cleanup");
    {
        let _held = lock_path(&path).await;
        assert!(lock::is_tracked(&path));
    }
    assert!(!lock::is_tracked(&path));

    // A waiter that gives up before getting the lock leaves nothing behind either.
    let held = lock_path(&path).await;
    let waiter = {
        let path = path.clone();
        tokio::spawn(async move {
            let _never = lock_path(&path).await;
        })
    };
    tokio::task::yield_now().await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    drop(held);
    assert!(!lock::is_tracked(&path));
}

/// One path component of a generated path.
fn component() -> impl proptest::strategy::Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "a",
        "b",
        "..",
        ".",
        "file",
        "deep",
        "up",
        "link_in",
        "link_in_abs",
        "link_out",
        "link_out_abs",
        "chain",
        "chain_out",
        "secret",
        "secret_link",
        "dangling",
        "outside",
        "missing",
    ])
}

/// Where a generated path starts: relative to the cwd, at the root, at the directory
/// holding the root, or somewhere unrelated.
#[derive(Clone, Copy, Debug)]
enum Start {
    Relative,
    Root,
    AboveRoot,
    Elsewhere,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_generated_path_escapes_the_root(
        start in prop::sample::select(vec![
            Start::Relative, Start::Root, Start::AboveRoot, Start::Elsewhere,
        ]),
        components in prop::collection::vec(component(), 1..8),
        trailing_slash in any::<bool>(),
    ) {
        let tree = tree();
        let mut path = components.join("/");
        if trailing_slash {
            path.push('/');
        }
        let path = match start {
            Start::Relative => path,
            Start::Root => format!("{}/{path}", tree.root.display()),
            Start::AboveRoot => format!("{}/{path}", tree.outside.parent().unwrap().display()),
            Start::Elsewhere => format!("/abs/{path}"),
        };
        let kernel = lookup(&tree, &path, Lookup::Auto);
        let walk = lookup(&tree, &path, Lookup::Walk);
        prop_assert_eq!(&kernel, &walk, "strategies disagree on {:?}", path);
        if let Outcome::Failed(kind) = kernel {
            prop_assert!(
                matches!(kind, ErrorType::AccessDenied | ErrorType::NotFound),
                "{:?} failed with {:?}", path, kind
            );
        }
    }
}

#[test]
fn content_hash_notices_any_one_byte_change_and_any_length_change() {
    for len in [0usize, 1, 7, 8, 31, 32, 33, 100, 4096] {
        let base: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let hash = content_hash(&base);
        assert_eq!(hash, content_hash(&base.clone()), "stable for {len}");
        for at in 0..len {
            let mut changed = base.clone();
            changed[at] ^= 0x20;
            assert_ne!(content_hash(&changed), hash, "byte {at} of {len}");
        }
        let mut longer = base.clone();
        longer.push(0);
        assert_ne!(content_hash(&longer), hash, "a zero byte appended to {len}");
    }
}

#[test]
fn snapshot_reads_stop_at_the_stat_size_and_capped_reads_go_to_the_end() {
    let info = |len| FileInfo {
        kind: FileKind::File,
        len,
        modified: None,
        mode: 0o100644,
        uid: 0,
        gid: 0,
        nlink: 1,
    };
    let grown = b"0123456789 and what was appended later";
    // Known size: the snapshot is what fstat saw; a read-modify-write sees it all.
    assert_eq!(read_snapshot(&grown[..], &info(10), 100, "f").unwrap(), b"0123456789");
    assert_eq!(read_capped(&grown[..], &info(10), 100, "f").unwrap(), grown);
    // No size reported (procfs): read to the end, within the limit.
    assert_eq!(read_snapshot(&grown[..], &info(0), 100, "f").unwrap(), grown);
    assert!(matches!(read_snapshot(&grown[..], &info(0), 20, "f"), Err(FsError::TooLarge(_))));
    assert!(matches!(read_capped(&grown[..], &info(10), 20, "f"), Err(FsError::TooLarge(_))));
    // A file shorter than it said ends where it ends.
    assert_eq!(read_snapshot(&b"abc"[..], &info(10), 100, "f").unwrap(), b"abc");
}
