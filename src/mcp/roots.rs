//! Client roots (`roots/list`) against configured roots: a client may narrow where
//! its session works, never widen it.

#[cfg(test)]
use std::path::Path;
use std::path::PathBuf;

/// The local path of a `file://` URI (`file:///home/me/x`, `file://localhost/x`),
/// percent-decoded; `None` for any other scheme or host.
pub(super) fn path_of_file_uri(uri: &str) -> Option<PathBuf> {
    let rest = uri.strip_prefix("file://")?;
    let path = rest.strip_prefix("localhost").unwrap_or(rest);
    if !path.starts_with('/') {
        return None;
    }
    let mut bytes = Vec::with_capacity(path.len());
    let raw = path.as_bytes();
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            let hex = std::str::from_utf8(&raw[i + 1..i + 3]).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            bytes.push(raw[i]);
            i += 1;
        }
    }
    use std::os::unix::ffi::OsStringExt;
    Some(PathBuf::from(std::ffi::OsString::from_vec(bytes)))
}

/// The parts of `configured` that `client` also covers: a client root inside a
/// configured root stays as it is; a configured root inside a client root stays as
/// it is; anything else is dropped. Sorted and without duplicates or nesting.
pub(super) fn intersect(configured: &[PathBuf], client: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for granted in configured {
        for asked in client {
            if asked.starts_with(granted) {
                out.push(asked.clone());
            } else if granted.starts_with(asked) {
                out.push(granted.clone());
            }
        }
    }
    out.sort();
    out.dedup();
    // Drop roots nested in another kept root.
    let kept = out.clone();
    out.retain(|path| !kept.iter().any(|other| other != path && path.starts_with(other)));
    out
}

/// Whether `path` lies inside one of `roots`.
#[cfg(test)]
fn covered(roots: &[PathBuf], path: &Path) -> bool {
    roots.iter().any(|root| path.starts_with(root))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(list: &[&str]) -> Vec<PathBuf> {
        list.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn file_uris_decode() {
        assert_eq!(path_of_file_uri("file:///a/b%20c"), Some(PathBuf::from("/a/b c")));
        assert_eq!(path_of_file_uri("file://localhost/x"), Some(PathBuf::from("/x")));
        assert_eq!(path_of_file_uri("https://example.com/x"), None);
        assert_eq!(path_of_file_uri("file://otherhost/x"), None);
    }

    #[test]
    fn intersection_narrows_and_never_widens() {
        let configured = paths(&["/srv/repo"]);
        // Narrower client root: kept.
        assert_eq!(intersect(&configured, &paths(&["/srv/repo/src"])), paths(&["/srv/repo/src"]));
        // Wider client root: the configured one.
        assert_eq!(intersect(&configured, &paths(&["/srv"])), paths(&["/srv/repo"]));
        // Unrelated: nothing.
        assert!(intersect(&configured, &paths(&["/etc"])).is_empty());
        // Several, nested ones collapse.
        assert_eq!(
            intersect(&configured, &paths(&["/srv/repo/a", "/srv/repo/a/b", "/", "/tmp"])),
            paths(&["/srv/repo"])
        );
        for narrowed in intersect(&configured, &paths(&["/srv/repo/a", "/", "/tmp"])) {
            assert!(covered(&configured, &narrowed));
        }
    }
}
