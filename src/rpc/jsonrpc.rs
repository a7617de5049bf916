//! JSON-RPC 2.0 framing: parsing one incoming message, and building responses,
//! errors and notifications. No I/O and no methods here.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

/// Standard error codes.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// The request was canceled by the client (LSP's RequestCancelled).
pub const REQUEST_CANCELLED: i64 = -32800;
/// The daemon is shutting down or over a limit.
pub const SERVER_BUSY: i64 = -32000;

/// One parsed incoming message. Its params stay JSON text: each method parses them
/// once, straight into its own type (a call's arguments stay text until the registry).
#[derive(Debug)]
pub enum Incoming {
    Request {
        id: Value,
        method: String,
        params: Params,
    },
    Notification {
        method: String,
        params: Params,
    },
    /// A response from the client (we send no requests on this protocol): ignored.
    Response,
}

/// A JSON-RPC error object.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into(), data: None }
    }

    pub fn invalid_params(message: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_PARAMS, message)
    }

    pub fn with_data(mut self, data: Value) -> RpcError {
        self.data = Some(data);
        self
    }
}

/// The answer to a frame that is not UTF-8.
pub fn not_utf8() -> RpcError {
    RpcError::new(PARSE_ERROR, "parse error: not UTF-8")
}

/// The answer to a frame over the size limit (it is skipped; the connection stays
/// usable).
pub fn too_large(max_message_bytes: usize) -> RpcError {
    RpcError::new(INVALID_REQUEST, format!("message larger than {max_message_bytes} bytes refused"))
}

/// What a malformed message deserves: the error, and the id to answer with (null when
/// it could not be read).
pub struct Malformed {
    pub id: Value,
    pub error: RpcError,
}

#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<&'a RawValue>,
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    params: Option<Box<RawValue>>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// Parses one message. Batches (arrays) are handled by the caller, element by element.
pub fn parse(text: &str) -> Result<Incoming, Malformed> {
    let envelope: Envelope<'_> = match serde_json::from_str(text) {
        Ok(envelope) => envelope,
        Err(err) if err.is_syntax() || err.is_eof() => {
            return Err(Malformed {
                id: Value::Null,
                error: RpcError::new(PARSE_ERROR, format!("parse error: {err}")),
            });
        }
        Err(err) => {
            return Err(Malformed {
                id: Value::Null,
                error: RpcError::new(INVALID_REQUEST, format!("invalid request: {err}")),
            });
        }
    };
    let id = envelope.id.clone().unwrap_or(Value::Null);
    if envelope.jsonrpc.map(RawValue::get) != Some("\"2.0\"") {
        return Err(Malformed {
            id,
            error: RpcError::new(INVALID_REQUEST, "invalid request: jsonrpc must be \"2.0\""),
        });
    }
    let params = Params(envelope.params);
    match (envelope.method, envelope.id) {
        (Some(method), Some(id)) => {
            if !(id.is_string() || id.is_number() || id.is_null()) {
                return Err(Malformed {
                    id: Value::Null,
                    error: RpcError::new(INVALID_REQUEST, "invalid request: bad id"),
                });
            }
            Ok(Incoming::Request { id, method, params })
        }
        (Some(method), None) => Ok(Incoming::Notification { method, params }),
        (None, Some(_)) if envelope.result.is_some() || envelope.error.is_some() => {
            Ok(Incoming::Response)
        }
        (None, _) => Err(Malformed {
            id,
            error: RpcError::new(INVALID_REQUEST, "invalid request: no method"),
        }),
    }
}

/// A success response line.
pub fn response<T: Serialize>(id: &Value, result: &T) -> String {
    response_sized(id, result, 128)
}

/// A success response line rendered into a buffer of `capacity` bytes to start with
/// (a close guess spares the copies of a growing buffer).
pub fn response_sized<T: Serialize>(id: &Value, result: &T, capacity: usize) -> String {
    #[derive(Serialize)]
    struct Response<'a, T> {
        jsonrpc: &'static str,
        id: &'a Value,
        result: &'a T,
    }
    let mut line = crate::tools::scratch::LINES.take(capacity);
    match serde_json::to_writer(&mut line, &Response { jsonrpc: "2.0", id, result }) {
        // serde_json writes UTF-8 only.
        Ok(()) => String::from_utf8(line).unwrap_or_default(),
        Err(err) => error_response(id, &RpcError::new(INTERNAL_ERROR, err.to_string())),
    }
}

/// An error response line.
pub fn error_response(id: &Value, error: &RpcError) -> String {
    #[derive(Serialize)]
    struct ErrorObject<'a> {
        code: i64,
        message: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<&'a Value>,
    }
    #[derive(Serialize)]
    struct ErrorResponse<'a> {
        jsonrpc: &'static str,
        id: &'a Value,
        error: ErrorObject<'a>,
    }
    let body = ErrorResponse {
        jsonrpc: "2.0",
        id,
        error: ErrorObject { code: error.code, message: &error.message, data: error.data.as_ref() },
    };
    serde_json::to_string(&body).unwrap_or_default()
}

/// A notification line.
pub fn notification<T: Serialize>(method: &str, params: &T) -> String {
    #[derive(Serialize)]
    struct Notification<'a, T> {
        jsonrpc: &'static str,
        method: &'a str,
        params: &'a T,
    }
    serde_json::to_string(&Notification { jsonrpc: "2.0", method, params }).unwrap_or_default()
}

/// A message's params as the JSON text it carried (absent when it had none).
#[derive(Debug, Default)]
pub struct Params(Option<Box<RawValue>>);

impl Params {
    /// The params' text; absent or `null` params read as `{}` (for methods whose
    /// params are optional).
    pub fn text(&self) -> &str {
        match self.0.as_deref().map(RawValue::get) {
            None | Some("null") => "{}",
            Some(text) => text,
        }
    }

    /// Deserializes the params into a type that may borrow from their text.
    pub fn parse<'a, T: serde::Deserialize<'a>>(&'a self) -> Result<T, RpcError> {
        serde_json::from_str(self.text())
            .map_err(|err| RpcError::invalid_params(format!("invalid params: {err}")))
    }
}

/// Deserializes params (absent or null params count as `{}` for methods whose params
/// are optional).
pub fn params<T: serde::de::DeserializeOwned>(params: Params) -> Result<T, RpcError> {
    params.parse()
}

/// A key for a request id usable in maps (`1` and `"1"` are different ids): its JSON
/// text, shared by the map's entry and whoever removes it.
pub fn id_key(id: &Value) -> Arc<str> {
    match id {
        Value::Number(number) => number_text(number),
        other => Arc::from(other.to_string()),
    }
}

/// A JSON number as its text, an integer without an intermediate string.
pub fn number_text(number: &serde_json::Number) -> Arc<str> {
    if let Some(integer) = number.as_i64() {
        Arc::from(itoa::Buffer::new().format(integer))
    } else if let Some(integer) = number.as_u64() {
        Arc::from(itoa::Buffer::new().format(integer))
    } else {
        Arc::from(number.to_string())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_id_key_is_the_id_as_json_text() {
        for id in [json!(7), json!(-3), json!(u64::MAX), json!(1.5), json!("7"), json!(null)] {
            assert_eq!(&*id_key(&id), id.to_string(), "{id}");
        }
        assert_ne!(id_key(&json!(1)), id_key(&json!("1")));
    }

    #[test]
    fn parses_requests_notifications_and_rejects_garbage() {
        assert!(matches!(
            parse(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            Ok(Incoming::Request { method, .. }) if method == "tools/list"
        ));
        assert!(matches!(
            parse(r#"{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":1}}"#),
            Ok(Incoming::Notification { .. })
        ));
        assert!(matches!(parse(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#), Ok(Incoming::Response)));
        let err = parse("{not json").err().unwrap();
        assert_eq!(err.error.code, PARSE_ERROR);
        let err = parse(r#"{"id":1,"method":"x"}"#).err().unwrap();
        assert_eq!((err.error.code, err.id), (INVALID_REQUEST, json!(1)));
        let err = parse(r#"{"jsonrpc":"2.0","id":{"a":1},"method":"x"}"#).err().unwrap();
        assert_eq!(err.error.code, INVALID_REQUEST);
        let err = parse(r#"[1,2]"#).err().unwrap();
        assert_eq!(err.error.code, INVALID_REQUEST);
    }

    #[test]
    fn builds_lines() {
        assert_eq!(
            response(&json!(1), &json!({"a": 1})),
            r#"{"jsonrpc":"2.0","id":1,"result":{"a":1}}"#
        );
        assert_eq!(
            error_response(&json!("x"), &RpcError::new(METHOD_NOT_FOUND, "nope")),
            r#"{"jsonrpc":"2.0","id":"x","error":{"code":-32601,"message":"nope"}}"#
        );
    }
}
