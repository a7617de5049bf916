//! `search_code`: searches file contents with ripgrep's own engines.
//!
//! `grep-regex` compiles the pattern, `grep-searcher` runs it over each file line by
//! line (binary files skipped at the first NUL byte, like ripgrep), and the parallel
//! walk of [`crate::tools::walk`] chooses the files and opens each one relative to its
//! directory's descriptor. Files the session may not read (toolgate's own, files under
//! read rules, files with several hard links) are left out and counted.
//! Output is rendered the way ripgrep prints it (`path:line:text`, context lines as
//! `path-line-text`, `--` between groups) so a model reads it without instruction.
//!
//! Files are searched in whatever order the walker threads reach them; the output is
//! put in path order once at the end, and only what can appear in the first `limit`
//! lines is ever rendered (see [`Prefix`]), while the totals are counted exactly.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use grep_matcher::{LineTerminator, Matcher};
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::tools::facts::{ClaudeCode, ClaudeTool, PathAccess, PathArgument, Subject};
use crate::tools::fs::budget::{READ_BUDGET, Reservation};
use crate::tools::fs::{self, FileKind};
use crate::tools::walk::{self, EntryKind, PathGlob, PathKey, Prefix, Tree, Visit, WalkOptions};
use crate::tools::{
    Definition, ErrorType, Facts, FsError, Safety, Tool, ToolContext, ToolResult, parse_args,
    schema_for,
};

/// Output lines (content mode) or files (other modes) when the call does not say:
/// enough to see a pattern's use across a project, small enough for a model's context.
const DEFAULT_LIMIT: usize = 500;
/// The most output lines or files one call may ask for; beyond this the output is no
/// longer something a model can read.
const MAX_LIMIT: usize = 100_000;
/// Lines of context one call may ask for around each match; more than this turns a
/// search into reading whole files, which read_file does better.
const MAX_CONTEXT: usize = 100;
/// Longest line shown in full. Minified or generated files hold single lines of
/// megabytes; beyond this only a window around the first match is shown.
const MAX_LINE_BYTES: usize = 500;
/// How much of a clipped line is shown before the match, so the match has context.
const CLIP_LEAD_BYTES: usize = 100;
/// Least memory a search thread may use for one file's buffer, whatever the session's
/// read limit: room for ordinary long lines.
const MIN_HEAP_BYTES: u64 = 64 * 1024;

/// How results are rendered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum OutputMode {
    /// Matching lines as `path:line:text` (context lines as `path-line-text`).
    #[default]
    Content,
    /// Only the paths of files that contain a match.
    FilesWithMatches,
    /// `path:N` with the number of matching lines per file.
    Count,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SearchCodeArgs {
    /// Regular expression (Rust regex syntax, like ripgrep), or a literal string with
    /// `fixed_strings`.
    #[schemars(length(min = 1))]
    pattern: String,
    /// File or directory to search, relative to the working directory (default: the
    /// working directory). Must be inside the session roots.
    #[serde(default)]
    path: Option<String>,
    /// Only search files matching this glob: without `/` it matches the file name
    /// (`*.rs`, `*.{ts,tsx}`), with `/` the path relative to the search directory.
    #[serde(default)]
    glob: Option<String>,
    /// Match without regard to case.
    #[serde(default)]
    case_insensitive: bool,
    /// Treat the pattern as a literal string, not a regular expression.
    #[serde(default)]
    fixed_strings: bool,
    /// Lines of context to show before and after each match (content mode).
    #[serde(default)]
    #[schemars(range(max = 100))]
    context: Option<usize>,
    /// `content` (default), `files_with_matches` or `count`.
    #[serde(default)]
    output_mode: OutputMode,
    /// Maximum output lines in content mode, or files in the other modes (default
    /// 500, at most 100000).
    #[serde(default)]
    #[schemars(range(min = 1, max = 100_000))]
    limit: Option<usize>,
    /// Include hidden files and directories (names starting with a dot).
    #[serde(default)]
    hidden: bool,
    /// Let the pattern match across lines (`\n` in the pattern matches a newline).
    #[serde(default)]
    multiline: bool,
}

struct SearchCode {
    definition: Definition,
}

pub fn tool() -> Arc<dyn Tool> {
    Arc::new(SearchCode {
        definition: Definition {
            name: "search_code".to_owned(),
            description: "Search file contents with a regular expression (ripgrep). \
                          Output modes: content (path:line:text, sorted by path then \
                          line), files_with_matches (paths), count (path:N). Respects \
                          .gitignore and .ignore files, skips hidden and binary files; \
                          paths are relative to the search directory."
                .to_owned(),
            input_schema: schema_for::<SearchCodeArgs>(),
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
                    name: "Grep",
                    aliases: &[],
                    fields: &[
                        ("case_insensitive", "-i"),
                        ("context", "-C"),
                        ("limit", "head_limit"),
                    ],
                }),
            },
        },
    })
}

#[async_trait::async_trait]
impl Tool for SearchCode {
    fn definition(&self) -> &Definition {
        &self.definition
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let args: SearchCodeArgs = match parse_args(args) {
            Ok(args) => args,
            Err(res) => return res,
        };
        let query = match Query::new(&args, &ctx) {
            Ok(query) => query,
            Err(err) => return err.into(),
        };
        // Raised when the call is canceled or times out, and when this future is
        // dropped: either way the blocking walk below stops at its next entry.
        let cancel = walk::CancelFlag::watch(&ctx.cancel);
        let flag = cancel.shared();
        let found = match tokio::task::spawn_blocking(move || search(&query, &flag)).await {
            Ok(Some(found)) => found,
            Ok(None) => return ToolResult::failure(ErrorType::Canceled, "the call was canceled"),
            Err(err) => {
                tracing::error!(%err, "search_code walk failed");
                return ToolResult::failure(ErrorType::InternalError, "the search failed");
            }
        };
        render(&found, args.output_mode, ctx.env.max_output_bytes)
    }
}

/// What a search reads.
enum Target {
    /// A directory tree, walked by descriptors.
    Tree(Box<Tree>),
    /// One file, already open (its name is the displayed path).
    File { file: File, name: PathBuf },
}

/// One validated search request.
struct Query {
    target: Target,
    matcher: RegexMatcher,
    glob: Option<PathGlob>,
    mode: OutputMode,
    context: usize,
    limit: usize,
    multiline: bool,
    /// Memory one search thread may use for one file's buffer: a line-oriented search
    /// holds a whole line, a multiline search a whole file. The session's read limit
    /// (a file read_file could not load either); a file needing more is skipped and
    /// counted as unreadable. Reserved from the shared read budget per thread.
    heap_limit: u64,
}

impl Query {
    fn new(args: &SearchCodeArgs, ctx: &ToolContext) -> Result<Query, QueryError> {
        let path = match args.path.as_deref() {
            None | Some("") => ".",
            Some(path) => path,
        };
        let options = WalkOptions { hidden: args.hidden, no_ignore: false };
        let resolved = fs::resolve(&ctx.env, path)?;
        let target = if resolved.is_dir {
            Target::Tree(Box::new(Tree::new(&ctx.env, resolved, options)))
        } else {
            // Opened for reading on its own: confined, checked against the session's
            // access and refused when hard-linked, like read_file.
            let opened = fs::open_read(&ctx.env, path)?;
            if opened.kind != FileKind::File {
                return Err(FsError::NotRegularFile(fs::shorten(path)).into());
            }
            let name = opened.path.file_name().map(PathBuf::from).unwrap_or_default();
            Target::File { file: File::from(opened.fd), name }
        };
        let glob = match &args.glob {
            None => None,
            Some(pattern) => Some(
                PathGlob::new(pattern)
                    .map_err(|err| QueryError::Glob { pattern: pattern.clone(), source: err })?,
            ),
        };
        let mut builder = RegexMatcherBuilder::new();
        builder
            .case_insensitive(args.case_insensitive)
            .fixed_strings(args.fixed_strings)
            // `^` and `$` match at line boundaries, as in ripgrep, and `$` also
            // before a `\r\n`: a model does not know which files have DOS line
            // endings, and `foo$` silently failing on them is a classic trap.
            .multi_line(true)
            .crlf(true);
        if args.multiline {
            // Matches may span lines, so the matcher has no line terminator (the
            // searcher then reads whole files).
            builder.line_terminator(None);
        }
        let matcher = builder.build(&args.pattern)?;
        let mode = args.output_mode;
        Ok(Query {
            target,
            matcher,
            glob,
            mode,
            context: if mode == OutputMode::Content {
                args.context.unwrap_or(0).min(MAX_CONTEXT)
            } else {
                0
            },
            limit: args.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT),
            multiline: args.multiline,
            heap_limit: ctx.env.max_read_bytes.max(MIN_HEAP_BYTES),
        })
    }

    /// A searcher for rendering content: line numbers and context.
    fn content_searcher(&self) -> Searcher {
        let mut builder = self.base_searcher();
        builder.line_number(true).before_context(self.context).after_context(self.context);
        builder.build()
    }

    /// A searcher that only counts: no line numbers, no context (both cost time).
    fn counting_searcher(&self) -> Searcher {
        let mut builder = self.base_searcher();
        builder.line_number(false);
        builder.build()
    }

    fn base_searcher(&self) -> SearcherBuilder {
        let mut builder = SearcherBuilder::new();
        builder
            // Lines end at `\n`; a `\r` before it is not part of the line (matching
            // the matcher's CRLF mode).
            .line_terminator(LineTerminator::crlf())
            .binary_detection(BinaryDetection::quit(b'\x00'))
            .multi_line(self.multiline)
            .heap_limit(Some(usize::try_from(self.heap_limit).unwrap_or(usize::MAX)));
        builder
    }
}

/// Why a search request cannot run.
#[derive(Debug, thiserror::Error)]
enum QueryError {
    #[error(transparent)]
    Path(#[from] FsError),
    #[error("invalid glob {pattern:?}: {}", source.kind())]
    Glob { pattern: String, source: globset::Error },
    #[error("invalid regex: {0}")]
    Regex(#[from] grep_regex::Error),
}

impl From<QueryError> for ToolResult {
    fn from(err: QueryError) -> ToolResult {
        match err {
            QueryError::Path(err) => err.into(),
            other => ToolResult::failure(ErrorType::InvalidArguments, other.to_string()),
        }
    }
}

/// What one file contributed to the output.
#[derive(Debug)]
struct FileHit {
    /// Rendered lines, each ending in `\n`.
    text: String,
    /// Number of lines in `text`.
    lines: usize,
    /// Whether `text` holds everything this file would print (false when its own
    /// output reached `limit` lines and rendering stopped).
    complete: bool,
}

/// What a search found.
struct Found {
    /// The files that can appear in the output, in path order.
    hits: Vec<FileHit>,
    /// Files with at least one match.
    files: u64,
    /// Matching lines in all files (not counted in files_with_matches mode, which
    /// stops reading a file at its first match).
    matches: u64,
    /// Files or directories that could not be read.
    unreadable: u64,
    /// Files left out because the session may not read them.
    withheld: u64,
    /// Whether context separators go between files.
    separate_files: bool,
    limit: usize,
}

/// One walker thread's searchers and findings. The searchers (and their buffers) are
/// reused for every file the thread searches.
struct ThreadSearch {
    /// This thread's share of the read budget; `None` when the call was canceled while
    /// waiting for it (then nothing is searched).
    memory: Option<Reservation<'static>>,
    content_searcher: Searcher,
    counting_searcher: Searcher,
    kept: Prefix<FileHit>,
    files: u64,
    matches: u64,
    unreadable: u64,
    withheld: u64,
}

/// Searches the tree; `None` when the search was canceled.
fn search(query: &Query, cancel: &AtomicBool) -> Option<Found> {
    let make_state = || ThreadSearch {
        memory: READ_BUDGET.reserve(query.heap_limit, cancel),
        content_searcher: query.content_searcher(),
        counting_searcher: query.counting_searcher(),
        kept: Prefix::new(query.limit),
        files: 0,
        matches: 0,
        unreadable: 0,
        withheld: 0,
    };
    let states = match &query.target {
        Target::File { file, name } => {
            let mut state = make_state();
            match file.try_clone() {
                _ if state.memory.is_none() => {}
                Ok(file) => search_file(query, &mut state, file, name, cancel),
                Err(_) => state.unreadable += 1,
            }
            vec![state]
        }
        Target::Tree(tree) => walk::walk(tree, cancel, make_state, |state, visit| match visit {
            Visit::Unreadable => state.unreadable += 1,
            Visit::Withheld => state.withheld += 1,
            Visit::Entry(_) if state.memory.is_none() => {}
            Visit::Entry(entry) => {
                // Symlinks are never followed (a link could lead outside the roots).
                if entry.kind != EntryKind::File {
                    return;
                }
                if let Some(glob) = &query.glob
                    && !glob.is_match(entry.relative)
                {
                    return;
                }
                match entry.open() {
                    Ok(Some((_, info))) if info.is_hardlinked() => state.withheld += 1,
                    Ok(Some((file, _))) => search_file(query, state, file, entry.relative, cancel),
                    Ok(None) => {}
                    Err(_) => state.unreadable += 1,
                }
            }
        }),
    };
    if cancel.load(Ordering::Relaxed) {
        return None;
    }
    let files = states.iter().map(|state| state.files).sum();
    let matches = states.iter().map(|state| state.matches).sum();
    let unreadable = states.iter().map(|state| state.unreadable).sum();
    let withheld = states.iter().map(|state| state.withheld).sum();
    let kept = Prefix::merge_all(states.into_iter().map(|state| state.kept), query.limit);
    Some(Found {
        hits: kept.into_sorted().map(|(_, hit)| hit).collect(),
        files,
        matches,
        unreadable,
        withheld,
        separate_files: query.context > 0,
        limit: query.limit,
    })
}

/// Searches one file and records what it contributes.
fn search_file(
    query: &Query,
    state: &mut ThreadSearch,
    file: File,
    shown: &Path,
    cancel: &AtomicBool,
) {
    let reader = CancelReader { file, cancel };
    // Files that cannot appear in the output are only counted, never rendered.
    let wanted = state.kept.wants(shown);
    let (res, matched, hit) = match query.mode {
        OutputMode::Content if wanted => {
            let mut sink = ContentSink::new(shown, &query.matcher, query.limit, cancel);
            let res = state.content_searcher.search_reader(&query.matcher, reader, &mut sink);
            state.matches += sink.matched_lines;
            let hit = FileHit { lines: sink.lines, complete: !sink.clipped, text: sink.text };
            (res, sink.matched_lines > 0, Some(hit))
        }
        OutputMode::Content | OutputMode::Count => {
            let mut sink = CountSink { matched_lines: 0, cancel };
            let res = state.counting_searcher.search_reader(&query.matcher, reader, &mut sink);
            state.matches += sink.matched_lines;
            let hit = (query.mode == OutputMode::Count && wanted).then(|| FileHit {
                text: format!("{}:{}\n", shown.to_string_lossy(), sink.matched_lines),
                lines: 1,
                complete: true,
            });
            (res, sink.matched_lines > 0, hit)
        }
        OutputMode::FilesWithMatches => {
            let mut sink = FirstMatchSink { found: false, cancel };
            let res = state.counting_searcher.search_reader(&query.matcher, reader, &mut sink);
            let hit = wanted.then(|| FileHit {
                text: format!("{}\n", shown.to_string_lossy()),
                lines: 1,
                complete: true,
            });
            (res, sink.found, hit)
        }
    };
    if res.is_err() && !cancel.load(Ordering::Relaxed) {
        state.unreadable += 1;
    }
    if !matched {
        return;
    }
    state.files += 1;
    if let Some(hit) = hit {
        let weight = hit.lines;
        state.kept.insert(PathKey::new(shown), hit, weight);
    }
}

/// A file reader that fails once the call is canceled, so even a huge file without
/// matches (where no sink callback runs) stops being read promptly.
struct CancelReader<'a> {
    file: File,
    cancel: &'a AtomicBool,
}

impl Read for CancelReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(io::Error::other("the search was canceled"));
        }
        self.file.read(buf)
    }
}

/// Renders matches and context of one file as ripgrep does, up to `cap` lines.
struct ContentSink<'a> {
    path: String,
    matcher: &'a RegexMatcher,
    cancel: &'a AtomicBool,
    /// Lines worth rendering: no file can show more than the call's limit.
    cap: usize,
    text: String,
    lines: usize,
    /// Whether rendering stopped at `cap` (counting goes on).
    clipped: bool,
    matched_lines: u64,
}

impl<'a> ContentSink<'a> {
    fn new(
        shown: &Path,
        matcher: &'a RegexMatcher,
        cap: usize,
        cancel: &'a AtomicBool,
    ) -> ContentSink<'a> {
        ContentSink {
            path: shown.to_string_lossy().into_owned(),
            matcher,
            cancel,
            cap,
            text: String::new(),
            lines: 0,
            clipped: false,
            matched_lines: 0,
        }
    }

    /// Whether one more line may be rendered; records the clip otherwise.
    fn has_room(&mut self) -> bool {
        if self.lines < self.cap {
            return true;
        }
        self.clipped = true;
        false
    }

    fn push_line(&mut self, separator: char, number: Option<u64>, line: &[u8], is_match: bool) {
        self.text.push_str(&self.path);
        self.text.push(separator);
        if let Some(number) = number {
            // Writing into a String cannot fail.
            let _ = write!(self.text, "{number}{separator}");
        }
        let line = strip_line_terminator(line);
        if line.len() <= MAX_LINE_BYTES {
            self.text.push_str(&String::from_utf8_lossy(line));
        } else {
            let focus = if is_match {
                self.matcher.find(line).ok().flatten().map_or(0, |found| found.start())
            } else {
                0
            };
            push_clipped(&mut self.text, line, focus);
        }
        self.text.push('\n');
        self.lines += 1;
    }
}

impl Sink for ContentSink<'_> {
    type Error = io::Error;

    fn matched(&mut self, _searcher: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, io::Error> {
        let mut number = mat.line_number();
        for line in mat.lines() {
            self.matched_lines += 1;
            if self.has_room() {
                self.push_line(':', number, line, true);
            }
            number = number.map(|number| number + 1);
        }
        Ok(!self.cancel.load(Ordering::Relaxed))
    }

    fn context(
        &mut self,
        _searcher: &Searcher,
        context: &SinkContext<'_>,
    ) -> Result<bool, io::Error> {
        if self.has_room() {
            self.push_line('-', context.line_number(), context.bytes(), false);
        }
        Ok(!self.cancel.load(Ordering::Relaxed))
    }

    fn context_break(&mut self, _searcher: &Searcher) -> Result<bool, io::Error> {
        if self.has_room() {
            self.text.push_str("--\n");
            self.lines += 1;
        }
        Ok(!self.cancel.load(Ordering::Relaxed))
    }
}

/// Counts matching lines without rendering anything.
struct CountSink<'a> {
    matched_lines: u64,
    cancel: &'a AtomicBool,
}

impl Sink for CountSink<'_> {
    type Error = io::Error;

    fn matched(&mut self, _searcher: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, io::Error> {
        self.matched_lines += mat.lines().count() as u64;
        Ok(!self.cancel.load(Ordering::Relaxed))
    }
}

/// Stops reading a file at its first match (files_with_matches mode).
struct FirstMatchSink<'a> {
    found: bool,
    cancel: &'a AtomicBool,
}

impl Sink for FirstMatchSink<'_> {
    type Error = io::Error;

    fn matched(&mut self, _searcher: &Searcher, _mat: &SinkMatch<'_>) -> Result<bool, io::Error> {
        self.found = true;
        Ok(false)
    }

    fn context(
        &mut self,
        _searcher: &Searcher,
        _context: &SinkContext<'_>,
    ) -> Result<bool, io::Error> {
        Ok(!self.cancel.load(Ordering::Relaxed))
    }
}

/// A line without its `\n` or `\r\n`.
fn strip_line_terminator(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Appends a window of at most `MAX_LINE_BYTES` of an over-long line, starting a little
/// before `focus` (the match), with `…` where text was cut. The window edges are moved
/// to UTF-8 character boundaries so no character is split.
fn push_clipped(out: &mut String, line: &[u8], focus: usize) {
    let mut start = focus.saturating_sub(CLIP_LEAD_BYTES).min(line.len());
    let mut end = (start + MAX_LINE_BYTES).min(line.len());
    while start > 0 && start < line.len() && is_utf8_continuation(line[start]) {
        start -= 1;
    }
    while end < line.len() && end > start && is_utf8_continuation(line[end]) {
        end -= 1;
    }
    if start > 0 {
        out.push('…');
    }
    out.push_str(&String::from_utf8_lossy(&line[start..end]));
    if end < line.len() {
        out.push_str(&format!("… [{} bytes clipped]", line.len() - (end - start)));
    }
}

fn is_utf8_continuation(byte: u8) -> bool {
    byte & 0b1100_0000 == 0b1000_0000
}

/// The text rendering in path order, cut at `limit` lines (or the session's output
/// byte cap), with a marker when anything was left out.
fn render(found: &Found, mode: OutputMode, max_output_bytes: usize) -> ToolResult {
    let mut content = String::new();
    let mut shown_lines: usize = 0;
    let mut complete_files: u64 = 0;
    let mut cut = false;
    'files: for (idx, hit) in found.hits.iter().enumerate() {
        if found.separate_files && idx > 0 {
            if shown_lines >= found.limit || content.len() + 3 > max_output_bytes {
                cut = true;
                break;
            }
            content.push_str("--\n");
            shown_lines += 1;
        }
        for line in hit.text.split_inclusive('\n') {
            if shown_lines >= found.limit || content.len() + line.len() > max_output_bytes {
                cut = true;
                break 'files;
            }
            content.push_str(line);
            shown_lines += 1;
        }
        if hit.complete {
            complete_files += 1;
        }
    }
    let truncated = cut || complete_files < found.files;
    let unit = if mode == OutputMode::Content { "lines" } else { "files" };
    if found.files == 0 {
        content.push_str("No matches found.\n");
    } else if truncated {
        content.push_str(&format!(
            "[truncated: {shown_lines} {unit} shown; {} files matched; narrow the pattern, \
             path or glob]\n",
            found.files
        ));
    }
    let mut res = ToolResult::success(content)
        .with_meta("count", shown_lines as u64)
        .with_meta("files", found.files)
        .with_meta("truncated", truncated);
    if mode != OutputMode::FilesWithMatches {
        res = res.with_meta("matches", found.matches);
    }
    if found.unreadable > 0 {
        res = res.with_meta("unreadable", found.unreadable);
    }
    if found.withheld > 0 {
        res.content.push_str(&withheld_note(found.withheld));
        res = res.with_meta("withheld", found.withheld);
    }
    res
}

/// The line telling the model that files were left out, and why.
pub(crate) fn withheld_note(withheld: u64) -> String {
    format!(
        "[{withheld} files left out: toolgate's own files, files the read rules deny or ask \
         about, or files with more than one hard link]\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipped_line_shows_a_window_around_the_match() {
        let mut line = "x".repeat(5000);
        line.push_str("NEEDLE");
        line.push_str(&"y".repeat(5000));
        let mut out = String::new();
        push_clipped(&mut out, line.as_bytes(), 5000);
        assert!(out.starts_with('…'));
        assert!(out.contains("NEEDLE"));
        assert!(out.len() < MAX_LINE_BYTES + 64, "{} bytes", out.len());
        assert!(out.ends_with(&format!("[{} bytes clipped]", line.len() - MAX_LINE_BYTES)));
    }

    #[test]
    fn clipped_line_never_splits_a_character() {
        let line = "é".repeat(1000);
        for focus in [0, 1, 101, 999, 1999] {
            let mut out = String::new();
            push_clipped(&mut out, line.as_bytes(), focus);
            assert!(!out.contains('\u{FFFD}'), "focus {focus}: {out}");
        }
    }

    #[test]
    fn line_terminators_are_stripped() {
        assert_eq!(strip_line_terminator(b"abc\r\n"), b"abc");
        assert_eq!(strip_line_terminator(b"abc\n"), b"abc");
        assert_eq!(strip_line_terminator(b"abc"), b"abc");
    }
}
