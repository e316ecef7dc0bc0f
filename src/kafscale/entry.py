"""The ``kafscale`` command's entry point.

Importing the CLI takes a second or two (the wire-format library is large); a Ctrl-C in that
time must end the command like a Ctrl-C at any other moment, with status 130 and no traceback.
"""

from __future__ import annotations


def main() -> int:
    try:
        from kafscale.broker.import_gc import collection_paused

        with collection_paused():  # the import's garbage is ~1k of its ~60k objects
            from kafscale.broker.cli import main as cli_main

        return cli_main()
    except KeyboardInterrupt:
        return 130
