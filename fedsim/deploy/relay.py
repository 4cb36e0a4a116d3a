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
        self._conns: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The port it accepts on (after :meth:`start`; useful with port 0)."""
        assert self.server is not None, "not started"
        return int(self.server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accepted, *self.listen)

    async def close(self) -> None:
        """Stop accepting and drop every connection under way."""
        if self.server is not None:
            self.server.close()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()

    async def _accepted(self, r_in: asyncio.StreamReader, w_in: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            await self._serve(r_in, w_in)
        finally:
            self._conns.discard(task)

    async def _serve(self, r_in: asyncio.StreamReader, w_in: asyncio.StreamWriter) -> None:
        try:
            r_out, w_out = await asyncio.open_connection(*self.to)
        except OSError:
            await _close(w_in)
            return
        try:
            async with asyncio.TaskGroup() as pipes:  # one failing cancels the other
                pipes.create_task(self._pipe(r_in, w_out))
                pipes.create_task(self._pipe(r_out, w_in))
        except* OSError:
            pass  # a side reset its connection: drop both
        finally:
            await asyncio.gather(_close(w_in), _close(w_out))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy ``reader`` to ``writer``, each chunk ``delay`` s after it was read."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def sender() -> None:
            while True:
                due, chunk = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not chunk:  # end of stream: pass the half-close on
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()

        task = asyncio.ensure_future(sender())
        try:
            while not task.done():  # (a sender that failed ends the reading too)
                read = asyncio.ensure_future(reader.read(1 << 16))
                await asyncio.wait({read, task}, return_when=asyncio.FIRST_COMPLETED)
                if not read.done():
                    read.cancel()
                    break
                chunk = read.result()
                queue.put_nowait((loop.time() + self.delay, chunk))
                if not chunk:
                    break
            await task
        finally:
            task.cancel()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host or "127.0.0.1", int(port)


def main(argv: list[str] | None = None) -> int:
    """Entry point: relay until killed."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--listen", required=True, type=_addr, help="HOST:PORT to accept on")
    ap.add_argument("--to", required=True, type=_addr, help="HOST:PORT to forward to")
    ap.add_argument("--delay-ms", type=float, required=True, help="added one-way delay")
    args = ap.parse_args(argv)

    async def run() -> None:
        relay = Relay(args.listen, args.to, args.delay_ms / 1e3)
        await relay.start()
        print("relay ready", flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
