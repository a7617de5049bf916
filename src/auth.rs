//! Who may use a network face: named bearer tokens.
//!
//! Every network face authenticates here and nowhere else: the TCP transport's
//! `POST /rpc` and `GET /ws`, and MCP Streamable HTTP (from `serve` and from
//! `toolgate mcp --http`). One token file format, one loader with one set of checks,
//! one header parser and one constant-time compare:
//!
//! - **The token file** holds one `name:secret` line per client (blank lines and
//!   `#` comments are skipped). It must be a regular file owned by the daemon's user
//!   (or root) that no other user may read or write (`chmod 600`); names are plain
//!   (`[A-Za-z0-9._-]`) and unique; secrets are unique, at least
//!   [`MIN_TOKEN_CHARS`] characters without whitespace, and not guessable: an
//!   estimate of their entropy (the Shannon entropy of their characters times their
//!   length) must reach [`MIN_TOKEN_BITS`], which refuses `aaaa…` and `passwordpassword`
//!   while 32 random hex digits pass with a wide margin.
//! - **The header** is `Authorization: Bearer <secret>`, the scheme in any case.
//! - **The compare** visits every configured token with `subtle`'s constant-time
//!   equality, whatever matches, so the time taken tells nothing about the secrets
//!   (beyond whether a presented value has the length of one of them).
//! - **The identity** of an authenticated request is its token's name, shown as
//!   `token:<name>` in the audit log and sessions: the file names the clients.
//!
//! A refused request gets `401` with `WWW-Authenticate: Bearer realm="toolgate"`
//! (plus `error="invalid_token"` for a wrong token) and a body saying how to pass the
//! token. The challenge names no `resource_metadata`, and the faces serve no OAuth
//! metadata documents: toolgate runs no authorization server, and a challenge that
//! pointed at one would make MCP clients start an OAuth discovery that can only fail
//! (interactive clients then ask for a browser) instead of reporting that a bearer
//! token is needed.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::admission::Admission;

/// Secrets shorter than this are refused: a bearer token is the only thing between a
/// network peer and command execution.
pub const MIN_TOKEN_CHARS: usize = 16;

/// The least estimated entropy of a secret, in bits (see the module docs).
pub const MIN_TOKEN_BITS: f64 = 64.0;

/// Random bytes in a generated secret (written as twice as many hex digits).
const GENERATED_TOKEN_BYTES: usize = 32;

/// How a refused client learns to authenticate; every face's 401 body ends with it.
pub const HOW_TO_AUTHENTICATE: &str = "Send the header `Authorization: Bearer <token>` with \
every request, where <token> is the secret of one `name:secret` line of the daemon's token \
file ([server] token_file; without one, `toolgate mcp --http` writes a token file and prints \
where).";

/// Why a token set could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the token file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write the token file {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("the token file {0} is not a regular file")]
    NotAFile(PathBuf),
    #[error("the token file {path} belongs to uid {uid}, not to the daemon's user")]
    Owner { path: PathBuf, uid: u32 },
    #[error(
        "the token file {path} is readable by other users (mode {mode:03o}); \
         run `chmod 600` on it"
    )]
    Permissions { path: PathBuf, mode: u32 },
    #[error("the directory {path} of generated tokens is open to other users (mode {mode:03o})")]
    DirectoryPermissions { path: PathBuf, mode: u32 },
    #[error("the token file {path} holds no token (one `name:secret` line per client)")]
    NoTokens { path: PathBuf },
    #[error("token file line {line}: expected `name:secret`, found a line without a name")]
    Unnamed { line: usize },
    #[error("token file line {line}: {reason}")]
    Malformed { line: usize, reason: String },
    #[error("token {name:?}: a token needs at least {MIN_TOKEN_CHARS} characters")]
    TooShort { name: String },
    #[error(
        "token {name:?} is guessable (about {bits} bits of entropy, at least {MIN_TOKEN_BITS} \
         needed): use a random secret, e.g. 32 random hex digits"
    )]
    Guessable { name: String, bits: u32 },
    #[error("token name {0:?} is not made of letters, digits, `-`, `_` and `.`")]
    BadName(String),
    #[error("token name {0:?} is used twice")]
    DuplicateName(String),
    #[error("tokens {0:?} and {1:?} have the same secret")]
    DuplicateSecret(String, String),
    #[error("the system random generator failed: {0}")]
    Random(getrandom::Error),
}

/// One named bearer token.
#[derive(Clone)]
struct Token {
    name: Arc<str>,
    secret: Vec<u8>,
}

/// The bearer tokens a face accepts, each named after the client that holds it.
/// Cheap to clone.
#[derive(Clone, Default)]
pub struct TokenSet {
    tokens: Arc<[Token]>,
}

impl fmt::Debug for TokenSet {
    /// Names only: secrets never reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenSet").field("names", &self.names()).finish()
    }
}

/// Who authenticated a request: the name of the token it presented. Displayed as
/// `token:<name>`, the client identity of its connection and sessions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    name: Arc<str>,
}

impl Identity {
    /// The token's name, as written in the token file.
    pub fn token_name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "token:{}", self.name)
    }
}

/// Why a request was not authenticated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer` credentials at all.
    Missing,
    /// A bearer token that matches none of the configured ones.
    Invalid,
}

impl TokenSet {
    /// No tokens: every authenticated route answers 401.
    pub fn empty() -> TokenSet {
        TokenSet::default()
    }

    /// Builds a set from `(name, secret)` pairs with the checks of the module docs.
    pub fn from_pairs<I, N, S>(pairs: I) -> Result<TokenSet, TokenError>
    where
        I: IntoIterator<Item = (N, S)>,
        N: Into<String>,
        S: Into<String>,
    {
        let mut tokens: Vec<Token> = Vec::new();
        for (name, secret) in pairs {
            let name = name.into();
            let secret = secret.into();
            validate_name(&name)?;
            if secret.chars().any(char::is_whitespace) {
                return Err(TokenError::Malformed {
                    line: tokens.len() + 1,
                    reason: format!("token {name:?} contains whitespace"),
                });
            }
            if secret.chars().count() < MIN_TOKEN_CHARS {
                return Err(TokenError::TooShort { name });
            }
            let bits = estimated_bits(&secret);
            if bits < MIN_TOKEN_BITS {
                // Rounded down for the message: only whole bits are meaningful here.
                let bits = bits as u32;
                return Err(TokenError::Guessable { name, bits });
            }
            if tokens.iter().any(|token| *token.name == *name) {
                return Err(TokenError::DuplicateName(name));
            }
            if let Some(twin) = tokens.iter().find(|token| token.secret == secret.as_bytes()) {
                return Err(TokenError::DuplicateSecret(twin.name.to_string(), name));
            }
            tokens.push(Token { name: name.into(), secret: secret.into_bytes() });
        }
        Ok(TokenSet { tokens: tokens.into() })
    }

    /// Reads a token file (see the module docs for its format and checks). The owner
    /// and mode are checked on the handle that is read, so the file cannot be swapped
    /// between the check and the read; a symbolic link is followed (the file it names
    /// must pass the checks).
    pub fn load(path: &Path) -> Result<TokenSet, TokenError> {
        let read_error = |source| TokenError::Read { path: path.to_path_buf(), source };
        let file = std::fs::File::open(path).map_err(read_error)?;
        let meta = file.metadata().map_err(read_error)?;
        if !meta.is_file() {
            return Err(TokenError::NotAFile(path.to_path_buf()));
        }
        let own = rustix::process::geteuid().as_raw();
        if meta.uid() != own && meta.uid() != 0 {
            return Err(TokenError::Owner { path: path.to_path_buf(), uid: meta.uid() });
        }
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(TokenError::Permissions { path: path.to_path_buf(), mode: mode & 0o777 });
        }
        let text = std::io::read_to_string(file).map_err(read_error)?;
        let set = TokenSet::parse(&text)?;
        if set.is_empty() {
            return Err(TokenError::NoTokens { path: path.to_path_buf() });
        }
        Ok(set)
    }

    /// Parses the token file format: `name:secret` per line (the name ends at the
    /// first `:`), blank lines and `#` comments skipped.
    pub fn parse(text: &str) -> Result<TokenSet, TokenError> {
        let mut pairs = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line_number = index + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((name, secret)) = line.split_once(':') else {
                return Err(TokenError::Unnamed { line: line_number });
            };
            let (name, secret) = (name.trim(), secret.trim());
            if secret.is_empty() {
                return Err(TokenError::Malformed {
                    line: line_number,
                    reason: format!("{name:?} has no secret after the `:`"),
                });
            }
            pairs.push((name.to_owned(), secret.to_owned()));
        }
        TokenSet::from_pairs(pairs)
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// The tokens' names, in file order.
    pub fn names(&self) -> Vec<&str> {
        self.tokens.iter().map(|token| &*token.name).collect()
    }

    /// The name of the token equal to `presented`, if any. Every token is compared in
    /// full, in constant time, whatever matches.
    pub fn authenticate(&self, presented: &[u8]) -> Option<&str> {
        self.find(presented).map(|token| &*token.name)
    }

    fn find(&self, presented: &[u8]) -> Option<&Token> {
        // 0 = none; otherwise the index of the match plus one.
        let mut found = 0u64;
        for (index, token) in self.tokens.iter().enumerate() {
            let equal = token.secret.as_slice().ct_eq(presented);
            let candidate = u64::try_from(index).unwrap_or(u64::MAX).saturating_add(1);
            found = u64::conditional_select(&found, &candidate, equal);
        }
        let index = usize::try_from(found.checked_sub(1)?).ok()?;
        self.tokens.get(index)
    }

    /// Authenticates a request's headers.
    pub fn check(&self, headers: &HeaderMap) -> Result<Identity, Refusal> {
        let presented = bearer_token(headers).ok_or(Refusal::Missing)?;
        let token = self.find(presented).ok_or(Refusal::Invalid)?;
        Ok(Identity { name: token.name.clone() })
    }
}

/// The Shannon entropy of `secret`'s characters times its length: an upper estimate
/// of what an attacker must guess, low for repeated or few distinct characters.
fn estimated_bits(secret: &str) -> f64 {
    let chars: Vec<char> = secret.chars().collect();
    let length = chars.len() as f64;
    let mut counts: std::collections::HashMap<char, usize> = std::collections::HashMap::new();
    for c in &chars {
        *counts.entry(*c).or_default() += 1;
    }
    let per_char: f64 = counts
        .values()
        .map(|count| {
            let p = *count as f64 / length;
            -p * p.log2()
        })
        .sum();
    per_char * length
}

fn validate_name(name: &str) -> Result<(), TokenError> {
    let plain = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if plain { Ok(()) } else { Err(TokenError::BadName(name.to_owned())) }
}

/// The token of an `Authorization: Bearer <token>` header (scheme in any case).
pub fn bearer_token(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    if token.is_empty() { None } else { Some(token) }
}

impl Refusal {
    /// The `401` for this refusal: a Bearer challenge without OAuth metadata, a body
    /// that says how to authenticate (`hint` adds what is particular to the face), and
    /// the connection closed after it (an unauthenticated client keeps nothing open).
    pub fn response(self, hint: &str) -> Response {
        let (challenge, reason) = match self {
            Refusal::Missing => {
                ("Bearer realm=\"toolgate\"", "This endpoint needs a bearer token.")
            }
            Refusal::Invalid => (
                "Bearer realm=\"toolgate\", error=\"invalid_token\", \
                 error_description=\"the bearer token is not valid\"",
                "The bearer token is not valid.",
            ),
        };
        let mut body = format!("{reason} {HOW_TO_AUTHENTICATE}");
        if !hint.is_empty() {
            body.push(' ');
            body.push_str(hint);
        }
        body.push('\n');
        (
            StatusCode::UNAUTHORIZED,
            [
                (header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge)),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
                (header::CONNECTION, HeaderValue::from_static("close")),
            ],
            body,
        )
            .into_response()
    }
}

/// What [`require_bearer`] checks requests against.
#[derive(Clone, Debug)]
pub struct Gate {
    pub tokens: TokenSet,
    /// Appended to the 401 body: what is particular to the face.
    pub hint: &'static str,
}

/// Axum middleware: lets a request through only with a known bearer token, recording
/// its [`Identity`] in the request's extensions. On a connection served by
/// [`crate::admission`], the first authenticated request moves the connection from
/// the unauthenticated pool to the authenticated one; when that is full the request
/// gets `429`.
pub async fn require_bearer(
    State(gate): State<Arc<Gate>>,
    mut request: Request,
    next: Next,
) -> Response {
    let identity = match gate.tokens.check(request.headers()) {
        Ok(identity) => identity,
        Err(refusal) => {
            let peer = request.extensions().get::<crate::admission::Peer>().map(|peer| peer.0);
            if refusal == Refusal::Invalid {
                tracing::info!(?peer, "request with an unknown bearer token refused");
            }
            return refusal.response(gate.hint);
        }
    };
    if let Some(admission) = request.extensions().get::<Admission>()
        && let Err(busy) = admission.promote()
    {
        return busy.into_response();
    }
    request.extensions_mut().insert(identity);
    next.run(request).await
}

/// Where a token file generated for a face lives and what it holds.
#[derive(Debug)]
pub struct GeneratedTokens {
    pub path: PathBuf,
    pub tokens: TokenSet,
    /// The name of the token in the file.
    pub name: String,
    /// False when an earlier run's file was valid and is used again.
    pub created: bool,
}

/// A token file of one random token called `name`, at `dir/file_name`, for a face
/// that was given no token file. `dir` is created owner-only if missing, else it must
/// already be owner-only (it is never chmodded). A valid file from an earlier run is
/// used again, so that clients configured with its token keep working; anything else
/// at the path is replaced (written aside, then renamed over it).
pub fn generated_token_file(
    dir: &Path,
    file_name: &str,
    name: &str,
) -> Result<GeneratedTokens, TokenError> {
    let write_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TokenError::Write { path, source }
    };
    match std::fs::DirBuilder::new().mode(0o700).recursive(true).create(dir) {
        Ok(()) => {}
        Err(source) => return Err(TokenError::Write { path: dir.to_path_buf(), source }),
    }
    let meta = std::fs::metadata(dir).map_err(write_error(dir))?;
    let own = rustix::process::geteuid().as_raw();
    if meta.uid() != own {
        return Err(TokenError::Owner { path: dir.to_path_buf(), uid: meta.uid() });
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TokenError::DirectoryPermissions { path: dir.to_path_buf(), mode });
    }
    let path = dir.join(file_name);
    if let Ok(tokens) = TokenSet::load(&path)
        && tokens.names() == [name]
    {
        return Ok(GeneratedTokens { path, tokens, name: name.to_owned(), created: false });
    }
    let mut bytes = [0u8; GENERATED_TOKEN_BYTES];
    getrandom::fill(&mut bytes).map_err(TokenError::Random)?;
    let secret: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    let aside = dir.join(format!(".{file_name}.{}", &secret[..8]));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&aside)
        .map_err(write_error(&aside))?;
    let written = file
        .write_all(
            format!("# written by toolgate for a face without a token file\n{name}:{secret}\n")
                .as_bytes(),
        )
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&aside, &path));
    if let Err(source) = written {
        let _ = std::fs::remove_file(&aside);
        return Err(TokenError::Write { path, source });
    }
    let tokens = TokenSet::from_pairs([(name, secret)])?;
    Ok(GeneratedTokens { path, tokens, name: name.to_owned(), created: true })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &'static str) -> HeaderMap {
        let mut map = HeaderMap::new();
        map.insert(header::AUTHORIZATION, HeaderValue::from_static(value));
        map
    }

    #[test]
    fn bearer_token_reads_the_authorization_header() {
        assert_eq!(bearer_token(&HeaderMap::new()), None);
        assert_eq!(bearer_token(&headers("Bearer  abc ")), Some(&b"abc"[..]));
        assert_eq!(bearer_token(&headers("bearer abc")), Some(&b"abc"[..]));
        assert_eq!(bearer_token(&headers("BEARER abc")), Some(&b"abc"[..]));
        assert_eq!(bearer_token(&headers("Basic abc")), None);
        assert_eq!(bearer_token(&headers("Bearer ")), None);
        assert_eq!(bearer_token(&headers("Bear")), None);
    }

    #[test]
    fn every_token_matches_and_nothing_else() {
        let set = TokenSet::from_pairs([
            ("a", "0123456789abcdef"),
            ("b", "fedcba9876543210"),
            ("c", "Zx8Qw2Lp5Rt7Vb3N"),
        ])
        .unwrap();
        assert_eq!(set.authenticate(b"0123456789abcdef"), Some("a"));
        assert_eq!(set.authenticate(b"fedcba9876543210"), Some("b"));
        assert_eq!(set.authenticate(b"Zx8Qw2Lp5Rt7Vb3N"), Some("c"));
        for wrong in [&b""[..], b"0123456789abcde", b"0123456789abcdef0", b"0123456789abcdeF"] {
            assert_eq!(set.authenticate(wrong), None);
        }
        let identity = set.check(&headers("bearer fedcba9876543210")).unwrap();
        assert_eq!(identity.to_string(), "token:b");
        assert_eq!(set.check(&headers("Bearer nope")), Err(Refusal::Invalid));
        assert_eq!(set.check(&HeaderMap::new()), Err(Refusal::Missing));
    }

    #[test]
    fn guessable_secrets_are_refused() {
        for weak in ["aaaaaaaaaaaaaaaaaaaaaaaa", "abababababababababababab", "passwordpassword"] {
            assert!(
                matches!(TokenSet::from_pairs([("ci", weak)]), Err(TokenError::Guessable { .. })),
                "{weak}"
            );
        }
        for strong in
            ["0123456789abcdef", "correct-horse-battery", "load-benchmark-token-0123456789"]
        {
            assert!(TokenSet::from_pairs([("ci", strong)]).is_ok(), "{strong}");
        }
    }

    #[test]
    fn a_generated_file_is_private_and_used_again() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("toolgate");
        let first = generated_token_file(&run, "mcp.tokens", "mcp").unwrap();
        assert!(first.created);
        assert_eq!(std::fs::metadata(&run).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(std::fs::metadata(&first.path).unwrap().permissions().mode() & 0o777, 0o600);
        let again = generated_token_file(&run, "mcp.tokens", "mcp").unwrap();
        assert!(!again.created);
        assert_eq!(again.path, first.path);
        // A file others could read is replaced, never used.
        std::fs::set_permissions(&first.path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let replaced = generated_token_file(&run, "mcp.tokens", "mcp").unwrap();
        assert!(replaced.created);
        assert_eq!(std::fs::metadata(&first.path).unwrap().permissions().mode() & 0o777, 0o600);
        // A directory open to others is refused, and left as it is.
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(
            generated_token_file(&run, "mcp.tokens", "mcp"),
            Err(TokenError::DirectoryPermissions { mode: 0o755, .. })
        ));
        assert_eq!(std::fs::metadata(&run).unwrap().permissions().mode() & 0o777, 0o755);
    }
}
