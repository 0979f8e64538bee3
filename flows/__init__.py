"""Prefect flows that orchestrate the DVC pipeline (see flows/pipeline.py and docs/scaling.md).

Thin by design: the flows run DVC stages, i.e. `contextual-bert <stage>` commands; DVC decides what is
stale. The library (`src/contextual_bert`) never imports Prefect, so `dvc repro` never starts a server.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from pathlib import Path

from contextual_bert.errors import ContextualBertError

# The one-line error a `contextual-bert <stage>` command prints (cli.main), as found in a failed stage's output.
_STAGE_ERROR = re.compile(r"^contextual-bert [\w-]+: error: .*$", re.MULTILINE)
# What DVC prints of the stage that failed; and an exception's line in a traceback (`RuntimeError: ...`).
_FAILED_STAGE = re.compile(r"failed to reproduce '([^']+)'")
_EXCEPTION_LINE = re.compile(r"^\s*(?:[\w.]+(?:Error|Exception|Exit|Interrupt)|contextual-bert [\w-]+: error): .*$")
MAX_ERROR_CHARS = 200


def stage_failure(exc: BaseException) -> tuple[str, str] | None:
    """(the stage, its last error line) when `exc`, or an exception it wraps, is a DVC stage that failed (a
    `dvc repro` of the pipeline, or of a training unit); None for any other failure."""
    texts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(texts) < 10:
        texts.append(getattr(seen, "output", None) or str(seen))  # a StageFailed's whole output, not its tail
        seen = seen.__cause__ or seen.__context__
    lines = "\n".join(texts).splitlines()
    stages = [m.group(1) for line in lines if (m := _FAILED_STAGE.search(line))]
    if not stages:
        return None
    errors = [line.strip() for line in lines if _EXCEPTION_LINE.match(line)]
    line = errors[-1] if errors else next(line.strip() for line in reversed(lines) if _FAILED_STAGE.search(line))
    return stages[-1], line if len(line) <= MAX_ERROR_CHARS else line[: MAX_ERROR_CHARS - 3] + "..."


def failure_block(prog: str, exc: BaseException, log: Path | None = None, table1: Path | None = None) -> str | None:
    """The few lines a failed stage gets on the console (the traceback stays in the log); None when `exc` is
    no stage failure. `table1`: Table 1, when the run wrote it before the failure."""
    found = stage_failure(exc)
    if found is None:
        return None
    stage, line = found
    block = [f"{prog}: stage '{stage}' failed; the stages before it are done (dvc.lock)", f"  error: {line}"]
    if log is not None:
        block.append(f"  the whole output, traceback included: {log}")
    if table1 is not None:
        block.append(f"  Table 1, written before the failure: {table1}")
    block.append("  once fixed, the same command runs the failed stage and those after it")
    return "\n".join(block)


def one_line_errors(prog: str) -> Callable:
    """Decorate a flow module's `main(argv)`: a user error (bad params or data: a ContextualBertError, or a stage
    that failed with its one-line error) prints as one line and exits 2, as `contextual-bert` does; a stage that
    failed otherwise prints its failure_block and exits 1; any other failure keeps its traceback."""

    def decorate(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except Exception as exc:  # noqa: BLE001 - re-raised unless it is a user error
                found = _STAGE_ERROR.findall(str(exc))
                if isinstance(exc, ContextualBertError) or found:
                    print(f"{prog}: error: {found[-1] if found else exc}", file=sys.stderr)
                    return 2
                block = failure_block(prog, exc)
                if block is None:
                    raise
                print(block, file=sys.stderr)
                return 1

        return run

    return decorate
