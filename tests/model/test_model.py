import json

import pytest
import torch
from helpers import wake_between_blocks

from contextual_bert.cli import main
from contextual_bert.config import BASELINE_MODELS, PAPER_VARIANTS, VARIANTS, ModelConfig
from contextual_bert.data.feature_spec import MASK_INDEX, N_SPECIAL, PAD_INDEX, UNKNOWN_INDEX, ContextSpec, FeatureSpec
from contextual_bert.errors import ContextualBertError
from contextual_bert.model import (
    PAPER_PARAMETERS,
    AttributeOverlap,
    ContextEmbedding,
    ContextualBert,
    Dropout,
    build_model,
    count_paper_parameters,
    describe_variants,
    load_checkpoint,
    other_articles_mean,
    save_checkpoint,
    scaled_keep_mask,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: a second thread only adds synchronisation

CONTEXT_VARIANTS = [v for v in VARIANTS if v != "none"]
SMALL = ModelConfig(d_model=16, n_blocks=2, n_heads=4, d_ff=32, dropout=0.1, max_set_size=8, attribute_overlap=False)
N_ITEMS = N_SPECIAL + 30
SPEC = ContextSpec(
    (
        FeatureSpec("gender", "categorical", "customer", N_SPECIAL + 2, 4),
        FeatureSpec("brands", "multi_categorical", "customer", N_SPECIAL + 5, 6, max_values=3),
        FeatureSpec("age", "numeric", "customer", N_SPECIAL + 10, 3),
        FeatureSpec("occasion", "categorical", "outfit", N_SPECIAL + 4, 5),
    )
)


def paper_spec() -> ContextSpec:
    """The paper's thirteen features with made-up cardinalities; their dims sum to d_context = 736."""
    dims = {"age": 32, "gender": 16, "country": 32, "preferred_brands": 160, "preferred_colors": 64,
            "preferred_styles": 160, "nogo_product_types": 64, "size_top": 32, "size_bottom": 32,
            "size_shoes": 32, "price_min": 32, "price_max": 32, "occasion": 48}  # fmt: skip
    multi = {"preferred_brands", "preferred_colors", "preferred_styles", "nogo_product_types"}
    return ContextSpec(
        tuple(
            FeatureSpec(
                name,
                "multi_categorical" if name in multi else "categorical",
                "customer",
                40,
                dim,
                max_values=8 if name in multi else 1,
            )  # fmt: skip
            for name, dim in dims.items()
        )
    )


def context(batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "gender": torch.randint(N_SPECIAL, N_SPECIAL + 2, (batch,), generator=g),
        "brands": torch.randint(0, N_SPECIAL + 5, (batch, 3), generator=g),
        "age": torch.randint(1, N_SPECIAL + 10, (batch,), generator=g),
        "occasion": torch.randint(N_SPECIAL, N_SPECIAL + 4, (batch,), generator=g),
    }


def outfits_with_one_mask(batch: int, size: int, length: int, seed: int = 0) -> torch.Tensor:
    """(batch, length) distinct real articles, the last `length - size` padding, [MASK] at position 0."""
    g = torch.Generator().manual_seed(seed)
    items = torch.stack([torch.randperm(N_ITEMS - N_SPECIAL, generator=g)[:size] + N_SPECIAL for _ in range(batch)])
    items[:, 0] = MASK_INDEX
    return torch.nn.functional.pad(items, (0, length - size), value=PAD_INDEX)


def model(variant: str, seed: int = 0) -> ContextualBert:
    torch.manual_seed(seed)
    bert = ContextualBert(SMALL, variant, N_ITEMS, SPEC).eval()
    if variant == "adaptive_norm":  # its zero start gates every sublayer off: it would read neither outfit nor c
        wake_between_blocks(bert)
    return bert


@pytest.mark.parametrize("variant", PAPER_VARIANTS)
def test_paper_parameter_counts_are_reproduced_exactly(variant):
    paper = ModelConfig(d_model=128, n_blocks=4, n_heads=8, d_ff=256)
    bert = ContextualBert(paper, variant, n_items=N_SPECIAL + 1000, spec=paper_spec())
    assert paper_spec().d_context == 736
    assert count_paper_parameters(bert) == PAPER_PARAMETERS[variant]


def test_counted_parameters_leave_out_articles_output_and_context_embeddings():
    small, large = (ContextualBert(SMALL, "global_state", n, SPEC) for n in (N_SPECIAL + 10, N_SPECIAL + 500))
    assert count_paper_parameters(small) == count_paper_parameters(large)
    assert sum(p.numel() for p in large.parameters()) - count_paper_parameters(large) == (
        (N_SPECIAL + 500) * (SMALL.d_model + 1) + sum(f.cardinality * f.dim for f in SPEC.features)
    )


def test_describe_variants_at_paper_sizes_and_from_the_cli(capsys, tmp_path):
    described = describe_variants(ModelConfig(d_model=64), paper=True)
    assert described["sizes"]["d_context"] == 736
    assert all(row["matches_paper"] for v, row in described["variants"].items() if v in PAPER_VARIANTS)
    params = tmp_path / "params.yaml"
    params.write_text(
        "model:\n  d_model: 64\n  n_heads: 4\nfeatures:\n  embedding_dims: {a: 10, b: 22}\n"
        f"paths:\n  features_dir: {tmp_path / 'features'}\n"
    )  # no features built yet
    assert main(["--params", str(params), "describe-model"]) == 0
    own = json.loads(capsys.readouterr().out)
    assert own["sizes"]["d_model"] == 64 and own["sizes"]["d_context"] == 32
    # [None] at d_model 64, d_ff 256: 4 blocks of attention + FFN + 2 LayerNorms, and the head transform.
    block = 4 * (64 * 64 + 64) + (64 * 256 + 256) + (256 * 64 + 64) + 2 * 2 * 64
    assert own["variants"]["none"]["parameters"] == 4 * block + 64 * 64 + 64


def test_describe_model_takes_d_context_from_the_feature_spec(capsys, tmp_path):
    """Built features know the true width of c (default_dim included), which params' embedding_dims do not."""
    (tmp_path / "features").mkdir()
    SPEC.save(tmp_path / "features" / "spec.json")
    params = tmp_path / "params.yaml"
    params.write_text(
        f"features:\n  default_dim: 16\n  embedding_dims: {{a: 10}}\npaths:\n  features_dir: {tmp_path / 'features'}\n"
    )
    assert main(["--params", str(params), "describe-model"]) == 0
    assert json.loads(capsys.readouterr().out)["sizes"]["d_context"] == SPEC.d_context != 10


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_changes_no_output(variant):
    bert = model(variant)
    items = outfits_with_one_mask(6, size=5, length=5)
    ctx = context(6)
    with torch.no_grad():
        unpadded = bert.masked_logits(items, ctx)
        padded = bert.masked_logits(torch.nn.functional.pad(items, (0, 3), value=PAD_INDEX), ctx)
        hidden = bert(torch.nn.functional.pad(items, (0, 3), value=PAD_INDEX), ctx)
    torch.testing.assert_close(padded, unpadded, rtol=1e-5, atol=1e-5)
    assert hidden.shape == (6, 8, SMALL.d_model)


@pytest.mark.parametrize("variant", VARIANTS)
def test_shuffling_an_outfit_leaves_the_masked_prediction_unchanged(variant):
    bert = model(variant)
    items = outfits_with_one_mask(6, size=7, length=8)
    ctx = context(6)
    shuffled = items[:, torch.tensor([5, 2, 0, 7, 1, 6, 3, 4])]  # [MASK] moves, padding moves to the middle
    with torch.no_grad():
        torch.testing.assert_close(bert.masked_logits(shuffled, ctx), bert.masked_logits(items, ctx),
                                   rtol=1e-5, atol=1e-5)  # fmt: skip
        changed = items.clone()
        changed[:, 1] = torch.where(changed[:, 1] == N_SPECIAL, N_SPECIAL + 1, N_SPECIAL)
        assert not torch.allclose(bert.masked_logits(changed, ctx), bert.masked_logits(items, ctx))


@pytest.mark.parametrize("variant", CONTEXT_VARIANTS)
def test_context_variants_depend_on_the_context(variant):
    bert = model(variant)
    items = outfits_with_one_mask(8, size=4, length=8)
    with torch.no_grad():
        a, b = bert.masked_logits(items, context(8, seed=1)), bert.masked_logits(items, context(8, seed=2))
    assert (a - b)[:, N_SPECIAL:].abs().max() > 1e-3


def test_none_ignores_the_context():
    bert = model("none")
    items = outfits_with_one_mask(8, size=4, length=8)
    with torch.no_grad():
        torch.testing.assert_close(bert.masked_logits(items, context(8, seed=1)), bert.masked_logits(items, None))
    assert bert.context_embedding is None


def test_context_embedding_concatenates_features_and_averages_multi_values():
    encoder = ContextEmbedding(SPEC)
    ctx = {"gender": torch.tensor([3, 4]), "brands": torch.tensor([[3, 5, 0], [0, 0, 0]]),
           "age": torch.tensor([1, 7]), "occasion": torch.tensor([3, 3])}  # fmt: skip
    c = encoder(ctx)
    assert c.shape == (2, SPEC.d_context)
    brands = encoder.embeddings[1].weight
    torch.testing.assert_close(c[0, 4:10], (brands[3] + brands[5]) / 2)
    assert torch.equal(c[1, 4:10], torch.zeros(6))  # a customer with no values: the padding embedding
    torch.testing.assert_close(c[1, :4], encoder.embeddings[0].weight[4])
    with pytest.raises(ContextualBertError, match="occasion"):
        encoder({k: v for k, v in ctx.items() if k != "occasion"})


def test_masked_logits_rank_only_real_articles_and_need_one_mask():
    bert = model("concat")
    items = outfits_with_one_mask(3, size=4, length=8)
    with torch.no_grad():
        logits = bert.masked_logits(items, context(3))
    assert logits.shape == (3, N_ITEMS)
    assert torch.isinf(logits[:, :N_SPECIAL]).all() and torch.isfinite(logits[:, N_SPECIAL:]).all()
    items[0, 1] = MASK_INDEX
    with pytest.raises(ContextualBertError, match="exactly one"):
        bert.masked_logits(items, context(3))


def test_checkpoint_round_trip_needs_no_other_file(tmp_path):
    bert = model("global_state_update", seed=3)
    save_checkpoint(tmp_path / "checkpoint.pt", bert, {"epoch": 4})
    loaded, meta = load_checkpoint(tmp_path / "checkpoint.pt")
    assert meta == {"epoch": 4} and loaded.name == "global_state_update" and loaded.spec == SPEC
    items, ctx = outfits_with_one_mask(4, size=6, length=8), context(4)
    with torch.no_grad():
        torch.testing.assert_close(loaded.masked_logits(items, ctx), bert.masked_logits(items, ctx))
    with pytest.raises(ContextualBertError, match="not found"):
        load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "broken.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ContextualBertError, match="broken.pt"):
        load_checkpoint(tmp_path / "broken.pt")


def test_a_checkpoint_written_before_the_word_model_still_loads(tmp_path):
    """Before issue 92 the payload named the model under "variant": such a checkpoint (models/, a registered
    version's files) still loads, as the same model."""
    from contextual_bert.model.checkpoint import model_from_payload, model_payload

    bert = model("concat", seed=1)
    payload = model_payload(bert)
    assert payload["model"] == "concat" and "variant" not in payload
    payload["variant"] = payload.pop("model")
    loaded = model_from_payload(payload).eval()
    assert loaded.name == "concat"
    items, ctx = outfits_with_one_mask(4, size=6, length=8), context(4)
    with torch.no_grad():
        torch.testing.assert_close(loaded.masked_logits(items, ctx), bert.masked_logits(items, ctx))


def test_unknown_variant_and_context_free_spec_are_clear_errors():
    with pytest.raises(ContextualBertError, match="unknown encoder model"):
        ContextualBert(SMALL, "gsu", N_ITEMS, SPEC)
    with pytest.raises(ContextualBertError, match="needs context"):
        ContextualBert(SMALL, "global_state", N_ITEMS, ContextSpec(()))


@pytest.mark.parametrize("variant", VARIANTS)
def test_selected_positions_equal_the_full_output_there(variant):
    bert = model(variant)
    items = outfits_with_one_mask(5, size=6, length=8)
    select = torch.zeros(5, 8, dtype=torch.bool)
    select[:, 0] = True
    select[1, 3] = select[4, 5] = True
    with torch.no_grad():
        torch.testing.assert_close(bert(items, context(5), select=select), bert(items, context(5))[select])


# --- [GSU]'s state and [GS]'s dropout ----------------------------------------------------------------


def _states_read_by_blocks(bert: ContextualBert, items, ctx) -> list[torch.Tensor]:
    """The global state c~ that each block's [GS] sublayer reads, in block order."""
    seen = []
    hooks = [block.global_state_attention.register_forward_hook(lambda m, args, out: seen.append(args[1]))
             for block in bert.blocks]  # fmt: skip
    with torch.no_grad():
        bert.masked_logits(items, ctx)
    for hook in hooks:
        hook.remove()
    return seen


def test_gsu_starts_out_as_gs_and_its_blocks_read_a_state_of_one_scale():
    paper = ModelConfig(d_model=128, n_blocks=4, n_heads=8, d_ff=256, dropout=0.1)
    torch.manual_seed(0)
    gs = ContextualBert(paper, "global_state", N_ITEMS, SPEC).eval()
    gsu = ContextualBert(paper, "global_state_update", N_ITEMS, SPEC).eval()
    missing, unexpected = gsu.load_state_dict(gs.state_dict(), strict=False)
    assert not unexpected and all(name.startswith("global_state_updates.") for name in missing)
    items, ctx = outfits_with_one_mask(64, size=6, length=8), context(64)
    with torch.no_grad():
        torch.testing.assert_close(gsu.masked_logits(items, ctx), gs.masked_logits(items, ctx))
    states = _states_read_by_blocks(gsu, items, ctx)
    first = float(states[0].std())
    assert all(float(s.std()) == pytest.approx(first, rel=0.05) for s in states[1:])
    # The count stays the paper's: the updates' norm is 256 parameters each, learned from a zero gain.
    assert count_paper_parameters(gsu) - count_paper_parameters(gs) == 3 * (128 * 256 + 256 + 256 * 128 + 128 + 256)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_the_dropout_mask_keeps_one_minus_p_and_the_expectation(p):
    torch.manual_seed(0)
    mask = scaled_keep_mask(torch.ones(7, 1001, 33), p)  # an odd size: the last int64's draws half used
    assert mask.shape == (7, 1001, 33)
    assert mask.unique().tolist() == [0.0, pytest.approx(1 / (1 - p), rel=1e-3)]
    assert float((mask > 0).float().mean()) == pytest.approx(1 - p, abs=0.005)
    assert float(mask.mean()) == pytest.approx(1.0, abs=0.01)
    assert not torch.equal(mask[0], mask[1])  # every draw its own
    torch.manual_seed(0)
    assert torch.equal(scaled_keep_mask(torch.ones(7, 1001, 33), p), mask)  # torch's seed decides it


def test_dropout_with_a_residual_is_dropout_plus_the_residual_bit_for_bit():
    """Dropout(x, residual), the blocks' fused form, against Dropout(x) + residual under the same seed: the
    same output and gradients; an x that broadcasts gets a mask per element of the residual's shape."""
    dropout = Dropout(0.1).train()
    for x_shape in ((5, 3, 16), (1, 3, 16)):
        x, residual = torch.randn(x_shape, requires_grad=True), torch.randn(5, 3, 16, requires_grad=True)
        torch.manual_seed(0)
        fused = dropout(x, residual)
        fused.pow(2).sum().backward()
        grads = x.grad.clone(), residual.grad.clone()
        x.grad = residual.grad = None
        torch.manual_seed(0)
        apart = dropout(x.expand_as(residual)) + residual
        apart.pow(2).sum().backward()
        assert torch.equal(fused, apart)
        assert torch.equal(grads[0], x.grad) and torch.equal(grads[1], residual.grad)
    dropped = fused == residual
    assert 0 < float(dropped.float().mean()) < 0.3 and not torch.equal(dropped[0], dropped[1])
    assert torch.equal(dropout.eval()(x, residual), x + residual)


def test_gs_dropout_draws_a_mask_per_position():
    layer = ContextualBert(SMALL, "global_state", N_ITEMS, SPEC).blocks[0].global_state_attention.train()
    layer.dropout.p = 0.5
    seen = []
    layer.dropout.register_forward_hook(lambda module, args, out: seen.append(out))
    layer(torch.zeros(6, 2, SMALL.d_model), torch.randn(2, SMALL.d_model))  # (L, B, d): 6 positions of 2 outfits
    dropped = seen[0] == 0
    assert 0 < float(dropped.float().mean()) < 1
    assert not torch.equal(dropped[0], dropped[1])


# --- the bag-of-items baseline ------------------------------------------------------------------------


def test_bag_of_items_scores_from_the_mean_of_the_other_articles():
    torch.manual_seed(0)
    bag = build_model(SMALL, "bag_of_items", N_ITEMS, SPEC).eval()
    items = outfits_with_one_mask(4, size=5, length=8)
    with torch.no_grad():
        hidden = bag(items, None, select=items == MASK_INDEX)
        expected = bag.item_embeddings(items[:, 1:5]).mean(dim=1)
        torch.testing.assert_close(hidden, expected)
        logits = bag.masked_logits(items, None)
        torch.testing.assert_close(logits[:, N_SPECIAL:], expected @ bag.output_embeddings.weight[N_SPECIAL:].T)
        shuffled = items[:, torch.tensor([3, 0, 6, 1, 7, 2, 4, 5])]
        torch.testing.assert_close(bag.masked_logits(shuffled, None), logits)
    # Its own articles and output layer are not counted, as for the paper's variants.
    assert count_paper_parameters(bag) == 0


def test_bag_of_items_with_context_depends_on_it_and_round_trips(tmp_path):
    torch.manual_seed(1)
    bag = build_model(SMALL, "bag_of_items_context", N_ITEMS, SPEC).eval()
    items = outfits_with_one_mask(8, size=4, length=8)
    with torch.no_grad():
        a, b = bag.masked_logits(items, context(8, seed=1)), bag.masked_logits(items, context(8, seed=2))
    assert (a - b)[:, N_SPECIAL:].abs().max() > 1e-3
    assert count_paper_parameters(bag) == SPEC.d_context * SMALL.d_model + SMALL.d_model
    save_checkpoint(tmp_path / "checkpoint.pt", bag, {})
    loaded, _ = load_checkpoint(tmp_path / "checkpoint.pt")
    assert type(loaded).__name__ == "BagOfItems"
    with torch.no_grad():
        torch.testing.assert_close(loaded.masked_logits(items, context(8, seed=1)), a)
    with pytest.raises(ContextualBertError, match="needs context"):
        build_model(SMALL, "bag_of_items_context", N_ITEMS, ContextSpec(()))


# --- article attributes (issue 14) ------------------------------------------------------------------------

# (digest of the state_dict's keys and shapes, all parameters) of every model without attributes at SMALL,
# N_ITEMS, SPEC, as the code built them before the attributes existed (commit fc7714f).
# (digests since ContextEmbedding's attribute is context_embedding: the same layout, a submodule renamed)
MODELS_BEFORE_ATTRIBUTES = {
    "none": ("8b989077c61f5328", 5281),
    "concat": ("0df20d3cfe6f61ee", 6255),
    "new_position": ("789d846384559178", 5727),
    "global_state": ("790b1940d3d18438", 6543),
    "global_state_update": ("36e37ec328f3aefd", 7647),
    "bag_of_items": ("dfc2d0c826207308", 1089),
    "bag_of_items_context": ("4e63b233df85c6a2", 1535),
}
ATTRIBUTES = ContextSpec((
    FeatureSpec("product_type", "categorical", "article", N_SPECIAL + 4, 4),
    FeatureSpec("colours", "multi_categorical", "article", N_SPECIAL + 3, 4, max_values=2),
    FeatureSpec("price", "numeric", "article", N_SPECIAL + 5, 4),
))  # fmt: skip
N_CATALOGUE = N_ITEMS + 5  # five articles the models never saw in training: no id embedding


def catalogue(n: int = N_CATALOGUE, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tables = {"product_type": torch.randint(1, N_SPECIAL + 4, (n,), generator=g),
              "colours": torch.randint(0, N_SPECIAL + 3, (n, 2), generator=g),
              "price": torch.randint(1, N_SPECIAL + 5, (n,), generator=g)}  # fmt: skip
    tables["colours"][:, 0] = tables["colours"][:, 0].clamp(min=1)
    for t in tables.values():
        t[:N_SPECIAL] = PAD_INDEX
    return tables


def attribute_model(model_name: str, combine: str = "sum", seed: int = 0):
    torch.manual_seed(seed)
    bert = build_model(SMALL, model_name + "_attrs", N_ITEMS, SPEC, ATTRIBUTES, combine)
    bert.set_catalogue(catalogue())
    return bert.eval()


@pytest.mark.parametrize("model_name", list(MODELS_BEFORE_ATTRIBUTES))
def test_without_attributes_every_model_is_built_exactly_as_before(model_name):
    import hashlib

    built = build_model(SMALL, model_name, N_ITEMS, SPEC)
    text = ";".join(f"{k}:{tuple(t.shape)}" for k, t in built.state_dict().items())
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    assert (digest, sum(p.numel() for p in built.parameters())) == MODELS_BEFORE_ATTRIBUTES[model_name]
    assert built.attributes is None and built.n_items == built.n_ids == N_ITEMS


@pytest.mark.parametrize("model_name", [*VARIANTS, *BASELINE_MODELS])
@pytest.mark.parametrize("combine", ["sum", "concat"])
def test_an_article_unseen_in_training_gets_a_finite_score_from_its_attributes(model_name, combine):
    bert = attribute_model(model_name, combine)
    assert bert.n_items == N_CATALOGUE and bert.n_ids == N_ITEMS
    items, ctx = outfits_with_one_mask(3, size=5, length=8), context(3)
    items[:, 1] = N_ITEMS + 2  # an unseen article in the input, too
    with torch.no_grad():
        logits = bert.masked_logits(items, ctx)
    assert logits.shape == (3, N_CATALOGUE)
    assert torch.isfinite(logits[:, N_SPECIAL:]).all()
    # Two unseen articles share the [UNK] id row: they differ only by their attributes.
    unseen = logits[:, N_ITEMS:]
    assert (unseen[:, 0] != unseen[:, 1]).all()
    # Changing one attribute value of one unseen article changes its score, and no other.
    changed = catalogue()
    article = N_ITEMS + 4
    changed["product_type"][article] = N_SPECIAL + (int(changed["product_type"][article]) - N_SPECIAL + 1) % 4
    bert.set_catalogue(changed)
    with torch.no_grad():
        after = bert.masked_logits(items, ctx)
    assert (after[:, article] != logits[:, article]).all()
    others = [a for a in range(N_SPECIAL, N_CATALOGUE) if a != article]
    torch.testing.assert_close(after[:, others], logits[:, others])


def test_attribute_models_count_the_papers_parameters_and_round_trip(tmp_path):
    paper = ModelConfig(d_model=128, n_blocks=4, n_heads=8, d_ff=256)
    for variant in PAPER_VARIANTS:  # attribute embeddings count with the article embeddings, left out
        bert = build_model(paper, variant + "_attrs", N_SPECIAL + 50, paper_spec(), ATTRIBUTES)
        assert count_paper_parameters(bert) == PAPER_PARAMETERS[variant]
    bert = attribute_model("global_state", "concat", seed=2)
    save_checkpoint(tmp_path / "checkpoint.pt", bert, {})
    loaded, _ = load_checkpoint(tmp_path / "checkpoint.pt")
    assert loaded.n_items == N_CATALOGUE and loaded.attributes.combine == "concat"
    assert not any("catalogue" in k or "id_rows" in k for k in loaded.state_dict())  # the weights only
    items, ctx = outfits_with_one_mask(2, size=4, length=8), context(2)
    with torch.no_grad():
        torch.testing.assert_close(loaded.masked_logits(items, ctx), bert.masked_logits(items, ctx))
    # A larger catalogue (articles added after training) is scored without touching a weight.
    loaded.set_catalogue(catalogue(N_CATALOGUE + 7, seed=1))
    with torch.no_grad():
        assert loaded.masked_logits(items, ctx).shape == (2, N_CATALOGUE + 7)


def test_attributes_are_refused_where_they_do_not_belong():
    with pytest.raises(ContextualBertError, match="needs article attributes"):
        build_model(SMALL, "none_attrs", N_ITEMS, SPEC)
    with pytest.raises(ContextualBertError, match="article ids only"):
        build_model(SMALL, "none", N_ITEMS, SPEC, ATTRIBUTES)
    bert = attribute_model("none")
    with pytest.raises(ContextualBertError, match="fewer than"):
        bert.set_catalogue(catalogue(N_ITEMS - 1))
    bad = catalogue()
    bad["price"][5] = N_SPECIAL + 5
    with pytest.raises(ContextualBertError, match="beyond"):
        bert.set_catalogue(bad)


# --- offsets for attribute values already in the outfit (model.AttributeOverlap) --------------------------


def overlap_model(model_name: str, seed: int = 0):
    torch.manual_seed(seed)
    bert = build_model(
        SMALL.model_copy(update={"attribute_overlap": True}), model_name + "_attrs", N_ITEMS, SPEC, ATTRIBUTES
    )
    bert.set_catalogue(catalogue())
    return bert.eval()


@pytest.mark.parametrize("model_name", ["none", "global_state", "bag_of_items_context"])
def test_attribute_overlap_starts_at_zero_and_round_trips(model_name, tmp_path):
    plain, with_overlap = attribute_model(model_name), overlap_model(model_name)
    items, ctx = outfits_with_one_mask(4, size=5, length=8), context(4)
    with torch.no_grad():  # the same draws and, with zero offsets, the same scores as without them
        torch.testing.assert_close(with_overlap.masked_logits(items, ctx), plain.masked_logits(items, ctx))
        for offset in with_overlap.reader(AttributeOverlap).offsets:
            offset.normal_()
        logits = with_overlap.masked_logits(items, ctx)
    assert not torch.allclose(logits, plain.masked_logits(items, ctx))
    save_checkpoint(tmp_path / "checkpoint.pt", with_overlap, {})
    loaded, _ = load_checkpoint(tmp_path / "checkpoint.pt")
    with torch.no_grad():
        torch.testing.assert_close(loaded.masked_logits(items, ctx), logits)
    paper = ModelConfig(d_model=128, n_blocks=4, n_heads=8, d_ff=256)
    if model_name in PAPER_VARIANTS:  # the offsets belong to the article side: the paper's count is unchanged
        counted = build_model(paper, model_name + "_attrs", N_SPECIAL + 50, paper_spec(), ATTRIBUTES)
        assert counted.reader(AttributeOverlap) is not None
        assert count_paper_parameters(counted) == PAPER_PARAMETERS[model_name]


def test_attribute_overlap_offsets_a_candidate_by_the_values_the_rest_of_the_outfit_holds():
    bert = overlap_model("none")
    tables = catalogue()
    bert.set_catalogue(tables)
    scale = AttributeOverlap.SCALE
    with torch.no_grad():
        product_type, colours, _ = (offset.detach() for offset in bert.reader(AttributeOverlap).offsets)
        product_type.copy_(torch.arange(len(product_type), dtype=torch.float) / 10)
        colours.copy_(-torch.arange(len(colours), dtype=torch.float) / 100)
    a, b = N_SPECIAL, N_SPECIAL + 1
    # Row 0 predicts position 2 ([MASK]); row 1 predicts position 0, which holds its own article (BERT keeps
    # 10% of the masked articles): that article must not count as "already in the outfit".
    items = torch.tensor([[a, b, MASK_INDEX, PAD_INDEX], [a, b, UNKNOWN_INDEX, PAD_INDEX]])
    select = torch.tensor([[False, False, True, False], [True, False, False, False]])
    with torch.no_grad():
        offsets = bert.outfit_offsets(items, select)
    assert offsets.shape == (2, N_CATALOGUE)

    def expected(others: list[int], candidate: int) -> float:
        total = 0.0
        types = {int(tables["product_type"][o]) for o in others}
        if int(tables["product_type"][candidate]) in types:
            total += float(product_type[int(tables["product_type"][candidate])]) * scale
        held = {int(v) for o in others for v in tables["colours"][o] if v != PAD_INDEX}
        values = [int(v) for v in tables["colours"][candidate] if v != PAD_INDEX]
        total += sum(float(colours[v]) * scale for v in values if v in held) / max(len(values), 1)
        return total  # price (its offsets still 0) adds nothing

    for candidate in range(N_SPECIAL, N_CATALOGUE):  # unseen articles (no id) included
        assert float(offsets[0, candidate]) == pytest.approx(expected([a, b], candidate), abs=1e-5)
        assert float(offsets[1, candidate]) == pytest.approx(expected([b], candidate), abs=1e-5)
    assert offsets[0].abs().sum() > 0
    assert not torch.allclose(offsets[0], offsets[1])  # row 1's own article made a difference, by leaving it out


def test_training_loss_with_attribute_overlap_trains_the_offsets():
    from contextual_bert.training import masked_item_loss

    bert = overlap_model("none").train()
    items = outfits_with_one_mask(6, size=5, length=8)
    targets = items.clone()
    predict = items == MASK_INDEX
    targets[predict] = N_SPECIAL + 7
    loss = masked_item_loss(bert, items, {}, predict, targets)
    loss.backward()
    assert torch.isfinite(loss) and bert.reader(AttributeOverlap).offsets[0].grad.abs().sum() > 0


# --- id dropout (train.id_dropout) -----------------------------------------------------------------------


@pytest.mark.parametrize("model_name", ["none", "global_state", "bag_of_items"])
def test_id_dropout_reads_unk_for_a_share_of_real_articles_in_training_only(model_name):
    bert = attribute_model(model_name)  # eval mode
    bert.set_id_dropout(0.25)
    sides = [bert.attributes] + ([bert.output_attributes] if model_name == "bag_of_items" else [])
    for side in sides:
        assert side.id_dropout == 0.25
        assert torch.equal(side.ids(), side.id_rows)  # evaluation: never dropped
    weight, bias = bert.output_layer()
    bert.train()
    attributes = bert.attributes
    torch.manual_seed(0)
    draws = torch.stack([attributes.ids() for _ in range(200)])
    changed = draws != attributes.id_rows
    assert (draws[changed] == UNKNOWN_INDEX).all()
    real = attributes.id_rows >= N_SPECIAL  # the specials, and the articles without an id, never change
    assert not changed[:, ~real].any() and real.sum() == N_ITEMS - N_SPECIAL
    assert abs(float(changed[:, real].float().mean()) - 0.25) < 0.02
    # The input side, per position: padding and [MASK] keep their rows, real articles are dropped at the rate.
    items = outfits_with_one_mask(400, size=6, length=8)
    flat = attributes.ids(items.reshape(-1))
    is_real = items.reshape(-1) >= N_SPECIAL
    assert torch.equal(flat[~is_real], items.reshape(-1)[~is_real])
    assert abs(float((flat[is_real] == UNKNOWN_INDEX).float().mean()) - 0.25) < 0.03
    # The output side: a dropped article is scored as an unseen one with its attributes, with the [UNK] bias.
    output_side = sides[-1]
    table = bert.output_embeddings if model_name == "bag_of_items" else bert.item_embeddings
    torch.manual_seed(1)
    dropped_weight, dropped_bias = bert.output_layer()
    torch.manual_seed(1)
    dropped = output_side.ids() != output_side.id_rows
    assert dropped.any() and not dropped.all()
    as_unseen = output_side(table, ids=torch.full_like(output_side.id_rows, UNKNOWN_INDEX))
    torch.testing.assert_close(dropped_weight[dropped], as_unseen[dropped])
    torch.testing.assert_close(dropped_weight[~dropped], weight[~dropped])
    assert (dropped_bias[dropped] == bert.output_bias[UNKNOWN_INDEX]).all()
    # the rows' own bias: in training an article without an id gets no calibration offset (evaluation's `bias` may)
    torch.testing.assert_close(dropped_bias[~dropped], bert.output_bias[output_side.id_rows][~dropped])


@pytest.mark.parametrize("model_name", ["none", "global_state_update", "bag_of_items_context"])
def test_a_model_without_attributes_has_no_id_dropout_and_draws_nothing_for_it(model_name):
    plain = build_model(SMALL, model_name, N_ITEMS, SPEC).train()
    with pytest.raises(ContextualBertError, match="no id dropout"):
        plain.set_id_dropout(0.5)
    weight, bias = plain.output_layer()
    table = plain.output_embeddings if model_name == "bag_of_items_context" else plain.item_embeddings
    assert weight is table.weight and bias is plain.output_bias  # the output layer as before the attributes
    state = torch.get_rng_state()
    items = outfits_with_one_mask(4, size=5, length=8)
    plain.eval()(items, context(4))
    assert torch.equal(torch.get_rng_state(), state)


# --- the bag path (model.bag_path, issue 45) -----------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("path", ["input", "output"])
def test_bag_path_adds_no_parameter_and_keeps_set_invariance_padding_and_round_trip(variant, path, tmp_path):
    paper = ModelConfig(d_model=128, n_blocks=4, n_heads=8, d_ff=256)
    with_path, without = (
        count_paper_parameters(ContextualBert(cfg, variant, N_SPECIAL + 1000, paper_spec()))
        for cfg in (paper.model_copy(update={"bag_path": path}), paper)
    )
    assert with_path == without == PAPER_PARAMETERS.get(variant, without)
    torch.manual_seed(0)
    bert = ContextualBert(SMALL.model_copy(update={"bag_path": path}), variant, N_ITEMS, SPEC).eval()
    items, ctx = outfits_with_one_mask(6, size=7, length=8), context(6)
    shuffled = items[:, torch.tensor([5, 2, 0, 7, 1, 6, 3, 4])]
    with torch.no_grad():
        logits = bert.masked_logits(items, ctx)
        torch.testing.assert_close(bert.masked_logits(shuffled, ctx), logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(bert.masked_logits(items[:, :7], ctx), logits, rtol=1e-5, atol=1e-5)
    save_checkpoint(tmp_path / "checkpoint.pt", bert, {})
    loaded, _ = load_checkpoint(tmp_path / "checkpoint.pt")
    assert loaded.model_cfg.bag_path == path
    with torch.no_grad():
        torch.testing.assert_close(loaded.masked_logits(items, ctx), logits)


def test_input_bag_path_gives_each_position_the_mean_of_the_other_articles():
    items = torch.tensor([[MASK_INDEX, N_SPECIAL, N_SPECIAL + 1, N_SPECIAL + 2, PAD_INDEX]])
    e = torch.arange(5 * 3, dtype=torch.float32).view(1, 5, 3)
    bag = other_articles_mean(e, items)
    torch.testing.assert_close(bag[0, 0], e[0, 1:4].mean(0))  # [MASK]: the three articles
    torch.testing.assert_close(bag[0, 1], e[0, 2:4].mean(0))  # an article: the two others ([MASK] left out)
    # the same weights with and without the path: only the input differs, by exactly the bag
    torch.manual_seed(0)
    plain = ContextualBert(SMALL, "none", N_ITEMS, SPEC).eval()
    with_bag = ContextualBert(SMALL.model_copy(update={"bag_path": "input"}), "none", N_ITEMS, SPEC).eval()
    with_bag.load_state_dict(plain.state_dict())
    seen = {}

    def keep(name):
        def hook(module, args):
            seen[name] = args[0].transpose(0, 1)  # the first block's input, (L, B, d); no dropout in eval mode

        return hook

    plain.blocks[0].register_forward_pre_hook(keep("plain"))
    with_bag.blocks[0].register_forward_pre_hook(keep("bag"))
    with torch.no_grad():
        plain(items[:, :4])
        with_bag(items[:, :4])
        x = plain.item_embeddings(items[:, :4]) * plain.input_scale
    torch.testing.assert_close(seen["bag"] - seen["plain"], other_articles_mean(x, items[:, :4]))


def test_output_bag_path_starts_the_logits_at_a_tied_bag_of_items():
    torch.manual_seed(0)
    plain = ContextualBert(SMALL, "none", N_ITEMS, SPEC).eval()
    with_bag = ContextualBert(SMALL.model_copy(update={"bag_path": "output"}), "none", N_ITEMS, SPEC).eval()
    with_bag.load_state_dict(plain.state_dict())
    items = outfits_with_one_mask(5, size=6, length=8)
    with torch.no_grad():
        difference = with_bag.masked_logits(items, None) - plain.masked_logits(items, None)
        e = plain.item_embeddings.weight
        bag = torch.stack([e[row[(row >= N_SPECIAL)]].mean(0) for row in items]) * plain.input_scale
    # the logits differ by exactly the bag's score of every article: mean(e_others) . e_a (times sqrt(d))
    torch.testing.assert_close(difference[:, N_SPECIAL:], bag @ e[N_SPECIAL:].T, rtol=1e-4, atol=1e-5)


def test_a_checkpoint_of_another_version_is_refused_naming_it(tmp_path):
    from contextual_bert.model import CHECKPOINT_VERSION, save_checkpoint

    model = ContextualBert(SMALL, "none", N_ITEMS, SPEC)
    save_checkpoint(tmp_path / "checkpoint.pt", model, {"epoch": 1})
    assert load_checkpoint(tmp_path / "checkpoint.pt")[1] == {"epoch": 1}
    payload = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    for version in (None, CHECKPOINT_VERSION - 1):  # none: written before the version existed
        torch.save(
            {**payload, "version": version} if version else {k: v for k, v in payload.items() if k != "version"},
            tmp_path / "old.pt",
        )
        with pytest.raises(
            ContextualBertError,
            match=rf"old\.pt: checkpoint version {version}: this code reads "
            rf"version {CHECKPOINT_VERSION} \(train the run again\)$",
        ):
            load_checkpoint(tmp_path / "old.pt")
