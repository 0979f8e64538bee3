"""Table 1's rendering: the markdown of reports/table1.md, from the statistics (`report_stats.py`): the rows, the
paper's numbers beside them, and the sections on context, history, attributes, seeds and yardsticks."""

from __future__ import annotations

import json

from contextual_bert.config import ATTRIBUTES_SUFFIX, BASELINE_MODELS, VARIANTS, Config, base_model, uses_attributes
from contextual_bert.data.feature_store import MANIFEST_FILE
from contextual_bert.evaluation.bootstrap import DEPENDENCE_METRIC, KNOWN_OUTFITS_KEY, LEVEL, OUTFITS_KEY
from contextual_bert.evaluation.ranking import STUCK_BELOW
from contextual_bert.evaluation.report_stats import TARGET_PARTS, VERDICT_METRICS, compare, compare_models
from contextual_bert.evaluation.table1_cells import (  # noqa: F401
    CONVERGENCE_LABELS,
    METRIC_LABELS,
    _converged_text,
    _count,
    _dependence_text,
    _fitb_cells,
    _fmt,
    _fmt_ci,
    _seed_spread_text,
    _split_words,
    _verdict_text,
    _yardstick_phrase,
    comparison_text,
    stuck,
)

LABELS = {
    "popularity": "Popularity",
    "optimum_context": "Optimum, with context",
    "optimum_no_context": "Optimum, without context",
    "bag_of_items": "Bag of items",
    "bag_of_items_context": "Bag of items + c",
    "none": "[None]",
    "concat": "[C]",
    "new_position": "[NP]",
    "global_state": "[GS]",
    "global_state_update": "[GSU]",
    "global_state_two_way": "[GS2]",
    "adaptive_norm": "[AdaLN]",
    "popularity_attribute": "Popularity by attribute",
    "popularity_history": "Popularity + own history",
    "popularity_attribute_history": "Popularity by attribute + own history",
    "optimum_history": "Optimum, with context and history",
}
LABELS |= {f"{m}_attrs": f"{LABELS[m]} + attributes" for m in (*VARIANTS, *BASELINE_MODELS)}


# Denk & Peleteiro Ramallo (2020), Table 1: 17k held-out of 380k outfits, mean of 3 runs.
PAPER_TABLE1 = {
    "none": {"cross_entropy": 5.26, "recall@1": 0.085, "parameters": 546_432},
    "concat": {"cross_entropy": 4.94, "recall@1": 0.103, "parameters": 673_664},
    "new_position": {"cross_entropy": 4.93, "recall@1": 0.105, "parameters": 640_768},
    "global_state": {"cross_entropy": 4.85, "recall@1": 0.112, "parameters": 723_328},
    "global_state_update": {"cross_entropy": 4.75, "recall@1": 0.122, "parameters": 921_856},
}


SEED_SE_TARGET = 0.02  # nats: a row's seed SE of the test cross-entropy above it is named, with its seeds' spread


def history_lines(summary: dict, references: dict) -> list[str]:
    """With features.history on: every model that reads c (and so the history) against popularity mixed with
    the customer's own history, paired on the same test cases."""
    if "popularity_history" not in references:
        return []
    ref = references["popularity_history"]
    ref_row = {
        "test": {k: {"mean": v, "se": None} for k, v in ref["test"].items() if isinstance(v, (int, float))},
        OUTFITS_KEY: ref.get(OUTFITS_KEY),
    }
    lines = [
        "",
        "## Does history help?",
        "",
        f"- Every context in this table holds the customer's history (features.history). The yardstick: "
        f"{LABELS['popularity_history'].lower()}, CE {ref['test']['cross_entropy']:.3f} (its weight "
        f"{ref.get('weight')}, chosen on validation). Each model that reads c against it:",
    ]
    for v in summary:
        if base_model(v) in ("none", "bag_of_items"):
            continue
        row, on = summary[v], ""
        if uses_attributes(v) and "test_known" in row:
            # it ranks every test target, the yardstick only those with an id: paired on those
            row, on = {"test": row["test_known"]["test"], OUTFITS_KEY: row.get(KNOWN_OUTFITS_KEY)}, " (known targets)"
        per_metric = {m: compare_models(row, ref_row, m, higher) for m, higher in VERDICT_METRICS}
        lines.append(f"  - {LABELS.get(v, v)}{on}: {comparison_text(per_metric)}")
    return lines


def attribute_lines(summary: dict, references: dict) -> list[str]:
    """The attribute models ("<model>_attrs") on all, known and unseen targets, read against the
    attribute-aware popularity."""
    models = [v for v in summary if uses_attributes(v)]
    if not models:
        return []
    lines = [
        "",
        "## Article attributes",
        "",
        "- The models with attributes and the attribute-aware popularity rank the whole catalogue (the "
        "articles table), so every test target is ranked; the models of ids only rank the train vocabulary "
        "and skip unseen targets (their rows above). Known: the target has an id embedding (seen in "
        "training); unseen: it has none. Cross-entropy (nats) / recall@5 % [95% bootstrap CI]:",
        "",
    ]
    rows = {
        name: {
            "test": {k: {"mean": v, "se": None} for k, v in ref["test"].items() if isinstance(v, (int, float))},
            "test_bootstrap": ref.get("test_bootstrap") or {},
            OUTFITS_KEY: ref.get(OUTFITS_KEY),
            **{
                part: {
                    "test": {k: {"mean": v, "se": None} for k, v in ref[part].items() if isinstance(v, (int, float))},
                    "bootstrap": ref.get(f"{part}_bootstrap") or {},
                }
                for part in TARGET_PARTS
                if part in ref
            },
        }
        for name, ref in references.items()
        if name == "popularity_attribute"
    }
    rows |= {v: summary[v] for v in models}
    lines += [
        "| Model | all: CE | all: recall@5 | known: CE | known: recall@5 | unseen: CE | unseen: recall@5 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in rows.items():
        cells = [
            LABELS.get(name, name),
            _fmt(s["test"].get("cross_entropy"), False, 2),
            f"{_fmt(s['test'].get('recall@5'), True, 2)} [{_fmt_ci(s['test_bootstrap'].get('recall@5'))}]",
        ]
        for part in TARGET_PARTS:
            p = s.get(part)
            cells += (
                ["–", "–"]
                if p is None
                else [
                    _fmt(p["test"].get("cross_entropy"), False, 2),
                    f"{_fmt(p['test'].get('recall@5'), True, 2)} [{_fmt_ci(p['bootstrap'].get('recall@5'))}]",
                ]
            )
        lines.append("| " + " | ".join(cells) + " |")
    if "popularity_attribute" in references:
        ref = rows["popularity_attribute"]
        lines.append("")
        for v in models:
            per_metric = {m: compare_models(summary[v], ref, m, higher) for m, higher in VERDICT_METRICS}
            lines.append(
                f"- {LABELS.get(v, v)} against {LABELS['popularity_attribute'].lower()} (all targets): "
                f"{comparison_text(per_metric)}"
            )
    # does the context still help when the articles are known by their attributes? (same cases both sides)
    none_attrs = "none" + ATTRIBUTES_SUFFIX
    context = [v for v in models if base_model(v) in VARIANTS and v != none_attrs]
    if none_attrs in summary and context:
        lines += ["", f"- Against {LABELS.get(none_attrs, none_attrs)} (all targets):"]
        for v in context:
            per_metric = {
                m: compare_models(summary[v], summary[none_attrs], m, higher) for m, higher in VERDICT_METRICS
            }
            lines.append(f"  - {LABELS.get(v, v)}: {comparison_text(per_metric)}")
    # what the attributes add to each model: its known targets against its twin of ids only (which ranks the
    # train vocabulary, the attribute model the larger catalogue: a harder task for the latter)
    twins = [v for v in models if base_model(v) in summary and "test_known" in summary[v]]
    if twins:
        lines += ["", "- Against the same model of ids only (known targets, the only ones the latter ranks):"]
        for v in twins:
            known = summary[v]["test_known"]["test"]
            per_metric = {
                m: compare(known[m], summary[base_model(v)]["test"][m], higher) for m, higher in VERDICT_METRICS
            }
            lines.append(
                f"  - {LABELS.get(v, v)} against {LABELS.get(base_model(v), base_model(v))}: "
                f"{comparison_text(per_metric)}"
            )
    return lines


# --- the table -------------------------------------------------------------------------------------------


def _data_lines(cfg: Config) -> list[str]:
    lines = []
    manifest_path = cfg.paths.features_dir / MANIFEST_FILE
    if manifest_path.exists():
        m = json.loads(manifest_path.read_text())
        rows = m.get("rows", {})
        lines.append(
            f"- Data: source **{m.get('source', 'unknown')}**, {rows.get('outfits', '?'):,} outfits "
            f"(train {rows.get('train', '?'):,} / validation {rows.get('val', '?'):,} / "
            f"test {rows.get('test', '?'):,}, {_split_words(m.get('split', {}))}), {rows.get('customers', '?'):,} customers, "
            f"{rows.get('articles', '?'):,} articles of which {m.get('n_items', 3) - 3:,} in the vocabulary "
            f"(d_context {m.get('d_context', '?')})."
        )
        if m.get("d_context") == 0:
            lines.append(
                f"- No context: this data (source **{m.get('source', 'unknown')}**, e.g. curated outfits without "
                "customers) has no context columns, so only the models that read none run ([None], the bag of items) "
                "beside the popularity; the context models ([C], [NP], [GS], [GSU], the bag of items + c) would "
                "have nothing to condition on."
            )
    ingest_path = cfg.paths.raw_dir / "ingest_report.json"
    if ingest_path.exists():
        ingest = json.loads(ingest_path.read_text())
        kept = {k: v for k, v in ingest.items() if k in ("source", "rows", "quarantined") or "drop" in k}
        lines.append(f"- Ingest ({ingest_path}): `{json.dumps(kept)}`")
    return lines


def seed_se_lines(summary: dict, metric: str = "cross_entropy") -> list[str]:
    """The seed SE of the test cross-entropy to three decimals, largest first: the table rounds to two, so a
    claim about its size is read here, never from the rounded column."""
    ses = {
        v: s["test"][metric]["se"]
        for v, s in summary.items()
        if metric in s["test"] and s["test"][metric]["se"] is not None
    }
    if not ses:
        return []
    largest = max(ses, key=ses.__getitem__)
    each = ", ".join(f"{LABELS.get(v, v)} {se:.3f}" for v, se in ses.items())
    lines = [
        "",
        f"- Seed SE of the test cross-entropy: at most **{ses[largest]:.3f}** nats "
        f"({LABELS.get(largest, largest)}); each: {each}.",
    ]
    over = [v for v, se in ses.items() if se > SEED_SE_TARGET]
    lines += [
        f"  - {LABELS.get(v, v)} misses the {SEED_SE_TARGET} nats target: {_seed_spread_text(summary[v], metric)}"
        for v in over
    ]
    return lines


def render_table1(
    cfg: Config,
    summary: dict,
    references: dict,
    verdicts: dict,
    order: dict,
    baseline_verdicts: dict | None = None,
    yardsticks: dict | None = None,
    unavailable: dict | None = None,
) -> str:
    lines = _preamble_lines(cfg, summary)
    lines += _reference_rows(references)
    lines += [_model_row(v, summary[v], (yardsticks or {}).get(v)) for v in summary]
    if unavailable:
        lines += [
            "",
            f"- Not trained on this data: {', '.join(LABELS.get(v, v) for v in unavailable)} "
            f"({next(iter(unavailable.values()))}).",
        ]
    lines += seed_se_lines(summary)
    lines += yardstick_lines(yardsticks or {})
    lines += _optimum_lines(summary, references)
    lines += history_lines(summary, references)
    lines += attribute_lines(summary, references)
    if baseline_verdicts:
        lines += ["", "## Against the learned baselines", ""]
        for text in baseline_verdicts["lines"]:
            lines.append(f"- {text}")
    lines += _context_lines(verdicts)
    lines += _order_lines(order)
    lines += ["", "Plots: `reports/plots/recall_at_k.png`, `reports/plots/training_curves.png`.", ""]
    return "\n".join(lines)


def _preamble_lines(cfg: Config, summary: dict) -> list[str]:
    """The title, what the data and the protocol are, and the table's header."""
    seeds = cfg.train.seeds
    n = len(seeds)
    counts = next(iter(summary.values()))["test"]
    spread = (
        f"mean ± standard error over {n} seeds {seeds} (SE = sample std / √n)"
        if n > 1
        else f"seed {seeds[0]} only (n=1, no SE)"
    )
    return [
        "# Table 1: outfit completion on this data",
        "",
        *_data_lines(cfg),
        f"- Test split, {spread}: {_count(counts, 'n_outfits')} outfits, "
        f"{_count(counts, 'n_cases')} masked-article cases ({_count(counts, 'n_unknown_targets')} with a target outside the vocabulary). Every article of "
        "the vocabulary is ranked; the outfit's other (in-outfit) articles are excluded from the ranking.",
        "- 95% CI: percentile bootstrap over the test outfits (bootstrap.py), the bounds averaged over seeds: "
        "how much the numbers move with the test split itself, besides the seed SE.",
        '- "Beats": with two seeds or more on both sides, the improvement must exceed the SE of the difference; '
        "with one seed, a paired bootstrap over the test outfits (both models' cases of an outfit drawn "
        f"together) must put the whole {LEVEL:.0%} interval of the difference on the better side of 0.",
        "- FITB (fill-in-the-blank, fitb.py): each test item blanked in turn, the model picks it among "
        "evaluate.fitb.n_candidates candidates (itself and negatives not in the outfit, the same questions for every "
        "row: reports/eval/fitb_questions.csv); easy: negatives of any article, hard: of the blank's product type "
        "(or category); chance is 1 / candidates. The field's Polyvore numbers read images: not comparable "
        "(docs/curated_products.md).",
        "- Recall in %. Paper columns: Denk & Peleteiro Ramallo (2020), Table 1, 17k held-out of 380k outfits, "
        "mean of 3 runs (their own data; compare the pattern, not the numbers).",
        "",
        "- Converged: runs whose early stopping fired or whose last 3 epochs improved validation "
        "cross-entropy by less than 0.01 nats together.",
        "- Parameters: counted as the paper counts them, without the article embeddings, the output layer and "
        "the customer-feature embeddings; so the bag of items counts 0 and the bag of items + c only its "
        "projection of c.",
        "- Outfit dependence: the test cross-entropy with the encoder reading another test outfit's articles "
        "(same length, the [MASK] in place, the customer and any attribute-overlap offsets the real ones) minus "
        f"the real one, in nats (evaluation.py). Under {STUCK_BELOW} (**stuck**): the model predicts without "
        "reading the outfit, a popularity table whatever its loss.",
        "",
        "| Model | Cross-entropy | (paper) | Recall@1 % | (paper) | Recall@5 % | Recall@5 % 95% CI | Recall@250 % | "
        "FITB easy % [95% CI] | FITB hard % [95% CI] | "
        "Parameters | (paper) | Recall@1 gain vs [None] | (paper) | Converged | Outfit dependence | "
        "Against its yardstick (CE) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]


def _reference_rows(references: dict) -> list[str]:
    """The counts' (and the optimum's) rows: no seeds, no parameters."""
    lines = []
    for name, result in references.items():
        ref = {k: {"mean": v, "se": None} for k, v in result["test"].items() if isinstance(v, (int, float))}
        lines.append(
            f"| {LABELS.get(name, name)} | {_fmt(ref.get('cross_entropy'), False, 2)} | – | "
            f"{_fmt(ref.get('recall@1'), True, 2)} | – | {_fmt(ref.get('recall@5'), True, 2)} | "
            f"{_fmt_ci((result.get('test_bootstrap') or {}).get('recall@5'))} | "
            f"{_fmt(ref.get('recall@250'), True, 2)} | {' | '.join(_fitb_cells(ref, result, pooled=False))} | "
            "– | – | – | – | – | – | – |"
        )
    return lines


def _model_row(v: str, s: dict, yardstick: dict | None) -> str:
    """A learned model's row: the mean ± seed SE of each metric, the paper's beside it."""
    paper, paper_none = PAPER_TABLE1.get(v, {}), PAPER_TABLE1["none"]["recall@1"]
    gain = s.get("recall@1_gain_vs_none")
    paper_gain = paper["recall@1"] / paper_none - 1 if paper and v != "none" else None
    return (
        "| "
        + " | ".join(
            [
                LABELS.get(v, v),
                _fmt(s["test"].get("cross_entropy"), False, 2),
                f"{paper['cross_entropy']:.2f}" if paper else "–",
                _fmt(s["test"].get("recall@1"), True, 2),
                f"{paper['recall@1'] * 100:.1f}" if paper else "–",
                _fmt(s["test"].get("recall@5"), True, 2),
                _fmt_ci(s["test_bootstrap"].get("recall@5")),
                _fmt(s["test"].get("recall@250"), True, 2),
                *_fitb_cells(s["test"], s, pooled=True),
                f"{s['parameters']:,}",
                f"{paper['parameters']:,}" if paper else "–",
                "–" if gain is None else f"{gain * 100:+.1f} %",
                "–" if paper_gain is None else f"{paper_gain * 100:+.1f} %",
                _converged_text(s.get("convergence")),
                _dependence_text(s["test"].get(DEPENDENCE_METRIC)),
                _yardstick_cell(yardstick),
            ]
        )
        + " |"
    )


def _optimum_lines(summary: dict, references: dict) -> list[str]:
    """Each model's gap to the data's exact optimum (planted data only)."""
    lines = []
    if "optimum_context" in references or "optimum_no_context" in references:
        lines += [
            "",
            "## Distance to the optimum",
            "",
            "- The data's exact Bayes-optimal predictor is known: its rows are the best any model can do on "
            "these test cases, with and without the customer. Gap in cross-entropy (nats):",
        ]
        for v in summary:
            ce = summary[v]["test"]["cross_entropy"]["mean"]
            uses_context = base_model(v) not in ("none", "bag_of_items")
            # a model that reads c reads the history in it (features.history), and is held to that optimum
            name = (
                ("optimum_history" if "optimum_history" in references else "optimum_context")
                if uses_context
                else "optimum_no_context"
            )
            if name in references and ce is not None:
                gap = ce - references[name]["test"]["cross_entropy"]
                lines.append(f"  - {LABELS.get(v, v)}: {gap:+.3f} to the {LABELS[name].lower()}")
    return lines


def _context_lines(verdicts: dict) -> list[str]:
    """Does every context variant beat [None]?"""
    lines = ["", "## Does context help?", ""]
    if not verdicts:
        lines.append(
            "- [None] is not among train.models (or no context variant is), so there is nothing to compare against."
        )
    else:
        overall = verdicts["all_beat_none_by_more_than_se"]
        comparisons = [c for pv in verdicts["per_variant"].values() for c in pv.values()]
        lines.append(
            f"- Every context variant beats [None] on cross-entropy and recall@5 "
            f"{_yardstick_phrase(comparisons)}: "
            f"**{_verdict_text(overall, 'a comparison below has no yardstick')}**."
        )
        for v, per_metric in verdicts["per_variant"].items():
            lines.append(f"  - {LABELS.get(v, v)}: {comparison_text(per_metric)}")
    return lines


def _order_lines(order: dict) -> list[str]:
    """The context variants' order by recall@1 against the paper's."""
    if not order:
        return []
    ours = " > ".join(LABELS.get(v, v) for v in order["ours"])
    paper = " > ".join(LABELS.get(v, v) for v in order["paper"])
    own = ", ".join(LABELS.get(v, v) for v in order["ours"] if v not in order["paper"])
    lines = [
        "",
        "## Order of the context variants by recall@1",
        "",
        f"- Ours: {ours}. Paper: {paper}{f' ({own}: not in the paper)' if own else ''}. "
        f"**{'Same order' if order['matches_paper'] else 'Different order'}.**",
    ]
    if order["within_se"]:
        pairs = ", ".join(f"{LABELS.get(a, a)} vs {LABELS.get(b, b)}" for a, b in order["within_se"])
        lines.append(
            f"- Neighbours whose recall@1 does not differ beyond its yardstick (the SE of the "
            f"difference; with one seed, the paired bootstrap): {pairs}."
        )
    return lines


def _yardstick_cell(verdict: dict | None) -> str:
    """Table 1's cell: the verdict against the row's yardstick, a worse one in bold capitals."""
    if not verdict:
        return "–"
    label = LABELS.get(verdict["name"], verdict["name"]).lower()
    if verdict["verdict"] is None:
        return f"unknown ({label})"
    word = {"better": "better than", "level": "level with", "worse": "**WORSE** than"}[verdict["verdict"]]
    return f"{word} {label} ({verdict['difference']:+.2f})"


def yardstick_lines(verdicts: dict[str, dict]) -> list[str]:
    """The section that says, for every learned row, where it stands against the count it must beat."""
    if not verdicts:
        return []
    worse = [v for v, c in verdicts.items() if c.get("verdict") == "worse"]
    lines = [
        "",
        "## Against the yardsticks",
        "",
        "- Each learned row against the count that knows what it reads: popularity; popularity + own history "
        "for a model whose context holds the history; the attribute-aware popularity for the models with "
        "attributes (all targets), lifted by the own history for those whose context holds it. Test "
        "cross-entropy, model minus yardstick (negative: better); better or "
        "worse beyond the SE of the difference with two seeds or more, beyond the paired bootstrap's 95% "
        "interval with one; otherwise level.",
        f"- **{len(worse)} of {len(verdicts)} learned rows are worse than their yardstick"
        + (f": {', '.join(LABELS.get(v, v) for v in worse)}.**" if worse else ".**"),
    ]
    for v, c in verdicts.items():
        if c.get("verdict") is None:
            lines.append(f"  - {LABELS.get(v, v)}: {c.get('why', 'no verdict')}")
            continue
        rule = (
            f"SE {c['se']:.3f}"
            if c.get("rule") == "se"
            else f"paired bootstrap {LEVEL:.0%} CI {c['interval'][0]:+.3f}..{c['interval'][1]:+.3f}"
        )
        lines.append(
            f"  - {LABELS.get(v, v)}: {c['model']:.3f} against {LABELS.get(c['name'], c['name']).lower()} "
            f"{c['yardstick']:.3f}, {c['difference']:+.3f} ({rule}): **{c['verdict']}**"
        )
    return lines
