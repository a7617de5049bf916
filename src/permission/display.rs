//! What a person is shown: one rendering for every face that asks (the CLI prompt,
//! the MCP elicitation's message), so that what is approved is what is on screen.
//!
//! Text from a model or a command never reaches a terminal as it is. Every control
//! character becomes visible (`\x1b`, `\r`), and so does every character that changes
//! how the text around it is displayed without showing itself: C1 controls
//! (`<U+009B>`), bidirectional overrides (`<U+202E>`), zero-width and other invisible
//! formatting characters. A command is folded so that all of it fits: runs of blanks
//! and of empty lines become one marker (`<4000 spaces>`, `<59 empty lines>`), and
//! only a long stretch of text with no blank and no shell operator is shortened in
//! its middle, so every simple command of it keeps showing.

use std::fmt::Write as _;

use serde_json::Value;

use crate::tools::{Facts, builtin};

/// Longest stretch without a blank or a shell operator shown whole; longer ones keep
/// their first and last characters around a count.
const MAX_SEGMENT: usize = 64;
const SEGMENT_HEAD: usize = 40;
const SEGMENT_TAIL: usize = 16;

/// Blanks in a row shown as they are; longer runs become a marker.
const MAX_BLANK_RUN: usize = 8;

/// Longest string argument (other than a command or a plan) shown, in lines.
const MAX_VALUE_LINES: usize = 12;

/// Characters that separate simple commands or words in a shell: never elided.
fn is_boundary(c: char) -> bool {
    matches!(c, ';' | '&' | '|' | '(' | ')' | '{' | '}' | '`' | '<' | '>' | '$' | '\'' | '"')
}

/// Whether a character must be shown as an escape: it is a control character, or it
/// changes the display of other text without being visible itself.
pub fn is_hidden(c: char) -> bool {
    let code = u32::from(c);
    c.is_control()
        || matches!(
            code,
            0x00AD // soft hyphen
            | 0x034F // combining grapheme joiner
            | 0x061C // Arabic letter mark
            | 0x115F | 0x1160 | 0x3164 | 0xFFA0 // Hangul fillers
            | 0x17B4 | 0x17B5 | 0x180B..=0x180F // Khmer and Mongolian invisibles
            | 0x200B..=0x200F // zero-width characters, LRM, RLM
            | 0x2028..=0x202E // separators, embeddings and overrides
            | 0x2060..=0x206F // word joiner, invisible operators, isolates
            | 0xFE00..=0xFE0F // variation selectors
            | 0xFEFF // zero-width no-break space
            | 0xFFF9..=0xFFFB // interlinear annotations
            | 0x1D173..=0x1D17A // musical formatting
            | 0xE0000..=0xE0FFF // tags and variation selectors supplement
        )
}

/// Appends one character, escaped when it is hidden.
fn push_visible(out: &mut String, c: char) {
    if !is_hidden(c) {
        out.push(c);
        return;
    }
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if u32::from(c) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", u32::from(c));
        }
        c => {
            let _ = write!(out, "<U+{:04X}>", u32::from(c));
        }
    }
}

/// `text` on one line with every hidden character visible (newlines too).
pub fn visible(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        push_visible(&mut out, c);
    }
    out
}

/// `text` with every hidden character visible except newlines and tabs, for output
/// shown as it comes (a command's live output).
pub fn visible_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\n' || c == '\t' {
            out.push(c);
        } else {
            push_visible(&mut out, c);
        }
    }
    out
}

/// One line of a command, folded: hidden characters visible, long blank runs
/// counted, long stretches without a boundary shortened in the middle.
fn fold_line(line: &str) -> String {
    let mut out = String::new();
    let chars: Vec<char> = line.chars().collect();
    let mut at = 0;
    while at < chars.len() {
        let c = chars[at];
        if c == ' ' || c == '\t' {
            let end = chars[at..]
                .iter()
                .position(|&c| c != ' ' && c != '\t')
                .map_or(chars.len(), |n| at + n);
            let run = &chars[at..end];
            if run.len() > MAX_BLANK_RUN {
                let what = if run.iter().all(|&c| c == ' ') { "spaces" } else { "blanks" };
                let _ = write!(out, " <{} {what}> ", run.len());
            } else {
                for &c in run {
                    push_visible(&mut out, c);
                }
            }
            at = end;
        } else if is_boundary(c) {
            push_visible(&mut out, c);
            at += 1;
        } else {
            let end = chars[at..]
                .iter()
                .position(|&c| c == ' ' || c == '\t' || is_boundary(c))
                .map_or(chars.len(), |n| at + n);
            let segment = &chars[at..end];
            if segment.len() > MAX_SEGMENT {
                for &c in &segment[..SEGMENT_HEAD] {
                    push_visible(&mut out, c);
                }
                let hidden = segment.len() - SEGMENT_HEAD - SEGMENT_TAIL;
                let _ = write!(out, "<…{hidden} more characters…>");
                for &c in &segment[segment.len() - SEGMENT_TAIL..] {
                    push_visible(&mut out, c);
                }
            } else {
                for &c in segment {
                    push_visible(&mut out, c);
                }
            }
            at = end;
        }
    }
    out
}

/// A command as lines to show: every line folded, runs of empty lines counted.
pub fn command_lines(command: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut empty_run = 0usize;
    let flush = |lines: &mut Vec<String>, run: &mut usize| {
        match *run {
            0 => {}
            1 => lines.push(String::new()),
            n => lines.push(format!("<{n} empty lines>")),
        }
        *run = 0;
    };
    for line in command.split('\n') {
        if line.trim_matches([' ', '\t']).is_empty() && !line.contains(is_hidden_not_blank) {
            empty_run += 1;
            continue;
        }
        flush(&mut lines, &mut empty_run);
        lines.push(fold_line(line));
    }
    flush(&mut lines, &mut empty_run);
    while lines.last().is_some_and(String::is_empty) {
        lines.pop();
    }
    lines
}

fn is_hidden_not_blank(c: char) -> bool {
    c != '\t' && is_hidden(c)
}

/// A short piece of text for a sentence (a command part named in a reason): one line,
/// folded as a command is.
pub fn inline(text: &str) -> String {
    command_lines(text).join(" \\n ")
}

/// A string argument as lines to show, at most [`MAX_VALUE_LINES`] of them.
fn value_lines(text: &str) -> Vec<String> {
    let mut lines = command_lines(text);
    if lines.len() > MAX_VALUE_LINES {
        let more = lines.len() - MAX_VALUE_LINES;
        lines.truncate(MAX_VALUE_LINES);
        lines.push(format!("<… {more} more lines>"));
    }
    lines
}

/// What a person is asked about, as the faces have it.
#[derive(Clone, Copy, Debug)]
pub struct Question<'a> {
    pub tool: &'a str,
    pub arguments: &'a Value,
    /// Why the call asks.
    pub reason: &'a str,
    /// Rules that would allow such calls without asking.
    pub suggestions: &'a [String],
    /// What "allow for this session" would grant; `None` when it is not offered.
    pub session_grant: Option<&'a str>,
}

/// The whole question as text: the tool, its arguments (a command in full, folded),
/// why it asks, and what each answer would allow. Ends without a newline.
pub fn question(question: &Question<'_>) -> String {
    let mut out = String::new();
    let tool = visible(question.tool);
    // A command tool's command is shown in full, whatever other arguments it has.
    let command = builtin::facts(question.tool)
        .and_then(Facts::command_argument)
        .and_then(|argument| Some((argument, question.arguments.get(argument)?.as_str()?)));
    match (question.tool, command) {
        (_, Some((argument, command))) => {
            let _ = writeln!(out, "toolgate: {tool} wants to run this command:");
            for line in command_lines(command) {
                let _ = writeln!(out, "  | {line}");
            }
            let others = question.arguments.as_object().into_iter().flatten();
            for (key, value) in others.filter(|(key, _)| key.as_str() != argument) {
                push_argument(&mut out, key, value);
            }
        }
        ("exit_plan_mode", _) => {
            let plan = question.arguments.get("plan").and_then(Value::as_str).unwrap_or("");
            let _ = writeln!(out, "toolgate: leave plan mode and carry out this plan?");
            for line in command_lines(plan) {
                let _ = writeln!(out, "  | {line}");
            }
        }
        _ => {
            let _ = writeln!(out, "toolgate: {tool} wants to run with:");
            match question.arguments.as_object() {
                Some(object) if !object.is_empty() => {
                    for (key, value) in object {
                        push_argument(&mut out, key, value);
                    }
                }
                Some(_) => out.push_str("  (no arguments)\n"),
                None => {
                    let _ = writeln!(out, "  {}", inline(&question.arguments.to_string()));
                }
            }
        }
    }
    let _ = writeln!(out, "why: {}", inline(question.reason));
    match question.session_grant {
        Some(grant) => {
            let _ = write!(out, "allow for this session grants: {}", inline(grant));
        }
        None => out.push_str("allow for this session is not offered for this call"),
    }
    if let Some(rule) = question.suggestions.first()
        && question.session_grant != Some(rule.as_str())
    {
        let _ = write!(out, "\na rule that would allow it: {}", inline(rule));
    }
    out
}

fn push_argument(out: &mut String, key: &str, value: &Value) {
    let key = visible(key);
    match value {
        Value::String(text) => {
            let lines = value_lines(text);
            match lines.as_slice() {
                [] => {
                    let _ = writeln!(out, "  {key}: \"\"");
                }
                [one] => {
                    let _ = writeln!(out, "  {key}: {one}");
                }
                several => {
                    let _ = writeln!(out, "  {key}:");
                    for line in several {
                        let _ = writeln!(out, "  | {line}");
                    }
                }
            }
        }
        other => {
            let _ = writeln!(out, "  {key}: {}", inline(&other.to_string()));
        }
    }
}

#[cfg(test)]
mod tests {
    use expect_test::expect;
    use serde_json::json;

    use super::*;

    #[test]
    fn hidden_characters_become_visible() {
        let text = "a\u{1b}[2J\rb\u{9b}c\u{202e}d\u{7f}\u{200b}e\tf\ng";
        expect![[r#"a\x1b[2J\rb<U+009B>c<U+202E>d\x7f<U+200B>e\tf\ng"#]].assert_eq(&visible(text));
        expect![["a\\x1b[2J\\rb<U+009B>c<U+202E>d\\x7f<U+200B>e\tf\ng"]]
            .assert_eq(&visible_lines(text));
        assert_eq!(visible("plain text, ünïcode ✓"), "plain text, ünïcode ✓");
    }

    #[test]
    fn long_commands_fold_so_every_part_shows() {
        let spaces = format!("ls{}; rm -rf victim", " ".repeat(4000));
        assert_eq!(command_lines(&spaces), ["ls <4000 spaces> ; rm -rf victim"]);
        let newlines = format!("ls{}rm -rf victim", "\n".repeat(60));
        assert_eq!(command_lines(&newlines), ["ls", "<59 empty lines>", "rm -rf victim"]);
        let word = format!("echo {}; rm -rf victim", "a".repeat(10_000));
        let folded = command_lines(&word);
        assert_eq!(folded.len(), 1);
        assert!(folded[0].ends_with("; rm -rf victim"), "{folded:?}");
        assert!(folded[0].contains("<…9944 more characters…>"), "{folded:?}");
        // Quoted text is not a place to hide in: its operators still split it.
        let quoted = format!("ls '{};rm -rf victim;{}'", "x".repeat(500), "y".repeat(500));
        assert!(command_lines(&quoted)[0].contains(";rm -rf victim;"));
    }

    #[test]
    fn the_question_shows_the_whole_command_and_the_grant() {
        let arguments = json!({
            "command": "ls '\u{1b}[2J\u{1b}[H<fake \"ls -la\" prompt>'; rm -rf victim",
        });
        let suggestions = ["run_command(rm:*)".to_owned()];
        let text = question(&Question {
            tool: "run_command",
            arguments: &arguments,
            reason: "run_command requires approval in default mode because no allow rule covers `rm -rf victim`",
            suggestions: &suggestions,
            session_grant: Some("run_command(rm:*)"),
        });
        expect![[r#"
            toolgate: run_command wants to run this command:
              | ls '\x1b[2J\x1b[H<fake "ls -la" prompt>'; rm -rf victim
            why: run_command requires approval in default mode because no allow rule covers `rm -rf victim`
            allow for this session grants: run_command(rm:*)"#]]
        .assert_eq(&text);
        assert!(!text.contains('\u{1b}'));

        let arguments = json!({"path": "a\u{1b}cb.txt", "content": "x\n".repeat(40)});
        let text = question(&Question {
            tool: "write_file",
            arguments: &arguments,
            reason: "write_file requires approval in default mode",
            suggestions: &[],
            session_grant: None,
        });
        expect![[r#"
            toolgate: write_file wants to run with:
              content:
              | x
              | x
              | x
              | x
              | x
              | x
              | x
              | x
              | x
              | x
              | x
              | x
              | <… 28 more lines>
              path: a\x1bcb.txt
            why: write_file requires approval in default mode
            allow for this session is not offered for this call"#]]
        .assert_eq(&text);
    }
}
