//! What the audit log keeps of a call's arguments.
//!
//! Three things are never written as they are:
//!
//! - **Secrets.** A value under a key whose name [`looks_secret`] is replaced, at any
//!   depth. Inside free text (a command line, a raw argument string that is not valid
//!   JSON, a path) the [`PATTERNS`] find what looks like a credential: tokens with a
//!   known shape (cloud keys, GitHub, GitLab, Slack, npm, PyPI, Stripe, `sk-` API
//!   keys, JSON Web Tokens), `Authorization` headers and bearer credentials, a
//!   password in a URL, `NAME=value` and `name: value` assignments and `--flag value`
//!   options whose name says secret, and private key blocks. What matched becomes
//!   `[redacted]`; the name in front of it is kept, so the record still says what
//!   was passed.
//! - **File contents.** A text value under a content key ([`CONTENT_KEYS`]: what
//!   `write_file` writes, the strings `edit_file` replaces) is recorded as its size
//!   and SHA-256 (`[1234 bytes, sha256:…]`): enough to tell which content was
//!   written, without copying the file into the log.
//! - **Bulk.** Any text longer than the configured `max_arguments_bytes`, and the
//!   whole arguments when they are still larger once encoded, are recorded the same
//!   way, so a call carrying megabytes of junk adds a short record.
//!
//! The pattern set is a maintained list: adding a shape of credential is one entry in
//! [`PATTERNS`] and one case in the tests below.

use std::sync::LazyLock;

use regex::{Regex, RegexSet};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// What a redacted value is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Parts of key names (compared case-insensitively) whose values are never written.
const SECRET_NAME_PARTS: [&str; 7] =
    ["token", "secret", "password", "passwd", "key", "auth", "credential"];

/// Keys whose text values are file contents: recorded as size and hash.
pub const CONTENT_KEYS: [&str; 7] =
    ["content", "contents", "old_string", "new_string", "new_source", "patch", "diff"];

/// Whether a key or variable name looks like it holds a secret. Deliberately broad
/// (`monkey` matches `key`): hiding a harmless value costs little.
pub fn looks_secret(name: &str) -> bool {
    SECRET_NAME_PARTS.iter().any(|part| crate::tools::contains_ignoring_ascii_case(name, part))
}

fn is_content_key(name: &str) -> bool {
    CONTENT_KEYS.iter().any(|key| name.eq_ignore_ascii_case(key))
}

/// One shape of secret in free text. What `regex` matches is replaced by `[redacted]`,
/// except the `keep` group in front of it and the `tail` group after it.
struct Pattern {
    name: &'static str,
    regex: &'static str,
}

/// The maintained set. Order matters only where shapes overlap: the private key block
/// goes first so that its body is taken whole.
const PATTERNS: &[Pattern] = &[
    Pattern {
        name: "private key block",
        regex: r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----(?s:.*?)(?:-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\z)",
    },
    Pattern {
        name: "AWS access key id",
        regex: r"\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|APKA|AROA|ASCA)[0-9A-Z]{16}\b",
    },
    Pattern { name: "GitHub token", regex: r"\bgh[pousr]_[A-Za-z0-9]{20,}" },
    Pattern { name: "GitHub fine-grained token", regex: r"\bgithub_pat_[A-Za-z0-9_]{20,}" },
    Pattern {
        name: "GitLab token",
        regex: r"\bgl(?:pat|dt|rt|ptt|ft|imt|oas|soat|cbt|ffct|agent)-[A-Za-z0-9_\-]{16,}",
    },
    Pattern { name: "Slack token", regex: r"\bx(?:ox[abeposr]|app)-[A-Za-z0-9\-]{8,}" },
    Pattern {
        name: "Slack webhook",
        regex: r"(?P<keep>https://hooks\.slack\.com/services/)[A-Za-z0-9/_\-]+",
    },
    Pattern { name: "API key (sk-)", regex: r"\bsk-[A-Za-z0-9_\-]{16,}" },
    Pattern { name: "Stripe key", regex: r"\b[rsp]k_(?:live|test)_[A-Za-z0-9]{16,}" },
    Pattern { name: "Google API key", regex: r"\bAIza[0-9A-Za-z_\-]{35}" },
    Pattern { name: "npm token", regex: r"\bnpm_[A-Za-z0-9]{36}" },
    Pattern { name: "PyPI token", regex: r"\bpypi-[A-Za-z0-9_\-]{50,}" },
    Pattern { name: "Hugging Face token", regex: r"\bhf_[A-Za-z0-9]{30,}" },
    Pattern {
        name: "JSON Web Token",
        regex: r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
    },
    Pattern {
        name: "Authorization header",
        regex: r#"(?i)(?P<keep>\b(?:proxy-)?authorization["']?\s*[:=]\s*["']?(?:(?:bearer|basic|token|digest|negotiate)\s+)?)[^\s"']+"#,
    },
    Pattern { name: "bearer credential", regex: r"(?i)(?P<keep>\bbearer\s+)[A-Za-z0-9._~+/\-]+=*" },
    Pattern {
        name: "password in a URL",
        regex: r"(?P<keep>\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^/\s:@]+:)[^/\s@]+(?P<tail>@)",
    },
    Pattern {
        name: "secret assignment",
        // `API_TOKEN=…`, `password: …`, `"token": "…"`, `db.password='…'`. Narrower
        // names than `looks_secret`: in a command line, `--author=` and `--key=2` are
        // ordinary and worth keeping. The value is a quoted string or runs to the next
        // space or separator.
        regex: r#"(?i)(?P<keep>[\w.\-]*(?:token|secret|passw(?:or)?d|passphrase|credentials?|api[_-]?key|apikey|access[_-]?key|private[_-]?key|client[_-]?key|signing[_-]?key|session[_-]?key)[\w.\-]*["']?\s*[:=]\s*)(?:"(?:[^"\\]|\\.)*"?|'[^']*'?|[^\s"',;&|)}\]]+)"#,
    },
    Pattern {
        name: "secret option",
        // `--password hunter2`, `--api-key KEY`.
        regex: r"(?i)(?P<keep>(?:^|\s)--?[\w\-]*(?:token|secret|password|passwd|passphrase|api-?key|access-?key)[\w\-]*\s+)[^\s\-][^\s]*",
    },
    Pattern {
        name: "user and password option",
        // `curl -u user:password`, `--user user:password`.
        regex: r"(?P<keep>(?:^|\s)(?:-u|--user)\s+[^\s:]+:)[^\s]+",
    },
];

struct Compiled {
    /// Tells at once whether any pattern matches, so clean text costs one scan.
    set: RegexSet,
    regexes: Vec<Regex>,
}

static COMPILED: LazyLock<Option<Compiled>> = LazyLock::new(|| {
    let mut regexes = Vec::with_capacity(PATTERNS.len());
    for pattern in PATTERNS {
        match Regex::new(pattern.regex) {
            Ok(regex) => regexes.push(regex),
            Err(err) => {
                // Unreachable with the constant set (a unit test compiles it); if it
                // ever happens, every text value is withheld rather than written
                // unredacted.
                tracing::error!(pattern = pattern.name, %err, "an audit secret pattern does not compile");
                return None;
            }
        }
    }
    let set = RegexSet::new(PATTERNS.iter().map(|pattern| pattern.regex)).ok()?;
    Some(Compiled { set, regexes })
});

/// Replaces every secret [`PATTERNS`] finds in `text`; `None` when nothing matched.
pub fn redact_text(text: &str) -> Option<String> {
    let Some(compiled) = COMPILED.as_ref() else {
        return Some(REDACTED.to_owned());
    };
    let matched = compiled.set.matches(text);
    if !matched.matched_any() {
        return None;
    }
    let mut out = text.to_owned();
    for idx in matched.iter() {
        let replaced = compiled.regexes[idx].replace_all(&out, |caps: &regex::Captures<'_>| {
            let whole = caps.get(0).map_or("", |m| m.as_str());
            let keep = caps.name("keep").map_or("", |m| m.as_str());
            let tail = caps.name("tail").map_or("", |m| m.as_str());
            let secret = whole.get(keep.len()..whole.len() - tail.len()).unwrap_or(whole);
            // What an earlier pattern already replaced stays as it is.
            if secret.starts_with("[redacted") {
                whole.to_owned()
            } else {
                format!("{keep}{REDACTED}{tail}")
            }
        });
        if let std::borrow::Cow::Owned(replaced) = replaced {
            out = replaced;
        }
    }
    Some(out)
}

/// Size and SHA-256 of some bytes, as recorded instead of them.
pub(super) fn summary(len: usize, sha256: &[u8]) -> String {
    format!("[{len} bytes, sha256:{}]", hex(sha256))
}

/// Lower-case hexadecimal.
pub(super) fn hex(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len() * 2);
    push_hex(&mut out, bytes);
    // Only ASCII digits were pushed.
    String::from_utf8(out).unwrap_or_default()
}

/// Appends `bytes` in lower-case hexadecimal.
pub(super) fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        out.push(DIGITS[usize::from(byte >> 4)]);
        out.push(DIGITS[usize::from(byte & 0xf)]);
    }
}

fn summarize_text(text: &str) -> String {
    summary(text.len(), &Sha256::digest(text.as_bytes()))
}

/// Counts and hashes what is written through it.
struct HashingWriter {
    hasher: Sha256,
    len: usize,
}

impl std::io::Write for HashingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.hasher.update(buf);
        self.len += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Counts what is written through it.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Replaces, at any depth, the value of every object key that [`looks_secret`].
pub fn redact(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map.iter_mut() {
                if looks_secret(key) {
                    *inner = Value::String(REDACTED.to_owned());
                } else {
                    redact(inner);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

/// The arguments as the audit log records them: secrets redacted (by key and in free
/// text), contents and long text as size and hash, and the whole as size and hash
/// when it is still larger than `max_bytes` once encoded.
pub(super) fn prepare(arguments: &Value, max_bytes: usize) -> Prepared<'_> {
    let redacted = Prepared::Redacted(Redacting { value: arguments, max_bytes });
    // Small arguments fit whatever their redaction writes; only larger ones are
    // measured by encoding them once.
    if encoded_bound(arguments) > max_bytes {
        let mut counter = Counter(0);
        let fits = serde_json::to_writer(&mut counter, &redacted).is_ok() && counter.0 <= max_bytes;
        if !fits {
            // The size and hash of the whole describe what the call really carried;
            // hashing streams the encoding, nothing is copied.
            let mut whole = HashingWriter { hasher: Sha256::new(), len: 0 };
            if serde_json::to_writer(&mut whole, arguments).is_ok() {
                return Prepared::Summary(summary(whole.len, &whole.hasher.finalize()));
            }
        }
    }
    redacted
}

/// What the audit log writes for a call's arguments ([`prepare`]).
pub(super) enum Prepared<'a> {
    /// The arguments, redacted as they are written: only what a redaction replaces
    /// is made anew.
    Redacted(Redacting<'a>),
    /// Too large once encoded: the size and hash of the whole.
    Summary(String),
}

impl serde::Serialize for Prepared<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Prepared::Redacted(redacting) => redacting.serialize(s),
            Prepared::Summary(summary) => s.serialize_str(summary),
        }
    }
}

/// A value serialized with every redaction applied on the way.
pub(super) struct Redacting<'a> {
    value: &'a Value,
    max_bytes: usize,
}

impl serde::Serialize for Redacting<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap as _, SerializeSeq as _};
        let max_bytes = self.max_bytes;
        match self.value {
            Value::Object(map) => {
                let mut out = s.serialize_map(Some(map.len()))?;
                for (key, inner) in map {
                    if looks_secret(key) {
                        out.serialize_entry(key, REDACTED)?;
                    } else if let (true, Value::String(text)) = (is_content_key(key), inner) {
                        out.serialize_entry(key, &summarize_text(text))?;
                    } else {
                        out.serialize_entry(key, &Redacting { value: inner, max_bytes })?;
                    }
                }
                out.end()
            }
            Value::Array(items) => {
                let mut out = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    out.serialize_element(&Redacting { value: item, max_bytes })?;
                }
                out.end()
            }
            Value::String(text) if text.len() > max_bytes => s.serialize_str(&summarize_text(text)),
            Value::String(text) => match redact_text(text) {
                Some(redacted) => s.serialize_str(&redacted),
                None => s.serialize_str(text),
            },
            other => other.serialize(s),
        }
    }
}

/// The most bytes `value` can take once redacted and encoded: a string escapes to at
/// most six bytes per byte, and whatever replaces one (the redaction mark, a size and
/// hash) takes under [`REPLACED_BOUND`].
fn encoded_bound(value: &Value) -> usize {
    fn text(text: &str) -> usize {
        (text.len() * 6 + 2).max(REPLACED_BOUND)
    }
    match value {
        Value::Object(map) => {
            2 + map.iter().map(|(key, inner)| text(key) + 2 + encoded_bound(inner)).sum::<usize>()
        }
        Value::Array(items) => 2 + items.iter().map(|item| encoded_bound(item) + 1).sum::<usize>(),
        Value::String(value) => text(value),
        // `null`, booleans and numbers (at most 24 bytes).
        _ => 24,
    }
}

/// More than any replacement writes, quotes included: `"[redacted]"`, or a size and
/// hash (`"[<up to 20 digits> bytes, sha256:<64 hex digits>]"`).
const REPLACED_BOUND: usize = 128;

/// A cheap upper estimate of the memory a value holds (its text and keys), used to
/// bound what waits in the writer's queue without encoding anything.
pub(super) fn approximate_size(value: &Value) -> usize {
    match value {
        Value::Object(map) => {
            map.iter().map(|(key, inner)| key.len() + 16 + approximate_size(inner)).sum()
        }
        Value::Array(items) => items.iter().map(|item| 16 + approximate_size(item)).sum(),
        Value::String(text) => text.len() + 16,
        _ => 16,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use serde_json::json;

    use super::*;

    /// What the log writes for `arguments`, as a value.
    fn written(arguments: &Value, max_bytes: usize) -> Value {
        serde_json::to_value(prepare(arguments, max_bytes)).unwrap()
    }

    #[test]
    fn every_pattern_compiles() {
        for pattern in PATTERNS {
            Regex::new(pattern.regex).unwrap_or_else(|err| panic!("{}: {err}", pattern.name));
        }
        assert!(COMPILED.is_some());
    }

    /// Each case: the text, and what must be left of it.
    #[test]
    fn secrets_in_free_text_are_redacted() {
        let cases = [
            (
                "API_TOKEN=sk-live-4f9a8b7c6d5e4f3a2b1c git status",
                "API_TOKEN=[redacted] git status",
            ),
            ("sk-live-4f9a8b7c6d5e4f3a2b1c", "[redacted]"),
            ("echo ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8", "echo [redacted]"),
            (
                "git clone https://x:gho_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6@github.com/a/b",
                "git clone https://x:[redacted]@github.com/a/b",
            ),
            ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "[redacted]"),
            ("glpat-AbCdEfGhIjKlMnOpQrSt rest", "[redacted] rest"),
            ("SLACK=xoxb-1234567890-abcdefghij", "SLACK=[redacted]"),
            (
                "curl https://hooks.slack.com/services/T000/B000/XXXX",
                "curl https://hooks.slack.com/services/[redacted]",
            ),
            ("aws s3 ls AKIAIOSFODNN7EXAMPLE", "aws s3 ls [redacted]"),
            (
                "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                "aws_secret_access_key = [redacted]",
            ),
            (
                "curl -H 'Authorization: Bearer abc.def-ghi' https://x",
                "curl -H 'Authorization: Bearer [redacted]' https://x",
            ),
            (
                "curl -H \"Authorization: token abcdef123\" x",
                "curl -H \"Authorization: token [redacted]\" x",
            ),
            ("bearer eyJhbGciOi", "bearer [redacted]"),
            ("psql postgres://admin:hunter2@db/prod", "psql postgres://admin:[redacted]@db/prod"),
            ("password=hunter2 next", "password=[redacted] next"),
            ("db.passwd: 'a b c' rest", "db.passwd: [redacted] rest"),
            ("secret=\"x y\"", "secret=[redacted]"),
            ("mysql --password hunter2 -h db", "mysql --password [redacted] -h db"),
            ("tool --api-key=abc123 run", "tool --api-key=[redacted] run"),
            ("curl -u alice:s3cret https://x", "curl -u alice:[redacted] https://x"),
            (
                "{\"command\": \"ls\", \"token\": \"abc\"",
                "{\"command\": \"ls\", \"token\": [redacted]",
            ),
            ("x AIzaSyA1234567890abcdefghijklmnopqrstuv y", "x [redacted] y"),
            ("npm_abcdefghijklmnopqrstuvwxyz0123456789", "[redacted]"),
            (
                "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
                "[redacted]",
            ),
            (
                "key: -----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEA\n-----END OPENSSH PRIVATE KEY-----\nafter",
                "key: [redacted]\nafter",
            ),
            ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow (cut off)", "[redacted]"),
        ];
        for (text, expected) in cases {
            assert_eq!(redact_text(text).as_deref(), Some(expected), "{text}");
        }
    }

    #[test]
    fn ordinary_text_is_kept() {
        for text in [
            "git status",
            "git log --author=alice --oneline",
            "sort --key=2 file",
            "cargo test -p toolgate",
            "src/auth.rs",
            "ssh-keygen -t ed25519",
            "the tokenizer",
            "https://example.com/path",
        ] {
            assert_eq!(redact_text(text), None, "{text}");
        }
    }

    #[test]
    fn secret_keys_are_redacted_at_any_depth() {
        let mut args = json!({
            "command": "deploy",
            "env": {"GITHUB_TOKEN": "ghp_x", "PATH": "/bin", "nested": [{"ApiKey": 7}]},
            "Authorization": {"scheme": "Bearer", "value": "x"},
            "db_password": null,
            "items": [{"client_secret": "s", "name": "n"}, "plain"],
            "credentials_file": "/x",
        });
        let expected = json!({
            "command": "deploy",
            "env": {"GITHUB_TOKEN": "[redacted]", "PATH": "/bin", "nested": [{"ApiKey": "[redacted]"}]},
            "Authorization": "[redacted]",
            "db_password": "[redacted]",
            "items": [{"client_secret": "[redacted]", "name": "n"}, "plain"],
            "credentials_file": "[redacted]",
        });
        assert_eq!(written(&args, 1 << 20), expected);
        redact(&mut args);
        assert_eq!(args, expected);
    }

    #[test]
    fn contents_become_size_and_hash() {
        let prepared = written(
            &json!({"path": "a.txt", "content": "password=hunter2\n", "old_string": "", "new_string": "x"}),
            1 << 20,
        );
        assert_eq!(
            prepared,
            json!({
                "path": "a.txt",
                "content": "[17 bytes, sha256:e24c8274d50b6074851f94ad4534fe5930e4e058fe1f3df6ff897034a436156b]",
                "old_string": "[0 bytes, sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855]",
                "new_string": "[1 bytes, sha256:2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881]",
            })
        );
    }

    #[test]
    fn a_raw_string_that_is_not_json_is_redacted_as_text() {
        let raw =
            Value::String("{\"path\": \"x\", \"token\": \"abc123\", \"api_key\":'k'".to_owned());
        assert_eq!(
            written(&raw, 1 << 20),
            json!("{\"path\": \"x\", \"token\": [redacted], \"api_key\":[redacted]")
        );
    }

    #[test]
    fn oversized_text_and_arguments_become_size_and_hash() {
        let long = "x".repeat(300);
        let prepared = written(&json!({"path": long.clone(), "n": 1}), 200);
        let hash = hex(&Sha256::digest(long.as_bytes()));
        assert_eq!(prepared, json!({"path": format!("[300 bytes, sha256:{hash}]"), "n": 1}));

        // Many small values: the whole is summarized.
        let many: Vec<Value> = (0..100).map(|idx| json!(idx)).collect();
        let args = json!({"items": many});
        let encoded = serde_json::to_vec(&args).unwrap();
        let expected = summary(encoded.len(), &Sha256::digest(&encoded));
        assert_eq!(written(&args, 200), json!(expected));
    }
}
