"""Fill-in-the-blank (FITB): the outfit-completion measure the field reports, beside the full ranking.

A question is a test outfit with one item blanked and N candidates (`evaluate.fitb.n_candidates`, 4 as in
the field): the blanked item and N-1 negatives, articles not in the outfit, drawn with a fixed seed
(`evaluate.fitb.seed`). Every item of every test outfit is blanked in turn. Two protocols:

- easy: the negatives are drawn uniformly from every real article of the catalogue (the articles table when
  features.article_features is on, else the train vocabulary);
- hard: the negatives share the blanked item's value of the first of `evaluate.fitb.hard_attributes` that is a
  single-valued attribute of the catalogue (product type; a curated set's category), as Polyvore Outfits' FITB
  (Vasileva et al. 2018) draws them from the blank's category. A blank whose
  value is missing or unknown, or whose value has fewer than N-1 articles outside the outfit, is not asked
  (counted: `not_asked`); so is any blank with fewer than N-1 articles outside its outfit to draw from. An
  attribute without any value (declared, yet missing everywhere) is passed over; no attribute, or no hard
  question at all: hard is {"known": false, "why": ...}, not an error (easy without a question is one).

A blank that the features cannot name (an [UNK] item: features.article_features off and the article outside the
train vocabulary) is not asked either. The questions depend on data/features and the settings only, never on a
model: every model is asked the same ones (`questions`, same seed -> the same questions), and the baseline stage
writes them to reports/eval/fitb_questions.csv (article ids; Config.fitb_questions_path), so that any other
model can answer them.

A model answers with its masked-item scores of the N candidates (`masked_logits`); a model of ids only scores
a candidate outside its vocabulary by its [UNK] row, as it reads such an article in the outfit. Accuracy is the
share of questions whose blanked item scores highest; a tie at the top among k candidates, the blank included,
counts 1/k (the expected accuracy of breaking it at random), so a scorer that ignores its input gets exactly 1/N.
The interval is the bootstrap over test outfits (bootstrap.py).

Against published numbers (docs/curated_products.md): Polyvore Outfits FITB accuracies (about 55-57 % for
type-aware embeddings, Vasileva et al. 2018) come from models that read the items' images and text; this project
reads ids, attributes and text, on other data. Hard has the same shape (4 candidates, one blank, negatives of the
blank's category); the numbers are not comparable across inputs and data sets.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from contextual_bert.config import FitbConfig
from contextual_bert.data.feature_spec import MASK_INDEX, MISSING_INDEX, N_SPECIAL, PAD_INDEX, UNKNOWN_INDEX
from contextual_bert.errors import ContextualBertError
from contextual_bert.evaluation.bootstrap import bootstrap_ci
from contextual_bert.evaluation.ranking import progress, scorer_name, scoring_pass

PROTOCOLS = ("easy", "hard")
METRICS = tuple(f"fitb_{p}" for p in PROTOCOLS)  # accuracies, in an evaluation's "test" metrics
RESULT_KEY = "fitb"  # an evaluation's block: per protocol the questions, accuracy and interval


@dataclass(frozen=True)
class Questions:
    """Every blank of a split and its candidates, per protocol.

    outfit, position: (C,) the row of the split and the blanked slot; candidates[p]: (C, N) catalogue indices
    (the blank at answer[p]); asked[p]: (C,) bool, the blank is a question of protocol p."""

    outfit: np.ndarray
    position: np.ndarray
    candidates: dict[str, np.ndarray]
    answer: dict[str, np.ndarray]
    asked: dict[str, np.ndarray]
    hard_attribute: str | None
    why_not_hard: str | None = None

    def digest(self) -> str:
        """A hash of the questions: equal digests, the same questions."""
        h = hashlib.sha256()
        for a in (
            self.outfit,
            self.position,
            *(x for p in PROTOCOLS for x in (self.candidates[p], self.answer[p], self.asked[p])),
        ):
            h.update(np.ascontiguousarray(a).astype(np.int64).tobytes())
        return h.hexdigest()


MAX_REDRAWS = 200  # rounds of vectorised redraws before the few questions left are drawn one by one


def _negatives(
    rng: np.random.Generator, order: np.ndarray, start: np.ndarray, size: np.ndarray, outfits: np.ndarray, k: int
) -> np.ndarray:
    """(Q, k) distinct articles per question, uniformly from its pool order[start:start + size], none of them in
    its outfit's row of `outfits` (Q, L). Every question must have k such articles. Drawn for all questions at
    once, the rows with a clash (an outfit's article, or one article twice) drawn again until none is left."""
    out = np.zeros((len(start), k), dtype=np.int64)
    todo = np.arange(len(start))
    for _ in range(MAX_REDRAWS):
        if not len(todo):
            return out
        drawn = order[start[todo, None] + (rng.random((len(todo), k)) * size[todo, None]).astype(np.int64)]
        in_outfit = (drawn[:, :, None] == outfits[todo, None, :]).any(axis=(1, 2))
        ordered = np.sort(drawn, axis=1)
        repeated = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
        good = ~in_outfit & ~repeated
        out[todo[good]] = drawn[good]
        todo = todo[~good]
    for q in todo:  # pools nearly exhausted by their outfits: draw from what is left
        pool = order[start[q] : start[q] + size[q]]
        out[q] = rng.choice(pool[~np.isin(pool, outfits[q])], k, replace=False)
    return out


def _has_values(values) -> bool:
    """Does any real article have a value (not missing, not unknown)? (A contract column a products table
    lacks is declared, yet missing everywhere.)"""
    values = np.asarray(values)[N_SPECIAL:]
    return bool((values >= N_SPECIAL).any())


def make_questions(
    items: np.ndarray, n_articles: int, cfg: FitbConfig, attributes: dict[str, np.ndarray] | None = None
) -> Questions:
    """The questions of a split (`items`: (B, L) catalogue indices, PAD-padded) over the real articles
    N_SPECIAL..n_articles-1, with `attributes` (name -> encoded values, the catalogue's) for the hard protocol."""
    items = np.asarray(items, dtype=np.int64)
    outfit, position = np.nonzero(items != PAD_INDEX)
    blank = items[outfit, position]
    named = blank >= N_SPECIAL  # an [UNK] blank cannot be named
    outfit, position, blank = outfit[named], position[named], blank[named]
    k = cfg.n_candidates - 1
    hard_attribute = next((a for a in cfg.hard_attributes if attributes and a in attributes
                           and np.asarray(attributes[a]).ndim == 1 and _has_values(attributes[a])), None)  # fmt: skip
    why = (
        None
        if hard_attribute
        else (
            f"no single-valued article attribute with values among evaluate.fitb.hard_attributes {cfg.hard_attributes}"
            + ("" if attributes else " (features.article_features is off)")
        )
    )
    real_in = items[outfit]  # each question's outfit (PAD where empty: never drawn)
    # per protocol, each question's pool as a slice of one article order, and the outfit's articles inside it
    order = {"easy": np.arange(N_SPECIAL, n_articles)}
    start = {"easy": np.zeros(len(blank), dtype=np.int64)}
    size = {"easy": np.full(len(blank), n_articles - N_SPECIAL, dtype=np.int64)}
    inside = {"easy": (real_in >= N_SPECIAL).sum(axis=1)}
    if hard_attribute:
        assert attributes is not None, "the hard protocol reads the articles' attributes"
        values = np.asarray(attributes[hard_attribute], dtype=np.int64)[:n_articles]
        by_value = np.argsort(values, kind="stable")
        order["hard"] = by_value[by_value >= N_SPECIAL]
        starts = np.searchsorted(values[order["hard"]], np.arange(values.max() + 2))
        v = values[blank]
        start["hard"], size["hard"] = starts[v], starts[v + 1] - starts[v]
        size["hard"][np.isin(v, (MISSING_INDEX, UNKNOWN_INDEX, PAD_INDEX))] = 0  # no value: no hard question
        inside["hard"] = ((values[real_in] == v[:, None]) & (real_in >= N_SPECIAL)).sum(axis=1)
    candidates, answer, asked = {}, {}, {}
    for number, protocol in enumerate(PROTOCOLS):
        n = len(blank)
        candidates[protocol] = np.full((n, cfg.n_candidates), PAD_INDEX, dtype=np.int64)
        answer[protocol] = np.zeros(n, dtype=np.int64)
        asked[protocol] = np.zeros(n, dtype=bool)
        if protocol not in order:
            continue
        rng = np.random.default_rng([cfg.seed, number])
        ok = size[protocol] - inside[protocol] >= k  # enough articles outside the outfit to draw from
        negatives = _negatives(rng, order[protocol], start[protocol][ok], size[protocol][ok], real_in[ok], k)
        slots = rng.integers(cfg.n_candidates, size=int(ok.sum()))
        rows = np.zeros((int(ok.sum()), cfg.n_candidates), dtype=np.int64)
        before = np.arange(cfg.n_candidates)[None, :] < slots[:, None]
        # the blank at its slot, the negatives in order around it
        rows[:, :-1] = negatives
        rows = np.where(before, rows, np.roll(rows, 1, axis=1))
        rows[np.arange(len(slots)), slots] = blank[ok]
        candidates[protocol][ok], answer[protocol][ok], asked[protocol][ok] = rows, slots, True
    return Questions(outfit, position, candidates, answer, asked, hard_attribute, why)


def split_questions(features_dir: Path, max_set_size: int, cfg: FitbConfig, split: str = "test"):
    """(the split's questions, its outfit ids, the catalogue's article ids): from data/features alone."""
    from contextual_bert.data.feature_store import ATTRIBUTES_FILE, load_article_vocab, load_catalogue, load_split

    features_dir = Path(features_dir)
    if (features_dir / ATTRIBUTES_FILE).exists():
        catalogue = load_catalogue(features_dir)
        ids, attributes = catalogue.vocab.ids, catalogue.attributes
    else:
        ids, attributes = load_article_vocab(features_dir).ids, None
    data = load_split(features_dir, split, max_set_size, catalogue=True)
    questions = make_questions(data.items.numpy(), len(ids), cfg, attributes)
    return questions, data.outfit_ids, ids


def answer(model, data, questions: Questions, batch_size: int, device) -> dict[str, np.ndarray]:
    """protocol -> (C,) the model's accuracy on each question (1, 0, or 1/k for a k-way tie at the top;
    NaN where not asked). `data`: the split as the model reads it (its own encoding of the same outfits)."""
    device = torch.device(device)
    model.eval()
    items = data.items.to(device)
    context = {name: values.to(device) for name, values in data.context.items()}
    n_items = int(model.n_items)
    out = {p: np.full(len(questions.outfit), np.nan) for p in PROTOCOLS}
    lengths = (items != PAD_INDEX).sum(dim=1)
    bar = progress(len(questions.outfit), f"{scorer_name(model)} FITB", "question")
    with torch.no_grad(), scoring_pass(model), bar:  # the output layer built once (ranking.scoring_pass)
        for start in range(0, len(questions.outfit), batch_size):
            rows = slice(start, start + batch_size)
            o = torch.as_tensor(questions.outfit[rows], device=device)
            p = torch.as_tensor(questions.position[rows], device=device)
            masked = items[o, : int(lengths[o].max())].clone()
            masked[torch.arange(len(o), device=device), p] = MASK_INDEX
            logits = model.masked_logits(masked, {name: values[o] for name, values in context.items()}).float()
            for protocol in PROTOCOLS:
                candidates = torch.as_tensor(questions.candidates[protocol][rows], device=device)
                candidates = candidates.masked_fill(candidates >= n_items, UNKNOWN_INDEX)  # outside its vocabulary
                scores = logits.gather(1, candidates)
                if torch.isnan(scores).any():
                    raise ContextualBertError("a model scored a FITB candidate NaN")
                best = scores.max(dim=1, keepdim=True).values
                top = scores == best
                slot = torch.as_tensor(questions.answer[protocol][rows], device=device)[:, None]
                correct = top.gather(1, slot).squeeze(1).double() / top.sum(dim=1).double()
                out[protocol][rows] = correct.cpu().numpy()
            bar.update(len(o))
    for protocol in PROTOCOLS:
        out[protocol][~questions.asked[protocol]] = np.nan
    return out


def fitb_result(model, data, questions: Questions, cfg: FitbConfig, batch_size: int, device) -> tuple[dict, dict]:
    """(test metrics: fitb_easy / fitb_hard accuracies, the evaluation's "fitb" block: per protocol the number
    of questions, accuracy and bootstrap interval; the settings and the questions' digest)."""
    correct = answer(model, data, questions, batch_size, device)
    metrics, block = (
        {},
        {
            "n_candidates": cfg.n_candidates,
            "seed": cfg.seed,
            "questions_sha256": questions.digest(),
            "chance": 1.0 / cfg.n_candidates,
        },
    )
    for protocol, metric in zip(PROTOCOLS, METRICS):
        asked = questions.asked[protocol]
        if protocol == "hard" and questions.hard_attribute is None:
            block[protocol] = {"known": False, "why": questions.why_not_hard}
            continue
        if protocol == "hard" and not asked.any():
            block[protocol] = {
                "known": False,
                "attribute": questions.hard_attribute,
                "why": "no test blank has "
                f"{cfg.n_candidates - 1} articles of its {questions.hard_attribute} outside its outfit",
            }
            continue
        if not asked.any():
            raise ContextualBertError(f"FITB {protocol}: no question could be asked on the test split")
        values = correct[protocol][asked]
        interval = bootstrap_ci(questions.outfit[asked], {metric: values}, n_outfits=len(data))
        metrics[metric] = float(values.mean())
        block[protocol] = {
            "n_questions": int(asked.sum()),
            "not_asked": int((~asked).sum()),
            "accuracy": metrics[metric],
            "ci": interval[metric],
            **({"attribute": questions.hard_attribute} if protocol == "hard" else {}),
        }
    return metrics, block


def write_questions(questions: Questions, outfit_ids: list, article_ids: list[str], path: Path) -> int:
    """The questions as CSV, one row per question and protocol: protocol, outfit_id, position, blank
    (article id), answer (the blank's slot, from 0), candidate_0..candidate_{N-1} (article ids); returns rows."""
    ids = np.asarray(article_ids, dtype=object)
    frames = []
    for protocol in PROTOCOLS:
        asked = questions.asked[protocol]
        candidates = questions.candidates[protocol][asked]
        frame = pd.DataFrame({
            "protocol": protocol,
            "outfit_id": np.asarray(outfit_ids, dtype=object)[questions.outfit[asked]],
            "position": questions.position[asked],
            "blank": ids[candidates[np.arange(len(candidates)), questions.answer[protocol][asked]]],
            "answer": questions.answer[protocol][asked],
            **{f"candidate_{i}": ids[candidates[:, i]] for i in range(candidates.shape[1])},
        })  # fmt: skip
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False)
    return len(table)
