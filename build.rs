//! Names the commit the binary is built from, for `toolgate --version`.
//!
//! `TOOLGATE_BUILD_COMMIT` wins (for packagers building from a tarball who know it);
//! else `git` is asked when the sources are a checkout; else the commit is `unknown`.
//! Building never depends on git being installed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TOOLGATE_BUILD_COMMIT");
    let commit = std::env::var("TOOLGATE_BUILD_COMMIT")
        .ok()
        .filter(|commit| !commit.trim().is_empty())
        .or_else(from_git)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=TOOLGATE_COMMIT={commit}");
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
