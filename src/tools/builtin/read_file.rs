//! read_file: shows a file to the model with line numbers, and remembers what was
//! read so that later writes can tell whether the model saw the current content.
//!
//! Output is bounded three ways, each reported honestly rather than silently: a line
//! window (`offset`/`limit`, 2000 lines by default), a cap on the returned text, and
//! a cap on each line's length. A file larger than the session's `max_read_bytes` is
//! not loaded: the window is streamed to, and `max_read_bytes` caps what is returned.
//! Images come back as an attachment (the MCP face turns it into an image block) with
//! a one-line text rendering; other binary files are refused. Jupyter notebooks are
//! shown as numbered cells with their text outputs, image outputs as attachments.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use base64::Engine as _;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::tools::facts::{ClaudeCode, ClaudeTool, PathAccess, PathArgument, Subject};
use crate::tools::fs::{self, FileKind, FileStamp, FsError, shorten, text};
use crate::tools::scratch::Lingering;
use crate::tools::{
    Attachment, DEFAULT_MAX_READ_BYTES, Definition, Env, ErrorType, Facts, Safety, Tool,
    ToolContext, ToolResult, parse_args, schema_for,
};

/// Lines returned when the call gives no `limit`. Enough for most source files in one
/// call, small enough that a huge file does not flood the model's context.
pub const DEFAULT_LINE_LIMIT: usize = 2000;

/// Cap on the returned text, in bytes (line numbers included). 2000 lines of ordinary
/// code are well under it; it only bites on files with very long lines.
pub const MAX_TEXT_BYTES: usize = 256 * 1024;

/// Longest line shown in full, in characters; minified files and data dumps have
/// lines of megabytes that would otherwise eat the whole budget in one line.
pub const MAX_LINE_CHARS: usize = 2000;

/// Largest image returned as an attachment. Model APIs reject bigger images (5 MB is
/// the common limit), and base64 makes the payload a third larger again.
pub const MAX_IMAGE_BYTES: u64 = 5 * 1024 * 1024;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The file to read, relative to the working directory or absolute (inside the roots).
    path: String,
    /// The first line to return, 1-based (0 also means the first line). Default: 1.
    offset: Option<u64>,
    /// How many lines to return. Default: 2000.
    #[schemars(range(min = 1))]
    limit: Option<u64>,
}

struct ReadFile {
    definition: Definition,
}

pub fn tool() -> Arc<dyn Tool> {
    static DESCRIPTION: &str = "Reads a file inside the session roots and returns its \
        lines numbered like `cat -n` (number, tab, text). Use offset and limit to page \
        through long files; the result says which lines were shown out of how many. \
        Images (PNG, JPEG, GIF, WebP) are returned as images. Binary files are refused. \
        Reading a file is required before write_file or edit_file may change it.";
    static DEFINITION: LazyLock<Definition> = LazyLock::new(|| Definition {
        name: "read_file".to_owned(),
        description: DESCRIPTION.to_owned(),
        input_schema: schema_for::<Args>(),
        safety: Safety::ReadOnly,
        system: false,
        timeout: None,
        facts: Facts {
            subject: Subject::Paths(&[PathArgument {
                name: "path",
                default: None,
                access: PathAccess::Read,
            }]),
            edits: false,
            binds_access: true,
            claude_code: ClaudeCode::Tool(ClaudeTool {
                name: "Read",
                aliases: &[],
                fields: &[("path", "file_path")],
            }),
        },
    });
    Arc::new(ReadFile { definition: DEFINITION.clone() })
}

#[async_trait::async_trait]
impl Tool for ReadFile {
    fn definition(&self) -> &Definition {
        &self.definition
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(res) => return res,
        };
        let env = ctx.env.clone();
        // Opening and stat-ing are a few quick syscalls; a small file is read right
        // here, since handing it to the blocking pool would cost more than the read.
        // Anything larger goes to the blocking pool.
        let opened = match open(&env, &args) {
            Ok(opened) => opened,
            Err(err) => return ToolResult::from(err),
        };
        if opened.info.len > env.max_read_bytes {
            // Too large to load: stream to the window instead.
            let cancel = ctx.cancel.clone();
            return fs::blocking(move || window(&env, &args, opened, &cancel))
                .await
                .unwrap_or_else(ToolResult::from);
        }
        if opened.info.len <= INLINE_READ_BYTES {
            return finish(&env, &args, opened).unwrap_or_else(ToolResult::from);
        }
        fs::blocking(move || finish_large(&env, &args, opened))
            .await
            .unwrap_or_else(ToolResult::from)
    }
}

/// Files up to this size are read on the calling task (a local read of this size takes
/// a few microseconds; a thread handoff costs more).
const INLINE_READ_BYTES: u64 = 64 * 1024;

/// A file opened beneath the roots, with what fstat said of it.
struct Opened {
    resolved: fs::Resolved,
    info: fs::FileInfo,
}

fn open(env: &Env, args: &Args) -> Result<Opened, FsError> {
    let resolved = fs::open_read(env, &args.path)?;
    match resolved.kind {
        FileKind::File => {}
        FileKind::Directory => return Err(FsError::IsDirectory(shorten(&args.path))),
        FileKind::Other => return Err(FsError::NotRegularFile(shorten(&args.path))),
    }
    let info = resolved.info;
    Ok(Opened { resolved, info })
}

/// Reads the file and renders it. The bytes go into this thread's scratch buffer,
/// reused from call to call: what is shown is rendered from them, never kept.
fn finish(env: &Env, args: &Args, opened: Opened) -> Result<ToolResult, FsError> {
    crate::tools::scratch::with(&READ_SCRATCH, READ_SCRATCH_KEEP_BYTES, |bytes| {
        finish_with(env, args, opened, bytes)
    })
}

thread_local! {
    static READ_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`finish`] for a file past [`INLINE_READ_BYTES`], read on the blocking pool: its
/// bytes go into the buffer the last large read left, so reads that follow each other
/// write into pages already there rather than fault in a fresh mapping each time (a
/// 10 MiB read took twice as long that way); the buffer is freed once large reads stop
/// coming.
fn finish_large(env: &Env, args: &Args, opened: Opened) -> Result<ToolResult, FsError> {
    let mut bytes = LARGE_READ.take();
    let result = finish_with(env, args, opened, &mut bytes);
    LARGE_READ.give_back(bytes);
    result
}

/// The buffer large reads share: kept up to the default read limit and its page of
/// slack, for as long as reads keep coming within a quarter second of each other.
static LARGE_READ: Lingering =
    Lingering::new(DEFAULT_MAX_READ_BYTES as usize + 4096, Duration::from_millis(250));

/// The most a thread's read buffer keeps between reads: what an inline read takes.
const READ_SCRATCH_KEEP_BYTES: usize = INLINE_READ_BYTES as usize + 4096;

fn finish_with(
    env: &Env,
    args: &Args,
    opened: Opened,
    bytes: &mut Vec<u8>,
) -> Result<ToolResult, FsError> {
    let Opened { resolved, info } = opened;
    let file = std::fs::File::from(resolved.fd);
    fs::read_snapshot_into(file, &info, env.max_read_bytes, &args.path, bytes)?;
    let bytes = &bytes[..];
    // Recorded for every outcome below, binary included: the session has seen what
    // the file is, which is what a later overwrite needs to know.
    env.files.record_at(&resolved.path, FileStamp::of(&info, bytes));
    // The path's own text when it is UTF-8 (nearly always), not a copy of it.
    let shown_path = resolved
        .path
        .into_os_string()
        .into_string()
        .unwrap_or_else(|raw| std::path::Path::new(&raw).display().to_string());
    if args.path.ends_with(".ipynb")
        && let Some((text, attachments, cells)) = super::notebook_edit::render(bytes)
    {
        return Ok(notebook_result(text, attachments, cells, shown_path, info.len));
    }
    if let Some(image) = sniff_image(bytes) {
        return Ok(image_result(&args.path, &shown_path, bytes, &image));
    }
    let decoded = match text::decode(bytes) {
        Ok(decoded) => decoded,
        Err(not_text) => {
            return Ok(ToolResult::failure(
                ErrorType::BinaryFile,
                format!("{} cannot be shown as text: {not_text}", shorten(&args.path)),
            )
            .with_meta("path", shown_path)
            .with_meta("bytes", info.len));
        }
    };
    Ok(render(&decoded, args, shown_path, info.len))
}

/// A notebook's rendering, capped like any text.
fn notebook_result(
    mut text: String,
    attachments: Vec<Attachment>,
    cells: usize,
    shown_path: String,
    len: u64,
) -> ToolResult {
    let truncated = text.len() > MAX_TEXT_BYTES;
    if truncated {
        let mut end = MAX_TEXT_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let left_out = text.len() - end;
        text.truncate(end);
        text.push_str(&format!("\n\n[truncated: {left_out} more bytes of the notebook]"));
    }
    let mut res = ToolResult::success(text)
        .with_meta("path", shown_path)
        .with_meta("notebook", true)
        .with_meta("cells", cells)
        .with_meta("truncated", truncated)
        .with_meta("bytes", len);
    for attachment in attachments {
        res = res.with_attachment(attachment);
    }
    res
}

/// Bytes read per system call while streaming to a window.
const STREAM_CHUNK_BYTES: usize = 1024 * 1024;

/// Reads the `offset`/`limit` window of a file larger than `max_read_bytes` without
/// loading it: lines before the window are counted as they stream past (never kept),
/// the window's lines are collected, and reading stops at the window's end. What is
/// returned is capped by `max_read_bytes` (and the usual text cap); the lines after
/// the window are not counted, so the total is reported only when the window reached
/// the end. UTF-8 only (a UTF-16 file of this size is refused as too large).
fn window(
    env: &Env,
    args: &Args,
    opened: Opened,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<ToolResult, FsError> {
    use std::io::Read as _;

    let Opened { resolved, info } = opened;
    let shown_path = resolved.path.display().to_string();
    let mut file = std::fs::File::from(resolved.fd);
    let start = usize::try_from(args.offset.unwrap_or(1).max(1)).unwrap_or(usize::MAX);
    let limit =
        args.limit.map_or(DEFAULT_LINE_LIMIT, |limit| usize::try_from(limit).unwrap_or(usize::MAX));
    let budget = MAX_TEXT_BYTES.min(usize::try_from(env.max_read_bytes).unwrap_or(usize::MAX));
    // Bytes kept of one line: enough for MAX_LINE_CHARS characters of any width.
    let line_keep = (MAX_LINE_CHARS * 4).min(budget);

    let mut chunk = vec![0u8; STREAM_CHUNK_BYTES];
    let mut line_no = 1usize;
    let mut first_chunk = true;
    let mut current: Vec<u8> = Vec::new();
    // Characters of the current line beyond what was kept.
    let mut current_dropped = 0usize;
    let mut lines: Vec<(String, usize)> = Vec::new();
    let mut used = 0usize;
    let mut hit_byte_cap = false;
    let mut at_eof = false;
    let mut bytes_read: u64 = 0;
    'read: loop {
        if cancel.is_cancelled() {
            return Ok(ToolResult::failure(ErrorType::Canceled, "the call was canceled"));
        }
        let n = match file.read(&mut chunk) {
            Ok(0) => {
                at_eof = true;
                break;
            }
            Ok(n) => n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(FsError::from_io(&args.path, err)),
        };
        bytes_read += n as u64;
        let mut data = &chunk[..n];
        if first_chunk {
            first_chunk = false;
            if data.starts_with(&[0xFF, 0xFE]) || data.starts_with(&[0xFE, 0xFF]) {
                return Err(FsError::TooLarge(format!(
                    "{} is a UTF-16 file larger than the read limit of {} bytes; only UTF-8 \
                     files that large are read by window",
                    shorten(&args.path),
                    env.max_read_bytes
                )));
            }
            let sniffed = &data[..data.len().min(text::BINARY_SNIFF_BYTES)];
            if memchr::memchr(0, sniffed).is_some() {
                env.files.record(resolved.path.clone(), large_stamp(&info));
                return Ok(ToolResult::failure(
                    ErrorType::BinaryFile,
                    format!(
                        "{} cannot be shown as text: the file looks binary (it contains NUL bytes)",
                        shorten(&args.path)
                    ),
                )
                .with_meta("path", shown_path)
                .with_meta("bytes", info.len));
            }
            data = data.strip_prefix(&[0xEF, 0xBB, 0xBF][..]).unwrap_or(data);
        }
        while !data.is_empty() {
            let newline = memchr::memchr(b'\n', data);
            if line_no < start {
                match newline {
                    Some(at) => {
                        line_no += 1;
                        data = &data[at + 1..];
                    }
                    None => break,
                }
                continue;
            }
            let (part, rest, ended) = match newline {
                Some(at) => (&data[..at], &data[at + 1..], true),
                None => (data, &data[data.len()..], false),
            };
            let room = line_keep.saturating_sub(current.len());
            let kept = part.len().min(room);
            current.extend_from_slice(&part[..kept]);
            current_dropped += count_chars(&part[kept..]);
            data = rest;
            if ended {
                let (line, dropped) = finish_line(&mut current, &mut current_dropped);
                let cost = number_width(line_no) + 2 + line.len() + 48;
                if used + cost > budget && !lines.is_empty() {
                    hit_byte_cap = true;
                    break 'read;
                }
                used += cost;
                lines.push((line, dropped));
                line_no += 1;
                if lines.len() >= limit {
                    break 'read;
                }
            }
        }
    }
    if at_eof && line_no >= start && (!current.is_empty() || current_dropped > 0) {
        let (line, dropped) = finish_line(&mut current, &mut current_dropped);
        lines.push((line, dropped));
        line_no += 1;
    }
    env.files.record(resolved.path, large_stamp(&info));

    let shown = lines.len();
    let mut content = String::with_capacity(used + 128);
    let mut cut_lines = 0usize;
    for (idx, (line, dropped)) in (start..).zip(&lines) {
        if idx > start {
            content.push('\n');
        }
        push_line_number(&mut content, idx);
        content.push('\t');
        // The returned text stays within the budget even for a single huge line.
        let room = budget.saturating_sub(content.len() + 48);
        let (line, extra) = match line.char_indices().nth(MAX_LINE_CHARS) {
            _ if line.len() > room => {
                let mut end = room;
                while !line.is_char_boundary(end) {
                    end -= 1;
                }
                (&line[..end], dropped + line[end..].chars().count())
            }
            Some((at, _)) => (&line[..at], dropped + line[at..].chars().count()),
            None => (line.as_str(), *dropped),
        };
        content.push_str(line);
        if extra > 0 {
            cut_lines += 1;
            content.push_str(&format!("… [line cut: {extra} more characters]"));
        }
    }
    // Lines counted so far: exact when the end was reached.
    let total = at_eof.then(|| line_no - 1);
    let end = start + shown - usize::from(shown > 0);
    let more_after = !at_eof || (hit_byte_cap && shown > 0);
    let mut notes: Vec<String> = Vec::new();
    match total {
        Some(total) if start > total => notes
            .push(format!("[offset {start} is past the end of the file, which has {total} lines]")),
        _ if shown > 0 && more_after => notes.push(format!(
            "[window: lines {start}-{end} of a file of {} bytes, too large to read whole; read \
             on with offset={}]",
            info.len,
            end + 1
        )),
        _ => {}
    }
    if cut_lines > 0 {
        notes.push(format!("[{cut_lines} line(s) were cut to fit]"));
    }
    for note in notes {
        if !content.is_empty() {
            content.push_str("\n\n");
        }
        content.push_str(&note);
    }
    let mut res = ToolResult::success(content)
        .with_meta("path", shown_path)
        .with_meta("start_line", start)
        .with_meta("lines_shown", shown)
        .with_meta("truncated", more_after || cut_lines > 0)
        .with_meta("bytes", info.len)
        .with_meta("bytes_read", bytes_read)
        .with_meta("encoding", "utf-8")
        .with_meta("windowed", true);
    if let Some(total) = total {
        res = res.with_meta("total_lines", total);
    }
    Ok(res)
}

/// What a session saw of a file too large to hash: its size and mtime.
fn large_stamp(info: &fs::FileInfo) -> FileStamp {
    FileStamp { modified: info.modified, len: info.len, hash: None }
}

/// UTF-8 characters in bytes (counting lead bytes; invalid bytes count as one each).
fn count_chars(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&byte| byte & 0xC0 != 0x80).count()
}

/// The collected line as text (CR of a CRLF ending dropped) and its dropped count.
fn finish_line(current: &mut Vec<u8>, dropped: &mut usize) -> (String, usize) {
    if *dropped == 0 && current.last() == Some(&b'\r') {
        current.pop();
    }
    let line = String::from_utf8_lossy(current).into_owned();
    current.clear();
    (line, std::mem::take(dropped))
}

/// Numbers and windows the text, with every cap applied and reported.
fn render(decoded: &text::Decoded, args: &Args, shown_path: String, len: u64) -> ToolResult {
    let total = count_lines(&decoded.text);
    let start = usize::try_from(args.offset.unwrap_or(1).max(1)).unwrap_or(usize::MAX);
    let limit =
        args.limit.map_or(DEFAULT_LINE_LIMIT, |limit| usize::try_from(limit).unwrap_or(usize::MAX));

    let whole =
        (start == 1 && total <= limit).then(|| number_whole(&decoded.text, total)).flatten();
    // A text the one pass took holds no carriage return: its line endings are LF
    // without looking again.
    let crlf = whole.is_none() && text::uses_crlf(&decoded.text);
    let Numbered { mut content, shown, cut_lines, hit_byte_cap } = match whole {
        Some(content) => Numbered { content, shown: total, cut_lines: 0, hit_byte_cap: false },
        None => number_window(&decoded.text, start, limit, total),
    };
    let end = start + shown - usize::from(shown > 0);
    let more_after = shown > 0 && end < total;
    let truncated = more_after || cut_lines > 0 || hit_byte_cap;

    let mut notes: Vec<String> = Vec::new();
    if total == 0 {
        notes.push("[the file is empty]".to_owned());
    } else if start > total {
        notes
            .push(format!("[offset {start} is past the end of the file, which has {total} lines]"));
    } else if more_after {
        let why = if hit_byte_cap {
            format!(" (output capped at {} KiB)", MAX_TEXT_BYTES / 1024)
        } else {
            String::new()
        };
        notes.push(format!(
            "[truncated: showing lines {start}-{end} of {total}{why}; read on with offset={}]",
            end + 1
        ));
    } else if shown == 0 {
        // Not even the first line fitted in the byte cap (impossible with the line
        // cap as set, kept so no combination of limits yields a silent empty result).
        notes.push(format!("[line {start} is too long to show]"));
    }
    if cut_lines > 0 {
        notes.push(format!(
            "[{cut_lines} line(s) longer than {MAX_LINE_CHARS} characters were cut]"
        ));
    }
    if decoded.lossy {
        notes.push(format!(
            "[the file is not valid {}; undecodable bytes are shown as U+FFFD]",
            decoded.encoding.as_str()
        ));
    }
    for note in notes {
        if !content.is_empty() {
            content.push_str("\n\n");
        }
        content.push_str(&note);
    }

    // In key order, the order they are kept in: each goes on the end.
    let mut res = ToolResult::success(content)
        .with_meta("bytes", len)
        .with_meta("encoding", decoded.encoding.as_str())
        .with_meta("line_endings", if crlf { "crlf" } else { "lf" })
        .with_meta("lines_shown", shown);
    if decoded.lossy {
        res = res.with_meta("lossy", true);
    }
    res.with_meta("path", shown_path)
        .with_meta("start_line", start)
        .with_meta("total_lines", total)
        .with_meta("truncated", truncated)
}

/// Splits text into lines without their terminators (`\n` or `\r\n`); a final
/// newline does not start an extra empty line, as with `cat -n` and `wc -l`.
fn split_lines(text: &str) -> impl Iterator<Item = &str> {
    let body = text.strip_suffix('\n').unwrap_or(text);
    let mut newlines = memchr::memchr_iter(b'\n', body.as_bytes());
    let mut start = (!text.is_empty()).then_some(0);
    std::iter::from_fn(move || {
        let from = start?;
        let line = match newlines.next() {
            Some(end) => {
                start = Some(end + 1);
                &body[from..end]
            }
            None => {
                start = None;
                &body[from..]
            }
        };
        Some(line.strip_suffix('\r').unwrap_or(line))
    })
}

/// Lines numbered by [`render`]: the text and what it shows.
struct Numbered {
    content: String,
    shown: usize,
    /// Lines cut to [`MAX_LINE_CHARS`].
    cut_lines: usize,
    /// The text reached [`MAX_TEXT_BYTES`] before the window's end.
    hit_byte_cap: bool,
}

/// The window of `limit` lines from line `start` (1-based) of a text of `total`
/// lines, numbered like `cat -n`, long lines cut and the whole capped.
fn number_window(text: &str, start: usize, limit: usize, total: usize) -> Numbered {
    let mut content = String::with_capacity(text.len().min(MAX_TEXT_BYTES) + total * 8);
    let mut shown = 0usize;
    let mut cut_lines = 0usize;
    let mut hit_byte_cap = false;
    if start <= total {
        let window = split_lines(text).skip(start - 1).take(limit);
        for (idx, line) in (start..).zip(window) {
            let (line, cut) = cap_line(line);
            let note = cut.map(|extra| format!("… [line cut: {extra} more characters]"));
            let numbered_len =
                number_width(idx) + 1 + line.len() + note.as_ref().map_or(0, String::len);
            if content.len() + numbered_len + 1 > MAX_TEXT_BYTES {
                hit_byte_cap = true;
                break;
            }
            if shown > 0 {
                content.push('\n');
            }
            push_line_number(&mut content, idx);
            content.push('\t');
            content.push_str(line);
            if let Some(note) = note {
                cut_lines += 1;
                content.push_str(&note);
            }
            shown += 1;
        }
    }
    Numbered { content, shown, cut_lines, hit_byte_cap }
}

/// The whole text numbered, in one pass, when nothing in it needs [`number_window`]'s
/// care: at least one line and fewer than 100,000 (so every number fits its six
/// columns), no carriage return, no line longer than [`MAX_LINE_CHARS`] bytes, and
/// the numbered text within [`MAX_TEXT_BYTES`]. The same text [`number_window`]
/// makes of the whole file (the tests compare them), for nearly every source file.
fn number_whole(text: &str, total: usize) -> Option<String> {
    /// A line number and its tab, as [`number_window`] writes them below 10^6.
    const PREFIX: usize = 7;
    let body = text.strip_suffix('\n').unwrap_or(text);
    if total == 0
        || total >= 100_000
        || body.len() + PREFIX * total + 1 > MAX_TEXT_BYTES
        || memchr::memchr(b'\r', body.as_bytes()).is_some()
    {
        return None;
    }
    let mut content: Vec<u8> = Vec::with_capacity(body.len() + PREFIX * total);
    // Each line after the first starts with the line break before it, its number and
    // its tab, written as one piece of constant size. The number counts up in place,
    // digit by digit, as an odometer does.
    let mut number = *b"\n     1\t";
    content.extend_from_slice(&number[1..]);
    let mut from = 0;
    for end in memchr::memchr_iter(b'\n', body.as_bytes()).chain([body.len()]) {
        if from > 0 {
            let mut at = PREFIX - 1;
            loop {
                match number[at] {
                    b'9' => {
                        number[at] = b'0';
                        at -= 1;
                        // Past the sixth column: impossible below 100,000 lines.
                        if at == 0 {
                            return None;
                        }
                    }
                    b' ' => {
                        number[at] = b'1';
                        break;
                    }
                    digit => {
                        number[at] = digit + 1;
                        break;
                    }
                }
            }
            content.extend_from_slice(&number);
        }
        let line = &body.as_bytes()[from..end];
        if line.len() > MAX_LINE_CHARS {
            return None;
        }
        content.extend_from_slice(line);
        from = end + 1;
    }
    // Lines cut from a `str` at line breaks, and ASCII between them.
    String::from_utf8(content).ok()
}

/// How many lines [`split_lines`] yields.
fn count_lines(text: &str) -> usize {
    if text.is_empty() {
        return 0;
    }
    let body = text.strip_suffix('\n').unwrap_or(text);
    memchr::memchr_iter(b'\n', body.as_bytes()).count() + 1
}

/// Columns a line number takes: right-aligned in six, as `cat -n` prints it (wider
/// numbers simply take more room).
fn number_width(number: usize) -> usize {
    let digits = number.checked_ilog10().map_or(1, |log| log as usize + 1);
    digits.max(6)
}

/// Appends a line number right-aligned in six columns, without allocating.
fn push_line_number(out: &mut String, number: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = number;
    loop {
        at -= 1;
        digits[at] = b'0' + u8::try_from(rest % 10).unwrap_or(0);
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let digits = &digits[at..];
    // The padding in one copy and the digits as characters: pushing the spaces one
    // by one and checking the digits as UTF-8 text cost half as much again per line.
    out.push_str(&LINE_NUMBER_PAD[..6usize.saturating_sub(digits.len())]);
    for &digit in digits {
        out.push(char::from(digit));
    }
}

/// The most padding a line number gets (six columns).
const LINE_NUMBER_PAD: &str = "      ";

/// A line cut to [`MAX_LINE_CHARS`], with the number of characters left out.
fn cap_line(line: &str) -> (&str, Option<usize>) {
    // A line of at most MAX_LINE_CHARS bytes has at most that many characters: the
    // common case needs no counting.
    if line.len() <= MAX_LINE_CHARS {
        return (line, None);
    }
    match line.char_indices().nth(MAX_LINE_CHARS) {
        None => (line, None),
        Some((byte_idx, _)) => {
            let rest = line[byte_idx..].chars().count();
            (&line[..byte_idx], Some(rest))
        }
    }
}

// ---------------------------------------------------------------------------------
// Images.

/// An image recognised by its magic bytes, with its size when the header gives it.
#[derive(Debug, PartialEq, Eq)]
struct Image {
    mime_type: &'static str,
    dimensions: Option<(u32, u32)>,
}

fn image_result(path: &str, shown_path: &str, bytes: &[u8], image: &Image) -> ToolResult {
    let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if len > MAX_IMAGE_BYTES {
        return ToolResult::failure(
            ErrorType::TooLarge,
            format!(
                "{} is a {} image of {len} bytes; images larger than {MAX_IMAGE_BYTES} bytes \
                 are not returned",
                shorten(path),
                image.mime_type
            ),
        )
        .with_meta("path", shown_path)
        .with_meta("bytes", len);
    }
    let dims = image.dimensions.map(|(width, height)| format!(", {width}x{height}"));
    let content = format!("[image: {}, {len} bytes{}]", image.mime_type, dims.unwrap_or_default());
    let mut res = ToolResult::success(content)
        .with_meta("path", shown_path)
        .with_meta("bytes", len)
        .with_meta("mime_type", image.mime_type)
        .with_attachment(Attachment::Image {
            mime_type: image.mime_type.to_owned(),
            data: base64::engine::general_purpose::STANDARD.encode(bytes),
        });
    if let Some((width, height)) = image.dimensions {
        res = res.with_meta("width", width).with_meta("height", height);
    }
    res
}

fn sniff_image(bytes: &[u8]) -> Option<Image> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        // The IHDR chunk comes first: width and height, big-endian, at 16 and 20.
        let dimensions = match (be32(bytes, 16), be32(bytes, 20)) {
            (Some(width), Some(height)) if bytes.get(12..16) == Some(b"IHDR") => {
                Some((width, height))
            }
            _ => None,
        };
        return Some(Image { mime_type: "image/png", dimensions });
    }
    if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        let dimensions =
            le16(bytes, 6).zip(le16(bytes, 8)).map(|(w, h)| (u32::from(w), u32::from(h)));
        return Some(Image { mime_type: "image/gif", dimensions });
    }
    if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        return Some(Image { mime_type: "image/jpeg", dimensions: jpeg_dimensions(bytes) });
    }
    if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        return Some(Image { mime_type: "image/webp", dimensions: webp_dimensions(bytes) });
    }
    None
}

/// Walks the JPEG marker segments up to the first start-of-frame, which holds the
/// height and width.
fn jpeg_dimensions(bytes: &[u8]) -> Option<(u32, u32)> {
    let mut pos = 2;
    while pos + 4 <= bytes.len() {
        if bytes[pos] != 0xFF {
            return None;
        }
        let marker = bytes[pos + 1];
        if marker == 0xFF {
            // Fill byte.
            pos += 1;
            continue;
        }
        if marker == 0x01 || (0xD0..=0xD9).contains(&marker) {
            // Markers without a length.
            pos += 2;
            continue;
        }
        let segment_len = usize::from(be16(bytes, pos + 2)?);
        let is_frame = (0xC0..=0xCF).contains(&marker) && ![0xC4, 0xC8, 0xCC].contains(&marker);
        if is_frame {
            let height = be16(bytes, pos + 5)?;
            let width = be16(bytes, pos + 7)?;
            return Some((u32::from(width), u32::from(height)));
        }
        pos += 2 + segment_len;
    }
    None
}

/// The three WebP flavours keep their size in different places.
fn webp_dimensions(bytes: &[u8]) -> Option<(u32, u32)> {
    let chunk = bytes.get(12..16)?;
    match chunk {
        b"VP8 " => {
            // Lossy: a key frame header, then 14-bit width and height.
            if bytes.get(23..26)? != [0x9D, 0x01, 0x2A] {
                return None;
            }
            let width = le16(bytes, 26)? & 0x3FFF;
            let height = le16(bytes, 28)? & 0x3FFF;
            Some((u32::from(width), u32::from(height)))
        }
        b"VP8L" => {
            // Lossless: a signature byte, then width-1 and height-1 in 14 bits each.
            if *bytes.get(20)? != 0x2F {
                return None;
            }
            let bits = u32::from_le_bytes(bytes.get(21..25)?.try_into().ok()?);
            Some(((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1))
        }
        b"VP8X" => {
            // Extended: canvas width-1 and height-1 in 24 bits each.
            let width = le24(bytes, 24)? + 1;
            let height = le24(bytes, 27)? + 1;
            Some((width, height))
        }
        _ => None,
    }
}

fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn be32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn le16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn le24(bytes: &[u8], at: usize) -> Option<u32> {
    let raw = bytes.get(at..at + 3)?;
    Some(u32::from(raw[0]) | (u32::from(raw[1]) << 8) | (u32::from(raw[2]) << 16))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_like_cat() {
        let cases: [(&str, &[&str]); 6] = [
            ("", &[]),
            ("a", &["a"]),
            ("a\n", &["a"]),
            ("a\n\n", &["a", ""]),
            ("a\r\nb\r\n", &["a", "b"]),
            ("\n", &[""]),
        ];
        for (text, lines) in cases {
            assert_eq!(split_lines(text).collect::<Vec<_>>(), lines, "{text:?}");
            assert_eq!(count_lines(text), lines.len(), "{text:?}");
        }
    }

    #[test]
    fn line_numbers_are_right_aligned_in_six_columns_like_cat() {
        for number in [0, 1, 9, 10, 99_999, 100_000, 999_999, 1_000_000, usize::MAX] {
            let mut out = String::new();
            push_line_number(&mut out, number);
            assert_eq!(out, format!("{number:>6}"));
            assert_eq!(number_width(number), out.len(), "{number}");
        }
    }

    /// The one-pass numbering of a whole file is the general loop's text, wherever
    /// the numbers gain a digit, and declines what only the loop handles.
    #[test]
    fn a_whole_file_is_numbered_in_one_pass_as_the_window_loop_numbers_it() {
        let same = |text: &str| {
            let total = count_lines(text);
            let whole = number_whole(text, total).expect("taken in one pass");
            let window = number_window(text, 1, usize::MAX, total);
            assert_eq!(whole, window.content, "{text:?}");
            assert_eq!(window.shown, total);
            assert!(!window.hit_byte_cap && window.cut_lines == 0);
        };
        for lines in [1, 2, 9, 10, 11, 99, 100, 101, 1000, 10_000] {
            let text: String = (0..lines).map(|n| format!("line {n} é\n")).collect();
            same(&text);
            same(text.trim_end_matches('\n'));
        }
        same("\n");
        same("\n\n\ttabbed\n\n");
        // As many lines as the byte cap allows.
        same(&"\n".repeat(MAX_TEXT_BYTES / 8));
        same(&"x".repeat(MAX_LINE_CHARS));

        // What needs the loop's care is left to it.
        let declined = |text: &str| assert_eq!(number_whole(text, count_lines(text)), None);
        declined("");
        declined("a\r\nb\r\n");
        declined(&format!("short\n{}\n", "x".repeat(MAX_LINE_CHARS + 1)));
        declined(&"\n".repeat(100_000));
        declined(&"y\n".repeat(MAX_TEXT_BYTES / 8));
    }

    proptest::proptest! {
        #[test]
        fn any_text_the_one_pass_takes_comes_out_as_the_loop_makes_it(
            lines in proptest::collection::vec("[a-z \t\"é\\\\]{0,40}", 0..300),
            trailing_newline: bool,
        ) {
            let mut text = lines.join("\n");
            if trailing_newline {
                text.push('\n');
            }
            let total = count_lines(&text);
            if let Some(whole) = number_whole(&text, total) {
                proptest::prop_assert_eq!(whole, number_window(&text, 1, usize::MAX, total).content);
            } else {
                proptest::prop_assert_eq!(total, 0);
            }
        }
    }

    #[test]
    fn long_lines_are_cut_on_char_boundaries() {
        let line = "é".repeat(MAX_LINE_CHARS + 5);
        let (kept, cut) = cap_line(&line);
        assert_eq!(kept.chars().count(), MAX_LINE_CHARS);
        assert_eq!(cut, Some(5));
        assert_eq!(cap_line("short"), ("short", None));
    }

    #[test]
    fn image_headers_give_dimensions() {
        // GIF: logical screen width and height, little-endian.
        let gif = b"GIF89a\x20\x00\x10\x00\x80\x00\x00";
        assert_eq!(
            sniff_image(gif),
            Some(Image { mime_type: "image/gif", dimensions: Some((32, 16)) })
        );
        // JPEG: an APP0 segment, then SOF0 with height 3, width 5.
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x04, 0x00, 0x00];
        jpeg.extend_from_slice(&[0xFF, 0xC0, 0x00, 0x0B, 0x08, 0x00, 0x03, 0x00, 0x05, 0x01]);
        assert_eq!(
            sniff_image(&jpeg),
            Some(Image { mime_type: "image/jpeg", dimensions: Some((5, 3)) })
        );
        // WebP VP8X: canvas 640x480 stored minus one.
        let mut webp = b"RIFF\x00\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00\x00\x00\x00\x00".to_vec();
        webp.extend_from_slice(&[0x7F, 0x02, 0x00, 0xDF, 0x01, 0x00]);
        assert_eq!(
            sniff_image(&webp),
            Some(Image { mime_type: "image/webp", dimensions: Some((640, 480)) })
        );
        assert_eq!(sniff_image(b"plain text"), None);
    }
}
