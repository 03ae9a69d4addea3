"""A bare TCP relay on trio: the floor for a Kafka proxy written in Python on trio.

    python bench/_relay.py LISTEN_PORT TARGET_PORT

Listens on 127.0.0.1:LISTEN_PORT and copies bytes both ways to 127.0.0.1:TARGET_PORT, one task
per direction, with nothing parsed: what is left of a proxy's cost per request is trio's and the
kernel's. Loopback only; it must never grow Kafka awareness, or it stops being the floor.
"""

import sys
from functools import partial

import trio

HOST = "127.0.0.1"
CHUNK = 256 * 1024


async def pump(source: trio.SocketStream, sink: trio.SocketStream, done: trio.CancelScope) -> None:
    try:
        while data := await source.receive_some(CHUNK):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    done.cancel()  # either side closing ends the connection


async def relay(target: int, client: trio.SocketStream) -> None:
    broker = await trio.open_tcp_stream(HOST, target)
    async with client, broker, trio.open_nursery() as nursery:
        nursery.start_soon(pump, client, broker, nursery.cancel_scope)
        nursery.start_soon(pump, broker, client, nursery.cancel_scope)


if __name__ == "__main__":
    listen, target = int(sys.argv[1]), int(sys.argv[2])
    trio.run(partial(trio.serve_tcp, partial(relay, target), listen, host=HOST))
