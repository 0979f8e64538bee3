"""A vector attribute in the model (model/articles.py, VectorProjection): a learned projection of each article's
vector summed into e_a, at the input and the tied output layer; a learned vector for an article without one. And
the calibration between known and new articles (ArticleAttributes.calibrate_unseen): outside training an article
without an id gets log(s (p K + U) / (p U)) on its logit (log(1 + p K / U) for `auto`), p the id dropout, s the
validation's share without an id, K the articles with an id and U those without, so that the [UNK]-read group
gets the share it should; nothing changes without id dropout or in training."""

import math

import pytest
import torch

from contextual_bert.config import ModelConfig
from contextual_bert.data.feature_spec import MASK_INDEX, N_SPECIAL, PAD_INDEX, ContextSpec, FeatureSpec
from contextual_bert.errors import ContextualBertError
from contextual_bert.model import AttributeOverlap, VectorProjection, build_model, load_checkpoint, save_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=16, dropout=0.0, max_set_size=8)
LENGTH = 5
N_IDS = N_SPECIAL + 10  # articles with an id embedding
N_ARTICLES = N_IDS + 4  # and four never seen in training
UNSEEN = N_IDS + 1
VECTOR = FeatureSpec("clip", "vector", "article", 0, 8, LENGTH)
TYPE = FeatureSpec("product_type", "categorical", "article", N_SPECIAL + 3, 8)


def catalogue(seed: int = 0, with_type: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    vectors = torch.randn(N_ARTICLES, LENGTH, generator=g)
    vectors[:N_SPECIAL] = float("nan")  # the specials have none (as the features stage stores them)
    vectors[N_IDS + 3] = float("nan")  # an unseen article without a vector
    out = {"clip": vectors}
    if with_type:
        out["product_type"] = torch.cat([torch.zeros(N_SPECIAL, dtype=torch.long),
                                         torch.randint(N_SPECIAL, N_SPECIAL + 3, (N_ARTICLES - N_SPECIAL,))])  # fmt: skip
    return out


def vector_model(model_name: str = "none_attrs", cfg: ModelConfig = SMALL, with_type=False, combine="sum"):
    torch.manual_seed(0)
    attributes = ContextSpec((VECTOR, TYPE) if with_type else (VECTOR,))
    model = build_model(cfg, model_name, N_IDS, ContextSpec(()), attributes, combine)
    model.set_catalogue(catalogue(with_type=with_type))
    return model.eval()


def logits(model, items: list[int]) -> torch.Tensor:
    outfit = torch.tensor([[MASK_INDEX, *items] + [PAD_INDEX] * (SMALL.max_set_size - 1 - len(items))])
    with torch.no_grad():
        return model.masked_logits(outfit, {})[0]


def with_vector(model, row: int, vector: torch.Tensor):
    changed = catalogue()
    changed["clip"][row] = vector
    model.set_catalogue(changed)
    return model


@pytest.mark.parametrize("model_name", ["none_attrs", "bag_of_items_attrs"])
def test_an_unseen_articles_score_depends_on_its_vector_at_the_output(model_name):
    model = vector_model(model_name)
    before = logits(model, [N_SPECIAL, N_SPECIAL + 1])
    after = logits(with_vector(model, UNSEEN, torch.ones(LENGTH) * 2), [N_SPECIAL, N_SPECIAL + 1])
    assert after[UNSEEN] != before[UNSEEN]  # ranked by its vector: it has no id of its own
    others = [i for i in range(N_SPECIAL, N_ARTICLES) if i != UNSEEN]
    torch.testing.assert_close(after[others], before[others])


def test_an_unseen_article_in_the_outfit_is_read_by_its_vector_at_the_input():
    model = vector_model()
    before = logits(model, [UNSEEN, N_SPECIAL])
    after = logits(with_vector(model, UNSEEN, torch.ones(LENGTH) * 2), [UNSEEN, N_SPECIAL])
    others = [i for i in range(N_SPECIAL, N_ARTICLES) if i != UNSEEN]
    assert not torch.allclose(after[others], before[others])


def test_an_article_without_a_vector_reads_the_learned_missing_vector():
    model = vector_model()
    table, projection = model.item_embeddings, model.attributes.embeddings[0]
    assert isinstance(projection, VectorProjection)
    unk = table.weight[2]
    with torch.no_grad():
        e = model.attributes(table, torch.tensor([N_IDS + 3]))[0]
        torch.testing.assert_close(e, (unk + projection.missing) * model.attributes.scale)
        # the specials read no vector at all: zero, as every attribute's PAD row
        torch.testing.assert_close(model.attributes(table, torch.tensor([PAD_INDEX]))[0], table.weight[0] * 0.5**0.5)
    # learned: training moves it
    model.train()
    outfit = torch.tensor([[MASK_INDEX, N_IDS + 3, N_SPECIAL, PAD_INDEX, PAD_INDEX, PAD_INDEX, PAD_INDEX, PAD_INDEX]])
    model.masked_logits(outfit, {})[0, N_IDS + 3].backward()
    assert projection.missing.grad is not None and projection.missing.grad.abs().sum() > 0
    assert projection.linear.weight.grad.abs().sum() > 0


def test_vectors_start_at_the_id_embeddings_scale():
    model = vector_model(cfg=SMALL.model_copy(update={"d_model": 256, "n_heads": 4}))
    unit = torch.nn.functional.normalize(torch.randn(2000, LENGTH), dim=1)
    projected = model.attributes.embeddings[0].linear(unit)
    assert projected.pow(2).mean().item() == pytest.approx(1 / 256, rel=0.1)


def test_a_vector_has_no_outfit_offsets_and_another_attribute_keeps_them():
    assert vector_model().reader(AttributeOverlap) is None
    overlap = vector_model(with_type=True).reader(AttributeOverlap)
    assert [f.name for f in overlap.spec.features] == ["product_type"]
    assert logits(vector_model(with_type=True), [N_SPECIAL]).isfinite()[N_SPECIAL + 1 :].all()


def test_concat_combine_projects_the_vector_at_its_spec_dim():
    model = vector_model(combine="concat")
    assert model.attributes.embeddings[0].linear.out_features == VECTOR.dim
    assert logits(model, [UNSEEN])[N_SPECIAL:].isfinite().all()


def test_a_checkpoint_keeps_the_projection_and_the_vectors(tmp_path):
    model = vector_model()
    save_checkpoint(tmp_path / "checkpoint.pt", model, {})
    loaded, _ = load_checkpoint(tmp_path / "checkpoint.pt")
    torch.testing.assert_close(logits(loaded, [UNSEEN, N_SPECIAL]), logits(model, [UNSEEN, N_SPECIAL]))


def test_a_catalogue_vector_of_another_length_is_refused():
    model = vector_model()
    wrong = {"clip": torch.zeros(N_ARTICLES, LENGTH + 1)}
    with pytest.raises(ContextualBertError, match=r"catalogue vector 'clip' is of shape \(17, 6\), not \(n, 5\)"):
        model.set_catalogue(wrong)


# --- the calibration between known and new articles ------------------------------------------------------

KNOWN, WITHOUT_ID = N_IDS - N_SPECIAL, N_ARTICLES - N_IDS


@pytest.mark.parametrize("model_name", ["none_attrs", "bag_of_items_attrs"])
def test_the_offset_is_log_one_plus_p_known_over_unseen_on_both_article_sides(model_name):
    model = vector_model(model_name)
    model.set_id_dropout(0.25)
    expected = math.log1p(0.25 * KNOWN / WITHOUT_ID)
    sides = [s for s in (model.attributes, getattr(model, "output_attributes", None)) if s is not None]
    assert [s.unseen_offset for s in sides] == [pytest.approx(expected)] * len(sides)


def test_a_rate_set_by_hand_aims_the_group_at_the_validation_share_not_at_the_rate():
    model = vector_model()
    model.set_id_dropout(0.5, unseen_share=0.1)  # a rate above the share: the group must get 0.1, not 0.5
    assert model.attributes.unseen_offset == pytest.approx(
        math.log(0.1 * (0.5 * KNOWN + WITHOUT_ID) / (0.5 * WITHOUT_ID))
    )
    model.set_id_dropout(0.5, unseen_share=0.0)  # validation meets no article without an id: no offset
    assert model.attributes.unseen_offset == 0.0


def test_outside_training_only_the_articles_without_an_id_move_by_the_offset():
    plain = logits(vector_model(), [UNSEEN, N_SPECIAL])
    model = vector_model()
    model.set_id_dropout(0.5)
    model.eval()
    moved = logits(model, [UNSEEN, N_SPECIAL]) - plain
    offset = math.log1p(0.5 * KNOWN / WITHOUT_ID)
    torch.testing.assert_close(moved[N_SPECIAL:N_IDS], torch.zeros(KNOWN))
    torch.testing.assert_close(moved[N_IDS:], torch.full((WITHOUT_ID,), offset))


def test_in_training_the_output_bias_is_the_id_rows_own():
    model = vector_model()
    model.set_id_dropout(0.5)
    model.train()
    model.set_id_dropout(0.0)  # no draws: the rows read their own ids, [UNK] for the articles without one
    model.attributes.unseen_offset = 1.0  # even with an offset set, training never adds it
    weight, bias = model.output_layer()
    torch.testing.assert_close(bias, model.output_bias[model.attributes.id_rows])


@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_without_id_dropout_or_without_articles_lacking_an_id_nothing_changes(rate):
    model = vector_model()
    before = logits(model, [UNSEEN, N_SPECIAL])
    model.set_id_dropout(0.0)
    assert model.attributes.unseen_offset == 0.0
    assert torch.equal(logits(model, [UNSEEN, N_SPECIAL]), before)  # the same bits
    known_only = {name: values[:N_IDS] for name, values in catalogue().items()}
    model.set_catalogue(known_only)
    model.set_id_dropout(rate)
    assert model.attributes.unseen_offset == 0.0


def test_a_checkpoint_keeps_the_offset_and_a_larger_catalogue_at_serving_keeps_it_too(tmp_path):
    model = vector_model()
    model.set_id_dropout(0.4)
    save_checkpoint(tmp_path / "checkpoint.pt", model, {})
    loaded, _ = load_checkpoint(tmp_path / "checkpoint.pt")
    assert model.attributes.unseen_offset > 0
    assert loaded.attributes.unseen_offset == pytest.approx(model.attributes.unseen_offset)
    torch.testing.assert_close(logits(loaded, [UNSEEN, N_SPECIAL]), logits(model.eval(), [UNSEEN, N_SPECIAL]))
    larger = {name: torch.cat([values, values[N_IDS : N_IDS + 2]]) for name, values in catalogue().items()}
    loaded.set_catalogue(larger)  # two articles added after training: fixed at training, the offset stays
    assert loaded.attributes.unseen_offset == pytest.approx(model.attributes.unseen_offset)
    scores = logits(loaded, [UNSEEN, N_SPECIAL])
    torch.testing.assert_close(scores[-2:], scores[N_IDS : N_IDS + 2])
