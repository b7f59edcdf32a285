"""The ``ollie`` command line: argument parsing and dispatch to the subcommands.

Only the CLI reads flags (and ``OLLIE_DEBUG``); the library takes explicit configuration and
reads its environment variables once, into :mod:`ollie.settings`.
Errors derived from `ollie.errors.OllieError` become a one-line message and exit status 2; any
other error (a bug) a one-line message and exit status 1 (``OLLIE_DEBUG=1`` shows its
traceback); an interrupt exit status 130.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from ollie.errors import OllieError

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
DEBUG_ENV = "OLLIE_DEBUG"
"""Set (to anything) to see the traceback of an internal error instead of one line."""

_SUBCOMMANDS: dict[str, str] = {
    "demo": "run a small end-to-end demonstration",
    "derive": "derive optimized candidates for one expression file",
    "optimize": "optimize a model (path/to/model.onnx or zoo:NAME)",
    "partition": "show the linear-region partition of a model (zoo:NAME or an .onnx path)",
    "run": "run a saved optimized program on random inputs and report its time",
    "bench": "run benchmarks",
    "zoo": "list the built-in evaluation models",
}


def _cmd_demo(args: argparse.Namespace) -> int:
    """Run `ollie.demo.main()` (imported lazily: it pulls in the whole pipeline)."""
    from ollie import demo

    result = demo.main()
    return result if isinstance(result, int) else EXIT_OK


def _not_implemented(args: argparse.Namespace) -> int:
    print(f"ollie {args.command}: not implemented yet", file=sys.stderr)
    return EXIT_BAD_INPUT


_HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {"demo": _cmd_demo}
_MODULES = {"derive": "ollie.commands.derive", "bench": "ollie.commands.bench",
            "optimize": "ollie.commands.optimize", "partition": "ollie.commands.partition"}
_EXTRA = {"run": ("ollie.commands.optimize", "add_run_arguments", "run_program"),
          "zoo": ("ollie.commands.optimize", None, "run_zoo")}


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``ollie`` command."""
    parser = argparse.ArgumentParser(
        prog="ollie", description="Ollie: a derivation-based tensor program optimizer."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in _SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name in _MODULES:
            module = importlib.import_module(_MODULES[name])
            module.add_arguments(p)
            _HANDLERS[name] = module.run
        elif name in _EXTRA:
            mod_name, add, handler = _EXTRA[name]
            module = importlib.import_module(mod_name)
            if add:
                getattr(module, add)(p)
            _HANDLERS[name] = getattr(module, handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ollie`` command; returns the process exit status."""
    parser = build_parser()
    # Unimplemented subcommands accept (and ignore) the arguments they will take later.
    args, extra = parser.parse_known_args(list(argv) if argv is not None else None)
    handler = _HANDLERS.get(args.command)
    if handler is None:
        return _not_implemented(args)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return handler(args)
    except OllieError as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"ollie: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("ollie: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug in Ollie: one line, the traceback on request
        if os.environ.get(DEBUG_ENV):
            raise
        text = " ".join(str(exc).split())[:300]
        print(f"ollie: internal error: {type(exc).__name__}{': ' + text if text else ''} "
              f"(set {DEBUG_ENV}=1 for the traceback; please report it)", file=sys.stderr)
        return EXIT_INTERNAL
