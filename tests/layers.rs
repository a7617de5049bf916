//! The layer map of ARCHITECTURE.md, kept true: a module only reaches downwards, the
//! modules of the tool layer (its root, `tools/mod.rs`, among them) form no import
//! cycle, and no function of the execution layer grows past a screenful or two.
//!
//! The check reads the sources: every `crate::<module>` path outside test code names
//! a dependency. Test code (from a file's first `#[cfg(test)]` on, and `*tests.rs`
//! files) may reach anywhere.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, bottom first. A module may use modules of lower layers only (and
/// itself). Keep in step with the layer map in ARCHITECTURE.md.
const LAYERS: &[(&str, usize)] = &[
    // The crate's only `unsafe` code, reaching nothing else.
    ("sys", 0),
    // The wire types every layer shares, reaching nothing else: the client-only build
    // compiles them with `protocol` and the typed client.
    ("wire", 0),
    // Containment and the kernel sandbox around every process a tool starts, and the
    // daemon's own hardening: below the tools that start processes.
    ("sandbox", 1),
    // Running a command under a supervisor that holds its whole process tree: the
    // daemon side, the supervisor side, the spawner and the launch. Knows nothing of
    // tools, policy, sessions or faces.
    ("exec", 2),
    // The tool contract, the registry and the tools.
    ("tools", 3),
    // Pure policy (and the typed decision about a call) and leaf services.
    ("permission", 4),
    ("systemd", 4),
    // Who may connect: admission pools and deadlines, bearer tokens. Below the faces,
    // which all authenticate through them.
    ("admission", 4),
    ("auth", 5),
    // Hook matchers read the permission layer's alias table.
    ("hooks", 5),
    ("audit", 5),
    ("config", 6),
    // toolgate's own files, which no tool may open.
    ("own_files", 7),
    // Tools that come and go.
    ("upstream", 7),
    ("skills", 8),
    // One model turn.
    ("agent", 8),
    // Sessions, the client API every face calls, typed events: no wire format.
    ("daemon", 9),
    // The native protocol's wire types, converted from and to the daemon's own.
    ("protocol", 10),
    // The faces: framing plus calls to the daemon's client API. The MCP face reuses
    // the native face's line framing.
    ("rpc", 11),
    ("mcp", 12),
    // Start-up and the human's client.
    ("server", 13),
    ("cli", 14),
];

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The file's code without test code and without comments.
fn code_of(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    if name.ends_with("tests.rs") {
        return None;
    }
    let text = std::fs::read_to_string(path).unwrap();
    let text = match text.find("#[cfg(test)]") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    let code: Vec<&str> = text
        .lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect();
    Some(code.join("\n"))
}

/// The module path of a source file (`tools/fs/text.rs` → `["tools", "fs", "text"]`).
fn module_of(path: &Path) -> Vec<String> {
    let relative = path.strip_prefix(src()).unwrap();
    let mut parts: Vec<String> =
        relative.iter().map(|part| part.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts
}

/// Every `crate::<name>` the code mentions.
fn crate_modules(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String =
            rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if !name.is_empty() {
            found.insert(name);
        }
    }
    found
}

#[test]
fn no_module_imports_a_layer_above_it() {
    let layers: BTreeMap<&str, usize> = LAYERS.iter().copied().collect();
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut violations = Vec::new();
    for file in files {
        let module = module_of(&file);
        let Some(top) = module.first() else { continue };
        if top == "main" || top.ends_with("tests") {
            continue;
        }
        let Some(&rank) = layers.get(top.as_str()) else {
            violations.push(format!("{top} is missing from the layer map"));
            continue;
        };
        let Some(code) = code_of(&file) else { continue };
        for used in crate_modules(&code) {
            if used == *top {
                continue;
            }
            match layers.get(used.as_str()) {
                Some(&used_rank) if used_rank < rank => {}
                Some(&used_rank) => violations.push(format!(
                    "{} (layer {rank}) uses crate::{used} (layer {used_rank})",
                    file.display()
                )),
                None => violations.push(format!(
                    "{} uses crate::{used}, which the layer map does not know",
                    file.display()
                )),
            }
        }
    }
    assert!(violations.is_empty(), "upward imports:\n{}", violations.join("\n"));
}

/// Flattens the `use` trees and paths of some code into `::`-separated paths that
/// start with `crate::`, `super::` or `self::`.
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // `use` statements, possibly over several lines, with brace groups.
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().last();
        rest = &rest[at + 4..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let Some(end) = rest.find(';') else { break };
        let tree = rest[..end].replace(" as ", " ").replace(" as\n", " ");
        let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
        let is_tree = tree.chars().all(|c| c.is_ascii_alphanumeric() || "_:{},*".contains(c));
        if is_tree {
            expand(&tree, &mut Vec::new(), &mut out);
        }
    }
    // Paths written inline (`super::builtin::all()`).
    for prefix in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(at) = rest.find(prefix) {
            let before = rest[..at].chars().last();
            let path: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            rest = &rest[at + prefix.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            out.push(path.split("::").filter(|s| !s.is_empty()).map(str::to_owned).collect());
        }
    }
    out
}

/// Expands one use tree (`a::{b, c::{d, e}}`) into its paths.
fn expand(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Some(open) = tree.find('{') {
        let head: Vec<String> =
            tree[..open].split("::").filter(|s| !s.is_empty()).map(str::to_owned).collect();
        let close = tree.rfind('}').filter(|close| *close > open).unwrap_or(tree.len());
        let inner = &tree[open + 1..close];
        let depth = prefix.len();
        prefix.extend(head);
        // Split the inner list at top-level commas.
        let mut level = 0;
        let mut start = 0;
        for (index, c) in inner.char_indices() {
            match c {
                '{' => level += 1,
                '}' => level -= 1,
                ',' if level == 0 => {
                    expand(&inner[start..index], prefix, out);
                    start = index + 1;
                }
                _ => {}
            }
        }
        expand(&inner[start..], prefix, out);
        prefix.truncate(depth);
        return;
    }
    let mut path = prefix.clone();
    path.extend(tree.split("::").filter(|s| !s.is_empty()).map(str::to_owned));
    if !path.is_empty() {
        out.push(path);
    }
}

#[test]
fn the_tool_layer_has_no_import_cycles() {
    let mut files = Vec::new();
    rust_files(&src().join("tools"), &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|file| module_of(file)).collect();
    let root = vec!["tools".to_owned()];
    // What the tools root re-exports, by name: `pub use registry::{Registry, ..}`.
    // (Re-exports from outside the tool layer, `pub use crate::exec::..`, lead out of
    // it.) The root's own code, for its edges, is what is left without them.
    let mut reexports: BTreeMap<String, Option<Vec<String>>> = BTreeMap::new();
    let root_code = code_of(&src().join("tools/mod.rs")).unwrap();
    let mut root_own_code = String::new();
    let mut rest = root_code.as_str();
    while let Some(at) = rest.find("pub use ") {
        let Some(end) = rest[at..].find(';').map(|end| at + end) else { break };
        root_own_code.push_str(&rest[..at]);
        let tree: String =
            rest[at + "pub use ".len()..end].chars().filter(|c| !c.is_whitespace()).collect();
        rest = &rest[end + 1..];
        let mut paths = Vec::new();
        expand(&tree, &mut Vec::new(), &mut paths);
        for path in paths {
            if let (Some(first), Some(name)) = (path.first(), path.last()) {
                let mut module = root.clone();
                module.push(first.clone());
                let inside = modules.contains(&module);
                reexports.insert(name.clone(), inside.then_some(module));
            }
        }
    }
    root_own_code.push_str(rest);
    // The module a path leads to: the longest known module on the way, through the
    // root's re-exports. An item the root defines itself (`Env`, `ToolResult`) leads
    // to the root, which is a node like any other.
    let resolve = |from: &[String], path: &[String]| -> Option<Vec<String>> {
        let mut at: Vec<String> = from.to_vec();
        let mut segments = path.iter().peekable();
        match segments.peek().map(|s| s.as_str()) {
            Some("crate") => {
                segments.next();
                at.clear();
            }
            Some("super") => {
                while segments.peek().map(|s| s.as_str()) == Some("super") {
                    segments.next();
                    at.pop();
                }
            }
            Some("self") => {
                segments.next();
            }
            _ => return None,
        }
        for segment in segments {
            let mut next = at.clone();
            next.push(segment.clone());
            if modules.contains(&next) {
                at = next;
            } else if at == root {
                return reexports.get(segment).cloned().unwrap_or_else(|| Some(root.clone()));
            } else {
                break;
            }
        }
        (at.starts_with(&root) && at != root).then_some(at)
    };
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in &files {
        let module = module_of(file);
        let Some(code) = code_of(file) else { continue };
        if module == root {
            root_edges(
                &root_own_code,
                &modules,
                &reexports,
                &resolve,
                edges.entry(root.clone()).or_default(),
            );
            continue;
        }
        let targets = edges.entry(module.clone()).or_default();
        for path in paths(&code) {
            // A module's ancestors below the root re-export it; the root's own items
            // are what every module shares, and the root must not depend on them.
            if let Some(target) = resolve(&module, &path)
                && target != module
                && (target == root || !module.starts_with(&target))
            {
                targets.insert(target);
            }
        }
        // A module's own children, named bare (`run_command::tool()`).
        for child in modules.iter().filter(|m| m.len() == module.len() + 1) {
            if child.starts_with(&module) && code.contains(&format!("{}::", child[child.len() - 1]))
            {
                targets.insert(child.clone());
            }
        }
    }
    // Depth-first search for a cycle.
    fn visit(
        node: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        stack: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle: Vec<String> = stack[at..].iter().map(|n| n.join("::")).collect();
            cycle.push(node.join("::"));
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        if let Some(cycle) = visit(node, &edges, &mut Vec::new(), &mut done) {
            panic!("import cycle in src/tools: {}", cycle.join(" -> "));
        }
    }
    // The checker sees the edges it must: the registry lists the built-ins, the file
    // functions take the session's Env, which holds the session's file record.
    let registry = vec!["tools".to_owned(), "registry".to_owned()];
    let builtin = vec!["tools".to_owned(), "builtin".to_owned()];
    assert!(edges.get(&registry).is_some_and(|targets| targets.contains(&builtin)), "{edges:?}");
    let fs = vec!["tools".to_owned(), "fs".to_owned()];
    assert!(edges.get(&fs).is_some_and(|targets| targets.contains(&root)), "{edges:?}");
    assert!(
        edges.get(&root).is_some_and(|targets| targets.iter().any(|t| t.starts_with(&fs))),
        "{edges:?}"
    );
}

/// Where a path from a module leads (see `the_tool_layer_has_no_import_cycles`).
type Resolve<'a> = dyn Fn(&[String], &[String]) -> Option<Vec<String>> + 'a;

/// The edges of the tool layer's root: paths into its child modules (named bare,
/// `fs::access::Access`, or from `crate::`/`self::`), and the names it re-exports
/// used in its own code. Module declarations and the re-exports themselves are not
/// dependencies.
fn root_edges(
    code: &str,
    modules: &BTreeSet<Vec<String>>,
    reexports: &BTreeMap<String, Option<Vec<String>>>,
    resolve: &Resolve<'_>,
    targets: &mut BTreeSet<Vec<String>>,
) {
    let root = vec!["tools".to_owned()];
    let mut found = paths(code);
    for child in modules.iter().filter(|m| m.len() == 2) {
        let prefix = format!("{}::", child[1]);
        let mut rest = code;
        while let Some(at) = rest.find(&prefix) {
            let before = rest[..at].chars().last();
            let path: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            rest = &rest[at + prefix.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let mut path: Vec<String> =
                path.split("::").filter(|s| !s.is_empty()).map(str::to_owned).collect();
            path.insert(0, "self".to_owned());
            found.push(path);
        }
    }
    for path in found {
        if let Some(target) = resolve(&root, &path)
            && target != root
        {
            targets.insert(target);
        }
    }
    for (name, module) in reexports {
        if let Some(module) = module
            && code.lines().any(|line| has_word(line, name))
        {
            targets.insert(module.clone());
        }
    }
}

/// Whether `word` stands alone in `line` (not inside a longer identifier).
fn has_word(line: &str, word: &str) -> bool {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    line.match_indices(word).any(|(at, _)| {
        let before = line[..at].chars().last();
        let after = line[at + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

#[test]
fn unsafe_code_lives_in_sys_alone() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut found = Vec::new();
    for file in files {
        if module_of(&file) == ["sys"] {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if has_word(code, "unsafe") {
                found.push(format!("{}:{}: {}", file.display(), number + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "`unsafe` outside src/sys.rs:\n{}", found.join("\n"));
    let sys = std::fs::read_to_string(src().join("sys.rs")).unwrap();
    let blocks = sys.matches("unsafe {").count();
    let reasons = sys.matches("// SAFETY:").count();
    assert!(blocks > 0 && blocks == reasons, "{blocks} unsafe blocks, {reasons} SAFETY comments");
}

/// The longest a function of `src/exec/` may be, in lines from its `fn` to its closing
/// brace.
const MAX_EXEC_FUNCTION_LINES: usize = 120;

/// The functions of some formatted Rust code with their lengths in lines, from the
/// `fn` line to the brace that closes the body (at the `fn`'s indentation, as rustfmt
/// puts it). Declarations without a body are left out.
fn function_lengths(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let trimmed = code.trim_start();
        let indent = &code[..code.len() - trimmed.len()];
        let Some(at) = trimmed.find("fn ") else { continue };
        let qualifiers = &trimmed[..at];
        let is_item = qualifiers.split_whitespace().all(|word| {
            matches!(word, "pub" | "const" | "async" | "unsafe" | "extern")
                || word.starts_with("pub(")
        });
        if !is_item {
            continue;
        }
        let name: String =
            trimmed[at + 3..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let closing = format!("{indent}}}");
        let mut end = None;
        for (index, next) in lines.iter().enumerate().skip(start) {
            let next_code = next.split("//").next().unwrap_or("").trim_end();
            if index == start && next_code.ends_with('}') && next_code.contains('{') {
                end = Some(index);
                break;
            }
            if next_code.ends_with(';') && !lines[start..index].iter().any(|l| l.contains('{')) {
                break; // a declaration
            }
            if index > start && *next == closing {
                end = Some(index);
                break;
            }
        }
        if let Some(end) = end {
            found.push((name, start + 1, end - start + 1));
        }
    }
    found
}

#[test]
fn no_function_of_exec_is_longer_than_the_limit() {
    let mut files = Vec::new();
    rust_files(&src().join("exec"), &mut files);
    assert!(!files.is_empty());
    let mut counted = 0;
    let mut long = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (name, line, length) in function_lengths(&text) {
            counted += 1;
            if length > MAX_EXEC_FUNCTION_LINES {
                long.push(format!("{}:{line}: {name} is {length} lines", file.display()));
            }
        }
    }
    // The counter sees the functions it must.
    assert!(counted > 100, "only {counted} functions found in src/exec");
    assert!(
        long.is_empty(),
        "functions longer than {MAX_EXEC_FUNCTION_LINES} lines in src/exec:\n{}",
        long.join("\n")
    );
}

#[test]
fn function_lengths_are_counted_from_fn_to_closing_brace() {
    let text = "pub async fn one(\n    a: u8,\n) -> u8 {\n    a\n}\n\nfn two() {}\n\n\
                trait T {\n    fn declared(&self);\n    fn body(&self) {\n        let _ = 1;\n    }\n}\n";
    let lengths = function_lengths(text);
    assert_eq!(
        lengths,
        vec![("one".to_owned(), 1, 5), ("two".to_owned(), 7, 1), ("body".to_owned(), 11, 3)]
    );
}
