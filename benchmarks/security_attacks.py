"""The attacks of issue 90 on a stack started with `python -m flows.infra.stack up` in a temporary directory:
each attack and its outcome in reports/benchmarks/security_attacks.json (with the commit and the CPU).

    python benchmarks/security_attacks.py [--workers 1] [--out reports/benchmarks/security_attacks.json]

In order: `up` refused on a symbolic link, a shared and another user's directory; `up`; no credentials and
wrong credentials on Prefect (API and events websocket), MLflow (every user) and PostgreSQL (every role);
a job-variable override on the promoter's queue (flows/infra/attacks.py); path traversal on MLflow's and
Prefect's paths; the registry's attacks (benchmarks/security_attacks_registry.py) where the stack holds a
registered version; `down` and `up` again;
`rotate`, then the old secrets on every server. Exits 1 when an attack was not refused.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flows.infra import attacks  # noqa: E402

MODEL = "outfit-completion"


def registry_attacks(root: Path) -> list[attacks.Outcome]:
    """benchmarks/security_attacks_registry.py's REGISTRY_ATTACKS on the stack in `root` (none when the file does not
    exist). They attack a registered version, which a new stack does not hold until a pipeline has run on it: then
    they are reported as not run. Its gate attacks need a running gate, which this script does not start
    (tests/serving/test_serving_gate.py and tests/registry/test_registry_security.py run every one of them)."""
    path = Path(__file__).with_name("security_attacks_registry.py")
    if not path.exists():
        return []
    spec = importlib.util.spec_from_file_location("security_attacks_registry", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stack = module.stack_from_dir(root)
    try:
        results = [attack(stack) for attack in module.REGISTRY_ATTACKS]
    except LookupError as exc:  # no registered version to attack
        return [attacks.Outcome("registry attacks", "a trainer against a registered version", f"not run: {exc}", False)]
    return [attacks.Outcome(r["name"], r["expected"], r["observed"], r["refused"]) for r in results]


def cpu() -> str:
    out = subprocess.run(["lscpu"], text=True, stdout=subprocess.PIPE, check=False).stdout
    model = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "")
    return f"{model or platform.processor()}, {os.cpu_count()} logical CPUs"


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, text=True, stdout=subprocess.PIPE).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, text=True, stdout=subprocess.PIPE).stdout
    return head + (" (with uncommitted changes)" if dirty.strip() else "")


def timed(step: str, seconds: dict, *args: str) -> None:
    started = time.monotonic()
    proc = attacks.stack_cli(*args)
    seconds[step] = round(time.monotonic() - started, 1)
    if proc.returncode != 0:
        raise SystemExit(f"stack {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "reports/benchmarks/security_attacks.json")
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="cb-security-"))
    scratch.chmod(0o711)  # as root the cluster runs as `postgres`, which must pass through it
    root = scratch / "stack"
    target = attacks.Target(root)
    outcomes: list[attacks.Outcome] = []
    seconds: dict[str, float] = {}
    dirs = Path(tempfile.mkdtemp(prefix="cb-dirs-"))
    try:
        outcomes += attacks.foreign_directories(dirs)
        timed("up", seconds, "up", "--dir", str(root), "--workers", str(args.workers))
        creds = target.creds
        outcomes += attacks.credential_attacks(target, {}, "no credentials")
        outcomes += attacks.credential_attacks(target, attacks.wrong(creds), "wrong credentials")
        outcomes += attacks.job_variable_override(target, MODEL)
        outcomes += attacks.traversal(target)
        outcomes += registry_attacks(root)
        timed("down", seconds, "down", "--dir", str(root))
        timed("up again", seconds, "up", "--dir", str(root), "--workers", str(args.workers))
        code, _ = attacks.http("POST", f"{target.api}/flows/filter", json={}, auth=attacks.prefect_auth(target.creds))
        outcomes.append(
            attacks.Outcome(
                "restart", "up after down: Prefect with the file's auth string", f"HTTP {code}", code == 200
            )
        )
        timed("rotate", seconds, "rotate", "--dir", str(root))
        outcomes += attacks.credential_attacks(target, creds, "old secrets after rotate")
        new = target.creds
        code, _ = attacks.http("POST", f"{target.api}/flows/filter", json={}, auth=attacks.prefect_auth(new))
        outcomes.append(attacks.Outcome("rotate", "the new auth string accepted", f"HTTP {code}", code == 200))
    finally:
        attacks.stack_cli("down", "--dir", str(root))
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(dirs, ignore_errors=True)

    missed = [o for o in outcomes if not o.refused]
    report = {
        "what": "issue 90's attacks on a stack started by `python -m flows.infra.stack up` (benchmarks/security_attacks.py)",
        "commit": commit(),
        "cpu": cpu(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": seconds,
        "attacks": len(outcomes),
        "refused": len(outcomes) - len(missed),
        "not_refused": [f"{o.attack}: {o.tried}: {o.observed}" for o in missed],
        "outcomes": [o.as_dict() for o in outcomes],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['refused']}/{report['attacks']} refused; {args.out}")
    for line in report["not_refused"]:
        print(f"NOT REFUSED: {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
