//! Saying what the sandbox denied, so that the model can ask for it.
//!
//! The kernel does not tell the daemon which access of a command Landlock refused:
//! its denial records (Landlock ABI 7 and later) go to the audit subsystem, readable
//! only with `CAP_AUDIT_READ` over an audit netlink socket, which toolgate does not
//! use. So a failed command's error output is read the
//! way a person would: a line that says "Permission denied" (`EACCES`, what both
//! Landlock and the network filter answer) or "Operation not permitted" and names a
//! path the profile does not grant is taken as a denial of that path; such a line
//! naming no path, with the network off, as a denied connection. The result says that
//! this is inferred, and how to ask for the access (`run_command`'s `sandbox`
//! argument, which a person must approve).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::Profile;

/// Denials named in one result at most.
const MAX_DENIALS: usize = 8;

/// Where a denial was learned.
pub const INFERRED: &str = "inferred from the command's error output";

/// One access the sandbox (probably) refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denial {
    /// A path: `write` when the profile lets it be read (so it was a write), else
    /// `read`. `protected`: a secret location or one of toolgate's own files, never
    /// grantable.
    Path { path: PathBuf, access: &'static str, protected: bool },
    /// A network connection or socket, with the network off.
    Network,
}

/// What the sandbox denied a failed command, from its error output: the value of
/// `metadata.sandbox_denied` and the line to add to its content (what was denied and
/// the widening to ask for); `None` when nothing points at the sandbox.
pub fn report(stderr: &str, profile: &Profile) -> Option<(Value, String)> {
    let denials = infer(stderr, profile);
    if denials.is_empty() {
        return None;
    }
    let listed: Vec<Value> = denials
        .iter()
        .map(|denial| match denial {
            Denial::Path { path, access, protected } => {
                json!({"path": path, "access": access, "protected": protected})
            }
            Denial::Network => json!({"network": true}),
        })
        .collect();
    Some((json!({"source": INFERRED, "denied": listed}), hint(&denials)))
}

/// The line added to the content: what was denied and the widening that would allow
/// it.
fn hint(denials: &[Denial]) -> String {
    let mut what = Vec::new();
    let mut writable = Vec::new();
    let mut readable = Vec::new();
    let mut network = false;
    for denial in denials {
        match denial {
            Denial::Path { path, access, protected: true } => {
                what.push(format!(
                    "{access} {} (a secret location or toolgate's own file: never granted)",
                    path.display()
                ));
            }
            Denial::Path { path, access, protected: false } => {
                what.push(format!("{access} {}", path.display()));
                let grant = grantable(path).display().to_string();
                let list = if *access == "write" { &mut writable } else { &mut readable };
                if !list.contains(&grant) {
                    list.push(grant);
                }
            }
            Denial::Network => {
                what.push("a network connection".to_owned());
                network = true;
            }
        }
    }
    let mut ask = serde_json::Map::new();
    if !writable.is_empty() {
        ask.insert("writable".to_owned(), json!(writable));
    }
    if !readable.is_empty() {
        ask.insert("readable".to_owned(), json!(readable));
    }
    if network {
        ask.insert("network".to_owned(), json!(true));
    }
    let mut line = format!("\n[sandbox: denied {} ({INFERRED})", what.join(", "));
    if !ask.is_empty() {
        line.push_str(&format!(
            "; to allow it for this call, run it again with \"sandbox\": {}, which a person \
             must approve",
            Value::Object(ask)
        ));
    }
    line.push(']');
    line
}

/// What to make writable so `path` can be written: the path when it exists, else the
/// nearest existing directory above it (where it would be created).
fn grantable(path: &Path) -> &Path {
    let mut candidate = path;
    while candidate.symlink_metadata().is_err() {
        match candidate.parent() {
            Some(parent) => candidate = parent,
            None => break,
        }
    }
    candidate
}

/// The denials a command's error output reports, as far as they can be told apart
/// from ordinary permission errors: only paths the profile does not grant count.
pub fn infer(stderr: &str, profile: &Profile) -> Vec<Denial> {
    let mut found: Vec<Denial> = Vec::new();
    for line in stderr.lines() {
        if !(line.contains("Permission denied") || line.contains("Operation not permitted")) {
            continue;
        }
        let paths = paths_in(line);
        if paths.is_empty() {
            if !profile.network && !found.contains(&Denial::Network) {
                found.push(Denial::Network);
            }
            continue;
        }
        for path in paths {
            let protected = beneath_any(&path, &profile.protect);
            let writable = beneath_any(&path, &profile.write) && !protected;
            if writable {
                // Granted by the sandbox: an ordinary permission error.
                continue;
            }
            let readable = (beneath_any(&path, &profile.read)
                || beneath_any(&path, &profile.own_read))
                && !protected;
            let access = if readable || writes(line) { "write" } else { "read" };
            let denial = Denial::Path { path, access, protected };
            if !found.contains(&denial) {
                found.push(denial);
            }
        }
        if found.len() >= MAX_DENIALS {
            found.truncate(MAX_DENIALS);
            break;
        }
    }
    found
}

/// Whether an error line is about writing (`cannot create`, `cannot touch`, ...).
fn writes(line: &str) -> bool {
    let line = line.to_ascii_lowercase();
    ["create", "touch", "write", "remove", "mkdir", "rename", "overwrite", "move", "copy", "unlink"]
        .iter()
        .any(|verb| line.contains(verb))
}

fn beneath_any(path: &Path, dirs: &[PathBuf]) -> bool {
    dirs.iter().any(|dir| path.starts_with(dir))
}

/// Absolute paths in an error line: quoted (`'…'`, `"…"`, `‘…’`, `` `…' ``) or bare
/// words starting with `/`, without the trailing `:` of `cat: /x: Permission denied`.
fn paths_in(line: &str) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find(['\'', '"', '‘', '`']) {
        let quote = rest[start..].chars().next().unwrap_or('\'');
        let after = &rest[start + quote.len_utf8()..];
        let close: &[char] = match quote {
            '‘' => &['’'],
            '`' => &['\'', '`'],
            '"' => &['"'],
            _ => &['\''],
        };
        let Some(end) = after.find(close) else { break };
        let inside = &after[..end];
        if inside.starts_with('/') {
            paths.push(PathBuf::from(inside));
        }
        rest = &after[end..];
        rest = rest.get(1..).unwrap_or_default();
    }
    if paths.is_empty() {
        // The first word ending in `:` is the program's name (`/bin/sh: 1: cannot
        // create /tmp/x: Permission denied`), not what it was denied.
        let mut words = line.split_whitespace().peekable();
        if words.peek().is_some_and(|word| word.ends_with(':')) {
            words.next();
        }
        for word in words {
            let word = word.trim_end_matches([':', ',', ';']);
            if word.starts_with('/') && word.len() > 1 {
                paths.push(PathBuf::from(word));
            }
        }
    }
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(network: bool) -> Profile {
        Profile {
            read: vec![PathBuf::from("/usr"), PathBuf::from("/etc"), PathBuf::from("/work")],
            write: vec![PathBuf::from("/work"), PathBuf::from("/dev/null")],
            protect: vec![PathBuf::from("/work/.state")],
            network,
            own_read: Vec::new(),
            landlock_abi: None,
            base: (0, 0),
        }
    }

    #[test]
    fn error_lines_of_common_tools_name_the_denied_path() {
        let stderr = "/bin/sh: 1: cannot create /tmp/x: Permission denied\n\
                      touch: cannot touch '/home/u/x': Permission denied\n\
                      cat: /root/.ssh/id_ed25519: Permission denied\n\
                      PermissionError: [Errno 13] Permission denied: '/etc/passwd'\n\
                      mkdir: cannot create directory ‘/work/.state/x’: Permission denied\n\
                      rm: cannot remove '/work/ro': Permission denied\n";
        let found = infer(stderr, &profile(true));
        let path = |path: &str, access, protected| Denial::Path {
            path: PathBuf::from(path),
            access,
            protected,
        };
        assert_eq!(
            found,
            vec![
                path("/tmp/x", "write", false),
                path("/home/u/x", "write", false),
                path("/root/.ssh/id_ed25519", "read", false),
                path("/etc/passwd", "write", false),
                path("/work/.state/x", "write", true),
            ]
        );
    }

    #[test]
    fn a_denial_without_a_path_is_the_network_only_when_it_is_off() {
        let stderr = "PermissionError: [Errno 13] Permission denied\n";
        assert_eq!(infer(stderr, &profile(false)), vec![Denial::Network]);
        assert!(infer(stderr, &profile(true)).is_empty());
        assert!(infer("no such file\n", &profile(false)).is_empty());
    }

    #[test]
    fn the_hint_names_the_widening_to_ask_for() {
        let denials = vec![
            Denial::Path { path: PathBuf::from("/"), access: "write", protected: false },
            Denial::Network,
        ];
        let line = hint(&denials);
        assert!(line.contains(r#""sandbox": {"network":true,"writable":["/"]}"#), "{line}");
        assert!(line.contains(INFERRED), "{line}");
    }
}
