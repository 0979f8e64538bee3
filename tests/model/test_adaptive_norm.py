"""[AdaLN] (model/encoder.py, issue 89): adaLN-Zero, the context scales and shifts every block's norms and gates its
sublayers, the regression started at zero."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from helpers import wake_between_blocks
from test_model import ATTRIBUTES, SMALL, SPEC, attribute_model, context, outfits_with_one_mask, paper_spec

from contextual_bert.cli import main
from contextual_bert.config import ModelConfig
from contextual_bert.data.feature_spec import N_SPECIAL
from contextual_bert.model import (
    N_MODULATIONS,
    PAPER_PARAMETERS,
    ContextualBert,
    build_model,
    count_paper_parameters,
    load_checkpoint,
    save_checkpoint,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: a second thread only adds synchronisation

ADALN = "adaptive_norm"
N_ITEMS = N_SPECIAL + 30


def block_outputs(bert: ContextualBert, items: torch.Tensor, ctx: dict) -> list[torch.Tensor]:
    """Every block's output (L, B, d) for the outfits `items` (B, L), by forward hooks (as the conditioning study's
    per-block probe reads them)."""
    outputs: list[torch.Tensor] = []
    hooks = [b.register_forward_hook(lambda _m, _i, out: outputs.append(out)) for b in bert.blocks]
    try:
        with torch.no_grad():
            bert(items, ctx)
    finally:
        for hook in hooks:
            hook.remove()
    return outputs


def test_at_initialisation_the_logits_do_not_depend_on_the_context_and_the_gates_learn_first():
    torch.manual_seed(0)
    bert = ContextualBert(SMALL, ADALN, N_ITEMS, SPEC).train()
    items, ctx, other = outfits_with_one_mask(8, size=5, length=8), context(8), context(8, seed=1)
    assert any(not torch.equal(ctx[name], other[name]) for name in ctx)
    with torch.no_grad():
        bert.eval()
        assert torch.equal(bert.masked_logits(items, ctx), bert.masked_logits(items, other))
        bert.train()
    bert.masked_logits(items, ctx).logsumexp(dim=1).mean().backward()
    for block in bert.blocks:  # from the zero start the regression moves first (the sublayers' outputs are gated off)
        grad = block.modulation.linear.bias.grad.view(N_MODULATIONS, -1)
        assert grad[2].abs().sum() > 0 and grad[5].abs().sum() > 0  # the gates of attention and FFN
        assert block.modulation.linear.weight.grad.abs().sum() > 0  # ... and how they depend on c
        assert block.attention.query.weight.grad is None or block.attention.query.weight.grad.abs().sum() == 0


def test_at_initialisation_every_block_is_the_post_norm_identity():
    """Zero gates, scales and shifts: a block is LN(LN(x)), and LN(x) = x already for the normalised input of blocks
    2..n; block 1 normalises the scaled embeddings."""
    torch.manual_seed(1)
    bert = ContextualBert(SMALL, ADALN, N_ITEMS, SPEC).eval()
    items, ctx = outfits_with_one_mask(6, size=6, length=6), context(6)
    outputs = block_outputs(bert, items, ctx)
    x = bert.article_vectors(items).transpose(0, 1) * bert.input_scale
    with torch.no_grad():
        torch.testing.assert_close(outputs[0], F.layer_norm(F.layer_norm(x, (SMALL.d_model,)), (SMALL.d_model,)))
    for before, after in zip(outputs, outputs[1:]):
        torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)


def test_at_gate_one_it_is_the_papers_post_norm_block_with_the_norms_gains_and_biases_as_the_regressions_bias():
    """The mapping onto the post-norm block: with the gates' bias at 1, the scales' at g - 1 and the shifts' at b and
    no dependence on c, [AdaLN] holding [None]'s weights gives [None]'s logits ([None]'s norms' g, b drawn at random)."""
    torch.manual_seed(2)
    plain = ContextualBert(SMALL, "none", N_ITEMS, SPEC).eval()
    adaln = ContextualBert(SMALL, ADALN, N_ITEMS, SPEC).eval()
    with torch.no_grad():
        for block in plain.blocks:
            for norm in (block.attention_norm, block.feed_forward_norm):
                norm.weight.normal_(1.0, 0.3)
                norm.bias.normal_(std=0.3)
    missing, unexpected = adaln.load_state_dict(plain.state_dict(), strict=False)
    assert all(k.startswith(("context_embedding.", "adaptive_condition.")) or ".modulation." in k for k in missing)
    assert all(k.endswith(("_norm.weight", "_norm.bias")) for k in unexpected) and unexpected
    with torch.no_grad():
        for mine, paper in zip(adaln.blocks, plain.blocks):
            shift_1, scale_1, gate_1, shift_2, scale_2, gate_2 = mine.modulation.linear.bias.view(N_MODULATIONS, -1)
            gate_1.fill_(1.0), gate_2.fill_(1.0)
            scale_1.copy_(paper.attention_norm.weight - 1), shift_1.copy_(paper.attention_norm.bias)
            scale_2.copy_(paper.feed_forward_norm.weight - 1), shift_2.copy_(paper.feed_forward_norm.bias)
    items, ctx = outfits_with_one_mask(16, size=6, length=8), context(16)
    with torch.no_grad():
        torch.testing.assert_close(adaln.masked_logits(items, ctx), plain.masked_logits(items, None))


def test_away_from_zero_the_context_changes_every_blocks_output_and_selecting_computes_the_same():
    torch.manual_seed(3)
    bert = ContextualBert(SMALL, ADALN, N_ITEMS, SPEC).eval()
    wake_between_blocks(bert)  # the regression's weights drawn at random, as training moves them from zero
    items, ctx = outfits_with_one_mask(6, size=5, length=8), context(6)
    other = dict(ctx, gender=torch.where(ctx["gender"] == N_SPECIAL, N_SPECIAL + 1, N_SPECIAL))  # every row's
    for block, (mine, theirs) in enumerate(zip(block_outputs(bert, items, ctx), block_outputs(bert, items, other))):
        real = (items != 0).T  # (L, B): the real positions
        assert ((mine - theirs).abs().amax(dim=2)[real] > 1e-4).all(), f"block {block + 1}"
    select = torch.zeros(6, 8, dtype=torch.bool)
    select[:, 0] = True
    select[2, 3] = True
    with torch.no_grad():
        torch.testing.assert_close(bert(items, ctx, select=select), bert(items, ctx)[select])
        assert not torch.allclose(bert.masked_logits(items, ctx), bert.masked_logits(items, other))


def test_a_checkpoint_round_trips_the_modulation(tmp_path):
    torch.manual_seed(4)
    bert = ContextualBert(SMALL, ADALN, N_ITEMS, SPEC).eval()
    wake_between_blocks(bert)
    save_checkpoint(tmp_path / "checkpoint.pt", bert, {})
    loaded, _ = load_checkpoint(tmp_path / "checkpoint.pt")
    assert loaded.name == ADALN
    items, ctx = outfits_with_one_mask(8, size=5, length=8), context(8)
    with torch.no_grad():
        torch.testing.assert_close(loaded.masked_logits(items, ctx), bert.masked_logits(items, ctx))


def test_the_attrs_twin_builds_counts_as_its_twin_and_learns(tmp_path):
    paper = ModelConfig(d_model=128, n_blocks=4, n_heads=8, d_ff=256)
    twin = build_model(paper, ADALN + "_attrs", N_SPECIAL + 50, paper_spec(), ATTRIBUTES)
    assert count_paper_parameters(twin) == count_paper_parameters(
        ContextualBert(paper, ADALN, N_SPECIAL + 50, paper_spec())
    )
    bert = attribute_model(ADALN, seed=5).train()
    items, ctx = outfits_with_one_mask(8, size=5, length=8), context(8)
    optimizer = torch.optim.Adam(bert.parameters(), lr=1e-2)
    target = torch.full((8,), N_SPECIAL + 1)
    losses = []
    for _ in range(5):
        loss = F.cross_entropy(bert.masked_logits(items, ctx), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(block.modulation.linear.weight.abs().sum() > 0 for block in bert.blocks)  # c now modulates


def test_adaln_counts_a_projection_of_c_and_a_regression_per_block_for_the_norms_affine(capsys, tmp_path):
    paper = ModelConfig(d_model=128, n_blocks=4, n_heads=8, d_ff=256)
    adaln = ContextualBert(paper, ADALN, N_SPECIAL + 1000, paper_spec())
    condition = 736 * 128 + 128  # z = W_c c
    per_block = 128 * N_MODULATIONS * 128 + N_MODULATIONS * 128 - 2 * 2 * 128  # Linear(SiLU(z)); norms' g, b gone
    assert count_paper_parameters(adaln) == PAPER_PARAMETERS["none"] + condition + 4 * per_block == 1_035_008
    (tmp_path / "params.yaml").write_text("")
    assert main(["--params", str(tmp_path / "params.yaml"), "describe-model", "--paper"]) == 0
    row = json.loads(capsys.readouterr().out)["variants"][ADALN]
    assert row == {"parameters": 1_035_008, "paper_parameters": "not in the paper"}


@pytest.mark.parametrize("model", [ADALN, ADALN + "_attrs"])
def test_contextual_bert_trains_evaluates_and_serves_it(tiny_project, tmp_path, model):
    """`contextual-bert train` and `evaluate` on the tiny project (runs of its own; the twin's features with the
    catalogue's attributes), then the completer ranks the catalogue with the trained model."""
    from contextual_bert.serving.completer import OutfitCompleterCore

    params = yaml.safe_load(tiny_project.params.read_text())
    params["paths"] |= {"models_dir": str(tmp_path / "models"), "reports_dir": str(tmp_path / "reports")}
    params["per_model"] = {model: {"max_epochs": 2}}
    attrs = model.endswith("_attrs")
    if attrs:
        params["paths"]["features_dir"] = str(tmp_path / "features")
        shipped = yaml.safe_load((Path(__file__).resolve().parents[2] / "params.yaml").read_text())["features"]
        params["features"] |= {"article_features": True, "article_attributes": shipped["article_attributes"]}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    features_dir = tmp_path / "features" if attrs else tiny_project.features_dir
    for stage in ("features", "train", "evaluate") if attrs else ("train", "evaluate"):
        if stage == "features":
            assert main(["--params", str(tmp_path / "params.yaml"), stage]) == 0
            continue
        assert main(["--params", str(tmp_path / "params.yaml"), stage, "--model", model, "--seed", "0"]) == 0, stage
    metrics = json.loads((tmp_path / "reports" / "eval" / f"{model}-s0.json").read_text())
    assert metrics["test"]["cross_entropy"] > 0
    core = OutfitCompleterCore.load(tmp_path / "models" / f"{model}-s0" / "checkpoint.pt", features_dir)
    assert core.model.name == model and (core.model.attributes is not None) == attrs
    validated = tiny_project.cfg.paths.validated_dir
    customers = pd.read_parquet(validated / "customers.parquet").head(3).reset_index(drop=True)
    outfits = pd.read_parquet(validated / "outfits.parquet").head(3)
    rows = customers.drop(columns=["customer_id"])
    rows["article_ids"] = [list(ids[:2]) for ids in outfits["article_ids"]]
    rows["occasion"] = outfits["occasion"].to_numpy()
    answer = core.recommend(rows, top_k=5)
    for outfit, ids, scores in zip(rows["article_ids"], answer["article_ids"], answer["scores"]):
        assert len(set(ids)) == 5 and not set(ids) & set(outfit)
        assert all(a >= b for a, b in zip(scores, scores[1:])) and 0 < sum(scores) <= 1
