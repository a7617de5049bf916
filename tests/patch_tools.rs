//! apply_patch end to end: patches written by real `git diff` and `git format-patch`,
//! line endings and indentation kept, all-or-nothing on a mismatch, permission rules
//! over every path of a patch, and kill -9 of the real daemon in the middle of a
//! 20-file patch.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::TestDaemon;
use tokio_util::sync::CancellationToken;
use toolgate::permission::{
    CallContext, Mode, PermissionEngine, Policy, RuleConfig, ToolFacts, Verdict,
};
use toolgate::tools::builtin::apply_patch;
use toolgate::tools::{Call, Env, ErrorType, Registry, ToolResult};

/// One journal directory for the whole test process.
fn journal_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let dir = DIR.get_or_init(|| tempfile::tempdir().unwrap());
    apply_patch::set_journal_dir(dir.path().join("patches"));
    dir.path()
}

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    env: Arc<Env>,
    registry: Registry,
}

impl Fixture {
    fn new() -> Fixture {
        journal_dir();
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        Fixture {
            env: Arc::new(Env::for_root(&root).unwrap()),
            _dir: dir,
            root,
            registry: Registry::with_builtins(),
        }
    }

    /// A fresh session (nothing read yet) on the same root.
    fn new_session(&mut self) {
        self.env = Arc::new(Env::for_root(&self.root).unwrap());
    }

    async fn call(&self, name: &str, args: Value) -> ToolResult {
        self.registry
            .execute(&Call::from_value("c1", name, &args), &self.env, &CancellationToken::new())
            .await
    }

    fn write(&self, rel: &str, bytes: impl AsRef<[u8]>) {
        let path = self.root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    /// Reads every file under the root (but .git) in this session.
    async fn read_all(&self) {
        for rel in snapshot(&self.root).keys() {
            let res = self.call("read_file", json!({"path": rel})).await;
            assert!(res.ok, "{res:#?}");
        }
    }

    fn git(&self, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(args)
            .current_dir(&self.root)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", &self.root)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }
}

/// Every file under `root` (but .git) with its bytes.
fn snapshot(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            if entry.file_name() == ".git" {
                continue;
            }
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            } else {
                files.insert(
                    path.strip_prefix(root).unwrap().display().to_string(),
                    std::fs::read(&path).unwrap(),
                );
            }
        }
    }
    files
}

#[track_caller]
fn assert_ok(res: &ToolResult) {
    assert!(res.ok, "expected success, got {res:#?}");
}

fn git_available() -> bool {
    Command::new("git").arg("--version").output().is_ok_and(|out| out.status.success())
}

#[tokio::test]
async fn patches_from_real_git_diff_and_format_patch_apply() {
    if !git_available() {
        println!("skipped: git is not installed");
        return;
    }
    let mut fx = Fixture::new();
    fx.git(&["init", "-q"]);
    fx.git(&["config", "user.email", "t@example.com"]);
    fx.git(&["config", "user.name", "T"]);
    fx.git(&["config", "core.autocrlf", "false"]);
    fx.write(
        "src/main.rs",
        "fn main() {\n\tlet a = 1;\n\tif a > 0 {\n\t\tprintln!(\"{a}\");\n\t}\n}\n",
    );
    fx.write("windows.txt", "first\r\nsecond\r\nthird\r\nfourth\r\n");
    fx.write("docs/guide.md", "# Guide\n\nStep one.\nStep two.\nStep three.\n");
    fx.write("old.txt", "to be removed\n");
    fx.write("tail.txt", "no newline at the end");
    fx.git(&["add", "-A"]);
    fx.git(&["commit", "-qm", "base"]);

    fx.write("src/main.rs", "fn main() {\n\tlet a = 2;\n\tif a > 0 {\n\t\tprintln!(\"a = {a}\");\n\t\tprintln!(\"done\");\n\t}\n}\n");
    fx.write("windows.txt", "first\r\nSECOND\r\nthird\r\nfourth\r\nfifth\r\n");
    std::fs::remove_file(fx.root.join("docs/guide.md")).unwrap();
    fx.write("manual/guide.md", "# Guide\n\nStep one.\nStep two, revised.\nStep three.\n");
    std::fs::remove_file(fx.root.join("old.txt")).unwrap();
    fx.write("new/dir/added.txt", "brand new\n\twith a tab\n");
    fx.write("tail.txt", "no newline at the end, still");
    fx.git(&["add", "-A"]);
    fx.git(&["commit", "-qm", "change several files\n\nWith a body."]);
    let expected = snapshot(&fx.root);
    let base = fx.git(&["rev-parse", "HEAD~1"]).trim().to_owned();
    let diff = fx.git(&["diff", "-M", "HEAD~1", "HEAD"]);
    let mail = fx.git(&["format-patch", "-M", "-1", "--stdout", "HEAD"]);
    assert!(diff.contains("rename from docs/guide.md"), "{diff}");

    for (label, patch) in [("git diff", &diff), ("git format-patch", &mail)] {
        fx.git(&["reset", "-q", "--hard", &base]);
        fx.git(&["clean", "-q", "-f", "-d"]);
        let old = snapshot(&fx.root);
        assert_ne!(old, expected);
        fx.new_session();
        fx.read_all().await;
        let res = fx.call("apply_patch", json!({"patch": patch})).await;
        assert_ok(&res);
        assert_eq!(snapshot(&fx.root), expected, "{label}: {}", res.content);
        let files = res.metadata["files"].as_array().unwrap();
        assert_eq!(files.len(), 6, "{label}: {files:?}");
        let moved = files.iter().find(|file| file["action"] == "moved").unwrap();
        assert_eq!(moved["moved_from"], "docs/guide.md");
        assert_eq!((moved["added"].as_u64(), moved["removed"].as_u64()), (Some(1), Some(1)));
        assert!(res.content.contains("+\t\tprintln!(\"done\");"), "{}", res.content);
        let stages: Vec<&str> = res.metadata["hunks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["stage"].as_str().unwrap())
            .collect();
        assert!(stages.iter().all(|stage| *stage == "exact"), "{label}: {stages:?}");
    }
}

#[tokio::test]
async fn a_format_patch_series_touching_one_file_twice_applies_in_order() {
    if !git_available() {
        println!("skipped: git is not installed");
        return;
    }
    let mut fx = Fixture::new();
    fx.git(&["init", "-q"]);
    fx.git(&["config", "user.email", "t@example.com"]);
    fx.git(&["config", "user.name", "T"]);
    let base: String = (1..=30).map(|n| format!("line {n}\n")).collect();
    fx.write("notes.txt", &base);
    fx.git(&["add", "-A"]);
    fx.git(&["commit", "-qm", "base"]);
    fx.write("notes.txt", base.replace("line 3\n", "line three\n"));
    fx.git(&["commit", "-qam", "first"]);
    let second =
        base.replace("line 3\n", "line three\n").replace("line 28\n", "line 28\nline 28.5\n");
    fx.write("notes.txt", &second);
    fx.write("other.txt", "other\n");
    fx.git(&["add", "-A"]);
    fx.git(&["commit", "-qm", "second"]);
    let series = fx.git(&["format-patch", "-2", "--stdout"]);
    fx.git(&["reset", "-q", "--hard", "HEAD~2"]);
    fx.new_session();
    fx.read_all().await;
    let res = fx.call("apply_patch", json!({"patch": series})).await;
    assert_ok(&res);
    assert_eq!(std::fs::read_to_string(fx.root.join("notes.txt")).unwrap(), second);
    assert_eq!(std::fs::read_to_string(fx.root.join("other.txt")).unwrap(), "other\n");
    // One hunk per commit on notes.txt; other.txt is added whole.
    assert_eq!(res.metadata["hunks"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn codex_patches_keep_crlf_and_tabs_and_report_loose_matches() {
    let fx = Fixture::new();
    fx.write("win.txt", "alpha\r\nbeta\r\ngamma\r\n");
    fx.write("tabs.go", "func f() {\n\tif x {\n\t\treturn 1\n\t}\n}\n");
    fx.write("quote.md", "He said \u{201C}hello\u{201D} \u{2014} twice.  \nEnd.\n");
    fx.read_all().await;
    let patch = "*** Begin Patch\n\
                 *** Update File: win.txt\n@@\n alpha\n-beta\n+BETA\n+inserted\n gamma\n\
                 *** Update File: tabs.go\n@@ func f() {\n     if x {\n-        return 1\n+\t\treturn 2\n\
                 *** Update File: quote.md\n@@\n-He said \"hello\" - twice.\n+He said \"bye\".\n End.\n\
                 *** End Patch";
    let res = fx.call("apply_patch", json!({"patch": patch})).await;
    assert_ok(&res);
    assert_eq!(
        std::fs::read(fx.root.join("win.txt")).unwrap(),
        b"alpha\r\nBETA\r\ninserted\r\ngamma\r\n"
    );
    assert_eq!(
        std::fs::read_to_string(fx.root.join("tabs.go")).unwrap(),
        "func f() {\n\tif x {\n\t\treturn 2\n\t}\n}\n"
    );
    assert_eq!(
        std::fs::read_to_string(fx.root.join("quote.md")).unwrap(),
        "He said \"bye\".\nEnd.\n"
    );
    let stages: Vec<(String, String)> = res.metadata["hunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["path"].as_str().unwrap().to_owned(), h["stage"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(
        stages,
        [
            ("win.txt".to_owned(), "exact".to_owned()),
            ("tabs.go".to_owned(), "ignoring_whitespace".to_owned()),
            ("quote.md".to_owned(), "normalized_punctuation".to_owned()),
        ]
    );
    assert!(
        res.content.contains("tabs.go hunk 1 at line 2: ignoring_whitespace"),
        "{}",
        res.content
    );
}

#[tokio::test]
async fn a_mismatched_hunk_leaves_every_file_untouched() {
    let fx = Fixture::new();
    fx.write("a.txt", "one\ntwo\nthree\n");
    fx.write("b.txt", "uno\ndos\ntres\n");
    fx.write("c.txt", "fn compute(total: u32) -> u32 {\n    total * 2\n}\n");
    fx.read_all().await;
    let before = snapshot(&fx.root);
    let patch = "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** Delete File: b.txt\n\
                 *** Add File: d.txt\n+new\n*** Update File: c.txt\n@@\n fn compute(totl: u32) -> u32 {\n\
                 -    total * 3\n+    total * 4\n*** End Patch\n";
    let res = fx.call("apply_patch", json!({"patch": patch})).await;
    assert!(!res.ok);
    assert_eq!(res.error_type, Some(ErrorType::NotFound), "{res:#?}");
    let error = res.error.as_deref().unwrap();
    assert!(error.contains("hunk 1 of c.txt does not apply"), "{error}");
    assert!(
        error.contains("     1\tfn compute(total: u32) -> u32 {"),
        "nearest lines missing: {error}"
    );
    assert_eq!(res.metadata["closest_line"], 1);
    assert_eq!(snapshot(&fx.root), before);

    // The same patch in dry-run mode after fixing the hunk: a diff, still no change.
    let fixed = patch.replace("totl", "total").replace("total * 3", "total * 2");
    let res = fx.call("apply_patch", json!({"patch": fixed, "dry_run": true})).await;
    assert_ok(&res);
    assert!(res.content.starts_with("would change 4 files"), "{}", res.content);
    assert!(res.content.contains("--- a/b.txt\n+++ /dev/null"), "{}", res.content);
    assert_eq!(snapshot(&fx.root), before);

    let res = fx.call("apply_patch", json!({"patch": fixed})).await;
    assert_ok(&res);
    let after = snapshot(&fx.root);
    assert_eq!(after["a.txt"], b"ONE\ntwo\nthree\n");
    assert!(!after.contains_key("b.txt"));
    assert_eq!(after["d.txt"], b"new\n");
    assert_eq!(after["c.txt"], b"fn compute(total: u32) -> u32 {\n    total * 4\n}\n");
    // The session knows the new contents: a second patch needs no new read.
    let res = fx.call("apply_patch", json!({"patch": "*** Begin Patch\n*** Update File: d.txt\n-new\n+newer\n*** End Patch"})).await;
    assert_ok(&res);
}

#[tokio::test]
async fn every_path_is_confined_and_must_be_fresh() {
    let fx = Fixture::new();
    fx.write("seen.txt", "a\n");
    fx.write("unseen.txt", "b\n");
    let res = fx.call("read_file", json!({"path": "seen.txt"})).await;
    assert_ok(&res);
    let before = snapshot(&fx.root);
    let stale = "*** Begin Patch\n*** Update File: seen.txt\n-a\n+A\n*** Update File: unseen.txt\n-b\n+B\n*** End Patch";
    let res = fx.call("apply_patch", json!({"patch": stale})).await;
    assert_eq!(res.error_type, Some(ErrorType::StaleFile), "{res:#?}");
    let escape = "*** Begin Patch\n*** Update File: seen.txt\n-a\n+A\n*** Add File: ../escape.txt\n+x\n*** End Patch";
    let res = fx.call("apply_patch", json!({"patch": escape})).await;
    assert_eq!(res.error_type, Some(ErrorType::AccessDenied), "{res:#?}");
    assert!(!fx.root.parent().unwrap().join("escape.txt").exists());
    // Through symbolic links leading out of the root: a directory and a file.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "secret\n").unwrap();
    std::os::unix::fs::symlink(outside.path(), fx.root.join("out")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), fx.root.join("secret.txt"))
        .unwrap();
    for sneaky in [
        "*** Begin Patch\n*** Update File: seen.txt\n-a\n+A\n*** Add File: out/planted.txt\n+x\n*** End Patch",
        "*** Begin Patch\n*** Update File: seen.txt\n-a\n+A\n*** Update File: secret.txt\n-secret\n+pwned\n*** End Patch",
        "*** Begin Patch\n*** Update File: seen.txt\n*** Move to: out/moved.txt\n-a\n+A\n*** End Patch",
    ] {
        let res = fx.call("apply_patch", json!({"patch": sneaky})).await;
        assert_eq!(res.error_type, Some(ErrorType::AccessDenied), "{sneaky}: {res:#?}");
    }
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    assert_eq!(std::fs::read_to_string(outside.path().join("secret.txt")).unwrap(), "secret\n");
    std::fs::remove_file(fx.root.join("out")).unwrap();
    std::fs::remove_file(fx.root.join("secret.txt")).unwrap();
    let res = fx
        .call(
            "apply_patch",
            json!({"patch": "*** Begin Patch\n*** Update File: seen.txt\n-a\n+A\n"}),
        )
        .await;
    assert_eq!(res.error_type, Some(ErrorType::InvalidArguments), "{res:#?}");
    assert_eq!(snapshot(&fx.root), before);
}

#[test]
fn permission_rules_see_every_path_of_a_patch() {
    let config = RuleConfig {
        allow: vec!["Edit(src/**)".to_owned()],
        ask: Vec::new(),
        deny: vec!["Edit(secrets/**)".to_owned()],
        ..RuleConfig::default()
    };
    let engine = PermissionEngine::new(Policy::new(&config, None).unwrap(), Mode::Default);
    let definition = apply_patch::tool().definition().clone();
    let facts = ToolFacts::of(&definition);
    let roots = [PathBuf::from("/w/proj")];
    let ctx = CallContext {
        cwd: Path::new("/w/proj"),
        roots: &roots,
        resolver: &toolgate::permission::Lexical,
    };
    let decide = |patch: &str| engine.decide(&facts, &json!({"patch": patch}), &ctx);

    let only_src = "*** Begin Patch\n*** Update File: src/a.rs\n-x\n+y\n*** Add File: src/b.rs\n+z\n*** End Patch";
    assert_eq!(decide(only_src).verdict, Verdict::Allow);
    // One denied path among allowed ones refuses the whole patch, whichever format.
    let sneaky = "*** Begin Patch\n*** Update File: src/a.rs\n-x\n+y\n*** Update File: src/c.rs\n\
                  *** Move to: secrets/key.pem\n-x\n+y\n*** End Patch";
    let decision = decide(sneaky);
    assert_eq!(decision.verdict, Verdict::Deny);
    assert_eq!(decision.explanation.rule.as_deref(), Some("Edit(secrets/**)"));
    let unified = "diff --git a/src/a.rs b/src/a.rs\n--- a/src/a.rs\n+++ b/src/a.rs\n@@ -1 +1 @@\n-x\n+y\n\
                   diff --git a/secrets/k b/secrets/k\n--- a/secrets/k\n+++ b/secrets/k\n@@ -1 +1 @@\n-x\n+y\n";
    assert_eq!(decide(unified).verdict, Verdict::Deny);
    // A path outside the allow rule asks, and the suggestions cover it.
    let outside = "*** Begin Patch\n*** Update File: src/a.rs\n-x\n+y\n*** Add File: docs/x.md\n+z\n*** End Patch";
    let decision = decide(outside);
    assert_eq!(decision.verdict, Verdict::Ask);
    assert!(decision.suggestions.iter().any(|rule| rule.contains("docs")), "{decision:?}");
    // accept_edits mode lets a patch inside the roots through, not one leaving them.
    let accepting = PermissionEngine::new(Policy::default(), Mode::AcceptEdits);
    let inside = json!({"patch": outside});
    assert_eq!(accepting.decide(&facts, &inside, &ctx).verdict, Verdict::Allow);
    let leaving = json!({"patch": "*** Begin Patch\n*** Add File: ../other/x\n+z\n*** End Patch"});
    assert_eq!(accepting.decide(&facts, &leaving, &ctx).verdict, Verdict::Ask);
    // notebook_edit is an Edit too.
    let notebook = toolgate::tools::builtin::notebook_edit::tool().definition().clone();
    let decision =
        engine.decide(&ToolFacts::of(&notebook), &json!({"path": "secrets/n.ipynb"}), &ctx);
    assert_eq!(decision.verdict, Verdict::Deny);
}

// ------------------------------------------------------------------------------
// kill -9 of the real daemon in the middle of a 20-file patch.

#[test]
fn kill_9_during_a_20_file_patch_leaves_all_old_or_all_new_after_restart() {
    let mut daemon = TestDaemon::start("[permissions]\nmode = \"bypass\"\n");
    daemon.kill();
    let workspace = daemon.path("workspace");
    let old_content = |idx: usize| format!("// file {idx}\nconst VALUE: u32 = {idx};\n");
    let mut patch = String::from("*** Begin Patch\n");
    for idx in 0..20 {
        patch.push_str(&format!("*** Update File: f{idx:02}.rs\n@@\n-const VALUE: u32 = {idx};\n+const VALUE: u32 = {};\n", idx + 100));
    }
    patch.push_str("*** End Patch\n");
    let new_content = |idx: usize| format!("// file {idx}\nconst VALUE: u32 = {};\n", idx + 100);

    let (mut saw_old, mut saw_new) = (0, 0);
    let mut seed = u64::from(std::process::id()) | 1;
    for round in 0..16 {
        for idx in 0..20 {
            std::fs::write(workspace.join(format!("f{idx:02}.rs")), old_content(idx)).unwrap();
        }
        daemon.restart();
        let mut client = daemon.connect();
        for idx in 0..20 {
            let read = client.call("read_file", json!({"path": format!("f{idx:02}.rs")}));
            assert_eq!(read["ok"], true, "{read}");
        }
        client.send("tools/call", json!({"name": "apply_patch", "arguments": {"patch": patch}}));
        // The kill lands at a pseudo-random point of the commit: right away, or once
        // that many staged files are seen (or the patch is seen finished).
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let wanted = match round % 4 {
            0 => None,
            // Past the last staged file: the commit line and the renames.
            1 => Some(21),
            2 => Some(usize::try_from(15 + seed % 6).unwrap()),
            _ => Some(usize::try_from(seed % 21).unwrap()),
        };
        if let Some(wanted) = wanted {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let staged = std::fs::read_dir(&workspace)
                    .unwrap()
                    .filter_map(Result::ok)
                    .filter(|entry| entry.file_name().to_string_lossy().ends_with(".tmp"))
                    .count();
                let finished = std::fs::read_to_string(workspace.join("f19.rs"))
                    .is_ok_and(|text| text == new_content(19));
                if staged >= wanted || finished {
                    break;
                }
                assert!(Instant::now() < deadline, "the patch never started");
                std::thread::yield_now();
            }
        }
        daemon.kill();
        // The restart recovers before it listens.
        daemon.restart();
        let contents: Vec<String> = (0..20)
            .map(|idx| std::fs::read_to_string(workspace.join(format!("f{idx:02}.rs"))).unwrap())
            .collect();
        if contents.iter().enumerate().all(|(idx, text)| *text == old_content(idx)) {
            saw_old += 1;
        } else {
            for (idx, text) in contents.iter().enumerate() {
                assert_eq!(
                    *text,
                    new_content(idx),
                    "round {round} (kill at {wanted:?}): mixed state"
                );
            }
            saw_new += 1;
        }
        let leftovers: Vec<String> = std::fs::read_dir(&workspace)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "staged files left: {leftovers:?}");
        let journals = daemon.path("state/toolgate/patches");
        if journals.exists() {
            assert_eq!(std::fs::read_dir(&journals).unwrap().count(), 0, "a journal was left");
        }
        daemon.kill();
    }
    println!("kill -9 rounds: {saw_old} left the old state, {saw_new} the new one");
}
