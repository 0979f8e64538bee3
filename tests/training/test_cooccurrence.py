import math

import pytest
import torch

import contextual_bert.training.cooccurrence as cooccurrence
from contextual_bert.config import ModelConfig, TrainConfig
from contextual_bert.data.feature_spec import N_SPECIAL, PAD_INDEX, UNKNOWN_INDEX, ContextSpec
from contextual_bert.data.feature_store import load_spec
from contextual_bert.model import build_model

A, B, C, D = (N_SPECIAL + i for i in range(4))


def test_pair_counts_and_ppmi_by_hand():
    """Three outfits {A,B,C}, {A,B}, {C,D} (+ padding and [UNK], which never count): the pairs and PPMI of a
    hand count."""
    items = torch.tensor([[A, B, C, PAD_INDEX], [B, A, UNKNOWN_INDEX, PAD_INDEX], [C, D, PAD_INDEX, PAD_INDEX]])
    counts = cooccurrence.pair_counts(items, N_SPECIAL + 4).to_dense()
    assert counts[A, B] == counts[B, A] == 2
    assert counts[A, C] == counts[B, C] == counts[C, D] == 1
    assert counts[A, A] == 0 and counts[:N_SPECIAL].sum() == 0 and counts[:, :N_SPECIAL].sum() == 0

    # {A,B} x 3, {A,C}, {C,D} x 3: N = 2 * 7 = 14 ordered pairs; n_A = 4, n_B = 3, n_C = 4, n_D = 3
    items = torch.tensor([[A, B]] * 3 + [[A, C]] + [[C, D]] * 3)
    pmi = cooccurrence.ppmi(cooccurrence.pair_counts(items, N_SPECIAL + 4)).to_dense()
    assert pmi[A, B].item() == pytest.approx(math.log(3 * 14 / (4 * 3)))
    assert pmi[C, D].item() == pytest.approx(math.log(3 * 14 / (4 * 3)))
    assert pmi[A, C] == 0  # log(14 / 16) < 0: only the positive part is kept
    assert pmi[A, D] == 0 and torch.equal(pmi, pmi.T)


def two_groups(n: int, seed: int = 0) -> torch.Tensor:
    """Outfits of 3 articles drawn from one of two groups of 6 articles each, never mixed."""
    g = torch.Generator().manual_seed(seed)
    group = torch.randint(0, 2, (n, 1), generator=g)
    picks = torch.rand(n, 6, generator=g).argsort(dim=1)[:, :3]
    items = torch.zeros(n, 5, dtype=torch.long)
    items[:, :3] = N_SPECIAL + group * 6 + picks
    return items


def test_articles_that_share_outfits_start_close():
    rows, has_pairs = cooccurrence.cooccurrence_embeddings(two_groups(400), N_SPECIAL + 14, 8)
    assert has_pairs[N_SPECIAL : N_SPECIAL + 12].all() and not has_pairs[N_SPECIAL + 12 :].any()
    unit = torch.nn.functional.normalize(rows[N_SPECIAL : N_SPECIAL + 12], dim=1)
    cosine = unit @ unit.T
    same = torch.block_diag(torch.ones(6, 6), torch.ones(6, 6)).bool() & ~torch.eye(12, dtype=torch.bool)
    differ = ~torch.block_diag(torch.ones(6, 6), torch.ones(6, 6)).bool()
    assert cosine[same].min() > cosine[differ].max()


def test_the_randomised_svd_spans_the_dense_one_and_leaves_the_random_stream(monkeypatch):
    items = two_groups(400)
    dense, _ = cooccurrence.cooccurrence_embeddings(items, N_SPECIAL + 14, 2)
    monkeypatch.setattr(cooccurrence, "DENSE_SVD_MAX_ITEMS", 4)
    state = torch.get_rng_state()
    approx, _ = cooccurrence.cooccurrence_embeddings(items, N_SPECIAL + 14, 2)
    assert torch.equal(state, torch.get_rng_state())
    # the same 2-d subspace (signs and rotation within it may differ)
    q_dense, q_approx = torch.linalg.qr(dense)[0], torch.linalg.qr(approx)[0]
    assert torch.linalg.svdvals(q_dense.T @ q_approx).min() > 0.99


@pytest.mark.parametrize("model_name", ["none", "bag_of_items"])
def test_init_sets_the_rows_with_pairs_at_the_tables_scale_and_keeps_the_rest(model_name):
    torch.manual_seed(0)
    model = build_model(ModelConfig(d_model=8, n_blocks=1, n_heads=2, d_ff=16, max_set_size=5), model_name,
                        N_SPECIAL + 14, ContextSpec(()))  # fmt: skip
    tables = [model.item_embeddings] + ([model.output_embeddings] if model_name == "bag_of_items" else [])
    before = [t.weight.detach().clone() for t in tables]
    assert cooccurrence.init_from_cooccurrence(model, two_groups(400)) == 12
    for table, old in zip(tables, before):
        new = table.weight.detach()
        assert torch.equal(new[N_SPECIAL + 12 :], old[N_SPECIAL + 12 :])  # never in an outfit: untouched
        assert torch.equal(new[:N_SPECIAL], old[:N_SPECIAL])
        assert not torch.equal(new[N_SPECIAL : N_SPECIAL + 12], old[N_SPECIAL : N_SPECIAL + 12])
        assert new[N_SPECIAL : N_SPECIAL + 12].std().item() == pytest.approx(old[N_SPECIAL:].std().item(), rel=1e-5)


def test_init_embeddings_is_in_the_run_key_at_every_value():
    """One checkpoint version, no older keys kept: a run holds the setting at its default too, so changing it
    starts the run afresh."""
    assert TrainConfig().read_by("none")["init_embeddings"] == "random"
    assert TrainConfig(init_embeddings="cooccurrence").read_by("none")["init_embeddings"] == "cooccurrence"


def test_train_starts_from_cooccurrence_only_when_asked(tmp_path, monkeypatch):
    """`training.train` applies the setting before `fit` (stubbed here: only the start matters)."""
    from feature_data import build_paper_features

    import contextual_bert.training as training

    features_dir, _, _ = build_paper_features(tmp_path)
    started = []
    monkeypatch.setattr(
        training.trainer,
        "fit",
        lambda model, *args, **kwargs: started.append(model.item_embeddings.weight.detach().clone()) or {},
    )
    model_cfg = ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=32, max_set_size=8)
    for name in ("random", "cooccurrence"):
        training.train(
            features_dir, tmp_path / name, "none", 0, model_cfg, TrainConfig(init_embeddings=name, device="cpu")
        )
    random_start, cooccurrence_start = started
    assert not torch.equal(random_start, cooccurrence_start)
    torch.manual_seed(0)
    fresh = build_model(model_cfg, "none", random_start.shape[0], load_spec(features_dir))
    assert torch.equal(random_start, fresh.item_embeddings.weight.detach())
