//! The control-plane tools: always listed, never subject to allowlists or permission
//! rules, but still run through hooks and the registry guard like any other tool.
//!
//! They act on the session that runs them through `Env::control`; without a session
//! (a bare registry call) they report that plainly instead of pretending.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::tools::{
    Definition, ErrorType, Safety, Todo, TodoStatus, Tool, ToolContext, ToolResult, parse_args,
    schema_for,
};

/// Both system tools.
pub fn all() -> Vec<Arc<dyn Tool>> {
    vec![Arc::new(ExitPlanMode::new()), Arc::new(TodoWrite::new())]
}

fn no_session() -> ToolResult {
    ToolResult::failure(ErrorType::InternalError, "this tool needs a session and has none")
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ExitPlanModeArgs {
    /// The plan the user is asked to approve (Markdown).
    plan: String,
}

/// Asks the approver to leave plan mode; on approval the session mode becomes `default`.
pub struct ExitPlanMode(Definition);

impl ExitPlanMode {
    fn new() -> ExitPlanMode {
        ExitPlanMode(Definition {
            name: "exit_plan_mode".to_owned(),
            description: "Present the plan to the user and ask to leave plan mode. On approval \
                          the session switches to the default mode, where side-effect tools \
                          can run (with approval)."
                .to_owned(),
            input_schema: schema_for::<ExitPlanModeArgs>(),
            // It changes only the session's own mode, never the workspace; it has to be
            // callable in plan mode, which only runs read_only tools.
            safety: Safety::ReadOnly,
            system: true,
            timeout: None,
            facts: Default::default(),
        })
    }
}

#[async_trait::async_trait]
impl Tool for ExitPlanMode {
    fn definition(&self) -> &Definition {
        &self.0
    }

    fn requested_timeout(&self, _args: &Value) -> Option<std::time::Duration> {
        // A person reads the plan: the session's maximum, not the default deadline.
        Some(crate::tools::MAX_TIMEOUT)
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let args: ExitPlanModeArgs = match parse_args(args) {
            Ok(args) => args,
            Err(res) => return res,
        };
        let Some(session) = ctx.env.control.get() else {
            return no_session();
        };
        match session.request_exit_plan_mode(&ctx.call_id, &args.plan, &ctx.cancel).await {
            Ok(()) => ToolResult::success(
                "The user approved the plan; the session is now in \
                                           the default mode.",
            )
            .with_meta("mode", "default"),
            Err(reason) => ToolResult::failure(ErrorType::PermissionDenied, reason),
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct TodoWriteArgs {
    /// The complete new task list (it replaces the previous one).
    #[schemars(length(max = 1000))]
    todos: Vec<Todo>,
}

/// The most items a task list holds (the schema's `maxItems`).
pub const MAX_TODOS: usize = 1000;
/// The most text a task list's items hold in all: a session keeps its list for its
/// whole life, and every client that subscribes is sent it.
pub const MAX_TODO_BYTES: usize = 256 * 1024;

/// Replaces the session's task list and tells its clients (`todos_updated`).
pub struct TodoWrite(Definition);

impl TodoWrite {
    fn new() -> TodoWrite {
        TodoWrite(Definition {
            name: "todo_write".to_owned(),
            description: "Replace the session's task list. Each item has `content` and a \
                          `status` of pending, in_progress or completed."
                .to_owned(),
            input_schema: schema_for::<TodoWriteArgs>(),
            // It writes only session state that clients display, never the workspace.
            safety: Safety::ReadOnly,
            system: true,
            timeout: None,
            facts: Default::default(),
        })
    }
}

#[async_trait::async_trait]
impl Tool for TodoWrite {
    fn definition(&self) -> &Definition {
        &self.0
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let args: TodoWriteArgs = match parse_args(args) {
            Ok(args) => args,
            Err(res) => return res,
        };
        let Some(session) = ctx.env.control.get() else {
            return no_session();
        };
        let count = |status| args.todos.iter().filter(|todo| todo.status == status).count();
        let (pending, in_progress, completed) = (
            count(TodoStatus::Pending),
            count(TodoStatus::InProgress),
            count(TodoStatus::Completed),
        );
        let total = args.todos.len();
        let bytes: usize = args.todos.iter().map(|todo| todo.content.len()).sum();
        if total > MAX_TODOS || bytes > MAX_TODO_BYTES {
            return ToolResult::failure(
                ErrorType::TooLarge,
                format!(
                    "a task list holds at most {MAX_TODOS} items and {} KiB of text; this one \
                     has {total} items and {bytes} bytes",
                    MAX_TODO_BYTES / 1024
                ),
            );
        }
        session.set_todos(args.todos);
        ToolResult::success(format!(
            "Task list updated: {total} tasks ({completed} completed, {in_progress} in progress, \
             {pending} pending)."
        ))
        .with_meta("total", total)
        .with_meta("pending", pending)
        .with_meta("in_progress", in_progress)
        .with_meta("completed", completed)
    }
}
