//! apply_patch: one patch, many files, all changed or none.
//!
//! Takes Codex's patch format or unified diffs as git writes them ([`parse`]), applies
//! every hunk in memory with context matching that loosens in stages ([`hunks`]), and
//! only when every file of the patch is settled writes them all through a journal in
//! the state directory ([`journal`]): after a crash at any point the next start finds
//! either the old or the new state of the whole patch.
//!
//! Every path passes the same checks as a single-file edit: confinement to the roots
//! (each resolved beneath a root, symlinks included), the stale-file rule (an existing
//! file must have been read in this session and be unchanged since), and permission
//! rules, which see every path of the patch ([`paths_of`]). The files' per-path
//! locks are taken in one order for the whole patch, so it never interleaves with
//! another edit of any of its files.

pub mod hunks;
pub mod journal;
pub mod parse;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, OnceLock};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use similar::{ChangeTag, TextDiff};
use tokio_util::sync::CancellationToken;

use self::hunks::Stage;
use self::journal::{Action, Change, CommitError, Step};
use self::parse::FileOp;
use crate::tools::facts::{ClaudeCode, Subject};
use crate::tools::fs::{
    self, FileInfo, FileStamp, FsError, ParentDirs, ResolvedParent, Staleness, text,
};
use crate::tools::{
    Definition, Env, ErrorType, Facts, Safety, Tool, ToolContext, ToolResult, parse_args,
    schema_for,
};

/// The tool's name.
pub const NAME: &str = "apply_patch";

/// Cap on the diff returned in the result, in bytes.
const MAX_DIFF_BYTES: usize = 64 * 1024;

/// Lines of unchanged context around each change in the diff.
const DIFF_CONTEXT_LINES: usize = 3;

/// Most files one patch may touch: far beyond any real change, small enough that a
/// hostile patch cannot make the daemon open files without end.
const MAX_PATCH_FILES: usize = 1000;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The patch: Codex's format (`*** Begin Patch` … `*** End Patch`, with `*** Add
    /// File:`, `*** Delete File:`, `*** Update File:` and `*** Move to:` sections and
    /// `@@` hunks) or a unified diff as `git diff` or `git format-patch` writes it.
    patch: String,
    /// Check the patch and return the diff without changing any file. Default: false.
    #[serde(default)]
    dry_run: bool,
}

struct ApplyPatch {
    definition: Definition,
}

pub fn tool() -> Arc<dyn Tool> {
    static DESCRIPTION: &str = "Applies a patch to files inside the session roots, all \
        files or none. Accepts Codex's format (*** Begin Patch, *** Add File: path, *** \
        Delete File: path, *** Update File: path with optional *** Move to: path, @@ hunks \
        of ' ' context, '-' removed and '+' added lines, *** End Patch) and unified diffs \
        from git diff or git format-patch. Hunk context is matched exactly, else ignoring \
        trailing whitespace, else ignoring surrounding whitespace, else with typographic \
        punctuation normalised; the result says which. Every existing file the patch \
        changes must have been read with read_file in this session. Returns a unified \
        diff with per-file counts; a hunk that does not match fails with not_found and the \
        nearest lines. dry_run checks and returns the diff without writing.";
    static DEFINITION: LazyLock<Definition> = LazyLock::new(|| Definition {
        name: NAME.to_owned(),
        description: DESCRIPTION.to_owned(),
        input_schema: schema_for::<Args>(),
        safety: Safety::SideEffect,
        system: false,
        timeout: None,
        facts: Facts {
            subject: Subject::Patch { patch: "patch" },
            edits: true,
            binds_access: false,
            claude_code: ClaudeCode::NoCounterpart,
        },
    });
    Arc::new(ApplyPatch { definition: DEFINITION.clone() })
}

/// Every path a patch names (sources and destinations of moves included), as written:
/// what permission rules and confinement are matched against. Empty when the patch
/// cannot be read, and then the tool refuses it too (the same parser decides both).
pub fn paths_of(patch: &str) -> Vec<String> {
    let Ok(ops) = parse::parse(patch) else {
        return Vec::new();
    };
    let mut paths: Vec<String> = Vec::new();
    for path in ops.iter().flat_map(FileOp::paths) {
        if !paths.iter().any(|seen| seen == path) {
            paths.push(path.to_owned());
        }
    }
    paths
}

// ---------------------------------------------------------------------------------
// The journal's place.

static JOURNAL_DIR: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Sets the directory of patch journals (before the first patch; returns false when
/// it was already set). Without it, `$XDG_STATE_HOME/toolgate/patches` (or
/// `~/.local/state/toolgate/patches`).
pub fn set_journal_dir(dir: PathBuf) -> bool {
    JOURNAL_DIR.set(Some(dir)).is_ok()
}

/// The directory of patch journals, if the process has a state directory at all.
pub fn journal_dir() -> Option<&'static Path> {
    JOURNAL_DIR.get_or_init(default_journal_dir).as_deref()
}

fn default_journal_dir() -> Option<PathBuf> {
    let absolute =
        |name: &str| std::env::var_os(name).map(PathBuf::from).filter(|path| path.is_absolute());
    let state = absolute("XDG_STATE_HOME")
        .or_else(|| absolute("HOME").map(|home| home.join(".local").join("state")))?;
    Some(state.join("toolgate").join("patches"))
}

/// Finishes or undoes the patches a previous run left mid-way (a crash, kill -9, power
/// loss). Run at start-up, before any session can look at the files.
pub fn recover_journal() -> std::io::Result<journal::Recovery> {
    match journal_dir() {
        Some(dir) => {
            let report = journal::recover(dir)?;
            if report.rolled_forward + report.rolled_back > 0 {
                tracing::warn!(
                    rolled_forward = report.rolled_forward,
                    rolled_back = report.rolled_back,
                    "recovered patches interrupted by a crash"
                );
            }
            Ok(report)
        }
        None => Ok(journal::Recovery::default()),
    }
}

// ---------------------------------------------------------------------------------
// The tool.

#[async_trait::async_trait]
impl Tool for ApplyPatch {
    fn definition(&self) -> &Definition {
        &self.definition
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(res) => return res,
        };
        let ops = match parse::parse(&args.patch) {
            Ok(ops) => ops,
            Err(err) => {
                return ToolResult::failure(
                    ErrorType::InvalidArguments,
                    format!("the patch cannot be read: {err}"),
                )
                .with_meta("patch_line", err.line);
            }
        };
        let journal_dir = match journal_dir() {
            Some(dir) => dir.to_path_buf(),
            None if args.dry_run => PathBuf::new(),
            None => {
                return ToolResult::failure(
                    ErrorType::IoError,
                    "there is no state directory for the patch journal (set XDG_STATE_HOME or HOME)",
                );
            }
        };
        run(&ctx, ops, args.dry_run, &journal_dir).await.unwrap_or_else(ToolResult::from)
    }
}

/// Every distinct path of the operations, in patch order.
fn names_of(ops: &[FileOp]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for path in ops.iter().flat_map(FileOp::paths) {
        if !names.iter().any(|seen| seen == path) {
            names.push(path.to_owned());
        }
    }
    names
}

/// Applies parsed operations: resolves and locks every path, plans in memory, then
/// commits.
async fn run(
    ctx: &ToolContext,
    ops: Vec<FileOp>,
    dry_run: bool,
    journal_dir: &Path,
) -> Result<ToolResult, FsError> {
    let env = ctx.env.clone();
    let names = names_of(&ops);
    if names.len() > MAX_PATCH_FILES {
        return Ok(ToolResult::failure(
            ErrorType::InvalidArguments,
            format!("the patch names {} files; at most {MAX_PATCH_FILES} are allowed", names.len()),
        ));
    }
    // Paths whose directory does not exist yet can only be created; their directories
    // are made once the whole patch is known to apply (so a failing patch leaves none).
    let created: Vec<&str> = ops
        .iter()
        .flat_map(|op| match op {
            FileOp::Add { path, .. } => vec![path.as_str()],
            FileOp::Update { move_to: Some(dest), .. } => vec![dest.as_str()],
            _ => Vec::new(),
        })
        .collect();
    let created: Vec<String> = created.into_iter().map(str::to_owned).collect();
    let resolve_env = env.clone();
    let resolve_names = names.clone();
    let first = fs::blocking(move || {
        resolve_names
            .iter()
            .map(|name| match fs::resolve_for_write(&resolve_env, name, ParentDirs::MustExist) {
                Ok(target) => Ok(Some(target)),
                Err(FsError::NotFound(_)) if created.contains(name) => Ok(None),
                Err(err) => Err(err),
            })
            .collect::<Result<Vec<Option<ResolvedParent>>, FsError>>()
    })
    .await?;
    let missing_dirs = first.iter().any(Option::is_none);
    let targets: Vec<ResolvedParent> = if missing_dirs {
        // Check the whole patch before creating any directory.
        let plan_env = env.clone();
        let plan_ops = ops.clone();
        let plan_names = names.clone();
        let checked = fs::blocking(move || {
            let targets =
                Targets::new(&plan_names, first.into_iter().map(|t| t.map(Arc::new)).collect());
            plan(&plan_env, &plan_ops, &targets).map(|planned| planned.map(|_| ()))
        })
        .await?;
        if let Err(res) = checked {
            return Ok(*res);
        }
        if dry_run {
            // Nothing more to learn by creating directories: plan against what is
            // there (missing parents mean new files).
            return dry_run_missing(&env, ops, names).await;
        }
        let resolve_env = env.clone();
        let resolve_names = names.clone();
        fs::blocking(move || {
            resolve_names
                .iter()
                .map(|name| fs::resolve_for_write(&resolve_env, name, ParentDirs::Create))
                .collect::<Result<Vec<_>, _>>()
        })
        .await?
    } else {
        first.into_iter().flatten().collect()
    };
    let mut keys: Vec<PathBuf> = targets.iter().map(ResolvedParent::path).collect();
    keys.sort();
    keys.dedup();
    let mut locks = Vec::with_capacity(keys.len());
    for key in &keys {
        locks.push(fs::lock_path(key).await);
    }
    let cancel = ctx.cancel.clone();
    let journal_dir = journal_dir.to_path_buf();
    let targets = Targets::new(&names, targets.into_iter().map(|t| Some(Arc::new(t))).collect());
    fs::blocking(move || {
        let _locks = locks;
        settle(&env, &ops, &targets, dry_run, &cancel, &journal_dir, &mut |_| false)
    })
    .await
}

/// Plans the patch against resolved targets and, unless it is a dry run, commits it.
/// `crash_at` is the journal's crash simulation (tests only).
fn settle(
    env: &Env,
    ops: &[FileOp],
    targets: &Targets,
    dry_run: bool,
    cancel: &CancellationToken,
    journal_dir: &Path,
    crash_at: &mut dyn FnMut(Step) -> bool,
) -> Result<ToolResult, FsError> {
    let planned = match plan(env, ops, targets)? {
        Ok(planned) => planned,
        Err(res) => return Ok(*res),
    };
    if cancel.is_cancelled() {
        return Ok(ToolResult::failure(ErrorType::Canceled, "the call was canceled"));
    }
    if dry_run || planned.changes.is_empty() {
        return Ok(planned.result(dry_run));
    }
    planned.commit(env, journal_dir, crash_at)
}

/// A dry run of a patch that creates directories: planned against what exists.
async fn dry_run_missing(
    env: &Arc<Env>,
    ops: Vec<FileOp>,
    names: Vec<String>,
) -> Result<ToolResult, FsError> {
    let env = env.clone();
    fs::blocking(move || {
        let targets = names
            .iter()
            .map(|name| match fs::resolve_for_write(&env, name, ParentDirs::MustExist) {
                Ok(target) => Ok(Some(Arc::new(target))),
                Err(FsError::NotFound(_)) => Ok(None),
                Err(err) => Err(err),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let targets = Targets::new(&names, targets);
        Ok(match plan(&env, &ops, &targets)? {
            Ok(planned) => planned.result(true),
            Err(res) => *res,
        })
    })
    .await
}

/// The resolved target of each path named in the patch (`None`: its directory does
/// not exist yet, so it is a new file).
struct Targets {
    by_name: HashMap<String, Option<Arc<ResolvedParent>>>,
}

impl Targets {
    fn new(names: &[String], targets: Vec<Option<Arc<ResolvedParent>>>) -> Targets {
        Targets { by_name: names.iter().cloned().zip(targets).collect() }
    }

    fn get(&self, name: &str) -> Option<&Arc<ResolvedParent>> {
        self.by_name.get(name).and_then(Option::as_ref)
    }
}

/// One file as the patch goes through it.
struct Virtual {
    /// The path as the patch first named it.
    shown: String,
    target: Option<Arc<ResolvedParent>>,
    /// The file before the patch.
    original: Option<Original>,
    /// The text now (`None`: does not exist).
    current: Option<String>,
    encoding: text::TextEncoding,
    /// Set on a move's destination: the file it came from (its mode is kept).
    moved_from: Option<(String, Option<FileInfo>)>,
    /// Set on a move's source.
    moved_to: Option<String>,
}

struct Original {
    text: String,
    info: FileInfo,
}

/// How one hunk matched, for the result.
struct HunkReport {
    path: String,
    hunk: usize,
    stage: Stage,
    line: usize,
}

/// A patch settled in memory.
struct Planned {
    files: Vec<Virtual>,
    /// Indexes into `files` of those that change, in patch order.
    changes: Vec<usize>,
    hunks: Vec<HunkReport>,
}

/// Loads every file the patch touches (checking it is fresh and text), applies the
/// operations in order, and settles what changes. `Err` for I/O; `Ok(Err)` for a
/// patch that does not apply (nothing has been written).
fn plan(
    env: &Env,
    ops: &[FileOp],
    targets: &Targets,
) -> Result<Result<Planned, Box<ToolResult>>, FsError> {
    let mut files: Vec<Virtual> = Vec::new();
    let mut index: HashMap<PathBuf, usize> = HashMap::new();
    let mut hunk_reports = Vec::new();
    let refuse = |error_type: ErrorType, message: String, path: &str| {
        Ok(Err(Box::new(
            ToolResult::failure(error_type, message).with_meta("path", path.to_owned()),
        )))
    };
    for op in ops {
        for name in op.paths() {
            let key = match targets.get(name) {
                Some(target) => target.path(),
                None => env.cwd.join(name),
            };
            if index.contains_key(&key) {
                continue;
            }
            let loaded = match load(env, name, targets.get(name).cloned())? {
                Ok(file) => file,
                Err(res) => return Ok(Err(res)),
            };
            index.insert(key, files.len());
            files.push(loaded);
        }
        let slot = |name: &str| -> usize {
            let key = match targets.get(name) {
                Some(target) => target.path(),
                None => env.cwd.join(name),
            };
            index.get(&key).copied().unwrap_or(0)
        };
        match op {
            FileOp::Add { path, content } => {
                let file = &mut files[slot(path)];
                if file.current.is_some() {
                    return refuse(
                        ErrorType::InvalidArguments,
                        format!(
                            "{} already exists; change it with an update section instead of \
                             adding it",
                            fs::shorten(path)
                        ),
                        path,
                    );
                }
                file.current = Some(content.clone());
            }
            FileOp::Delete { path, hunks } => {
                let file = &mut files[slot(path)];
                let Some(current) = &file.current else {
                    return refuse(
                        ErrorType::NotFound,
                        format!("{} does not exist, so it cannot be deleted", fs::shorten(path)),
                        path,
                    );
                };
                if !hunks.is_empty() {
                    match hunks::apply(current, hunks) {
                        Ok((rest, applied)) if rest.trim().is_empty() => {
                            report_hunks(&mut hunk_reports, path, &applied);
                        }
                        Ok(_) => {
                            return refuse(
                                ErrorType::NotFound,
                                format!(
                                    "{} has content the patch's deletion does not list; read \
                                     it again and regenerate the patch",
                                    fs::shorten(path)
                                ),
                                path,
                            );
                        }
                        Err(mismatch) => {
                            return Ok(Err(Box::new(mismatch_result(path, current, &mismatch))));
                        }
                    }
                }
                file.current = None;
            }
            FileOp::Update { path, move_to, hunks } => {
                let src = slot(path);
                let Some(current) = files[src].current.clone() else {
                    return refuse(
                        ErrorType::NotFound,
                        format!("{} does not exist, so it cannot be updated", fs::shorten(path)),
                        path,
                    );
                };
                let updated = match hunks::apply(&current, hunks) {
                    Ok((updated, applied)) => {
                        report_hunks(&mut hunk_reports, path, &applied);
                        updated
                    }
                    Err(mismatch) => {
                        return Ok(Err(Box::new(mismatch_result(path, &current, &mismatch))));
                    }
                };
                match move_to {
                    Some(dest) if slot(dest) != src => {
                        let dst = slot(dest);
                        if files[dst].current.is_some() {
                            return refuse(
                                ErrorType::InvalidArguments,
                                format!(
                                    "{} already exists; the patch cannot move {} onto it",
                                    fs::shorten(dest),
                                    fs::shorten(path)
                                ),
                                dest,
                            );
                        }
                        let encoding = files[src].encoding;
                        let info = files[src].original.as_ref().map(|original| original.info);
                        files[src].current = None;
                        files[src].moved_to = Some(dest.clone());
                        let to = &mut files[dst];
                        to.current = Some(updated);
                        to.encoding = encoding;
                        to.moved_from = Some((path.clone(), info));
                    }
                    _ => files[src].current = Some(updated),
                }
            }
        }
    }
    let changes = files
        .iter()
        .enumerate()
        .filter(|(_, file)| match (&file.original, &file.current) {
            (Some(original), Some(current)) => original.text != *current,
            (None, None) => false,
            _ => true,
        })
        .map(|(idx, _)| idx)
        .collect();
    Ok(Ok(Planned { files, changes, hunks: hunk_reports }))
}

fn report_hunks(reports: &mut Vec<HunkReport>, path: &str, applied: &[hunks::Applied]) {
    for (idx, hunk) in applied.iter().enumerate() {
        reports.push(HunkReport {
            path: path.to_owned(),
            hunk: idx + 1,
            stage: hunk.stage,
            line: hunk.line,
        });
    }
}

/// Reads one file of the patch: it must be fresh (read in this session, unchanged
/// since) and text the patch can write back unchanged outside its hunks.
fn load(
    env: &Env,
    name: &str,
    target: Option<Arc<ResolvedParent>>,
) -> Result<Result<Virtual, Box<ToolResult>>, FsError> {
    let empty = |target| Virtual {
        shown: name.to_owned(),
        target,
        original: None,
        current: None,
        encoding: text::TextEncoding::Utf8,
        moved_from: None,
        moved_to: None,
    };
    let Some(resolved) = target else {
        return Ok(Ok(empty(None)));
    };
    let Some((file, info)) = fs::open_existing(&resolved, name)? else {
        return Ok(Ok(empty(Some(resolved))));
    };
    let key = resolved.path();
    let bytes = fs::read_capped(file, &info, env.max_read_bytes, name)?;
    let current = FileStamp::of(&info, &bytes);
    if let Some(message) = Staleness::check(&env.files, &key, &current).message(name) {
        return Ok(Err(Box::new(
            ToolResult::failure(ErrorType::StaleFile, message).with_meta("path", name.to_owned()),
        )));
    }
    let decoded = match text::decode(&bytes) {
        Ok(decoded) if !decoded.lossy => decoded,
        Ok(decoded) => {
            return Ok(Err(Box::new(
                ToolResult::failure(
                    ErrorType::BinaryFile,
                    format!(
                        "{} is not valid {}; apply_patch only changes files it can write back \
                         unchanged outside the patch",
                        fs::shorten(name),
                        decoded.encoding.as_str()
                    ),
                )
                .with_meta("path", name.to_owned()),
            )));
        }
        Err(not_text) => {
            return Ok(Err(Box::new(
                ToolResult::failure(
                    ErrorType::BinaryFile,
                    format!("{} cannot be patched as text: {not_text}", fs::shorten(name)),
                )
                .with_meta("path", name.to_owned()),
            )));
        }
    };
    let text = decoded.text.into_owned();
    Ok(Ok(Virtual {
        shown: name.to_owned(),
        target: Some(resolved),
        current: Some(text.clone()),
        original: Some(Original { text, info }),
        encoding: decoded.encoding,
        moved_from: None,
        moved_to: None,
    }))
}

/// `not_found` for a hunk that matches nowhere, with the nearest lines.
fn mismatch_result(path: &str, text: &str, mismatch: &hunks::Mismatch) -> ToolResult {
    let shown = fs::shorten(path);
    let number = mismatch.hunk + 1;
    let mut message = match &mismatch.anchor {
        Some(anchor) => format!(
            "hunk {number} of {shown} does not apply: its @@ line {anchor:?} is not in the file"
        ),
        None => format!(
            "hunk {number} of {shown} does not apply: its context and removed lines are not in \
             the file (compared exactly, ignoring whitespace, and with typographic punctuation \
             normalised)"
        ),
    };
    let wanted = mismatch.anchor.as_deref().unwrap_or(&mismatch.expected);
    let hint = super::edit_file::not_found_hint(text, wanted);
    if let Some(hint) = &hint {
        message.push_str(".\n");
        message.push_str(&hint.text);
    }
    message.push_str("\nNo file was changed.");
    let mut res = ToolResult::failure(ErrorType::NotFound, message)
        .with_meta("path", path.to_owned())
        .with_meta("hunk", number);
    if let Some(line) = hint.and_then(|hint| hint.line) {
        res = res.with_meta("closest_line", line);
    }
    res
}

/// Per-file line counts of a diff.
struct Counts {
    added: usize,
    removed: usize,
}

impl Planned {
    /// The result for the model: a summary, the stages of loosely matched hunks, and
    /// the unified diff.
    fn result(&self, dry_run: bool) -> ToolResult {
        let mut summary = String::new();
        let mut diff = String::new();
        let mut files_meta = Vec::new();
        let (mut total_added, mut total_removed) = (0, 0);
        for &idx in &self.changes {
            let file = &self.files[idx];
            if file.moved_to.is_some() && file.current.is_none() {
                // Shown with its destination.
                continue;
            }
            let before = match (&file.moved_from, &file.original) {
                (Some((from, _)), _) => self
                    .files
                    .iter()
                    .find(|other| other.shown == *from)
                    .and_then(|other| other.original.as_ref())
                    .map(|original| original.text.as_str()),
                (None, Some(original)) => Some(original.text.as_str()),
                (None, None) => None,
            };
            let after = file.current.as_deref();
            let (action, old_name, new_name) = match (&file.moved_from, before, after) {
                (Some((from, _)), _, _) => ("moved", from.as_str(), file.shown.as_str()),
                (None, None, Some(_)) => ("added", "/dev/null", file.shown.as_str()),
                (None, Some(_), None) => ("deleted", file.shown.as_str(), "/dev/null"),
                _ => ("modified", file.shown.as_str(), file.shown.as_str()),
            };
            let (file_diff, counts) =
                unified(old_name, new_name, before.unwrap_or(""), after.unwrap_or(""));
            total_added += counts.added;
            total_removed += counts.removed;
            let label = match action {
                "moved" => format!("{old_name} -> {new_name}"),
                _ => file.shown.clone(),
            };
            let letter = match action {
                "added" => 'A',
                "deleted" => 'D',
                "moved" => 'R',
                _ => 'M',
            };
            let _ = writeln!(summary, " {letter} {label} (+{} -{})", counts.added, counts.removed);
            let mut meta = json!({
                "path": file.shown,
                "action": action,
                "added": counts.added,
                "removed": counts.removed,
            });
            if let (Some((from, _)), Some(map)) = (&file.moved_from, meta.as_object_mut()) {
                map.insert("moved_from".to_owned(), Value::String(from.clone()));
            }
            files_meta.push(meta);
            diff.push_str(&file_diff);
        }
        let changed = files_meta.len();
        let noun = if changed == 1 { "file" } else { "files" };
        let verb = if dry_run { "would change" } else { "changed" };
        let mut content =
            format!("{verb} {changed} {noun} (+{total_added} -{total_removed})\n{summary}");
        let loose: Vec<&HunkReport> =
            self.hunks.iter().filter(|hunk| hunk.stage != Stage::Exact).collect();
        if !loose.is_empty() {
            content.push_str("hunks matched loosely:\n");
            for hunk in &loose {
                let _ = writeln!(
                    content,
                    " {} hunk {} at line {}: {}",
                    hunk.path,
                    hunk.hunk,
                    hunk.line,
                    hunk.stage.as_str()
                );
            }
        }
        if diff.len() > MAX_DIFF_BYTES {
            let mut end = MAX_DIFF_BYTES;
            while !diff.is_char_boundary(end) {
                end -= 1;
            }
            let left_out = diff.len() - end;
            diff.truncate(end);
            let _ = write!(diff, "\n… [diff cut: {left_out} more bytes]");
        }
        content.push_str(&diff);
        let hunks_meta: Vec<Value> = self
            .hunks
            .iter()
            .map(|hunk| {
                json!({"path": hunk.path, "hunk": hunk.hunk, "line": hunk.line, "stage": hunk.stage.as_str()})
            })
            .collect();
        let mut res = ToolResult::success(content)
            .with_meta("files", Value::Array(files_meta))
            .with_meta("hunks", Value::Array(hunks_meta))
            .with_meta("added", total_added)
            .with_meta("removed", total_removed);
        if dry_run {
            res = res.with_meta("dry_run", true);
        }
        res
    }

    /// Writes every change through the journal and records what the session now knows.
    fn commit(
        &self,
        env: &Env,
        journal_dir: &Path,
        crash_at: &mut dyn FnMut(Step) -> bool,
    ) -> Result<ToolResult, FsError> {
        let mut changes = Vec::with_capacity(self.changes.len());
        let mut keys = Vec::with_capacity(self.changes.len());
        for &idx in &self.changes {
            let file = &self.files[idx];
            let Some(target) = &file.target else {
                return Err(FsError::Io {
                    path: file.shown.clone(),
                    source: std::io::Error::other("the file's directory was not created"),
                });
            };
            let action = match &file.current {
                Some(current) => {
                    let info = match (&file.original, &file.moved_from) {
                        (Some(original), _) => Some(original.info),
                        (None, Some((_, info))) => *info,
                        (None, None) => None,
                    };
                    Action::Write {
                        bytes: text::encode(current, file.encoding),
                        mode: info.map(|info| info.mode & 0o777),
                        owner: info.map(|info| (info.uid, info.gid)),
                    }
                }
                None => Action::Delete,
            };
            keys.push(target.path());
            changes.push(Change {
                dir: target.dir.as_fd(),
                dir_path: target.dir_path.clone(),
                name: target.name.clone(),
                action,
            });
        }
        let stamps = match journal::commit(journal_dir, &changes, crash_at) {
            Ok(stamps) => stamps,
            Err(CommitError::NotApplied(err)) => {
                return Err(FsError::Io {
                    path: "the patch".to_owned(),
                    source: std::io::Error::new(err.kind(), format!("{err}; no file was changed")),
                });
            }
            Err(err) => {
                return Err(FsError::Io {
                    path: "the patch".to_owned(),
                    source: std::io::Error::other(err.to_string()),
                });
            }
        };
        for (key, stamp) in keys.into_iter().zip(stamps) {
            match stamp {
                Some(stamp) => env.files.record(key, stamp),
                None => env.files.forget(&key),
            }
        }
        Ok(self.result(false))
    }
}

/// A unified diff of one file (LF endings) and its counts.
fn unified(old_name: &str, new_name: &str, before: &str, after: &str) -> (String, Counts) {
    let before = text::to_lf(before);
    let after = text::to_lf(after);
    let diff = TextDiff::configure()
        .timeout(std::time::Duration::from_millis(500))
        .diff_lines(&*before, &*after);
    let mut counts = Counts { added: 0, removed: 0 };
    for change in diff.iter_all_changes() {
        match change.tag() {
            ChangeTag::Insert => counts.added += 1,
            ChangeTag::Delete => counts.removed += 1,
            ChangeTag::Equal => {}
        }
    }
    let old_header =
        if old_name == "/dev/null" { old_name.to_owned() } else { format!("a/{old_name}") };
    let new_header =
        if new_name == "/dev/null" { new_name.to_owned() } else { format!("b/{new_name}") };
    let text = diff
        .unified_diff()
        .context_radius(DIFF_CONTEXT_LINES)
        .header(&old_header, &new_header)
        .to_string();
    (text, counts)
}

#[cfg(test)]
mod tests;
