//! The confinement layer of `tools/explain`: whether the paths a call names stay inside
//! the session's roots, checked with the lookup the tools themselves use (symlinks
//! followed, never out of a root), so that explain and the call agree.

use std::path::Path;

use serde_json::Value;

use crate::permission::{Explanation, Layer};
use crate::tools::facts::Subject;
use crate::tools::fs::{self, FsError};
use crate::tools::{Env, builtin};

/// The confinement layer's sentence, and whether it refuses the call; `None` when the
/// tool takes no path toolgate confines. Which arguments are paths is what the tool's
/// facts say: its path arguments (or their defaults), every file of its patch, a
/// command's working directory.
pub(crate) fn check(tool: &str, args: &Value, env: &Env) -> Option<(bool, Explanation)> {
    let facts = builtin::facts(tool)?;
    let named: Vec<(&str, String)> = match facts.subject {
        Subject::Arguments => return None,
        Subject::Command { cwd, .. } => {
            let dir = args.get(cwd).and_then(Value::as_str).unwrap_or(".");
            vec![("the working directory", dir.to_owned())]
        }
        Subject::Paths(_) | Subject::Patch { .. } => {
            builtin::paths_named(facts, args).into_iter().map(|path| ("the path", path)).collect()
        }
    };
    let mut checked = Vec::new();
    for (what, path) in named {
        if let Err(reason) = inside(env, &path) {
            return Some((true, explanation(reason)));
        }
        checked.push(format!("{what} {path}"));
    }
    let reason = if checked.is_empty() {
        format!("{tool} names no path to check")
    } else {
        format!("{} stays inside the session roots", checked.join(", "))
    };
    Some((false, explanation(reason)))
}

fn explanation(reason: String) -> Explanation {
    Explanation { layer: Layer::Confinement, rule: None, list: None, reason }
}

/// Resolves `path`, or its nearest existing ancestor when it does not exist yet (a
/// file to be written), as the tools do. Only leaving the roots is a refusal here;
/// other errors (a malformed path, say) are the tool's to report.
fn inside(env: &Env, path: &str) -> Result<(), String> {
    let mut current = Path::new(path);
    loop {
        let text = if current.as_os_str().is_empty() { "." } else { &*current.to_string_lossy() };
        match fs::resolve(env, text) {
            Ok(_) => return Ok(()),
            Err(FsError::AccessDenied(reason)) => return Err(reason),
            Err(FsError::NotFound(_)) => match current.parent() {
                Some(parent) => current = parent,
                None => return Ok(()),
            },
            Err(_) => return Ok(()),
        }
    }
}
