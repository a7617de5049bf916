//! Lexical path arithmetic for permission decisions.
//!
//! The permission engine decides before anything touches the disk, so it resolves a
//! path the way a reader of the call would: relative to the working directory, `.`
//! dropped, `..` popping one component, symlinks not followed. The tools themselves
//! enforce root confinement on the real file system afterwards; this view only decides
//! which rules a path falls under, and a lexical escape (`../../etc`) is therefore seen
//! as outside the roots, as it must be.

use std::path::{Component, Path, PathBuf};

/// Joins `path` onto `cwd` (unless it is absolute) and normalizes it lexically.
///
/// `..` at the file-system root stays at the root, as the kernel does.
pub(crate) fn resolve(cwd: &Path, path: &Path) -> PathBuf {
    if let Some(plain) = crate::tools::fs::lexical::join_plain(cwd, path) {
        return plain;
    }
    let mut out = if path.is_absolute() { PathBuf::from("/") } else { normalize(cwd) };
    push_normalized(&mut out, path);
    out
}

/// Normalizes an absolute path lexically (used for the working directory itself, which
/// the session already keeps canonical; normalizing again costs little and keeps a
/// hand-built context honest).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    push_normalized(&mut out, path);
    out
}

fn push_normalized(out: &mut PathBuf, path: &Path) {
    for component in path.components() {
        match component {
            Component::RootDir => {
                out.clear();
                out.push("/");
            }
            Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => out.push(part),
        }
    }
}

/// Whether a lexically normalized absolute path lies inside (or is) one of the roots.
pub(crate) fn inside_roots(path: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|root| path.starts_with(root))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_lexically() {
        let cwd = Path::new("/w/proj/sub");
        let table = [
            ("a.rs", "/w/proj/sub/a.rs"),
            ("./a.rs", "/w/proj/sub/a.rs"),
            ("../b/c.rs", "/w/proj/b/c.rs"),
            ("../../../../../etc/passwd", "/etc/passwd"),
            ("/abs/./x/../y", "/abs/y"),
            ("", "/w/proj/sub"),
            (".", "/w/proj/sub"),
            ("x//y/", "/w/proj/sub/x/y"),
        ];
        for (input, expected) in table {
            assert_eq!(resolve(cwd, Path::new(input)), PathBuf::from(expected), "input {input:?}");
        }
    }

    #[test]
    fn containment_is_component_wise() {
        let roots = [PathBuf::from("/w/proj")];
        assert!(inside_roots(Path::new("/w/proj"), &roots));
        assert!(inside_roots(Path::new("/w/proj/src/a.rs"), &roots));
        assert!(!inside_roots(Path::new("/w/project/a.rs"), &roots));
        assert!(!inside_roots(Path::new("/w"), &roots));
    }
}
