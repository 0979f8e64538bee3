"""Own checkouts for parallel trainings, sharing one DVC cache, and bringing their results back.

Why: DVC allows one `dvc` command per workspace at a time (`.dvc/tmp/lock`), so two trainings cannot
`dvc repro` side by side in the parent's workspace. Each training flow run therefore works in its own
`git worktree` of the parent's repository:

1. `create_checkout`: `git worktree add --detach` at HEAD, then the parent's uncommitted changes copied
   over (modified and untracked files, dvc.lock and params.yaml among them, deleted files deleted), so
   the checkout sees exactly what the parent sees; its `.dvc/config.local` points `cache.dir` at the
   parent's cache, so upstream outputs (data/features) are linked in, not recomputed, and new outputs
   land in the shared cache.
2. `checkout_inputs` cuts the checkout's dvc.lock down to the unit's and the upstream stages' entries
   (DVC reads and rewrites the whole file several times per command) and links the upstream outputs in;
   the training flow runs `dvc repro --single-item train@<v>-<s> evaluate@<v>-<s>` there.
3. `bring_back`, in the parent and in series: copies the stage outputs into the parent workspace and
   writes the records DVC wrote in the checkout (what the outputs were made from) into the parent's
   dvc.lock; no `dvc commit`, whose rewrites of the whole lock cost ~6 s of CPU a unit beside two
   trainings. `refuse_stale`, once after every unit is back: DVC in the parent finds them up to date, or
   a unit trained on other inputs than the parent has now. A later `dvc repro` in the parent finds the
   stages up to date and does not train again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from flows.infra.dvc_stages import cache_dir, git, keep_lock_entries, record_stages, run_dvc, stage_records, stale


def _paths(out: str) -> list[str]:
    return [p for p in out.split("\0") if p]


def remove_checkout(workdir: Path, checkout: Path) -> None:
    """Remove a checkout made by `create_checkout` (no error if it is gone already)."""
    workdir, checkout = Path(workdir), Path(checkout)
    if checkout.exists():
        git(["worktree", "remove", "--force", str(checkout)], workdir, check=False)
        shutil.rmtree(checkout, ignore_errors=True)
    git(["worktree", "prune"], workdir, check=False)


def create_checkout(workdir: Path, checkout: Path) -> Path:
    """A git worktree of `workdir` at `checkout` with the parent's working-tree changes and cache."""
    workdir, checkout = Path(workdir).resolve(), Path(checkout).resolve()
    remove_checkout(workdir, checkout)  # a leftover of a failed run
    checkout.parent.mkdir(parents=True, exist_ok=True)
    git(["worktree", "add", "--detach", "--force", str(checkout), "HEAD"], workdir)

    changed = _paths(git(["ls-files", "-z", "--modified", "--others", "--exclude-standard"], workdir))
    deleted = set(_paths(git(["ls-files", "-z", "--deleted"], workdir)))
    for rel in changed:
        src, dst = workdir / rel, checkout / rel
        if rel in deleted or not src.is_file():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    for rel in deleted:
        (checkout / rel).unlink(missing_ok=True)

    # `dvc config --local cache.dir ...` and `cache.type ...`, written at once (each dvc call costs ~1 s).
    # Links instead of copies: upstream outputs cost no disk or time; DVC keeps cached files read-only.
    (checkout / ".dvc" / "config.local").write_text(
        f'[cache]\n    dir = {cache_dir(workdir)}\n    type = "reflink,hardlink,copy"\n'
    )
    return checkout


def checkout_inputs(checkout: Path, stages: list[str] | tuple[str, ...]) -> str:
    """Link the outputs of the stages' upstream stages (and their own last outputs) from the cache.

    The checkout's dvc.lock is first cut down to what the unit reads (`dvc_stages.keep_lock_entries`).
    Outputs never produced yet are skipped (`--allow-missing`); `dvc repro` then produces them.
    """
    keep_lock_entries(checkout, stages)
    return run_dvc(["checkout", "--with-deps", "--allow-missing", *stages], checkout)


def bring_back(checkout: Path, workdir: Path, stages: list[str] | tuple[str, ...]) -> list[str]:
    """Copy the stages' outputs from `checkout` into `workdir` and record them in its dvc.lock.

    Must run in series with every other write to `workdir`'s dvc.lock. The records are the checkout's, so
    they say what the outputs were made from: if the parent's inputs changed meanwhile, DVC here finds the
    stages stale (`refuse_stale`), never up to date. Raises if a stage has no record in the checkout (it
    did not run). The cached outputs are in the shared cache already (the checkout's `dvc repro` put them
    there).
    """
    checkout, workdir = Path(checkout), Path(workdir)
    entries = stage_records(checkout, stages)
    for entry in entries.values():
        for out in entry.get("outs", []):
            src, dst = checkout / out["path"], workdir / out["path"]
            if dst.is_dir() and not dst.is_symlink():
                shutil.rmtree(dst)
            elif dst.exists() or dst.is_symlink():
                dst.unlink()
            dst.parent.mkdir(parents=True, exist_ok=True)
            # Content only: files linked from the cache are read-only, the parent's copies need not be.
            if src.is_dir():
                shutil.copytree(src, dst, copy_function=shutil.copyfile)
            else:
                shutil.copyfile(src, dst)
    record_stages(workdir, entries)
    return list(stages)


def refuse_stale(workdir: Path, stages: list[str] | tuple[str, ...]) -> None:
    """Raise when DVC in `workdir` finds a brought-back stage stale: its checkout trained on other inputs
    (code, params, upstream data) than the workspace has now. One `dvc status` for all of them."""
    changed = stale(list(stages), Path(workdir))
    if changed:
        raise RuntimeError(
            f"{sorted(changed)}: the outputs brought back into {workdir} were made from other inputs than it "
            "has now (they changed during the run); the checkouts trained on other inputs, and `dvc repro` "
            "trains them again"
        )
