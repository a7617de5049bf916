"""Stands in front of toolgate's MCP endpoint for clients that cannot send a bearer
token (the conformance suite has no option for one): every request is forwarded with
`Authorization: Bearer <token>` added and `Connection: close`, then the bytes are
relayed both ways unchanged (SSE streams included). The Host and Origin headers pass
through as sent, so toolgate's own checks still see what the client sent.

usage: bearer_proxy.py LISTEN_PORT UPSTREAM_PORT TOKEN
"""

import asyncio
import sys

DROPPED = (b"authorization:", b"connection:", b"keep-alive:", b"proxy-connection:")


async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        try:
            writer.close()
        except ConnectionError:
            pass


async def handle(client_reader, client_writer, upstream_port: int, token: bytes) -> None:
    try:
        head = await client_reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        client_writer.close()
        return
    lines = head[:-4].split(b"\r\n")
    kept = [line for line in lines[1:] if not line.lower().startswith(DROPPED)]
    forwarded = [lines[0], *kept, b"Authorization: Bearer " + token, b"Connection: close"]
    try:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
    except OSError:
        client_writer.close()
        return
    upstream_writer.write(b"\r\n".join(forwarded) + b"\r\n\r\n")
    to_upstream = asyncio.create_task(relay(client_reader, upstream_writer))
    # The answer ends the exchange: the upstream closes after it (Connection: close).
    await relay(upstream_reader, client_writer)
    to_upstream.cancel()


async def main() -> None:
    listen_port, upstream_port, token = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode()
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, upstream_port, token), "127.0.0.1", listen_port
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
