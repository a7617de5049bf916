//! toolgate's own files: the paths no tool may ever read or write.
//!
//! Configuration, token files, skill and hook files, the audit log, the state and
//! runtime directories steer the daemon itself. A model that could read them would see
//! every client's token and other sessions' audit records; one that could write them
//! would change its own rules. So they go into the session's
//! [`Access`](crate::tools::fs::Access) as a built-in deny on resolved paths, which no
//! rule and no mode (bypass included) lifts, wherever they lie. When one of them lies
//! inside a workspace root, the daemon says so at start-up.
//!
//! A workspace's own skill directory (`<root>/.toolgate/skills`) is part of the
//! workspace, not of toolgate's configuration: whether its skills are trusted is
//! decided where skills are loaded.

use std::path::{Path, PathBuf};

use crate::config::{Config, LoadOptions};
use crate::tools::fs::Access;

/// The directory name toolgate uses under each XDG base directory.
const APP_DIR: &str = "toolgate";

/// Every file and directory of toolgate's own that `config` (loaded with `options`)
/// names, absolute. Directories cover everything beneath them.
pub fn own_paths(config: &Config, options: &LoadOptions) -> Vec<PathBuf> {
    let mut own: Vec<PathBuf> = Vec::new();
    // Configuration: every layer read, and the directories they come from.
    own.extend(config.sources.iter().cloned());
    own.extend(options.system_dir.iter().cloned());
    own.extend(options.user_dir.iter().cloned());
    // State (the default audit log lives here) and the runtime directory (socket,
    // generated tokens).
    own.extend(options.state_home.iter().map(|dir| dir.join(APP_DIR)));
    own.extend(options.runtime_dir.iter().map(|dir| dir.join(APP_DIR)));
    own.push(config.server.socket.clone());
    own.extend(config.server.token_file.iter().cloned());
    if let Some(log) = &config.server.audit_log {
        own.push(log.clone());
        // Rotated logs sit next to the log; a directory of toolgate's own is covered
        // whole.
        if let Some(dir) = log.parent().filter(|dir| dir.ends_with(APP_DIR)) {
            own.push(dir.to_path_buf());
        }
    }
    // Skills, except each workspace's own skill directory.
    let workspace_skills: Vec<PathBuf> =
        config.workspace.roots.iter().map(|root| root.join(".toolgate").join("skills")).collect();
    own.extend(config.skills.dirs.iter().filter(|dir| !workspace_skills.contains(dir)).cloned());
    // Hook programs: every word of a hook command that names an existing file.
    let hooks = config.hooks.pre_tool_use.iter().chain(&config.hooks.post_tool_use);
    for hook in hooks {
        own.extend(hook_files(&hook.command, options.home.as_deref()));
    }
    own.retain(|path| path.is_absolute() && path.parent().is_some());
    own.sort();
    own.dedup();
    own
}

/// Words of a hook command that name existing regular files (`~/` expanded), the
/// scripts a hook runs.
fn hook_files(command: &str, home: Option<&Path>) -> Vec<PathBuf> {
    command
        .split(|c: char| c.is_whitespace() || matches!(c, ';' | '&' | '|' | '\'' | '"'))
        .filter_map(|word| match (word.strip_prefix("~/"), home) {
            (Some(rest), Some(home)) => Some(home.join(rest)),
            (Some(_), None) => None,
            (None, _) if word.starts_with('/') => Some(PathBuf::from(word)),
            (None, _) => None,
        })
        .filter(|path| path.is_file())
        .collect()
}

/// Logs a warning for each of toolgate's own paths that lies inside a root: the tools
/// refuse them, but commands run in the roots.
pub fn warn_inside_roots(access: &Access, roots: &[PathBuf]) {
    for own in access.own_paths() {
        if let Some(root) = roots.iter().find(|root| own.starts_with(root)) {
            tracing::warn!(
                path = %own.display(),
                root = %root.display(),
                "one of toolgate's own files lies inside a workspace root; tools refuse it, \
                 but commands run there could reach it: move the root or the file"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_words_that_name_files_are_kept() {
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let script = dir.path().join("guard.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap_or_else(|err| panic!("{err}"));
        let command = format!("sh {} --strict; echo ~/missing", script.display());
        assert_eq!(hook_files(&command, Some(dir.path())), vec![script.clone()]);
        let home_relative = "~/guard.sh";
        assert_eq!(hook_files(home_relative, Some(dir.path())), vec![script]);
        assert!(hook_files(home_relative, None).is_empty());
    }
}
