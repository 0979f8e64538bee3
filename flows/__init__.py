"""Prefect flows that orchestrate the DVC pipeline (see flows/pipeline.py and docs/scaling.md).

Thin by design: the flows run DVC stages, i.e. `contextual-bert <stage>` commands; DVC decides what is
stale. The library (`src/contextual_bert`) never imports Prefect, so `dvc repro` never starts a server.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable

from contextual_bert.errors import ContextualBertError

# The one-line error a `contextual-bert <stage>` command prints (cli.main), as found in a failed stage's output.
_STAGE_ERROR = re.compile(r"^contextual-bert [\w-]+: error: .*$", re.MULTILINE)


def one_line_errors(prog: str) -> Callable:
    """Decorate a flow module's `main(argv)`: a user error (bad params or data: a ContextualBertError, or a stage
    that failed with its one-line error) prints as one line and exits 2, as `contextual-bert` does; any other
    failure keeps its traceback."""

    def decorate(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except Exception as exc:  # noqa: BLE001 - re-raised unless it is a user error
                found = _STAGE_ERROR.findall(str(exc))
                if not (isinstance(exc, ContextualBertError) or found):
                    raise
                print(f"{prog}: error: {found[-1] if found else exc}", file=sys.stderr)
                return 2

        return run

    return decorate
