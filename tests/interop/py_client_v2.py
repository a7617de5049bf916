"""Interop check with the official Python MCP SDK, 2.x: drives toolgate's MCP face over
stdio or Streamable HTTP through the SDK's high-level `mcp.Client`, and prints one
PASS/FAIL/SKIP line per check, then 'N passed, N failed'. Exit status 1 when anything
failed.

Each run connects twice: with the client's default negotiation (`mode="auto"`: a
`server/discover` probe, which toolgate answers, so the conversation speaks the
stateless 2026-07-28 revision, approvals come back as `input_required` rounds and a
call is canceled by abandoning it) and with `mode="legacy"` (the `initialize`
handshake, approvals as `elicitation/create` requests).

The 1.x client is driven by py_client.py; the two SDKs differ in their entry points
(`Client` vs `ClientSession`), in field names (snake_case models) and in how a call
is canceled, so each has its own script.

usage: py_client_v2.py stdio ROOT SERVER_CMD... | py_client_v2.py http URL ROOT
"""

import os
import sys
import time

import anyio
from mcp import Client, MCPError, StdioServerParameters, types

from checks import BUILTINS, WARNINGS, check, finish, skip, terminated_cleanly

MODERN = "2026-07-28"


def structured(result):
    return result.structured_content or {}


def placeholder(result):
    return "not built yet" in (structured(result).get("error") or "")


class Approver:
    """Answers approval elicitations (a request, or an input_required round) with a
    scripted decision."""

    def __init__(self):
        self.answer = None
        self.asked = 0

    async def __call__(self, context, params):
        self.asked += 1
        if self.answer == "decline":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"decision": self.answer or "deny"})


async def scenario(client, approver, root, label, expected_version):
    check(f"{label} negotiated {expected_version}", client.protocol_version == expected_version,
          str(client.protocol_version))
    if expected_version == MODERN:
        # The discover result's serverInfo stamp is optional in 2026-07-28; when sent it
        # must name toolgate.
        info = client.server_info
        check(f"{label} server identity", info is None or info.name == "toolgate", str(info))
    else:
        check(f"{label} server identity", client.server_info is not None
              and client.server_info.name == "toolgate", str(client.server_info))
    check(f"{label} tools capability", client.server_capabilities.tools is not None,
          str(client.server_capabilities))

    tools = await client.list_tools()
    names = [tool.name for tool in tools.tools]
    check(f"{label} tools/list has the built-ins", all(n in names for n in BUILTINS), str(names))
    read_file = next((t for t in tools.tools if t.name == "read_file"), None)
    check(
        f"{label} read_file is annotated read-only",
        read_file is not None and read_file.annotations is not None
        and read_file.annotations.read_only_hint is True
        and read_file.annotations.destructive_hint is False,
        str(read_file.annotations if read_file else None),
    )

    tag = label.replace("/", "-")  # for file names
    with open(os.path.join(root, "hello.txt"), "w") as f:
        f.write("hello from interop\n")
    calls = {
        "read_file": {"path": "hello.txt"},
        "find_files": {"pattern": "*.txt"},
        "search_code": {"pattern": "hello"},
    }
    for name, args in calls.items():
        result = await client.call_tool(name, args)
        data = structured(result)
        if placeholder(result):
            check(f"{label} call {name} (protocol only: tool not built here)", data.get("tool") == name)
        else:
            check(f"{label} call {name}", data.get("ok") is True and data.get("tool") == name
                  and result.is_error is False, str(data)[:300])
    result = await client.call_tool("read_file", {"path": "hello.txt"})
    if not placeholder(result):
        check(f"{label} read_file content", "hello from interop" in (structured(result).get("content") or "")
              and any(getattr(block, "text", "") and "hello from interop" in block.text
                      for block in result.content), str(result)[:300])

    # A tool that does not exist is a protocol error, not a tool result.
    try:
        await client.call_tool("no_such_tool", {})
        check(f"{label} unknown tool -> -32602", False, "the call succeeded")
    except MCPError as err:
        data = err.data if isinstance(err.data, dict) else {}
        check(f"{label} unknown tool -> -32602 unknown_tool", err.code == -32602
              and data.get("error_type") == "unknown_tool", f"{err.code} {err.message} {err.data}")

    # Approvals: a side-effect call asks (elicitation/create in the handshake era, an
    # input_required round in 2026-07-28; the client routes both to the callback).
    approver.answer = "decline"
    before = approver.asked
    result = await client.call_tool("write_file", {"path": f"approved-{tag}.txt", "content": "x"})
    check(f"{label} decline -> permission_denied", structured(result).get("error_type") == "permission_denied"
          and result.is_error is True and approver.asked == before + 1, str(structured(result))[:300])
    check(f"{label} declined write left no file", not os.path.exists(os.path.join(root, f"approved-{tag}.txt")))
    approver.answer = "allow_once"
    before = approver.asked
    result = await client.call_tool("write_file", {"path": f"approved-{tag}.txt", "content": "x"})
    data = structured(result)
    if placeholder(result):
        check(f"{label} accept -> the tool runs (reached the tool)", data.get("error_type") == "internal_error")
    else:
        check(f"{label} accept -> the tool runs", data.get("ok") is True and approver.asked == before + 1
              and os.path.exists(os.path.join(root, f"approved-{tag}.txt")), str(data)[:300])

    # Progress from a long command, then cancel it by abandoning the call: the client
    # sends notifications/cancelled (stdio, handshake-era HTTP) or drops the request's
    # HTTP stream (2026-07-28 over HTTP).
    progress = []

    async def on_progress(value, total, message):
        progress.append(message)

    approver.answer = "allow_once"
    pid_file = os.path.join(root, f"pid-{tag}")
    command = f"for i in 1 2 3; do echo tick-$i; done; echo $$ > {pid_file}; exec sleep 300"
    probe = await client.call_tool("run_command", {"command": "true"})
    if placeholder(probe):
        skip(f"{label} progress and cancel of run_command", "run_command is not built in this tree")
    else:
        finished = []
        async with anyio.create_task_group() as group:
            async def call():
                finished.append(await client.call_tool("run_command", {"command": command},
                                                       progress_callback=on_progress))
            group.start_soon(call)
            deadline = time.time() + 30
            while not os.path.exists(pid_file) and time.time() < deadline:
                await anyio.sleep(0.02)
            # Output chunks may be coalesced: wait for the last line, not a count.
            while "tick-3" not in "".join(m or "" for m in progress) and time.time() < deadline:
                await anyio.sleep(0.02)
            group.cancel_scope.cancel()
        check(f"{label} progress carries live output", "tick-1" in "".join(m or "" for m in progress), str(progress))
        check(f"{label} the abandoned call had not finished", not finished, str(finished)[:300])
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
        # The conversation goes on after a canceled call.
        result = await client.call_tool("read_file", {"path": "hello.txt"})
        check(f"{label} calls work after a cancel", structured(result).get("tool") == "read_file",
              str(structured(result))[:300])

    # The conformance fixture's progress, when fixtures are on.
    if "test_tool_with_progress" in names:
        seen = []

        async def fixture_progress(value, total, message):
            seen.append(value)
        await client.call_tool("test_tool_with_progress", {}, progress_callback=fixture_progress)
        check(f"{label} fixture progress", seen == sorted(seen) and len(seen) >= 3, str(seen))


async def main():
    transport = sys.argv[1]
    approver = Approver()
    for mode, expected in (("auto", MODERN), ("legacy", "2025-11-25")):
        label = f"{transport}/{mode}"
        if transport == "stdio":
            root = sys.argv[2]
            command = sys.argv[3:]
            server = StdioServerParameters(command=command[0], args=command[1:])
        else:
            server, root = sys.argv[2], sys.argv[3]
        WARNINGS.messages.clear()
        try:
            async with Client(server, mode=mode, elicitation_callback=approver) as client:
                await scenario(client, approver, root, label, expected)
        except Exception as err:  # noqa: BLE001 - any failure to talk is a failed check
            check(f"{label} conversation", False, f"{type(err).__name__}: {err}")
        if transport == "http" and mode == "legacy":
            terminated_cleanly(label)
    finish()


if __name__ == "__main__":
    anyio.run(main)
