"""The sources' sections of params.yaml (`ingest`, `generate`, `planted`, `import_hm`, `import_sets`) and the base
every section of the one configuration shares; `config.py` composes them into `Config`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GeneratorSize(Section):
    n_outfits: int = Field(gt=0)
    n_articles: int = Field(gt=0)
    n_customers: int = Field(gt=0)


VECTOR_FILE_SUFFIXES = (".parquet", ".npy")


class VectorFileConfig(Section):
    """A file of article vectors (ingest.article_vectors), keyed by article id: Parquet with an id column and a
    list column, or .npy (one row per article) with its ids in a text file beside it, one a line, row for row."""

    path: Path
    id_column: str = "article_id"  # Parquet: the article id column
    column: str = "vector"  # Parquet: the list<float> column
    ids: Path | None = None  # .npy: its ids file; by default beside it, data/clip.npy's data/clip.ids.txt

    @model_validator(mode="after")
    def _known_format(self):
        if self.path.suffix not in VECTOR_FILE_SUFFIXES:
            raise ValueError(f"{self.path}: a vectors file is {' or '.join(VECTOR_FILE_SUFFIXES)}")
        return self

    @property
    def ids_path(self) -> Path:
        return self.ids or self.path.with_suffix(".ids.txt")


class IngestConfig(Section):
    source: str = "synthetic"  # a name in contextual_bert.data.sources.SOURCES (checked there: sources.chosen)
    # The smallest outfit generated, imported or valid (the largest: model.max_set_size). Here, not under
    # `model`: only ingest and validate read it, and the trainings (which list `model`) need not re-run.
    min_set_size: int = Field(4, ge=1)
    # Article vectors from files of their own (CLIP, a sentence embedding): attribute -> its file, joined into
    # the articles table as that column after any source's ingest (data/vector_files.py); declare the attribute
    # as `vector` under features.article_attributes. Here, as the source's files are: ingest reads them, and the
    # `source` stage fingerprints them (a changed file re-runs ingest).
    article_vectors: dict[str, VectorFileConfig] = {}


class GenerateConfig(Section):
    size: str = "default"
    seed: int = 0
    # how strongly a customer's hidden favourite brand and colour (in no table) weigh: x(1 + 2s), x(1 + s);
    # 0: none, the article draws as without them (generator.py's docstring)
    customer_taste_strength: float = Field(1.0, ge=0)
    sizes: dict[str, GeneratorSize] = {
        "tiny": GeneratorSize(n_outfits=2_000, n_articles=400, n_customers=300),
        "default": GeneratorSize(n_outfits=6_000, n_articles=600, n_customers=1_500),
        "paper": GeneratorSize(n_outfits=380_000, n_articles=30_000, n_customers=100_000),
    }

    @model_validator(mode="after")
    def _size_is_known(self):
        if self.size not in self.sizes:
            raise ValueError(f"generate.size '{self.size}' is not one of {sorted(self.sizes)}")
        return self

    @property
    def chosen(self) -> GeneratorSize:
        return self.sizes[self.size]


class PlantedConfig(Section):
    """The planted-signal generator (planted.py): sizes, and the strengths of its two signals."""

    seed: int = 0
    n_outfits: int = Field(24_000, gt=0)
    n_articles: int = Field(3_000, gt=0)
    n_customers: int = Field(6_000, gt=0)
    n_types: int = Field(24, ge=1)
    n_tastes: int = Field(128, ge=1)
    taste_strength: float = Field(1.3, ge=0)  # how strongly a taste shifts the articles drawn
    # the same through a hidden style per article that no column of the articles table carries (0: off, and
    # the data is today's byte for byte); with taste_strength 0 only the articles themselves reveal the taste
    hidden_taste_strength: float = Field(0.0, ge=0)
    context_strength: float = Field(4.0, ge=0)  # how strongly the context shifts the taste
    # a hidden taste per customer (one of n_customer_tastes, in no column) shifting its outfits' tastes as
    # strongly as this: what a customer's history can tell beyond the context (0: off, today's data and truth)
    customer_taste_strength: float = Field(0.0, ge=0)
    n_customer_tastes: int = Field(16, ge=1)
    popularity_exponent: float = Field(0.8, ge=0)  # Zipf exponent of the articles' popularity
    # planted closets (closets.py, another story: no tastes): each customer re-wears articles of a hidden closet
    # of this many slots (0: off, and the data is today's byte for byte) ...
    closet_size: int = Field(0, ge=0)
    # ... an item of a type the closet holds being one of its closet's articles of that type with this chance
    rewear_probability: float = Field(0.3, ge=0, lt=1)
    # the compatibility switch (tastes_options.py): a customer column `lifestyle` of n_lifestyles values changes
    # which styles go with a taste: each lifestyle's style table is sqrt(1 - s^2) x the shared one + s x its own
    # (0: off, and the data is today's byte for byte; 1: unrelated tables per lifestyle)
    compatibility_switch: float = Field(0.0, ge=0, le=1)
    n_lifestyles: int = Field(3, ge=1)
    # plain: the planted context columns; paper: plus the paper's twelve customer columns (categorical,
    # multi-valued, numeric), all pure noise: d_context about the paper's 736 with features.embedding_dims
    context: Literal["plain", "paper"] = "plain"
    # a list<float32> column `style_vector` of this length in the articles table: the article's tastes, randomly
    # projected (0: off, today's data) ...
    vector_dim: int = Field(0, ge=0, le=4096)
    # ... plus Gaussian noise of this std (each dimension's signal has std 1)
    vector_noise: float = Field(1.0, ge=0)

    @model_validator(mode="after")
    def _one_story(self):
        if self.closet_size and (self.hidden_taste_strength or self.customer_taste_strength):
            raise ValueError(
                "planted.closet_size > 0 is the closets' story, which has no tastes: set "
                "hidden_taste_strength and customer_taste_strength to 0"
            )
        if self.closet_size and (self.compatibility_switch or self.context != "plain" or self.vector_dim):
            raise ValueError(
                "planted.closet_size > 0 is the closets' story: compatibility_switch, context and vector_dim are "
                "the planted tastes' options; set them to 0, plain and 0"
            )
        if self.compatibility_switch and self.n_lifestyles < 2:
            raise ValueError(
                f"planted.compatibility_switch {self.compatibility_switch} needs at least 2 lifestyles to switch "
                f"between; planted.n_lifestyles is {self.n_lifestyles}"
            )
        return self


class ImportHMConfig(Section):
    source: Path = Path("../shared/data/hm_sample")
    # One basket = one customer's distinct articles per day, per week (Monday to Sunday), or per session:
    # purchase days at most `session_gap_days` apart belong to one session.
    basket: Literal["day", "week", "session"] = "day"
    session_gap_days: int = Field(1, ge=1)
    # t_dat in another form than ISO (YYYY-MM-DD, or an ISO date and time, always read): a strptime format,
    # e.g. "%d/%m/%Y" or "%m/%d/%Y %H:%M"; its date as written is the day.
    date_format: str | None = None
    memory_limit_gib: float = Field(3.0, gt=0)  # DuckDB's working memory; beyond it, it spills to disk
    threads: int = Field(0, ge=0)  # DuckDB threads; 0: one per core


ContextKindName = Literal["categorical", "multi_categorical", "numeric"]
# text and vector: article attributes only (vector: a fixed-length float vector per article, data/vectors.py)
AttributeKindName = Literal["categorical", "multi_categorical", "numeric", "text", "vector"]


class ImportSetsConfig(Section):
    """Curated sets: (outfit id, item id) pairs (or a set per row, its items as a list), or the Polyvore Outfits
    JSON layout; customers optional."""

    source: Path = Path("data/sets.json")  # .csv/.tsv, .parquet, .jsonl pairs or .json (Polyvore); text may be .gz
    outfit_column: str = "outfit_id"
    item_column: str = "item_id"
    customer_column: str | None = None  # the customer of each outfit, when the pairs name one
    customers: Path | None = None  # a customers table (.csv / .parquet / .jsonl) keyed by customer_column
    # the date of each outfit (a column of the pairs, a key of a Polyvore set): a date, or an integer sequence
    # number k read as 1970-01-01 + k days; without it the outfits have no date (and no history)
    date_column: str | None = None
    context: dict[str, ContextKindName] = {}  # its context columns and their kinds
    # A products table (.csv/.tsv/.parquet/.jsonl, or .json: Polyvore's item metadata keyed by item id): its
    # columns become article columns (import_sets.article_name); features.article_attributes.sets says which
    # the models read. Its id column (default: item_column), and attribute -> its column where the names
    # differ beyond letter case and separators.
    articles: Path | None = None
    article_id_column: str | None = None
    article_columns: dict[str, str] = {}
