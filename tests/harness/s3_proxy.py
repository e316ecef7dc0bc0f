"""A loopback TCP proxy in front of an S3 server, with two faults a test can switch on.

For races and outages a test has to hit every time rather than by luck. Each connection is
piped through unchanged, except that

* a connection whose request is a PUT of a key matching ``hold`` (a regular expression on the
  request target) is forwarded only after ``delay_s``: an upload still in flight when a topic
  is deleted, say;
* while ``refuse`` is set, connections are closed as soon as they are accepted: the object
  store is unreachable.

moto answers every request with ``Connection: close``, so each connection carries one request.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

_HEAD_LIMIT = 64 * 1024


class S3Proxy:
    def __init__(self, upstream_host: str, upstream_port: int, delay_s: float) -> None:
        self._upstream = (upstream_host, upstream_port)
        self.delay_s = delay_s
        self.hold: re.Pattern[str] | None = None
        self.refuse = False
        self.held: list[str] = []  # request targets held back so far
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="s3-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refuse:
                client.close()
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client, socket.create_connection(self._upstream) as upstream:
            head = self._read_head(client)
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            method, _, rest = request_line.partition(" ")
            target = rest.rpartition(" ")[0]
            hold = self.hold
            if method == "PUT" and hold is not None and hold.search(target):
                self.held.append(target)
                time.sleep(self.delay_s)
            upstream.sendall(head)
            back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
            back.start()
            _pipe(client, upstream)
            back.join()

    @staticmethod
    def _read_head(client: socket.socket) -> bytes:
        head = b""
        while b"\r\n\r\n" not in head and len(head) < _HEAD_LIMIT:
            chunk = client.recv(65536)
            if not chunk:
                break
            head += chunk
        return head


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with suppress(OSError):
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    with suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@contextmanager
def s3_proxy(url: str, delay_s: float = 2.0) -> Iterator[S3Proxy]:
    """An ``S3Proxy`` in front of the S3 server at ``url`` (http://host:port)."""
    host, _, port = url.removeprefix("http://").rstrip("/").partition(":")
    proxy = S3Proxy(host, int(port), delay_s)
    try:
        yield proxy
    finally:
        proxy.close()
