//! read_file, write_file and edit_file driven end to end through the Registry, the
//! way every client reaches them.

#![expect(
    clippy::unwrap_used,
    reason = "fixture code outside #[test] functions fails loudly on a broken setup"
)]

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolgate::tools::fs::text::{TextEncoding, encode};
use toolgate::tools::{Attachment, Call, Env, ErrorType, Registry, ToolResult};

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    env: Arc<Env>,
    registry: Arc<Registry>,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture::with_env(|_| {})
    }

    fn with_env(adjust: impl FnOnce(&mut Env)) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let mut env = Env::for_root(&root).unwrap();
        adjust(&mut env);
        Fixture {
            _dir: dir,
            root,
            env: Arc::new(env),
            registry: Arc::new(Registry::with_builtins()),
        }
    }

    /// A second session on the same root: its own Env and FileTracker.
    fn other_session(&self) -> Arc<Env> {
        Arc::new(Env::for_root(&self.root).unwrap())
    }

    async fn call(&self, name: &str, args: Value) -> ToolResult {
        call_in(&self.registry, &self.env, name, args).await
    }

    fn write(&self, rel: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
        let path = self.root.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn read(&self, rel: &str) -> Vec<u8> {
        std::fs::read(self.root.join(rel)).unwrap()
    }

    fn read_text(&self, rel: &str) -> String {
        String::from_utf8(self.read(rel)).unwrap()
    }
}

async fn call_in(registry: &Registry, env: &Arc<Env>, name: &str, args: Value) -> ToolResult {
    registry.execute(&Call::from_value("c1", name, &args), env, &CancellationToken::new()).await
}

#[track_caller]
fn assert_ok(res: &ToolResult) {
    assert!(res.ok, "expected success, got {res:#?}");
}

#[track_caller]
fn assert_err(res: &ToolResult, want: ErrorType) {
    assert!(!res.ok, "expected {want}, got success: {res:#?}");
    assert_eq!(res.error_type, Some(want), "{res:#?}");
}

fn meta<'r>(res: &'r ToolResult, key: &str) -> &'r Value {
    res.metadata.get(key).unwrap_or_else(|| panic!("no metadata {key:?} in {res:#?}"))
}

fn numbered(lines: std::ops::RangeInclusive<usize>) -> String {
    lines.map(|n| format!("line {n}\n")).collect()
}

/// No temporary file of an atomic write may ever be left in `dir`.
#[track_caller]
fn assert_no_temp_files(dir: &Path) {
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left behind: {leftovers:?}");
}

// ------------------------------------------------------------------------------
// read_file

#[tokio::test]
async fn read_numbers_lines_like_cat_and_records_a_stamp() {
    let fx = Fixture::new();
    let path = fx.write("src/main.rs", "fn main() {\n\tprintln!(\"hi\");\n}\n");
    let res = fx.call("read_file", json!({"path": "src/main.rs"})).await;
    assert_ok(&res);
    assert_eq!(res.content, "     1\tfn main() {\n     2\t\tprintln!(\"hi\");\n     3\t}");
    assert_eq!(meta(&res, "total_lines"), 3);
    assert_eq!(meta(&res, "lines_shown"), 3);
    assert_eq!(meta(&res, "start_line"), 1);
    assert_eq!(meta(&res, "truncated"), false);
    assert_eq!(meta(&res, "path"), path.display().to_string().as_str());
    assert_eq!(meta(&res, "call_id"), "c1");
    assert!(fx.env.files.get(&path).is_some(), "the read was not recorded");
}

#[tokio::test]
async fn read_window_reports_what_was_shown_out_of_how_many() {
    let fx = Fixture::new();
    fx.write("ten.txt", numbered(1..=10));
    let res = fx.call("read_file", json!({"path": "ten.txt", "offset": 3, "limit": 4})).await;
    assert_ok(&res);
    assert_eq!(
        res.content,
        "     3\tline 3\n     4\tline 4\n     5\tline 5\n     6\tline 6\n\n\
         [truncated: showing lines 3-6 of 10; read on with offset=7]"
    );
    assert_eq!(meta(&res, "total_lines"), 10);
    assert_eq!(meta(&res, "lines_shown"), 4);
    assert_eq!(meta(&res, "start_line"), 3);
    assert_eq!(meta(&res, "truncated"), true);

    // The last page is complete: no marker, not truncated.
    let res = fx.call("read_file", json!({"path": "ten.txt", "offset": 9})).await;
    assert_eq!(res.content, "     9\tline 9\n    10\tline 10");
    assert_eq!(meta(&res, "truncated"), false);

    let res = fx.call("read_file", json!({"path": "ten.txt", "offset": 11})).await;
    assert_ok(&res);
    assert_eq!(res.content, "[offset 11 is past the end of the file, which has 10 lines]");
    assert_eq!(meta(&res, "lines_shown"), 0);
}

#[tokio::test]
async fn read_caps_lines_bytes_and_line_length_honestly() {
    let fx = Fixture::new();
    fx.write("long.txt", numbered(1..=2500));
    let res = fx.call("read_file", json!({"path": "long.txt"})).await;
    assert_eq!(meta(&res, "lines_shown"), 2000);
    assert!(
        res.content
            .ends_with("[truncated: showing lines 1-2000 of 2500; read on with offset=2001]")
    );

    // 300 lines of 1500 characters exceed the 256 KiB text cap.
    let wide: String = (0..300).map(|_| format!("{}\n", "x".repeat(1500))).collect();
    fx.write("wide.txt", wide);
    let res = fx.call("read_file", json!({"path": "wide.txt"})).await;
    let shown = meta(&res, "lines_shown").as_u64().unwrap();
    assert!(shown > 100 && shown < 300, "{shown} lines shown");
    assert!(res.content.len() <= 256 * 1024);
    assert!(
        res.content.ends_with(&format!(
            "[truncated: showing lines 1-{shown} of 300 (output capped at 256 KiB); read on \
             with offset={}]",
            shown + 1
        )),
        "{}",
        &res.content[res.content.len() - 200..]
    );

    fx.write("minified.js", format!("{}\nshort\n", "y".repeat(5000)));
    let res = fx.call("read_file", json!({"path": "minified.js"})).await;
    assert_eq!(meta(&res, "truncated"), true);
    assert!(res.content.contains("… [line cut: 3000 more characters]"));
    assert!(res.content.contains("[1 line(s) longer than 2000 characters were cut]"));
    assert!(res.content.contains("     2\tshort"));
}

#[tokio::test]
async fn read_business_errors() {
    let fx = Fixture::with_env(|env| env.max_read_bytes = 100);
    fx.write("dir/inner.txt", "x");
    fx.write("big.txt", "z".repeat(150));
    fx.write("blob.bin", b"\x7fELF\x02\x01\x01\x00\x00\x00binary");

    let res = fx.call("read_file", json!({"path": "missing.txt"})).await;
    assert_err(&res, ErrorType::NotFound);
    let res = fx.call("read_file", json!({"path": "dir"})).await;
    assert_err(&res, ErrorType::IsDirectory);
    // Too large to load: read by window, and what comes back fits the limit.
    let res = fx.call("read_file", json!({"path": "big.txt"})).await;
    assert_ok(&res);
    assert_eq!(meta(&res, "windowed"), true);
    assert!(res.content.len() <= 100 + 64, "{res:#?}");
    assert!(res.content.starts_with("     1\tzzz"), "{res:#?}");
    assert!(res.content.contains("more characters]"), "{res:#?}");
    let res = fx.call("read_file", json!({"path": "blob.bin"})).await;
    assert_err(&res, ErrorType::BinaryFile);
}

#[tokio::test]
async fn read_refuses_fifos_without_blocking() {
    let fx = Fixture::new();
    let fifo = fx.root.join("pipe");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let res = fx.call("read_file", json!({"path": "pipe"})).await;
    assert_err(&res, ErrorType::IoError);
    assert!(res.error.unwrap().contains("not a regular file"));
}

#[tokio::test]
async fn images_come_back_as_attachments() {
    let fx = Fixture::new();
    // A PNG header: signature, then the IHDR chunk (16x8, 8-bit RGBA).
    let mut png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
    png.extend_from_slice(&16u32.to_be_bytes());
    png.extend_from_slice(&8u32.to_be_bytes());
    png.extend_from_slice(&[8, 6, 0, 0, 0, 0x6d, 0x5d, 0x3b, 0x5b]);
    png.extend_from_slice(b"\x00\x00\x00\x00IEND\xaeB`\x82");
    fx.write("icon.png", &png);
    let res = fx.call("read_file", json!({"path": "icon.png"})).await;
    assert_ok(&res);
    assert_eq!(res.content, format!("[image: image/png, {} bytes, 16x8]", png.len()));
    assert_eq!(
        res.attachments,
        vec![Attachment::Image {
            mime_type: "image/png".to_owned(),
            data: base64::engine::general_purpose::STANDARD.encode(&png),
        }]
    );
    assert_eq!(meta(&res, "width"), 16);
    assert_eq!(meta(&res, "height"), 8);
}

#[tokio::test]
async fn invalid_utf8_is_shown_lossily_and_never_edited() {
    let fx = Fixture::new();
    fx.write("latin1.txt", b"caf\xe9\nna\xefve\n");
    let res = fx.call("read_file", json!({"path": "latin1.txt"})).await;
    assert_ok(&res);
    assert!(res.content.starts_with("     1\tcaf\u{FFFD}\n     2\tna\u{FFFD}ve"));
    assert!(res.content.contains("not valid utf-8"), "{}", res.content);
    assert_eq!(meta(&res, "lossy"), true);
    let res = fx
        .call("edit_file", json!({"path": "latin1.txt", "old_string": "caf", "new_string": "tea"}))
        .await;
    assert_err(&res, ErrorType::BinaryFile);
    assert_eq!(fx.read("latin1.txt"), b"caf\xe9\nna\xefve\n");
}

#[tokio::test]
async fn empty_files_say_so() {
    let fx = Fixture::new();
    fx.write("empty.txt", "");
    let res = fx.call("read_file", json!({"path": "empty.txt"})).await;
    assert_ok(&res);
    assert_eq!(res.content, "[the file is empty]");
    assert_eq!(meta(&res, "total_lines"), 0);
}

// ------------------------------------------------------------------------------
// write_file

#[tokio::test]
async fn write_creates_files_and_parent_directories() {
    let fx = Fixture::new();
    let res = fx.call("write_file", json!({"path": "new/dir/a.txt", "content": "hello\n"})).await;
    assert_ok(&res);
    let path = fx.root.join("new/dir/a.txt");
    assert_eq!(res.content, format!("created {} (6 bytes)", path.display()));
    assert_eq!(meta(&res, "created"), true);
    assert_eq!(meta(&res, "bytes"), 6);
    assert_eq!(fx.read_text("new/dir/a.txt"), "hello\n");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & !0o644, 0, "new file mode {mode:o}");
    assert_no_temp_files(&fx.root.join("new/dir"));

    // What the session wrote, it may edit without reading again.
    let res = fx
        .call(
            "edit_file",
            json!({"path": "new/dir/a.txt", "old_string": "hello", "new_string": "bye"}),
        )
        .await;
    assert_ok(&res);
    assert_eq!(fx.read_text("new/dir/a.txt"), "bye\n");
}

#[tokio::test]
async fn overwriting_requires_a_read_of_the_current_content() {
    let fx = Fixture::new();
    fx.write("notes.txt", "aaaa\n");
    let res = fx.call("write_file", json!({"path": "notes.txt", "content": "new\n"})).await;
    assert_err(&res, ErrorType::StaleFile);
    assert!(res.error.as_deref().unwrap().contains("read it with read_file first"));
    assert_eq!(fx.read_text("notes.txt"), "aaaa\n");

    assert_ok(&fx.call("read_file", json!({"path": "notes.txt"})).await);
    // Changed behind the session's back, same length and (likely) the same mtime tick:
    // only the content hash can tell.
    fx.write("notes.txt", "bbbb\n");
    let res = fx.call("write_file", json!({"path": "notes.txt", "content": "new\n"})).await;
    assert_err(&res, ErrorType::StaleFile);
    assert!(res.error.as_deref().unwrap().contains("has changed since it was last read"));
    assert_eq!(fx.read_text("notes.txt"), "bbbb\n");

    assert_ok(&fx.call("read_file", json!({"path": "notes.txt"})).await);
    let res = fx.call("write_file", json!({"path": "notes.txt", "content": "new\n"})).await;
    assert_ok(&res);
    assert_eq!(meta(&res, "created"), false);
    assert!(res.content.starts_with("overwrote "));
    assert_eq!(fx.read_text("notes.txt"), "new\n");

    // Another session has its own record: it has not read the file.
    let other = fx.other_session();
    let res =
        call_in(&fx.registry, &other, "write_file", json!({"path": "notes.txt", "content": "x"}))
            .await;
    assert_err(&res, ErrorType::StaleFile);
}

#[tokio::test]
async fn write_keeps_the_file_mode() {
    let fx = Fixture::new();
    let path = fx.write("run.sh", "#!/bin/sh\necho old\n");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o751)).unwrap();
    assert_ok(&fx.call("read_file", json!({"path": "run.sh"})).await);
    let res =
        fx.call("write_file", json!({"path": "run.sh", "content": "#!/bin/sh\necho new\n"})).await;
    assert_ok(&res);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777, 0o751);
    let res = fx
        .call("edit_file", json!({"path": "run.sh", "old_string": "new", "new_string": "newer"}))
        .await;
    assert_ok(&res);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777, 0o751);
    assert_eq!(fx.read_text("run.sh"), "#!/bin/sh\necho newer\n");
}

#[tokio::test]
async fn write_refuses_directories_and_names_that_are_not_files() {
    let fx = Fixture::new();
    fx.write("dir/x", "x");
    let res = fx.call("write_file", json!({"path": "dir", "content": "x"})).await;
    assert_err(&res, ErrorType::IsDirectory);
    assert!(fx.root.join("dir").is_dir());
    for path in ["dir/", "dir/.", "dir/.."] {
        let res = fx.call("write_file", json!({"path": path, "content": "x"})).await;
        assert_err(&res, ErrorType::InvalidArguments);
    }
}

#[tokio::test]
async fn writing_through_a_link_inside_the_root_replaces_its_target() {
    let fx = Fixture::new();
    fx.write("real/config.toml", "a = 1\n");
    symlink("real/config.toml", fx.root.join("config.toml")).unwrap();
    let res = fx.call("read_file", json!({"path": "config.toml"})).await;
    assert_ok(&res);
    assert_eq!(meta(&res, "path"), fx.root.join("real/config.toml").display().to_string().as_str());
    let res = fx.call("write_file", json!({"path": "config.toml", "content": "a = 2\n"})).await;
    assert_ok(&res);
    assert!(
        std::fs::symlink_metadata(fx.root.join("config.toml")).unwrap().file_type().is_symlink()
    );
    assert_eq!(fx.read_text("real/config.toml"), "a = 2\n");
    let res = fx
        .call("edit_file", json!({"path": "config.toml", "old_string": "2", "new_string": "3"}))
        .await;
    assert_ok(&res);
    assert_eq!(fx.read_text("real/config.toml"), "a = 3\n");
}

// ------------------------------------------------------------------------------
// edit_file

#[tokio::test]
async fn edit_replaces_one_match_and_shows_a_diff() {
    let fx = Fixture::new();
    fx.write("lib.rs", "a = 1\nb = 2\nc = 3\n");
    assert_ok(&fx.call("read_file", json!({"path": "lib.rs"})).await);
    let res = fx
        .call("edit_file", json!({"path": "lib.rs", "old_string": "b = 2", "new_string": "b = 4"}))
        .await;
    assert_ok(&res);
    assert_eq!(fx.read_text("lib.rs"), "a = 1\nb = 4\nc = 3\n");
    let path = fx.root.join("lib.rs").display().to_string();
    assert_eq!(
        res.content,
        format!(
            "edited {path} (1 replacement)\n--- {path}\n+++ {path}\n@@ -1,3 +1,3 @@\n a = 1\n-b = 2\n+b = 4\n c = 3\n"
        )
    );
    assert_eq!(meta(&res, "replacements"), 1);
    assert_eq!(meta(&res, "first_line"), 2);
}

#[tokio::test]
async fn edit_business_errors() {
    let fx = Fixture::new();
    fx.write("code.py", "def total(items):\n    return sum(items)\n\nx = 1\nx = 1\nx = 1\n");

    // Not read yet.
    let res = fx
        .call(
            "edit_file",
            json!({"path": "code.py", "old_string": "def", "new_string": "async def"}),
        )
        .await;
    assert_err(&res, ErrorType::StaleFile);
    assert_ok(&fx.call("read_file", json!({"path": "code.py"})).await);

    let res = fx
        .call("edit_file", json!({"path": "code.py", "old_string": "x = 1", "new_string": "x = 2"}))
        .await;
    assert_err(&res, ErrorType::NotUnique);
    assert_eq!(meta(&res, "matches"), 3);
    assert_eq!(meta(&res, "lines"), &json!([4, 5, 6]));
    assert!(res.error.as_deref().unwrap().contains("occurs 3 times"));

    let res = fx
        .call(
            "edit_file",
            json!({"path": "code.py", "old_string": "    return sum(item)", "new_string": "    return 0"}),
        )
        .await;
    assert_err(&res, ErrorType::NotFound);
    let error = res.error.as_deref().unwrap();
    assert!(error.contains("the closest lines are:"), "{error}");
    assert!(error.contains("     2\t    return sum(items)"), "{error}");
    assert_eq!(meta(&res, "closest_line"), 2);

    let res = fx
        .call("edit_file", json!({"path": "code.py", "old_string": "same", "new_string": "same"}))
        .await;
    assert_err(&res, ErrorType::InvalidArguments);

    let res =
        fx.call("edit_file", json!({"path": "code.py", "old_string": "", "new_string": "x"})).await;
    assert_err(&res, ErrorType::InvalidArguments);

    let res = fx
        .call("edit_file", json!({"path": "nope.py", "old_string": "a", "new_string": "b"}))
        .await;
    assert_err(&res, ErrorType::NotFound);
    let res = fx
        .call("edit_file", json!({"path": "nodir/nope.py", "old_string": "a", "new_string": "b"}))
        .await;
    assert_err(&res, ErrorType::NotFound);
    assert!(!fx.root.join("nodir").exists(), "a failed edit created a directory");

    // Changed since read.
    fx.write("code.py", "def total(items):\n    return 0\n");
    let res = fx
        .call("edit_file", json!({"path": "code.py", "old_string": "0", "new_string": "1"}))
        .await;
    assert_err(&res, ErrorType::StaleFile);
    assert_eq!(fx.read_text("code.py"), "def total(items):\n    return 0\n");

    let res = fx
        .call(
            "edit_file",
            json!({"path": "code.py", "old_string": "x", "new_string": "y", "replace_all": "yes"}),
        )
        .await;
    assert_err(&res, ErrorType::InvalidArguments);
}

#[tokio::test]
async fn replace_all_counts_replacements() {
    let fx = Fixture::new();
    fx.write("a.txt", "foo bar foo\nfoo\n");
    assert_ok(&fx.call("read_file", json!({"path": "a.txt"})).await);
    let res = fx
        .call(
            "edit_file",
            json!({"path": "a.txt", "old_string": "foo", "new_string": "baz", "replace_all": true}),
        )
        .await;
    assert_ok(&res);
    assert_eq!(meta(&res, "replacements"), 3);
    assert_eq!(fx.read_text("a.txt"), "baz bar baz\nbaz\n");
}

#[tokio::test]
async fn empty_old_string_creates_a_new_file() {
    let fx = Fixture::new();
    let res = fx
        .call(
            "edit_file",
            json!({"path": "made/here.txt", "old_string": "", "new_string": "fresh\n"}),
        )
        .await;
    assert_ok(&res);
    assert_eq!(meta(&res, "created"), true);
    assert_eq!(fx.read_text("made/here.txt"), "fresh\n");
    assert!(res.content.contains("+fresh"), "{}", res.content);
}

#[tokio::test]
async fn crlf_files_stay_crlf() {
    let fx = Fixture::new();
    fx.write("win.txt", "first\r\nsecond\r\nthird\r\n");
    let res = fx.call("read_file", json!({"path": "win.txt"})).await;
    assert_eq!(res.content, "     1\tfirst\n     2\tsecond\n     3\tthird");
    assert_eq!(meta(&res, "line_endings"), "crlf");
    let res = fx
        .call(
            "edit_file",
            json!({"path": "win.txt", "old_string": "first\nsecond", "new_string": "one\ntwo\nthree"}),
        )
        .await;
    assert_ok(&res);
    assert_eq!(fx.read_text("win.txt"), "one\r\ntwo\r\nthree\r\nthird\r\n");
    // The diff shown to the model has plain line endings.
    assert!(res.content.contains("-first\n-second\n+one\n+two\n+three\n"), "{}", res.content);
}

#[tokio::test]
async fn utf16_and_bom_files_round_trip() {
    let fx = Fixture::new();
    for (name, encoding) in [
        ("le.txt", TextEncoding::Utf16Le),
        ("be.txt", TextEncoding::Utf16Be),
        ("bom.txt", TextEncoding::Utf8Bom),
    ] {
        fx.write(name, encode("Grüße\r\nfrom 🦀\r\n", encoding));
        let res = fx.call("read_file", json!({"path": name})).await;
        assert_ok(&res);
        assert_eq!(res.content, "     1\tGrüße\n     2\tfrom 🦀", "{name}");
        assert_eq!(meta(&res, "encoding"), encoding.as_str());
        let res = fx
            .call(
                "edit_file",
                json!({"path": name, "old_string": "from 🦀", "new_string": "von 🦀\nund 🐍"}),
            )
            .await;
        assert_ok(&res);
        assert_eq!(fx.read(name), encode("Grüße\r\nvon 🦀\r\nund 🐍\r\n", encoding), "{name}");
        let res = fx.call("read_file", json!({"path": name})).await;
        assert_eq!(res.content, "     1\tGrüße\n     2\tvon 🦀\n     3\tund 🐍", "{name}");
    }
}

/// Twenty concurrent edits of one file, each replacing its own marker: every one
/// must land. Without the per-path lock, two read-modify-write cycles interleave and
/// one overwrites the other's change.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_edits_of_one_file_lose_nothing() {
    const TASKS: usize = 20;
    let fx = Arc::new(Fixture::new());
    let original: String = (0..TASKS).map(|idx| format!("marker-{idx:02} = old\n")).collect();
    fx.write("shared.txt", &original);
    assert_ok(&fx.call("read_file", json!({"path": "shared.txt"})).await);
    let mut handles = Vec::new();
    for idx in 0..TASKS {
        let fx = fx.clone();
        handles.push(tokio::spawn(async move {
            let args = json!({
                "path": "shared.txt",
                "old_string": format!("marker-{idx:02} = old"),
                "new_string": format!("marker-{idx:02} = new"),
            });
            fx.call("edit_file", args).await
        }));
    }
    for handle in handles {
        assert_ok(&handle.await.unwrap());
    }
    let expected: String = (0..TASKS).map(|idx| format!("marker-{idx:02} = new\n")).collect();
    assert_eq!(fx.read_text("shared.txt"), expected);
    assert_no_temp_files(&fx.root);
}

/// Two sessions editing one file: each must re-read after the other's change
/// (`stale_file`), and with that retry every edit lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_sessions_see_stale_files_and_lose_nothing() {
    const PER_SESSION: usize = 8;
    let fx = Arc::new(Fixture::new());
    let original: String =
        (0..2 * PER_SESSION).map(|idx| format!("slot-{idx:02} = old\n")).collect();
    fx.write("shared.txt", &original);
    let mut handles = Vec::new();
    for session in 0..2 {
        let fx = fx.clone();
        handles.push(tokio::spawn(async move {
            let env = fx.other_session();
            let mut stale_seen = 0;
            for slot in (session * PER_SESSION)..((session + 1) * PER_SESSION) {
                let args = json!({
                    "path": "shared.txt",
                    "old_string": format!("slot-{slot:02} = old"),
                    "new_string": format!("slot-{slot:02} = new"),
                });
                loop {
                    let read =
                        call_in(&fx.registry, &env, "read_file", json!({"path": "shared.txt"}));
                    assert_ok(&read.await);
                    let res = call_in(&fx.registry, &env, "edit_file", args.clone()).await;
                    if res.ok {
                        break;
                    }
                    assert_err(&res, ErrorType::StaleFile);
                    stale_seen += 1;
                }
            }
            stale_seen
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    let expected: String =
        (0..2 * PER_SESSION).map(|idx| format!("slot-{idx:02} = new\n")).collect();
    assert_eq!(fx.read_text("shared.txt"), expected);
}

// ------------------------------------------------------------------------------
// Multi-edits, windows of huge files, notebooks.

#[tokio::test]
async fn a_list_of_edits_applies_in_order_all_or_none() {
    let fx = Fixture::new();
    fx.write("cfg.py", "a = 1\nb = 2\nc = 3\n");
    assert_ok(&fx.call("read_file", json!({"path": "cfg.py"})).await);
    let edits = json!([
        {"old_string": "a = 1", "new_string": "a = 10"},
        {"old_string": "a = 10\nb = 2", "new_string": "a = 10\nb = 20"},
        {"old_string": "c = 3", "new_string": "c = 30"},
    ]);
    let res =
        fx.call("edit_file", json!({"path": "cfg.py", "edits": edits, "dry_run": true})).await;
    assert_ok(&res);
    assert_eq!(meta(&res, "dry_run"), true);
    assert!(res.content.contains("-b = 2\n-c = 3\n+a = 10\n+b = 20"), "{}", res.content);
    assert_eq!(fx.read_text("cfg.py"), "a = 1\nb = 2\nc = 3\n");

    // The second of three fails: nothing is written.
    let bad = json!([
        {"old_string": "a = 1", "new_string": "a = 10"},
        {"old_string": "b = 5", "new_string": "b = 6"},
        {"old_string": "c = 3", "new_string": "c = 30"},
    ]);
    let res = fx.call("edit_file", json!({"path": "cfg.py", "edits": bad})).await;
    assert_err(&res, ErrorType::NotFound);
    assert_eq!(meta(&res, "edit_index"), 1);
    assert!(res.error.as_deref().unwrap().starts_with("edit 2 of 3:"), "{res:#?}");
    assert_eq!(fx.read_text("cfg.py"), "a = 1\nb = 2\nc = 3\n");

    let res = fx.call("edit_file", json!({"path": "cfg.py", "edits": edits})).await;
    assert_ok(&res);
    assert_eq!(meta(&res, "replacements"), 3);
    assert_eq!(fx.read_text("cfg.py"), "a = 10\nb = 20\nc = 30\n");

    let both = json!({"path": "cfg.py", "old_string": "x", "new_string": "y", "edits": edits});
    assert_err(&fx.call("edit_file", both).await, ErrorType::InvalidArguments);
    let neither = json!({"path": "cfg.py"});
    assert_err(&fx.call("edit_file", neither).await, ErrorType::InvalidArguments);
}

/// Bytes this process has read through read(2) and friends, per the kernel.
fn bytes_read_by_process() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines().find_map(|line| line.strip_prefix("rchar: ")).and_then(|n| n.trim().parse().ok())
}

#[tokio::test]
async fn a_window_of_a_2_gb_sparse_log_is_read_without_reading_it_whole() {
    use std::io::Write as _;
    let fx = Fixture::new();
    let path = fx.root.join("huge.log");
    // Ten million short lines (20 MB of real data), then a hole up to 2 GiB.
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&path).unwrap());
    for number in 1..=10_000_005u64 {
        if number >= 9_999_999 {
            writeln!(out, "entry {number}").unwrap();
        } else {
            out.write_all(b"x\n").unwrap();
        }
    }
    let file = out.into_inner().unwrap();
    file.set_len(2 * 1024 * 1024 * 1024).unwrap();
    drop(file);

    let before = bytes_read_by_process();
    let res =
        fx.call("read_file", json!({"path": "huge.log", "offset": 10_000_000, "limit": 3})).await;
    let after = bytes_read_by_process();
    assert_ok(&res);
    assert_eq!(
        res.content,
        "10000000\tentry 10000000\n10000001\tentry 10000001\n10000002\tentry 10000002\n\n\
         [window: lines 10000000-10000002 of a file of 2147483648 bytes, too large to read \
         whole; read on with offset=10000003]"
    );
    assert_eq!(meta(&res, "windowed"), true);
    assert_eq!(meta(&res, "truncated"), true);
    assert!(res.metadata.get("total_lines").is_none());
    let streamed = meta(&res, "bytes_read").as_u64().unwrap();
    assert!(streamed < 64 * 1024 * 1024, "streamed {streamed} bytes");
    match (before, after) {
        (Some(before), Some(after)) => {
            assert!(after - before < 256 * 1024 * 1024, "the process read {} bytes", after - before)
        }
        _ => println!("skipped the kernel's read count: /proc/self/io is not readable"),
    }
}

const NOTEBOOK: &str = r##"{
 "cells": [
  {
   "cell_type": "markdown",
   "id": "intro",
   "metadata": {},
   "source": [
    "# Analysis\n",
    "Plain text, caf\u00e9."
   ]
  },
  {
   "cell_type": "code",
   "execution_count": 2,
   "id": "plot",
   "metadata": {
    "collapsed": false
   },
   "outputs": [
    {
     "name": "stdout",
     "output_type": "stream",
     "text": [
      "mean 4.2\n"
     ]
    },
    {
     "data": {
      "image/png": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==",
      "text/plain": [
       "<Figure size 640x480>"
      ]
     },
     "metadata": {},
     "output_type": "display_data"
    }
   ],
   "source": [
    "import stats\n",
    "print('mean', stats.mean(xs))"
   ]
  }
 ],
 "metadata": {
  "kernelspec": {
   "display_name": "Python 3",
   "language": "python",
   "name": "python3"
  }
 },
 "nbformat": 4,
 "nbformat_minor": 5
}
"##;

#[tokio::test]
async fn notebooks_read_as_cells_and_round_trip_byte_for_byte() {
    let fx = Fixture::new();
    fx.write("analysis.ipynb", NOTEBOOK);
    let res = fx.call("read_file", json!({"path": "analysis.ipynb"})).await;
    assert_ok(&res);
    assert_eq!(meta(&res, "cells"), 2);
    assert!(
        res.content.starts_with("[cell 0] markdown id=intro\n# Analysis\nPlain text, café.\n"),
        "{}",
        res.content
    );
    assert!(
        res.content.contains("[cell 1] code id=plot (python) execution_count=2\nimport stats\n"),
        "{}",
        res.content
    );
    assert!(res.content.contains("[output 0] stream\nmean 4.2\n"), "{}", res.content);
    assert!(res.content.contains("[output 1] image/png (image attachment 1)"), "{}", res.content);
    assert!(res.content.contains("<Figure size 640x480>"), "{}", res.content);
    assert!(
        matches!(&res.attachments[..], [Attachment::Image { mime_type, .. }] if mime_type == "image/png")
    );

    // The same text back, by id and by index: not a byte changes.
    for target in [json!({"cell_id": "intro"}), json!({"index": 1})] {
        let source = if target.get("cell_id").is_some() {
            "# Analysis\nPlain text, café."
        } else {
            "import stats\nprint('mean', stats.mean(xs))"
        };
        let mut args = json!({"path": "analysis.ipynb", "source": source});
        args.as_object_mut().unwrap().extend(target.as_object().unwrap().clone());
        let res = fx.call("notebook_edit", args).await;
        assert_ok(&res);
        assert_eq!(meta(&res, "changed"), false);
        assert_eq!(fx.read("analysis.ipynb"), NOTEBOOK.as_bytes());
    }

    // A real change touches only the cell's source, in the file's style.
    let res = fx
        .call(
            "notebook_edit",
            json!({"path": "analysis.ipynb", "cell_id": "plot", "source": "print(1)\nprint(2)"}),
        )
        .await;
    assert_ok(&res);
    let edited = fx.read_text("analysis.ipynb");
    let expected = NOTEBOOK.replace(
        "    \"import stats\\n\",\n    \"print('mean', stats.mean(xs))\"",
        "    \"print(1)\\n\",\n    \"print(2)\"",
    );
    assert_eq!(edited, expected);

    // Insert then delete: back to the same bytes; the notebook must be fresh each time.
    let res = fx
        .call("notebook_edit", json!({"path": "analysis.ipynb", "index": 1, "action": "insert", "cell_type": "markdown", "source": "## Method"}))
        .await;
    assert_ok(&res);
    let parsed: Value = serde_json::from_str(&fx.read_text("analysis.ipynb")).unwrap();
    assert_eq!(parsed["cells"][1]["source"], json!(["## Method"]));
    assert_eq!(parsed["cells"].as_array().unwrap().len(), 3);
    let res = fx
        .call("notebook_edit", json!({"path": "analysis.ipynb", "index": 1, "action": "delete"}))
        .await;
    assert_ok(&res);
    assert_eq!(fx.read_text("analysis.ipynb"), expected);

    // Another session that never read it is refused.
    let other = fx.other_session();
    let res = call_in(
        &fx.registry,
        &other,
        "notebook_edit",
        json!({"path": "analysis.ipynb", "index": 0, "source": "x"}),
    )
    .await;
    assert_err(&res, ErrorType::StaleFile);
}
