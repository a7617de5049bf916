//! What a background process will read from what `process_write` sends it, so that
//! the permission rules judge that and not the raw bytes: the line already typed but
//! not yet entered (input split over several writes), and on a terminal the line
//! editing an interactive shell applies (erase, kill, word-erase, interrupt).
//!
//! On a terminal the model is the editing both a terminal's canonical mode and
//! readline agree on, with the line being typed at its end: `DEL` and `^H` erase the
//! last character, `^U` the whole line, `^W` the last word, `^C` drops the line;
//! `CR` and `LF` enter it. Any other control character (arrows and every escape
//! sequence, tab completion, `^V`, `^R`, `^A` and the other cursor moves, `^D` in the
//! middle of a line...) changes the line in ways not modelled here, so input holding
//! one is [`Unmodelled`]: the caller refuses it unless a rule allows raw input. Through
//! a pipe nothing is edited: the bytes are the text.

/// Input as the process will read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Typed {
    /// The lines entered, each with its line end (`\n`).
    pub entered: String,
    /// What stays typed but not entered.
    pub pending: String,
}

impl Typed {
    /// All the text the input will have put before the process: the lines entered
    /// and what is still pending (which a later write may enter).
    pub fn text(&self) -> String {
        let mut text = self.entered.clone();
        text.push_str(&self.pending);
        text
    }
}

/// Input holding a control character the model does not follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unmodelled(pub String);

impl std::fmt::Display for Unmodelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What `input`, written after `pending` (the line typed so far), makes: the lines it
/// enters and the line left pending. `terminal`: the process reads a terminal, whose
/// line editing applies.
pub fn type_input(pending: &str, input: &str, terminal: bool) -> Result<Typed, Unmodelled> {
    let mut typed = Typed { entered: String::new(), pending: pending.to_owned() };
    for ch in input.chars() {
        match ch {
            '\n' => {
                typed.entered.push_str(&typed.pending);
                typed.entered.push('\n');
                typed.pending.clear();
            }
            _ if !terminal => typed.pending.push(ch),
            '\r' => {
                typed.entered.push_str(&typed.pending);
                typed.entered.push('\n');
                typed.pending.clear();
            }
            '\u{7f}' | '\u{8}' => {
                typed.pending.pop();
            }
            '\u{15}' | '\u{3}' => typed.pending.clear(),
            '\u{17}' => {
                let kept = typed.pending.trim_end_matches([' ', '\t']).len();
                typed.pending.truncate(kept);
                let word = typed.pending.rfind([' ', '\t']).map_or(0, |at| at + 1);
                typed.pending.truncate(word);
            }
            // End of input on an empty line: the shell exits, nothing runs.
            '\u{4}' if typed.pending.is_empty() => {}
            _ if ch.is_control() => {
                return Err(Unmodelled(format!(
                    "the input holds {}, a control character whose effect on the line an \
                     interactive program edits (cursor moves, completion, history, escape \
                     sequences) is not modelled",
                    name(ch)
                )));
            }
            _ => typed.pending.push(ch),
        }
    }
    Ok(typed)
}

/// A control character as a person names it.
fn name(ch: char) -> String {
    match ch {
        '\u{1b}' => "ESC (\\x1b)".to_owned(),
        '\t' => "a tab".to_owned(),
        _ if (ch as u32) < 0x20 => {
            format!("^{} (\\x{:02x})", char::from_u32(ch as u32 + 0x40).unwrap_or('?'), ch as u32)
        }
        _ => format!("U+{:04X}", ch as u32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(pending: &str, input: &str) -> (String, String) {
        let typed = type_input(pending, input, true).unwrap_or_else(|err| panic!("{err}"));
        (typed.entered, typed.pending)
    }

    #[test]
    fn a_terminal_line_is_judged_as_edited() {
        assert_eq!(typed("", "toucx\u{7f}h pw\n"), ("touch pw\n".into(), "".into()));
        assert_eq!(typed("", "echo hi\u{15}touch pw\n"), ("touch pw\n".into(), "".into()));
        assert_eq!(
            typed("", "echo hi there\u{17}\u{17}touch pw\r"),
            ("echo touch pw\n".into(), "".into())
        );
        assert_eq!(typed("", "rm -rf x\u{3}ls\n"), ("ls\n".into(), "".into()));
        assert_eq!(typed("tou", "ch pw\n"), ("touch pw\n".into(), "".into()));
        assert_eq!(typed("", "git status\ntou"), ("git status\n".into(), "tou".into()));
        assert_eq!(typed("", "\u{4}"), ("".into(), "".into()));
    }

    #[test]
    fn what_cannot_be_modelled_is_said() {
        for input in ["ls\u{1b}[A\n", "tou\tpw\n", "ls\u{16}\u{7f}\n", "ab\u{4}\n", "x\u{12}\n"] {
            assert!(type_input("", input, true).is_err(), "{input:?}");
        }
    }

    #[test]
    fn a_pipe_edits_nothing() {
        let typed =
            type_input("tou", "ch\u{7f} x\tpw\n", false).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(typed.entered, "touch\u{7f} x\tpw\n");
        assert!(typed.pending.is_empty());
    }
}
