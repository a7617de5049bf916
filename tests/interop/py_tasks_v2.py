"""The MCP tasks extension through the official Python SDK 2.x client: a long
`run_command` is answered as a task (after its approval round), polled with
`tasks/get` until it completes, and another one is canceled with `tasks/cancel`,
which kills its command. The SDK has no tasks client of its own; the extension is
written here the way the SDK means extensions to be written (a `ClientExtension`
whose `ResultClaim` resolves a `resultType: "task"` answer into the tool's result),
so every message goes through the SDK's own session, validation and transports.

Prints one PASS/FAIL line per check, then 'N passed, N failed'; exit status 1 when
anything failed.

usage: py_tasks_v2.py stdio ROOT SERVER_CMD... | py_tasks_v2.py http URL ROOT
"""

import os
import sys
import time
from typing import Any, Literal

import anyio
from pydantic import TypeAdapter
from mcp import Client, StdioServerParameters, types
from mcp.client.extension import ClientExtension, ResultClaim

from checks import check, finish

TASKS = "io.modelcontextprotocol/tasks"
ANY = TypeAdapter(dict[str, Any])
TERMINAL = ("completed", "failed", "cancelled")


class CreateTaskResult(types.Result):
    """`resultType: "task"`: the task the server made of a call."""

    result_type: Literal["task"]
    task_id: str
    status: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class TaskRequest(types.Request[dict[str, Any], str]):
    """tasks/get, tasks/update, tasks/cancel (their Mcp-Name header is the task id)."""

    name_param = "taskId"


class Tasks(ClientExtension):
    """Resolves a task into the call's result by polling `tasks/get`. `on_working`
    runs at each poll that finds the task working (the test's hook to release or
    cancel it)."""

    identifier = TASKS

    def __init__(self):
        self.created = []
        self.statuses = []
        self.on_working = None

    def claims(self):
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=self.resolve)]

    async def request(self, session, method, task_id):
        return await session.send_request(TaskRequest(method=method, params={"taskId": task_id}), ANY)

    async def resolve(self, created, ctx):
        self.created.append(created)
        deadline = time.time() + 60
        while time.time() < deadline:
            state = await self.request(ctx.session, "tasks/get", created.task_id)
            self.statuses.append(state.get("status"))
            if state.get("status") == "working" and self.on_working is not None:
                await self.on_working(ctx.session, created.task_id)
            elif state.get("status") in TERMINAL:
                if state["status"] == "completed":
                    return types.CallToolResult.model_validate(state["result"])
                text = f"task {state['status']}: {state.get('error')}"
                return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
            await anyio.sleep((created.poll_interval_ms or 500) / 1000)
        raise TimeoutError(f"task {created.task_id} never settled: {self.statuses}")


async def approve(context, params):
    return types.ElicitResult(action="accept", content={"decision": "allow_once"})


async def scenario(client, tasks, root, label):
    # Start and poll: the command waits for a file the first `working` poll creates.
    go = os.path.join(root, f"go-{label.replace('/', '-')}")

    async def release(session, task_id):
        open(go, "w").close()

    tasks.on_working = release
    command = f"while [ ! -e {go} ]; do sleep 0.05; done; echo task-finished"
    result = await client.call_tool("run_command", {"command": command})
    created = tasks.created[-1] if tasks.created else None
    check(f"{label} a long call is answered with a task", created is not None
          and created.status == "working" and bool(created.task_id), str(created))
    check(f"{label} the task was polled while working", "working" in tasks.statuses, str(tasks.statuses))
    data = result.structured_content or {}
    check(f"{label} the completed task carries the call's result", data.get("ok") is True
          and "task-finished" in (data.get("content") or ""), str(data)[:300])

    # Cancel: the first `working` poll once the command runs sends tasks/cancel.
    pid_file = os.path.join(root, f"pid-{label.replace('/', '-')}")
    acks = []

    async def cancel(session, task_id):
        if os.path.exists(pid_file) and not acks:
            acks.append(await tasks.request(session, "tasks/cancel", task_id))

    tasks.on_working = cancel
    tasks.statuses.clear()
    result = await client.call_tool("run_command", {"command": f"echo $$ > {pid_file}; exec sleep 300"})
    check(f"{label} tasks/cancel is acknowledged", acks == [{"resultType": "complete"}], str(acks))
    check(f"{label} a canceled task settles as cancelled", tasks.statuses[-1:] == ["cancelled"]
          and result.is_error is True, str(tasks.statuses))
    pid = int(open(pid_file).read().strip()) if os.path.exists(pid_file) else None
    deadline = time.time() + 30
    alive = pid is not None
    while alive and time.time() < deadline:
        try:
            os.kill(pid, 0)
            await anyio.sleep(0.02)
        except ProcessLookupError:
            alive = False
    check(f"{label} tasks/cancel kills the command", pid is not None and not alive, f"pid={pid}")


async def main():
    transport = sys.argv[1]
    if transport == "stdio":
        root = sys.argv[2]
        command = sys.argv[3:]
        server = StdioServerParameters(command=command[0], args=command[1:])
    else:
        server, root = sys.argv[2], sys.argv[3]
    label = f"{transport}/tasks"
    tasks = Tasks()
    try:
        async with Client(server, mode="auto", elicitation_callback=approve, extensions=[tasks]) as client:
            check(f"{label} negotiated 2026-07-28", client.protocol_version == "2026-07-28",
                  str(client.protocol_version))
            extensions = client.server_capabilities.extensions or {}
            check(f"{label} the server advertises the tasks extension", TASKS in extensions, str(extensions))
            await scenario(client, tasks, root, label)
    except Exception as err:  # noqa: BLE001 - any failure to talk is a failed check
        check(f"{label} conversation", False, f"{type(err).__name__}: {err}")
    finish()


if __name__ == "__main__":
    anyio.run(main)
