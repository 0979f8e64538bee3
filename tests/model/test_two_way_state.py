"""[GS2] (model/encoder.py, issue 70): the global state that the outfit writes to, between blocks, as well as reads."""

import json

import pytest
import torch
from helpers import wake_between_blocks
from test_model import SMALL, SPEC, context, outfits_with_one_mask, paper_spec

from contextual_bert.cli import main
from contextual_bert.config import ModelConfig
from contextual_bert.data.feature_spec import N_SPECIAL, PAD_INDEX
from contextual_bert.model import (
    PAPER_PARAMETERS,
    ContextualBert,
    count_paper_parameters,
    load_checkpoint,
    save_checkpoint,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: a second thread only adds synchronisation

GS2 = "global_state_two_way"
N_ITEMS = N_SPECIAL + 30


def trained_looking(variant: str, seed: int = 0) -> ContextualBert:
    """The variant at SMALL, its reads and updates between blocks away from their zero start."""
    torch.manual_seed(seed)
    bert = ContextualBert(SMALL, variant, N_ITEMS, SPEC).eval()
    wake_between_blocks(bert)
    return bert


def test_the_state_after_block_1_depends_on_the_outfit_in_gs2_only():
    items, ctx = outfits_with_one_mask(6, size=5, length=8), context(6)
    changed = items.clone()
    changed[:, 2] = torch.where(changed[:, 2] == N_SPECIAL, N_SPECIAL + 1, N_SPECIAL)  # one article of each outfit
    for variant in ("global_state", "global_state_update", GS2):
        bert = trained_looking(variant)
        with torch.no_grad():
            before, after = bert.global_states(items, ctx), bert.global_states(changed, ctx)
        assert len(before) == len(after) == SMALL.n_blocks
        assert torch.equal(before[0], after[0])  # block 1 reads c~ = FNN(c): the context only
        if variant == GS2:  # every row's state has read its outfit
            assert ((before[1] - after[1]).abs().amax(dim=1) > 1e-4).all(), variant
        else:
            assert torch.equal(before[1], after[1]), variant
    assert ContextualBert(SMALL, "concat", N_ITEMS, SPEC).global_states(items, ctx) == []


def test_gs2_starts_out_exactly_as_gs():
    """The reads and updates start as the identity: [GS]'s weights in [GS2] give [GS]'s outputs, bit for bit."""
    paper = ModelConfig(d_model=128, n_blocks=4, n_heads=8, d_ff=256, dropout=0.1)
    torch.manual_seed(0)
    gs = ContextualBert(paper, "global_state", N_ITEMS, SPEC).eval()
    gs2 = ContextualBert(paper, GS2, N_ITEMS, SPEC).eval()
    missing, unexpected = gs2.load_state_dict(gs.state_dict(), strict=False)
    assert not unexpected and missing
    assert all(name.startswith(("global_state_reads.", "global_state_updates.")) for name in missing)
    items, ctx = outfits_with_one_mask(64, size=6, length=8), context(64)
    with torch.no_grad():
        assert torch.equal(gs2.masked_logits(items, ctx), gs.masked_logits(items, ctx))
        assert all(torch.equal(a, b) for a, b in zip(gs2.global_states(items, ctx), gs.global_states(items, ctx)))


def test_gs2_ignores_padding_and_order_and_selects_after_reading_every_position():
    bert = trained_looking(GS2)
    items, ctx = outfits_with_one_mask(6, size=6, length=6), context(6)
    padded = torch.nn.functional.pad(items, (0, 2), value=PAD_INDEX)
    shuffled = padded[:, torch.tensor([5, 2, 0, 7, 1, 6, 3, 4])]  # padding moves to the middle
    select = torch.zeros(6, 8, dtype=torch.bool)
    select[:, 0] = True  # one position per outfit: the last block computes it alone, after the read of all
    select[1, 3] = True
    with torch.no_grad():
        logits = bert.masked_logits(items, ctx)
        torch.testing.assert_close(bert.masked_logits(padded, ctx), logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(bert.masked_logits(shuffled, ctx), logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(bert(padded, ctx, select=select), bert(padded, ctx)[select])


def test_gs2_learns_its_reads_and_round_trips(tmp_path):
    bert = ContextualBert(SMALL, GS2, N_ITEMS, SPEC).train()
    items, ctx = outfits_with_one_mask(8, size=5, length=8), context(8)
    bert.masked_logits(items, ctx).logsumexp(dim=1).mean().backward()
    for read in bert.global_state_reads:  # from the zero start, the gain moves first
        assert read.norm.weight.grad.abs().sum() > 0
    bert = trained_looking(GS2, seed=4)
    save_checkpoint(tmp_path / "checkpoint.pt", bert, {})
    loaded, _ = load_checkpoint(tmp_path / "checkpoint.pt")
    assert loaded.name == GS2
    with torch.no_grad():
        torch.testing.assert_close(loaded.masked_logits(items, ctx), bert.masked_logits(items, ctx))


def test_gs2_counts_gsu_and_a_cross_attention_and_norm_per_update(capsys, tmp_path):
    paper = ModelConfig(d_model=128, n_blocks=4, n_heads=8, d_ff=256)
    gs2 = ContextualBert(paper, GS2, N_SPECIAL + 1000, paper_spec())
    read = 4 * (128 * 128 + 128) + 2 * 128  # W^Q, W^K, W^V, W^O and the read's g, b
    assert count_paper_parameters(gs2) == PAPER_PARAMETERS["global_state_update"] + 3 * read == 1_120_768
    (tmp_path / "params.yaml").write_text("")
    assert main(["--params", str(tmp_path / "params.yaml"), "describe-model", "--paper"]) == 0
    row = json.loads(capsys.readouterr().out)["variants"][GS2]
    assert row == {"parameters": 1_120_768, "paper_parameters": "not in the paper"}
