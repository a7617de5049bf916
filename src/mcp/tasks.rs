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
//! from the SDK's task store (random UUIDs).
//!
//! The state kept is bounded per identity:
//! - at most [`MAX_RUNNING_TASKS`] running tasks. The place is taken ([`Slot`]) when
//!   a call that may become a task starts, under the same lock as the count, and held
//!   until the task it became ends (or given back when the call is answered within
//!   its request): calls started together cannot all pass the bound while none of
//!   them is a task yet. A call that finds no place is answered when it finishes, as
//!   without the extension;
//! - at most [`MAX_FINISHED_TASKS`] finished tasks, whose stored results (terminal
//!   payloads, measured as the JSON `tasks/get` answers with) take at most
//!   [`MAX_FINISHED_BYTES`]: past either, the task that finished first is forgotten
//!   first (the newest is always kept, so a result larger than the whole budget can
//!   be read until the next task finishes), and `tasks/get`, `tasks/update` and `tasks/cancel` on it are
//!   told it does not exist, as for an expired task;
//! - a finished task is forgotten one TTL after it ended, and a running one is failed
//!   and its call aborted at its TTL (the SDK's expiry).
//!
//! Each task lives in a [`TaskManager`] of its own (the SDK's lifecycle of one task:
//! status, input requests, cancellation, TTL); the index here says which tasks an
//! identity has, in which order they finished and what they weigh, and forgetting a
//! task is dropping its manager.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rmcp::ErrorData as McpError;
use rmcp::model::{CallToolResult, CreateTaskResult, GetTaskResult, Task};
use rmcp::task_manager::{TaskContext, TaskExit, TaskFuture, TaskManager, TaskOptions};

/// Running tasks per client identity. Calls beyond it still run (the session's own
/// limit on calls applies to them) but are answered synchronously.
pub(crate) const MAX_RUNNING_TASKS: usize = 64;

/// Finished tasks kept per client identity; the one that finished first is forgotten
/// first.
pub(crate) const MAX_FINISHED_TASKS: usize = 256;

/// Bytes of finished tasks' results kept per client identity (64 MiB, the budget of
/// long results kept as links); the one that finished first is forgotten first.
pub(crate) const MAX_FINISHED_BYTES: usize = 64 * 1024 * 1024;

/// Suggested polling interval of a task.
const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// How long a terminal task stays readable beyond the longest call.
const RETENTION: Duration = Duration::from_secs(10 * 60);

/// What one identity may hold.
#[derive(Clone, Copy, Debug)]
struct Bounds {
    running: usize,
    finished: usize,
    finished_bytes: usize,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds {
            running: MAX_RUNNING_TASKS,
            finished: MAX_FINISHED_TASKS,
            finished_bytes: MAX_FINISHED_BYTES,
        }
    }
}

/// Every task of one MCP face, by owner.
pub(crate) struct Tasks {
    state: Arc<Mutex<State>>,
    ttl: Duration,
}

struct State {
    bounds: Bounds,
    ttl: Duration,
    owners: HashMap<String, Owner>,
}

/// One identity's tasks.
#[derive(Default)]
struct Owner {
    /// Places taken: calls that may still become tasks, and tasks still running.
    running: usize,
    /// Every task kept, running or finished, by id.
    tasks: HashMap<String, Kept>,
    /// Finished tasks in the order they finished, with the bytes of their results.
    finished: VecDeque<Finished>,
    /// The sum of `finished`'s bytes.
    finished_bytes: usize,
}

struct Kept {
    manager: TaskManager,
    started: Instant,
    /// Whether its operation has ended (it is then in `finished`).
    ended: bool,
}

struct Finished {
    id: String,
    bytes: usize,
    at: Instant,
}

/// A place among an owner's running tasks, taken by [`Tasks::reserve`] before the
/// call starts and given back when dropped: by the call answered within its request,
/// or by the task it became ([`Tasks::start`]) when its operation ends, which then
/// counts as finished with the bytes of its result.
pub(crate) struct Slot {
    state: Arc<Mutex<State>>,
    owner: String,
    /// The task this place became, once it did.
    task: Option<String>,
    /// The bytes of the task's stored result, once it has one.
    bytes: usize,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let task = self.task.take();
        lock(&self.state).release(&self.owner, task, self.bytes);
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    /// Gives `owner`'s place back; `task`, when the place had become one, has finished
    /// with a result of `bytes` and is kept within the bounds.
    fn release(&mut self, owner: &str, task: Option<String>, bytes: usize) {
        let bounds = self.bounds;
        let Some(tasks) = self.owners.get_mut(owner) else {
            return;
        };
        tasks.running = tasks.running.saturating_sub(1);
        if let Some(id) = task
            && let Some(kept) = tasks.tasks.get_mut(&id)
        {
            kept.ended = true;
            tasks.finished.push_back(Finished { id, bytes, at: Instant::now() });
            tasks.finished_bytes = tasks.finished_bytes.saturating_add(bytes);
            while tasks.finished.len() > 1
                && (tasks.finished.len() > bounds.finished
                    || tasks.finished_bytes > bounds.finished_bytes)
            {
                tasks.forget_oldest();
            }
        }
        if tasks.is_empty() {
            self.owners.remove(owner);
        }
    }

    /// Forgets finished tasks one TTL after they ended; returns the managers of
    /// running tasks past their TTL, for the SDK's expiry to fail them (outside the
    /// lock: their operations give their places back when aborted).
    fn expire(&mut self) -> Vec<TaskManager> {
        let ttl = self.ttl;
        let mut overdue = Vec::new();
        self.owners.retain(|_, tasks| {
            while tasks.finished.front().is_some_and(|oldest| oldest.at.elapsed() >= ttl) {
                tasks.forget_oldest();
            }
            overdue.extend(
                tasks
                    .tasks
                    .values()
                    .filter(|kept| !kept.ended && kept.started.elapsed() >= ttl)
                    .map(|kept| kept.manager.clone()),
            );
            !tasks.is_empty()
        });
        overdue
    }
}

impl Owner {
    fn forget_oldest(&mut self) {
        if let Some(oldest) = self.finished.pop_front() {
            self.finished_bytes = self.finished_bytes.saturating_sub(oldest.bytes);
            self.tasks.remove(&oldest.id);
        }
    }

    fn is_empty(&self) -> bool {
        self.running == 0 && self.tasks.is_empty()
    }
}

/// Lets the SDK fail overdue running tasks (its expiry runs on every access).
fn fail_overdue(overdue: Vec<TaskManager>) {
    for manager in overdue {
        manager.running_task_count();
    }
}

impl Tasks {
    /// Tasks whose calls take at most `longest_call`: a task lives that long plus a
    /// retention window, and stays readable one TTL after it ended.
    pub(crate) fn new(longest_call: Duration) -> Tasks {
        Tasks::with_bounds(longest_call.saturating_add(RETENTION), Bounds::default())
    }

    fn with_bounds(ttl: Duration, bounds: Bounds) -> Tasks {
        let state = State { bounds, ttl, owners: HashMap::new() };
        Tasks { state: Arc::new(Mutex::new(state)), ttl }
    }

    /// A place for a call of `owner` that may become a task, taken at once; `None`
    /// when `owner`'s running tasks and the calls holding places are at the bound.
    pub(crate) fn reserve(&self, owner: &str) -> Option<Slot> {
        let (reserved, overdue) = {
            let mut state = lock(&self.state);
            let overdue = state.expire();
            let running = state.bounds.running;
            let tasks = state.owners.entry(owner.to_owned()).or_default();
            let reserved = tasks.running < running;
            if reserved {
                tasks.running += 1;
            } else if tasks.is_empty() {
                state.owners.remove(owner);
            }
            (reserved, overdue)
        };
        fail_overdue(overdue);
        reserved.then(|| Slot {
            state: self.state.clone(),
            owner: owner.to_owned(),
            task: None,
            bytes: 0,
        })
    }

    /// Starts `operation` as a task in the place `slot` holds; the answer to the
    /// `tools/call`. The task is readable by `tasks/get` before this returns, and its
    /// place is given back when its operation ends.
    pub(crate) fn start<F>(&self, slot: Slot, operation: F) -> CreateTaskResult
    where
        F: FnOnce(TaskContext) -> TaskFuture,
    {
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        let poll_ms = u64::try_from(POLL_INTERVAL.as_millis()).unwrap_or(u64::MAX);
        let options = TaskOptions::new().with_ttl_ms(ttl_ms).with_poll_interval_ms(poll_ms);
        let manager = TaskManager::new();
        let kept = manager.clone();
        let task: Task = manager.spawn(options, move |context: TaskContext| {
            // Indexed before the operation starts (it cannot end first) and before the
            // task id leaves this function.
            let mut slot = slot;
            let id = context.task_id().to_owned();
            if let Some(tasks) = lock(&slot.state).owners.get_mut(&slot.owner) {
                tasks.tasks.insert(
                    id.clone(),
                    Kept { manager: kept, started: Instant::now(), ended: false },
                );
            }
            slot.task = Some(id);
            let operation = operation(context);
            Box::pin(async move {
                let result = operation.await;
                slot.bytes = stored_bytes(&result);
                drop(slot);
                result
            })
        });
        CreateTaskResult::new(task)
    }

    /// The manager of `owner`'s task `task_id`, if it is kept.
    fn task(&self, owner: &str, task_id: &str) -> Result<TaskManager, McpError> {
        let (manager, overdue) = {
            let mut state = lock(&self.state);
            let overdue = state.expire();
            let manager = state.owners.get(owner).and_then(|tasks| tasks.tasks.get(task_id));
            (manager.map(|kept| kept.manager.clone()), overdue)
        };
        fail_overdue(overdue);
        manager.ok_or_else(|| unknown(task_id))
    }

    /// `tasks/get`.
    pub(crate) fn get(&self, owner: &str, task_id: &str) -> Result<GetTaskResult, McpError> {
        self.task(owner, task_id)?.get_task(task_id).map(GetTaskResult::new)
    }

    /// `tasks/update`: answers to outstanding input requests (unknown keys ignored).
    pub(crate) fn update(
        &self,
        owner: &str,
        task_id: &str,
        responses: impl IntoIterator<Item = (String, serde_json::Value)>,
    ) -> Result<(), McpError> {
        self.task(owner, task_id)?.update_task(task_id, responses)
    }

    /// `tasks/cancel`: the task's call is canceled; idempotent on a terminal task.
    pub(crate) fn cancel(&self, owner: &str, task_id: &str) -> Result<(), McpError> {
        self.task(owner, task_id)?.cancel_task(task_id)
    }

    /// Aborts every task (the face is going away).
    pub(crate) fn shutdown(&self) {
        let managers: Vec<TaskManager> = lock(&self.state)
            .owners
            .drain()
            .flat_map(|(_, tasks)| tasks.tasks.into_values().map(|kept| kept.manager))
            .collect();
        for manager in managers {
            manager.shutdown();
        }
    }
}

/// The bytes a task's terminal payload takes as JSON: its result, or its error.
fn stored_bytes(result: &Result<CallToolResult, TaskExit>) -> usize {
    let mut counted = Counted(0);
    let written = match result {
        Ok(result) => serde_json::to_writer(&mut counted, result),
        Err(TaskExit::Error(error)) => serde_json::to_writer(&mut counted, error),
        Err(TaskExit::Cancelled) => Ok(()),
    };
    if written.is_err() {
        tracing::warn!("a task's result could not be measured");
    }
    counted.0
}

/// A writer that only counts.
struct Counted(usize);

impl std::io::Write for Counted {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 = self.0.saturating_add(bytes.len());
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn unknown(task_id: &str) -> McpError {
    McpError::invalid_params(format!("unknown task: {task_id}"), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{CallToolResult, ContentBlock, TaskStatus};
    use rmcp::task_manager::TaskExit;

    fn wait_cancel() -> impl FnOnce(TaskContext) -> TaskFuture {
        |task: TaskContext| {
            Box::pin(async move {
                task.cancelled().await;
                Err::<CallToolResult, _>(TaskExit::Cancelled)
            })
        }
    }

    /// An operation that ends at once with `text` as its result.
    fn answers(text: String) -> impl FnOnce(TaskContext) -> TaskFuture {
        move |_task: TaskContext| {
            Box::pin(async move { Ok(CallToolResult::success(vec![ContentBlock::text(text)])) })
        }
    }

    fn start(
        tasks: &Tasks,
        owner: &str,
        operation: impl FnOnce(TaskContext) -> TaskFuture,
    ) -> String {
        let slot = tasks.reserve(owner).expect("a place");
        tasks.start(slot, operation).task.task_id
    }

    /// Waits until `owner` has no running task (every place is given back).
    async fn idle(tasks: &Tasks, owner: &str) {
        while lock(&tasks.state).owners.get(owner).is_some_and(|tasks| tasks.running > 0) {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_task_is_visible_to_its_owner_only() {
        let tasks = Tasks::new(Duration::from_secs(60));
        let id = start(&tasks, "token:a", wait_cancel());
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
    async fn places_are_taken_when_calls_start_and_given_back() {
        let tasks = Tasks::new(Duration::from_secs(60));
        // Places taken by calls that are not tasks yet count as running tasks.
        let places: Vec<Slot> =
            (0..MAX_RUNNING_TASKS).map(|_| tasks.reserve("token:a").expect("a place")).collect();
        assert!(tasks.reserve("token:a").is_none());
        assert!(tasks.reserve("token:b").is_some(), "each identity has its own places");
        // A call answered within its request gives its place back.
        let mut places = places.into_iter();
        drop(places.next());
        let place = tasks.reserve("token:a").expect("the place given back");
        // A task holds its place until it ends.
        let id = tasks.start(place, wait_cancel()).task.task_id;
        assert!(tasks.reserve("token:a").is_none());
        tasks.cancel("token:a", &id).unwrap();
        let mut freed = None;
        while freed.is_none() {
            tokio::task::yield_now().await;
            freed = tasks.reserve("token:a");
        }
        drop(places);
        drop(freed);
        tasks.shutdown();
    }

    #[tokio::test]
    async fn finished_tasks_are_bounded_in_count_oldest_first() {
        let tasks = Tasks::new(Duration::from_secs(60));
        let mut ids = Vec::new();
        for index in 0..MAX_FINISHED_TASKS + 3 {
            ids.push(start(&tasks, "token:a", answers(format!("result {index}"))));
            idle(&tasks, "token:a").await;
        }
        for forgotten in &ids[..3] {
            let error = tasks.get("token:a", forgotten).unwrap_err();
            assert_eq!(error.code, rmcp::model::ErrorCode::INVALID_PARAMS);
        }
        for kept in &ids[3..] {
            let task = tasks.get("token:a", kept).unwrap();
            assert_eq!(task.task.status(), TaskStatus::Completed);
        }
        let other = start(&tasks, "token:b", answers("other".to_owned()));
        idle(&tasks, "token:b").await;
        assert!(tasks.get("token:b", &other).is_ok(), "each identity has its own budget");
    }

    #[tokio::test]
    async fn finished_tasks_are_bounded_in_bytes_oldest_first() {
        let bounds = Bounds { running: 4, finished: 100, finished_bytes: 10_000 };
        let tasks = Tasks::with_bounds(Duration::from_secs(60), bounds);
        let result = |index: usize| format!("{index}{}", "x".repeat(3_000));
        let measure =
            stored_bytes(&Ok(CallToolResult::success(vec![ContentBlock::text(result(0))])));
        assert!(measure > 3_000 && measure < 5_000, "{measure}");
        let mut ids = Vec::new();
        for index in 0..5 {
            ids.push(start(&tasks, "token:a", answers(result(index))));
            idle(&tasks, "token:a").await;
        }
        // 10,000 bytes hold the newest `10_000 / measure` results.
        let kept = 10_000 / measure;
        for (index, id) in ids.iter().enumerate() {
            assert_eq!(tasks.get("token:a", id).is_ok(), index >= ids.len() - kept, "{index}");
        }
        // A result larger than the whole budget is still kept, alone.
        let huge = start(&tasks, "token:a", answers("y".repeat(20_000)));
        idle(&tasks, "token:a").await;
        assert!(tasks.get("token:a", &huge).is_ok());
        assert!(ids.iter().all(|id| tasks.get("token:a", id).is_err()));
    }

    #[tokio::test]
    async fn a_finished_task_is_forgotten_one_ttl_after_it_ended() {
        let bounds = Bounds::default();
        let tasks = Tasks::with_bounds(Duration::from_millis(50), bounds);
        let id = start(&tasks, "token:a", answers("soon gone".to_owned()));
        idle(&tasks, "token:a").await;
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(tasks.get("token:a", &id).is_err());
        assert!(lock(&tasks.state).owners.is_empty(), "nothing is left of the identity");
    }
}
