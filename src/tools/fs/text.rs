//! Deciding whether file bytes are text, decoding them, and encoding edited text back
//! the way the file was stored.
//!
//! read_file shows text to the model as UTF-8; edit_file must write a file back in
//! its own encoding and with its own line endings, or a one-line edit would rewrite
//! every byte of a UTF-16 or CRLF file. Only encodings that can be detected without
//! guessing are decoded: UTF-8 (with or without a BOM) and UTF-16 with a BOM.

use std::borrow::Cow;

/// How many leading bytes are inspected for NUL bytes when deciding a file without a
/// BOM is binary. Git and ripgrep use the same window: enough to catch every common
/// binary format (their headers contain NULs) without scanning a whole large file.
pub const BINARY_SNIFF_BYTES: usize = 8 * 1024;

const UTF8_BOM: &[u8] = &[0xEF, 0xBB, 0xBF];
const UTF16LE_BOM: &[u8] = &[0xFF, 0xFE];
const UTF16BE_BOM: &[u8] = &[0xFE, 0xFF];
/// Starts with the UTF-16LE BOM too; must be told apart before it.
const UTF32LE_BOM: &[u8] = &[0xFF, 0xFE, 0x00, 0x00];

/// How a text file is stored on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextEncoding {
    Utf8,
    Utf8Bom,
    Utf16Le,
    Utf16Be,
}

impl TextEncoding {
    /// The name shown in results' metadata.
    pub fn as_str(self) -> &'static str {
        match self {
            TextEncoding::Utf8 => "utf-8",
            TextEncoding::Utf8Bom => "utf-8-bom",
            TextEncoding::Utf16Le => "utf-16le",
            TextEncoding::Utf16Be => "utf-16be",
        }
    }
}

/// A file's bytes as text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// The text without its BOM: borrowed from the bytes when they were valid UTF-8
    /// already (the common case costs no copy).
    pub text: Cow<'a, str>,
    pub encoding: TextEncoding,
    /// Some bytes were not valid in the encoding and were replaced with U+FFFD; the
    /// text cannot be written back without changing them.
    pub lossy: bool,
}

/// Why bytes were not decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotText {
    #[error("the file looks binary (it contains NUL bytes)")]
    Binary,
    #[error("the file is UTF-32, which is not supported")]
    Utf32,
}

/// Decodes file bytes: a BOM decides the encoding; without one, NUL bytes in the
/// first [`BINARY_SNIFF_BYTES`] mean binary, and anything else is UTF-8 (invalid
/// sequences replaced and reported as `lossy`).
pub fn decode(bytes: &[u8]) -> Result<Decoded<'_>, NotText> {
    if bytes.starts_with(UTF32LE_BOM) {
        return Err(NotText::Utf32);
    }
    if let Some(rest) = bytes.strip_prefix(UTF8_BOM) {
        let (text, lossy) = utf8(rest);
        return Ok(Decoded { text, encoding: TextEncoding::Utf8Bom, lossy });
    }
    if let Some(rest) = bytes.strip_prefix(UTF16LE_BOM) {
        let (text, lossy) = utf16(encoding_rs::UTF_16LE, rest);
        return Ok(Decoded { text, encoding: TextEncoding::Utf16Le, lossy });
    }
    if let Some(rest) = bytes.strip_prefix(UTF16BE_BOM) {
        let (text, lossy) = utf16(encoding_rs::UTF_16BE, rest);
        return Ok(Decoded { text, encoding: TextEncoding::Utf16Be, lossy });
    }
    let sniffed = &bytes[..bytes.len().min(BINARY_SNIFF_BYTES)];
    if memchr::memchr(0, sniffed).is_some() {
        return Err(NotText::Binary);
    }
    let (text, lossy) = utf8(bytes);
    Ok(Decoded { text, encoding: TextEncoding::Utf8, lossy })
}

/// Encodes text the way a file was stored, BOM included.
pub fn encode(text: &str, encoding: TextEncoding) -> Vec<u8> {
    match encoding {
        TextEncoding::Utf8 => text.as_bytes().to_vec(),
        TextEncoding::Utf8Bom => [UTF8_BOM, text.as_bytes()].concat(),
        TextEncoding::Utf16Le => {
            let mut out = UTF16LE_BOM.to_vec();
            out.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
            out
        }
        TextEncoding::Utf16Be => {
            let mut out = UTF16BE_BOM.to_vec();
            out.extend(text.encode_utf16().flat_map(u16::to_be_bytes));
            out
        }
    }
}

/// The length of `text` once [`encode`]d as `encoding`, BOM included, found without
/// encoding it.
pub fn encoded_len(text: &str, encoding: TextEncoding) -> usize {
    match encoding {
        TextEncoding::Utf8 => text.len(),
        TextEncoding::Utf8Bom => UTF8_BOM.len() + text.len(),
        TextEncoding::Utf16Le | TextEncoding::Utf16Be => {
            UTF16LE_BOM.len() + 2 * text.encode_utf16().count()
        }
    }
}

/// The longest text (in UTF-8 bytes) whose [`encode`]d form can fit in `bytes`: a
/// UTF-16 code unit (2 bytes) stands for at most 3 bytes of UTF-8.
pub fn max_text_len(bytes: usize, encoding: TextEncoding) -> usize {
    match encoding {
        TextEncoding::Utf8 => bytes,
        TextEncoding::Utf8Bom => bytes.saturating_sub(UTF8_BOM.len()),
        TextEncoding::Utf16Le | TextEncoding::Utf16Be => {
            (bytes.saturating_sub(UTF16LE_BOM.len()) / 2).saturating_mul(3)
        }
    }
}

/// Whether text uses CRLF line endings: more `\r\n` than bare `\n`. A mixed file
/// keeps its majority style for new lines.
pub fn uses_crlf(text: &str) -> bool {
    // Most text holds no carriage return at all: one quick scan settles it, without
    // counting lines or searching for pairs.
    if memchr::memchr(b'\r', text.as_bytes()).is_none() {
        return false;
    }
    let total = memchr::memchr_iter(b'\n', text.as_bytes()).count();
    let crlf = memchr::memmem::find_iter(text.as_bytes(), b"\r\n").count();
    crlf > 0 && crlf * 2 >= total
}

/// Converts every line ending to CRLF (`\r\n` stays, bare `\n` gains a `\r`).
pub fn to_crlf(text: &str) -> String {
    text.replace("\r\n", "\n").replace('\n', "\r\n")
}

/// Converts CRLF line endings to LF (for showing text and diffs).
pub fn to_lf(text: &str) -> Cow<'_, str> {
    if text.contains("\r\n") { Cow::Owned(text.replace("\r\n", "\n")) } else { Cow::Borrowed(text) }
}

fn utf8(bytes: &[u8]) -> (Cow<'_, str>, bool) {
    // The strict check is the fast one; the lossy walk only runs on invalid bytes.
    match std::str::from_utf8(bytes) {
        Ok(text) => (Cow::Borrowed(text), false),
        Err(_) => (Cow::Owned(String::from_utf8_lossy(bytes).into_owned()), true),
    }
}

fn utf16<'a>(encoding: &'static encoding_rs::Encoding, bytes: &'a [u8]) -> (Cow<'a, str>, bool) {
    encoding.decode_without_bom_handling(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_encoding_round_trips() {
        let text = "première ligne\r\nzweite Zeile 🦀\r\n";
        for encoding in [
            TextEncoding::Utf8,
            TextEncoding::Utf8Bom,
            TextEncoding::Utf16Le,
            TextEncoding::Utf16Be,
        ] {
            let bytes = encode(text, encoding);
            let decoded = decode(&bytes).unwrap();
            assert_eq!(decoded, Decoded { text: text.into(), encoding, lossy: false });
            assert_eq!(encoded_len(text, encoding), bytes.len(), "{encoding:?}");
        }
    }

    #[test]
    fn the_longest_text_that_fits_is_bounded_by_its_widest_encoding() {
        // Three UTF-8 bytes each, one UTF-16 unit each: the widest ratio there is.
        let text = "€".repeat(10);
        for encoding in [TextEncoding::Utf16Le, TextEncoding::Utf16Be] {
            let bytes = encoded_len(&text, encoding);
            assert_eq!(max_text_len(bytes, encoding), text.len());
            assert_eq!(max_text_len(bytes - 1, encoding), text.len() - 3);
        }
        assert_eq!(max_text_len(10, TextEncoding::Utf8), 10);
        assert_eq!(max_text_len(10, TextEncoding::Utf8Bom), 7);
        assert_eq!(max_text_len(1, TextEncoding::Utf8Bom), 0);
    }

    #[test]
    fn nul_bytes_without_bom_mean_binary() {
        assert_eq!(decode(b"\x7fELF\x02\x01\x01\x00\x00"), Err(NotText::Binary));
        assert_eq!(decode(&[0xFF, 0xFE, 0, 0, b'a', 0, 0, 0]), Err(NotText::Utf32));
        // A NUL past the sniffed window does not make a text file binary.
        let mut late = vec![b'a'; BINARY_SNIFF_BYTES];
        late.push(0);
        assert!(decode(&late).is_ok());
    }

    #[test]
    fn invalid_utf8_is_lossy() {
        let decoded = decode(b"caf\xe9 au lait").unwrap();
        assert!(decoded.lossy);
        assert_eq!(decoded.text, "caf\u{FFFD} au lait");
    }

    #[test]
    fn crlf_detection_follows_the_majority() {
        assert!(uses_crlf("a\r\nb\r\nc\n"));
        assert!(!uses_crlf("a\nb\nc\r\n"));
        assert!(!uses_crlf("no newline at all"));
        assert!(!uses_crlf("a carriage return\ralone\n"));
        assert!(uses_crlf("\r\n"));
        assert_eq!(to_crlf("a\nb\r\nc"), "a\r\nb\r\nc");
        assert_eq!(to_lf("a\r\nb\n"), "a\nb\n");
    }
}
