//! write_file: creates a file or replaces one the model has read, atomically.
//!
//! A model that overwrites a file it never read (or that changed since) destroys
//! work it has not seen, so an existing file is only replaced when the session's
//! [`FileTracker`](crate::tools::fs::FileTracker) shows the current content; new
//! files need no read. The write itself is atomic (temporary file, fsync, rename),
//! keeps the replaced file's permission bits, and creates missing parent directories
//! inside the roots. The per-path lock shared with edit_file keeps the freshness
//! check and the write together, so no concurrent edit slips in between.

use std::sync::{Arc, LazyLock};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::tools::facts::{ClaudeCode, ClaudeTool, PathAccess, PathArgument, Subject};
use crate::tools::fs::{self, FsError, ParentDirs, ResolvedParent, Staleness};
use crate::tools::{
    Definition, Env, ErrorType, Facts, Safety, Tool, ToolContext, ToolResult, parse_args,
    schema_for,
};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The file to write, relative to the working directory or absolute (inside the roots).
    path: String,
    /// The complete new content of the file.
    content: String,
}

struct WriteFile {
    definition: Definition,
}

pub fn tool() -> Arc<dyn Tool> {
    static DESCRIPTION: &str = "Writes a file inside the session roots, creating it (and \
        any missing parent directories) or replacing its whole content. Replacing an \
        existing file requires having read it with read_file in this session, and fails \
        with stale_file if it changed since. The write is atomic and keeps the file's \
        permissions. Prefer edit_file for changing part of a file.";
    static DEFINITION: LazyLock<Definition> = LazyLock::new(|| Definition {
        name: "write_file".to_owned(),
        description: DESCRIPTION.to_owned(),
        input_schema: schema_for::<Args>(),
        safety: Safety::SideEffect,
        system: false,
        timeout: None,
        facts: Facts {
            subject: Subject::Paths(&[PathArgument {
                name: "path",
                default: None,
                access: PathAccess::Write,
            }]),
            edits: true,
            binds_access: true,
            claude_code: ClaudeCode::Tool(ClaudeTool {
                name: "Write",
                aliases: &[],
                fields: &[("path", "file_path")],
            }),
        },
    });
    Arc::new(WriteFile { definition: DEFINITION.clone() })
}

#[async_trait::async_trait]
impl Tool for WriteFile {
    fn definition(&self) -> &Definition {
        &self.definition
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(res) => return res,
        };
        let env = ctx.env.clone();
        let cancel = ctx.cancel.clone();
        let path = args.path.clone();
        fs::with_write_lock(&ctx.env, &path, ParentDirs::Create, move |target| {
            write_locked(&env, &args, target, &cancel)
        })
        .await
        .unwrap_or_else(ToolResult::from)
    }
}

fn write_locked(
    env: &Env,
    args: &Args,
    target: &ResolvedParent,
    cancel: &CancellationToken,
) -> Result<ToolResult, FsError> {
    let key = target.path();
    let shown_path = key.display().to_string();
    let replaced = match fs::open_existing(target, &args.path)? {
        None => None,
        Some((file, info)) => {
            let current = fs::current_stamp(file, &info, env.max_read_bytes, &args.path)?;
            if let Some(message) = Staleness::check(&env.files, &key, &current).message(&args.path)
            {
                return Ok(ToolResult::failure(ErrorType::StaleFile, message)
                    .with_meta("path", shown_path));
            }
            Some(info)
        }
    };
    if cancel.is_cancelled() {
        return Ok(ToolResult::failure(ErrorType::Canceled, "the call was canceled"));
    }
    let bytes = args.content.as_bytes();
    let written = match &replaced {
        Some(info) => fs::write_atomic_replacing(&target.dir, &target.name, bytes, info),
        None => fs::write_atomic(&target.dir, &target.name, bytes, None),
    };
    let stamp = written.map_err(|err| FsError::from_io(&args.path, err))?;
    env.files.record(key, stamp);
    let created = replaced.is_none();
    let verb = if created { "created" } else { "overwrote" };
    Ok(ToolResult::success(format!("{verb} {shown_path} ({} bytes)", bytes.len()))
        .with_meta("path", shown_path)
        .with_meta("bytes", bytes.len())
        .with_meta("created", created))
}
