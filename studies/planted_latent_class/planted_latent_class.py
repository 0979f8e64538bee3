"""How near can a learner get to the optimum of planted data at a given size? A latent-class yardstick.

The Bayes optimum (`optimum.py`) knows the generator's parameters. A model has to estimate them from the
training split. This benchmark fits the generator's own model family to the training outfits by EM and scores
it on the test split exactly as the pipeline scores every model (`evaluation.evaluate_split`, the same cases):

- `ids`: a mixture of K multinomials over the articles, K = the truth's number of tastes: an outfit's taste z
  ~ pi, its items drawn i.i.d. from phi[z]. It sees ids only, as [None] does (no product types, so it cannot
  know that an outfit holds each type once).
- `types`: the generator's own structure with free parameters: items of distinct product types (from the
  truth, as an article attribute would give them), P(a | t, z) = phi_t[z, a] within each type, and the
  remaining types equally likely for a masked position, as in planted.py. Everything but the K x 3,000
  parameters and pi is the truth's.
- `styles` (planted hidden tastes only, hidden_taste_strength > 0): that structure knowing also each article's
  hidden style h(a) (from the truth, what noiseless article vectors carry): P(a | t, z) = P(h(a) | t, z)
  P(a | h(a), t), a free multinomial over the styles per type and class, and within a (type, style) cell the
  articles by their training count (+ 1), the same for every class, as the generator has it (w[a, z] = pop[a]
  x a style's affinity). The generator's family with the least to estimate: what the vectors allow a learner.

None of them uses the customer context: they are yardsticks for [None] and the bag of items (the optimum without
context). phi is smoothed towards popularity (pseudo-counts `alpha` x an article's training count / K); K
and alpha are chosen on validation; EM stops at the best validation cross-entropy (checked every `--check`
iterations). Fitting the right family is the best case for a learner of this data size, so its gap to the
optimum is about what the data allows, not what a recipe gets wrong.

    python studies/planted_latent_class/planted_latent_class.py --project /tmp/contextual-bert-learning-curve/n150000 \
        --classes 16 64 128 --alphas 1 0.3 --max-iter 80 --run n150000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from contextual_bert.config import EvaluateConfig, ModelConfig
from contextual_bert.data import N_SPECIAL, TRUTH_JSON, load_article_vocab, load_split, load_truth
from contextual_bert.evaluation import evaluate_split, optimum_from_features

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2])
)  # `studies.project`: studies/ is a folder of scripts, not an installed package
from studies.project import record  # noqa: E402


def item_matrix(items: torch.Tensor, n_items: int) -> sp.csr_matrix:
    """(outfits, n_items) 0/1: the outfit's real articles ([UNK] and padding dropped)."""
    real = items >= N_SPECIAL
    rows = torch.arange(items.shape[0])[:, None].expand_as(items)[real].numpy()
    return sp.csr_matrix((np.ones(len(rows)), (rows, items[real].numpy())), shape=(items.shape[0], n_items))


class LatentClass:
    """A mixture of multinomials over articles (item_type None) or over articles within types (item_type)."""

    def __init__(
        self, n_items: int, n_classes: int, item_type: np.ndarray | None, alpha: float, seed: int, counts: np.ndarray,
        cell: np.ndarray | None = None,
    ):  # fmt: skip
        rng = np.random.default_rng(seed)
        self.n_items, self.item_type, self.cell = n_items, item_type, cell
        self.prior = alpha * counts / n_classes  # pseudo-counts towards popularity
        if cell is not None:  # an article's share of its cell by its training count + 1, the same in every class
            real = cell >= 0
            cell_total = np.bincount(cell[real], weights=counts[real] + 1.0)
            self.within = np.where(real, (counts + 1.0) / cell_total[cell.clip(min=0)], 0.0)
        self.log_pi = np.full(n_classes, -np.log(n_classes))
        self.log_phi = self._normalised(self._tied(rng.gamma(1.0, 1.0, (n_classes, n_items))))

    def _tied(self, weights: np.ndarray) -> np.ndarray:
        """With cells: each class's weight of a cell (the sum over its articles) spread over the cell's articles by
        `within`; without: the weights as they are."""
        if self.cell is None:
            return weights
        real = self.cell >= 0
        sums = np.zeros((weights.shape[0], self.cell.max() + 1))
        np.add.at(sums.T, self.cell[real], weights[:, real].T)
        tied = np.zeros_like(weights)
        tied[:, real] = sums[:, self.cell[real]] * self.within[real]
        return tied

    def _normalised(self, weights: np.ndarray) -> np.ndarray:
        weights = weights.copy()
        weights[:, :N_SPECIAL] = 0.0
        if self.item_type is None:
            totals = weights.sum(1, keepdims=True)
        else:  # within each type
            real = self.item_type >= 0
            sums = np.zeros((weights.shape[0], self.item_type.max() + 1))
            np.add.at(sums.T, self.item_type[real], weights[:, real].T)
            totals = np.ones_like(weights)
            totals[:, real] = sums[:, self.item_type[real]]
        with np.errstate(divide="ignore"):
            return np.log(weights / totals)

    def _finite_log_phi(self) -> np.ndarray:
        """log phi with -inf (an article no class draws: whole columns) set to 0, so such an article leaves the
        posterior over classes unchanged."""
        return np.where(np.isfinite(self.log_phi), self.log_phi, 0.0)

    def step(self, x: sp.csr_matrix) -> float:
        """One EM iteration; returns the training log-likelihood per outfit before it."""
        phi = self._finite_log_phi()
        joint = np.asarray(x @ phi.T) + self.log_pi  # (outfits, K)
        top = joint.max(1, keepdims=True)
        log_norm = top + np.log(np.exp(joint - top).sum(1, keepdims=True))
        resp = np.exp(joint - log_norm)
        self.log_pi = np.log(resp.mean(0) + 1e-12)
        self.log_phi = self._normalised(self._tied(np.asarray((x.T @ resp).T) + self.prior))
        return float(log_norm.mean())

    def masked_logits(self, items: torch.Tensor, context=None) -> torch.Tensor:
        """log P(article | the other items), one row per case (its [MASK] position is the target)."""
        phi = torch.from_numpy(self._finite_log_phi())
        known = items >= N_SPECIAL
        per_item = phi.T[items.clamp(min=0)] * known[..., None]  # (B, L, K)
        post = torch.softmax(per_item.sum(1) + torch.from_numpy(self.log_pi), dim=1)
        logits = torch.log(post @ torch.from_numpy(np.exp(self.log_phi)))
        if self.item_type is not None:  # types already in the outfit are excluded
            item_type = torch.from_numpy(self.item_type)
            taken = torch.zeros(len(items), int(item_type.max()) + 1, dtype=torch.bool)
            rows = torch.arange(len(items))[:, None].expand_as(items)[known]
            taken[rows, item_type[items[known]]] = True
            logits = logits.masked_fill(taken[:, item_type.clamp(min=0)], float("-inf"))
        logits[:, :N_SPECIAL] = float("-inf")
        return logits

    def eval(self):
        return self


def fit(kind: str, x, val, n_items, n_classes, item_type, alpha, seed, max_iter, check, cfg, cell=None) -> dict:
    counts = np.asarray(x.sum(0)).ravel()
    model = LatentClass(n_items, n_classes, None if kind == "ids" else item_type, alpha, seed, counts,
                        cell if kind == "styles" else None)  # fmt: skip
    best, best_state, rows = np.inf, None, []
    for it in range(1, max_iter + 1):
        loglik = model.step(x)
        if it % check == 0 or it == max_iter:
            ce = evaluate_split(model, val, cfg, "cpu")[0]["cross_entropy"]
            rows.append({"iteration": it, "train_loglik": loglik, "val_cross_entropy": ce})
            print(kind, n_classes, alpha, it, f"loglik {loglik:.3f} val {ce:.4f}", flush=True)
            if ce < best:
                best, best_state = ce, (model.log_pi.copy(), model.log_phi.copy())
            elif ce > best + 0.02:
                break
    model.log_pi, model.log_phi = best_state
    return {"model": model, "best_val": best, "curve": rows}


def hidden_cells(raw: Path, features: Path, item_type: np.ndarray) -> np.ndarray:
    """(n_items,) each vocabulary article's (type, hidden style) cell, -1 for the specials; from the truth's JSON."""
    about = json.loads((raw / TRUTH_JSON).read_text())
    if "hidden_style" not in about:
        raise SystemExit(f"{raw / TRUTH_JSON}: no hidden style (hidden_taste_strength 0): the kind `styles` needs one")
    truth = load_truth(raw)
    style_of = dict(zip(truth.article_ids.astype(str), about["hidden_style"]))
    ids = load_article_vocab(features).ids
    style = np.array([-1] * N_SPECIAL + [style_of[str(a)] for a in ids[N_SPECIAL:]])
    n_styles = max(about["hidden_style"]) + 1
    return np.where(item_type >= 0, item_type * n_styles + style, -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, required=True, help="a planted project (data/raw, data/features)")
    parser.add_argument("--run", required=True, help="the run's key in the results file")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).with_name("results.json"),
        help="the results file (default: the study's results.json)",
    )
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.3, 1.0, 3.0])
    parser.add_argument("--classes", type=int, nargs="+", default=None, help="K to try; default: the truth's")
    parser.add_argument("--max-iter", type=int, default=60)
    parser.add_argument("--check", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", nargs="+", choices=("ids", "types", "styles"), default=["ids", "types"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    raw, features = args.project / "data/raw", args.project / "data/features"
    truth = load_truth(raw)
    optimum = optimum_from_features(raw, features, with_context=False)
    item_type = optimum.item_type.numpy()
    n_items = len(item_type)
    cell = hidden_cells(raw, features, item_type) if "styles" in args.kinds else None
    max_set_size = ModelConfig().max_set_size
    train, val, test = (load_split(features, s, max_set_size) for s in ("train", "val", "test"))
    x = item_matrix(train.items, n_items)
    cfg = EvaluateConfig()
    result = {
        "project": str(args.project),
        "n_train_outfits": len(train),
        "n_classes": truth.n_tastes,
        "optimum_no_context_test": evaluate_split(optimum, test, cfg, "cpu")[0]["cross_entropy"],
        "fits": {},
    }
    for kind in args.kinds:
        start, fits = time.time(), []
        for k in args.classes or [truth.n_tastes]:
            for alpha in args.alphas:
                run = fit(kind, x, val, n_items, k, item_type, alpha, args.seed, args.max_iter, args.check, cfg, cell)
                fits.append((run["best_val"], (k, alpha), run))
        best_val, (k, alpha), run = min(fits, key=lambda f: f[0])
        metrics = evaluate_split(run["model"], test, cfg, "cpu")[0]
        result["fits"][kind] = {
            "n_classes": k,
            "alpha": alpha,
            "val_cross_entropy": best_val,
            "test": metrics,
            "gap_to_optimum_no_context": metrics["cross_entropy"] - result["optimum_no_context_test"],
            "curves": {f"K={c} alpha={a}": r["curve"] for _, (c, a), r in fits},
            "seconds": round(time.time() - start, 1),
        }
        print(kind, "test", round(metrics["cross_entropy"], 4), "optimum", round(result["optimum_no_context_test"], 4))
    record(args.out, args.run, result)


if __name__ == "__main__":
    main()
