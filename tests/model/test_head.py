"""The article head alone (model/head.py): held by every model, tied for the encoder and not for the bag of items,
owning no weight (checkpoints keep their keys, the parameters their order), and the held output layer serving the
input side only where it holds the very same vectors."""

import torch

from contextual_bert.config import ModelConfig
from contextual_bert.data.feature_spec import N_SPECIAL, ContextSpec, FeatureSpec
from contextual_bert.model import ArticleHead, ArticleVectors, build_model

TINY = ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=16, dropout=0.0, max_set_size=6)
SPEC = ContextSpec((FeatureSpec("style", "categorical", "customer", N_SPECIAL + 4, 4),))
N_ITEMS = N_SPECIAL + 20


def test_the_encoders_head_is_tied_and_the_bags_is_its_own():
    bert = build_model(TINY, "global_state", N_ITEMS, SPEC)
    assert isinstance(bert.output, ArticleHead) and isinstance(bert.articles, ArticleVectors)
    assert bert.output.vectors is bert.articles and bert.articles.ids is bert.item_embeddings
    assert bert.output.bias is bert.output_bias
    bag = build_model(TINY, "bag_of_items", N_ITEMS, SPEC)
    assert bag.output.vectors is not bag.articles and bag.output.vectors.ids is bag.output_embeddings
    assert bag.n_items == bag.n_ids == N_ITEMS


def test_the_head_owns_no_weight_so_checkpoints_keep_their_keys_and_the_parameters_their_order():
    bert = build_model(TINY, "global_state", N_ITEMS, SPEC)
    keys = list(bert.state_dict())
    # the model's own parameter first, then its submodules' in the order they were registered
    assert keys[:2] == ["output_bias", "item_embeddings.weight"] and keys[-1] == "head_transform.bias"
    assert not any(k.startswith(("articles.", "output.")) for k in keys)
    assert [name for name, _ in bert.named_parameters()] == keys  # no buffer in it: the same order


def test_a_held_layer_serves_the_input_side_only_when_tied_in_eval_mode_without_gradient():
    bert = build_model(TINY, "global_state", N_ITEMS, SPEC).eval()
    items = torch.tensor([[N_SPECIAL, N_SPECIAL + 1]])
    assert bert.output.held_vectors(bert.articles, items) is None  # nothing held
    with torch.no_grad(), bert.catalogue_pass():
        held = bert.output.held_vectors(bert.articles, items)
        assert held is not None and torch.equal(held, bert.articles(items))
        other = ArticleVectors(torch.nn.Embedding(N_ITEMS, 16), None)
        assert bert.output.held_vectors(other, items) is None  # not the vectors it holds
    assert bert.output.held is None  # let go after the pass
    with torch.no_grad():
        assert bert.hold_catalogue() and not bert.hold_catalogue()  # once; a second asks for nothing new
        bert.train()
        assert bert.output.held_vectors(bert.articles, items) is None  # training builds it every step
    bert.release_catalogue()
