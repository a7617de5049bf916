//! find_files and search_code driven end to end through the Registry, each test on
//! its own temporary tree.

#![expect(
    clippy::unwrap_used,
    reason = "fixture helpers outside #[test] functions fail loudly on a broken setup"
)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use expect_test::{Expect, expect};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;
use toolgate::tools::{Call, Env, ErrorType, Registry, ToolResult};

/// A temporary directory holding `root/` (the session root) and `outside/` (a sibling
/// the session must never reach).
struct Tree {
    dir: TempDir,
}

impl Tree {
    fn new(files: &[(&str, &str)]) -> Tree {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        std::fs::create_dir(dir.path().join("outside")).unwrap();
        std::fs::write(dir.path().join("outside/secret.txt"), "needle outside\n").unwrap();
        let tree = Tree { dir };
        for (path, text) in files {
            tree.write(path, text.as_bytes());
        }
        tree
    }

    fn root(&self) -> std::path::PathBuf {
        self.dir.path().join("root")
    }

    fn write(&self, path: &str, bytes: &[u8]) {
        let full = self.root().join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, bytes).unwrap();
    }

    fn env(&self) -> Arc<Env> {
        Arc::new(Env::for_root(self.root()).unwrap())
    }

    async fn call(&self, tool: &str, args: Value) -> ToolResult {
        self.call_in(&self.env(), tool, args).await
    }

    async fn call_in(&self, env: &Arc<Env>, tool: &str, args: Value) -> ToolResult {
        let registry = Registry::with_builtins();
        let call = Call::from_value("c1", tool, &args);
        registry.execute(&call, env, &CancellationToken::new()).await
    }

    async fn ok(&self, tool: &str, args: Value) -> ToolResult {
        let res = self.call(tool, args.clone()).await;
        assert!(res.ok, "{tool} {args} failed: {res:?}");
        res
    }

    async fn content(&self, tool: &str, args: Value) -> String {
        self.ok(tool, args).await.content
    }

    async fn failure(&self, tool: &str, args: Value) -> (ErrorType, String) {
        let res = self.call(tool, args.clone()).await;
        assert!(!res.ok, "{tool} {args} unexpectedly succeeded: {}", res.content);
        (res.error_type.unwrap(), res.error.unwrap_or_default())
    }
}

fn check(actual: &str, expected: Expect) {
    expected.assert_eq(actual);
}

#[cfg(unix)]
fn symlink(target: impl AsRef<Path>, link: impl AsRef<Path>) {
    std::os::unix::fs::symlink(target, link).unwrap();
}

/// A small project: sources, an ignored build directory and log, a hidden directory
/// and a `.git` directory.
fn project() -> Tree {
    Tree::new(&[
        ("Cargo.toml", "[package]\nname = \"demo\"\n"),
        ("src/main.rs", "fn main() {\n    println!(\"hello\");\n}\n"),
        ("src/lib.rs", "pub fn hello() -> &'static str {\n    \"hello\"\n}\n"),
        ("src/util/mod.rs", "// Hello helpers\npub fn shout() {}\n"),
        ("README.md", "# demo\nSay hello.\n"),
        (".gitignore", "target/\n*.log\n"),
        ("target/debug/build.rs", "fn hello() {}\n"),
        ("run.log", "hello from the log\n"),
        (".hidden/config.rs", "const HELLO: &str = \"hello\";\n"),
        (".git/config", "hello = git\n"),
    ])
}

// ---------------------------------------------------------------------------------
// find_files

#[tokio::test]
async fn find_files_lists_sorted_paths_relative_to_the_root() {
    let tree = project();
    check(
        &tree.content("find_files", json!({"pattern": "*.rs"})).await,
        expect![[r#"
            src/lib.rs
            src/main.rs
            src/util/mod.rs
        "#]],
    );
}

#[tokio::test]
async fn find_files_respects_gitignore_outside_a_git_repository() {
    let tree = project();
    let listed = tree.content("find_files", json!({"pattern": "*"})).await;
    assert!(!listed.contains("target/"), "{listed}");
    assert!(!listed.contains("run.log"), "{listed}");
    let everything = tree.content("find_files", json!({"pattern": "*", "no_ignore": true})).await;
    assert!(everything.contains("target/debug/build.rs"), "{everything}");
    assert!(everything.contains("run.log"), "{everything}");
}

#[tokio::test]
async fn find_files_skips_hidden_files_unless_asked() {
    let tree = project();
    check(
        &tree.content("find_files", json!({"pattern": "*"})).await,
        expect![[r#"
            Cargo.toml
            README.md
            src/lib.rs
            src/main.rs
            src/util/mod.rs
        "#]],
    );
    // With `hidden`, dot files appear; the `.git` directory never does.
    check(
        &tree.content("find_files", json!({"pattern": "*", "hidden": true})).await,
        expect![[r#"
            .gitignore
            .hidden/config.rs
            Cargo.toml
            README.md
            src/lib.rs
            src/main.rs
            src/util/mod.rs
        "#]],
    );
}

#[tokio::test]
async fn find_files_pattern_with_slash_matches_the_relative_path() {
    let tree = project();
    check(
        &tree.content("find_files", json!({"pattern": "src/*.rs"})).await,
        expect![[r#"
            src/lib.rs
            src/main.rs
        "#]],
    );
    check(
        &tree.content("find_files", json!({"pattern": "src/**/mod.rs"})).await,
        expect![[r#"
            src/util/mod.rs
        "#]],
    );
    // Relative to the search directory, not to the session cwd.
    check(
        &tree.content("find_files", json!({"pattern": "util/*.rs", "path": "src"})).await,
        expect![[r#"
            util/mod.rs
        "#]],
    );
}

/// A tree of `n_dirs * n_files` small files named so that the walk order and the path
/// order differ.
fn wide_tree(n_dirs: usize, n_files: usize) -> Tree {
    let tree = Tree::new(&[]);
    for dir_idx in 0..n_dirs {
        for file_idx in 0..n_files {
            let path =
                format!("d{:02}/f{:03}.txt", (dir_idx * 7) % n_dirs, (file_idx * 13) % n_files);
            tree.write(
                &path,
                format!("line one\nneedle {dir_idx} {file_idx}\nline three\n").as_bytes(),
            );
        }
    }
    tree
}

#[tokio::test]
async fn find_files_order_is_the_same_on_every_run() {
    let tree = wide_tree(8, 50);
    let first = tree.content("find_files", json!({"pattern": "*.txt"})).await;
    let mut sorted: Vec<&str> = first.lines().collect();
    sorted.sort_unstable();
    assert_eq!(first.lines().collect::<Vec<_>>(), sorted);
    assert_eq!(sorted.len(), 400);
    for _ in 0..5 {
        assert_eq!(tree.content("find_files", json!({"pattern": "*.txt"})).await, first);
    }
}

#[tokio::test]
async fn find_files_truncates_to_the_first_paths_with_exact_totals() {
    let tree = wide_tree(8, 50);
    let res = tree.ok("find_files", json!({"pattern": "*.txt", "limit": 5})).await;
    check(
        &res.content,
        expect![[r#"
            d00/f000.txt
            d00/f001.txt
            d00/f002.txt
            d00/f003.txt
            d00/f004.txt
            [truncated: 5 of 400 paths shown; narrow the pattern or path]
        "#]],
    );
    assert_eq!(res.metadata["truncated"], json!(true));
    assert_eq!(res.metadata["count"], json!(5));
    assert_eq!(res.metadata["total"], json!(400));

    let whole = tree.ok("find_files", json!({"pattern": "d03/*", "limit": 50})).await;
    assert_eq!(whole.metadata["truncated"], json!(false));
    assert_eq!(whole.metadata["count"], json!(50));
    assert_eq!(whole.metadata["total"], json!(50));
}

#[tokio::test]
async fn find_files_reports_no_match_plainly() {
    let tree = project();
    let res = tree.ok("find_files", json!({"pattern": "*.py"})).await;
    assert_eq!(res.content, "No files found.\n");
    assert_eq!(res.metadata["total"], json!(0));
    assert_eq!(res.metadata["truncated"], json!(false));
}

#[tokio::test]
async fn find_files_rejects_an_invalid_glob() {
    let tree = project();
    let (error_type, message) = tree.failure("find_files", json!({"pattern": "src/[a-"})).await;
    assert_eq!(error_type, ErrorType::InvalidArguments);
    assert!(message.contains("invalid glob"), "{message}");
}

#[tokio::test]
async fn find_files_rejects_out_of_range_arguments() {
    let tree = project();
    for args in [
        json!({"pattern": ""}),
        json!({"pattern": "*", "limit": 0}),
        json!({"pattern": "*", "limit": 100_001}),
        json!({"pattern": "*", "recursive": true}),
    ] {
        let (error_type, _) = tree.failure("find_files", args).await;
        assert_eq!(error_type, ErrorType::InvalidArguments);
    }
}

#[tokio::test]
async fn find_files_reports_a_missing_directory_and_a_file_as_root() {
    let tree = project();
    let (error_type, _) = tree.failure("find_files", json!({"pattern": "*", "path": "nope"})).await;
    assert_eq!(error_type, ErrorType::NotFound);
    let (error_type, message) =
        tree.failure("find_files", json!({"pattern": "*", "path": "Cargo.toml"})).await;
    assert_eq!(error_type, ErrorType::InvalidArguments);
    assert!(message.contains("not a directory"), "{message}");
}

// ---------------------------------------------------------------------------------
// Confinement, for both tools

#[tokio::test]
async fn paths_outside_the_root_are_denied() {
    let tree = project();
    symlink(tree.dir.path().join("outside"), tree.root().join("escape"));
    let outside = tree.dir.path().join("outside").display().to_string();
    for path in [outside.as_str(), "..", "../outside", "src/../..", "escape", "escape/secret.txt"] {
        for (tool, args) in [
            ("find_files", json!({"pattern": "*", "path": path})),
            ("search_code", json!({"pattern": "needle", "path": path})),
        ] {
            let (error_type, message) = tree.failure(tool, args).await;
            assert_eq!(error_type, ErrorType::AccessDenied, "{tool} {path}: {message}");
        }
    }
}

#[tokio::test]
async fn symlinks_inside_the_tree_are_not_followed() {
    let tree = project();
    symlink(tree.dir.path().join("outside"), tree.root().join("linked_dir"));
    symlink(tree.dir.path().join("outside/secret.txt"), tree.root().join("linked_file.txt"));

    let listed = tree.content("find_files", json!({"pattern": "*", "no_ignore": true})).await;
    assert!(!listed.contains("secret.txt"), "{listed}");
    // The link itself is an entry of the tree; what it points to is not walked.
    assert!(listed.contains("linked_file.txt"), "{listed}");

    let res = tree.ok("search_code", json!({"pattern": "needle"})).await;
    assert_eq!(res.content, "No matches found.\n");
    assert_eq!(res.metadata["files"], json!(0));
}

#[tokio::test]
async fn an_absolute_path_inside_the_root_is_accepted() {
    let tree = project();
    let src = tree.root().join("src").display().to_string();
    check(
        &tree.content("find_files", json!({"pattern": "*.rs", "path": src})).await,
        expect![[r#"
            lib.rs
            main.rs
            util/mod.rs
        "#]],
    );
}

// ---------------------------------------------------------------------------------
// search_code

#[tokio::test]
async fn search_code_content_is_sorted_by_path_then_line() {
    let tree = project();
    let res = tree.ok("search_code", json!({"pattern": "hello"})).await;
    check(
        &res.content,
        expect![[r#"
            README.md:2:Say hello.
            src/lib.rs:1:pub fn hello() -> &'static str {
            src/lib.rs:2:    "hello"
            src/main.rs:2:    println!("hello");
        "#]],
    );
    assert_eq!(res.metadata["files"], json!(3));
    assert_eq!(res.metadata["matches"], json!(4));
    assert_eq!(res.metadata["truncated"], json!(false));
}

#[tokio::test]
async fn search_code_respects_gitignore_and_hidden() {
    let tree = project();
    let plain = tree
        .content("search_code", json!({"pattern": "hello", "output_mode": "files_with_matches"}))
        .await;
    check(
        &plain,
        expect![[r#"
            README.md
            src/lib.rs
            src/main.rs
        "#]],
    );
    check(
        &tree
            .content(
                "search_code",
                json!({"pattern": "hello", "output_mode": "files_with_matches", "hidden": true}),
            )
            .await,
        expect![[r#"
            .hidden/config.rs
            README.md
            src/lib.rs
            src/main.rs
        "#]],
    );
}

#[tokio::test]
async fn search_code_case_insensitive() {
    let tree = project();
    check(
        &tree
            .content(
                "search_code",
                json!({"pattern": "HELLO", "case_insensitive": true, "path": "src"}),
            )
            .await,
        expect![[r#"
            lib.rs:1:pub fn hello() -> &'static str {
            lib.rs:2:    "hello"
            main.rs:2:    println!("hello");
            util/mod.rs:1:// Hello helpers
        "#]],
    );
    let res = tree.ok("search_code", json!({"pattern": "HELLO", "path": "src"})).await;
    assert_eq!(res.metadata["files"], json!(0));
}

#[tokio::test]
async fn search_code_fixed_strings_with_regex_metacharacters() {
    let tree = Tree::new(&[("a.txt", "call(a.b)*\ncallXa.b\n(a+b)[0]\n")]);
    check(
        &tree.content("search_code", json!({"pattern": "(a.b)*", "fixed_strings": true})).await,
        expect![[r#"
            a.txt:1:call(a.b)*
        "#]],
    );
    check(
        &tree.content("search_code", json!({"pattern": "(a+b)[0]", "fixed_strings": true})).await,
        expect![[r#"
            a.txt:3:(a+b)[0]
        "#]],
    );
    // The same text as a regex means something else.
    check(
        &tree.content("search_code", json!({"pattern": "call.a\\.b"})).await,
        expect![[r#"
            a.txt:1:call(a.b)*
            a.txt:2:callXa.b
        "#]],
    );
}

#[tokio::test]
async fn search_code_glob_filters_files() {
    let tree = project();
    check(
        &tree.content("search_code", json!({"pattern": "hello", "glob": "*.md"})).await,
        expect![[r#"
            README.md:2:Say hello.
        "#]],
    );
    check(
        &tree
            .content("search_code", json!({"pattern": "hello", "glob": "src/*.rs", "output_mode": "files_with_matches"}))
            .await,
        expect![[r#"
            src/lib.rs
            src/main.rs
        "#]],
    );
    // A glob never brings back an ignored file.
    let res = tree.ok("search_code", json!({"pattern": "hello", "glob": "*.log"})).await;
    assert_eq!(res.metadata["files"], json!(0));
}

#[tokio::test]
async fn search_code_context_lines_and_group_separators() {
    let text: String = (1..=20)
        .map(|n| {
            if n == 5 || n == 7 || n == 15 { format!("match {n}\n") } else { format!("line {n}\n") }
        })
        .collect();
    let tree = Tree::new(&[("a.txt", &text), ("b.txt", "x\nmatch b\ny\n")]);
    check(
        &tree.content("search_code", json!({"pattern": "match", "context": 1})).await,
        expect![[r#"
            a.txt-4-line 4
            a.txt:5:match 5
            a.txt-6-line 6
            a.txt:7:match 7
            a.txt-8-line 8
            --
            a.txt-14-line 14
            a.txt:15:match 15
            a.txt-16-line 16
            --
            b.txt-1-x
            b.txt:2:match b
            b.txt-3-y
        "#]],
    );
}

#[tokio::test]
async fn search_code_count_mode() {
    let tree = project();
    let res = tree.ok("search_code", json!({"pattern": "hello", "output_mode": "count"})).await;
    check(
        &res.content,
        expect![[r#"
            README.md:1
            src/lib.rs:2
            src/main.rs:1
        "#]],
    );
    assert_eq!(res.metadata["matches"], json!(4));
    assert_eq!(res.metadata["files"], json!(3));
}

#[tokio::test]
async fn search_code_files_with_matches_mode() {
    let tree = wide_tree(4, 10);
    let res = tree
        .ok("search_code", json!({"pattern": "needle 3 ", "output_mode": "files_with_matches"}))
        .await;
    assert_eq!(res.metadata["files"], json!(10));
    assert!(res.metadata.get("matches").is_none());
    let lines: Vec<&str> = res.content.lines().collect();
    assert_eq!(lines.len(), 10);
    assert!(lines.iter().all(|line| line.starts_with("d01/")), "{lines:?}");
}

#[tokio::test]
async fn search_code_invalid_regex_is_invalid_arguments() {
    let tree = project();
    let (error_type, message) = tree.failure("search_code", json!({"pattern": "fn (main"})).await;
    assert_eq!(error_type, ErrorType::InvalidArguments);
    assert!(message.contains("invalid regex"), "{message}");
    assert!(message.contains("unclosed group"), "{message}");
}

#[tokio::test]
async fn search_code_newline_needs_multiline() {
    let tree = Tree::new(&[("a.txt", "fn one() {\n}\nfn two() {\n  body\n}\n")]);
    let (error_type, _) = tree.failure("search_code", json!({"pattern": "\\{\\n\\}"})).await;
    assert_eq!(error_type, ErrorType::InvalidArguments);
    check(
        &tree.content("search_code", json!({"pattern": "\\{\\n\\}", "multiline": true})).await,
        expect![[r#"
            a.txt:1:fn one() {
            a.txt:2:}
        "#]],
    );
}

#[tokio::test]
async fn search_code_skips_binary_files() {
    let tree = Tree::new(&[("text.txt", "needle\n")]);
    let mut binary = b"\x7fELF\x00\x00needle\n".to_vec();
    binary.extend_from_slice(&[0u8; 100]);
    tree.write("program.bin", &binary);
    let res = tree.ok("search_code", json!({"pattern": "needle"})).await;
    check(
        &res.content,
        expect![[r#"
            text.txt:1:needle
        "#]],
    );
    assert_eq!(res.metadata["files"], json!(1));
}

#[tokio::test]
async fn search_code_truncates_content_with_exact_totals() {
    let tree = wide_tree(4, 10);
    let res = tree.ok("search_code", json!({"pattern": "needle|line one", "limit": 5})).await;
    check(
        &res.content,
        expect![[r#"
            d00/f000.txt:1:line one
            d00/f000.txt:2:needle 0 0
            d00/f001.txt:1:line one
            d00/f001.txt:2:needle 0 7
            d00/f002.txt:1:line one
            [truncated: 5 lines shown; 40 files matched; narrow the pattern, path or glob]
        "#]],
    );
    assert_eq!(res.metadata["truncated"], json!(true));
    assert_eq!(res.metadata["count"], json!(5));
    assert_eq!(res.metadata["files"], json!(40));
    assert_eq!(res.metadata["matches"], json!(80));

    let files = tree
        .ok("search_code", json!({"pattern": "needle", "limit": 3, "output_mode": "count"}))
        .await;
    check(
        &files.content,
        expect![[r#"
            d00/f000.txt:1
            d00/f001.txt:1
            d00/f002.txt:1
            [truncated: 3 files shown; 40 files matched; narrow the pattern, path or glob]
        "#]],
    );
    assert_eq!(files.metadata["matches"], json!(40));
}

#[tokio::test]
async fn search_code_limit_cuts_inside_one_large_file() {
    let text: String = (0..1000).map(|n| format!("needle {n}\n")).collect();
    let tree = Tree::new(&[("big.txt", &text), ("small.txt", "needle\n")]);
    let res = tree.ok("search_code", json!({"pattern": "needle", "limit": 2})).await;
    check(
        &res.content,
        expect![[r#"
            big.txt:1:needle 0
            big.txt:2:needle 1
            [truncated: 2 lines shown; 2 files matched; narrow the pattern, path or glob]
        "#]],
    );
    assert_eq!(res.metadata["matches"], json!(1001));
}

#[tokio::test]
async fn search_code_order_is_the_same_on_every_run() {
    let tree = wide_tree(8, 50);
    let first = tree.content("search_code", json!({"pattern": "needle", "limit": 100_000})).await;
    assert_eq!(first.lines().count(), 400);
    for _ in 0..5 {
        assert_eq!(
            tree.content("search_code", json!({"pattern": "needle", "limit": 100_000})).await,
            first
        );
    }
}

#[tokio::test]
async fn search_code_clips_long_lines_around_the_match() {
    let minified = format!("{}NEEDLE{}\n", "a".repeat(100_000), "b".repeat(100_000));
    let tree = Tree::new(&[("app.min.js", &minified)]);
    let res = tree.ok("search_code", json!({"pattern": "NEEDLE"})).await;
    assert!(res.content.len() < 1000, "{} bytes", res.content.len());
    assert!(res.content.starts_with("app.min.js:1:…"), "{}", res.content);
    assert!(res.content.contains("NEEDLE"), "{}", res.content);
}

#[tokio::test]
async fn search_code_searches_a_single_file() {
    let tree = project();
    check(
        &tree.content("search_code", json!({"pattern": "hello", "path": "src/lib.rs"})).await,
        expect![[r#"
            lib.rs:1:pub fn hello() -> &'static str {
            lib.rs:2:    "hello"
        "#]],
    );
}

#[tokio::test]
async fn search_code_rejects_out_of_range_arguments() {
    let tree = project();
    for args in [
        json!({"pattern": ""}),
        json!({"pattern": "x", "context": 101}),
        json!({"pattern": "x", "limit": 0}),
        json!({"pattern": "x", "output_mode": "lines"}),
        json!({"pattern": "x", "ignore_case": true}),
    ] {
        let (error_type, _) = tree.failure("search_code", args).await;
        assert_eq!(error_type, ErrorType::InvalidArguments);
    }
}

#[tokio::test]
async fn search_code_strips_crlf_line_endings() {
    let tree = Tree::new(&[("dos.txt", "first\r\nneedle here\r\nlast\r\n")]);
    check(
        &tree.content("search_code", json!({"pattern": "here$", "context": 1})).await,
        expect![[r#"
            dos.txt-1-first
            dos.txt:2:needle here
            dos.txt-3-last
        "#]],
    );
}

#[tokio::test]
async fn output_is_cut_at_the_sessions_byte_cap() {
    let tree = wide_tree(2, 10);
    let mut env = Env::for_root(tree.root()).unwrap();
    env.max_output_bytes = 40;
    let env = Arc::new(env);
    let found = tree.call_in(&env, "find_files", json!({"pattern": "*.txt"})).await;
    check(
        &found.content,
        expect![[r#"
            d00/f000.txt
            d00/f001.txt
            d00/f002.txt
            [truncated: 3 of 20 paths shown; narrow the pattern or path]
        "#]],
    );
    assert_eq!(found.metadata["truncated"], json!(true));
    let searched = tree.call_in(&env, "search_code", json!({"pattern": "needle"})).await;
    assert_eq!(searched.metadata["truncated"], json!(true));
    assert_eq!(searched.metadata["count"], json!(1));
    assert_eq!(searched.metadata["matches"], json!(20));
}

#[tokio::test]
async fn search_code_missing_path_is_not_found() {
    let tree = project();
    let (error_type, _) =
        tree.failure("search_code", json!({"pattern": "x", "path": "nope/deeper"})).await;
    assert_eq!(error_type, ErrorType::NotFound);
}

// ---------------------------------------------------------------------------------
// Cancellation

/// A tree big enough (5000 files, 22 MB) that searching it takes far longer than the
/// delay before the cancels below.
fn big_tree() -> Tree {
    let tree = Tree::new(&[]);
    let body: String =
        (0..100).map(|n| format!("let value_{n} = compute({n}); // filler text\n")).collect();
    for dir_idx in 0..20 {
        for file_idx in 0..250 {
            tree.write(&format!("d{dir_idx}/s{}/f{file_idx}.rs", file_idx % 10), body.as_bytes());
        }
    }
    tree
}

/// A pattern with no literal to skip ahead on, so every byte of the tree is scanned.
const SLOW_PATTERN: &str = "[a-z]+_[0-9]+ = nothing";

/// Runs `tool` through the Registry and cancels it from another task after a short
/// delay. Whether the cancel lands before or during the walk, the answer must be
/// `canceled`, so the outcome does not depend on timing; the tree is large so that it
/// normally lands mid-walk.
async fn cancel_through_registry(tree: &Tree, tool: &str, args: Value, after: Duration) {
    let registry = Arc::new(Registry::with_builtins());
    let cancel = CancellationToken::new();
    let env = tree.env();
    let call = Call::from_value("c-cancel", tool, &args);
    let running = {
        let registry = registry.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move { registry.execute(&call, &env, &cancel).await })
    };
    let canceler = cancel_after(&cancel, after);
    // A safety net only: a canceled call answers at once.
    let res = tokio::time::timeout(Duration::from_secs(60), running).await.unwrap().unwrap();
    canceler.await.unwrap();
    assert_eq!(res.error_type, Some(ErrorType::Canceled), "{tool}: {res:?}");
    assert_eq!(res.call_id(), Some("c-cancel"));
}

fn cancel_soon(cancel: &CancellationToken) -> tokio::task::JoinHandle<()> {
    cancel_after(cancel, Duration::from_millis(20))
}

fn cancel_after(cancel: &CancellationToken, after: Duration) -> tokio::task::JoinHandle<()> {
    let cancel = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        cancel.cancel();
    })
}

fn direct_context(tree: &Tree, cancel: CancellationToken) -> toolgate::tools::ToolContext {
    toolgate::tools::ToolContext {
        call_id: "direct".into(),
        env: tree.env(),
        cancel,
        timeout: Duration::from_secs(60),
        output: toolgate::tools::OutputSink::discard(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_mid_walk_returns_canceled() {
    let tree = big_tree();
    cancel_through_registry(
        &tree,
        "search_code",
        json!({"pattern": SLOW_PATTERN, "output_mode": "count"}),
        Duration::from_millis(20),
    )
    .await;
    // Listing names is fast enough to finish a whole tree within a few milliseconds, so
    // the cancel comes as soon as the call is under way.
    cancel_through_registry(
        &tree,
        "find_files",
        json!({"pattern": "*.rs", "limit": 100_000}),
        Duration::ZERO,
    )
    .await;

    // Without the registry around it, the tool itself notices the cancel mid-search
    // and stops: if it ignored the token it would finish the search and answer `ok`.
    let cancel = CancellationToken::new();
    let canceler = cancel_soon(&cancel);
    let tool = toolgate::tools::builtin::search_code::tool();
    let run = tool.execute(json!({"pattern": SLOW_PATTERN}), direct_context(&tree, cancel));
    let res = tokio::time::timeout(Duration::from_secs(60), run).await.unwrap();
    canceler.await.unwrap();
    assert_eq!(res.error_type, Some(ErrorType::Canceled), "{res:?}");
}

/// The tools themselves stop on cancellation, not only the registry around them: run
/// directly with an already-canceled token, each walk quits at its first entry.
#[tokio::test]
async fn tools_honour_their_cancel_token_directly() {
    let tree = project();
    for (tool, args) in [
        (toolgate::tools::builtin::find_files::tool(), json!({"pattern": "*"})),
        (toolgate::tools::builtin::search_code::tool(), json!({"pattern": "hello"})),
    ] {
        let cancel = CancellationToken::new();
        cancel.cancel();
        let res = tool.execute(args, direct_context(&tree, cancel)).await;
        assert_eq!(res.error_type, Some(ErrorType::Canceled), "{res:?}");
    }
}
