"""What carrying a client's principal costs the proxy: Envelope wrap and unwrap per request.

The proxy sends each forwarded request inside a KIP-590 Envelope and unwraps each answer
(``UpstreamLink.wrap``/``unwrap``). This times both, in process, for produce-sized frames
(the request's bytes are copied once more) against the bare path, so the figure is the CPU the
Envelope adds per MiB forwarded, independent of brokers and network. Prints figures; asserts
nothing.

    .venv/bin/python bench/envelope_cost.py
"""

from __future__ import annotations

import argparse
import time

from kafscale.broker.protocol import codec
from kafscale.broker.proxy.upstream import UpstreamLink
from kafscale.broker.security.forwarding import address_bytes

MiB = 1024 * 1024


def frame_of(size: int) -> bytes:
    """A produce-like request frame carrying ``size`` bytes of records."""
    body = {
        "acks": -1,
        "timeout": 30_000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": b"x" * size}]}],
    }
    return codec.encode_request(0, 9, 7, body, "bench")


def per_call_s(action: object, repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        action()  # type: ignore[operator]
    return (time.perf_counter() - started) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    link = UpstreamLink(None, codec.encode_principal("User:alice"), address_bytes("10.0.0.1"))
    print(f"{'request':>10} {'wrap µs':>9} {'unwrap µs':>10} {'ms per MiB (both)':>18}")
    for size in (1024, 16 * 1024, 256 * 1024, MiB):
        frame = frame_of(size)
        wrapped = link.wrap(frame)
        answer = codec.encode_response(58, 0, 7, {"response_data": frame[4:], "error_code": 0})[4:]
        wrap_s = per_call_s(lambda f=frame: link.wrap(f), args.repeat)
        unwrap_s = per_call_s(lambda a=answer: link.unwrap(a), args.repeat)
        assert len(wrapped) > len(frame)
        per_mib_ms = (wrap_s + unwrap_s) * 1000 * MiB / len(frame)
        print(f"{size:>10} {wrap_s * 1e6:>9.1f} {unwrap_s * 1e6:>10.1f} {per_mib_ms:>18.3f}")


if __name__ == "__main__":
    main()
