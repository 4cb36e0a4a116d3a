"""A TCP relay that adds a fixed real delay in both directions, keeping order.

For testing a deployment over a slow path when the kernel offers no qdisc
to delay packets (``tc netem`` is not available everywhere): each chunk read
from one side is written to the other ``delay`` seconds after it was read.
Run as ``python -m fedsim.deploy.relay --listen HOST:PORT --to HOST:PORT
--delay-ms 20``; it serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys

__all__ = ["Relay", "main"]


class Relay:
    """Forwards every connection to ``listen`` onto ``to``, each byte ``delay`` s late."""

    def __init__(self, listen: tuple[str, int], to: tuple[str, int], delay: float) -> None:
        self.listen, self.to, self.delay = listen, to, delay
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, *self.listen)

    async def _serve(self, r_in: asyncio.StreamReader, w_in: asyncio.StreamWriter) -> None:
        try:
            r_out, w_out = await asyncio.open_connection(*self.to)
        except OSError:
            w_in.close()
            return
        await asyncio.gather(self._pipe(r_in, w_out), self._pipe(r_out, w_in),
                             return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def sender() -> None:
            while True:
                due, chunk = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not chunk:
                    writer.close()
                    return
                writer.write(chunk)
                await writer.drain()

        task = asyncio.ensure_future(sender())
        try:
            while True:
                chunk = await reader.read(1 << 16)
                queue.put_nowait((loop.time() + self.delay, chunk))
                if not chunk:
                    break
            await task
        finally:
            task.cancel()
            with contextlib.suppress(Exception):
                writer.close()


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def main(argv: list[str] | None = None) -> int:
    """Entry point: relay until killed."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--listen", required=True, help="HOST:PORT to accept on")
    ap.add_argument("--to", required=True, help="HOST:PORT to forward to")
    ap.add_argument("--delay-ms", type=float, required=True, help="added one-way delay")
    args = ap.parse_args(argv)

    async def run() -> None:
        relay = Relay(_addr(args.listen), _addr(args.to), args.delay_ms / 1e3)
        await relay.start()
        print("relay ready", flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
