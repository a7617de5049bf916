//! Long results as resource links: a `tools/call` result whose text is longer than
//! [`ResultLinks::threshold_bytes`], for a client whose protocol version has the
//! `resource_link` content block (2025-06-18 and later), is answered with a head and
//! a tail of the text plus a `resource_link` to the whole text
//! (`toolgate://results/<128-bit random id>`). `resources/read` on that uri returns
//! the text byte for byte, to the client identity the result was given to only
//! (another token, or another stdio conversation, is told it does not exist).
//!
//! The texts kept are bounded per identity in count and bytes (the oldest are
//! forgotten first) and each is forgotten one TTL after it was kept. A text too large
//! to be kept at all is sent inline, as to a client without resource links.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rmcp::ErrorData as McpError;
use rmcp::model::ReadResourceResult;
use serde_json::json;

/// The uri prefix of a kept result.
pub const RESULT_URI_PREFIX: &str = "toolgate://results/";

/// The MIME type of a kept result (tool results are text).
pub const RESULT_MIME_TYPE: &str = "text/plain";

/// The longest excerpt at each end of a linked result.
const EXCERPT_BYTES: usize = 8 * 1024;

/// When results become links and how many are kept.
#[derive(Clone, Debug)]
pub struct ResultLinks {
    /// A result whose text is longer than this (in bytes) is answered with an
    /// excerpt and a link; `0` never links.
    pub threshold_bytes: usize,
    /// Results kept per client identity; the oldest is forgotten first.
    pub max_kept: usize,
    /// Bytes of result text kept per client identity; the oldest are forgotten first.
    pub max_kept_bytes: usize,
    /// How long a kept result stays readable.
    pub ttl: Duration,
}

/// The default of [`ResultLinks::threshold_bytes`].
pub const DEFAULT_LINK_THRESHOLD_BYTES: usize = 64 * 1024;

impl Default for ResultLinks {
    fn default() -> ResultLinks {
        ResultLinks {
            threshold_bytes: DEFAULT_LINK_THRESHOLD_BYTES,
            max_kept: 32,
            max_kept_bytes: 64 * 1024 * 1024,
            ttl: Duration::from_secs(30 * 60),
        }
    }
}

/// A long text as it is answered: the excerpt that stands for it and where the
/// whole of it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Linked {
    pub uri: String,
    pub excerpt: String,
    /// The whole text's length in bytes.
    pub size: usize,
}

struct Kept {
    id: String,
    text: Arc<str>,
    kept_at: Instant,
}

/// The kept results of one MCP face, by owner.
pub(crate) struct ResultStore {
    options: ResultLinks,
    owners: Mutex<HashMap<String, VecDeque<Kept>>>,
}

impl ResultStore {
    pub(crate) fn new(options: ResultLinks) -> ResultStore {
        ResultStore { options, owners: Mutex::new(HashMap::new()) }
    }

    /// Whether a text of this length is answered with a link.
    pub(crate) fn is_long(&self, text: &str) -> bool {
        self.options.threshold_bytes > 0 && text.len() > self.options.threshold_bytes
    }

    /// Keeps `text` for `owner` and returns how to answer with it; `None` when it
    /// cannot be kept (larger than the whole store, or no randomness for an id).
    pub(crate) fn keep(&self, owner: &str, text: &str) -> Option<Linked> {
        if text.len() > self.options.max_kept_bytes || self.options.max_kept == 0 {
            return None;
        }
        let id = match super::random_hex() {
            Ok(id) => id,
            Err(err) => {
                tracing::error!(%err, "no random id for a long result; sending it inline");
                return None;
            }
        };
        let uri = format!("{RESULT_URI_PREFIX}{id}");
        let mut owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        self.expire(&mut owners);
        let kept = owners.entry(owner.to_owned()).or_default();
        let mut bytes: usize = kept.iter().map(|entry| entry.text.len()).sum();
        while !kept.is_empty()
            && (kept.len() >= self.options.max_kept
                || bytes.saturating_add(text.len()) > self.options.max_kept_bytes)
        {
            if let Some(oldest) = kept.pop_front() {
                bytes -= oldest.text.len();
            }
        }
        kept.push_back(Kept { id, text: Arc::from(text), kept_at: Instant::now() });
        let excerpt = excerpt(text, self.options.threshold_bytes, &uri);
        Some(Linked { uri, excerpt, size: text.len() })
    }

    /// The whole text behind `uri`, if `owner` was given it and it is still kept.
    pub(crate) fn read(&self, owner: &str, uri: &str) -> Option<Arc<str>> {
        let id = uri.strip_prefix(RESULT_URI_PREFIX)?;
        let mut owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        self.expire(&mut owners);
        owners.get(owner)?.iter().find(|entry| entry.id == id).map(|entry| entry.text.clone())
    }

    /// `resources/read` of a kept result.
    pub(crate) fn read_resource(
        &self,
        owner: &str,
        uri: &str,
    ) -> Result<ReadResourceResult, McpError> {
        let Some(text) = self.read(owner, uri) else {
            return Err(McpError::resource_not_found(
                format!("resource not found: {uri}"),
                Some(json!({"uri": uri})),
            ));
        };
        let contents = json!({
            "resultType": "complete",
            "contents": [{"uri": uri, "mimeType": RESULT_MIME_TYPE, "text": &*text}],
        });
        serde_json::from_value(contents)
            .map_err(|err| McpError::internal_error(err.to_string(), None))
    }

    fn expire(&self, owners: &mut HashMap<String, VecDeque<Kept>>) {
        for kept in owners.values_mut() {
            kept.retain(|entry| entry.kept_at.elapsed() < self.options.ttl);
        }
        owners.retain(|_, kept| !kept.is_empty());
    }
}

/// The head and the tail of a long text around a marker naming the omitted part and
/// where the whole text is; never longer than about `threshold` bytes.
fn excerpt(text: &str, threshold: usize, uri: &str) -> String {
    let side = EXCERPT_BYTES.min(threshold / 2);
    let head = floor_boundary(text, side);
    let tail = ceil_boundary(text, text.len().saturating_sub(side)).max(head);
    let omitted = tail - head;
    format!(
        "{}\n[... {omitted} bytes omitted; the whole result ({} bytes) is the resource {uri} \
         (resources/read) ...]\n{}",
        &text[..head],
        text.len(),
        &text[tail..]
    )
}

fn floor_boundary(text: &str, mut index: usize) -> usize {
    index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

fn ceil_boundary(text: &str, mut index: usize) -> usize {
    index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index += 1;
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(max_kept: usize, max_kept_bytes: usize) -> ResultStore {
        ResultStore::new(ResultLinks {
            threshold_bytes: 16,
            max_kept,
            max_kept_bytes,
            ttl: Duration::from_secs(60),
        })
    }

    #[test]
    fn excerpt_keeps_head_and_tail_on_char_boundaries() {
        let text = format!("{}{}", "é".repeat(20), "z".repeat(20));
        let linked = store(4, 1024).keep("a", &text).unwrap();
        assert!(linked.excerpt.starts_with("éééé"), "{}", linked.excerpt);
        assert!(linked.excerpt.ends_with("zzzzzzzz"), "{}", linked.excerpt);
        assert!(linked.excerpt.contains(&linked.uri));
        assert_eq!(linked.size, text.len());
    }

    #[test]
    fn only_the_owner_reads_and_the_store_is_bounded() {
        let store = store(2, 100);
        let first = store.keep("a", &"1".repeat(40)).unwrap();
        assert_eq!(store.read("a", &first.uri).as_deref(), Some(&*"1".repeat(40)));
        assert!(store.read("b", &first.uri).is_none());
        let second = store.keep("a", &"2".repeat(40)).unwrap();
        let third = store.keep("a", &"3".repeat(40)).unwrap();
        // Count bound: the first is gone.
        assert!(store.read("a", &first.uri).is_none());
        assert!(store.read("a", &second.uri).is_some());
        // The count bound evicts the second, the byte bound (40 + 70 > 100) the third.
        let fourth = store.keep("a", &"4".repeat(70)).unwrap();
        assert!(store.read("a", &second.uri).is_none());
        assert!(store.read("a", &third.uri).is_none());
        assert!(store.read("a", &fourth.uri).is_some());
        // Larger than the store: not kept.
        assert!(store.keep("a", &"5".repeat(101)).is_none());
    }

    #[test]
    fn expired_results_are_forgotten() {
        let store = ResultStore::new(ResultLinks {
            threshold_bytes: 16,
            max_kept: 4,
            max_kept_bytes: 1024,
            ttl: Duration::ZERO,
        });
        let linked = store.keep("a", &"x".repeat(40)).unwrap();
        assert!(store.read("a", &linked.uri).is_none());
    }
}
