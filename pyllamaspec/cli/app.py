"""Parse the command line, run the subcommand, and report any failure in one format for every command:
``pyllamaspec: error: <what went wrong and what to do>`` on stderr, exit status 2 (130 when interrupted by
Ctrl-C, 143 by SIGTERM: both end the command through the same cleanup)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import NoReturn

from ..errors import PyllamaspecError
from .output import PROG, error_line
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
DEBUG_ENV = "PYLLAMASPEC_DEBUG"  # set: unexpected exceptions keep their traceback


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that cleanup (temp files, child processes) runs as for Ctrl-C."""


def _on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process outright
    raise Terminated()


class Parser(argparse.ArgumentParser):
    """argparse with the package's error format (subcommand parsers are made of the same class)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        command = self.prog.removeprefix(PROG).strip()
        self.exit(EXIT_ERROR, error_line(f"{command}: {message}" if command else message) + "\n")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from . import bench, convert, download, generate, info, inspect, quantize, rpc_server, serve, synth

    ap = Parser(prog=PROG, description="Fast, exact speculative decoding of GGUF models")
    ap.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    ap.add_argument("-v", "--verbose", action="count", default=0,
                    help="llama.cpp logs on stderr: -v warnings, -vv info, -vvv debug (default: errors only)")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (generate, info, inspect, convert, quantize, download, synth, bench, serve, rpc_server):
        command.register(sub)
    return ap


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command; every failure becomes one error report and exit status 2."""
    try:
        previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: signals stay the host program's
        previous_sigterm = None
    try:
        if getattr(args, "verbose", 0):
            from ..native_tools import set_log_level

            set_log_level(args.verbose)
        return args.func(args)
    except PyllamaspecError as e:
        print(error_line(e), file=sys.stderr)
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        print(f"\n{PROG}: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except OSError as e:
        print(error_line(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")), file=sys.stderr)
    except Exception as e:  # an unforeseen failure still ends as one report, unless debugging
        if os.environ.get(DEBUG_ENV):
            raise
        print(error_line(f"internal error: {type(e).__name__}: {e} (set {DEBUG_ENV}=1 for a traceback)"),
              file=sys.stderr)
    finally:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
    return EXIT_ERROR


def main(argv=None) -> int:
    return run_command(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
