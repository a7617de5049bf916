//! The built-in tools, one file each: the argument struct, the Definition and the
//! execution. Shared mechanics live in `tools::fs` (confinement, atomic writes) and
//! `exec` (spawning and killing process trees).

use std::sync::{Arc, LazyLock};

use serde_json::Value;

use super::Tool;
use super::facts::{Facts, Subject};

pub mod apply_patch;
pub mod edit_file;
pub mod find_files;
pub mod notebook_edit;
pub mod process_tools;
pub mod read_file;
pub mod run_command;
pub mod search_code;
pub mod write_file;

/// Every built-in tool, in no particular order (the registry sorts).
pub fn all() -> Vec<Arc<dyn Tool>> {
    let mut tools = vec![
        read_file::tool(),
        write_file::tool(),
        edit_file::tool(),
        apply_patch::tool(),
        notebook_edit::tool(),
        run_command::tool(),
        find_files::tool(),
        search_code::tool(),
    ];
    tools.extend(process_tools::tools());
    tools
}

/// Every built-in tool's name and facts, read once from their definitions, in the
/// order of [`all`]. The layers above build what they know about tools from this
/// (rule aliases, which specifiers are paths, what `accept_edits` covers, what
/// confinement checks, the names hooks see), so a tool is known by what it declares.
pub fn declared() -> &'static [(String, Facts)] {
    static DECLARED: LazyLock<Vec<(String, Facts)>> = LazyLock::new(|| {
        all()
            .iter()
            .map(|tool| {
                let definition = tool.definition();
                (definition.name.clone(), definition.facts)
            })
            .collect()
    });
    &DECLARED
}

/// The facts of the built-in tool `name`; `None` for any other tool (which declares
/// nothing the layers read).
pub fn facts(name: &str) -> Option<&'static Facts> {
    declared().iter().find(|(tool, _)| tool == name).map(|(_, facts)| facts)
}

/// The paths a call names, as written, when the tool's subject is paths or a patch:
/// each path argument given (or its default), every file of the patch. Empty for
/// other subjects (a command's directory is not among them).
pub fn paths_named(facts: &Facts, args: &Value) -> Vec<String> {
    match facts.subject {
        Subject::Paths(paths) => paths
            .iter()
            .filter_map(|path| args.get(path.name).and_then(Value::as_str).or(path.default))
            .map(str::to_owned)
            .collect(),
        Subject::Patch { patch } => {
            args.get(patch).and_then(Value::as_str).map(apply_patch::paths_of).unwrap_or_default()
        }
        Subject::Arguments | Subject::Command { .. } => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::tools::Safety;
    use crate::tools::facts::{ClaudeCode, PathAccess};

    /// Whether a schema property looks like it names a file or a directory: by its
    /// name, or by a description that says what it is relative to.
    fn path_like(name: &str, property: &Value) -> bool {
        let description = property.get("description").and_then(Value::as_str).unwrap_or("");
        matches!(name, "path" | "cwd" | "dir" | "directory" | "file" | "filename")
            || ["_path", "_dir", "_directory", "_file"].iter().any(|end| name.ends_with(end))
            || description.contains("working directory")
            || description.contains("inside the roots")
            || description.contains("session roots")
    }

    fn properties(tool: &Arc<dyn Tool>) -> serde_json::Map<String, Value> {
        let schema = &tool.definition().input_schema;
        schema.get("properties").and_then(Value::as_object).cloned().unwrap_or_default()
    }

    /// The arguments the facts name (paths, a command and its directory, a patch).
    fn declared_arguments(facts: &Facts) -> Vec<&'static str> {
        match facts.subject {
            Subject::Arguments => Vec::new(),
            Subject::Command { command, cwd } => vec![command, cwd],
            Subject::Paths(paths) => paths.iter().map(|path| path.name).collect(),
            Subject::Patch { patch } => vec![patch],
        }
    }

    #[test]
    fn every_path_argument_of_a_built_in_is_declared() {
        let mut missing = Vec::new();
        for tool in all() {
            let definition = tool.definition();
            let declared = declared_arguments(&definition.facts);
            for (name, property) in properties(&tool) {
                if path_like(&name, &property) && !declared.contains(&name.as_str()) {
                    missing.push(format!("{}.{name}", definition.name));
                }
            }
        }
        assert!(missing.is_empty(), "path arguments no facts declare: {missing:?}");
    }

    #[test]
    fn the_facts_of_a_built_in_name_its_own_arguments() {
        for tool in all() {
            let definition = tool.definition();
            let properties = properties(&tool);
            let facts = &definition.facts;
            for argument in declared_arguments(facts) {
                assert!(
                    properties.contains_key(argument),
                    "{}: the facts name `{argument}`, which its schema does not have",
                    definition.name
                );
            }
            if let Some(claude) = facts.claude_code.tool() {
                for (ours, theirs) in claude.fields {
                    assert!(properties.contains_key(*ours), "{}: no `{ours}`", definition.name);
                    assert!(
                        !properties.contains_key(*theirs),
                        "{}: Claude Code's `{theirs}` would be read back as another argument",
                        definition.name
                    );
                }
            }
        }
    }

    #[test]
    fn a_built_in_that_writes_files_declares_that_it_edits() {
        for tool in all() {
            let definition = tool.definition();
            let facts = &definition.facts;
            let writes = match facts.subject {
                Subject::Paths(paths) => paths.iter().any(|path| path.access == PathAccess::Write),
                Subject::Patch { .. } => true,
                Subject::Arguments | Subject::Command { .. } => false,
            };
            assert_eq!(
                facts.edits, writes,
                "{}: edits files exactly when it writes the paths it names",
                definition.name
            );
            if writes {
                assert_eq!(definition.safety, Safety::SideEffect, "{}", definition.name);
            }
            if facts.binds_access {
                assert!(
                    matches!(facts.subject, Subject::Paths(paths)
                        if paths.iter().all(|path| path.access != PathAccess::Search)),
                    "{}: only a tool that reads or writes the paths it names binds an access",
                    definition.name
                );
            }
        }
        let commands = all()
            .iter()
            .filter(|tool| tool.definition().facts.command_argument().is_some())
            .count();
        assert_eq!(commands, 1, "exactly one built-in runs shell commands");
    }

    #[test]
    fn every_built_in_says_what_claude_code_calls_it() {
        let mut names = Vec::new();
        for tool in all() {
            let definition = tool.definition();
            let claude = definition.facts.claude_code;
            assert_ne!(
                claude,
                ClaudeCode::Undeclared,
                "{}: declare Claude Code's counterpart, or that it has none",
                definition.name
            );
            if let Some(claude) = claude.tool() {
                for name in std::iter::once(claude.name).chain(claude.aliases.iter().copied()) {
                    assert!(!names.contains(&name), "{name} stands for two built-ins");
                    names.push(name);
                }
            }
        }
    }

    #[test]
    fn paths_named_follow_the_declared_arguments_and_defaults() {
        let facts = |name: &str| facts(name).copied().unwrap_or_default();
        let named = |tool: &str, args: Value| paths_named(&facts(tool), &args);
        assert_eq!(named("notebook_edit", json!({"path": "a.ipynb"})), ["a.ipynb"]);
        assert_eq!(named("read_file", json!({})), Vec::<String>::new());
        assert_eq!(named("find_files", json!({"pattern": "*"})), ["."]);
        let patch = "*** Begin Patch\n*** Add File: new.txt\n+x\n*** Update File: old.txt\n\
                     *** Move to: moved.txt\n@@\n-a\n+b\n*** End Patch\n";
        assert_eq!(
            named("apply_patch", json!({"patch": patch})),
            ["new.txt", "old.txt", "moved.txt"]
        );
        assert_eq!(
            named("run_command", json!({"command": "ls", "cwd": "x"})),
            Vec::<String>::new()
        );
        assert_eq!(facts("no_such_tool"), Facts::NONE);
    }
}
