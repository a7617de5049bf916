//! `find_files`: lists the files under a directory whose path matches a glob.
//!
//! The walk is the parallel walk by directory descriptors of [`crate::tools::walk`]
//! (ignore files respected, hidden entries opt-in, symlinks listed but not followed,
//! entries the session may not see left out and counted). Results are paths relative to the search root in path order, the same on
//! every run whatever order the walker threads saw them in, and capped at `limit` with
//! an exact total.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::tools::facts::{ClaudeCode, ClaudeTool, PathAccess, PathArgument, Subject};
use crate::tools::fs;
use crate::tools::walk::{self, PathGlob, PathKey, Prefix, Tree, Visit, WalkOptions};
use crate::tools::{
    Definition, ErrorType, Facts, Safety, Tool, ToolContext, ToolResult, parse_args, schema_for,
};

/// Paths returned when the call does not say: enough to survey a project, small
/// enough (tens of kilobytes) not to crowd a model's context.
const DEFAULT_LIMIT: usize = 1000;
/// The most paths one call may ask for; beyond this a listing is no longer something
/// a model can read, and the kept paths would cost real memory.
const MAX_LIMIT: usize = 100_000;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct FindFilesArgs {
    /// Glob to match. Without `/` it matches the file name at any depth (`*.rs`,
    /// `Cargo.toml`); with `/` it matches the path relative to the search directory
    /// (`src/**/*.rs`). `*` does not cross `/`, `**` does, `{a,b}` is alternation.
    #[schemars(length(min = 1))]
    pattern: String,
    /// Directory to search, relative to the working directory (default: the working
    /// directory). Must be inside the session roots.
    #[serde(default)]
    path: Option<String>,
    /// Maximum number of paths returned (default 1000, at most 100000).
    #[serde(default)]
    #[schemars(range(min = 1, max = 100_000))]
    limit: Option<usize>,
    /// Include hidden files and directories (names starting with a dot).
    #[serde(default)]
    hidden: bool,
    /// Do not apply .gitignore / .ignore rules.
    #[serde(default)]
    no_ignore: bool,
}

struct FindFiles {
    definition: Definition,
}

pub fn tool() -> Arc<dyn Tool> {
    Arc::new(FindFiles {
        definition: Definition {
            name: "find_files".to_owned(),
            description: "Find files by glob pattern. Returns matching paths relative to the \
                          search directory, one per line, sorted. Respects .gitignore and \
                          .ignore files and skips hidden files unless asked; symlinks are \
                          listed but not followed."
                .to_owned(),
            input_schema: schema_for::<FindFilesArgs>(),
            safety: Safety::ReadOnly,
            system: false,
            timeout: None,
            facts: Facts {
                subject: Subject::Paths(&[PathArgument {
                    name: "path",
                    default: Some("."),
                    access: PathAccess::Search,
                }]),
                edits: false,
                binds_access: false,
                claude_code: ClaudeCode::Tool(ClaudeTool {
                    name: "Glob",
                    aliases: &[],
                    fields: &[],
                }),
            },
        },
    })
}

#[async_trait::async_trait]
impl Tool for FindFiles {
    fn definition(&self) -> &Definition {
        &self.definition
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let args: FindFilesArgs = match parse_args(args) {
            Ok(args) => args,
            Err(res) => return res,
        };
        let start = match fs::open_dir(&ctx.env, args.path.as_deref()) {
            Ok(start) => start,
            Err(err) => return err.into(),
        };
        let glob = match PathGlob::new(&args.pattern) {
            Ok(glob) => glob,
            Err(err) => {
                return ToolResult::failure(
                    ErrorType::InvalidArguments,
                    format!("invalid glob {:?}: {}", args.pattern, err.kind()),
                );
            }
        };
        let options = WalkOptions { hidden: args.hidden, no_ignore: args.no_ignore };
        let query = Query {
            tree: Tree::new(&ctx.env, start, options),
            glob,
            limit: args.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT),
        };

        // Raised when the call is canceled or times out, and when this future is
        // dropped: either way the blocking walk below stops at its next entry.
        let cancel = walk::CancelFlag::watch(&ctx.cancel);
        let flag = cancel.shared();
        let found = match tokio::task::spawn_blocking(move || find(&query, &flag)).await {
            Ok(Some(found)) => found,
            Ok(None) => return ToolResult::failure(ErrorType::Canceled, "the call was canceled"),
            Err(err) => {
                tracing::error!(%err, "find_files walk failed");
                return ToolResult::failure(ErrorType::InternalError, "the file walk failed");
            }
        };
        render(found, ctx.env.max_output_bytes)
    }
}

/// One validated find request.
struct Query {
    /// The directory, opened beneath the roots.
    tree: Tree,
    glob: PathGlob,
    limit: usize,
}

/// What a walk found.
struct Found {
    /// The first `limit` matches in path order.
    paths: Vec<PathKey>,
    /// Every match in the tree.
    total: u64,
    /// Entries the walker could not read (permissions, vanished files).
    unreadable: u64,
    /// Entries left out because the session may not see them.
    withheld: u64,
}

/// One walker thread's findings.
struct ThreadFindings {
    kept: Prefix<()>,
    total: u64,
    unreadable: u64,
    withheld: u64,
}

/// Walks the tree; `None` when the walk was canceled.
fn find(query: &Query, cancel: &AtomicBool) -> Option<Found> {
    let states = walk::walk(
        &query.tree,
        cancel,
        || ThreadFindings { kept: Prefix::new(query.limit), total: 0, unreadable: 0, withheld: 0 },
        |state, visit| match visit {
            Visit::Unreadable => state.unreadable += 1,
            Visit::Withheld => state.withheld += 1,
            Visit::Entry(entry) => {
                if !query.glob.is_match(entry.relative) {
                    return;
                }
                state.total += 1;
                if state.kept.wants(entry.relative) {
                    state.kept.insert(PathKey::new(entry.relative), (), 1);
                }
            }
        },
    );
    if cancel.load(Ordering::Relaxed) {
        return None;
    }
    let total = states.iter().map(|state| state.total).sum();
    let unreadable = states.iter().map(|state| state.unreadable).sum();
    let withheld = states.iter().map(|state| state.withheld).sum();
    let kept = Prefix::merge_all(states.into_iter().map(|state| state.kept), query.limit);
    let paths = kept.into_sorted().map(|(path, ())| path).collect();
    Some(Found { paths, total, unreadable, withheld })
}

/// The text rendering: one path per line, then a marker when the list was cut (by
/// `limit` or by the session's output byte cap).
fn render(found: Found, max_output_bytes: usize) -> ToolResult {
    let mut content = String::new();
    let mut count: u64 = 0;
    for path in &found.paths {
        let before = content.len();
        path.push_to(&mut content);
        content.push('\n');
        if content.len() > max_output_bytes {
            content.truncate(before);
            break;
        }
        count += 1;
    }
    let truncated = count < found.total;
    if found.total == 0 {
        content.push_str("No files found.\n");
    } else if truncated {
        content.push_str(&format!(
            "[truncated: {count} of {} paths shown; narrow the pattern or path]\n",
            found.total
        ));
    }
    let mut res = ToolResult::success(content)
        .with_meta("count", count)
        .with_meta("total", found.total)
        .with_meta("truncated", truncated);
    if found.unreadable > 0 {
        res = res.with_meta("unreadable", found.unreadable);
    }
    if found.withheld > 0 {
        res.content.push_str(&format!(
            "[{} entries left out: toolgate's own files or files the read rules deny or ask \
             about]\n",
            found.withheld
        ));
        res = res.with_meta("withheld", found.withheld);
    }
    res
}
