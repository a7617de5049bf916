//! Serializing long text fields (a result's `content`) as JSON strings quickly.
//!
//! A file's text is most of every read_file answer, and JSON-escaping it byte by byte
//! was the largest single cost of answering a call. Here, sixteen bytes are checked at
//! a time for anything that needs escaping (`"`, `\` and control characters); clean
//! blocks are copied as they are, and the bytes around an escape eight at a time. The
//! output is byte for byte what `serde_json` writes for the same string, so readers
//! see no difference.

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
    // takes a `RawValue`, without parsing it again to check it: `escape_into` writes a
    // valid string literal by construction (the tests compare it with serde_json's
    // output, byte for byte).
    let mut raw = serializer.serialize_struct(RAW_VALUE_TOKEN, 1)?;
    // Escaped into this thread's scratch buffer, reused from call to call (a read's
    // answer is the same few kilobytes every time), then copied into the line.
    super::scratch::with(&SCRATCH, SCRATCH_KEEP_BYTES, |scratch: &mut Vec<u8>| {
        escape_into(scratch, text);
        // Escaping a `str` only ever adds ASCII: the literal is UTF-8.
        match std::str::from_utf8(scratch) {
            Ok(literal) => raw.serialize_field(RAW_VALUE_TOKEN, literal),
            Err(err) => Err(serde::ser::Error::custom(err)),
        }
    })?;
    raw.end()
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The most a thread's scratch buffer keeps between texts; a larger one is freed.
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
    let mut out = Vec::with_capacity(text.len() + text.len() / 16 + 2);
    escape_into(&mut out, text);
    // Escaping a `str` only ever adds ASCII, so the literal is UTF-8; should that ever
    // fail, serde_json's own escaper gives the same literal.
    String::from_utf8(out).unwrap_or_else(|_| serde_json::to_string(text).unwrap_or_default())
}

/// Appends `text` as a JSON string literal, quotes included: byte for byte what
/// serde_json writes. Sixteen bytes are checked at a time (a comparison the compiler
/// does in vector registers) and a clean block is copied whole; in a block with
/// something to escape, each eight-byte word's escapes are found exactly from its
/// mask, and the clean bytes around them are copied eight at a time.
pub fn escape_into(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    // Escaped bytes gather in `stage` and go to the output in a few large copies. Its
    // length is a local of its own, apart from the buffer (whose address the copies
    // take), so that the compiler keeps it in a register rather than in memory.
    let mut stage = [0u8; STAGE_BYTES];
    let mut len = 0;
    let mut blocks = bytes.chunks_exact(BLOCK);
    for block in &mut blocks {
        if len + BLOCK / WORD * WORD_ROOM > STAGE_BYTES {
            out.extend_from_slice(&stage[..len]);
            len = 0;
        }
        // Not `any`: a fold without early exit is what the compiler vectorizes.
        if !block.iter().fold(false, |dirty, &byte| dirty | needs_escape(byte)) {
            stage[len..len + BLOCK].copy_from_slice(block);
            len += BLOCK;
            continue;
        }
        for word in block.chunks_exact(WORD) {
            len = escape_word(&mut stage, len, word);
        }
    }
    for piece in blocks.remainder().chunks(WORD) {
        if len + WORD_ROOM > STAGE_BYTES {
            out.extend_from_slice(&stage[..len]);
            len = 0;
        }
        if piece.len() == WORD {
            len = escape_word(&mut stage, len, piece);
        } else {
            for &byte in piece {
                let (escaped, kept) =
                    if needs_escape(byte) { escape_of(byte) } else { (u64::from(byte), 1) };
                len = store(&mut stage, len, escaped, kept);
            }
        }
    }
    out.extend_from_slice(&stage[..len]);
    out.push(b'"');
}

/// Bytes checked together for anything to escape.
const BLOCK: usize = 16;
const WORD: usize = 8;
/// The most a word's escaping writes past where it starts: eight six-byte escapes,
/// the last of them stored as a whole word.
const WORD_ROOM: usize = WORD * 6 + WORD;
/// How many escaped bytes gather before they are copied to the output.
const STAGE_BYTES: usize = 1024;

/// Writes `value`'s eight bytes (little-endian) at `len` and keeps the first `keep`:
/// the rest are overwritten by the next store or left out when the stage is copied.
/// Returns the new length.
fn store(stage: &mut [u8; STAGE_BYTES], len: usize, value: u64, keep: usize) -> usize {
    stage[len..len + WORD].copy_from_slice(&value.to_le_bytes());
    len + keep
}

/// Eight bytes, escaped into the stage at `len`; returns the new length.
fn escape_word(stage: &mut [u8; STAGE_BYTES], mut len: usize, bytes: &[u8]) -> usize {
    let mut word = [0u8; WORD];
    word.copy_from_slice(bytes);
    let word = u64::from_le_bytes(word);
    let mut mask = escape_mask(word);
    let mut from = 0;
    while mask != 0 {
        // The flag of byte i is bit 8i + 7 (little-endian load).
        let at = (mask.trailing_zeros() / 8) as usize;
        len = store(stage, len, word >> (8 * from), at - from);
        let (escaped, kept) = escape_of(bytes[at]);
        len = store(stage, len, escaped, kept);
        from = at + 1;
        mask &= mask - 1;
    }
    if from < WORD {
        len = store(stage, len, word >> (8 * from), WORD - from);
    }
    len
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
    (byte < 0x20) | (byte == b'"') | (byte == b'\\')
}

/// The escape of a byte that needs one, as the little-endian word of its bytes and
/// their count: serde_json's short forms where JSON has them, `\u00XX` otherwise.
fn escape_of(byte: u8) -> (u64, usize) {
    const fn short(letter: u8) -> (u64, usize) {
        (u64::from_le_bytes([b'\\', letter, 0, 0, 0, 0, 0, 0]), 2)
    }
    const CONTROL: [(u64, usize); 32] = {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut table = [(0, 0); 32];
        let mut byte = 0;
        while byte < 32 {
            table[byte] = match byte {
                0x08 => short(b'b'),
                0x09 => short(b't'),
                0x0A => short(b'n'),
                0x0C => short(b'f'),
                0x0D => short(b'r'),
                _ => {
                    let hex = [b'\\', b'u', b'0', b'0', HEX[byte >> 4], HEX[byte & 0xF], 0, 0];
                    (u64::from_le_bytes(hex), 6)
                }
            };
            byte += 1;
        }
        table
    };
    match byte {
        b'"' => short(b'"'),
        b'\\' => short(b'\\'),
        _ => CONTROL[usize::from(byte & 0x1F)],
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
    fn escapes_are_right_wherever_blocks_words_and_the_staging_buffer_end() {
        let same = |text: &str| assert_eq!(escape(text), serde_json::to_string(text).unwrap());
        // One byte (or character) to escape or keep at every position of texts around
        // the word and block sizes.
        for len in 1..=2 * BLOCK + WORD + 3 {
            for at in 0..len {
                for special in ["\u{1}", "\"", "\\", "\n", "\t", "\u{7f}", "\u{e9}", "\u{1f980}"] {
                    same(&format!("{}{special}{}", "a".repeat(at), "b".repeat(len - at - 1)));
                }
            }
        }
        // Six-byte escapes only, and mixed runs, fill the staging buffer many times.
        same(&"\u{1}".repeat(3 * STAGE_BYTES));
        let mixed: String = (0..20 * STAGE_BYTES)
            .map(|i| {
                ['x', '\u{0}', '"', '\u{e9}', '\n', '\\', '\u{1f980}', '\u{1f}'][i * 7 % 11 % 8]
            })
            .collect();
        same(&mixed);
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
