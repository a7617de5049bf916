//! Names the commit the binary is built from, for `toolgate --version`.
//!
//! `TOOLGATE_BUILD_COMMIT` wins (for packagers building from a tarball who know it);
//! else `git` is asked when the sources are the top of a checkout (not a tarball
//! unpacked inside some other repository); else a published crate's
//! `.cargo_vcs_info.json` says; else the commit is `unknown`. Building never depends
//! on git being installed.
//!
//! On Linux with glibc, the binary's relative relocations are packed (DT_RELR): the
//! loader reads about 16 KB of them at every start instead of 950 KB (the daemon, its
//! supervisor spawner, a sandboxed upstream server, every command-line client).
//!
//! Where the linker is lld (the default of Rust 1.90 and later on x86-64 Linux with
//! glibc), the functions listed in `link/text-order.txt` (what a server runs from its
//! start to idle, then what a call runs) are laid out first, together: an idle server
//! then has about 4 MB of its code resident instead of 11 (see `scripts/text-order`).
//! `TOOLGATE_TEXT_ORDER=0` turns this off, as does any linker choice in RUSTFLAGS.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TOOLGATE_BUILD_COMMIT");
    let commit = std::env::var("TOOLGATE_BUILD_COMMIT")
        .ok()
        .filter(|commit| !commit.trim().is_empty())
        .or_else(from_git)
        .or_else(from_cargo_vcs_info)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=TOOLGATE_COMMIT={commit}");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu")
    {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    order_text();
}

/// Hands `link/text-order.txt` to lld as the binary's symbol ordering file. Names the
/// build does not have are skipped without a word: the list is an optimisation of
/// layout, and one made for another toolchain only orders less.
fn order_text() {
    println!("cargo:rerun-if-env-changed=TOOLGATE_TEXT_ORDER");
    let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR") else { return };
    let list = Path::new(&dir).join("link").join("text-order.txt");
    println!("cargo:rerun-if-changed={}", list.display());
    let wanted = std::env::var("TOOLGATE_TEXT_ORDER").map_or(true, |value| value != "0");
    let text = list.to_string_lossy();
    // A comma would split the argument `-Wl,` passes on.
    if !wanted || !list.exists() || text.contains(',') || !linker_is_lld() {
        return;
    }
    println!("cargo:rustc-link-arg-bin=toolgate=-Wl,--symbol-ordering-file={text}");
    println!("cargo:rustc-link-arg-bin=toolgate=-Wl,--no-warn-symbol-ordering");
    // For the test that checks the layout it gives, and that the list was made with
    // this toolchain.
    println!("cargo:rustc-env=TOOLGATE_TEXT_ORDER_FILE={text}");
    if let Some(version) = rustc_version() {
        println!("cargo:rustc-env=TOOLGATE_RUSTC_VERSION={version}");
    }
}

/// Whether rustc links this target with its own lld: on x86-64 Linux with glibc since
/// Rust 1.90, unless RUSTFLAGS choose the linker.
fn linker_is_lld() -> bool {
    if std::env::var("TARGET").as_deref() != Ok("x86_64-unknown-linux-gnu") {
        return false;
    }
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    let chosen = ["fuse-ld", "linker", "link-self-contained"];
    if flags.split('\x1f').any(|flag| chosen.iter().any(|word| flag.contains(word))) {
        return false;
    }
    let Some(version) = rustc_version() else { return false };
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    let mut numbers = version.split_whitespace().nth(1).unwrap_or("").split('.');
    let major = numbers.next().and_then(|n| n.parse::<u32>().ok());
    let minor = numbers.next().and_then(|n| n.parse::<u32>().ok());
    matches!((major, minor), (Some(1), Some(minor)) if minor >= 90)
}

/// What `rustc -V` says of the compiler building this crate.
fn rustc_version() -> Option<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let output = Command::new(rustc).arg("-V").output().ok()?;
    Some(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn git(args: &[&str]) -> Option<String> {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
    let output = Command::new("git").args(args).current_dir(manifest_dir).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// The abbreviated commit of HEAD, and what makes Cargo run this again when HEAD
/// moves (a commit, a checkout): the HEAD file, the branch's ref and packed-refs.
fn from_git() -> Option<String> {
    let manifest_dir = std::fs::canonicalize(std::env::var_os("CARGO_MANIFEST_DIR")?).ok()?;
    let toplevel = std::fs::canonicalize(git(&["rev-parse", "--show-toplevel"])?).ok()?;
    if toplevel != manifest_dir {
        return None;
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    let absolute = |path: String| {
        let path = PathBuf::from(path);
        match std::env::var_os("CARGO_MANIFEST_DIR") {
            Some(dir) if path.is_relative() => Path::new(&dir).join(path),
            _ => path,
        }
    };
    let mut watched = Vec::new();
    if let Some(git_dir) = git(&["rev-parse", "--git-dir"]) {
        watched.push(absolute(git_dir).join("HEAD"));
    }
    if let Some(common) = git(&["rev-parse", "--git-common-dir"]) {
        let common = absolute(common);
        watched.push(common.join("packed-refs"));
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watched.push(common.join(branch));
        }
    }
    // A path that does not exist would make Cargo run this script on every build.
    for path in watched.iter().filter(|path| path.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    Some(commit)
}

/// `cargo package` records the commit in `.cargo_vcs_info.json`:
/// `{"git": {"sha1": "…"}, …}`.
fn from_cargo_vcs_info() -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
    let path = Path::new(&dir).join(".cargo_vcs_info.json");
    let text = std::fs::read_to_string(&path).ok()?;
    println!("cargo:rerun-if-changed={}", path.display());
    let start = text.find("\"sha1\"")?;
    let rest = &text[start + "\"sha1\"".len()..];
    let hex: String = rest
        .trim_start_matches(|c: char| c == ':' || c == '"' || c.is_whitespace())
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .take(12)
        .collect();
    (hex.len() == 12).then_some(hex)
}
