"""Promotion: which registered version serves, as alias 'champion'; and rolling that back.

The candidate is the best version by validation `promote.metric` (recall@K) among those trained on the
current features and never rolled back. It takes alias 'champion' when there is none, or when it beats the
champion on the same validation cases: its recall@K exceeds the champion's by more than `promote.margin`
and an exact one-sided McNemar test on the per-case hits (from `ranking.case_ranks`) gives p < `alpha`.
The test and the decision are recorded as tags of the candidate version. The old champion takes alias
'previous'; `rollback` gives 'champion' back to it and marks the demoted version so promote skips it.
Aliases, not the deprecated stages.

What it decides from is what it computes, on the promoter's record: a version is loaded only from a copy
whose files match the digest `register` recorded (registry/integrity.py), and the candidate's validation
recall@K computed here must equal its recorded tag (the tags are MANAGE-only under registry/auth_app.py; this
is the second line). A version failing either is skipped, named in the report, and the next best is tried;
a champion or 'previous' failing its digest stops promote and rollback with one line.

Never a model that counts worse than a count: a candidate whose validation cross-entropy is above its
yardstick's on the same cases (evaluation/yardstick.py: popularity, + own history, or the attribute-aware
popularity) is refused, whatever it would do against the champion, and the champion stays.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from contextual_bert.config import Config, recall_k
from contextual_bert.data.feature_spec import HISTORY_COLUMN
from contextual_bert.errors import ContextualBertError
from contextual_bert.registry.integrity import IntegrityError, load_verified_pyfunc, verified_copy
from contextual_bert.registry.manage import require_manage
from contextual_bert.registry.models import write_report
from contextual_bert.registry.tracking import client, directory_sha256, metric_key, model_tag

CHAMPION, PREVIOUS = "champion", "previous"
HISTORY_TAG = "champion_history"  # registered-model tag: JSON list of champion versions, oldest first
ROLLED_BACK_TAG = "rolled_back"
PROMOTION_REPORT = "promotion.json"


# --- the paired test ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairedTest:
    """Exact one-sided McNemar test that the candidate's hit rate beats the champion's on the same cases."""

    n_cases: int
    candidate_recall: float
    champion_recall: float
    candidate_only: int  # cases the candidate hits and the champion misses
    champion_only: int
    p_value: float
    margin: float
    alpha: float

    @property
    def difference(self) -> float:
        return self.candidate_recall - self.champion_recall

    @property
    def beats(self) -> bool:
        return self.difference > self.margin and self.p_value < self.alpha

    def as_dict(self) -> dict:
        return {
            "n_cases": self.n_cases,
            "candidate_recall": self.candidate_recall,
            "champion_recall": self.champion_recall,
            "difference": self.difference,
            "candidate_only_hits": self.candidate_only,
            "champion_only_hits": self.champion_only,
            "test": "exact one-sided McNemar (binomial on discordant cases)",
            "p_value": self.p_value,
            "margin": self.margin,
            "alpha": self.alpha,
            "beats": self.beats,
        }


def paired_test(candidate_hits, champion_hits, margin: float, alpha: float) -> PairedTest:
    """Compare per-case hits (booleans, same cases in the same order) of a candidate and the champion."""
    from scipy.stats import binomtest

    candidate_hits = np.asarray(candidate_hits, dtype=bool)
    champion_hits = np.asarray(champion_hits, dtype=bool)
    if candidate_hits.shape != champion_hits.shape or candidate_hits.ndim != 1 or len(candidate_hits) == 0:
        raise ContextualBertError(
            f"the paired test needs the same non-empty cases for both models, got {candidate_hits.shape} and "
            f"{champion_hits.shape}"
        )
    b = int((candidate_hits & ~champion_hits).sum())
    c = int((~candidate_hits & champion_hits).sum())
    p = binomtest(b, b + c, 0.5, alternative="greater").pvalue if b + c else 1.0
    return PairedTest(
        len(candidate_hits), float(candidate_hits.mean()), float(champion_hits.mean()), b, c, float(p), margin, alpha
    )


# --- per-case hits of a registered version on the validation cases ---------------------------------------


def validation_cases(cfg: Config, core, model_features_sha: str, features_sha: str):
    """The current validation outfits, encoded for `core`'s model.

    A model trained on the current features reads them as stored; one trained on other features (other
    vocabularies) gets the same outfits re-encoded from data/validated through its own vocabularies, so
    both sides of the paired test see the same cases.
    """
    from contextual_bert.data.feature_store import load_split

    max_set_size = core.max_set_size
    if model_features_sha == features_sha:
        return load_split(cfg.paths.features_dir, "val", max_set_size)
    return _reencoded_validation(cfg, core)


def _splits(cfg: Config) -> dict[str, str]:
    """The current features' split of every outfit id."""
    from contextual_bert.data.feature_store import split_outfit_ids

    return {o: split for split in ("train", "val", "test") for o in split_outfit_ids(cfg.paths.features_dir, split)}


def _reencoded_validation(cfg: Config, core):
    import pandas as pd

    from contextual_bert.data.feature_store import split_outfit_ids

    for path in (cfg.paths.validated_dir / "outfits.parquet", cfg.paths.validated_dir / "customers.parquet"):
        if not path.exists():
            raise ContextualBertError(
                f"{path}: not found; the champion was trained on other features, and comparing it on today's "
                "validation outfits needs them as validated (run `contextual-bert validate`)"
            )
    val_ids = split_outfit_ids(cfg.paths.features_dir, "val")
    outfits = pd.read_parquet(cfg.paths.validated_dir / "outfits.parquet")
    customers = pd.read_parquet(cfg.paths.validated_dir / "customers.parquet")
    outfits = outfits.assign(outfit_id=outfits["outfit_id"].astype(str))
    if core.model.reads_history:  # each outfit's history by the one rule, as the champion was trained to read it
        from contextual_bert.data.features import history_article_ids

        outfits[HISTORY_COLUMN] = history_article_ids(
            outfits, _splits(cfg), cfg.features, cfg.paths.validated_dir / "outfits.parquet"
        )
    outfits = outfits.set_index("outfit_id").loc[val_ids]
    rows = outfits.reset_index().merge(customers, on="customer_id", how="left", suffixes=("", "_customer"))
    # the champion's own vocabularies, through the one outfit encoder (whole outfits: no [MASK] slot)
    try:
        return core.encoder.encode(rows, with_mask=False, id_column="outfit_id", as_written=True).outfits
    except ContextualBertError as exc:  # name the file and whose vocabularies: a row number alone is unclear
        raise ContextualBertError(
            f"{cfg.paths.validated_dir / 'outfits.parquet'}, validation outfits encoded for the champion: {exc}"
        ) from None


def keyed_cases(model, data, batch_size: int, device) -> dict[tuple[str, int], tuple[int, float]]:
    """(rank, log-probability of the target) of every validation case (outfit id, position) `model` ranks.

    Cases whose target the model cannot rank (an article it never saw: evaluation skips them) are absent.
    """
    from contextual_bert.evaluation.ranking import case_ranks

    cases = case_ranks(model, data, batch_size, device)
    outfit_ids = data.outfit_ids or [str(i) for i in range(len(data))]
    return {
        (outfit_ids[o], int(p)): (int(r), float(lp))
        for o, p, r, lp in zip(
            cases["outfit"].tolist(), cases["position"].tolist(), cases["rank"].tolist(), cases["log_prob"].tolist()
        )
    }


def version_cases(cfg: Config, mlflow_client, version, features_sha: str, into: Path):
    """A registered version's serving core (its own pyfunc, from its verified copy under `into`), the
    validation outfits encoded for it, and its keyed_cases on them."""
    pyfunc = load_verified_pyfunc(mlflow_client, cfg.mlflow.model_name, version, into / str(version.version))
    core = pyfunc.unwrap_python_model().core
    data = validation_cases(cfg, core, version.tags.get("features_sha256", ""), features_sha)
    return core, data, keyed_cases(core.model, data, cfg.evaluate.batch_size, core.device)


def version_case_hits(cfg: Config, mlflow_client, version, k: int, features_sha: str, into: Path) -> dict:
    """Hit@k of a registered version on every validation case (outfit id, position) it ranks."""
    _, _, cases = version_cases(cfg, mlflow_client, version, features_sha, into)
    return hits_at(cases, k)


def hits_at(cases: dict, k: int) -> dict[tuple[str, int], bool]:
    return {key: rank <= k for key, (rank, _) in cases.items()}


def recorded_metric(version, key: str) -> float | None:
    try:
        return float(version.tags[key])
    except (KeyError, ValueError):
        return None


def matches_record(recorded: float | None, hits: dict) -> bool:
    """A recall computed now equals the one recorded at registration, up to one case (a tie ranked the other
    way on another device): a record off by more was not computed from this model on these cases."""
    if recorded is None or not hits:
        return False
    computed = float(np.mean(list(hits.values())))
    return abs(computed - recorded) <= 1.0 / len(hits) + 1e-9


def checked_best(cfg: Config, mlflow_client, pool: list, k: int, features_sha: str, into: Path):
    """The best candidate by recorded validation metric whose files match their digest and whose metric,
    computed now, matches the record: (version, core, data, cases), and the versions skipped, with why."""
    key = metric_key(cfg.promote.metric, "val")
    skipped = []
    for version in sorted(pool, key=lambda v: (-(recorded_metric(v, key) or 0.0), int(v.version))):
        try:
            core, data, cases = version_cases(cfg, mlflow_client, version, features_sha, into)
        except IntegrityError as exc:
            skipped.append({"version": int(version.version), "why": str(exc)})
            continue
        if not matches_record(recorded_metric(version, key), hits_at(cases, k)):
            computed = float(np.mean(list(hits_at(cases, k).values()))) if cases else float("nan")
            skipped.append(
                {
                    "version": int(version.version),
                    "why": f"recorded {key} {version.tags.get(key)!r} is not what it computes now ({computed:.4f})",
                }
            )
            continue
        return (version, core, data, cases), skipped
    details = "; ".join(f"version {s['version']}: {s['why']}" for s in skipped)
    raise ContextualBertError(f"no candidate of '{cfg.mlflow.model_name}' passes its checks: {details}")


def yardstick_guard(cfg: Config, core, data, cases: dict) -> dict:
    """The candidate's validation cross-entropy against its yardstick's on the same cases (the candidate is
    trained on the current features, so the yardstick is built from them): "worse" when the candidate's is
    above, by the point estimate."""
    from contextual_bert.evaluation.evaluate import yardstick_model
    from contextual_bert.evaluation.yardstick import yardstick_of

    # a version registered before issue 92 loads with the package it shipped, whose models name themselves `variant`
    name = yardstick_of(getattr(core.model, "name", None) or core.model.variant, core.model.reads_history)
    yardstick = yardstick_model(name, cfg.paths.features_dir, cfg.evaluate, core.max_set_size, data).to(core.device)
    counted = keyed_cases(yardstick, data, cfg.evaluate.batch_size, core.device)
    common = sorted(set(cases) & set(counted))
    if not common:
        raise ContextualBertError(f"the candidate and its yardstick ({name}) share no validation case")
    candidate = -float(np.mean([cases[key][1] for key in common]))
    count = -float(np.mean([counted[key][1] for key in common]))
    return {
        "yardstick": name,
        "n_cases": len(common),
        "candidate_val_cross_entropy": candidate,
        "yardstick_val_cross_entropy": count,
        "worse": candidate > count,
    }


def aligned_hits(candidate: dict, champion: dict) -> tuple[np.ndarray, np.ndarray]:
    """Both models' hits on the union of their cases; a case one model cannot rank is its miss."""
    keys = sorted(set(candidate) | set(champion))
    return (
        np.array([candidate.get(key, False) for key in keys], dtype=bool),
        np.array([champion.get(key, False) for key in keys], dtype=bool),
    )


# --- promote and rollback -------------------------------------------------------------------------------


def _alias_version(mlflow_client, name: str, alias: str):
    from mlflow.exceptions import MlflowException

    try:
        return mlflow_client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def _history(mlflow_client, name: str) -> list[str]:
    tags = mlflow_client.get_registered_model(name).tags
    try:
        return [str(v) for v in json.loads(tags.get(HISTORY_TAG, "[]"))]
    except json.JSONDecodeError:
        return []


def _set_history(mlflow_client, name: str, history: list[str]) -> None:
    mlflow_client.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history[-50:]))


def candidates(mlflow_client, cfg: Config, features_sha: str) -> list:
    """Versions trained on the current features, evaluated on validation, never rolled back."""
    key = metric_key(cfg.promote.metric, "val")
    versions = mlflow_client.search_model_versions(f"name = '{cfg.mlflow.model_name}'")
    return [
        v
        for v in versions
        if v.tags.get("features_sha256") == features_sha and key in v.tags and v.tags.get(ROLLED_BACK_TAG) != "true"
    ]


def promote(cfg: Config) -> dict:
    """Point 'champion' at the best version when it beats the current one; writes reports/promotion.json."""
    with tempfile.TemporaryDirectory(prefix="promote-") as tmp:  # the verified copies of the versions loaded
        return _promote(cfg, Path(tmp))


def _promote(cfg: Config, into: Path) -> dict:
    k = recall_k(cfg.promote.metric)
    name = cfg.mlflow.model_name
    mlflow_client = client(cfg.mlflow)
    require_manage(mlflow_client, name, "promote", f"to move alias '{CHAMPION}'")
    features_sha = directory_sha256(cfg.paths.features_dir)
    pool = candidates(mlflow_client, cfg, features_sha)
    if not pool:
        raise ContextualBertError(
            f"no version of '{name}' was trained on the current {cfg.paths.features_dir} and evaluated; "
            "run `contextual-bert register` first"
        )
    key = metric_key(cfg.promote.metric, "val")
    (best, core, data, best_cases), skipped = checked_best(cfg, mlflow_client, pool, k, features_sha, into)
    champion = _alias_version(mlflow_client, name, CHAMPION)
    result: dict[str, object] = {
        "model_name": name,
        "metric": cfg.promote.metric,
        "candidate": _describe(best, key),
        "champion_before": _describe(champion, key) if champion else None,
        "skipped": skipped,
    }

    guard = yardstick_guard(cfg, core, data, best_cases)
    result["yardstick"] = guard
    if guard["worse"]:
        decision, test = (
            f"not promoted: version {best.version} ({model_tag(best.tags)}) counts worse than its yardstick "
            f"{guard['yardstick']} on validation, cross-entropy {guard['candidate_val_cross_entropy']:.4f} against "
            f"{guard['yardstick_val_cross_entropy']:.4f} on {guard['n_cases']} cases",
            None,
        )
    elif champion is None:
        decision, test = "promoted: there was no champion", None
    elif champion.version == best.version:
        decision, test = "kept: the best version is already the champion", None
    else:
        candidate_hits, champion_hits = aligned_hits(
            hits_at(best_cases, k), version_case_hits(cfg, mlflow_client, champion, k, features_sha, into)
        )
        test = paired_test(candidate_hits, champion_hits, cfg.promote.margin, cfg.promote.alpha)
        decision = (
            f"promoted: beats version {champion.version} by {test.difference:+.4f} (p={test.p_value:.3g})"
            if test.beats
            else f"not promoted: {test.difference:+.4f} vs version {champion.version} (margin {test.margin}, "
            f"p={test.p_value:.3g}, alpha {test.alpha})"
        )
    promoted = decision.startswith("promoted")
    if test is not None or promoted or guard["worse"]:
        tags = {"promotion_decision": decision, "yardstick_guard": json.dumps(guard)}
        if test is not None:
            tags.update(
                promotion_test=json.dumps(test.as_dict()),
                promotion_p_value=repr(test.p_value),
                promotion_against_version=str(champion.version),
            )
        for tag, value in tags.items():
            mlflow_client.set_model_version_tag(name, best.version, tag, value)
    if promoted:
        move_champion(mlflow_client, name, best.version, champion)
    result.update(
        decision=decision,
        promoted=promoted,
        test=test.as_dict() if test else None,
        champion=int(best.version) if promoted else (int(champion.version) if champion else None),
    )
    write_report(cfg, PROMOTION_REPORT, result)
    return result


def move_champion(mlflow_client, name: str, version, champion) -> None:
    """Point alias 'champion' at `version`; the old champion (`champion`, or None) takes 'previous', and the
    champion history grows. A running `mlflow models serve -m models:/<name>@champion` does not follow: it
    resolved the alias when it started (docs/reproducibility.md, serving under load)."""
    if champion is not None:
        mlflow_client.set_registered_model_alias(name, PREVIOUS, champion.version)
    mlflow_client.set_registered_model_alias(name, CHAMPION, version)
    history = _history(mlflow_client, name)
    if champion is not None and (not history or history[-1] != str(champion.version)):
        history.append(str(champion.version))
    _set_history(mlflow_client, name, history + [str(version)])


def rollback(cfg: Config) -> dict:
    """Give 'champion' back to the 'previous' version; the demoted one is tagged rolled_back."""
    name = cfg.mlflow.model_name
    mlflow_client = client(cfg.mlflow)
    require_manage(mlflow_client, name, "promote --rollback", f"to move alias '{CHAMPION}'")
    champion = _alias_version(mlflow_client, name, CHAMPION)
    previous = _alias_version(mlflow_client, name, PREVIOUS)
    if previous is None:
        raise ContextualBertError(f"model '{name}' has no '{PREVIOUS}' version to roll back to")
    with tempfile.TemporaryDirectory(prefix="rollback-") as tmp:  # what it gives 'champion' back to is checked
        verified_copy(mlflow_client, name, previous, Path(tmp))
    if champion is not None:
        mlflow_client.set_model_version_tag(name, champion.version, ROLLED_BACK_TAG, "true")
    mlflow_client.set_registered_model_alias(name, CHAMPION, previous.version)
    history = _history(mlflow_client, name)
    if champion is not None and history and history[-1] == str(champion.version):
        history.pop()
    if not history or history[-1] != str(previous.version):
        history.append(str(previous.version))
    _set_history(mlflow_client, name, history)
    before = history[-2] if len(history) >= 2 else None
    if before is not None:
        mlflow_client.set_registered_model_alias(name, PREVIOUS, before)
    else:
        mlflow_client.delete_registered_model_alias(name, PREVIOUS)
    result = {
        "model_name": name,
        "rolled_back": int(champion.version) if champion else None,
        "champion": int(previous.version),
        "previous": int(before) if before else None,
        "decision": f"rolled back: champion is version {previous.version} again",
    }
    write_report(cfg, PROMOTION_REPORT, result)
    return result


def _describe(version, key: str) -> dict:
    return {
        "version": int(version.version),
        "model": model_tag(version.tags),
        "seed": version.tags.get("seed"),
        "run_id": version.run_id,
        key: recorded_metric(version, key),
    }
