"""Building a model by name, and its parameters as the paper counts them."""

from __future__ import annotations

from contextual_bert.config import BASELINE_MODELS, VARIANTS, ModelConfig, base_model
from contextual_bert.data.feature_spec import N_SPECIAL, ContextSpec, FeatureSpec
from contextual_bert.model.bag_of_items import BagOfItems
from contextual_bert.model.encoder import PAPER_PARAMETERS, PAPER_SIZES, ContextualBert
from contextual_bert.model.readers import AttributeOverlap
from contextual_bert.model.scores import OutfitModel

NOT_IN_THE_PAPER = "not in the paper"  # describe_variants' paper count of a variant of ours


def build_model(
    model_cfg: ModelConfig,
    name: str,
    n_items: int,
    spec: ContextSpec,
    attributes: ContextSpec | None = None,
    combine: str = "sum",
) -> OutfitModel:
    """A paper variant (ContextualBert) or a learned baseline (BagOfItems), by name; a "<model>_attrs" name
    with the article attributes' spec (n_items: the article ids; the catalogue comes by `set_catalogue`)."""
    model_class = BagOfItems if base_model(name) in BASELINE_MODELS else ContextualBert
    return model_class(model_cfg, name, n_items, spec, attributes, combine)


def count_paper_parameters(model: OutfitModel) -> int:
    """Parameters as the paper counts them: without the article embeddings, the output layer and the
    customer-feature embeddings."""
    # the id tables (the bag of items' untied output one too) and the output bias
    excluded = {id(model.articles.ids.weight), id(model.output.vectors.ids.weight), id(model.output.bias)}
    if model.context_embedding is not None:
        excluded |= {id(p) for p in model.context_embedding.parameters()}
    for article_side in (*model.article_sides(), model.reader(AttributeOverlap)):
        if article_side is not None:  # attribute embeddings (and projection) belong to the article embeddings
            excluded |= {id(p) for p in article_side.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in excluded)


def describe_variants(model_cfg: ModelConfig, paper: bool = False, d_context: int | None = None) -> dict:
    """Counted parameters of every variant, at the paper's sizes or at `model_cfg`'s (d_context: the
    width of c, by default the paper's 736), beside the paper's count ("not in the paper" for ours)."""
    if paper:
        sizes = dict(PAPER_SIZES)
        model_cfg = model_cfg.model_copy(update={k: v for k, v in sizes.items() if k != "d_context"})
    else:
        sizes = {
            "d_model": model_cfg.d_model,
            "n_blocks": model_cfg.n_blocks,
            "n_heads": model_cfg.n_heads,
            "d_ff": model_cfg.d_ff,
            "d_context": PAPER_SIZES["d_context"] if d_context is None else d_context,
        }
    # The counted parameters do not depend on the context features' split of d_context nor on n_items.
    spec = ContextSpec((FeatureSpec("c", "categorical", "customer", N_SPECIAL + 1, sizes["d_context"]),))
    variants = {}
    for variant in VARIANTS:
        counted = count_paper_parameters(ContextualBert(model_cfg, variant, N_SPECIAL + 1, spec))
        row = {"parameters": counted, "paper_parameters": PAPER_PARAMETERS.get(variant, NOT_IN_THE_PAPER)}
        if paper and variant in PAPER_PARAMETERS:  # ours (OWN_VARIANTS) have nothing to match
            row["matches_paper"] = counted == PAPER_PARAMETERS[variant]
        variants[variant] = row
    return {"sizes": sizes, "paper": paper, "variants": variants}
