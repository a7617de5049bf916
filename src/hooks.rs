//! SKELETON: command hooks.

/// One configured command hook (compatible with Claude Code's command hooks).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// Regex on the tool name; empty or "*" matches every tool.
    #[serde(default)]
    pub matcher: String,
    /// Run through `/bin/sh -c`; a leading `~/` is expanded to the home directory.
    pub command: String,
    /// Killed (with its whole process group) after this long.
    #[serde(default = "default_hook_timeout_ms")]
    pub timeout_ms: u64,
    /// What a hook that fails to run or exits with an unexpected code means.
    #[serde(default)]
    pub on_error: OnError,
}

/// Whether a failing hook lets the call through (fail open) or blocks it (fail closed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    #[default]
    Allow,
    Deny,
}

fn default_hook_timeout_ms() -> u64 {
    60_000
}
