"""A loopback TCP relay that can hold back a server's replies: a server that applies a request
but answers late (etcd committing while the broker is frozen past its deadline, say), on
purpose rather than by luck.

Bytes go through unchanged both ways. While ``holding_replies()`` is open, the server's bytes
wait in the relay (and then in the kernel's buffers); they are delivered, in order, when it
closes. Requests still reach the server at once.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress


class TcpRelay:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._replies_flow = threading.Event()
        self._replies_flow.set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="tcp-relay", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @contextmanager
    def holding_replies(self) -> Iterator[None]:
        self._replies_flow.clear()
        try:
            yield
        finally:
            self._replies_flow.set()

    def close(self) -> None:
        self._closed.set()
        self._replies_flow.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._upstream)
            for source, sink, gate in (
                (client, upstream, None),
                (upstream, client, self._replies_flow),
            ):
                threading.Thread(
                    target=self._pump, args=(source, sink, gate), name="tcp-relay-pump", daemon=True
                ).start()

    def _pump(
        self, source: socket.socket, sink: socket.socket, gate: threading.Event | None
    ) -> None:
        with suppress(OSError):
            while chunk := source.recv(65536):
                if gate is not None:
                    gate.wait()
                sink.sendall(chunk)
        for end in (source, sink):
            with suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
