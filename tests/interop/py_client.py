"""Interop check with the official Python MCP SDK, 1.x: drives toolgate's MCP face over
stdio or Streamable HTTP and prints one PASS/FAIL/SKIP line per check, then
'N passed, N failed'. Exit status 1 when anything failed. (py_client_v2.py drives 2.x.)

usage: py_client.py stdio ROOT SERVER_CMD... | py_client.py http URL ROOT
"""

import asyncio
import os
import sys
import time

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError

from checks import BUILTINS, check, finish, skip, terminated_cleanly


def structured(result):
    return result.structuredContent or {}


def placeholder(result):
    return "not built yet" in (structured(result).get("error") or "")


class Approver:
    """Answers approval elicitations with a scripted decision."""

    def __init__(self):
        self.answer = None
        self.asked = 0

    async def __call__(self, context, params):
        self.asked += 1
        if self.answer == "decline":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"decision": self.answer or "deny"})


async def scenario(session, approver, root, label):
    init = await session.initialize()
    check(f"{label} initialize", init.serverInfo.name == "toolgate", str(init.serverInfo))

    tools = await session.list_tools()
    names = [tool.name for tool in tools.tools]
    check(f"{label} tools/list has the built-ins", all(n in names for n in BUILTINS), str(names))
    read_file = next((t for t in tools.tools if t.name == "read_file"), None)
    check(
        f"{label} read_file is annotated read-only",
        read_file is not None and read_file.annotations.readOnlyHint is True
        and read_file.annotations.destructiveHint is False,
    )

    with open(os.path.join(root, "hello.txt"), "w") as f:
        f.write("hello from interop\n")
    calls = {
        "read_file": {"path": "hello.txt"},
        "find_files": {"pattern": "*.txt"},
        "search_code": {"pattern": "hello"},
    }
    for name, args in calls.items():
        result = await session.call_tool(name, args)
        data = structured(result)
        if placeholder(result):
            check(f"{label} call {name} (protocol only: tool not built here)", data.get("tool") == name)
        else:
            check(f"{label} call {name}", data.get("ok") is True and result.isError is False, str(data)[:300])

    # A tool that does not exist is a protocol error, not a tool result.
    try:
        await session.call_tool("no_such_tool", {})
        check(f"{label} unknown tool -> -32602", False, "the call succeeded")
    except McpError as err:
        data = err.error.data if isinstance(err.error.data, dict) else {}
        check(f"{label} unknown tool -> -32602 unknown_tool", err.error.code == -32602
              and data.get("error_type") == "unknown_tool", str(err.error))

    # Approvals: a side-effect call asks through elicitation.
    approver.answer = "decline"
    before = approver.asked
    result = await session.call_tool("write_file", {"path": "approved.txt", "content": "x"})
    check(f"{label} decline -> permission_denied", structured(result).get("error_type") == "permission_denied"
          and approver.asked == before + 1, str(structured(result))[:300])
    approver.answer = "allow_once"
    result = await session.call_tool("write_file", {"path": "approved.txt", "content": "x"})
    data = structured(result)
    if placeholder(result):
        check(f"{label} accept -> the tool runs (reached the tool)", data.get("error_type") == "internal_error")
    else:
        check(f"{label} accept -> the tool runs", data.get("ok") is True
              and os.path.exists(os.path.join(root, "approved.txt")), str(data)[:300])

    # Progress from a long command, then cancel it.
    progress = []

    async def on_progress(value, total, message):
        progress.append(message)

    approver.answer = "allow_once"
    pid_file = os.path.join(root, f"pid-{label}")
    command = f"for i in 1 2 3; do echo tick-$i; done; echo $$ > {pid_file}; exec sleep 300"
    probe = await session.call_tool("run_command", {"command": "true"})
    if placeholder(probe):
        skip(f"{label} progress and cancel of run_command", "run_command is not built in this tree")
    else:
        # This SDK does not tell the server when a caller gives up on a request, so
        # the cancellation is sent as the spec says: notifications/cancelled naming
        # the request id (the next one the session will use).
        request_id = session._request_id
        async with anyio.create_task_group() as group:
            async def call():
                await session.call_tool("run_command", {"command": command}, progress_callback=on_progress)
            group.start_soon(call)
            deadline = time.time() + 30
            while not os.path.exists(pid_file) and time.time() < deadline:
                await anyio.sleep(0.02)
            # Output chunks may be coalesced: wait for the last line, not a count.
            while "tick-3" not in "".join(m or "" for m in progress) and time.time() < deadline:
                await anyio.sleep(0.02)
            await session.send_notification(types.ClientNotification(types.CancelledNotification(
                params=types.CancelledNotificationParams(requestId=request_id, reason="test"))))
            group.cancel_scope.cancel()
        check(f"{label} progress carries live output", "tick-1" in "".join(m or "" for m in progress), str(progress))
        pid = int(open(pid_file).read().strip()) if os.path.exists(pid_file) else None
        deadline = time.time() + 30
        alive = pid is not None
        while alive and time.time() < deadline:
            try:
                os.kill(pid, 0)
                await anyio.sleep(0.02)
            except ProcessLookupError:
                alive = False
        check(f"{label} cancel kills the command", pid is not None and not alive, f"pid={pid}")

    # The conformance fixture's progress, when fixtures are on.
    if "test_tool_with_progress" in names:
        seen = []

        async def fixture_progress(value, total, message):
            seen.append(value)
        await session.call_tool("test_tool_with_progress", {}, progress_callback=fixture_progress)
        check(f"{label} fixture progress", seen == sorted(seen) and len(seen) >= 3, str(seen))


async def main():
    mode = sys.argv[1]
    approver = Approver()
    if mode == "stdio":
        root = sys.argv[2]
        command = sys.argv[3:]
        params = StdioServerParameters(command=command[0], args=command[1:])
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write, elicitation_callback=approver) as session:
                await scenario(session, approver, root, "stdio")
    else:
        url, root = sys.argv[2], sys.argv[3]
        async with streamablehttp_client(url) as (read, write, _):
            async with ClientSession(read, write, elicitation_callback=approver) as session:
                await scenario(session, approver, root, "http")
        terminated_cleanly("http")
    finish()


if __name__ == "__main__":
    asyncio.run(main())
