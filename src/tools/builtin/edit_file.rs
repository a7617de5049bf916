//! edit_file: replaces an exact piece of a file the model has read, and shows the
//! change as a diff.
//!
//! The model names the change by content (`old_string` → `new_string`), not by line
//! numbers that go stale after every edit. That only works when the match is exact
//! and unambiguous, so zero matches and several matches are errors that tell the
//! model how to fix its call: the nearest similar lines for `not_found`, the count and
//! lines for `not_unique`. The file keeps its encoding (UTF-8, UTF-8 with BOM, UTF-16
//! with BOM) and its line endings: in a CRLF file, `old_string`/`new_string` written
//! with `\n` match and are written with `\r\n`. The whole read-modify-write runs under
//! the per-path lock, so concurrent edits of one file (from any session) all land.
//!
//! An edit never makes a file larger than the read limit (`[limits] max_read_bytes`):
//! each edit's result size is computed from its match count before the text is built,
//! and one that would pass the limit is refused (`too_large`), so a few `replace_all`
//! edits that each double the text cost no more memory than the limit. The call's
//! cancellation is looked at between edits and every few thousand matches, so an edit
//! whose call timed out or was canceled stops and frees the file's lock.

use std::fmt::Write as _;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use similar::TextDiff;
use tokio_util::sync::CancellationToken;

use crate::tools::facts::{ClaudeCode, ClaudeTool, PathAccess, PathArgument, Subject};
use crate::tools::fs::{self, FileStamp, FsError, ParentDirs, ResolvedParent, Staleness, text};
use crate::tools::{
    Definition, Env, ErrorType, Facts, Safety, Tool, ToolContext, ToolResult, parse_args,
    schema_for,
};

/// Cap on the diff returned in the result, in bytes: enough for any ordinary edit,
/// while a `replace_all` over a big file does not flood the model's context.
const MAX_DIFF_BYTES: usize = 16 * 1024;

/// Matches gone through between two looks at the call's cancellation.
const CANCEL_CHECK_MATCHES: usize = 4096;

/// Lines of unchanged context around each change in the diff, as `diff -u`.
const DIFF_CONTEXT_LINES: usize = 3;

/// How long computing the diff may take before `similar` settles for a coarser (still
/// correct) diff; the edit itself is already written by then.
const DIFF_TIMEOUT: Duration = Duration::from_millis(500);

/// How many match lines a `not_unique` error lists.
const MAX_LISTED_MATCHES: usize = 10;

/// File lines scanned for a `not_found` hint; the hint is a courtesy and must stay
/// cheap on huge files.
const MAX_HINT_SCAN_LINES: usize = 100_000;

/// Lines whose similarity is computed exactly (a character diff each), chosen by a
/// cheap upper bound; keeps a hint on a file of near-identical lines to a few
/// milliseconds while real near-misses, which have the highest bounds, are kept.
const MAX_HINT_DIFFED_LINES: usize = 2000;

/// Buckets of a line's character profile; enough to tell typical code lines apart.
const PROFILE_BUCKETS: usize = 64;

/// Characters of a line compared when looking for similar lines.
const MAX_HINT_LINE_CHARS: usize = 400;

/// Similarity (0..1) a line needs to be offered as "closest": below it, the lines
/// share little more than indentation and punctuation.
const HINT_MIN_SIMILARITY: f32 = 0.6;

/// Closest regions offered in a `not_found` hint.
const MAX_HINT_REGIONS: usize = 3;

/// Lines shown per region in a hint, and characters per shown line.
const MAX_HINT_REGION_LINES: usize = 12;
const MAX_HINT_SHOWN_CHARS: usize = 200;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The file to edit, relative to the working directory or absolute (inside the roots).
    path: String,
    /// The exact text to replace, indentation included; empty only for a missing or empty
    /// file. Give either old_string and new_string, or edits.
    old_string: Option<String>,
    /// The replacement text; must differ from old_string.
    new_string: Option<String>,
    /// Replace every occurrence instead of requiring exactly one. Default: false.
    #[serde(default)]
    replace_all: bool,
    /// Several edits of this file, applied in order (each to the result of the ones
    /// before); all are made or none.
    edits: Option<Vec<EditSpec>>,
    /// Return the diff without changing the file. Default: false.
    #[serde(default)]
    dry_run: bool,
}

/// One replacement of a multi-edit.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct EditSpec {
    /// The exact text to replace, indentation included.
    old_string: String,
    /// The replacement text; must differ from old_string.
    new_string: String,
    /// Replace every occurrence instead of requiring exactly one. Default: false.
    #[serde(default)]
    replace_all: bool,
}

impl Args {
    /// The edits asked for, in order: the single-edit form or the list.
    fn edits(&self) -> Result<Vec<EditSpec>, ToolResult> {
        let invalid = |message: &str| ToolResult::failure(ErrorType::InvalidArguments, message);
        let edits = match (&self.old_string, &self.new_string, &self.edits) {
            (Some(old), Some(new), None) => vec![EditSpec {
                old_string: old.clone(),
                new_string: new.clone(),
                replace_all: self.replace_all,
            }],
            (None, None, Some(edits)) if !edits.is_empty() => edits.clone(),
            (None, None, Some(_)) => return Err(invalid("edits is empty; give at least one edit")),
            (_, _, Some(_)) => {
                return Err(invalid("give either old_string and new_string, or edits, not both"));
            }
            _ => return Err(invalid("give old_string and new_string, or a list of edits")),
        };
        for (idx, edit) in edits.iter().enumerate() {
            if edit.old_string == edit.new_string {
                let which =
                    if edits.len() > 1 { format!("edit {}: ", idx + 1) } else { String::new() };
                return Err(invalid(&format!(
                    "{which}old_string and new_string are identical; there is nothing to change"
                )));
            }
            if idx > 0 && edit.old_string.is_empty() {
                return Err(invalid(&format!(
                    "edit {}: old_string is empty; only a first edit may create a file",
                    idx + 1
                )));
            }
        }
        Ok(edits)
    }
}

struct EditFile {
    definition: Definition,
}

pub fn tool() -> Arc<dyn Tool> {
    static DESCRIPTION: &str = "Edits a file inside the session roots by replacing the \
        exact text old_string with new_string. old_string must occur exactly once (copy it \
        from read_file output with its indentation, without the line-number prefix), \
        unless replace_all is true. The file must have been read with read_file in this \
        session and not changed since. Line endings and encoding are preserved. An empty \
        old_string creates a new file. Several changes to one file go in edits, a list of \
        {old_string, new_string, replace_all?} applied in order: all are made or none. \
        dry_run returns the diff without writing. Returns a diff of the change.";
    static DEFINITION: LazyLock<Definition> = LazyLock::new(|| Definition {
        name: "edit_file".to_owned(),
        description: DESCRIPTION.to_owned(),
        input_schema: schema_for::<Args>(),
        safety: Safety::SideEffect,
        system: false,
        timeout: None,
        facts: Facts {
            subject: Subject::Paths(&[PathArgument {
                name: "path",
                default: None,
                access: PathAccess::Write,
            }]),
            edits: true,
            binds_access: true,
            // `MultiEdit`: Claude Code's multi-edit tool of older releases.
            claude_code: ClaudeCode::Tool(ClaudeTool {
                name: "Edit",
                aliases: &["MultiEdit"],
                fields: &[("path", "file_path")],
            }),
        },
    });
    Arc::new(EditFile { definition: DEFINITION.clone() })
}

#[async_trait::async_trait]
impl Tool for EditFile {
    fn definition(&self) -> &Definition {
        &self.definition
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(res) => return res,
        };
        let edits = match args.edits() {
            Ok(edits) => edits,
            Err(res) => return res,
        };
        // Directories are only created for a new file; an edit of an existing file
        // must not leave directories behind when it fails.
        let creates = edits.first().is_some_and(|edit| edit.old_string.is_empty());
        let parents =
            if creates && !args.dry_run { ParentDirs::Create } else { ParentDirs::MustExist };
        let env = ctx.env.clone();
        let cancel = ctx.cancel.clone();
        let path = args.path.clone();
        fs::with_write_lock(&ctx.env, &path, parents, move |target| {
            edit_locked(&env, &args, &edits, target, &cancel)
        })
        .await
        .unwrap_or_else(ToolResult::from)
    }
}

fn edit_locked(
    env: &Env,
    args: &Args,
    edits: &[EditSpec],
    target: &ResolvedParent,
    cancel: &CancellationToken,
) -> Result<ToolResult, FsError> {
    let key = target.path();
    let shown_path = key.display().to_string();
    let Some((file, info)) = fs::open_existing(target, &args.path)? else {
        let Some((first, rest)) =
            edits.split_first().filter(|(first, _)| first.old_string.is_empty())
        else {
            return Err(fs::missing(&args.path, &key));
        };
        return create(env, args, first, rest, target, cancel);
    };
    let bytes = fs::read_capped(file, &info, env.max_read_bytes, &args.path)?;
    let current = FileStamp::of(&info, &bytes);
    if let Some(message) = Staleness::check(&env.files, &key, &current).message(&args.path) {
        return Ok(ToolResult::failure(ErrorType::StaleFile, message).with_meta("path", shown_path));
    }
    let decoded = match text::decode(&bytes) {
        Ok(decoded) if !decoded.lossy => decoded,
        Ok(decoded) => {
            return Ok(ToolResult::failure(
                ErrorType::BinaryFile,
                format!(
                    "{} is not valid {}; edit_file only changes files it can write back \
                     unchanged outside the edit",
                    fs::shorten(&args.path),
                    decoded.encoding.as_str()
                ),
            )
            .with_meta("path", shown_path));
        }
        Err(not_text) => {
            return Ok(ToolResult::failure(
                ErrorType::BinaryFile,
                format!("{} cannot be edited as text: {not_text}", fs::shorten(&args.path)),
            )
            .with_meta("path", shown_path));
        }
    };
    let limit = env.max_read_bytes;
    let bounds = Bounds {
        max_len: text::max_text_len(usize::try_from(limit).unwrap_or(usize::MAX), decoded.encoding),
        limit,
        cancel,
    };
    let planned = match plan_all(&decoded.text, edits, &bounds) {
        Ok(planned) => planned,
        Err((_, PlanError::Canceled)) => return Ok(PlanError::Canceled.into_result("", "", "")),
        Err((idx, err)) => {
            let mut res = err
                .into_result(&args.path, &decoded.text, &edits[idx].old_string)
                .with_meta("path", shown_path);
            if edits.len() > 1 {
                res = res.with_meta("edit_index", idx);
                if let Some(message) = res.error.take() {
                    res.error = Some(format!("edit {} of {}: {message}", idx + 1, edits.len()));
                }
            }
            return Ok(res);
        }
    };
    if cancel.is_cancelled() {
        return Ok(ToolResult::failure(ErrorType::Canceled, "the call was canceled"));
    }
    // The text fits; its encoding (UTF-16 takes up to twice the bytes) must too.
    let file_len =
        u64::try_from(text::encoded_len(&planned.text, decoded.encoding)).unwrap_or(u64::MAX);
    if file_len > limit {
        let too_large = PlanError::TooLarge { size: file_len, limit };
        return Ok(too_large.into_result(&args.path, "", "").with_meta("path", shown_path));
    }
    if !args.dry_run {
        let out = text::encode(&planned.text, decoded.encoding);
        let stamp = fs::write_atomic_replacing(&target.dir, &target.name, &out, &info)
            .map_err(|err| FsError::from_io(&args.path, err))?;
        env.files.record(key, stamp);
    }
    let diff = diff_snippet(&shown_path, &decoded.text, &planned.text);
    let noun = if planned.replacements == 1 { "replacement" } else { "replacements" };
    let verb = if args.dry_run { "would edit" } else { "edited" };
    let mut res = ToolResult::success(format!(
        "{verb} {shown_path} ({} {noun})\n{diff}",
        planned.replacements
    ))
    .with_meta("path", shown_path)
    .with_meta("replacements", planned.replacements)
    .with_meta("first_line", planned.first_line)
    .with_meta("encoding", decoded.encoding.as_str());
    if edits.len() > 1 {
        res = res.with_meta("edits", edits.len());
    }
    if args.dry_run {
        res = res.with_meta("dry_run", true);
    }
    Ok(res)
}

/// What bounds the planning of an edit.
struct Bounds<'a> {
    /// The longest text (UTF-8 bytes) an edit may make: what the file's encoding lets
    /// fit in the read limit.
    max_len: usize,
    /// The read limit, for messages.
    limit: u64,
    /// The call's: looked at between edits and every [`CANCEL_CHECK_MATCHES`] matches.
    cancel: &'a CancellationToken,
}

impl Bounds<'_> {
    /// Refuses a text of `size` bytes when it is longer than the limit allows.
    fn check(&self, size: u128) -> Result<(), PlanError> {
        if size > self.max_len as u128 {
            return Err(PlanError::TooLarge {
                size: u64::try_from(size).unwrap_or(u64::MAX),
                limit: self.limit,
            });
        }
        Ok(())
    }

    /// Refuses to go on once the call is over, every [`CANCEL_CHECK_MATCHES`]th match.
    fn check_cancel(&self, matches: usize) -> Result<(), PlanError> {
        if matches % CANCEL_CHECK_MATCHES == CANCEL_CHECK_MATCHES - 1 && self.cancel.is_cancelled()
        {
            return Err(PlanError::Canceled);
        }
        Ok(())
    }
}

/// Applies every edit in order to the text; the first that cannot be made is
/// returned with its index, and nothing is changed.
fn plan_all(
    text: &str,
    edits: &[EditSpec],
    bounds: &Bounds<'_>,
) -> Result<Planned, (usize, PlanError)> {
    let mut current = Planned { text: text.to_owned(), replacements: 0, first_line: usize::MAX };
    for (idx, edit) in edits.iter().enumerate() {
        if bounds.cancel.is_cancelled() {
            return Err((idx, PlanError::Canceled));
        }
        let step =
            plan(&current.text, &edit.old_string, &edit.new_string, edit.replace_all, bounds)
                .map_err(|err| (idx, err))?;
        current = Planned {
            text: step.text,
            replacements: current.replacements + step.replacements,
            first_line: current.first_line.min(step.first_line),
        };
    }
    Ok(current)
}

/// An empty first `old_string` on a path that does not exist creates the file; the
/// edits after it apply to the new content.
fn create(
    env: &Env,
    args: &Args,
    first: &EditSpec,
    rest: &[EditSpec],
    target: &ResolvedParent,
    cancel: &CancellationToken,
) -> Result<ToolResult, FsError> {
    let key = target.path();
    let shown_path = key.display().to_string();
    let limit = env.max_read_bytes;
    let bounds = Bounds { max_len: usize::try_from(limit).unwrap_or(usize::MAX), limit, cancel };
    if let Err(err) = bounds.check(first.new_string.len() as u128) {
        let message = err.into_result(&args.path, "", "");
        return Ok(message.with_meta("path", shown_path).with_meta("edit_index", 0));
    }
    let content = match plan_all(&first.new_string, rest, &bounds) {
        Ok(planned) => planned.text,
        Err((_, PlanError::Canceled)) => return Ok(PlanError::Canceled.into_result("", "", "")),
        Err((idx, err)) => {
            let old = rest.get(idx).map(|edit| edit.old_string.as_str()).unwrap_or_default();
            let message = err.into_result(&args.path, &first.new_string, old);
            return Ok(message.with_meta("path", shown_path).with_meta("edit_index", idx + 1));
        }
    };
    if cancel.is_cancelled() {
        return Ok(ToolResult::failure(ErrorType::Canceled, "the call was canceled"));
    }
    if !args.dry_run {
        let stamp = fs::write_atomic(&target.dir, &target.name, content.as_bytes(), None)
            .map_err(|err| FsError::from_io(&args.path, err))?;
        env.files.record(key, stamp);
    }
    let diff = diff_snippet(&shown_path, "", &content);
    let verb = if args.dry_run { "would create" } else { "created" };
    let mut res =
        ToolResult::success(format!("{verb} {shown_path} ({} bytes)\n{diff}", content.len()))
            .with_meta("path", shown_path)
            .with_meta("replacements", 1 + rest.len())
            .with_meta("first_line", 1)
            .with_meta("created", !args.dry_run);
    if args.dry_run {
        res = res.with_meta("dry_run", true);
    }
    Ok(res)
}

/// The edited text, before encoding.
#[derive(Debug, PartialEq, Eq)]
struct Planned {
    text: String,
    replacements: usize,
    /// 1-based line of the first replacement.
    first_line: usize,
}

/// Why an edit cannot be made.
#[derive(Debug, PartialEq, Eq)]
enum PlanError {
    NotFound,
    NotUnique {
        count: usize,
        lines: Vec<usize>,
    },
    /// An empty `old_string` on a file that has content.
    EmptyOldString,
    /// The edited text would be `size` bytes, more than the read limit lets the file
    /// hold.
    TooLarge {
        size: u64,
        limit: u64,
    },
    /// The call was canceled (or timed out) while the edits were planned.
    Canceled,
}

impl PlanError {
    fn into_result(self, path: &str, text: &str, old: &str) -> ToolResult {
        let shown = fs::shorten(path);
        match self {
            PlanError::NotFound => {
                let mut message = format!("old_string was not found in {shown}");
                let hint = not_found_hint(text, old);
                if let Some(hint) = &hint {
                    message.push_str(".\n");
                    message.push_str(&hint.text);
                }
                let res = ToolResult::failure(ErrorType::NotFound, message);
                match hint.and_then(|hint| hint.line) {
                    Some(line) => res.with_meta("closest_line", line),
                    None => res,
                }
            }
            PlanError::NotUnique { count, lines } => {
                let listed: Vec<String> = lines.iter().map(usize::to_string).collect();
                let more = if count > lines.len() { ", …" } else { "" };
                ToolResult::failure(
                    ErrorType::NotUnique,
                    format!(
                        "old_string occurs {count} times in {shown} (at lines {}{more}); include \
                         more surrounding text to make it unique, or set replace_all to change \
                         every occurrence",
                        listed.join(", ")
                    ),
                )
                .with_meta("matches", count)
                .with_meta("lines", lines)
            }
            PlanError::EmptyOldString => ToolResult::failure(
                ErrorType::InvalidArguments,
                format!(
                    "old_string is empty but {shown} already has content; give the exact text \
                     to replace, or use write_file to replace the whole file"
                ),
            ),
            PlanError::TooLarge { size, limit } => ToolResult::failure(
                ErrorType::TooLarge,
                format!(
                    "the edited text would be {size} bytes, more than {shown} may hold: the \
                     read limit is {limit} bytes ([limits] max_read_bytes), and edit_file only \
                     writes a file it can read back whole; nothing was changed"
                ),
            )
            .with_meta("bytes", size)
            .with_meta("max_read_bytes", limit),
            PlanError::Canceled => {
                ToolResult::failure(ErrorType::Canceled, "the call was canceled")
            }
        }
    }
}

/// Applies the edit to decoded text. In a CRLF file, `old`/`new` are first tried
/// with CRLF line endings (so text copied from read_file, which shows plain lines,
/// matches and new lines follow the file's style), then as given (a mixed file may
/// have LF lines too). In an LF file, CRLF in `old`/`new` is tried as LF after the
/// text as given.
///
/// The matches are counted first, and the edited text's size computed from their
/// number: an edit whose result would pass `bounds` is refused before any of it is
/// built.
fn plan(
    text: &str,
    old: &str,
    new: &str,
    replace_all: bool,
    bounds: &Bounds<'_>,
) -> Result<Planned, PlanError> {
    if old.is_empty() {
        if !text.is_empty() {
            return Err(PlanError::EmptyOldString);
        }
        bounds.check(new.len() as u128)?;
        return Ok(Planned { text: new.to_owned(), replacements: 1, first_line: 1 });
    }
    let mut candidates = Vec::with_capacity(2);
    let crlf = text::uses_crlf(text);
    if crlf {
        candidates.push((text::to_crlf(old), text::to_crlf(new)));
    }
    candidates.push((old.to_owned(), new.to_owned()));
    if !crlf {
        candidates.push((text::to_lf(old).into_owned(), text::to_lf(new).into_owned()));
    }
    candidates.dedup_by(|later, earlier| later.0 == earlier.0);
    for (old, new) in candidates {
        let mut count = 0usize;
        let mut listed = Vec::new();
        for (at, _) in text.match_indices(old.as_str()) {
            bounds.check_cancel(count)?;
            if listed.len() < MAX_LISTED_MATCHES {
                listed.push(at);
            }
            count += 1;
        }
        let Some(&first) = listed.first() else {
            continue;
        };
        if count > 1 && !replace_all {
            let lines = listed.iter().map(|&at| line_of(text, at)).collect();
            return Err(PlanError::NotUnique { count, lines });
        }
        // Every match lies in the text, so what they take out never exceeds its length.
        let size = text.len() as u128 - count as u128 * old.len() as u128
            + count as u128 * new.len() as u128;
        bounds.check(size)?;
        let mut edited = String::with_capacity(usize::try_from(size).unwrap_or(usize::MAX));
        let mut copied = 0;
        for (replaced, (at, _)) in text.match_indices(old.as_str()).enumerate() {
            bounds.check_cancel(replaced)?;
            edited.push_str(&text[copied..at]);
            edited.push_str(&new);
            copied = at + old.len();
        }
        edited.push_str(&text[copied..]);
        return Ok(Planned { text: edited, replacements: count, first_line: line_of(text, first) });
    }
    Err(PlanError::NotFound)
}

/// The 1-based line holding byte `at`.
fn line_of(text: &str, at: usize) -> usize {
    memchr::memchr_iter(b'\n', &text.as_bytes()[..at]).count() + 1
}

/// A unified diff of the change (LF endings, a few lines of context), capped.
fn diff_snippet(path: &str, before: &str, after: &str) -> String {
    let before = text::to_lf(before);
    let after = text::to_lf(after);
    let diff = TextDiff::configure().timeout(DIFF_TIMEOUT).diff_lines(&*before, &*after);
    let mut out =
        diff.unified_diff().context_radius(DIFF_CONTEXT_LINES).header(path, path).to_string();
    if out.len() > MAX_DIFF_BYTES {
        let mut end = MAX_DIFF_BYTES;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        let left_out = out.len() - end;
        out.truncate(end);
        let _ = write!(out, "\n… [diff cut: {left_out} more bytes]");
    }
    out
}

// ---------------------------------------------------------------------------------
// The not_found hint.

pub(crate) struct Hint {
    pub(crate) text: String,
    /// The first line of the best region, for metadata.
    pub(crate) line: Option<usize>,
}

/// Explains the likeliest reason `old` did not match: read_file's line-number
/// prefixes pasted along, a difference in whitespace only, or else the regions most
/// similar to it (by per-line character similarity), with their line numbers.
pub(crate) fn not_found_hint(text: &str, old: &str) -> Option<Hint> {
    let file_lines: Vec<&str> = text.lines().take(MAX_HINT_SCAN_LINES).collect();
    let old_lines: Vec<&str> = old.lines().collect();
    if old_lines.is_empty() || file_lines.is_empty() {
        return None;
    }
    if old_lines.iter().filter(|line| !line.trim().is_empty()).all(|line| has_number_prefix(line)) {
        return Some(Hint {
            text: "old_string seems to include read_file's line-number prefixes (spaces, the \
                   number and a tab); pass only the file's own text"
                .to_owned(),
            line: None,
        });
    }
    if let Some(start) = whitespace_insensitive_match(&file_lines, &old_lines) {
        let end = start + old_lines.len().max(1) - 1;
        let mut text = format!(
            "old_string matches lines {}-{} only when whitespace is ignored; copy the exact \
             text, indentation included:\n",
            start + 1,
            end + 1
        );
        push_region(&mut text, &file_lines, start, old_lines.len());
        return Some(Hint { text, line: Some(start + 1) });
    }
    let regions = similar_regions(&file_lines, &old_lines);
    let best = regions.first()?.0;
    let mut text = String::from("the closest lines are:");
    for (start, score) in regions {
        let end = (start + old_lines.len()).min(file_lines.len());
        // Rounded down, so only an exact match (impossible here) could read 100%.
        let percent = (score * 100.0).floor().min(99.0);
        let _ = write!(text, "\nlines {}-{} ({percent:.0}% similar):\n", start + 1, end);
        push_region(&mut text, &file_lines, start, old_lines.len());
    }
    Some(Hint { text, line: Some(best + 1) })
}

/// `    12\t…`: read_file's numbering.
fn has_number_prefix(line: &str) -> bool {
    let rest = line.trim_start_matches(' ');
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    digits > 0 && rest[digits..].starts_with('\t')
}

fn collapse_whitespace(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The first window of file lines equal to `old` once whitespace runs are collapsed
/// (for one line: a file line containing it).
fn whitespace_insensitive_match(file_lines: &[&str], old_lines: &[&str]) -> Option<usize> {
    let old: Vec<String> = old_lines.iter().map(|line| collapse_whitespace(line)).collect();
    if old.iter().all(String::is_empty) {
        return None;
    }
    if let [single] = old.as_slice() {
        return file_lines.iter().position(|line| collapse_whitespace(line).contains(single));
    }
    (0..=file_lines.len().checked_sub(old.len())?).find(|&start| {
        old.iter().zip(&file_lines[start..]).all(|(want, have)| *want == collapse_whitespace(have))
    })
}

/// The best regions as (first line index, score): file lines are scored against the
/// most distinctive (longest) line of `old`, the best few anchor a window the size of
/// `old`, and windows are ranked by their average per-line similarity.
fn similar_regions(file_lines: &[&str], old_lines: &[&str]) -> Vec<(usize, f32)> {
    let (anchor_idx, anchor) = old_lines
        .iter()
        .map(|line| clip(line.trim()))
        .enumerate()
        .max_by_key(|(_, line)| line.chars().count())
        .unwrap_or((0, ""));
    if anchor.is_empty() {
        return Vec::new();
    }
    // A cheap upper bound first (shared characters), so the character diff only runs
    // on the most promising lines however large the file is.
    let anchor_profile = Profile::of(anchor);
    let mut candidates: Vec<(usize, f32)> = file_lines
        .iter()
        .enumerate()
        .filter_map(|(idx, line)| {
            let bound = anchor_profile.similarity_bound(&Profile::of(clip(line.trim())));
            (bound >= HINT_MIN_SIMILARITY).then_some((idx, bound))
        })
        .collect();
    candidates.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    candidates.truncate(MAX_HINT_DIFFED_LINES);
    let mut anchors: Vec<(usize, f32)> = candidates
        .into_iter()
        .filter_map(|(idx, _)| {
            let score = similarity(anchor, clip(file_lines[idx].trim()));
            (score >= HINT_MIN_SIMILARITY).then_some((idx, score))
        })
        .collect();
    anchors.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut regions: Vec<(usize, f32)> = Vec::new();
    for (idx, _) in anchors {
        let start = idx.saturating_sub(anchor_idx);
        if regions.iter().any(|(seen, _)| *seen == start) {
            continue;
        }
        let pairs: Vec<(&str, &str)> = old_lines
            .iter()
            .zip(file_lines.iter().skip(start))
            .take(MAX_HINT_REGION_LINES)
            .map(|(want, have)| (*want, *have))
            .collect();
        let score = pairs
            .iter()
            .map(|(want, have)| similarity(clip(want.trim()), clip(have.trim())))
            .sum::<f32>()
            / pairs.len().max(1) as f32;
        regions.push((start, score));
        if regions.len() >= MAX_HINT_REGIONS * 4 {
            break;
        }
    }
    regions.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    regions.truncate(MAX_HINT_REGIONS);
    regions
}

/// A line's characters counted into a few buckets: two lines cannot have more
/// characters in common than their bucket counts share, which bounds their
/// similarity from above without diffing them.
struct Profile {
    buckets: [u32; PROFILE_BUCKETS],
    len: u32,
}

impl Profile {
    fn of(line: &str) -> Profile {
        let mut buckets = [0u32; PROFILE_BUCKETS];
        let mut len = 0u32;
        for ch in line.chars() {
            buckets[ch as usize % PROFILE_BUCKETS] += 1;
            len += 1;
        }
        Profile { buckets, len }
    }

    /// At least [`similarity`] of the two lines (`2 * shared / total`).
    fn similarity_bound(&self, other: &Profile) -> f32 {
        let total = self.len + other.len;
        if total == 0 {
            return 1.0;
        }
        let shared: u32 =
            self.buckets.iter().zip(&other.buckets).map(|(mine, theirs)| *mine.min(theirs)).sum();
        2.0 * shared as f32 / total as f32
    }
}

/// Character-level similarity in 0..1 (`2 * matches / total`), skipping the diff when
/// the lengths alone rule out reaching the hint threshold.
fn similarity(a: &str, b: &str) -> f32 {
    if a == b {
        return 1.0;
    }
    let (len_a, len_b) = (a.chars().count(), b.chars().count());
    let bound = 2.0 * len_a.min(len_b) as f32 / (len_a + len_b).max(1) as f32;
    if bound < HINT_MIN_SIMILARITY {
        return 0.0;
    }
    TextDiff::configure().timeout(DIFF_TIMEOUT).diff_chars(a, b).ratio()
}

fn clip(line: &str) -> &str {
    match line.char_indices().nth(MAX_HINT_LINE_CHARS) {
        Some((at, _)) => &line[..at],
        None => line,
    }
}

/// Appends `count` numbered lines from `start`, like read_file shows them.
fn push_region(out: &mut String, file_lines: &[&str], start: usize, count: usize) {
    let shown = count.clamp(1, MAX_HINT_REGION_LINES);
    for (idx, line) in file_lines.iter().enumerate().skip(start).take(shown) {
        let line = match line.char_indices().nth(MAX_HINT_SHOWN_CHARS) {
            Some((at, _)) => format!("{}…", &line[..at]),
            None => (*line).to_owned(),
        };
        let _ = writeln!(out, "{:>6}\t{line}", idx + 1);
    }
    if count > shown {
        let _ = writeln!(out, "     …\t({} more lines)", count - shown);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`plan`] with no bound but the machine's.
    fn unbounded(
        text: &str,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<Planned, PlanError> {
        let cancel = CancellationToken::new();
        plan(
            text,
            old,
            new,
            replace_all,
            &Bounds { max_len: usize::MAX, limit: u64::MAX, cancel: &cancel },
        )
    }

    fn doubling(edits: usize) -> Vec<EditSpec> {
        let edit = EditSpec { old_string: "x".into(), new_string: "xx".into(), replace_all: true };
        vec![edit; edits]
    }

    #[test]
    fn an_edit_past_the_limit_is_refused_from_its_match_count() {
        let cancel = CancellationToken::new();
        let bounds = Bounds { max_len: 64 * 1024, limit: 64 * 1024, cancel: &cancel };
        let text = "x".repeat(1024);
        // 1 KiB doubled six times is 64 KiB, the limit itself; the seventh edit is
        // refused, by what it would make.
        assert_eq!(plan_all(&text, &doubling(6), &bounds).unwrap().text.len(), 64 * 1024);
        let (idx, err) = plan_all(&text, &doubling(11), &bounds).unwrap_err();
        assert_eq!((idx, err), (6, PlanError::TooLarge { size: 128 * 1024, limit: 64 * 1024 }));
        // Single replacements are counted once, whatever else matches.
        let long = "y".repeat(64 * 1024 - 1);
        let edit = |new: &str| plan(&long, "y", new, false, &bounds);
        assert!(
            matches!(edit("yy"), Err(PlanError::NotUnique { count, .. }) if count == long.len())
        );
        let short = "y".repeat(10);
        assert_eq!(plan(&short, "yyyyyyyyyy", &long, false, &bounds).unwrap().text, long);
        let past = format!("{long}yy");
        assert_eq!(
            plan(&short, "yyyyyyyyyy", &past, false, &bounds),
            Err(PlanError::TooLarge { size: past.len() as u64, limit: 64 * 1024 })
        );
        // An empty file filled by the first edit.
        assert!(matches!(plan("", "", &past, false, &bounds), Err(PlanError::TooLarge { .. })));
    }

    #[test]
    fn a_canceled_call_stops_between_edits_and_inside_a_replacement() {
        let cancel = CancellationToken::new();
        cancel.cancel();
        let bounds = Bounds { max_len: usize::MAX, limit: u64::MAX, cancel: &cancel };
        let text = "x".repeat(CANCEL_CHECK_MATCHES * 4);
        assert_eq!(plan_all(&text, &doubling(3), &bounds).unwrap_err(), (0, PlanError::Canceled));
        assert_eq!(plan(&text, "x", "xx", true, &bounds), Err(PlanError::Canceled));
        // A few matches finish: the look comes every CANCEL_CHECK_MATCHES.
        assert_eq!(plan("axa", "x", "y", true, &bounds).unwrap().text, "aya");
    }

    #[test]
    fn plan_requires_a_unique_match() {
        let text = "a = 1\nb = 2\na = 1\n";
        assert_eq!(
            unbounded(text, "a = 1", "a = 3", false),
            Err(PlanError::NotUnique { count: 2, lines: vec![1, 3] })
        );
        assert_eq!(
            unbounded(text, "a = 1", "a = 3", true),
            Ok(Planned {
                text: "a = 3\nb = 2\na = 3\n".to_owned(),
                replacements: 2,
                first_line: 1
            })
        );
        assert_eq!(
            unbounded(text, "b = 2", "b = 4", false),
            Ok(Planned {
                text: "a = 1\nb = 4\na = 1\n".to_owned(),
                replacements: 1,
                first_line: 2
            })
        );
        assert_eq!(unbounded(text, "c = 3", "c = 4", false), Err(PlanError::NotFound));
    }

    #[test]
    fn plan_matches_lf_text_in_crlf_files_and_writes_crlf() {
        let text = "one\r\ntwo\r\nthree\r\n";
        let planned = unbounded(text, "one\ntwo\n", "uno\ndos\n", false).unwrap();
        assert_eq!(planned.text, "uno\r\ndos\r\nthree\r\n");
        // And the other way round: CRLF text pasted into an edit of an LF file.
        let planned = unbounded("one\ntwo\n", "one\r\ntwo", "1\r\n2", false).unwrap();
        assert_eq!(planned.text, "1\n2\n");
    }

    #[test]
    fn empty_old_string_only_fills_an_empty_file() {
        assert_eq!(unbounded("x", "", "y", false), Err(PlanError::EmptyOldString));
        assert_eq!(unbounded("", "", "y", false).unwrap().text, "y");
    }

    #[test]
    fn hints_name_the_likely_mistake() {
        let text = "fn main() {\n    let total = compute(1, 2);\n    println!(\"{total}\");\n}\n";
        let numbered = not_found_hint(text, "     2\t    let total = compute(1, 2);").unwrap();
        assert!(numbered.text.contains("line-number prefixes"), "{}", numbered.text);

        let spaced =
            not_found_hint(text, "let total  =  compute(1, 2);\nprintln!(\"{total}\");").unwrap();
        assert!(
            spaced.text.contains("lines 2-3 only when whitespace is ignored"),
            "{}",
            spaced.text
        );
        assert_eq!(spaced.line, Some(2));

        let typo = not_found_hint(text, "    let totl = compute(1, 3);").unwrap();
        assert!(typo.text.contains("lines 2-2"), "{}", typo.text);
        assert!(typo.text.contains("     2\t    let total = compute(1, 2);"), "{}", typo.text);
        assert_eq!(typo.line, Some(2));

        assert!(not_found_hint(text, "completely unrelated words here").is_none());
    }
}
