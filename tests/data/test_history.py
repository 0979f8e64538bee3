"""The customer's history (history.py), the time split and the history feature through the features stage,
the model and the outfit encoder."""

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from feature_data import paper_cfg, paper_tables, write_validated

from contextual_bert.config import EvaluateConfig, HistoryConfig, ModelConfig
from contextual_bert.data.contract import DATE_COLUMN, PAPER_SCHEMA
from contextual_bert.data.feature_spec import HISTORY_COLUMN, HISTORY_FEATURE, PAD_INDEX
from contextual_bert.data.feature_store import OUTFITS_FILE, load_article_vocab, load_spec, load_split
from contextual_bert.data.features import assign_time_splits, build_features
from contextual_bert.data.history import earlier_outfits, history_items, listed_history
from contextual_bert.data.outfit_encoder import OutfitEncoder
from contextual_bert.errors import DataError
from contextual_bert.evaluation.counts import HISTORY_WEIGHTS, HistoryPopularityModel, history_log_probs, history_weight
from contextual_bert.evaluation.ranking import case_ranks
from contextual_bert.model import HistoryAttentionPooling, HistoryBag, HistoryPooling, HistoryRepeat, build_model

MAX_ITEMS = 12


def dated_tables(seed=0):
    """paper_tables with a date per outfit: few dates, so that many outfits share one."""
    articles, customers, outfits = paper_tables(seed=seed)
    rng = np.random.default_rng(seed + 1)
    outfits[DATE_COLUMN] = pd.Timestamp("2024-01-01") + pd.to_timedelta(rng.integers(0, 60, len(outfits)), "D")
    return articles, customers, outfits


@pytest.fixture(scope="module")
def dated(tmp_path_factory):
    root = tmp_path_factory.mktemp("dated")
    tables = dated_tables()
    validated = write_validated(root / "validated", PAPER_SCHEMA, *tables)
    cfg = paper_cfg(min_article_count=2, split="time", history=HistoryConfig(enabled=True, max_items=MAX_ITEMS))
    build_features(validated, root / "features", cfg, max_set_size=8)
    return root / "features", tables


def test_history_is_the_same_customers_strictly_earlier_outfits_only():
    customers = ["a", "a", "a", "b", None, "a"]
    dates = ["2024-01-03", "2024-01-01", "2024-01-03", "2024-01-02", "2024-01-01", "2024-01-02"]
    rows = earlier_outfits(customers, dates)
    assert [r.tolist() for r in rows] == [[5, 1], [], [5, 1], [], [], [1]]  # never itself, a later or same-day one
    eligible = [True, True, True, True, True, False]
    assert [r.tolist() for r in earlier_outfits(customers, dates, eligible)] == [[1], [], [1], [], [], [1]]
    items = [["x", "y"], ["y", "z"], ["q"], ["r"], ["s"], ["y", "w"]]
    # y worn twice first, then the most recent of those worn once (w), in 3 slots
    assert history_items(rows, items, 3) == [["y", "y", "w"], [], ["y", "y", "w"], [], [], ["y", "z"]]


def brute_force_slots(rows: np.ndarray, items: list, max_items: int) -> list:
    """The history rule counted afresh for one outfit: its earlier outfits most recent first."""
    listed = [article for row in rows for article in items[row]]
    order = sorted(dict.fromkeys(listed), key=lambda a: (-listed.count(a), listed.index(a)))
    return [a for a in order for _ in range(listed.count(a))][:max_items]


@pytest.mark.parametrize("eligible_share", [1.0, 0.6])
def test_counting_each_customer_once_gives_every_outfits_own_count(eligible_share):
    rng = np.random.default_rng(3)
    n = 400
    customers = rng.integers(0, 12, n).astype(str).tolist()
    dates = (pd.Timestamp("2024-01-01") + pd.to_timedelta(rng.integers(0, 40, n), "D")).tolist()
    items = [list(dict.fromkeys(rng.integers(0, 30, 5).tolist())) for _ in range(n)]  # re-worn articles
    rows = earlier_outfits(customers, dates, rng.random(n) < eligible_share)
    for max_items in (6, 1000):
        slots = history_items(rows, items, max_items)
        assert slots == [brute_force_slots(r, items, max_items) for r in rows]
    assert max(len(s) - len(set(s)) for s in slots) > 5  # articles held more than once


def test_a_listed_history_is_laid_out_as_the_features_stage_lays_it_out():
    # the client's list: each earlier outfit's articles, the most recent outfit first
    assert listed_history(["w", "y", "y", "z", "x"], 4) == ["y", "y", "w", "z"]
    assert listed_history(["y", "y", "w"], 4) == listed_history(listed_history(["y", "y", "w"], 4), 4)


def test_a_dated_outfits_history_holds_no_article_of_its_own_or_a_later_or_same_date_outfit(dated):
    features, (_, _, outfits) = dated
    stored = pq.read_table(features / OUTFITS_FILE).to_pandas()
    vocab = pq.read_table(features / "article_vocab.parquet").column("article_id").to_pylist()
    assert (stored["outfit_id"].to_numpy() == outfits["outfit_id"].to_numpy()).all()
    day = outfits[DATE_COLUMN].to_numpy()
    with_history = 0
    for row in range(len(outfits)):
        history = {vocab[i] for i in stored[HISTORY_FEATURE].iloc[row]} - {"[UNK]"}  # a0199: below min count
        same_customer = (outfits["customer_id"] == outfits["customer_id"].iloc[row]).to_numpy()
        allowed = set().union(*outfits["article_ids"][same_customer & (day < day[row])].map(set)) or set()
        assert history <= allowed, row
        assert len(history) <= MAX_ITEMS
        with_history += bool(history)
    assert with_history > len(outfits) // 2


def test_the_time_split_leaves_no_training_outfit_after_the_cut(dated):
    features, (_, _, outfits) = dated
    split = pq.read_table(features / OUTFITS_FILE).column("split").to_numpy(zero_copy_only=False)
    day = outfits[DATE_COLUMN].to_numpy()
    assert (
        day[split == "train"].max()
        < day[split == "val"].min()
        <= day[split == "val"].max()
        < day[split == "test"].min()
    )
    cfg = paper_cfg()
    for name, share in (("val", cfg.val_fraction), ("test", cfg.test_fraction)):
        assert 0.5 * share < (split == name).mean() < 2 * share, name  # whole days: about the share
    assert (assign_time_splits(day[::-1], 0.08, 0.08) == assign_time_splits(day, 0.08, 0.08)[::-1]).all()


def test_history_or_the_time_split_without_dates_is_a_one_line_error(tmp_path):
    validated = write_validated(tmp_path / "validated", PAPER_SCHEMA, *paper_tables())
    for cfg, what in (
        (paper_cfg(split="time"), "features.split: time"),
        (paper_cfg(history=HistoryConfig(enabled=True)), "features.history"),
    ):
        with pytest.raises(DataError, match=f"{what} needs the outfits' dates") as err:
            build_features(validated, tmp_path / "features", cfg, max_set_size=8)
        assert "\n" not in str(err.value)


def test_history_off_writes_exactly_the_features_of_before(tmp_path):
    """The date column and the new settings at their defaults leave every file of data/features as it was."""
    articles, customers, outfits = dated_tables()
    plain = write_validated(tmp_path / "plain", PAPER_SCHEMA, articles, customers, outfits.drop(columns=DATE_COLUMN))
    dated_dir = write_validated(tmp_path / "dated", PAPER_SCHEMA, articles, customers, outfits)
    build_features(plain, tmp_path / "f1", paper_cfg(), max_set_size=8)
    build_features(dated_dir, tmp_path / "f2", paper_cfg(), max_set_size=8)
    for path in sorted((tmp_path / "f1").iterdir()):
        if path.name == "manifest.json":  # its input hashes differ (the outfits table has a date column)
            a, b = (pd.read_json(p, typ="series").drop("inputs") for p in (path, tmp_path / "f2" / path.name))
            assert a.to_json() == b.to_json()
        else:
            assert path.read_bytes() == (tmp_path / "f2" / path.name).read_bytes(), path.name


def _model_and_split(features, model_name, pooling="mean", **readers):
    """A tiny model that reads the history through its share of c only, unless `readers` (history_repeat,
    history_bag) say otherwise."""
    spec = load_spec(features)
    vocab_rows = pq.read_metadata(features / "article_vocab.parquet").num_rows
    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=16,
        n_blocks=1,
        n_heads=2,
        d_ff=32,
        history_pooling=pooling,
        **({"history_repeat": False, "history_bag": False} | readers),
    )
    model = build_model(cfg, model_name, vocab_rows, spec).eval()
    if pooling == "attention":  # a query that tells articles apart (it starts at zero: the mean, scaled)
        for module in model.modules():
            if isinstance(module, HistoryAttentionPooling):
                torch.nn.init.normal_(module.query, std=3.0)
    return model, load_split(features, "test", 8)


@pytest.mark.parametrize(
    "model_name, pooling",
    [
        ("global_state", "mean"),
        ("bag_of_items_context", "mean"),
        ("global_state", "attention"),
        ("bag_of_items_context", "attention"),
    ],
)
def test_pooling_is_blind_to_the_order_of_the_history_and_the_history_changes_the_prediction(
    dated, model_name, pooling
):
    features, _ = dated
    model, test = _model_and_split(features, model_name, pooling)
    items = test.items.clone()
    last = (items != PAD_INDEX).sum(dim=1) - 1
    items[torch.arange(len(items)), last] = 1  # [MASK] the last item
    history = test.context[HISTORY_FEATURE]
    has = (history != PAD_INDEX).sum(dim=1) > 1
    assert has.sum() > 10
    with torch.no_grad():
        logits = model.masked_logits(items, test.context)
        reversed_history = torch.stack([torch.cat([h[h != PAD_INDEX].flip(0), h[h == PAD_INDEX]]) for h in history])
        shuffled = model.masked_logits(items, {**test.context, HISTORY_FEATURE: reversed_history})
        none = model.masked_logits(items, {**test.context, HISTORY_FEATURE: torch.zeros_like(history)})
    torch.testing.assert_close(shuffled, logits, rtol=1e-5, atol=1e-5)
    assert (none[has, 3:] - logits[has, 3:]).abs().amax(dim=1).min() > 1e-4  # (specials: -inf)


def test_a_request_with_history_is_encoded_and_one_without_reports_it_missing(dated):
    features, (_, _, outfits) = dated
    encoder = OutfitEncoder.load(features, 8)
    known = [a for a in outfits["article_ids"].iloc[0]]
    rows = pd.DataFrame(
        {"article_ids": [known[:3], known[:3], known[:3]], HISTORY_COLUMN: [known[3:] + ["nope"], None, []]}
    )
    encoded = encoder.encode(rows, with_mask=True)
    history = encoded.outfits.context[HISTORY_FEATURE]
    assert history.shape == (3, MAX_ITEMS)
    assert (history[0] != PAD_INDEX).sum() == len(known) - 3 + 1
    assert (history[1:] == PAD_INDEX).all()
    assert encoded.unknown_article_ids[0] == ["nope"]
    assert [HISTORY_FEATURE in m for m in encoded.missing_features] == [False, True, True]
    model, _ = _model_and_split(features, "global_state")
    with torch.no_grad():
        logits = model.masked_logits(encoded.outfits.items, encoded.outfits.context)
    assert not torch.allclose(logits[0], logits[1])
    torch.testing.assert_close(logits[1], logits[2])


def test_attention_pooling_weighs_the_history_by_its_evidence_and_gives_the_bias_for_none():
    """The null slot: with a query that matches an article, its weight (and so its share of c) grows with how
    often the history holds such articles, where a mean gives one article and five alike the same vector."""
    torch.manual_seed(0)
    table = torch.nn.Embedding(10, 4)
    pool = HistoryAttentionPooling(4, 3, n_heads=1)
    mean = HistoryPooling(4, 3)
    with torch.no_grad():
        pool.query.copy_(table.weight[5] * 4)
        pool.null_logit.fill_(float(pool.query[0] @ table.weight[5]) / 2)  # one such article: half the weight
        pool.projection.weight.copy_(torch.eye(3, 4))
        pool.projection.bias.zero_()
        mean.projection.load_state_dict(pool.projection.state_dict())
    once = torch.tensor([[5, PAD_INDEX, PAD_INDEX, PAD_INDEX, PAD_INDEX]])
    five = torch.tensor([[5, 5, 5, 5, 5]])
    none = torch.full((1, 5), PAD_INDEX)
    with torch.no_grad():
        torch.testing.assert_close(mean(once, table), mean(five, table))
        a, b = pool(once, table), pool(five, table)
        assert (b.abs() > a.abs() * 1.2).all() and (torch.sign(a) == torch.sign(b)).all()
        torch.testing.assert_close(pool(none, table), pool.projection.bias.unsqueeze(0))


@pytest.mark.parametrize("model_name", ["global_state", "bag_of_items_context"])
def test_the_repeat_offset_raises_exactly_the_history_articles_and_the_sampled_columns_are_the_full_ones(
    dated, model_name
):
    features, _ = dated
    model, test = _model_and_split(features, model_name)
    spec, n = load_spec(features), pq.read_metadata(features / "article_vocab.parquet").num_rows
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=32, history_repeat=True, history_bag=False)
    repeating = build_model(cfg, model_name, n, spec).eval()
    missing = repeating.load_state_dict(model.state_dict(), strict=False).missing_keys
    assert missing == ["logit_offsets.0.weight", "logit_offsets.0.worn"]  # the repeat's lambda and v_k
    with torch.no_grad():
        repeating.reader(HistoryRepeat).weight.copy_(torch.tensor([0.2, -0.03]))
        repeating.reader(HistoryRepeat).worn.copy_(torch.linspace(-0.1, 0.1, HistoryRepeat.WORN_LEVELS))
    items = test.items.clone()
    last = (items != PAD_INDEX).sum(dim=1) - 1
    items[torch.arange(len(items)), last] = 1  # [MASK] the last item
    history = test.context[HISTORY_FEATURE]
    with torch.no_grad():
        gained = repeating.masked_logits(items, test.context) - model.masked_logits(items, test.context)
    held = torch.zeros_like(gained, dtype=torch.bool).scatter_(1, history, True)
    held[:, :3] = False  # specials: -inf in both
    size = (history >= 3).sum(dim=1, keepdim=True).clamp_min(1).float()
    worn = torch.zeros_like(gained).scatter_add_(1, history, (history >= 3).float())  # slots holding the article
    # the mixture's lift over the output bias b (0 at a random start): log(1 + lambda k(a) / (n e^b))
    level = torch.linspace(-0.1, 0.1, HistoryRepeat.WORN_LEVELS)[worn.long().clamp(1, HistoryRepeat.WORN_LEVELS) - 1]
    scale = 10.0  # AttributeOverlap.SCALE
    log_lambda = HistoryRepeat.LOG_LAMBDA + (0.2 - 0.03 * size.log() + level) * scale - size.log()
    expected = torch.log1p(log_lambda.exp() * worn / repeating.output_bias.detach().exp()[None, :])
    rows = held.any(dim=1)
    assert rows.sum() > 10 and (worn > 1).sum() > 10  # articles worn more than once among them
    torch.testing.assert_close(gained[:, 3:][~held[:, 3:]], torch.zeros(int((~held[:, 3:]).sum())), atol=1e-5, rtol=0)
    torch.testing.assert_close(gained[held], expected.expand_as(gained)[held], atol=1e-5, rtol=1e-5)
    select = items == 1
    candidates = torch.tensor([5, 3, int(history[rows][0, 0]), n - 1])
    with torch.no_grad():
        full = repeating.outfit_offsets(items, select, context=test.context)
        sampled = repeating.outfit_offsets(items, select, candidates, context=test.context)
    torch.testing.assert_close(sampled, full[:, candidates])
    assert (
        repeating.outfit_offsets(items, select) is None
        and model.outfit_offsets(items, select, context=test.context) is None
    )


def test_the_served_trace_of_a_history_model_equals_the_model_with_and_without_history(dated):
    """Serving traces masked_logits on an example without history: attention pooling and the repeat offset
    still give the model's own logits for requests whose histories differ in length."""
    from contextual_bert.serving.completer import OutfitCompleterCore

    features, (_, _, outfits) = dated
    spec, n = load_spec(features), pq.read_metadata(features / "article_vocab.parquet").num_rows
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=32, history_pooling="attention", history_repeat=True)
    model = build_model(cfg, "global_state", n, spec).eval()
    with torch.no_grad():
        model.reader(HistoryRepeat).weight.copy_(torch.tensor([0.3, -0.05]))
        for module in model.modules():
            if isinstance(module, HistoryAttentionPooling):
                torch.nn.init.normal_(module.query, std=3.0)
    core = OutfitCompleterCore(model, OutfitEncoder.load(features, 8), torch.device("cpu"))
    assert core.masked_logits != model.masked_logits  # the trace, not the module
    ids = [a for row in outfits["article_ids"].iloc[:6] for a in row]
    rows = pd.DataFrame(
        {"article_ids": [ids[:2], ids[2:5], ids[5:6], ids[:3]], HISTORY_COLUMN: [ids[6:20], None, ids[8:9], ids[3:30]]}
    )
    encoded = core.encode(rows)
    items, context = encoded.outfits.items, encoded.outfits.context
    with torch.no_grad():
        traced, plain = core.masked_logits(items, context), model.masked_logits(items, context)
    torch.testing.assert_close(traced, plain, rtol=0, atol=0)
    first = {k: v[:1] for k, v in context.items()}
    with torch.no_grad():
        without = core.masked_logits(items[:1], {**first, HISTORY_FEATURE: torch.zeros_like(first[HISTORY_FEATURE])})
    assert not torch.allclose(plain[0, 3:], without[0, 3:])


def test_the_history_bag_adds_the_gated_mean_of_the_historys_output_vectors_to_the_head_state(dated):
    features, _ = dated
    model, test = _model_and_split(features, "global_state")
    spec, n = load_spec(features), pq.read_metadata(features / "article_vocab.parquet").num_rows
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=32, history_repeat=False, history_bag=True)
    bagged = build_model(cfg, "global_state", n, spec).eval()
    assert bagged.load_state_dict(model.state_dict(), strict=False).missing_keys == ["head_terms.1.gate"]
    items = test.items.clone()
    last = (items != PAD_INDEX).sum(dim=1) - 1
    items[torch.arange(len(items)), last] = 1
    history = test.context[HISTORY_FEATURE]
    with torch.no_grad():
        torch.testing.assert_close(bagged.masked_logits(items, test.context), model.masked_logits(items, test.context))
        bagged.reader(HistoryBag).gate.fill_(0.5)
        gained = bagged.masked_logits(items, test.context) - model.masked_logits(items, test.context)
        seen = (history != PAD_INDEX).unsqueeze(-1).float()
        mean = (model.item_embeddings(history) * seen).sum(1) / seen.sum(1).clamp_min(1) * model.input_scale
        expected = 0.5 * mean @ model.item_embeddings.weight.t()  # tied output vectors
    torch.testing.assert_close(gained[:, 3:], expected[:, 3:], atol=1e-4, rtol=1e-4)
    assert (history != PAD_INDEX).any(dim=1).sum() > 10 and expected[:, 3:].abs().amax() > 1e-2


def test_the_defaults_read_the_history_three_ways(dated):
    features, _ = dated
    spec, n = load_spec(features), pq.read_metadata(features / "article_vocab.parquet").num_rows
    default = build_model(ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=32), "global_state", n, spec)
    assert default.reader(HistoryRepeat) is not None and default.reader(HistoryBag) is not None
    assert (
        build_model(ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=32), "bag_of_items_context", n, spec).reader(
            HistoryRepeat
        )
        is not None
    )  # the bag of items reads its history through c: no gate


def test_a_history_champion_reencoded_from_validated_data_reads_its_history(dated, tmp_path):
    """Promotion's path for a champion trained on other features (promotion._reencoded_validation): the
    validation outfits re-encoded through its own vocabularies carry their history, by the one rule."""
    from contextual_bert.config import Config
    from contextual_bert.model import save_checkpoint
    from contextual_bert.registry.promotion import validation_cases
    from contextual_bert.serving.completer import OutfitCompleterCore

    features, _ = dated
    model, _ = _model_and_split(features, "global_state", history_repeat=True)
    assert model.reads_history
    save_checkpoint(tmp_path / "checkpoint.pt", model, {})
    core = OutfitCompleterCore.load(tmp_path / "checkpoint.pt", features, device="cpu")
    features_cfg = paper_cfg(
        min_article_count=2, split="time", history=HistoryConfig(enabled=True, max_items=MAX_ITEMS)
    )
    cfg = Config.model_validate(
        {
            "paths": {"features_dir": str(features), "validated_dir": str(features.parent / "validated")},
            "features": features_cfg.model_dump(),
        }
    )
    stored = load_split(features, "val", 8)
    reencoded = validation_cases(cfg, core, "other-features", "current-features")
    assert reencoded.outfit_ids == stored.outfit_ids and torch.equal(reencoded.items, stored.items)
    assert (stored.context[HISTORY_FEATURE] != PAD_INDEX).any(dim=1).sum() > 10
    assert torch.equal(reencoded.context[HISTORY_FEATURE], stored.context[HISTORY_FEATURE])


def test_the_history_weights_are_scored_in_one_pass_as_the_ranking_pass_scores_each(dated):
    features, _ = dated
    counts = np.asarray(load_article_vocab(features).counts)
    test = load_split(features, "test", 8)
    log_probs = history_log_probs(counts, test, HISTORY_WEIGHTS)
    for i, weight in enumerate(HISTORY_WEIGHTS):
        ranked = case_ranks(HistoryPopularityModel(counts, weight), test, 64, "cpu", with_ranks=False)["log_prob"]
        np.testing.assert_allclose(log_probs[:, i], ranked, atol=2e-6, rtol=0)
    chosen, by_weight = history_weight(counts, test, EvaluateConfig())
    assert by_weight[chosen] == min(by_weight.values()) and set(by_weight) == set(HISTORY_WEIGHTS)
    assert by_weight[0.0] != by_weight[0.5]  # the history changes the loss: the test cases have histories
