"""One model distilled from several (issue 71, round H): a student [None] + attributes trained on its teachers' mean
prediction, so that what an ensemble of seeds knows is served by one model of the same size.

The student has its teachers' recipe (their project's params.yaml, settings' `distill.set` on top: the full softmax)
and the library's training loop (training.fit: validation, early stopping, checkpoints as any run's); only the
loss differs, (1 - alpha) x the masked targets' cross-entropy + alpha x the cross-entropy against the teachers'
mean P(a | the same masked input), the teachers in evaluation mode (no dropout, every article with its id). The loss
is swapped in here (training.step_loss), for this study: src has no distillation (not built; docs/decisions.md).

Reported (this folder's results.json, `<student>/none_attrs/distilled`): the student's training, its test
cross-entropy as trained and mixed with the count (count_mixture.py's weight, fitted on validation), each beside its
share of the gap between the count (the attribute-aware popularity) and the optimum without context; the teachers
one by one and their ensemble the same way; the student against the count, the first teacher and the ensemble
(paired bootstrap over the test outfits).

    python studies/article_vectors/distill.py --work /tmp/avH --student distilled_a10 \\
        --teachers-in /tmp/avF0,/tmp/avF [--alpha 1.0]
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from contextual_bert import cpu_kernels

cpu_kernels.pin("avx2")  # the teachers' kernels (params.yaml's train.cpu_kernels); before torch is imported
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `studies.`: a folder of scripts, not a package
from contextual_bert.config import load_config  # noqa: E402
from contextual_bert.data import N_SPECIAL  # noqa: E402
from contextual_bert.evaluation import outfit_record, paired_difference  # noqa: E402
from contextual_bert.model import load_checkpoint  # noqa: E402
from contextual_bert.training import step_loss, train  # noqa: E402
from studies.article_vectors.count_mixture import cases_of  # noqa: E402
from studies.article_vectors.seed_ensemble import gap_ends, gap_record, mean_of, scores  # noqa: E402
from studies.article_vectors.unseen_mass import load_trained  # noqa: E402
from studies.project import override, record  # noqa: E402

HERE = Path(__file__).resolve().parent
MODEL = "none_attrs"


def teachers_log_probs(teachers: list, inputs, context, predict) -> torch.Tensor:
    """(M, real articles): log of the teachers' mean P(a | inputs) at the `predict` positions."""
    with torch.no_grad():
        each = [
            torch.log_softmax(
                t.article_logits(
                    t.head_states(inputs, context, predict), t.outfit_offsets(inputs, predict, context=context)
                ).float(),
                dim=1,
            )
            for t in teachers
        ]
    return torch.logsumexp(torch.stack(each), dim=0) - math.log(len(each))


def distillation_loss(teachers: list, alpha: float):
    """training.masked_item_loss's signature, the full softmax: (1 - alpha) x the targets' cross-entropy +
    alpha x the cross-entropy against the teachers' mean prediction."""

    def loss(model, inputs, context, predict, items, sampler=None):
        if sampler is not None:
            raise SystemExit("distillation needs the full softmax (settings' distill.set: train.softmax=full)")
        head_states = model.head_states(inputs, context, predict)
        targets = items[predict]
        if len(targets) == 0:
            return head_states.sum() * 0.0
        offsets = model.outfit_offsets(inputs, predict, context=context)
        log_p = torch.log_softmax(model.article_logits(head_states, offsets).float(), dim=1)
        hard = F.nll_loss(log_p, targets - N_SPECIAL)
        soft = -(teachers_log_probs(teachers, inputs, context, predict).exp() * log_p).sum(dim=1).mean()
        return (1.0 - alpha) * hard + alpha * soft

    return loss


def find(cell: str, folders: list[Path]) -> Path:
    for folder in folders:
        if (folder / cell / "params.yaml").exists():
            return folder / cell
    raise SystemExit(f"teacher cell {cell!r} is in none of {', '.join(map(str, folders))}")


def student_params(project: Path, assignments: list[str], out: Path) -> Path:
    params = yaml.safe_load((project / "params.yaml").read_text())
    for assignment in assignments:
        override(params, assignment)
    out.mkdir(parents=True, exist_ok=True)
    (out / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return out / "params.yaml"


def train_student(params_path: Path, features: Path, teachers: list, alpha: float, seed: int, out: Path) -> dict:
    """training.train for MODEL, with the distillation loss."""
    cfg = load_config(params_path)
    with step_loss(distillation_loss(teachers, alpha)):  # train_step's loss, while the student trains
        return train(features, out, MODEL, seed, cfg.model_for(MODEL), cfg.train_for(MODEL))


def measure(student_dir: Path, project: Path, trained: list) -> dict:
    """The student, the teachers and their ensemble on test, as trained and mixed with the count."""
    first = trained[0]
    student, _ = load_checkpoint(student_dir / "checkpoint.pt")
    student.set_catalogue(first.catalogue.tensors())
    student.eval()
    ends = gap_ends(project)
    count = {split: cases_of(first.count, getattr(first, split)) for split in ("val", "test")}
    count_log_prob = {split: cases["log_prob"] for split, cases in count.items()}

    def log_probs(model) -> dict:
        cases = {split: cases_of(model, getattr(first, split)) for split in ("val", "test")}
        assert np.array_equal(cases["test"]["target"], count["test"]["target"])  # the same cases, the same order
        return {split: c["log_prob"] for split, c in cases.items()}

    mine, teachers = log_probs(student), [log_probs(t.model) for t in trained]
    ensemble = {split: mean_of([t[split] for t in teachers]) for split in ("val", "test")}
    outfit, ids = count["test"]["outfit"], list(range(len(first.test.items)))

    def record_of(log_prob: np.ndarray) -> dict:
        return outfit_record(outfit, {"cross_entropy": -log_prob}, ids)

    paired = {
        f"student - {name}": {
            k: v
            for k, v in paired_difference(record_of(mine["test"]), record_of(other), "cross_entropy").items()
            if k in ("difference", "interval")
        }
        for name, other in (
            ("count", count["test"]["log_prob"]),
            ("the first teacher", teachers[0]["test"]),
            ("the teachers' ensemble", ensemble["test"]),
        )
    }
    return {
        "student": scores(mine["val"], mine["test"], count_log_prob, ends),
        "teachers": [scores(t["val"], t["test"], count_log_prob, ends) for t in teachers],
        "teachers' ensemble": scores(ensemble["val"], ensemble["test"], count_log_prob, ends),
        "paired": paired,
        "gap": gap_record(ends),
        "cases": {"test": int(len(outfit))},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="the student's folder goes here")
    parser.add_argument("--student", required=True, help="one of settings' distill.students")
    parser.add_argument("--teachers-in", required=True, help="comma-separated folders holding the teachers' cells")
    parser.add_argument("--alpha", type=float, help="the soft targets' weight where settings say `chosen`")
    parser.add_argument("--out", type=Path, default=HERE / "results.json", help="the results file")
    args = parser.parse_args()

    settings = yaml.safe_load((HERE / "settings.yaml").read_text())["distill"]
    declared = settings["students"][args.student]
    alpha = declared["alpha"] if declared["alpha"] != "chosen" else args.alpha
    if alpha is None or not 0.0 <= float(alpha) <= 1.0:
        raise SystemExit(f"{args.student}: alpha is the round's choice: pass --alpha in [0, 1]")
    folders = [Path(f) for f in args.teachers_in.split(",")]
    projects = [find(cell, folders) for cell in declared["teachers"]]
    seed = declared.get("seed", 0)  # the student's; the teachers' are their cells'
    trained = [load_trained(p, MODEL, yaml.safe_load((p / "params.yaml").read_text())["train"]["seeds"][0])
               for p in projects]  # fmt: skip
    for t in trained[1:]:  # one data set: the same catalogue and splits
        assert all(
            torch.equal(a.nan_to_num(-1.0), b.nan_to_num(-1.0))  # a vector's NaN rows: the articles without one
            for a, b in zip(t.catalogue.tensors().values(), trained[0].catalogue.tensors().values())
        )
        assert torch.equal(t.test.items, trained[0].test.items)
    out = args.work / args.student
    assignments = settings["set"] + declared.get("set", [])  # a student's own settings after the round's
    params_path = student_params(projects[0], assignments, out)
    features = Path(yaml.safe_load(params_path.read_text())["paths"]["features_dir"])
    metrics = train_student(params_path, features, [t.model for t in trained], float(alpha), seed, out)
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    record(args.out, f"{args.student}/{MODEL}/distilled", {
        "alpha": float(alpha), "teachers": [str(p) for p in projects], "seed": seed, "commit": commit,
        "set": assignments,
        "training": {k: metrics[k] for k in ("epochs", "best_epoch", "best_val_cross_entropy", "converged", "seconds",
                                             "id_dropout")},
        **measure(out, projects[0], trained),
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
