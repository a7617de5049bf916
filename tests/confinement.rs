//! Every file tool stays inside the session roots, whatever path the model sends:
//! `..`, absolute paths, symlinks (direct, through an intermediate directory,
//! swapped in after a read), and malformed input. Also the atomic write's promise
//! that a failed write leaves the target as it was and no temporary file behind.

#![expect(
    clippy::unwrap_used,
    reason = "fixture code outside #[test] functions fails loudly on a broken setup"
)]

use std::os::fd::AsFd;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolgate::tools::fs::{self, ParentDirs};
use toolgate::tools::{Call, Env, ErrorType, Registry, ToolResult};

/// A session root next to a directory it must never reach.
struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
    env: Arc<Env>,
    registry: Registry,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let root = base.join("root");
        let outside = base.join("outside");
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::create_dir_all(outside.join("dir")).unwrap();
        std::fs::write(root.join("src/lib.rs"), "pub fn f() {}\n").unwrap();
        std::fs::write(outside.join("secret.txt"), "secret\n").unwrap();
        std::fs::write(outside.join("dir/inner.txt"), "inner\n").unwrap();
        let env = Arc::new(Env::for_root(&root).unwrap());
        Fixture { _dir: dir, root, outside, env, registry: Registry::with_builtins() }
    }

    async fn call(&self, name: &str, args: Value) -> ToolResult {
        let call = Call::from_value("c1", name, &args);
        self.registry.execute(&call, &self.env, &CancellationToken::new()).await
    }

    async fn call_raw(&self, name: &str, arguments: &str) -> ToolResult {
        let call = Call::new("c1", name, arguments);
        self.registry.execute(&call, &self.env, &CancellationToken::new()).await
    }

    /// Every file and its content under `outside`, to prove nothing there changed.
    fn outside_snapshot(&self) -> Vec<(PathBuf, Vec<u8>)> {
        let mut entries = Vec::new();
        let mut stack = vec![self.outside.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let meta = std::fs::symlink_metadata(&path).unwrap();
                if meta.is_dir() {
                    stack.push(path.clone());
                    entries.push((path, Vec::new()));
                } else {
                    entries.push((path.clone(), std::fs::read(&path).unwrap()));
                }
            }
        }
        entries.sort();
        entries
    }
}

#[track_caller]
fn assert_denied(res: &ToolResult) {
    assert!(!res.ok, "expected access_denied, got success: {res:#?}");
    assert_eq!(res.error_type, Some(ErrorType::AccessDenied), "{res:#?}");
}

#[track_caller]
fn assert_invalid(res: &ToolResult) {
    assert!(!res.ok, "expected invalid_arguments, got success: {res:#?}");
    assert_eq!(res.error_type, Some(ErrorType::InvalidArguments), "{res:#?}");
}

/// The three file tools, each asked to touch `path`.
fn calls_on(path: &str) -> Vec<(&'static str, Value)> {
    vec![
        ("read_file", json!({"path": path})),
        ("write_file", json!({"path": path, "content": "pwned\n"})),
        ("edit_file", json!({"path": path, "old_string": "secret", "new_string": "pwned"})),
        ("edit_file", json!({"path": path, "old_string": "", "new_string": "pwned\n"})),
    ]
}

async fn assert_all_denied(fx: &Fixture, path: &str) {
    let before = fx.outside_snapshot();
    for (tool, args) in calls_on(path) {
        let res = fx.call(tool, args).await;
        assert_denied(&res);
        assert_eq!(res.tool, tool);
    }
    assert_eq!(fx.outside_snapshot(), before, "{path:?} changed something outside the root");
}

#[tokio::test]
async fn dot_dot_escapes_are_denied() {
    let fx = Fixture::new();
    assert_all_denied(&fx, "../outside/secret.txt").await;
    assert_all_denied(&fx, "src/../../outside/secret.txt").await;
    assert_all_denied(&fx, "../outside/new.txt").await;
    assert_all_denied(&fx, "../outside/newdir/new.txt").await;
    assert!(!fx.outside.join("newdir").exists());
}

#[tokio::test]
async fn absolute_paths_outside_the_roots_are_denied() {
    let fx = Fixture::new();
    assert_all_denied(&fx, &fx.outside.join("secret.txt").display().to_string()).await;
    assert_all_denied(&fx, "/etc/passwd").await;
    // An absolute path that starts inside and climbs out.
    assert_all_denied(&fx, &format!("{}/../outside/secret.txt", fx.root.display())).await;
    // The root itself cannot be replaced by a file.
    let res =
        fx.call("write_file", json!({"path": fx.root.display().to_string(), "content": "x"})).await;
    assert_denied(&res);
}

#[tokio::test]
async fn symlinks_leading_outside_are_denied() {
    let fx = Fixture::new();
    symlink(fx.outside.join("secret.txt"), fx.root.join("abs_link")).unwrap();
    symlink("../outside/secret.txt", fx.root.join("rel_link")).unwrap();
    symlink("rel_link", fx.root.join("chain_link")).unwrap();
    symlink("../outside/new.txt", fx.root.join("dangling_out")).unwrap();
    for path in ["abs_link", "rel_link", "chain_link", "dangling_out"] {
        assert_all_denied(&fx, path).await;
    }
    assert!(!fx.outside.join("new.txt").exists());
}

#[tokio::test]
async fn intermediate_directory_symlinks_leading_outside_are_denied() {
    let fx = Fixture::new();
    symlink("../outside/dir", fx.root.join("linked_dir")).unwrap();
    symlink(fx.outside.join("dir"), fx.root.join("src/abs_dir")).unwrap();
    for path in [
        "linked_dir/inner.txt",
        "linked_dir/new.txt",
        "linked_dir/sub/new.txt",
        "src/abs_dir/inner.txt",
        "src/abs_dir/new.txt",
    ] {
        assert_all_denied(&fx, path).await;
    }
    assert!(!fx.outside.join("dir/sub").exists());
    assert_eq!(
        fs::open_dir(&fx.env, Some("linked_dir")).unwrap_err().error_type(),
        ErrorType::AccessDenied
    );
}

#[tokio::test]
async fn a_symlink_swapped_in_after_a_read_is_denied() {
    let fx = Fixture::new();
    std::fs::write(fx.root.join("notes.txt"), "secret notes\n").unwrap();
    let res = fx.call("read_file", json!({"path": "notes.txt"})).await;
    assert!(res.ok, "{res:#?}");
    // Swap the file for a link to a file outside with the same content, so that no
    // staleness check could save the day: only confinement can.
    std::fs::write(fx.outside.join("secret.txt"), "secret notes\n").unwrap();
    std::fs::remove_file(fx.root.join("notes.txt")).unwrap();
    symlink(fx.outside.join("secret.txt"), fx.root.join("notes.txt")).unwrap();
    assert_all_denied(&fx, "notes.txt").await;
    assert_eq!(std::fs::read_to_string(fx.outside.join("secret.txt")).unwrap(), "secret notes\n");

    // The same with a directory on the way: read src/lib.rs, then make src a link.
    let res = fx.call("read_file", json!({"path": "src/lib.rs"})).await;
    assert!(res.ok, "{res:#?}");
    std::fs::write(fx.outside.join("dir/lib.rs"), "pub fn f() {}\n").unwrap();
    std::fs::rename(fx.root.join("src"), fx.root.join("src_old")).unwrap();
    symlink(fx.outside.join("dir"), fx.root.join("src")).unwrap();
    assert_all_denied(&fx, "src/lib.rs").await;
}

#[tokio::test]
async fn a_symlink_swapped_in_after_resolution_is_refused_by_nofollow() {
    let fx = Fixture::new();
    std::fs::write(fx.root.join("target.txt"), "content\n").unwrap();
    let target = fs::resolve_for_write(&fx.env, "target.txt", ParentDirs::MustExist).unwrap();
    // Between resolving the parent and opening the file, the name becomes a link.
    std::fs::remove_file(fx.root.join("target.txt")).unwrap();
    symlink(fx.outside.join("secret.txt"), fx.root.join("target.txt")).unwrap();
    let err = fs::open_existing(&target, "target.txt").unwrap_err();
    assert_eq!(err.error_type(), ErrorType::AccessDenied);
}

#[tokio::test]
async fn links_inside_the_root_are_followed() {
    let fx = Fixture::new();
    symlink("src", fx.root.join("code")).unwrap();
    let res = fx.call("read_file", json!({"path": "code/lib.rs"})).await;
    assert!(res.ok, "{res:#?}");
    assert_eq!(res.metadata["path"], fx.root.join("src/lib.rs").display().to_string());
    assert_eq!(fs::open_dir(&fx.env, Some("code")).unwrap().path, fx.root.join("src"));
    assert_eq!(fs::open_dir(&fx.env, None).unwrap().path, fx.root);
    assert_eq!(
        fs::open_dir(&fx.env, Some("src/lib.rs")).unwrap_err().error_type(),
        ErrorType::InvalidArguments
    );
}

#[tokio::test]
async fn every_root_of_a_session_is_reachable_and_nothing_else() {
    let fx = Fixture::new();
    let second = fx.outside.join("dir");
    let mut env = Env::for_root(&fx.root).unwrap();
    env.roots.push(std::fs::canonicalize(&second).unwrap());
    let env = Arc::new(env);
    let run = |name: &'static str, args: Value| {
        let env = env.clone();
        let registry = &fx.registry;
        async move {
            registry
                .execute(&Call::from_value("c1", name, &args), &env, &CancellationToken::new())
                .await
        }
    };
    let inner = second.join("inner.txt").display().to_string();
    let res = run("read_file", json!({"path": inner})).await;
    assert!(res.ok, "{res:#?}");
    let res =
        run("edit_file", json!({"path": inner, "old_string": "inner", "new_string": "edited"}))
            .await;
    assert!(res.ok, "{res:#?}");
    assert_eq!(std::fs::read_to_string(second.join("inner.txt")).unwrap(), "edited\n");
    // The second root does not open up its parent.
    assert_denied(
        &run("read_file", json!({"path": fx.outside.join("secret.txt").display().to_string()}))
            .await,
    );
    assert_denied(
        &run("read_file", json!({"path": format!("{}/../secret.txt", second.display())})).await,
    );
}

#[tokio::test]
async fn malformed_input_is_invalid_arguments_never_a_panic() {
    let fx = Fixture::new();
    let huge = "a".repeat(1024 * 1024);
    for tool in ["read_file", "write_file", "edit_file"] {
        for path in ["", "src/\u{0}lib.rs", huge.as_str()] {
            let args = match tool {
                "read_file" => json!({"path": path}),
                "write_file" => json!({"path": path, "content": "x"}),
                _ => json!({"path": path, "old_string": "a", "new_string": "b"}),
            };
            let res = fx.call(tool, args).await;
            assert_invalid(&res);
            assert!(res.error.as_deref().unwrap().len() < 1000, "the message echoes the input");
        }
    }
    for (tool, arguments) in [
        ("read_file", r#"{"path": 5}"#),
        ("read_file", r#"{"path": "src/lib.rs", "offset": "x"}"#),
        ("read_file", r#"{"path": "src/lib.rs", "limit": 0}"#),
        ("read_file", r#"{"path": "src/lib.rs", "limit": -3}"#),
        ("read_file", r#"{"path": "src/lib.rs", "extra": true}"#),
        ("read_file", r#"{}"#),
        ("read_file", r#"["src/lib.rs"]"#),
        ("read_file", r#"{"path": "src/lib.rs""#),
        ("write_file", r#"{"path": "a.txt"}"#),
        ("write_file", r#"{"path": "a.txt", "content": null}"#),
        ("edit_file", r#"{"path": "a.txt", "old_string": 1, "new_string": "b"}"#),
        ("edit_file", r#"{"path": "a.txt", "old_string": "a"}"#),
    ] {
        let res = fx.call_raw(tool, arguments).await;
        assert_invalid(&res);
    }
    assert!(!fx.root.join("a.txt").exists());
}

#[test]
fn a_failed_atomic_write_leaves_the_target_and_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir(root.join("empty_dir")).unwrap();
    std::fs::create_dir(root.join("full_dir")).unwrap();
    std::fs::write(root.join("full_dir/keep.txt"), "keep").unwrap();
    let env = Env::for_root(&root).unwrap();
    for name in ["empty_dir", "full_dir"] {
        // The rename target is a directory: everything up to the rename succeeds,
        // the rename fails, and the write must be undone.
        let parent = fs::resolve_parent(&env, name, ParentDirs::MustExist).unwrap();
        let err =
            fs::write_atomic(parent.dir.as_fd(), &parent.name, b"new content", None).unwrap_err();
        assert!(err.raw_os_error().is_some(), "{err}");
        assert!(root.join(name).is_dir());
        assert_eq!(listing(&root), ["empty_dir", "full_dir"]);
    }
    assert_eq!(std::fs::read_to_string(root.join("full_dir/keep.txt")).unwrap(), "keep");

    // The directory vanished after it was opened: the temporary file cannot even be
    // created, and nothing appears anywhere.
    std::fs::create_dir(root.join("gone")).unwrap();
    let parent = fs::resolve_parent(&env, "gone/file.txt", ParentDirs::MustExist).unwrap();
    std::fs::remove_dir(root.join("gone")).unwrap();
    assert!(fs::write_atomic(parent.dir.as_fd(), &parent.name, b"x", None).is_err());
    assert_eq!(listing(&root), ["empty_dir", "full_dir"]);
}

#[tokio::test]
async fn write_file_into_a_directory_name_keeps_everything() {
    let fx = Fixture::new();
    let before = std::fs::read_dir(fx.root.join("src")).unwrap().count();
    let res = fx.call("write_file", json!({"path": "src", "content": "x"})).await;
    assert_eq!(res.error_type, Some(ErrorType::IsDirectory), "{res:#?}");
    assert_eq!(std::fs::read_dir(fx.root.join("src")).unwrap().count(), before);
    assert_eq!(listing(&fx.root), ["src"]);
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Path components for generated write targets.
fn component() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "src",
        "new",
        "..",
        ".",
        "lib.rs",
        "out_link",
        "in_link",
        "abs_in",
        "outside",
        "dir",
        "secret.txt",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Whatever path write_file and edit_file are given, nothing outside the root
    /// changes, and whatever they report having written is inside it.
    #[test]
    fn generated_writes_never_touch_anything_outside(
        components in prop::collection::vec(component(), 1..6),
        absolute in any::<bool>(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let fx = Fixture::new();
        symlink("../outside/dir", fx.root.join("out_link")).unwrap();
        symlink("src", fx.root.join("in_link")).unwrap();
        symlink(fx.root.join("src"), fx.root.join("abs_in")).unwrap();
        let before = fx.outside_snapshot();
        let path = components.join("/");
        let path = if absolute { format!("{}/{path}", fx.root.display()) } else { path };
        for (tool, args) in [
            ("write_file", json!({"path": path, "content": "generated\n"})),
            ("edit_file", json!({"path": path, "old_string": "", "new_string": "generated\n"})),
        ] {
            let res = runtime.block_on(fx.call(tool, args));
            if res.ok {
                let written = PathBuf::from(res.metadata["path"].as_str().unwrap());
                prop_assert!(written.starts_with(&fx.root), "{} wrote {:?}", tool, written);
                prop_assert_eq!(std::fs::read_to_string(&written).unwrap(), "generated\n");
            } else {
                let kind = res.error_type.unwrap();
                prop_assert!(
                    matches!(
                        kind,
                        ErrorType::AccessDenied
                            | ErrorType::NotFound
                            | ErrorType::IsDirectory
                            | ErrorType::InvalidArguments
                            | ErrorType::StaleFile
                    ),
                    "{} on {:?}: {:#?}", tool, path, res
                );
            }
        }
        prop_assert_eq!(fx.outside_snapshot(), before, "{:?} changed something outside", path);
    }
}
