//! How what the file system says enters a decision.
//!
//! The engine itself does no I/O. Where a decision depends on the file system (a
//! redirection's target, a `cd` in the command), it asks the [`Resolver`] of the
//! [`CallContext`](super::CallContext): the daemon passes [`SystemResolver`], which
//! reads the real file system; tests pass a table ([`Lexical`] or their own). The walk
//! that follows symlinks is [`follow`], shared by both, so what a test proves about it
//! holds for the daemon.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

/// Most symlinks one resolution follows, as the kernel's limit (`ELOOP`).
const MAX_LINKS: usize = 40;

/// Answers where a path really leads.
pub trait Resolver: Send + Sync {
    /// The path an absolute `path` (which may hold `.` and `..`) names once every
    /// symlink on it is followed, the final component included, as the kernel would
    /// when a command opens it for writing. Components that do not exist yet are kept
    /// as written. `None` when that cannot be told: a symlink loop, a directory that
    /// cannot be read.
    fn resolve(&self, path: &Path) -> Option<PathBuf>;
}

/// What one path component turned out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Exists and is not a symlink.
    Present,
    /// Does not exist (or its parent is not a directory): the rest is taken as written.
    Missing,
    /// A symlink with this target.
    Link(PathBuf),
    /// Cannot be looked at.
    Unreadable,
}

/// Follows the symlinks of an absolute `path`, asking `lookup` about each component
/// (already physical: every component before it was resolved). `..` goes to the
/// physical parent, as the kernel does.
pub fn follow(path: &Path, mut lookup: impl FnMut(&Path) -> Entry) -> Option<PathBuf> {
    let mut pending: VecDeque<OwnedComponent> = components(path).collect();
    let mut out = PathBuf::from("/");
    let mut links = 0usize;
    // Components pushed since the first missing one: those are not looked up.
    let mut missing_depth = 0usize;
    while let Some(component) = pending.pop_front() {
        match component {
            OwnedComponent::Root => {
                out = PathBuf::from("/");
                missing_depth = 0;
            }
            OwnedComponent::Parent => {
                out.pop();
                missing_depth = missing_depth.saturating_sub(1);
            }
            OwnedComponent::Normal(name) => {
                out.push(&name);
                if missing_depth > 0 {
                    missing_depth += 1;
                    continue;
                }
                match lookup(&out) {
                    Entry::Present => {}
                    Entry::Missing => missing_depth = 1,
                    Entry::Unreadable => return None,
                    Entry::Link(target) => {
                        links += 1;
                        if links > MAX_LINKS {
                            return None;
                        }
                        out.pop();
                        for (at, part) in components(&target).enumerate() {
                            pending.insert(at, part);
                        }
                    }
                }
            }
        }
    }
    Some(out)
}

enum OwnedComponent {
    Root,
    Parent,
    Normal(OsString),
}

fn components(path: &Path) -> impl Iterator<Item = OwnedComponent> + '_ {
    path.components().filter_map(|component| match component {
        Component::RootDir | Component::Prefix(_) => Some(OwnedComponent::Root),
        Component::CurDir => None,
        Component::ParentDir => Some(OwnedComponent::Parent),
        Component::Normal(name) => Some(OwnedComponent::Normal(name.to_owned())),
    })
}

/// The real file system, read with `lstat` and `readlink`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve(&self, path: &Path) -> Option<PathBuf> {
        follow(path, |component| match std::fs::symlink_metadata(component) {
            Ok(meta) if meta.file_type().is_symlink() => match std::fs::read_link(component) {
                Ok(target) => Entry::Link(target),
                Err(_) => Entry::Unreadable,
            },
            Ok(_) => Entry::Present,
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                Entry::Missing
            }
            Err(_) => Entry::Unreadable,
        })
    }
}

/// A file system without symlinks: paths resolve as written. For tests, and for
/// callers that have no file system to ask.
#[derive(Clone, Copy, Debug, Default)]
pub struct Lexical;

impl Resolver for Lexical {
    fn resolve(&self, path: &Path) -> Option<PathBuf> {
        follow(path, |_| Entry::Present)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// A file system given as a table of symlinks and unreadable paths; every other
    /// path under `/w` exists, everything else is missing.
    struct Table(HashMap<&'static str, Entry>);

    impl Resolver for Table {
        fn resolve(&self, path: &Path) -> Option<PathBuf> {
            follow(path, |component| {
                let text = component.to_str().unwrap_or_default();
                match self.0.get(text) {
                    Some(entry) => entry.clone(),
                    None if text == "/w" || text.starts_with("/w/") => Entry::Present,
                    None => Entry::Missing,
                }
            })
        }
    }

    #[test]
    fn follows_links_like_the_kernel() {
        let table = Table(HashMap::from([
            ("/w/out", Entry::Link(PathBuf::from("../outside"))),
            ("/w/abs", Entry::Link(PathBuf::from("/etc"))),
            ("/w/chain", Entry::Link(PathBuf::from("out/deeper"))),
            ("/w/loop", Entry::Link(PathBuf::from("loop"))),
            ("/w/secret", Entry::Unreadable),
            ("/w/dangling", Entry::Link(PathBuf::from("/nowhere/file"))),
        ]));
        let cases: &[(&str, Option<&str>)] = &[
            ("/w/a/b", Some("/w/a/b")),
            ("/w/out/x", Some("/outside/x")),
            ("/w/out/../x", Some("/x")),
            ("/w/a/../out/x", Some("/outside/x")),
            ("/w/abs/passwd", Some("/etc/passwd")),
            ("/w/chain", Some("/outside/deeper")),
            ("/w/dangling", Some("/nowhere/file")),
            ("/w/loop/x", None),
            ("/w/secret/x", None),
            ("/w/./a//b/", Some("/w/a/b")),
            // Past a missing component nothing is looked up; `..` comes back to where
            // lookups start again.
            ("/nowhere/../w/out/x", Some("/outside/x")),
        ];
        for (path, expected) in cases {
            assert_eq!(
                table.resolve(Path::new(path)),
                expected.map(PathBuf::from),
                "resolving {path}"
            );
        }
    }

    #[test]
    fn the_system_resolver_reads_the_file_system() {
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let base = std::fs::canonicalize(dir.path()).unwrap_or_else(|err| panic!("{err}"));
        std::fs::create_dir(base.join("inside")).unwrap_or_else(|err| panic!("{err}"));
        std::os::unix::fs::symlink("../..", base.join("inside").join("up"))
            .unwrap_or_else(|err| panic!("{err}"));
        let resolved = SystemResolver.resolve(&base.join("inside/up/x"));
        assert_eq!(resolved, base.parent().map(|parent| parent.join("x")));
        let plain = SystemResolver.resolve(&base.join("inside/new/file"));
        assert_eq!(plain, Some(base.join("inside/new/file")));
    }
}
