//! [`Metadata`]: the structured facts of a [`super::ToolResult`].
//!
//! On the wire it is a JSON object whose keys are sorted, as a
//! `serde_json::Map<String, Value>` writes it; in memory it is a short vector kept in
//! key order, whose keys are the tools' own `&'static str`s. A result carries a handful
//! of entries, and each key of a `Map` was a fresh `String` and the map a tree node:
//! about a fifth of what a small call allocated.

use std::borrow::Cow;
use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// Entries a result's metadata has room for at its first: a file read reports nine,
/// a command about as many.
const FIRST_ROOM: usize = 12;

/// A result's metadata: keys in order, each once.
#[derive(Clone, Default, PartialEq)]
pub struct Metadata(Vec<(Cow<'static, str>, Value)>);

impl Metadata {
    pub fn new() -> Metadata {
        Metadata(Vec::new())
    }

    /// Sets `key` to `value`, replacing what it held.
    pub fn insert(&mut self, key: impl Into<Cow<'static, str>>, value: Value) {
        let key = key.into();
        // A key past the last one (as a tool that reports its facts in key order gives
        // them) goes on the end without a search.
        let at_end = self.0.last().is_none_or(|(last, _)| last.as_ref() < key.as_ref());
        let position = if at_end { Err(self.0.len()) } else { self.position(&key) };
        match position {
            Ok(at) => self.0[at].1 = value,
            Err(at) => {
                if self.0.capacity() == 0 {
                    // Room for what nearly every tool reports, in one allocation.
                    self.0.reserve_exact(FIRST_ROOM);
                }
                self.0.insert(at, (key, value));
            }
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.position(key).ok().map(|at| &self.0[at].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_ok()
    }

    /// The entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.0.iter().map(|(key, value)| (key.as_ref(), value))
    }

    fn position(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(held, _)| held.as_ref().cmp(key))
    }
}

/// `metadata["key"]`, as on a JSON map: panics when the key is not there.
impl std::ops::Index<&str> for Metadata {
    type Output = Value;

    fn index(&self, key: &str) -> &Value {
        self.get(key).unwrap_or_else(|| panic!("no metadata {key:?}"))
    }
}

impl fmt::Debug for Metadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for Metadata {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in &self.0 {
            map.serialize_entry(key.as_ref(), value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Metadata, D::Error> {
        struct Entries;

        impl<'de> Visitor<'de> for Entries {
            type Value = Metadata;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Metadata, A::Error> {
                let mut metadata = Metadata::new();
                // A key given twice keeps its last value, as a JSON map does.
                while let Some((key, value)) = access.next_entry::<String, Value>()? {
                    metadata.insert(key, value);
                }
                Ok(metadata)
            }
        }

        deserializer.deserialize_map(Entries)
    }
}

/// The schema of a JSON object with any values, as for `serde_json::Map`.
impl schemars::JsonSchema for Metadata {
    fn schema_name() -> Cow<'static, str> {
        <serde_json::Map<String, Value> as schemars::JsonSchema>::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        <serde_json::Map<String, Value> as schemars::JsonSchema>::schema_id()
    }

    fn inline_schema() -> bool {
        <serde_json::Map<String, Value> as schemars::JsonSchema>::inline_schema()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <serde_json::Map<String, Value> as schemars::JsonSchema>::json_schema(generator)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn it_writes_and_reads_what_a_json_map_does() {
        let mut metadata = Metadata::new();
        metadata.insert("path", json!("/a \"b\""));
        metadata.insert("bytes", json!(4096));
        metadata.insert("truncated", json!(false));
        metadata.insert("Zed", json!(null));
        metadata.insert("lines", json!([1, 2.5, {"z": 1, "a": 2}]));
        metadata.insert(String::from("call_id"), json!("c1"));
        metadata.insert("bytes", json!(4097));
        metadata.insert("é", json!("x"));

        let mut map = serde_json::Map::new();
        for (key, value) in [
            ("path", json!("/a \"b\"")),
            ("bytes", json!(4096)),
            ("truncated", json!(false)),
            ("Zed", json!(null)),
            ("lines", json!([1, 2.5, {"z": 1, "a": 2}])),
            ("call_id", json!("c1")),
            ("bytes", json!(4097)),
            ("é", json!("x")),
        ] {
            map.insert(key.to_owned(), value);
        }
        let text = serde_json::to_string(&metadata).unwrap();
        assert_eq!(text, serde_json::to_string(&map).unwrap());
        assert_eq!(
            text,
            r#"{"Zed":null,"bytes":4097,"call_id":"c1","lines":[1,2.5,{"a":2,"z":1}],"path":"/a \"b\"","truncated":false,"é":"x"}"#
        );
        let back: Metadata = serde_json::from_str(&text).unwrap();
        assert_eq!(back, metadata);

        assert_eq!(metadata["bytes"], json!(4097));
        assert_eq!(metadata.get("call_id").and_then(Value::as_str), Some("c1"));
        assert!(metadata.contains_key("Zed") && !metadata.contains_key("zed"));
        assert_eq!(metadata.get("zed"), None);
        let keys: Vec<&str> = metadata.iter().map(|(key, _)| key).collect();
        assert_eq!(keys, ["Zed", "bytes", "call_id", "lines", "path", "truncated", "é"]);
    }

    #[test]
    fn a_key_given_twice_keeps_its_last_value() {
        let metadata: Metadata = serde_json::from_str(r#"{"b":1,"a":2,"b":3}"#).unwrap();
        assert_eq!(serde_json::to_string(&metadata).unwrap(), r#"{"a":2,"b":3}"#);
        assert!(serde_json::from_str::<Metadata>("[1]").is_err());
    }

    proptest::proptest! {
        // Keys in order (taken at the end), out of order and repeated alike.
        #[test]
        fn any_inserts_read_as_a_json_maps(entries in proptest::collection::vec(("[a-e]{0,3}", 0u8..4), 0..12)) {
            let mut metadata = Metadata::new();
            let mut map = serde_json::Map::new();
            for (key, value) in entries {
                metadata.insert(key.clone(), json!(value));
                map.insert(key, json!(value));
            }
            proptest::prop_assert_eq!(
                serde_json::to_string(&metadata).unwrap(),
                serde_json::to_string(&map).unwrap()
            );
        }
    }

    #[test]
    fn its_schema_is_a_json_maps() {
        let ours = schemars::schema_for!(Metadata);
        let map = schemars::schema_for!(serde_json::Map<String, Value>);
        assert_eq!(ours, map);
    }
}
