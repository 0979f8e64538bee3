"""The model users load: an MLflow pyfunc that completes a partial outfit for a customer.

A request is a batch of rows. Each row holds ``article_ids`` (the partial outfit: 1 to max_set_size - 1
distinct article ids) and, optionally, the customer's context columns (and the outfit's, e.g. occasion) as
raw values, named as in the data's schema, and, for a model trained with features.history, the customer's
earlier outfits' article ids, the most recent outfit first, an article once per outfit that held it
(``history_article_ids``; the model reads them as often as worn, the most worn first; absent or empty: no history, reported in
missing_features; ids it does not know are reported with the outfit's). The answer per row: the top-k article ids (k from the request's
``top_k`` param, else mlflow.top_k from params.yaml; at most 250) with their probabilities, never an article
of the outfit, and what could not be used: article ids unknown to the model, even without surrounding spaces
or leading zeros (ArticleVocab.to_indices; they enter as the [UNK] item) and context features that were missing or held an unseen value (they enter as their missing/unknown index).

A malformed row (no outfit, too many items, a repeated id, a value that is not an id) refuses the whole
request with one message naming the row; MLflow's scoring server answers it with HTTP 400.

The pyfunc is logged from code (`pyfunc_model.py`), never pickled: its artifacts are the checkpoint and the
features files serving needs, its code the `contextual_bert` package as it was at logging time.

A model with article attributes ("<model>_attrs") recommends from the catalogue, not only from the articles
it was trained on. At load it reads the catalogue bundled at logging time and, when CONTEXTUAL_BERT_CATALOGUE
names an articles table (.parquet, .csv or .jsonl: article_id and the attribute columns, e.g. the new
season's data/validated/articles.parquet; a vector attribute as a list column, or JSON text in a CSV), appends
the articles it does not hold yet: they are scored by their attributes from then on, and may be named in
requests, without retraining (README, Serving).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import mlflow.pyfunc
import numpy as np
import pandas as pd
import torch
from mlflow.pyfunc.model import PythonModel  # mlflow.pyfunc.PythonModel, as mypy can see it

from contextual_bert.data.contract import read_table_file
from contextual_bert.data.feature_spec import N_SPECIAL, PAD_INDEX
from contextual_bert.data.feature_store import CATALOGUE_FEATURE_FILES, MODEL_FEATURE_FILES, load_catalogue
from contextual_bert.data.outfit_encoder import EncodedRows, OutfitEncoder
from contextual_bert.devices import autocast, select_device
from contextual_bert.errors import ContextualBertError

MAX_TOP_K = 250
BATCH_ROWS = 1024  # rows scored per forward pass: bounds memory for large requests
PARALLEL_ROWS = 64  # requests from this many rows on use several torch threads (serving_threads)
OUTPUT_COLUMNS = ("article_ids", "scores", "unknown_article_ids", "missing_features", "unknown_features")
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # src/contextual_bert, shipped with a logged model
PYFUNC_CODE = PACKAGE_DIR / "serving" / "pyfunc_model.py"
CATALOGUE_ENV = "CONTEXTUAL_BERT_CATALOGUE"  # an articles table whose new articles the served model adds


class _ItemsOnly(torch.nn.Module):
    """masked_logits of a model that reads no context, with the outfit as its only input (traceable)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        return self.model.masked_logits(items, {})


class OutfitCompleterCore:
    """Model + vocabularies: request rows in, ranked articles out. No MLflow in here."""

    def __init__(self, model, encoder: OutfitEncoder, device: torch.device):
        self.model = model.to(device).eval()
        # the output layer over the whole catalogue built once, not per request (for an "_attrs" model every
        # article's vector from its attributes; model.ArticleHead.hold): the weights never change here
        self.model.hold_catalogue()
        self.encoder = encoder
        self.article_vocab = encoder.article_vocab
        self._vocab_ids = np.asarray(encoder.article_vocab.ids, dtype=object)  # index -> id, for whole batches
        self.device = device
        self.max_set_size = model.model_cfg.max_set_size
        self.masked_logits = self._traced_masked_logits() if device.type == "cpu" else self.model.masked_logits

    def _traced_masked_logits(self):
        """The model's masked_logits as a TorchScript trace. On the CPU a small request's forward pass is
        a few hundred small ops, and Python's share of each is most of the time: the trace runs them
        without it (one row: 4.6 -> 2.3 ms CPU, measured; the same numbers, tests/serving/test_serving.py).
        Shapes stay free (batch and width are read at run time); the trace keeps no Python check, and
        needs none here: the encoder gives every row exactly one [MASK]. TorchScript is deprecated from
        torch 2.13 on, though still supported: where it goes, serve the module (self.model.masked_logits)."""
        import warnings

        vocab = self.article_vocab.ids
        example = self.encode(pd.DataFrame({"article_ids": [[vocab[N_SPECIAL]], vocab[N_SPECIAL : N_SPECIAL + 2]]}))
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)  # the Python check, left out (above)
            warnings.simplefilter("ignore", DeprecationWarning)  # said above
            items = example.outfits.items.to(self.device)
            context = {k: v.to(self.device) for k, v in example.outfits.context.items()}
            if not context:  # data without context columns: the tracer takes no empty dict, so trace items alone
                traced = torch.jit.trace(_ItemsOnly(self.model), (items,), strict=False, check_trace=False)
                return lambda items, context: traced(items)
            inputs = (items, context)
            traced = torch.jit.trace_module(self.model, {"masked_logits": inputs}, strict=False, check_trace=False)
        return traced.masked_logits

    @classmethod
    def load(
        cls, checkpoint: Path, features_dir: Path, device: str = "auto", catalogue: Path | None = None
    ) -> OutfitCompleterCore:
        """`catalogue`: an articles table whose articles the model does not hold yet are added (attribute
        models only); by default the one CONTEXTUAL_BERT_CATALOGUE names, if any."""
        from contextual_bert.model import load_checkpoint

        torch_device = select_device(device)
        model, _ = load_checkpoint(checkpoint, map_location=torch_device)
        encoder = OutfitEncoder.load(features_dir, model.model_cfg.max_set_size)
        if len(encoder.article_vocab) != model.n_ids:
            raise ContextualBertError(
                f"{features_dir}: the article vocabulary has {len(encoder.article_vocab)} rows, the model {model.n_ids}"
            )
        if model.attributes is not None:
            articles = load_catalogue(features_dir)
            named = catalogue or os.environ.get(CATALOGUE_ENV) or None
            if named is not None:
                path = Path(named)  # .csv, .parquet, ...: its new articles' attributes, vectors included
                articles = articles.extend(read_table_file(path, ("article_id",)), path)
            model.set_catalogue(articles.tensors())
            encoder = OutfitEncoder(articles.vocab, encoder.context, encoder.max_set_size)
        elif catalogue is not None:
            raise ContextualBertError(
                f"model '{model.name}' reads article ids only: it cannot add articles "
                "from a catalogue (train a '<model>_attrs' model)"
            )
        return cls(model, encoder, torch_device)

    def encode(self, rows: pd.DataFrame) -> EncodedRows:
        """Partial outfits with a [MASK] slot to fill, through the model's own vocabularies."""
        return self.encoder.encode(rows, with_mask=True)

    @torch.inference_mode()
    def log_probs(self, items: torch.Tensor, context: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, n_items) log-probabilities of the article to add; -inf for specials and the outfit's articles.

        Rows are scored in groups of one width (up to the last non-padding item), each group cut to that
        width: padding positions cost as much as real ones in every block, and in a mixed request they
        are a third of the positions (measured: a 1,024-row request 35% faster). Padding is hidden from
        attention, so a row's scores do not depend on its group."""
        items = items.to(self.device)
        context = {k: v.to(self.device) for k, v in context.items()}
        positions = torch.arange(1, items.shape[1] + 1, device=self.device)
        widths = ((items != PAD_INDEX) * positions).amax(dim=1)
        groups = widths.unique().tolist()
        if len(groups) == 1:
            return self._log_probs(items[:, : groups[0]], context)
        out = torch.empty((len(items), self.model.n_items), device=self.device)
        for width in groups:
            rows = (widths == width).nonzero().squeeze(1)
            out[rows] = self._log_probs(items[rows, :width], {k: v[rows] for k, v in context.items()})
        return out

    def _log_probs(self, items: torch.Tensor, context: dict[str, torch.Tensor]) -> torch.Tensor:
        with autocast(self.device):
            logits = self.masked_logits(items, context).float()
        # Never recommend what the outfit holds; [UNK] and the other specials are already -inf.
        logits.scatter_(1, items, float("-inf"))
        return torch.log_softmax(logits, dim=1)

    def recommend(self, rows: pd.DataFrame, top_k: int) -> pd.DataFrame:
        if not 1 <= int(top_k) <= MAX_TOP_K:
            raise ContextualBertError(f"top_k must be between 1 and {MAX_TOP_K}, got {top_k}")
        # first: a request without 'article_ids' is refused even when empty, for MLflow's schema check drops
        # the columns it does not know, so a list body or a frame of unnamed columns arrives with no rows
        request = self.encode(rows)
        if len(rows) == 0:
            return pd.DataFrame({c: pd.Series([], dtype=object) for c in OUTPUT_COLUMNS})
        items, context = request.outfits.items, request.outfits.context
        k = min(int(top_k), len(self.article_vocab) - N_SPECIAL)
        ids, scores = [], []
        for start in range(0, len(rows), BATCH_ROWS):
            stop = start + BATCH_ROWS
            log_probs = self.log_probs(items[start:stop], {n: t[start:stop] for n, t in context.items()})
            top = torch.topk(log_probs, k, dim=1)
            # Whole batches at once: ids by fancy indexing, probabilities by one exp. A row with fewer
            # candidates than k (a tiny vocabulary) drops its excluded, -inf ones.
            values, indices = top.values.cpu().numpy(), top.indices.cpu().numpy()
            kept = np.isfinite(values)
            batch_ids, batch_scores = self._vocab_ids[indices], np.exp(values.astype(np.float64))
            if kept.all():
                ids += batch_ids.tolist()
                scores += batch_scores.tolist()
            else:
                ids += [row[keep].tolist() for row, keep in zip(batch_ids, kept)]
                scores += [row[keep].tolist() for row, keep in zip(batch_scores, kept)]
        return pd.DataFrame(
            {
                "article_ids": ids,
                "scores": scores,
                "unknown_article_ids": request.unknown_article_ids,
                "missing_features": request.missing_features,
                "unknown_features": request.unknown_features,
            }
        )


# --- the MLflow pyfunc -----------------------------------------------------------------------------------


class OutfitCompleter(PythonModel):
    """The pyfunc: loads the core from the model's artifacts; turns bad input into MLflow's HTTP 400."""

    def load_context(self, context):
        artifacts = context.artifacts
        features_dir = Path(artifacts["article_vocab"]).parent
        self.settings = json.loads(Path(artifacts["settings"]).read_text())
        self.core = OutfitCompleterCore.load(Path(artifacts["checkpoint"]), features_dir)

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None):
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

        top_k = (params or {}).get("top_k")
        top_k = self.settings["top_k"] if top_k is None else top_k  # a JSON null is no value: the default
        if not isinstance(model_input, pd.DataFrame):
            model_input = pd.DataFrame(model_input)
        try:
            with cpu_threads(self.core.device, serving_threads(len(model_input))):
                return self.core.recommend(model_input, int(top_k))
        except ContextualBertError as exc:
            raise MlflowException(str(exc), error_code=INVALID_PARAMETER_VALUE) from None


def serving_threads(rows: int) -> int:
    """Torch CPU threads for a request of `rows` rows.

    Below PARALLEL_ROWS, one: a small request is a few small matrix products, and threads only add
    hand-offs. From PARALLEL_ROWS on, CONTEXTUAL_BERT_SERVING_THREADS (default 1): more threads split a
    large forward pass, but they wait for each other, and on a machine with other work they lose badly
    (on the shared 2-core machine at load 3-4, in process, 1,024 rows: 2 threads 309 rows/s,
    reports/benchmarks/serving_2threads.json, against 1,960 with 1 thread in the same conditions; serving.json
    has the current one-thread numbers). Set it on a machine of its own; scale a server out with workers
    (`mlflow models serve --workers N`) otherwise.
    """
    if rows < PARALLEL_ROWS:
        return 1
    value = os.environ.get("CONTEXTUAL_BERT_SERVING_THREADS", "1")
    try:
        return max(1, int(value))
    except ValueError:
        raise ContextualBertError(f"CONTEXTUAL_BERT_SERVING_THREADS must be a whole number, got '{value}'") from None


@contextmanager
def cpu_threads(device: torch.device, n: int):
    """Run the body with n torch threads on the CPU, restoring the caller's setting after."""
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def signature(spec, top_k: int):
    """Input: article_ids + every context feature, all Any and none required of MLflow (the model requires
    article_ids); output: OUTPUT_COLUMNS; param top_k."""
    from mlflow.models import ModelSignature
    from mlflow.types import DataType
    from mlflow.types.schema import AnyType, Array, ColSpec, ParamSchema, ParamSpec, Schema, TensorSpec

    # Every input is declared Any and checked where it is read, by one rule in and out of the scoring server:
    # the outfit by outfit_encoder.outfit_ids_of (not a list, empty, a repeated or odd id: a one-line error
    # naming the row, HTTP 400), a context value by the encoder (a plain string is a one-value list; a value
    # it cannot use, such as a word or true/false for a number, is reported per row as unknown). A typed
    # column is enforced by MLflow before predict, differently per path: over HTTP it casts true to 1.0 and
    # refuses a word with a 400 naming no row, in process it refuses "30" (the scoring server accepts it),
    # and its message dumps the whole frame. Checking costs too: MLflow checks Array(string) by building a
    # pandas Series per cell (60% of a 1,024-row request), and even Array(Any) cell by cell, twice over
    # HTTP (list columns Any: the server's CPU for 1,024 rows 219 -> 174 ms, commit 264682a). The kinds are
    # kept in the model's metadata (log_pyfunc_model). Nor does MLflow require article_ids: its refusal of a
    # request without the column (or of a list or an empty body, which it reads as a frame without it) dumps
    # the frame and the whole schema; the encoder's is one line naming the column.
    inputs: list[ColSpec | TensorSpec] = [
        ColSpec(AnyType(), name, required=False) for name in ("article_ids", *(f.request_column for f in spec.features))
    ]
    outputs: list[ColSpec | TensorSpec] = [
        ColSpec(Array(DataType.string), "article_ids"),
        ColSpec(Array(DataType.double), "scores"),
        ColSpec(Array(DataType.string), "unknown_article_ids"),
        ColSpec(Array(DataType.string), "missing_features"),
        ColSpec(Array(DataType.string), "unknown_features"),
    ]
    params = ParamSchema([ParamSpec("top_k", DataType.long, int(top_k))])
    return ModelSignature(inputs=Schema(inputs), outputs=Schema(outputs), params=params)


def feature_kinds(spec) -> dict[str, str]:
    """Each context input's kind (categorical, multi_categorical, numeric): what the Any-typed signature
    cannot say, kept in the logged model's metadata (MLmodel)."""
    return {f.request_column: f.kind for f in spec.features}


def pip_requirements() -> list[str]:
    from importlib.metadata import version

    return [
        f"{name}=={version(name)}" for name in ("mlflow", "torch", "numpy", "pandas", "pyarrow", "pydantic", "pyyaml")
    ]


def _package_copy(tmp: Path) -> Path:
    """The contextual_bert package without caches: shipped with the model so it loads the code it was
    logged with."""
    target = tmp / "contextual_bert"
    shutil.copytree(PACKAGE_DIR, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


def log_pyfunc_model(
    checkpoint: Path,
    features_dir: Path,
    *,
    model_name: str,
    top_k: int,
    model_id: str | None = None,
    input_example: pd.DataFrame | None = None,
):
    """Log the pyfunc (from code) with its artifacts and signature; MLflow's ModelInfo.

    With `model_id` the files go into that existing LoggedModel (created with its source run), so the
    training run's status is never touched.
    """
    from contextual_bert.data.feature_store import load_spec

    spec = load_spec(features_dir)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        settings = tmp / "settings.json"
        settings.write_text(json.dumps({"top_k": int(top_k)}))
        artifacts = {"checkpoint": str(checkpoint), "settings": str(settings)}
        for name in MODEL_FEATURE_FILES:  # keyed by stem: "article_vocab", "context_vocab", "spec", "manifest"
            artifacts[Path(name).stem] = str(Path(features_dir) / name)
        for name in CATALOGUE_FEATURE_FILES:  # the catalogue, where the article attributes are on
            if (Path(features_dir) / name).exists():
                artifacts[Path(name).stem] = str(Path(features_dir) / name)
        for path in artifacts.values():
            if not Path(path).exists():
                raise ContextualBertError(f"{path}: not found; the served model needs it")
        return mlflow.pyfunc.log_model(
            name=model_name,
            python_model=str(PYFUNC_CODE),
            artifacts=artifacts,
            code_paths=[str(_package_copy(tmp))],
            signature=signature(spec, top_k),
            input_example=input_example,
            pip_requirements=pip_requirements(),
            metadata={"context_features": feature_kinds(spec)},
            model_id=model_id,
        )


def example_request(features_dir: Path, n_rows: int = 2) -> pd.DataFrame:
    """A request built from real articles of the vocabulary, context left to the caller (all optional)."""
    from contextual_bert.data.feature_store import load_article_vocab

    vocab = load_article_vocab(features_dir)
    real = vocab.ids[N_SPECIAL:]
    rows = [{"article_ids": real[i : i + 2]} for i in range(0, 2 * n_rows, 2)]
    return pd.DataFrame(rows)
