"""The models: the paper's encoder and its variants (encoder.py), the learned bag of items
(bag_of_items.py), article vectors from attributes (articles.py), the customer context (context.py), the
readers at the two seams (readers.py), the output side they share (scores.py), and checkpoints.

The public API is `__all__`: the names studies/ and users import from here (tests/test_studies.py)."""

from contextual_bert.model.articles import (
    ATTRIBUTE_COMBINES,
    ArticleAttributes,
    TextEmbedding,
    VectorProjection,
    attribute_embedding,
)
from contextual_bert.model.bag_of_items import BagOfItems
from contextual_bert.model.build import build_model, count_paper_parameters, describe_variants
from contextual_bert.model.checkpoint import (
    CHECKPOINT_VERSION,
    atomic_save,
    load_checkpoint,
    model_from_payload,
    model_payload,
    save_checkpoint,
)
from contextual_bert.model.context import ContextEmbedding, HistoryAttentionPooling, HistoryPooling, history_mean
from contextual_bert.model.dropout import DRAW_BITS, Dropout, keep_mask, scaled_keep_mask
from contextual_bert.model.encoder import (
    ADAPTIVE_NORM,
    GLOBAL_STATE_VARIANTS,
    N_MODULATIONS,
    PAPER_PARAMETERS,
    PAPER_SIZES,
    STATE_UPDATE_VARIANTS,
    AdaptiveModulation,
    Block,
    ConcatInput,
    ContextualBert,
    FeedForward,
    GlobalState,
    GlobalStateAttention,
    GlobalStateRead,
    GlobalStateUpdate,
    MultiHeadSelfAttention,
    StateAttention,
)
from contextual_bert.model.head import ArticleHead, ArticleVectors
from contextual_bert.model.readers import (
    AttributeOverlap,
    HistoryBag,
    HistoryRepeat,
    OutfitBag,
    head_terms,
    logit_offsets,
    other_articles_mean,
    overlap_spec,
)
from contextual_bert.model.scores import OutfitModel

__all__ = [
    "ATTRIBUTE_COMBINES",
    "ArticleAttributes",
    "TextEmbedding",
    "VectorProjection",
    "attribute_embedding",
    "BagOfItems",
    "build_model",
    "count_paper_parameters",
    "describe_variants",
    "CHECKPOINT_VERSION",
    "atomic_save",
    "load_checkpoint",
    "model_from_payload",
    "model_payload",
    "save_checkpoint",
    "ContextEmbedding",
    "HistoryAttentionPooling",
    "HistoryPooling",
    "history_mean",
    "DRAW_BITS",
    "Dropout",
    "keep_mask",
    "scaled_keep_mask",
    "ADAPTIVE_NORM",
    "GLOBAL_STATE_VARIANTS",
    "N_MODULATIONS",
    "PAPER_PARAMETERS",
    "PAPER_SIZES",
    "STATE_UPDATE_VARIANTS",
    "AdaptiveModulation",
    "Block",
    "ConcatInput",
    "ContextualBert",
    "FeedForward",
    "GlobalState",
    "GlobalStateAttention",
    "GlobalStateRead",
    "GlobalStateUpdate",
    "MultiHeadSelfAttention",
    "StateAttention",
    "ArticleHead",
    "ArticleVectors",
    "AttributeOverlap",
    "HistoryBag",
    "HistoryRepeat",
    "OutfitBag",
    "head_terms",
    "logit_offsets",
    "other_articles_mean",
    "overlap_spec",
    "OutfitModel",
]
