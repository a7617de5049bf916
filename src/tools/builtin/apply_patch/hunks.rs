//! Applying a file's hunks to its text, matching their context in stages.
//!
//! A hunk's old lines are looked for with exact equality first, then ignoring trailing
//! whitespace, then ignoring whitespace at both ends, then with typographic
//! punctuation (curly quotes, dashes, non-breaking spaces) read as ASCII; the stage
//! that matched is reported for each hunk. Unchanged lines are always written back
//! from the file itself, so a looser match never rewrites context, and the file keeps
//! its own line endings: a line replacing another keeps that line's ending, other new
//! lines take the file's prevailing one.

use super::parse::{Hunk, Line};
use crate::tools::fs::text;

/// How loosely a hunk's context had to be compared to match.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    Exact,
    TrailingWhitespace,
    Whitespace,
    Punctuation,
}

impl Stage {
    pub const ALL: [Stage; 4] =
        [Stage::Exact, Stage::TrailingWhitespace, Stage::Whitespace, Stage::Punctuation];

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Exact => "exact",
            Stage::TrailingWhitespace => "ignoring_trailing_whitespace",
            Stage::Whitespace => "ignoring_whitespace",
            Stage::Punctuation => "normalized_punctuation",
        }
    }

    fn same(self, file: &str, patch: &str) -> bool {
        match self {
            Stage::Exact => file == patch,
            Stage::TrailingWhitespace => file.trim_end() == patch.trim_end(),
            Stage::Whitespace => file.trim() == patch.trim(),
            Stage::Punctuation => {
                let (file, patch) = (file.trim(), patch.trim());
                file.chars().map(plain).eq(patch.chars().map(plain))
            }
        }
    }
}

/// A typographic character read as its ASCII counterpart.
fn plain(ch: char) -> char {
    match ch {
        '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{201B}' | '\u{2032}' => '\'',
        '\u{201C}' | '\u{201D}' | '\u{201E}' | '\u{201F}' | '\u{2033}' => '"',
        '\u{2010}' | '\u{2011}' | '\u{2012}' | '\u{2013}' | '\u{2014}' | '\u{2015}'
        | '\u{2212}' => '-',
        '\u{00A0}' | '\u{2002}' | '\u{2003}' | '\u{2009}' | '\u{200A}' | '\u{202F}'
        | '\u{205F}' | '\u{3000}' => ' ',
        other => other,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Eol {
    Lf,
    CrLf,
    None,
}

impl Eol {
    fn as_str(self) -> &'static str {
        match self {
            Eol::Lf => "\n",
            Eol::CrLf => "\r\n",
            Eol::None => "",
        }
    }
}

#[derive(Clone, Debug)]
struct FileLine {
    text: String,
    eol: Eol,
}

/// How one hunk was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    pub stage: Stage,
    /// 1-based line of the result where the hunk's lines begin.
    pub line: usize,
}

/// Why a hunk could not be applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// 0-based index of the hunk within the file's hunks.
    pub hunk: usize,
    /// The hunk's `@@ text` anchor was not found (rather than its lines).
    pub anchor: Option<String>,
    /// The lines that were looked for.
    pub expected: String,
}

/// Applies `hunks` in order to `text`; all of them or none.
pub fn apply(text: &str, hunks: &[Hunk]) -> Result<(String, Vec<Applied>), Mismatch> {
    let default_eol = if text::uses_crlf(text) { Eol::CrLf } else { Eol::Lf };
    let ends_without_newline = !text.is_empty() && !text.ends_with('\n');
    let mut lines = split(text);
    let mut applied = Vec::with_capacity(hunks.len());
    let mut cursor = 0usize;
    let mut delta: isize = 0;
    for (idx, hunk) in hunks.iter().enumerate() {
        let old = hunk.old_lines();
        let mismatch = |anchor: Option<String>| Mismatch {
            hunk: idx,
            anchor,
            expected: old.iter().map(|line| format!("{line}\n")).collect(),
        };
        let mut from = cursor;
        let mut anchor_stage = Stage::Exact;
        if let Some(anchor) = &hunk.anchor {
            let found = Stage::ALL.iter().find_map(|&stage| {
                (from..lines.len())
                    .find(|&at| stage.same(&lines[at].text, anchor))
                    .map(|at| (at, stage))
            });
            match found {
                // The hunk's lines may begin with the anchor line itself.
                Some((at, stage)) => {
                    from = at;
                    anchor_stage = stage;
                }
                None => return Err(mismatch(Some(anchor.clone()))),
            }
        }
        let hint = hunk.old_start.map(|start| {
            let zero_based = if old.is_empty() { start } else { start.saturating_sub(1) };
            zero_based.saturating_add_signed(delta)
        });
        let (at, stage) = if old.is_empty() {
            // Pure insertion: where the diff says, after the anchor, or at the end.
            let at = match (hint, &hunk.anchor) {
                (Some(hint), _) => hint.min(lines.len()),
                (None, Some(_)) => from + 1,
                (None, None) => lines.len(),
            };
            (at, anchor_stage)
        } else {
            let found = Stage::ALL.iter().find_map(|&stage| {
                find(&lines, &old, from, hunk.at_end, hint, stage).map(|at| (at, stage))
            });
            match found {
                Some((at, stage)) => (at, stage.max(anchor_stage)),
                None => return Err(mismatch(None)),
            }
        };
        let reaches_end = at + old.len() == lines.len();
        let mut replacement: Vec<FileLine> = Vec::with_capacity(hunk.lines.len());
        let mut old_idx = at;
        // A line that replaces a removed one keeps that line's ending (a mixed file
        // stays mixed); other new lines take the file's prevailing one.
        let mut replaced_eol: Option<Eol> = None;
        for line in &hunk.lines {
            match line {
                Line::Context(_) => {
                    replacement.push(lines[old_idx].clone());
                    old_idx += 1;
                    replaced_eol = None;
                }
                Line::Remove(_) => {
                    replaced_eol = Some(lines[old_idx].eol).filter(|eol| *eol != Eol::None);
                    old_idx += 1;
                }
                Line::Add(text) => replacement.push(FileLine {
                    text: text.clone(),
                    eol: replaced_eol.unwrap_or(default_eol),
                }),
            }
        }
        if reaches_end && let Some(last) = replacement.last_mut() {
            if hunk.new_no_newline {
                last.eol = Eol::None;
            } else if hunk.old_no_newline {
                last.eol = default_eol;
            } else if ends_without_newline {
                last.eol = Eol::None;
            } else if last.eol == Eol::None {
                last.eol = default_eol;
            }
        }
        let added = replacement.len();
        lines.splice(at..at + old.len(), replacement);
        applied.push(Applied { stage, line: at + 1 });
        cursor = at + added;
        delta += isize::try_from(added).unwrap_or(0) - isize::try_from(old.len()).unwrap_or(0);
    }
    let mut out = String::with_capacity(text.len() + 64);
    let count = lines.len();
    for (idx, line) in lines.into_iter().enumerate() {
        out.push_str(&line.text);
        let eol = if line.eol == Eol::None && idx + 1 < count { default_eol } else { line.eol };
        out.push_str(eol.as_str());
    }
    Ok((out, applied))
}

/// Where `old` matches at this stage: at or after `from` (only at the very end when
/// `at_end`), the match nearest the diff's line number when it gives one.
fn find(
    lines: &[FileLine],
    old: &[&str],
    from: usize,
    at_end: bool,
    hint: Option<usize>,
    stage: Stage,
) -> Option<usize> {
    let last_start = lines.len().checked_sub(old.len())?;
    let matches_at =
        |at: usize| old.iter().zip(&lines[at..]).all(|(want, have)| stage.same(&have.text, want));
    if at_end {
        return (last_start >= from && matches_at(last_start)).then_some(last_start);
    }
    if from > last_start {
        return None;
    }
    match hint {
        None => (from..=last_start).find(|&at| matches_at(at)),
        Some(hint) => {
            (from..=last_start).filter(|&at| matches_at(at)).min_by_key(|&at| at.abs_diff(hint))
        }
    }
}

fn split(text: &str) -> Vec<FileLine> {
    let mut lines = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        match rest.find('\n') {
            Some(end) => {
                let line = &rest[..end];
                let (line, eol) = match line.strip_suffix('\r') {
                    Some(line) => (line, Eol::CrLf),
                    None => (line, Eol::Lf),
                };
                lines.push(FileLine { text: line.to_owned(), eol });
                rest = &rest[end + 1..];
            }
            None => {
                lines.push(FileLine { text: rest.to_owned(), eol: Eol::None });
                rest = "";
            }
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hunk(lines: &[&str]) -> Hunk {
        let lines = lines
            .iter()
            .map(|line| match line.split_at(1) {
                (" ", rest) => Line::Context(rest.to_owned()),
                ("-", rest) => Line::Remove(rest.to_owned()),
                (_, rest) => Line::Add(rest.to_owned()),
            })
            .collect();
        Hunk { lines, ..Hunk::default() }
    }

    #[test]
    fn stages_loosen_in_order_and_context_comes_from_the_file() {
        let text = "fn a() {\n\tlet x = \"q\";  \n\treturn x;\n}\n";
        let (out, applied) =
            apply(text, &[hunk(&[" \tlet x = \"q\";", "-\treturn x;", "+\treturn y;"])]).unwrap();
        assert_eq!(out, "fn a() {\n\tlet x = \"q\";  \n\treturn y;\n}\n");
        assert_eq!(applied[0].stage, Stage::TrailingWhitespace);

        let (_, applied) =
            apply(text, &[hunk(&["   let x = \"q\";", "-  return x;", "+\treturn y;"])]).unwrap();
        assert_eq!(applied[0].stage, Stage::Whitespace);

        let (_, applied) =
            apply(text, &[hunk(&[" let x = \u{201C}q\u{201D};", "-return x;", "+z"])]).unwrap();
        assert_eq!(applied[0].stage, Stage::Punctuation);

        let err = apply(text, &[hunk(&[" nothing like it", "-x"])]).unwrap_err();
        assert_eq!(err.hunk, 0);
    }

    #[test]
    fn crlf_files_keep_crlf_and_missing_final_newline_is_kept() {
        let text = "one\r\ntwo\r\nthree";
        let (out, _) = apply(text, &[hunk(&[" two", "-three", "+drei", "+vier"])]).unwrap();
        assert_eq!(out, "one\r\ntwo\r\ndrei\r\nvier");
        let (out, _) = apply("a\nb\n", &[hunk(&[" b", "+c"])]).unwrap();
        assert_eq!(out, "a\nb\nc\n");
    }

    #[test]
    fn anchors_position_hunks_and_may_be_part_of_them() {
        let text = "fn a() {\n    x();\n}\nfn b() {\n    x();\n}\n";
        let mut after = hunk(&["-    x();", "+    y();"]);
        after.anchor = Some("fn b() {".to_owned());
        let (out, _) = apply(text, &[after]).unwrap();
        assert_eq!(out, "fn a() {\n    x();\n}\nfn b() {\n    y();\n}\n");
        let mut including = hunk(&[" fn b() {", "-    x();", "+    z();"]);
        including.anchor = Some("fn b() {".to_owned());
        let (out, _) = apply(text, &[including]).unwrap();
        assert_eq!(out, "fn a() {\n    x();\n}\nfn b() {\n    z();\n}\n");
        let mut insert = hunk(&["+    w();"]);
        insert.anchor = Some("fn a() {".to_owned());
        let (out, _) = apply(text, &[insert]).unwrap();
        assert!(out.starts_with("fn a() {\n    w();\n    x();\n"), "{out}");
    }

    #[test]
    fn line_hints_pick_the_nearest_of_repeated_context() {
        let text = "x\ny\nx\ny\n";
        let mut second = hunk(&[" x", "-y", "+z"]);
        second.old_start = Some(3);
        let (out, applied) = apply(text, &[second]).unwrap();
        assert_eq!(out, "x\ny\nx\nz\n");
        assert_eq!(applied[0].line, 3);
    }
}
