"""The ``kafscale`` command's entry point.

Importing the CLI takes a second or two (the wire-format library is large); a Ctrl-C in that
time must end the command like a Ctrl-C at any other moment, with status 130 and no traceback.
A reader that stops reading (``kafscale status | head``) ends the command quietly too, as it
ends any Unix tool: status 141 (128 + SIGPIPE), no traceback.
"""

from __future__ import annotations

import os
import sys

EXIT_BROKEN_PIPE = 141


def main() -> int:
    try:
        from kafscale.broker.import_gc import collection_paused

        with collection_paused():  # the import's garbage is ~1k of its ~60k objects
            from kafscale.broker.cli import main as cli_main

        code = cli_main()
        sys.stdout.flush()  # here, not at exit: a closed pipe then raises where it is caught
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Python would flush stdout again at exit and print that error: point it at nothing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
