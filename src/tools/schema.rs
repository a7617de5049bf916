//! Compiling a tool's input schema into the validator the Registry checks arguments
//! with.
//!
//! Tool schemas are JSON Schema 2020-12 (the MCP default). Compiling one first checks
//! it against its draft's meta-schema, and the 2020-12 meta-schema is expensive to
//! build: about 20 ms and 13 MiB the first time in a process, most of it never given
//! back. The 2019-09 meta-schema costs a tenth of that. For the keywords that tool
//! schemas use (types, properties, required, enums, bounds, object-valued `items`,
//! `$defs` and `$ref`), the two drafts validate identically; they differ only in the
//! tuple keywords (`prefixItems`, array-valued `items`, `additionalItems`) and the
//! dynamic/recursive references. So a schema that uses none of those, and does not
//! name a draft of its own, is compiled under 2019-09 — same verdicts, a fraction of
//! the start-up cost and memory — and every other schema under the draft it names, or
//! 2020-12 when it names none.

use serde_json::Value;

/// Keywords whose meaning differs between 2019-09 and 2020-12 (or that exist in only
/// one of them). Looked for anywhere in the schema, property names included, which
/// only ever errs towards the exact 2020-12 compile.
const DRAFT_SENSITIVE_KEYWORDS: &[&str] = &[
    "prefixItems",
    "additionalItems",
    "$dynamicRef",
    "$dynamicAnchor",
    "$recursiveRef",
    "$recursiveAnchor",
    "$schema",
];

/// The draft a schema is compiled under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompiledAs {
    /// 2019-09, whose verdicts are the same as 2020-12's for this schema.
    Equivalent201909,
    /// The draft the schema names, or 2020-12.
    AsDeclared,
}

/// Compiles `schema` into a validator (formats checked), or says why it is not a
/// valid schema.
pub fn compile(schema: &Value) -> Result<(jsonschema::Validator, CompiledAs), String> {
    let options = jsonschema::options().should_validate_formats(true);
    let (options, compiled_as) = if draft_insensitive(schema) {
        (options.with_draft(jsonschema::Draft::Draft201909), CompiledAs::Equivalent201909)
    } else {
        (options, CompiledAs::AsDeclared)
    };
    options.build(schema).map(|validator| (validator, compiled_as)).map_err(|err| err.to_string())
}

/// Whether `schema` validates the same under 2019-09 as under 2020-12: no keyword
/// whose meaning differs, no array-valued `items`, and no `$schema` naming a draft.
fn draft_insensitive(schema: &Value) -> bool {
    match schema {
        Value::Object(map) => map.iter().all(|(key, value)| {
            let sensitive = DRAFT_SENSITIVE_KEYWORDS.contains(&key.as_str())
                || (key == "items" && value.is_array());
            !sensitive && draft_insensitive(value)
        }),
        Value::Array(items) => items.iter().all(draft_insensitive),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn verdicts(schema: &Value, draft: jsonschema::Draft, instances: &[Value]) -> Vec<bool> {
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .with_draft(draft)
            .build(schema)
            .unwrap();
        instances.iter().map(|instance| validator.is_valid(instance)).collect()
    }

    #[test]
    fn builtin_schemas_compile_under_the_cheap_draft_with_the_same_verdicts() {
        let samples = [
            json!({}),
            json!({"path": "a.txt"}),
            json!({"path": 3}),
            json!({"path": "a", "offset": -1}),
            json!({"path": "a", "limit": 0}),
            json!({"path": "a", "limit": 5, "offset": 2}),
            json!({"path": "a", "content": "x"}),
            json!({"path": "a", "old_string": "x", "new_string": "y", "replace_all": true}),
            json!({"command": "ls", "timeout_ms": 10}),
            json!({"command": "ls", "timeout_ms": "10"}),
            json!({"pattern": "*.rs", "path": "src", "limit": 3}),
            json!({"pattern": "fn", "output_mode": "count", "context": 2}),
            json!({"pattern": "fn", "output_mode": "nonsense"}),
            json!({"unknown": true}),
            json!([1, 2]),
            json!("text"),
        ];
        let builtins = crate::tools::builtin::all();
        assert!(builtins.len() >= 6);
        for tool in builtins {
            let schema = &tool.definition().input_schema;
            let (validator, compiled_as) = compile(schema).unwrap();
            assert_eq!(compiled_as, CompiledAs::Equivalent201909, "{}", tool.definition().name);
            let strict = verdicts(schema, jsonschema::Draft::Draft202012, &samples);
            let cheap: Vec<bool> = samples.iter().map(|s| validator.is_valid(s)).collect();
            assert_eq!(cheap, strict, "{}", tool.definition().name);
            // And every built-in schema is a valid 2020-12 schema.
            assert!(jsonschema::meta::is_valid(schema), "{}", tool.definition().name);
        }
    }

    #[test]
    fn tuple_and_dynamic_keywords_keep_the_declared_draft() {
        let tuple = json!({"type": "array", "prefixItems": [{"type": "integer"}], "items": false});
        let (validator, compiled_as) = compile(&tuple).unwrap();
        assert_eq!(compiled_as, CompiledAs::AsDeclared);
        // 2020-12 semantics: one integer and nothing more.
        assert!(validator.is_valid(&json!([1])));
        assert!(!validator.is_valid(&json!([1, 2])));
        assert!(!validator.is_valid(&json!(["a"])));

        let array_items = json!({"type": "array", "items": [{"type": "string"}]});
        assert!(!draft_insensitive(&array_items));
        // 2020-12 has no array form of `items`; 2019-09 would have read it as a tuple.
        assert!(compile(&array_items).is_err());

        let declared =
            json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"});
        assert_eq!(compile(&declared).unwrap().1, CompiledAs::AsDeclared);

        let nested = json!({"type": "object", "properties": {"x": {"$dynamicRef": "#meta"}}});
        assert!(!draft_insensitive(&nested));
        let object_items = json!({"type": "array", "items": {"type": "string"}, "minItems": 1});
        assert!(draft_insensitive(&object_items));
    }

    #[test]
    fn invalid_schemas_are_refused_under_either_draft() {
        let cheap = json!({"type": "object", "properties": {"n": {"type": "integr"}}});
        assert!(draft_insensitive(&cheap));
        assert!(compile(&cheap).is_err());
        let exact = json!({"type": "array", "prefixItems": {"type": "integr"}});
        assert!(!draft_insensitive(&exact));
        assert!(compile(&exact).is_err());
    }
}
