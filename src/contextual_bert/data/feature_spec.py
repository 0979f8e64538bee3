"""The shared vocabulary between the features stage, the model and serving.

Every context feature, whatever its raw kind, reaches the model as integer indices into its own
embedding table: categorical -> one index, multi-valued categorical -> a 0-padded row of indices,
numeric -> the index of its bucket. Index 0 is padding, 1 missing, 2 unknown (unseen at fit time).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final, Literal

import torch

# Reserved indices, shared by the article vocabulary and every context-feature vocabulary.
PAD_INDEX = 0
MISSING_INDEX = 1  # context features: value absent. Article vocabulary: this index is [MASK].
UNKNOWN_INDEX = 2
MASK_INDEX = 1
N_SPECIAL = 3  # first index of a real article / value

# text and vector: article attributes only. A vector is a fixed-length float row per article (data/vectors.py), not
# indices: its FeatureSpec's max_values is its length, its cardinality 0 (no table of values)
FeatureKind = Literal["categorical", "multi_categorical", "numeric", "text", "vector", "history"]
VECTOR_KIND: Final = "vector"
# kinds stored as a PAD-padded row of indices per row (max_values wide): a list of values, a text's words, or
# the article indices of a customer's history
LIST_KINDS = ("multi_categorical", "text", "history")
# "article": an attribute of the catalogue; "history": the customer's earlier articles (features.history), stored
# per outfit as article indices and embedded through the model's own article vectors, not a table of its own
FeatureSource = Literal["customer", "outfit", "article", "history"]
HISTORY_FEATURE = "history"  # its name in the spec and in data/features' outfits table
HISTORY_COLUMN = "history_article_ids"  # a serving request's column: the customer's earlier article ids


@dataclass(frozen=True)
class FeatureSpec:
    """One context feature as the model sees it."""

    name: str
    kind: FeatureKind
    source: FeatureSource  # customers table, per outfit (e.g. occasion), or an article attribute
    cardinality: int  # size of its embedding table, special indices included
    dim: int  # embedding dimension; the dims of all features sum to d_context
    max_values: int = 1  # width of the padded index row for multi_categorical and text, a vector's length, else 1

    @property
    def request_column(self) -> str:
        """Its column in a serving request: the raw values under the feature's name, or the history's ids."""
        return HISTORY_COLUMN if self.source == "history" else self.name

    @property
    def is_list(self) -> bool:
        """Stored as a padded row of indices (LIST_KINDS), pooled by the mean of their embeddings."""
        return self.kind in LIST_KINDS


@dataclass(frozen=True)
class ContextSpec:
    features: tuple[FeatureSpec, ...]

    @property
    def d_context(self) -> int:
        return sum(f.dim for f in self.features)

    def to_json(self) -> str:
        return json.dumps({"features": [asdict(f) for f in self.features]}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> ContextSpec:
        return cls(tuple(FeatureSpec(**f) for f in json.loads(text)["features"]))

    def save(self, path: Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: Path) -> ContextSpec:
        return cls.from_json(Path(path).read_text())


@dataclass
class EncodedOutfits:
    """A split of outfits as tensors, ready for the model.

    items:   (N, max_set_size) int64 article indices, PAD_INDEX-padded at the end.
    context: feature name -> (N,) int64 for categorical/numeric, (N, max_values) for multi_categorical,
             already joined from the customer to each outfit.
    """

    items: torch.Tensor
    context: dict[str, torch.Tensor] = field(default_factory=dict)
    outfit_ids: list[str] | None = None

    def __len__(self) -> int:
        return self.items.shape[0]

    def to(self, device: torch.device | str) -> EncodedOutfits:
        return EncodedOutfits(
            self.items.to(device), {k: v.to(device) for k, v in self.context.items()}, self.outfit_ids
        )

    def subset(self, index: torch.Tensor) -> EncodedOutfits:
        ids = None if self.outfit_ids is None else [self.outfit_ids[i] for i in index.tolist()]
        return EncodedOutfits(self.items[index], {k: v[index] for k, v in self.context.items()}, ids)
