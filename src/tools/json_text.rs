//! Serializing long text fields (a result's `content`) as JSON strings quickly.
//!
//! A file's text is most of every read_file answer, and JSON-escaping it byte by byte
//! was the largest single cost of answering a call. Here, eight bytes are checked at a
//! time for anything that needs escaping (`"`, `\` and control characters); clean
//! words are copied as they are. The output is byte for byte what `serde_json` writes
//! for the same string, so readers see no difference.

use serde::Serializer;
use serde::ser::SerializeStruct;
use serde_json::value::RawValue;

/// Below this many bytes the plain path is as fast and allocates nothing.
const FAST_PATH_BYTES: usize = 256;

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// `serialize_with` for long text fields: the same JSON as `serialize_str`.
pub fn serialize<S: Serializer>(text: &str, serializer: S) -> Result<S::Ok, S::Error> {
    if text.len() < FAST_PATH_BYTES {
        return serializer.serialize_str(text);
    }
    match serializer_kind::<S>() {
        // A `Value` holds the text itself: escaping it would only be undone.
        Kind::Value => return serializer.serialize_str(text),
        Kind::Other => {
            return match RawValue::from_string(escape(text)) {
                Ok(raw) => serde::Serialize::serialize(&raw, serializer),
                Err(_) => serializer.serialize_str(text),
            };
        }
        Kind::Text => {}
    }
    // serde_json's text serializer takes the escaped literal as it is, the way it
    // takes a `RawValue`, without parsing it again to check it: `escape` writes a
    // valid string literal by construction (the tests compare it with serde_json's
    // output, byte for byte).
    let mut raw = serializer.serialize_struct(RAW_VALUE_TOKEN, 1)?;
    // Escaped into this thread's scratch string, reused from call to call (a read's
    // answer is the same few kilobytes every time), then copied into the line.
    super::scratch::with(&SCRATCH, SCRATCH_KEEP_BYTES, |scratch: &mut String| {
        escape_into(scratch, text);
        raw.serialize_field(RAW_VALUE_TOKEN, scratch.as_str())
    })?;
    raw.end()
}

thread_local! {
    static SCRATCH: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// The most a thread's scratch string keeps between texts; a larger one is freed.
const SCRATCH_KEEP_BYTES: usize = 64 * 1024;

/// The name under which serde_json's serializers recognize raw JSON text (what
/// `RawValue` serializes as).
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

enum Kind {
    /// serde_json writing JSON text, which understands [`RAW_VALUE_TOKEN`].
    Text,
    /// serde_json building a `Value`.
    Value,
    /// Any other serializer.
    Other,
}

fn serializer_kind<S>() -> Kind {
    let name = std::any::type_name::<S>();
    if name.starts_with("&mut serde_json::ser::Serializer<") {
        Kind::Text
    } else if name == "serde_json::value::ser::Serializer" {
        Kind::Value
    } else {
        Kind::Other
    }
}

/// `text` as a JSON string literal, quotes included.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 16 + 2);
    escape_into(&mut out, text);
    out
}

/// Where escaped text goes: a `String`, or the `Vec<u8>` of a line being written.
pub trait Sink {
    fn push_str(&mut self, text: &str);
}

impl Sink for String {
    fn push_str(&mut self, text: &str) {
        String::push_str(self, text);
    }
}

impl Sink for Vec<u8> {
    fn push_str(&mut self, text: &str) {
        self.extend_from_slice(text.as_bytes());
    }
}

/// Appends `text` as a JSON string literal, quotes included: byte for byte what
/// serde_json writes. Eight bytes are looked at a time; the bytes that need escaping
/// in a word are found exactly from its mask, so a word with a tab or a quote costs
/// one step per such byte, not one per byte.
pub fn escape_into(out: &mut impl Sink, text: &str) {
    let bytes = text.as_bytes();
    out.push_str("\"");
    let mut clean_from = 0;
    let mut at = 0;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let mut mask = escape_mask(u64::from_le_bytes(word));
        while mask != 0 {
            // The flag of byte i is bit 8i + 7 (little-endian load).
            let index = at + (mask.trailing_zeros() / 8) as usize;
            // Escaped bytes are ASCII, so both cuts fall on character boundaries.
            out.push_str(&text[clean_from..index]);
            push_escape(out, bytes[index]);
            clean_from = index + 1;
            mask &= mask - 1;
        }
        at += 8;
    }
    for index in at..bytes.len() {
        if needs_escape(bytes[index]) {
            out.push_str(&text[clean_from..index]);
            push_escape(out, bytes[index]);
            clean_from = index + 1;
        }
    }
    out.push_str(&text[clean_from..]);
    out.push_str("\"");
}

/// The high bit of each of the eight bytes that is `"`, `\` or below 0x20, and no
/// other bit. Exact: every sum stays within its byte (at most 0x7F + 0x7F), so no
/// carry or borrow reaches a neighbour, unlike the "has zero byte" trick.
fn escape_mask(word: u64) -> u64 {
    const LOW7: u64 = ONES * 0x7F;
    // A byte's high bit ends up set iff its low seven bits are not zero.
    let zero = |value: u64| !(((value & LOW7) + LOW7) | value) & HIGHS;
    // ... iff its low seven bits are 0x20 or more.
    let below_space = !(((word & LOW7) + ONES * 0x60) | word) & HIGHS;
    below_space | zero(word ^ (ONES * u64::from(b'"'))) | zero(word ^ (ONES * u64::from(b'\\')))
}

/// Whether a byte needs escaping: `"`, `\` and the control characters.
fn needs_escape(byte: u8) -> bool {
    byte < 0x20 || byte == b'"' || byte == b'\\'
}

/// Appends the escape of a byte that needs one.
fn push_escape(out: &mut impl Sink, byte: u8) {
    const CONTROL: [&str; 32] = [
        "\\u0000", "\\u0001", "\\u0002", "\\u0003", "\\u0004", "\\u0005", "\\u0006", "\\u0007",
        "\\b", "\\t", "\\n", "\\u000b", "\\f", "\\r", "\\u000e", "\\u000f", "\\u0010", "\\u0011",
        "\\u0012", "\\u0013", "\\u0014", "\\u0015", "\\u0016", "\\u0017", "\\u0018", "\\u0019",
        "\\u001a", "\\u001b", "\\u001c", "\\u001d", "\\u001e", "\\u001f",
    ];
    out.push_str(match byte {
        b'"' => "\\\"",
        b'\\' => "\\\\",
        _ => CONTROL[usize::from(byte & 0x1F)],
    });
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn every_byte_that_needs_it_is_escaped_as_serde_json_does() {
        let all: String = (0u8..=0x7F).map(char::from).collect();
        let text = format!("{all}é🦀 {all}").repeat(5);
        assert_eq!(escape(&text), serde_json::to_string(&text).unwrap());
        // The mask flags exactly the bytes that need escaping, wherever they are and
        // whatever their neighbours (a borrow from a flagged byte flags nothing else).
        for byte in 0u8..=0xFF {
            for neighbour in [0u8, b'"', 0x1F, 0x20, 0x7F, 0x80, 0xFF] {
                for position in 0..8 {
                    let mut word = [neighbour; 8];
                    word[position] = byte;
                    let expected = word.iter().enumerate().fold(0u64, |mask, (index, &b)| {
                        if needs_escape(b) { mask | 0x80 << (8 * index) } else { mask }
                    });
                    assert_eq!(
                        escape_mask(u64::from_le_bytes(word)),
                        expected,
                        "{byte:#x} at {position} among {neighbour:#x}"
                    );
                }
            }
        }
    }

    #[test]
    fn long_text_fields_serialize_like_plain_strings() {
        #[derive(serde::Serialize)]
        struct Holder<'a> {
            #[serde(serialize_with = "serialize")]
            text: &'a str,
        }
        let file = "     1\tfn main() {\n     2\t    println!(\"hi\\n\");\n".repeat(40);
        for text in ["short \"one\"\n", file.as_str()] {
            let ours = serde_json::to_string(&Holder { text }).unwrap();
            let plain = serde_json::to_string(&serde_json::json!({ "text": text })).unwrap();
            assert_eq!(ours, plain);
            let value = serde_json::to_value(Holder { text }).unwrap();
            assert_eq!(value["text"], text);
            let pretty = serde_json::to_string_pretty(&Holder { text }).unwrap();
            let plain = serde_json::to_string_pretty(&serde_json::json!({ "text": text })).unwrap();
            assert_eq!(pretty, plain);
        }
        // The unchecked path is the one taken for serde_json's text serializers.
        let text = |kind| matches!(kind, Kind::Text);
        assert!(text(serializer_kind::<&mut serde_json::Serializer<Vec<u8>>>()));
        assert!(text(serializer_kind::<&mut serde_json::Serializer<&mut Vec<u8>>>()));
        assert!(text(serializer_kind::<
            &mut serde_json::Serializer<Vec<u8>, serde_json::ser::PrettyFormatter<'static>>,
        >()));
        assert!(matches!(serializer_kind::<serde_json::value::Serializer>(), Kind::Value));
        assert!(matches!(serializer_kind::<String>(), Kind::Other));
    }

    proptest! {
        #[test]
        fn escaping_matches_serde_json(text in "\\PC*|[\\x00-\\x7f]{0,300}") {
            prop_assert_eq!(escape(&text), serde_json::to_string(&text).unwrap());
        }
    }
}
