//! What a tool declares about itself for the layers above the registry: what its
//! calls act on (a command, paths, a patch), how each path is used, whether it edits
//! files, and what Claude Code calls it and its arguments.
//!
//! A built-in tool declares these next to its schema, in its [`Definition`]; the
//! permission rules, the confinement check of `tools/explain`, `accept_edits` and the
//! hooks read them from there (`builtin::facts`), so a new tool is known to every
//! layer by what it declares. A tool that declares nothing (a proxied MCP tool, a
//! skill, a test's tool) gets [`Facts::default`]: its arguments are plain values,
//! rules match them as text, and no path of it is confined or matched as a path.
//!
//! These are never sent to a client: the wire form of a [`Definition`] is unchanged.
//!
//! [`Definition`]: super::Definition

/// What the layers above the registry know about one tool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// What a call acts on: what a rule's specifier is matched against, and the paths
    /// confinement checks.
    pub subject: Subject,
    /// Whether the tool creates, replaces, changes or deletes files: what
    /// `accept_edits` lets run inside the roots without asking, what Claude Code's
    /// `Edit` rules govern, and what a guarded directory asks about. Its paths are
    /// [`PathAccess::Write`].
    pub edits: bool,
    /// Whether the tool's path rules stand for every access of its paths' kind: the
    /// file layer applies them to the resolved path of whatever any tool opens so
    /// (`read_file`'s rules to every read, `edit_file`'s and `write_file`'s to every
    /// write, as Claude Code's `Read`, `Edit` and `Write` rules do).
    pub binds_access: bool,
    /// Claude Code's counterpart of the tool.
    pub claude_code: ClaudeCode,
}

/// What a call acts on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Subject {
    /// Plain arguments (the default): rules match their values as text.
    #[default]
    Arguments,
    /// A shell command: the text of the argument `command`, run in the directory the
    /// argument `cwd` names (the working directory when it is left out).
    Command { command: &'static str, cwd: &'static str },
    /// Files or directories, one per argument.
    Paths(&'static [PathArgument]),
    /// Every file a patch (in `apply_patch`'s formats) in the argument `patch` names,
    /// relative to the working directory; all of them are written.
    Patch { patch: &'static str },
}

/// One argument naming a file or a directory, relative to the working directory or
/// absolute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathArgument {
    /// The argument's name in the input schema.
    pub name: &'static str,
    /// The path a call that leaves the argument out acts on (`"."`: the working
    /// directory); `None` when such a call names no path.
    pub default: Option<&'static str>,
    pub access: PathAccess,
}

/// How a tool uses a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathAccess {
    /// Returns the file's content.
    Read,
    /// Creates, replaces or changes the file.
    Write,
    /// Lists or searches the directory (or file) beneath it: a rule for a directory
    /// covers the searches started there.
    Search,
}

/// Claude Code's counterpart of a tool, for rules and hooks written for Claude Code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClaudeCode {
    /// The tool does not say (tools from elsewhere): it keeps its own names.
    #[default]
    Undeclared,
    /// Claude Code has no such tool: the tool keeps its own names.
    NoCounterpart,
    /// Claude Code's tool of the same purpose.
    Tool(ClaudeTool),
}

impl ClaudeCode {
    /// The counterpart, when there is one.
    pub fn tool(&self) -> Option<&ClaudeTool> {
        match self {
            ClaudeCode::Tool(tool) => Some(tool),
            ClaudeCode::Undeclared | ClaudeCode::NoCounterpart => None,
        }
    }
}

/// Claude Code's names for a tool and its arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaudeTool {
    /// Its name: the `tool_name` a Claude Code hook sees, and a name rules may give
    /// the tool (`Bash`, `Read`).
    pub name: &'static str,
    /// Further names rules may give the tool (`MultiEdit` for `edit_file`).
    pub aliases: &'static [&'static str],
    /// Arguments named differently, as (toolgate's name, Claude Code's name): what a
    /// Claude Code hook reads in `tool_input` and writes in `updatedInput`.
    pub fields: &'static [(&'static str, &'static str)],
}

impl Facts {
    /// The facts of a tool that declares nothing.
    pub const NONE: Facts = Facts {
        subject: Subject::Arguments,
        edits: false,
        binds_access: false,
        claude_code: ClaudeCode::Undeclared,
    };

    /// Whether rule specifiers for the tool are path globs.
    pub fn takes_path_rules(&self) -> bool {
        matches!(self.subject, Subject::Paths(_) | Subject::Patch { .. })
    }

    /// Whether the tool's paths name directories to list or search.
    pub fn searches(&self) -> bool {
        matches!(self.subject, Subject::Paths(paths)
            if paths.iter().any(|path| path.access == PathAccess::Search))
    }

    /// The argument holding the command, for a command tool.
    pub fn command_argument(&self) -> Option<&'static str> {
        match self.subject {
            Subject::Command { command, .. } => Some(command),
            _ => None,
        }
    }
}
