//! Paths that lexical normalization leaves as they are.
//!
//! Most paths a model names are plain: `src/main.rs`, or an absolute path below a
//! root, with no `.` or `..`, no doubled or trailing slash. Joined onto a plain working
//! directory, such a path is already normalized, so the lookups and the permission
//! layer take it as it is — one allocation for the joined path — instead of walking
//! its components. Anything else takes the general way, which gives the same result.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// Whether `path` has no empty, `.` or `..` component and no trailing slash (one
/// leading slash allowed). The empty path and `/` are not plain.
pub(crate) fn is_plain(path: &[u8]) -> bool {
    let body = path.strip_prefix(b"/").unwrap_or(path);
    !body.is_empty()
        && body
            .split(|&byte| byte == b'/')
            .all(|part| !part.is_empty() && part != b"." && part != b"..")
}

/// `path` made absolute against `base` and normalized, when that needs no
/// normalizing: `path` is plain and, if relative, `base` is a plain absolute path.
/// `None` otherwise (normalize the general way).
pub(crate) fn join_plain(base: &Path, path: &Path) -> Option<PathBuf> {
    let path = path.as_os_str().as_bytes();
    if !is_plain(path) {
        return None;
    }
    if path.starts_with(b"/") {
        return Some(PathBuf::from(OsString::from_vec(path.to_vec())));
    }
    let base = base.as_os_str().as_bytes();
    if !base.starts_with(b"/") || !is_plain(base) {
        return None;
    }
    let mut joined = Vec::with_capacity(base.len() + 1 + path.len());
    joined.extend_from_slice(base);
    joined.push(b'/');
    joined.extend_from_slice(path);
    Some(PathBuf::from(OsString::from_vec(joined)))
}

/// Whether the plain absolute `path` lies strictly below the plain absolute `dir`
/// (what `Path::starts_with` says of such paths, without the component walk).
pub(crate) fn strictly_below(path: &Path, dir: &Path) -> bool {
    let (path, dir) = (path.as_os_str().as_bytes(), dir.as_os_str().as_bytes());
    path.len() > dir.len() + 1 && path.starts_with(dir) && path[dir.len()] == b'/'
}

/// `path.starts_with(dir)` as `Path` says it, compared by bytes when both are plain
/// (the component walk only for the others). Whether each is plain ([`is_plain`]) is
/// the caller's to say: a path checked against many directories is looked at once.
pub(crate) fn starts_with_as(path: &Path, path_plain: bool, dir: &Path, dir_plain: bool) -> bool {
    if path_plain && dir_plain {
        let (bytes, prefix) = (path.as_os_str().as_bytes(), dir.as_os_str().as_bytes());
        return bytes.starts_with(prefix)
            && (bytes.len() == prefix.len() || bytes[prefix.len()] == b'/');
    }
    path.starts_with(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The general way: what the lookups do with a path that is not plain.
    fn normalized(base: &Path, path: &Path) -> PathBuf {
        Path::new("/").join(super::super::normalize_lexically(&base.join(path)))
    }

    #[test]
    fn plain_paths_are_those_normalizing_leaves_alone() {
        for plain in ["a", "a.rs", "src/main.rs", "/w/p/a", ".hidden/x", "a/..b/c.", "/x"] {
            assert!(is_plain(plain.as_bytes()), "{plain}");
        }
        for not_plain in
            ["", "/", "//x", "a//b", "a/", "./a", "a/.", "a/./b", "../a", "a/..", "/w/../x"]
        {
            assert!(!is_plain(not_plain.as_bytes()), "{not_plain}");
        }
    }

    #[test]
    fn a_plain_join_is_what_normalizing_gives() {
        let base = Path::new("/work/proj");
        for path in ["a.rs", "src/main.rs", "/etc/passwd", "/work/proj/x", "..x/y"] {
            let joined = join_plain(base, Path::new(path)).unwrap();
            assert_eq!(joined, normalized(base, Path::new(path)), "{path}");
        }
        for path in ["", ".", "./a", "a/../b", "a//b", "a/", "../x"] {
            assert_eq!(join_plain(base, Path::new(path)), None, "{path}");
        }
        // A relative path on a base that is not plain (or not absolute) is left to
        // the general way.
        assert_eq!(join_plain(Path::new("/"), Path::new("a")), None);
        assert_eq!(join_plain(Path::new("/w/./p"), Path::new("a")), None);
        assert_eq!(join_plain(Path::new("w/p"), Path::new("a")), None);
    }

    #[test]
    fn starts_with_agrees_with_path() {
        let paths = [
            "/w/p", "/w/p/a", "/w/pa", "/w", "/", "/w/p/", "/w//p/a", "/w/./p/a", "w/p", "w",
            "w/p/a", "/x/p", "",
        ];
        for path in paths {
            for dir in paths {
                assert_eq!(
                    starts_with_as(
                        Path::new(path),
                        is_plain(path.as_bytes()),
                        Path::new(dir),
                        is_plain(dir.as_bytes())
                    ),
                    Path::new(path).starts_with(dir),
                    "{path:?} {dir:?}"
                );
            }
        }
    }

    #[test]
    fn strictly_below_agrees_with_starts_with_for_plain_paths() {
        let cases = [
            ("/w/p/a", "/w/p", true),
            ("/w/p", "/w/p", false),
            ("/w/pa", "/w/p", false),
            ("/w/p/a/b", "/w", true),
            ("/x/p/a", "/w/p", false),
        ];
        for (path, dir, below) in cases {
            assert_eq!(strictly_below(Path::new(path), Path::new(dir)), below, "{path} {dir}");
            assert_eq!(Path::new(path).starts_with(dir) && path != dir, below, "{path} {dir}");
        }
    }
}
