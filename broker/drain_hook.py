"""The preStop hook of a broker pod: ``python -m kafscale.broker.drain_hook``.

It asks the broker's admin endpoint to hand its partitions over (``POST /drain``) and waits for
the answer. It runs in the pod while the broker still serves, so it must cost little: the
``kafscale`` command imports the whole broker (~2 s of CPU and ~80 MB on the test machine)
before it reads its arguments, while this module imports the standard library and the admin
client only. Its timeout is set by the operator to fit inside the pod's termination grace
period, leaving the broker time to shut down after the hook returns.

When the broker requires an admin token (``admin.token_file``), the hook sends it: it reads
the file named by ``--token-file``, by default the broker's own ``KAFSCALE_ADMIN__TOKEN_FILE``
(the hook runs in the broker's container, with its environment), so the operator's preStop
command needs no change when a token is configured.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys

from kafscale.broker.admin_http import admin_request, read_token

TOKEN_FILE_ENV = "KAFSCALE_ADMIN__TOKEN_FILE"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The hook's flags, also those of ``kafscale drain``."""
    parser.add_argument(
        "--admin-url",
        default="http://127.0.0.1:8080",
        help="the broker's admin port (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=60.0,
        help="longest wait for the handoff (default: %(default)s)",
    )
    parser.add_argument(
        "--token-file",
        default=os.environ.get(TOKEN_FILE_ENV),
        help=f"file with the admin bearer token (default: ${TOKEN_FILE_ENV})",
    )


def drain(args: argparse.Namespace) -> int:
    """POST /drain and print the broker's answer as JSON (as ``kafscale status --json``
    prints): 0 if the broker handed its partitions over. A refusal, an unreachable broker or
    an answer that is not the admin port's is one line on stderr and 1. The answer used to be
    printed as a Python dict (``{'drained': True}``), which no JSON tool reads, and an answer
    that was not JSON ended in a traceback."""
    try:
        token = read_token(args.token_file)
        status, body = admin_request(args.admin_url, "POST", "/drain", args.timeout_s, token)
    except (OSError, http.client.HTTPException) as exc:
        print(f"kafscale drain: {str(exc) or type(exc).__name__}", file=sys.stderr)
        return 1
    except ValueError as exc:  # not a URL, or an answer that is not JSON
        print(
            f"kafscale drain: {args.admin_url} is not a broker's admin port: {exc}", file=sys.stderr
        )
        return 1
    if status != 200:
        print(f"kafscale drain: refused (HTTP {status}): {refusal(body)}", file=sys.stderr)
        return 1
    print(json.dumps(body))
    return 0


def refusal(body: object) -> str:
    """What an admin port's error answer says (``{"error": ...}``)."""
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])
    return json.dumps(body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kafscale-drain", description=__doc__)
    add_arguments(parser)
    return drain(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
