"""The pipe between the ServerApp's process and the server's: both ends and what crosses it.

The ServerApp runs in a process of its own (:mod:`.serverapp`), so its
Python code and the native code it calls (protobuf serializing a round's
model, numpy aggregating the replies) never hold the server process's GIL:
the server's event loop keeps its timers while the strategy computes. Each
call its grid makes is one request over a Unix socket pair (:class:`Pipe`).
A message is a small pickled header ``(kind, request id, value, payload
count)`` followed by that many payloads as raw byte strings, each
length-prefixed: a payload is written from the buffer it is in (a reply
straight from the ZeroMQ frame it arrived in) and read into a buffer of
its own, with the GIL released while the kernel copies, and never pickled.

The app's end is :class:`AppLink`: any thread of the app may call
(Flower's legacy apps ask for node ids from a second thread while the
first waits in ``send_and_receive``); a reader thread hands each answer to
the call that waits for it. The server's end is :class:`Relay`: a thread
that only waits on the pipe and answers each request from the
:class:`~.exchange.Exchange`; a ``send_and_receive`` is answered by a
second thread once the exchange says its replies are in
(:meth:`~.exchange.Exchange.watch`), so no request waits behind another and
no thread is made per round.

Requests (the app's end to the server's), ``(op, id, args, payloads)``:

- ``push (replies, timeout, batch)``: the messages' ``(head, message id,
  digest, payload index)``, one payload per distinct content; answered
  ``(ids, batch number)``.
- ``wait (number,)``: a send_and_receive's replies, when it has them all,
  its timeout passed or the run ended.
- ``pull (ids,)``: the replies that came for ``ids``.
- ``nodes ()``: the federation's node ids.
- ``done (error,)``: the ServerApp returned (``None``) or raised (its
  text); not answered.

Answers: ``("ok", id, value, n)`` then ``n`` payloads, or ``("ended", id,
text, 0)`` once the run is over. A reply crosses as ``(message id, code,
reason, num_examples, has payload)``, the node's serialized reply as its
payload (:class:`~.exchange.Reply`).
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import queue
import select
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedsim.flower.content import Head
from fedsim.flower.exchange import Exchange, Pushed, Reply, RunEnded

__all__ = ["AppLink", "Pipe", "Relay", "Sent", "WireReply"]

log = logging.getLogger(__name__)

#: a reply as it crosses: (message id, code, reason, num_examples, has payload)
WireReply = tuple[str, int, str, int | None, bool]
#: a pushed message as it crosses: (head, message id, digest, payload index)
Sent = tuple[Head, str, bytes, int]


class Pipe:
    """One end of the socket pair: objects (pickled) and byte strings, each sent
    with its length first and read into a buffer of its own."""

    _LEN = struct.Struct("!Q")
    #: at most this much is copied to send a short message in one write
    _SMALL = 1 << 16

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, obj: object) -> None:
        self.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    def send_bytes(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        n = view.nbytes
        if n <= self._SMALL:
            self.sock.sendall(self._LEN.pack(n) + view.tobytes())
        else:
            self.sock.sendall(self._LEN.pack(n))
            self.sock.sendall(view.cast("B") if view.format != "B" or view.ndim != 1 else view)

    def recv(self) -> Any:
        return pickle.loads(self.recv_bytes())

    def recv_bytes(self) -> bytearray:
        head = self._exactly(self._LEN.size)
        return self._exactly(self._LEN.unpack(head)[0])

    def _exactly(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise EOFError("the other end closed the pipe")
            got += k
        return buf

    def poll(self, timeout: float) -> bool:
        """Whether something can be read within ``timeout`` seconds."""
        return bool(select.select([self.sock], [], [], timeout)[0])

    def shutdown(self) -> None:
        """Wake a reader blocked on this end (the other end may be held by others)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.sock.close()


def _send(conn: Pipe, lock: threading.Lock, header: tuple[Any, ...],
          payloads: Sequence[bytes | bytearray | memoryview] = ()) -> None:
    with lock:
        conn.send(header)
        for b in payloads:
            conn.send_bytes(b)


@dataclass
class _Pending:
    event: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    payloads: list[bytearray] = field(default_factory=list)
    ended: str | None = None


class AppLink:
    """The ServerApp's end of the pipe: calls that block until the server answers."""

    def __init__(self, conn: Pipe) -> None:
        self._conn = conn
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._ids = 0
        self._pending: dict[int, _Pending] = {}
        #: why the link ended (the run is over), once it has
        self.ended: str | None = None
        self._reader = threading.Thread(target=self._read, name="fedsim-flower-link",
                                        daemon=True)

    def start(self) -> None:
        """Start reading answers (after the start command was read)."""
        self._reader.start()

    def call(self, op: str, args: tuple[Any, ...] = (),
             payloads: Sequence[bytes] = ()) -> tuple[Any, list[bytearray]]:
        """Send request ``op`` and wait for its answer: (value, payloads).
        Raises :class:`RunEnded` when the run has ended."""
        with self._lock:
            if self.ended is not None:
                raise RunEnded(self.ended)
            self._ids += 1
            rid = self._ids
            pending = self._pending[rid] = _Pending()
        try:
            _send(self._conn, self._send_lock, (op, rid, args, len(payloads)), payloads)
        except OSError as exc:
            self._end(f"the fedsim run has ended (its server's pipe: {exc})")
        pending.event.wait()
        if pending.ended is not None:
            raise RunEnded(pending.ended)
        return pending.value, pending.payloads

    def notify(self, op: str, args: tuple[Any, ...] = ()) -> None:
        """Send ``op``, which is not answered (``done``); a closed pipe is ignored."""
        with contextlib.suppress(OSError):
            _send(self._conn, self._send_lock, (op, 0, args, 0))

    def _read(self) -> None:
        why = "the fedsim run has ended"
        try:
            while True:
                kind, rid, value, n = self._conn.recv()
                payloads = [self._conn.recv_bytes() for _ in range(n)]
                with self._lock:
                    pending = self._pending.pop(rid, None)
                if pending is None:
                    continue
                if kind == "ok":
                    pending.value, pending.payloads = value, payloads
                else:                 # the run is over: every later call raises too
                    pending.ended = str(value)
                    with self._lock:
                        if self.ended is None:
                            self.ended = pending.ended
                pending.event.set()
        except (EOFError, OSError):
            pass
        except Exception as exc:      # a malformed answer: no call may wait forever
            why = f"fedsim's pipe to the server failed: {type(exc).__name__}: {exc}"
        finally:
            self._end(why)

    def _end(self, why: str) -> None:
        with self._lock:
            if self.ended is None:
                self.ended = why
            pending = list(self._pending.values())
            self._pending.clear()
        for p in pending:
            p.ended = self.ended
            p.event.set()


def wire_replies(replies: Sequence[Reply],
                 ) -> tuple[list[WireReply], list[bytes | bytearray | memoryview]]:
    """Replies as they cross the pipe, and their payloads in order."""
    out: list[WireReply] = []
    payloads: list[bytes | bytearray | memoryview] = []
    for r in replies:
        out.append((r.message_id, int(r.code), r.reason, r.num_examples, r.data is not None))
        if r.data is not None:
            payloads.append(r.data)
    return out, payloads


def replies_of(wire: Sequence[WireReply], payloads: Sequence[bytearray]) -> list[Reply]:
    """The replies back from :func:`wire_replies`."""
    it = iter(payloads)
    return [Reply(mid, data=next(it) if has else None, num_examples=num, code=code,
                  reason=reason) for mid, code, reason, num, has in wire]


class Relay:
    """The server's end of the pipe: answers the ServerApp's requests from ``exchange``.

    ``on_done(error)`` is called once, from the relay's thread, when the
    ServerApp returned (``None``), raised (``"raised KeyError: ..."``), or
    its process ended without saying (a text that says so: each completes
    "the ServerApp ...")."""

    def __init__(self, conn: Pipe, exchange: Exchange,
                 on_done: Callable[[str | None], None]) -> None:
        self._conn = conn
        self._exchange = exchange
        self._on_done = on_done
        self._done = False
        self._send_lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="fedsim-flower-relay",
                                        daemon=True)
        #: the waits whose replies are in: (request id, batch number); None ends it
        self._ready: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._answerer = threading.Thread(target=self._answer_waits,
                                          name="fedsim-flower-answers", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._answerer.start()

    def send(self, header: tuple[Any, ...]) -> None:
        """A command to the app's process (``start``), outside any request."""
        _send(self._conn, self._send_lock, header)

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._ready.put(None)
        if self._answerer.is_alive():
            self._answerer.join(timeout)

    def close(self) -> None:
        """Close the server's end (once the app's process has ended): a reader still
        blocked on it (a process the app forked holds the other end) is woken."""
        self._conn.shutdown()
        self.join(1.0)
        with contextlib.suppress(Exception):
            self._conn.close()

    def _finish(self, error: str | None) -> None:
        if not self._done:
            self._done = True
            self._on_done(error)

    def _serve(self) -> None:
        try:
            while True:
                op, rid, args, n = self._conn.recv()
                payloads = [self._conn.recv_bytes() for _ in range(n)]
                if op == "done":
                    self._finish(args[0])
                elif op == "wait":
                    self._watch(rid, args[0])
                else:
                    self._answer(rid, op, args, payloads)
        except (EOFError, OSError):
            self._finish("ended without returning (its process exited)")
        except Exception as exc:      # a malformed request: the app's process is ours
            log.error("the ServerApp's pipe carried a malformed request: %s: %s",
                      type(exc).__name__, exc)
            self._finish(f"could not be served (a malformed request: {type(exc).__name__}: "
                         f"{exc})")

    def _reply(self, rid: int, value: Any,
               payloads: Sequence[bytes | bytearray | memoryview] = ()) -> None:
        # the app's process gone (the reader sees it), or the pipe closed at the end
        with contextlib.suppress(Exception):
            _send(self._conn, self._send_lock, ("ok", rid, value, len(payloads)), payloads)

    def _ended(self, rid: int, why: str) -> None:
        with contextlib.suppress(Exception):
            _send(self._conn, self._send_lock, ("ended", rid, why, 0))

    def _answer(self, rid: int, op: str, args: tuple[Any, ...],
                payloads: list[bytearray]) -> None:
        ex = self._exchange
        try:
            if op == "push":
                sent, timeout, batch = args
                pushed = [Pushed(Head(*head), mid, payloads[i], digest)
                          for head, mid, digest, i in sent]
                self._reply(rid, ex.push(pushed, timeout, batch))
            elif op == "pull":
                self._reply(rid, *wire_replies(ex.pull(args[0])))
            elif op == "nodes":
                self._reply(rid, ex.node_ids())
            else:
                raise ValueError(f"unknown request {op!r}")
        except RunEnded as exc:
            self._ended(rid, str(exc))

    def _watch(self, rid: int, number: int) -> None:
        def ready() -> None:
            self._ready.put((rid, number))

        self._exchange.watch(number, ready)

    def _answer_waits(self) -> None:
        while True:
            item = self._ready.get()
            if item is None:
                return
            rid, number = item
            try:
                self._reply(rid, *wire_replies(self._exchange.finish(number)))
            except RunEnded as exc:
                self._ended(rid, str(exc))
            except Exception as exc:      # never leave the app's call waiting
                log.error("a send_and_receive could not be answered: %s: %s",
                          type(exc).__name__, exc)
                self._ended(rid, f"fedsim could not answer it: {type(exc).__name__}: {exc}")
