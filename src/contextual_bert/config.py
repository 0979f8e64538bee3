"""The one configuration model, loaded from params.yaml and validated at start.

Each pipeline stage reads its own section (as in iterative/example-get-started), so DVC re-runs a stage
only when its section changes. Unknown keys are errors: a typo in params.yaml must not pass silently.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, ClassVar, Literal

import yaml
from pydantic import AfterValidator, ConfigDict, Field, ValidationError, model_validator

from contextual_bert.config_sources import (  # noqa: F401 - the sources' sections, read through the config
    AttributeKindName,
    GenerateConfig,
    GeneratorSize,
    ImportHMConfig,
    ImportSetsConfig,
    IngestConfig,
    PlantedConfig,
    Section,
)
from contextual_bert.errors import ContextualBertError
from contextual_bert.names import (  # noqa: F401 - the model names, read through the config by most modules
    ATTRIBUTE_MODELS,
    ATTRIBUTES_SUFFIX,
    BASELINE_MODELS,
    CHECKPOINT_FILE,
    CONTEXT_FREE,
    CURVE_FILE,
    LAST_FILE,
    METRICS_FILE,
    MODELS,
    NOT_APPLICABLE,
    OWN_VARIANTS,
    PAPER_VARIANTS,
    VARIANTS,
    base_model,
    uses_attributes,
)


def _distinct(values: list) -> list:
    repeated = sorted({str(v) for v in values if values.count(v) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} listed more than once")
    return values


Positive = Annotated[int, Field(ge=1)]


def _refuse_renamed(prefix: str, renamed: dict[str, str], values: object) -> object:
    """A section's raw values, refused when they set a key by its old name (`renamed`: old -> new): one line
    naming both, not pydantic's "extra inputs are not permitted"."""
    for old in sorted(renamed.keys() & (values.keys() if isinstance(values, dict) else set())):
        raise ValueError(f"{prefix}{old} is now {prefix}{renamed[old]}")
    return values


def recall_k(metric: str) -> int:
    """K of a 'recall@K' metric name; the promotion test is defined on per-case hit@K."""
    match = re.fullmatch(r"recall@(\d+)", metric)
    if not match or int(match.group(1)) < 1:
        raise ContextualBertError(f"promote.metric '{metric}' is not recall@K (the paired test compares hits@K)")
    return int(match.group(1))


ATTRIBUTE_SETTINGS = ("id_dropout", "attribute_overlap")  # settings only the "_attrs" models read: set per model
ENCODER_SETTINGS = ("bag_warmup_epochs", "bag_warmup_check_steps")  # train settings only the paper's encoders read
InitEmbeddings = Literal["random", "cooccurrence"]  # how the article-id embeddings start (cooccurrence.py)
# how the logits start: random, or as the counts (count_start.py); auto: counts on sparse data (training/sparse.py)
InitOutput = Literal["random", "counts", "auto"]
# an "_attrs" model's id dropout: a rate, or "auto", the validation articles' share without an id (training.id_dropout_rate)
IdDropout = Annotated[float, Field(ge=0, lt=1)] | Literal["auto"]
Softmax = Literal["full", "sampled"]  # the training loss's output layer (training.NegativeSampler)
ModelName = Literal[MODELS]  # type: ignore[valid-type]  # a model name, as pydantic validates it (Literal[("a", "b")] is Literal["a", "b"])


class PathsConfig(Section):
    raw_dir: Path = Path("data/raw")
    validated_dir: Path = Path("data/validated")
    quarantine_dir: Path = Path("data/quarantine")
    features_dir: Path = Path("data/features")
    models_dir: Path = Path("models")
    reports_dir: Path = Path("reports")
    source_fingerprint: Path = Path("data/source.json")  # the `source` stage's output, which ingest depends on


class ValidateConfig(Section):
    max_quarantine_share: float = Field(0.05, ge=0, le=1)


class HistoryConfig(Section):
    """The customer's history as a context feature (history.py: which earlier outfits; feature_store: how it is
    stored). Off: data/features is exactly what it was without it."""

    enabled: bool = False
    max_items: int = Field(100, ge=1)  # history slots: earlier articles, as often as worn, the most worn first
    dim: int = Field(64, ge=1)  # its share of d_context: the pooled article vectors projected to this width


class DerivedVectorConfig(Section):
    """An article vector derived from the catalogue's text (features.derived_vectors; data/vectors.TextVectors)."""

    columns: Annotated[list[str], Field(min_length=1), AfterValidator(_distinct)]  # text columns of the articles
    dim: int = Field(64, ge=1)  # the vector's length: the SVD's components (fewer when there are fewer words)


class FeaturesConfig(Section):
    # hash: a keyed hash of the outfit id (features.py). time: the earliest outfits train, the latest validate
    # and test (cut dates by share), so no training outfit comes from the evaluated period; needs dates.
    split: Literal["hash", "time"] = "hash"
    history: HistoryConfig = HistoryConfig()
    min_article_count: int = Field(1, ge=1)
    val_fraction: float = Field(0.08, gt=0, lt=0.5)
    test_fraction: float = Field(0.08, gt=0, lt=0.5)
    split_seed: int = 0
    numeric_buckets: int = Field(10, ge=2)
    max_multi_values: int = Field(8, ge=1)
    min_context_count: int = Field(2, ge=1)  # rarer context values (counted on train rows) -> unknown
    # Guards before training: every split needs this many outfits and targets whose article is in the
    # train vocabulary (a target outside it cannot be learned or ranked).
    min_split_outfits: int = Field(10, ge=1)
    min_known_targets: int = Field(10, ge=1)
    default_dim: int = Field(16, ge=1)
    embedding_dims: dict[str, Positive] = {}  # feature name -> embedding dim; others get default_dim
    # Article attributes (issue 14), per data source (the `source` of data/raw/schema.json): column of the
    # articles table -> kind. Encoded for every article of the catalogue only when `article_features` is on
    # (off: data/features is exactly what it was before, and the paper's models with it).
    article_features: bool = False
    article_attributes: dict[str, dict[str, AttributeKindName]] = {}
    # Attributes of kind text (a product's name or description; feature_store.text_words): a word on fewer
    # train articles than this maps to UNKNOWN; an article keeps its first max_text_words distinct words.
    min_text_count: int = Field(2, ge=1)
    max_text_words: int = Field(32, ge=1)
    # Attributes of kind vector (data/vectors.py): attribute -> l2, each article's vector scaled to length 1;
    # none (or unlisted): as read. Either way all are then scaled by one number to a mean length of 1.
    vector_normalize: dict[str, Literal["none", "l2"]] = {}
    # Vectors made here from the catalogue's own text columns (TF-IDF + truncated SVD over every article of
    # the catalogue): attribute -> its columns and width; declare the attribute as `vector` to read it.
    derived_vectors: dict[str, DerivedVectorConfig] = {}


class ModelConfig(Section):
    d_model: int = Field(128, ge=1)
    n_blocks: int = Field(4, ge=1)
    n_heads: int = Field(8, ge=1)
    d_ff: int = Field(256, ge=1)
    dropout: float = Field(0.1, ge=0, lt=1)
    max_set_size: int = Field(8, ge=2)
    # ContextualBert only, a path without parameters from the rest of the outfit to the masked position
    # (model.other_articles_mean, the bag of items' own state): "input", every position's input also gets the
    # mean of the outfit's other articles' input vectors; "output", the head state at a predicted position gets
    # the mean of the other articles' (tied) output vectors, so the logits start as a tied bag of items' and
    # the encoder learns what a bag cannot.
    bag_path: Literal["none", "input", "output"] = "none"
    # How a model reads features.history; nothing without it (docs/history.md, "How a model reads it", for the
    # measurements behind the defaults). history_pooling: its share of c, the "mean" of the history's article
    # vectors (model.HistoryPooling) or "attention" with a learned query per head and a null slot
    # (model.HistoryAttentionPooling: no better, measured). history_repeat: a learned logit offset for a
    # candidate the history holds (model.HistoryRepeat). history_bag, ContextualBert only: the head state at a
    # masked position also gets g times the mean of the history's (tied) output vectors, g learned from 0
    # (ContextualBert.history_state): the history read as the bag of items reads the outfit.
    history_pooling: Literal["mean", "attention"] = "mean"
    history_repeat: bool = True
    history_bag: bool = True
    # "_attrs" models only, set per model (per_model.<model>_attrs.attribute_overlap): a learned logit offset per
    # attribute value for a candidate whose value another article of the outfit already has
    # (model.readers.AttributeOverlap)
    attribute_overlap: bool = True

    @model_validator(mode="after")
    def _heads_divide_d_model(self):  # found at load, not at the first training's model build
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model ({self.d_model}) is not divisible by model.n_heads ({self.n_heads})")
        return self


class TrainConfig(Section):
    # an old name -> its new one: refused
    RENAMED: ClassVar[dict[str, str]] = {"warmup_steps": "lr_warmup_steps", "variants": "models"}
    # each at least once, never twice (a stage per model and seed); OWN_VARIANTS and the "_attrs" models only
    # when listed
    models: Annotated[list[ModelName], Field(min_length=1), AfterValidator(_distinct)] = [
        *PAPER_VARIANTS,
        *BASELINE_MODELS,
    ]
    seeds: Annotated[list[int], Field(min_length=1), AfterValidator(_distinct)] = [0, 1, 2]
    batch_size: int = Field(64, ge=1)
    max_epochs: int = Field(32, ge=1)
    learning_rate: float = Field(2e-3, gt=0)
    weight_decay: float = Field(0.3, ge=0)
    lr_warmup_steps: int = Field(200, ge=0)  # the learning rate's linear warm-up (not the bag's: bag_warmup_*)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"  # after warm-up, down to min_lr_fraction
    min_lr_fraction: float = Field(0.0, ge=0, le=1)  # ... of learning_rate, reached at max_epochs
    grad_clip: float = Field(1.0, ge=0)  # global gradient norm; 0: no clipping
    patience: int = Field(10, ge=1)
    # the epoch's validation reads at most this many validation outfits, a fixed evenly spaced sample (0: all),
    # and its training probe (the training split's cross-entropy, a diagnostic) at most probe_outfits training
    # outfits, 0: none: on a large catalogue both rank every article, and would otherwise cost more than the
    # epoch's sampled-softmax training; the probe alone cost a default training 9% (docs/decisions.md)
    validation_outfits: int = Field(4000, ge=0)
    probe_outfits: int = Field(0, ge=0)
    mask_prob: float = Field(0.3, ge=0, le=1)  # per item; at least one item per outfit is always masked
    mask_token_prob: float = Field(0.8, ge=0, le=1)  # BERT 80/10/10: of masked items, replaced by [MASK]
    random_token_prob: float = Field(0.1, ge=0, le=1)  # ... by a random article (rest kept as is)
    # "_attrs" models only: the share of real articles whose id embedding a training step replaces by the
    # [UNK] row, at the input positions and the output rows (model.ArticleAttributes.ids). Set per model in
    # params.yaml (per_model.<model>_attrs.id_dropout), never here: DVC then tracks it for those models alone.
    # "auto": the share of the validation outfits' articles that have no id (unseen in training), so training
    # meets [UNK] as often as evaluation does (docs/encoder_recipe.md).
    id_dropout: IdDropout = 0.0
    # How the article-id embeddings start: random, or the training outfits' co-occurrence (cooccurrence.py;
    # for sparse data, where the encoder otherwise stays at popularity: docs/training.md).
    init_embeddings: InitEmbeddings = "random"
    # How the output bias starts: "random" (at 0), or "counts": at the training split's log-popularity, so that a
    # model starts at about the popularity yardstick (with a history: popularity + own history) and its learned
    # scores, small and random at the start either way, add to it (count_start.py; docs/training.md).
    init_output: InitOutput = "auto"
    # s: after every step an article id's embedding row shrinks by 1 - lr * s / n^2, n its training count, on top
    # of weight_decay, so that the ids of articles seen once or twice are not learned by heart (0: off;
    # training.regularisers.RareIdDecay)
    rare_id_decay: Annotated[float, Field(ge=0)] | Literal["auto"] = "auto"
    # auto (init_output, rare_id_decay): the sparse recipe (counts, 5) when more than this share of the articles
    # seen in training are seen at most twice, else random and 0 (training/sparse.py)
    sparse_share: float = Field(0.5, gt=0, le=1)
    # The training loss's softmax: over every article (full), or over the step's masked targets plus
    # `negatives` articles drawn by popularity, shared by the batch, with the log-Q correction
    # (training.NegativeSampler; docs/sampled_softmax.md). Evaluation always ranks every article.
    softmax: Softmax = "sampled"
    negatives: int = Field(1024, ge=1)  # sampled: popularity draws per step (with replacement)
    # models with features.history: the share of a training outfit's history articles a step leaves out, so
    # that a history is read as tastes, not as a fingerprint of the customer whose training outfits the model
    # could then learn by heart (docs/history.md); without a history feature it draws nothing
    history_dropout: float = Field(0.0, ge=0, lt=1)
    # The paper's encoders only (ENCODER_SETTINGS): a warm-up from the bag of items. For the first N epochs the
    # training loss's head state also gets w * the mean of the outfit's other articles' vectors
    # (ContextualBert.bag_state), w = 1 in epoch 1 falling linearly to 0 at epoch N + 1; from then on, and in
    # every evaluation, the model is the paper's. On weak-signal data the encoder otherwise stays at popularity
    # (docs/encoder_recipe.md).
    bag_warmup_epochs: int = Field(2, ge=0)
    # With a number S the warm-up runs only for an encoder that is stuck: at the end of the first epoch with at
    # least S steps, the outfit dependence on validation (ranking.STUCK_BELOW, Table 1's **stuck**) decides; a
    # stuck encoder gets the warm-up's N epochs from the next epoch on, any other trains on as the paper's
    # model, its training unchanged to the bit. None: the warm-up always runs, from epoch 1.
    bag_warmup_check_steps: int | None = Field(400, ge=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # torch threads a training computes with: a recorded setting (a DVC param, part of the run's key), never the
    # machine's default, since the split of a reduction over threads changes its rounding (docs/reproducibility.md)
    num_threads: int = Field(1, ge=1)
    # the CPU kernels: "avx2" asks ATen, MKL (MKL_CBWR) and oneDNN for their AVX2 code path, so that x86 CPUs
    # with and without AVX-512 give the same bits; "native": the widest the CPU has; "auto": the one measured
    # fastest on this CPU model, avx2 where none was (cpu_kernels.FASTEST): the same bits per CPU model
    cpu_kernels: Literal["auto", "avx2", "native"] = "auto"
    # within an epoch, last.pt is written at most this often (seconds; 0: at epochs' ends only), so that a run
    # killed mid-epoch resumes where it stopped; the results do not depend on it
    checkpoint_every_s: float = Field(60.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _no_old_names(cls, values: object) -> object:
        return _refuse_renamed("train.", cls.RENAMED, values)

    def read_by(self, model: str, exclude: frozenset[str] | set[str] = frozenset()) -> dict:
        """The settings `model` trains with, as a dict: without ATTRIBUTE_SETTINGS for a model without
        attributes, which never reads them, without ENCODER_SETTINGS for a bag, and without `negatives` under
        the full softmax."""
        skip = set(exclude) | (set() if uses_attributes(model) else set(ATTRIBUTE_SETTINGS))
        skip |= set(ENCODER_SETTINGS) if base_model(model) in BASELINE_MODELS else set()
        if self.softmax == "full":  # the negatives are drawn by the sampled softmax only
            skip.add("negatives")
        return self.model_dump(mode="json", exclude=skip)


class ModelOverrides(Section):
    """Per-model overrides of train settings (`per_model.<model>`); its own params key so DVC re-runs only that
    model."""

    learning_rate: float | None = None
    batch_size: int | None = None
    max_epochs: int | None = None
    weight_decay: float | None = None
    dropout: float | None = None
    id_dropout: IdDropout | None = None  # "_attrs" models only (TrainConfig.id_dropout)
    attribute_overlap: bool | None = None  # "_attrs" models only (ModelConfig.attribute_overlap)
    init_embeddings: InitEmbeddings | None = None
    softmax: Softmax | None = None
    negatives: int | None = Field(None, ge=1)
    bag_warmup_epochs: int | None = Field(None, ge=0)  # the encoders only (TrainConfig.bag_warmup_epochs)
    bag_warmup_check_steps: int | None = Field(None, ge=1)  # the encoders only (TrainConfig.bag_warmup_check_steps)


SweepKey = Literal["learning_rate", "dropout", "weight_decay", "batch_size", "init_embeddings"]
SweepValue = float | InitEmbeddings  # init_embeddings takes its names (random | cooccurrence), the others numbers


class SweepConfig(Section):
    """The per-model sweep (flows/sweep.py through DVC experiments): every combination of `grid` for every
    model, one seed, chosen on validation cross-entropy; the choice is written to `per_model:`."""

    RENAMED: ClassVar[dict[str, str]] = {"variants": "models"}  # an old name -> its new one: refused
    seed: int = 0  # one of train.seeds: each setting trains train@<model>-<seed>
    models: list[ModelName] = []  # empty: train.models
    grid: dict[SweepKey, list[SweepValue]] = {"learning_rate": [5e-4, 1e-3, 2e-3, 3e-3, 5e-3]}
    # a model's own grid instead of `grid` (e.g. the bags of items, cheap to train, whose best rates lie
    # higher than the transformers'); the same keys
    grids: dict[ModelName, dict[SweepKey, list[SweepValue]]] = {}

    @model_validator(mode="before")
    @classmethod
    def _no_old_names(cls, values: object) -> object:
        return _refuse_renamed("sweep.", cls.RENAMED, values)


class FitbConfig(Section):
    """Fill-in-the-blank (fitb.py): each test outfit's items blanked in turn, the blank among n_candidates
    (itself and negatives not in the outfit, drawn with `seed`): easy, negatives of any article; hard, of the
    blank's value of the first of hard_attributes that the catalogue has (single-valued)."""

    enabled: bool = True
    n_candidates: int = Field(4, ge=2)
    seed: int = 0
    hard_attributes: list[str] = ["product_type", "category"]


class EvaluateConfig(Section):
    ks: Annotated[list[Positive], Field(min_length=1), AfterValidator(_distinct)] = [1, 5, 10, 50, 250]
    batch_size: int = Field(1024, ge=1)
    # The attribute-aware popularity yardstick (with features.article_features on): popularity among the
    # articles whose value of this attribute is not yet in the outfit, and within the value for unseen articles.
    popularity_attribute: str | None = "product_type"
    fitb: FitbConfig = FitbConfig()  # fill-in-the-blank accuracy beside the full ranking (fitb.py)


class MlflowConfig(Section):
    tracking_uri: str = "sqlite:///mlflow.db"  # MLFLOW_TRACKING_URI overrides
    experiment: str = "contextual-bert"
    model_name: str = "outfit-completion"
    top_k: int = Field(10, ge=1, le=250)


class PromoteConfig(Section):
    # recall@K only: promotion runs a paired test on per-case hits@K (registry.py).
    metric: str = Field("recall@5", pattern=r"^recall@[1-9][0-9]*$")
    margin: float = Field(0.0, ge=0)  # the candidate's recall@K must exceed the champion's by more than this
    alpha: float = Field(0.05, gt=0, lt=1)  # ... and the one-sided McNemar p-value be below this


class Config(Section):
    paths: PathsConfig = PathsConfig()
    ingest: IngestConfig = IngestConfig()
    generate: GenerateConfig = GenerateConfig()
    planted: PlantedConfig = PlantedConfig()
    import_hm: ImportHMConfig = ImportHMConfig()
    import_sets: ImportSetsConfig = ImportSetsConfig()
    validate_: ValidateConfig = Field(ValidateConfig(), alias="validate")
    features: FeaturesConfig = FeaturesConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    per_model: dict[ModelName, ModelOverrides] = {m: ModelOverrides() for m in PAPER_VARIANTS + BASELINE_MODELS}
    sweep: SweepConfig = SweepConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    mlflow: MlflowConfig = MlflowConfig()
    promote: PromoteConfig = PromoteConfig()

    RENAMED: ClassVar[dict[str, str]] = {"variants": "per_model"}  # an old top-level key -> its new one: refused
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, protected_namespaces=())

    @model_validator(mode="before")
    @classmethod
    def _no_old_names(cls, values: object) -> object:
        return _refuse_renamed("", cls.RENAMED, values)

    @model_validator(mode="after")
    def _attribute_settings_per_model(self):
        # The trainings' DVC params are train's keys plus their own per_model.<model>: a setting only the
        # "_attrs" models read lives in their own keys, so changing it never re-runs the paper's models.
        for name in ATTRIBUTE_SETTINGS:
            section = "train" if name in TrainConfig.model_fields else "model"
            if name in getattr(self, section).model_fields_set:
                raise ValueError(
                    f"{section}.{name}: set it per model, per_model.<model>_attrs.{name} (only the "
                    "models with article attributes read it)"
                )
            for model, overrides in self.per_model.items():
                if getattr(overrides, name) is not None and not uses_attributes(model):
                    raise ValueError(
                        f"per_model.{model}.{name}: only the models with article attributes "
                        f"('{model}{ATTRIBUTES_SUFFIX}') read it"
                    )
        return self

    @model_validator(mode="after")
    def _outfit_sizes_agree(self):
        if self.ingest.min_set_size > self.model.max_set_size:
            raise ValueError(
                f"ingest.min_set_size ({self.ingest.min_set_size}) is above model.max_set_size "
                f"({self.model.max_set_size})"
            )
        return self

    @model_validator(mode="after")
    def _promotion_metric_is_evaluated(self):
        # found at load, not when the promote stage finds no version evaluated on it (the sweep, a tool of
        # its own, checks its settings when it runs)
        k = recall_k(self.promote.metric)  # its pattern was checked with the field
        if k not in self.evaluate.ks:
            raise ValueError(
                f"promote.metric {self.promote.metric}: evaluate.ks {self.evaluate.ks} has no {k}, so no "
                "evaluation computes it"
            )
        return self

    @model_validator(mode="after")
    def _overrides_within_bounds(self):
        # train_for / model_for apply overrides by copying, which checks nothing: check them here, against
        # TrainConfig's and ModelConfig's own bounds (a negative learning rate, a dropout of 1.5)
        for model in self.per_model:
            for settings in (self.train_for(model), self.model_for(model)):
                try:
                    type(settings).model_validate(settings.model_dump())
                except ValidationError as exc:
                    error = exc.errors()[0]
                    raise ValueError(f"per_model.{model}.{error['loc'][0]}: {error['msg']}") from None
        return self

    def run_dir(self, model: str, seed: int) -> Path:
        """Where one training run (model, seed) keeps its checkpoints and curve."""
        return self.paths.models_dir / f"{model}-s{seed}"

    def train_metrics_path(self, model: str, seed: int) -> Path:
        """The training's result as a DVC metric (`dvc exp show`, the sweep): a copy of the run's metrics.json."""
        return self.paths.reports_dir / "train" / f"{model}-s{seed}.json"

    def eval_path(self, name: str) -> Path:
        """Where the evaluation of one run ("<model>-s<seed>") or of a yardstick is written."""
        return self.paths.reports_dir / "eval" / f"{name}.json"

    def fitb_questions_path(self) -> Path:
        """The fill-in-the-blank questions of the test split (fitb.py), as article ids: the baseline stage's."""
        return self.paths.reports_dir / "eval" / "fitb_questions.csv"

    def train_for(self, model: str) -> TrainConfig:
        """Train settings for one model, its overrides (`per_model.<model>`) applied."""
        overrides = self.per_model.get(model, ModelOverrides()).model_dump(exclude_none=True)
        return self.train.model_copy(update={k: v for k, v in overrides.items() if k in TrainConfig.model_fields})

    def model_for(self, model: str) -> ModelConfig:
        """Model settings for one model, its overrides (`per_model.<model>`) applied."""
        overrides = self.per_model.get(model, ModelOverrides()).model_dump(exclude_none=True)
        update = {k: v for k, v in overrides.items() if k in ModelConfig.model_fields}
        return self.model.model_copy(update=update) if update else self.model


def load_config(path: str | Path = "params.yaml") -> Config:
    """Load and validate params.yaml; a missing, unreadable or invalid file is a one-line error."""
    path = Path(path)
    if not path.exists():
        raise ContextualBertError(f"{path}: params file not found")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:  # its text spans lines: the problem and where, on one
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ContextualBertError(f"{path}{where}: not valid YAML ({problem})") from None
    except UnicodeDecodeError as exc:
        raise ContextualBertError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ContextualBertError(f"{path}: cannot be read ({exc.strerror})") from None
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        if first["type"] == "value_error":  # one of this module's checks: named where it does not name itself
            message = str(first["ctx"]["error"])
            raise ContextualBertError(f"{path}: {f'{where!r}: ' if where not in message else ''}{message}") from None
        raise ContextualBertError(
            f"{path}: '{where}': {first['msg']} ({exc.error_count()} problem(s) in all)"
        ) from None
