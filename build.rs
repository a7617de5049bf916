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
