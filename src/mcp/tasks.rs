//! The MCP tasks extension (`io.modelcontextprotocol/tasks`, 2026-07-28): a
//! `tools/call` that outlives the face's task threshold is answered with a
//! `CreateTaskResult` (`resultType: "task"`) while the call goes on, and the client
//! polls `tasks/get` (the result is inlined once the task is terminal), answers
//! in-task questions with `tasks/update`, and cancels with `tasks/cancel`.
//!
//! A task is the same call as a plain one: it was decided (hooks, rules, a person)
//! before it became a task, runs the same pipeline ([`crate::agent::Session::run`],
//! `resume` or `execute_shared`), and leaves one audit record. `tasks/cancel`
//! cancels the token that pipeline was given, which is what `notifications/cancelled`
//! does to a plain call: the process tree is killed and the task settles as
//! `cancelled`. The conversation's session stays open while one of its tasks runs,
//! even after the request (or, in 2026-07-28 over HTTP, the conversation) that
//! started it has ended; closing a stdio conversation still cancels its calls.
//!
//! Tasks belong to the client identity that started them (`token:<name>` over HTTP,
//! `mcp` on stdio, where the face serves one client): another identity's `tasks/get`,
//! `tasks/update` or `tasks/cancel` is told the task does not exist. Task ids come
//! from the SDK's task store (random UUIDs), one store per identity.
//!
//! The state kept is bounded: at most [`MAX_RUNNING_TASKS`] running tasks per
//! identity (a call beyond them is answered when it finishes, as without the
//! extension), and a task is forgotten one TTL after it ended.

use std::time::Duration;

use dashmap::DashMap;
use rmcp::ErrorData as McpError;
use rmcp::model::{CreateTaskResult, GetTaskResult, Task};
use rmcp::task_manager::{TaskContext, TaskFuture, TaskManager, TaskOptions};

/// Running tasks per client identity. Calls beyond it still run (the session's own
/// limit on calls applies to them) but are answered synchronously.
pub(crate) const MAX_RUNNING_TASKS: usize = 64;

/// Suggested polling interval of a task.
const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// How long a terminal task stays readable beyond the longest call.
const RETENTION: Duration = Duration::from_secs(10 * 60);

/// Every task of one MCP face, by owner.
pub(crate) struct Tasks {
    owners: DashMap<String, TaskManager>,
    ttl: Duration,
}

impl Tasks {
    /// Tasks whose calls take at most `longest_call`: a task lives that long plus a
    /// retention window, and stays readable one TTL after it ended.
    pub(crate) fn new(longest_call: Duration) -> Tasks {
        Tasks { owners: DashMap::new(), ttl: longest_call.saturating_add(RETENTION) }
    }

    fn manager(&self, owner: &str) -> TaskManager {
        if let Some(manager) = self.owners.get(owner) {
            return manager.clone();
        }
        self.owners.entry(owner.to_owned()).or_default().clone()
    }

    fn existing(&self, owner: &str) -> Option<TaskManager> {
        self.owners.get(owner).map(|manager| manager.clone())
    }

    /// Whether `owner` may start one more task.
    pub(crate) fn has_room(&self, owner: &str) -> bool {
        self.existing(owner).is_none_or(|manager| manager.running_task_count() < MAX_RUNNING_TASKS)
    }

    /// Starts `operation` as a task of `owner`; the answer to the `tools/call`. The
    /// task is readable by `tasks/get` before this returns.
    pub(crate) fn start<F>(&self, owner: &str, operation: F) -> CreateTaskResult
    where
        F: FnOnce(TaskContext) -> TaskFuture,
    {
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        let poll_ms = u64::try_from(POLL_INTERVAL.as_millis()).unwrap_or(u64::MAX);
        let options = TaskOptions::new().with_ttl_ms(ttl_ms).with_poll_interval_ms(poll_ms);
        let task: Task = self.manager(owner).spawn(options, operation);
        CreateTaskResult::new(task)
    }

    /// `tasks/get`.
    pub(crate) fn get(&self, owner: &str, task_id: &str) -> Result<GetTaskResult, McpError> {
        let manager = self.existing(owner).ok_or_else(|| unknown(task_id))?;
        manager.get_task(task_id).map(GetTaskResult::new)
    }

    /// `tasks/update`: answers to outstanding input requests (unknown keys ignored).
    pub(crate) fn update(
        &self,
        owner: &str,
        task_id: &str,
        responses: impl IntoIterator<Item = (String, serde_json::Value)>,
    ) -> Result<(), McpError> {
        let manager = self.existing(owner).ok_or_else(|| unknown(task_id))?;
        manager.update_task(task_id, responses)
    }

    /// `tasks/cancel`: the task's call is canceled; idempotent on a terminal task.
    pub(crate) fn cancel(&self, owner: &str, task_id: &str) -> Result<(), McpError> {
        let manager = self.existing(owner).ok_or_else(|| unknown(task_id))?;
        manager.cancel_task(task_id)
    }

    /// Aborts every task (the face is going away).
    pub(crate) fn shutdown(&self) {
        for manager in self.owners.iter() {
            manager.shutdown();
        }
    }
}

fn unknown(task_id: &str) -> McpError {
    McpError::invalid_params(format!("unknown task: {task_id}"), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{CallToolResult, TaskStatus};
    use rmcp::task_manager::TaskExit;

    fn wait_cancel() -> impl FnOnce(TaskContext) -> TaskFuture {
        |task: TaskContext| {
            Box::pin(async move {
                task.cancelled().await;
                Err::<CallToolResult, _>(TaskExit::Cancelled)
            })
        }
    }

    #[tokio::test]
    async fn a_task_is_visible_to_its_owner_only() {
        let tasks = Tasks::new(Duration::from_secs(60));
        let created = tasks.start("token:a", wait_cancel());
        let id = created.task.task_id.clone();
        assert_eq!(tasks.get("token:a", &id).unwrap().task.status(), TaskStatus::Working);
        for other in ["token:b", "mcp"] {
            assert!(tasks.get(other, &id).is_err());
            assert!(tasks.cancel(other, &id).is_err());
            assert!(tasks.update(other, &id, []).is_err());
        }
        tasks.cancel("token:a", &id).unwrap();
        let mut status = TaskStatus::Working;
        while !status.is_terminal() {
            tokio::task::yield_now().await;
            status = tasks.get("token:a", &id).unwrap().task.status();
        }
        assert_eq!(status, TaskStatus::Cancelled);
        // Cancelling a terminal task is acknowledged again.
        tasks.cancel("token:a", &id).unwrap();
    }

    #[tokio::test]
    async fn running_tasks_are_bounded_per_owner() {
        let tasks = Tasks::new(Duration::from_secs(60));
        for _ in 0..MAX_RUNNING_TASKS {
            assert!(tasks.has_room("token:a"));
            tasks.start("token:a", wait_cancel());
        }
        assert!(!tasks.has_room("token:a"));
        assert!(tasks.has_room("token:b"));
        tasks.shutdown();
    }
}
