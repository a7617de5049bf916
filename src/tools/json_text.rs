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
    raw.serialize_field(RAW_VALUE_TOKEN, &escape(text))?;
    raw.end()
}

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
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(bytes.len() + bytes.len() / 16 + 2);
    out.push('"');
    let mut clean_from = 0;
    let mut at = 0;
    while at + 8 <= bytes.len() {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[at..at + 8]);
        if !needs_escape(u64::from_le_bytes(word)) {
            at += 8;
            continue;
        }
        for index in at..at + 8 {
            if let Some(escaped) = escape_byte(bytes[index]) {
                // Escaped bytes are ASCII, so both cuts fall on character boundaries.
                out.push_str(&text[clean_from..index]);
                push_escape(&mut out, bytes[index], escaped);
                clean_from = index + 1;
            }
        }
        at += 8;
    }
    for index in at..bytes.len() {
        if let Some(escaped) = escape_byte(bytes[index]) {
            out.push_str(&text[clean_from..index]);
            push_escape(&mut out, bytes[index], escaped);
            clean_from = index + 1;
        }
    }
    out.push_str(&text[clean_from..]);
    out.push('"');
    out
}

/// Whether any of the eight bytes is `"`, `\` or below 0x20. Exact for presence
/// (the classic "has zero byte" and "has byte less than" word tricks).
fn needs_escape(word: u64) -> bool {
    let has_zero = |value: u64| value.wrapping_sub(ONES) & !value & HIGHS != 0;
    let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGHS != 0;
    below_space
        || has_zero(word ^ (ONES * u64::from(b'"')))
        || has_zero(word ^ (ONES * u64::from(b'\\')))
}

/// The short escape of a byte, `Some(0)` for one written as `\u00XX`, `None` when the
/// byte needs none.
fn escape_byte(byte: u8) -> Option<u8> {
    match byte {
        b'"' => Some(b'"'),
        b'\\' => Some(b'\\'),
        b'\n' => Some(b'n'),
        b'\t' => Some(b't'),
        b'\r' => Some(b'r'),
        0x08 => Some(b'b'),
        0x0C => Some(b'f'),
        0x00..=0x1F => Some(0),
        _ => None,
    }
}

fn push_escape(out: &mut String, byte: u8, escaped: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('\\');
    if escaped == 0 {
        out.push_str("u00");
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xF)]));
    } else {
        out.push(char::from(escaped));
    }
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
        for byte in 0u8..=0xFF {
            let word = u64::from_le_bytes([b'a', b'b', b'c', byte, b'd', b'e', b'f', b'g']);
            let must = byte < 0x20 || byte == b'"' || byte == b'\\';
            assert_eq!(needs_escape(word), must, "{byte:#x}");
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
