"""A fault-injecting TCP proxy on loopback: forwards connections to a target and cuts them at
random (each forwarded chunk may close both sides), or all at once on demand (`cut_all`), so
messages in flight are lost on real sockets, or closes every new connection at once for a
while (`refuse_for`) or until told otherwise (`refuse`, `accept`), or holds every new
connection a while before forwarding it (`hold_new`), or delays every byte by `delay` seconds
each way (a slow network: its bytes kept in order, reading never held back, so the bandwidth
is the target's). Runs its own event loop in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time

from rlog.tools.dev import free_port


class FaultProxy:
    def __init__(
        self,
        target: str,
        cut: float,
        seed: int,
        host: str = "127.0.0.1",
        delay: float = 0.0,
        port: int | None = None,
    ) -> None:
        self.target_host, _, target_port = target.rpartition(":")
        self.target_port = int(target_port)
        self.cut = cut
        self.delay = delay
        self.rng = random.Random(seed)
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.cuts = 0
        self._refuse_until = 0.0  # time.monotonic(): new connections are closed before then
        self._refusing = False  # new connections are closed until `accept`
        self.refused = 0  # connections closed so
        self._hold = 0.0  # seconds each new connection waits before it is forwarded
        self.held = 0  # connections that waited so
        self._open: set[asyncio.StreamWriter] = set()
        self._cut_alls = 0  # `cut_all` calls so far: a connection being made meanwhile is cut too
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def cut_all(self) -> int:
        """Close every connection open now, both sides (new ones are forwarded as before);
        returns how many sockets were closed."""

        def close_all() -> int:
            writers, self._open = self._open, set()
            self._cut_alls += 1
            for w in writers:
                w.close()
            self.cuts += 1
            return len(writers)

        return asyncio.run_coroutine_threadsafe(_call(close_all), self._loop).result(10)

    def refuse_for(self, seconds: float) -> None:
        """Close every new connection as soon as it is accepted, for `seconds` from now (a
        server that is up but whose connections die before gRPC's handshake)."""
        self._refuse_until = time.monotonic() + seconds

    def refuse(self) -> None:
        """Close every new connection as soon as it is accepted until `accept` is called:
        a window the test ends, where a timed one could close before a slow host's call
        came to it."""
        self._refusing = True

    def accept(self) -> None:
        """Forward new connections again (ends `refuse` and any `refuse_for`)."""
        self._refusing = False
        self._refuse_until = 0.0

    def hold_new(self, seconds: float) -> None:
        """From now on, hold every new connection `seconds` before forwarding it (a peer
        whose name resolves, or whose connection is made, slowly); open ones are untouched."""
        self._hold = seconds

    def stop(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, self.host, self.port)
        )
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            # The connections' tasks end here, cancelled, rather than be destroyed pending
            # with the loop ("Task was destroyed but it is pending!" in every run's output).
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing or time.monotonic() < self._refuse_until:
            self.refused += 1
            writer.close()
            return
        cut_alls = self._cut_alls
        if self._hold > 0:
            self.held += 1
            await asyncio.sleep(self._hold)
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.close()
            return
        if self._cut_alls != cut_alls:
            # accepted before a `cut_all` but not yet open when it ran: it was open "now" too
            # (a client's reconnect slipped through a test's cut and refusal this way)
            up_writer.close()
            writer.close()
            return
        self._open.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while chunk := await src.read(65536):
                    if self.rng.random() < self.cut:
                        self.cuts += 1
                        break  # the chunk is lost and the connection cut
                    dst.write(chunk)
                    await dst.drain()
            for w in (writer, up_writer):
                w.close()
                self._open.discard(w)

        async def delayed(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            loop = asyncio.get_running_loop()
            chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

            async def forward() -> None:
                while True:
                    due, chunk = await chunks.get()
                    await asyncio.sleep(max(0.0, due - loop.time()))
                    if not chunk:
                        break
                    dst.write(chunk)
                    await dst.drain()

            forwarding = loop.create_task(forward())
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while chunk := await src.read(65536):
                    chunks.put_nowait((loop.time() + self.delay, chunk))
            chunks.put_nowait((loop.time() + self.delay, b""))
            with contextlib.suppress(OSError):
                await forwarding
            for w in (writer, up_writer):
                w.close()
                self._open.discard(w)

        way = delayed if self.delay > 0 else pipe
        await asyncio.gather(way(reader, up_writer), way(up_reader, writer))


async def _call(fn):  # type: ignore[no-untyped-def]
    return fn()
