//! Reading a patch: Codex's envelope (`*** Begin Patch` … `*** End Patch`) or unified
//! diffs as `git diff`, `git format-patch` and `diff -u` write them.
//!
//! Both become the same list of [`FileOp`]s, in the order the patch gives them; a path
//! may appear more than once (a `format-patch` series touching a file twice), and the
//! operations apply one after the other.

use std::fmt;

/// One change to one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileOp {
    /// A new file with this content (which ends in a newline unless the patch said
    /// otherwise).
    Add { path: String, content: String },
    /// The file is removed. With hunks (a unified diff lists the removed lines), they
    /// must match the whole current content.
    Delete { path: String, hunks: Vec<Hunk> },
    /// Hunks applied in order, then optionally a rename.
    Update { path: String, move_to: Option<String>, hunks: Vec<Hunk> },
}

impl FileOp {
    /// Every path the operation names (a rename names two).
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        let (first, second) = match self {
            FileOp::Add { path, .. } | FileOp::Delete { path, .. } => (path.as_str(), None),
            FileOp::Update { path, move_to, .. } => (path.as_str(), move_to.as_deref()),
        };
        std::iter::once(first).chain(second)
    }
}

/// One line of a hunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line {
    Context(String),
    Remove(String),
    Add(String),
}

/// One hunk: the lines it expects (context and removals, in order) and what replaces
/// them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hunk {
    /// The 1-based line the old side starts at, when the patch says (unified diffs):
    /// the match nearest to it wins when the context occurs more than once.
    pub old_start: Option<usize>,
    /// Codex's `@@ text`: the hunk applies after the first line equal to it.
    pub anchor: Option<String>,
    pub lines: Vec<Line>,
    /// The hunk must match at the end of the file (Codex's `*** End of File`).
    pub at_end: bool,
    /// `\ No newline at end of file` after the old side's last line.
    pub old_no_newline: bool,
    /// `\ No newline at end of file` after the new side's last line.
    pub new_no_newline: bool,
}

impl Hunk {
    /// The lines the file must contain.
    pub fn old_lines(&self) -> Vec<&str> {
        self.lines
            .iter()
            .filter_map(|line| match line {
                Line::Context(text) | Line::Remove(text) => Some(text.as_str()),
                Line::Add(_) => None,
            })
            .collect()
    }

    pub fn added(&self) -> usize {
        self.lines.iter().filter(|line| matches!(line, Line::Add(_))).count()
    }

    pub fn removed(&self) -> usize {
        self.lines.iter().filter(|line| matches!(line, Line::Remove(_))).count()
    }
}

/// Why a patch could not be read: the line (1-based) and what was expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {} of the patch: {}", self.line, self.message)
    }
}

fn error(line: usize, message: impl Into<String>) -> ParseError {
    ParseError { line: line + 1, message: message.into() }
}

/// Reads a patch in either format.
pub fn parse(patch: &str) -> Result<Vec<FileOp>, ParseError> {
    let lines: Vec<&str> =
        patch.split('\n').map(|line| line.strip_suffix('\r').unwrap_or(line)).collect();
    let mut start = lines.iter().position(|line| !line.trim().is_empty()).unwrap_or(0);
    let mut end = lines.len();
    // A patch pasted as a shell heredoc (`apply_patch <<'EOF'` … `EOF`).
    if lines.get(start).is_some_and(|line| line.trim_start().starts_with("<<")) {
        start += 1;
        while end > start && lines[end - 1].trim().is_empty() {
            end -= 1;
        }
        if end > start && lines[end - 1].trim().trim_matches(['\'', '"']) == "EOF" {
            end -= 1;
        }
    }
    let body = &lines[start..end];
    let ops = if body.first().is_some_and(|line| line.trim() == BEGIN) {
        parse_codex(body, start)?
    } else {
        parse_unified(body, start)?
    };
    if ops.is_empty() {
        return Err(error(start, "the patch changes no file"));
    }
    Ok(ops)
}

// ---------------------------------------------------------------------------------
// Codex's format.

const BEGIN: &str = "*** Begin Patch";
const END: &str = "*** End Patch";
const ADD: &str = "*** Add File: ";
const DELETE: &str = "*** Delete File: ";
const UPDATE: &str = "*** Update File: ";
const MOVE: &str = "*** Move to: ";
const END_OF_FILE: &str = "*** End of File";

fn parse_codex(lines: &[&str], base: usize) -> Result<Vec<FileOp>, ParseError> {
    let mut ops = Vec::new();
    let mut at = 1;
    let mut ended = false;
    while at < lines.len() {
        let line = lines[at];
        let trimmed = line.trim();
        if trimmed == END {
            ended = true;
            break;
        }
        if let Some(path) = line.strip_prefix(ADD) {
            at += 1;
            let mut content = String::new();
            while at < lines.len() && !lines[at].starts_with("*** ") {
                match lines[at].strip_prefix('+') {
                    Some(text) => {
                        content.push_str(text);
                        content.push('\n');
                    }
                    None if lines[at].is_empty() && at + 1 == lines.len() => {}
                    None => {
                        return Err(error(
                            base + at,
                            "every line of an added file starts with `+`",
                        ));
                    }
                }
                at += 1;
            }
            ops.push(FileOp::Add { path: path_arg(path, base + at)?, content });
            continue;
        }
        if let Some(path) = line.strip_prefix(DELETE) {
            ops.push(FileOp::Delete { path: path_arg(path, base + at)?, hunks: Vec::new() });
            at += 1;
            continue;
        }
        if let Some(path) = line.strip_prefix(UPDATE) {
            let path = path_arg(path, base + at)?;
            at += 1;
            let mut move_to = None;
            if let Some(dest) = lines.get(at).and_then(|line| line.strip_prefix(MOVE)) {
                move_to = Some(path_arg(dest, base + at)?);
                at += 1;
            }
            let mut hunks: Vec<Hunk> = Vec::new();
            while at < lines.len() {
                let line = lines[at];
                if line.trim() == END_OF_FILE {
                    match hunks.last_mut() {
                        Some(hunk) => hunk.at_end = true,
                        None => return Err(error(base + at, "`*** End of File` before any hunk")),
                    }
                    at += 1;
                    continue;
                }
                if line.starts_with("*** ") {
                    break;
                }
                if let Some(rest) = line.strip_prefix("@@") {
                    let anchor = rest.trim();
                    hunks.push(Hunk {
                        anchor: (!anchor.is_empty()).then(|| anchor.to_owned()),
                        ..Hunk::default()
                    });
                    at += 1;
                    continue;
                }
                if hunks.is_empty() {
                    // Codex lets the first hunk of a file start without `@@`.
                    hunks.push(Hunk::default());
                }
                let hunk = hunks.last_mut().ok_or_else(|| error(base + at, "no hunk"))?;
                let parsed = match line.chars().next() {
                    Some(' ') => Line::Context(line[1..].to_owned()),
                    Some('-') => Line::Remove(line[1..].to_owned()),
                    Some('+') => Line::Add(line[1..].to_owned()),
                    // An empty line inside a hunk is an empty context line whose
                    // leading space was lost on the way.
                    None => Line::Context(String::new()),
                    Some(_) => {
                        return Err(error(
                            base + at,
                            format!(
                                "expected a hunk line starting with ' ', '-' or '+', or a \
                                 `*** ` header, found {:?}",
                                clip(line)
                            ),
                        ));
                    }
                };
                hunk.lines.push(parsed);
                at += 1;
            }
            // Blank lines ending a hunk are separators before the next header more
            // often than context; dropping unchanged context only loosens the match.
            for hunk in &mut hunks {
                while matches!(hunk.lines.last(), Some(Line::Context(text)) if text.is_empty()) {
                    hunk.lines.pop();
                }
            }
            hunks.retain(|hunk| !hunk.lines.is_empty());
            if hunks.is_empty() && move_to.is_none() {
                return Err(error(base + at, format!("the update of {path} has no hunks")));
            }
            ops.push(FileOp::Update { path, move_to, hunks });
            continue;
        }
        if trimmed.is_empty() {
            at += 1;
            continue;
        }
        return Err(error(
            base + at,
            format!(
                "expected `*** Add File: `, `*** Delete File: `, `*** Update File: ` or `{END}`, \
                 found {:?}",
                clip(line)
            ),
        ));
    }
    if !ended {
        return Err(error(
            base + lines.len().saturating_sub(1),
            format!("the patch has no `{END}` line"),
        ));
    }
    Ok(ops)
}

fn path_arg(raw: &str, line: usize) -> Result<String, ParseError> {
    let path = raw.trim();
    if path.is_empty() {
        return Err(error(line, "a file header names no path"));
    }
    Ok(path.to_owned())
}

fn clip(line: &str) -> String {
    match line.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_owned(),
    }
}

// ---------------------------------------------------------------------------------
// Unified diffs.

/// What a `diff --git` header (and its extended lines) said about one file.
#[derive(Debug, Default)]
struct Header {
    old: Option<String>,
    new: Option<String>,
    rename_from: Option<String>,
    rename_to: Option<String>,
    new_file: bool,
    deleted: bool,
    /// The names from the `diff --git a/x b/y` line, for headers without `---`/`+++`.
    git_names: Option<(String, String)>,
}

fn parse_unified(lines: &[&str], base: usize) -> Result<Vec<FileOp>, ParseError> {
    let mut ops = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at];
        let starts_git = line.starts_with("diff --git ");
        let starts_plain = line.starts_with("--- ")
            && lines.get(at + 1).is_some_and(|next| next.starts_with("+++ "));
        if !starts_git && !starts_plain {
            // Mail headers, commit messages, diffstats, signatures: not part of a file.
            at += 1;
            continue;
        }
        let mut header = Header::default();
        if starts_git {
            header.git_names = git_names(&line["diff --git ".len()..]);
            at += 1;
            while at < lines.len() {
                let line = lines[at];
                if line.starts_with("diff --git ") || line.starts_with("@@") {
                    break;
                }
                if line.starts_with("--- ") {
                    break;
                }
                if line.starts_with("Binary files ") || line == "GIT binary patch" {
                    return Err(error(base + at, "binary patches are not supported"));
                }
                if let Some(rest) = line.strip_prefix("rename from ") {
                    header.rename_from = Some(unquote(rest));
                } else if let Some(rest) = line.strip_prefix("rename to ") {
                    header.rename_to = Some(unquote(rest));
                } else if line.starts_with("copy from ") || line.starts_with("copy to ") {
                    return Err(error(base + at, "copies are not supported; add the file instead"));
                } else if line.starts_with("new file mode") {
                    header.new_file = true;
                } else if line.starts_with("deleted file mode") {
                    header.deleted = true;
                } else if !(line.starts_with("index ")
                    || line.starts_with("old mode")
                    || line.starts_with("new mode")
                    || line.starts_with("similarity index")
                    || line.starts_with("dissimilarity index"))
                {
                    break;
                }
                at += 1;
            }
        }
        if at + 1 < lines.len()
            && lines[at].starts_with("--- ")
            && lines[at + 1].starts_with("+++ ")
        {
            header.old = diff_name(&lines[at][4..]);
            header.new = diff_name(&lines[at + 1][4..]);
            at += 2;
        }
        let mut hunks = Vec::new();
        while at < lines.len() && lines[at].starts_with("@@") {
            let (hunk, next) = parse_unified_hunk(lines, at, base)?;
            hunks.push(hunk);
            at = next;
        }
        ops.push(file_op(header, hunks, base + at)?);
    }
    Ok(ops)
}

/// Turns a header and its hunks into an operation, stripping git's `a/` and `b/`.
fn file_op(header: Header, hunks: Vec<Hunk>, line: usize) -> Result<FileOp, ParseError> {
    let git_style = header.git_names.is_some()
        || (header.old.as_deref().is_none_or(|old| old.starts_with("a/"))
            && header.new.as_deref().is_none_or(|new| new.starts_with("b/")));
    let strip = |name: Option<String>, prefix: &str| {
        name.map(|name| match name.strip_prefix(prefix) {
            Some(rest) if git_style => rest.to_owned(),
            _ => name,
        })
    };
    let (git_old, git_new) = match header.git_names {
        Some((old, new)) => (Some(old), Some(new)),
        None => (None, None),
    };
    let old = strip(header.old.or(git_old), "a/");
    let new = strip(header.new.or(git_new), "b/");
    if header.rename_from.is_some() || header.rename_to.is_some() {
        let from =
            header.rename_from.or(old).ok_or_else(|| error(line, "a rename without its source"))?;
        let to =
            header.rename_to.or(new).ok_or_else(|| error(line, "a rename without its target"))?;
        return Ok(FileOp::Update { path: from, move_to: Some(to), hunks });
    }
    match (old, new) {
        (None, Some(new)) | (Some(_), Some(new)) if header.new_file => {
            Ok(FileOp::Add { content: added_content(&hunks, line)?, path: new })
        }
        (Some(old), None) | (Some(old), Some(_)) if header.deleted => {
            Ok(FileOp::Delete { path: old, hunks })
        }
        (Some(old), Some(new)) => {
            if hunks.is_empty() {
                // A mode change or an empty diff: nothing to do to the content.
                return Ok(FileOp::Update { path: old, move_to: None, hunks });
            }
            Ok(FileOp::Update { move_to: (old != new).then_some(new), path: old, hunks })
        }
        _ => Err(error(line, "a file diff without file names")),
    }
}

/// The content of a file a diff creates: the added lines of its one hunk.
fn added_content(hunks: &[Hunk], line: usize) -> Result<String, ParseError> {
    let mut content = String::new();
    for hunk in hunks {
        if hunk.lines.iter().any(|line| !matches!(line, Line::Add(_))) {
            return Err(error(line, "the diff of a new file may only add lines"));
        }
        for line in &hunk.lines {
            if let Line::Add(text) = line {
                content.push_str(text);
                content.push('\n');
            }
        }
        if hunk.new_no_newline {
            content.pop();
        }
    }
    Ok(content)
}

/// A `---`/`+++` name: `/dev/null` is none; a tab starts a timestamp (`diff -u`).
fn diff_name(raw: &str) -> Option<String> {
    let name = raw.split('\t').next().unwrap_or(raw).trim_end();
    let name = unquote(name);
    (name != "/dev/null").then_some(name)
}

/// The two names of `diff --git a/x b/y` (split where the second `b/` begins, which is
/// unambiguous when both names are the same length, as they are without a rename).
fn git_names(rest: &str) -> Option<(String, String)> {
    if rest.starts_with('"') {
        let end = closing_quote(rest)?;
        let old = unquote(&rest[..=end]);
        let new = unquote(rest[end + 1..].trim_start());
        return Some((old, new));
    }
    let bytes = rest.as_bytes();
    let half = rest.len().checked_sub(1)? / 2;
    if bytes.get(half) == Some(&b' ')
        && rest[..half].strip_prefix("a/") == rest[half + 1..].strip_prefix("b/")
    {
        return Some((rest[..half].to_owned(), rest[half + 1..].to_owned()));
    }
    let split = rest.find(" b/")?;
    Some((rest[..split].to_owned(), unquote(&rest[split + 1..])))
}

fn closing_quote(text: &str) -> Option<usize> {
    let mut escaped = false;
    for (idx, ch) in text.char_indices().skip(1) {
        match ch {
            '\\' if !escaped => escaped = true,
            '"' if !escaped => return Some(idx),
            _ => escaped = false,
        }
    }
    None
}

/// Git quotes names with unusual bytes in C style: `"a/sp\303\251cial \"x\""`.
fn unquote(name: &str) -> String {
    let Some(inner) = name.strip_prefix('"').and_then(|rest| rest.strip_suffix('"')) else {
        return name.to_owned();
    };
    let mut bytes = Vec::with_capacity(inner.len());
    let mut chars = inner.bytes().peekable();
    while let Some(byte) = chars.next() {
        if byte != b'\\' {
            bytes.push(byte);
            continue;
        }
        match chars.next() {
            Some(b'n') => bytes.push(b'\n'),
            Some(b't') => bytes.push(b'\t'),
            Some(b'r') => bytes.push(b'\r'),
            Some(b'a') => bytes.push(7),
            Some(b'b') => bytes.push(8),
            Some(b'f') => bytes.push(12),
            Some(b'v') => bytes.push(11),
            Some(digit @ b'0'..=b'7') => {
                let mut value = u32::from(digit - b'0');
                for _ in 0..2 {
                    match chars.peek() {
                        Some(&next @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(next - b'0');
                            chars.next();
                        }
                        _ => break,
                    }
                }
                bytes.push(u8::try_from(value & 0xFF).unwrap_or(b'?'));
            }
            Some(other) => bytes.push(other),
            None => bytes.push(b'\\'),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Reads one `@@ -a,b +c,d @@` hunk, driven by its line counts (so the lines after it,
/// such as a mail signature, are not taken for context).
fn parse_unified_hunk(lines: &[&str], at: usize, base: usize) -> Result<(Hunk, usize), ParseError> {
    let header = lines[at];
    let (old_start, mut old_left, mut new_left) = hunk_counts(header)
        .ok_or_else(|| error(base + at, format!("not a hunk header: {:?}", clip(header))))?;
    let mut hunk = Hunk { old_start: Some(old_start), ..Hunk::default() };
    let mut idx = at + 1;
    // Which side the last line belonged to, for `\ No newline at end of file`.
    let mut last: Option<char> = None;
    while idx < lines.len() {
        let line = lines[idx];
        if let Some(rest) = line.strip_prefix('\\') {
            if rest.contains("No newline") || !rest.is_empty() {
                match last {
                    Some('-') => hunk.old_no_newline = true,
                    Some('+') => hunk.new_no_newline = true,
                    _ => {
                        hunk.old_no_newline = true;
                        hunk.new_no_newline = true;
                    }
                }
            }
            idx += 1;
            continue;
        }
        if old_left == 0 && new_left == 0 {
            break;
        }
        let (kind, text) = match line.chars().next() {
            Some(kind @ (' ' | '-' | '+')) => (kind, &line[1..]),
            // Some tools drop the space of an empty context line.
            None => (' ', ""),
            Some(_) => {
                return Err(error(
                    base + idx,
                    format!(
                        "the hunk at line {} ends early ({old_left} old and {new_left} new lines \
                         missing)",
                        base + at + 1
                    ),
                ));
            }
        };
        match kind {
            ' ' if old_left > 0 && new_left > 0 => {
                old_left -= 1;
                new_left -= 1;
                hunk.lines.push(Line::Context(text.to_owned()));
            }
            '-' if old_left > 0 => {
                old_left -= 1;
                hunk.lines.push(Line::Remove(text.to_owned()));
            }
            '+' if new_left > 0 => {
                new_left -= 1;
                hunk.lines.push(Line::Add(text.to_owned()));
            }
            _ => {
                return Err(error(base + idx, "the hunk has more lines than its header says"));
            }
        }
        last = Some(kind);
        idx += 1;
    }
    if old_left > 0 || new_left > 0 {
        return Err(error(
            base + idx.min(lines.len().saturating_sub(1)),
            format!("the hunk at line {} is cut short", base + at + 1),
        ));
    }
    Ok((hunk, idx))
}

/// `@@ -12,3 +12,4 @@ text` → (12, 3, 4); a missing count is 1.
fn hunk_counts(header: &str) -> Option<(usize, usize, usize)> {
    let rest = header.strip_prefix("@@ -")?;
    let (ranges, _) = rest.split_once(" @@")?;
    let (old, new) = ranges.split_once(" +")?;
    let range = |text: &str| -> Option<(usize, usize)> {
        match text.split_once(',') {
            Some((start, count)) => Some((start.parse().ok()?, count.parse().ok()?)),
            None => Some((text.parse().ok()?, 1)),
        }
    };
    let (old_start, old_count) = range(old)?;
    let (_, new_count) = range(new)?;
    Some((old_start, old_count, new_count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codex_patches_add_delete_update_and_move() {
        let patch = "*** Begin Patch\n*** Add File: new.txt\n+hello\n+world\n*** Delete File: old.txt\n\
                     *** Update File: src/a.rs\n*** Move to: src/b.rs\n@@ fn main\n context\n-old\n+new\n\
                     *** End of File\n*** End Patch\n";
        let ops = parse(patch).unwrap();
        assert_eq!(ops.len(), 3);
        assert_eq!(
            ops[0],
            FileOp::Add { path: "new.txt".into(), content: "hello\nworld\n".into() }
        );
        assert_eq!(ops[1], FileOp::Delete { path: "old.txt".into(), hunks: vec![] });
        let FileOp::Update { path, move_to, hunks } = &ops[2] else { panic!("{ops:?}") };
        assert_eq!(path, "src/a.rs");
        assert_eq!(move_to.as_deref(), Some("src/b.rs"));
        assert_eq!(hunks.len(), 1);
        assert_eq!(hunks[0].anchor.as_deref(), Some("fn main"));
        assert!(hunks[0].at_end);
        assert_eq!(
            hunks[0].lines,
            vec![
                Line::Context("context".into()),
                Line::Remove("old".into()),
                Line::Add("new".into())
            ]
        );
    }

    #[test]
    fn codex_patch_without_end_is_refused() {
        let err = parse("*** Begin Patch\n*** Delete File: x\n").unwrap_err();
        assert!(err.message.contains("End Patch"), "{err}");
    }

    #[test]
    fn unified_diffs_with_mail_headers_and_signature() {
        let patch = "From 1234 Mon Sep 17 00:00:00 2001\nFrom: A <a@b>\nSubject: [PATCH] x\n\n---\n \
                     a.txt | 2 +-\n 1 file changed\n\ndiff --git a/a.txt b/a.txt\nindex 1..2 100644\n\
                     --- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+deux\n-- \n2.39.2\n\n";
        let ops = parse(patch).unwrap();
        assert_eq!(ops.len(), 1);
        let FileOp::Update { path, move_to, hunks } = &ops[0] else { panic!("{ops:?}") };
        assert_eq!(path, "a.txt");
        assert_eq!(*move_to, None);
        assert_eq!(hunks[0].old_start, Some(1));
        assert_eq!(hunks[0].lines.len(), 3);
    }

    #[test]
    fn unified_new_deleted_renamed_and_no_newline() {
        let patch = "diff --git a/n.txt b/n.txt\nnew file mode 100644\nindex 0..1\n--- /dev/null\n\
                     +++ b/n.txt\n@@ -0,0 +1,2 @@\n+a\n+b\n\\ No newline at end of file\n\
                     diff --git a/d.txt b/d.txt\ndeleted file mode 100644\n--- a/d.txt\n+++ /dev/null\n\
                     @@ -1 +0,0 @@\n-gone\ndiff --git a/x y.txt b/z.txt\nsimilarity index 100%\n\
                     rename from x y.txt\nrename to z.txt\n";
        let ops = parse(patch).unwrap();
        assert_eq!(ops[0], FileOp::Add { path: "n.txt".into(), content: "a\nb".into() });
        assert!(
            matches!(&ops[1], FileOp::Delete { path, hunks } if path == "d.txt" && hunks.len() == 1)
        );
        assert_eq!(
            ops[2],
            FileOp::Update { path: "x y.txt".into(), move_to: Some("z.txt".into()), hunks: vec![] }
        );
    }

    #[test]
    fn quoted_names_are_unquoted() {
        assert_eq!(unquote("\"a/caf\\303\\251 \\\"q\\\"\""), "a/café \"q\"");
        assert_eq!(diff_name("a/x.txt\t2024-01-01 00:00:00"), Some("a/x.txt".into()));
    }
}
