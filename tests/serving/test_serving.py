import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from helpers import STRONG, free_port, stop_process_group, wait_for_http, wake_between_blocks
from mlflow.exceptions import MlflowException

from contextual_bert.config import BASELINE_MODELS, VARIANTS
from contextual_bert.data.feature_spec import N_SPECIAL
from contextual_bert.data.feature_store import load_spec
from contextual_bert.errors import ContextualBertError
from contextual_bert.registry.tracking import client, experiment_id
from contextual_bert.serving.completer import (
    MAX_TOP_K,
    OUTPUT_COLUMNS,
    OutfitCompleterCore,
    example_request,
    log_pyfunc_model,
    signature,
)


@pytest.fixture(scope="session")
def core(tiny_trained_runs):
    checkpoint = tiny_trained_runs.cfg.paths.models_dir / f"{STRONG[0]}-s{STRONG[1]}" / "checkpoint.pt"
    return OutfitCompleterCore.load(checkpoint, tiny_trained_runs.features_dir, device="cpu")


@pytest.fixture(scope="session")
def requests(tiny_trained_runs) -> pd.DataFrame:
    """Real customers (raw context values) with partial outfits of real articles, some holding odd values."""
    cfg = tiny_trained_runs.cfg
    customers = pd.read_parquet(cfg.paths.validated_dir / "customers.parquet").head(4).reset_index(drop=True)
    outfits = pd.read_parquet(cfg.paths.validated_dir / "outfits.parquet").head(4)
    rows = customers.drop(columns=["customer_id"])
    rows["article_ids"] = [list(ids[:3]) for ids in outfits["article_ids"]]
    rows["occasion"] = outfits["occasion"].to_numpy()
    rows.loc[1, "article_ids"] = [rows.loc[1, "article_ids"][0], "NOT-AN-ARTICLE"]
    rows.loc[2, "gender"] = None
    rows.loc[3, "country"] = "Atlantis"
    return rows


def test_recommends_k_articles_never_from_the_outfit(core, requests):
    out = core.recommend(requests, top_k=7)
    assert list(out.columns) == list(OUTPUT_COLUMNS) and len(out) == len(requests)
    vocab_ids = set(core.article_vocab.ids[3:])
    for outfit, ids, scores in zip(requests["article_ids"], out["article_ids"], out["scores"]):
        assert len(ids) == 7 and len(set(ids)) == 7 and set(ids) <= vocab_ids
        assert not set(ids) & set(outfit)
        assert all(a >= b for a, b in zip(scores, scores[1:])) and 0 < sum(scores) <= 1


def test_a_rows_scores_do_not_depend_on_the_other_rows_of_its_request(core, requests):
    """Rows are scored in groups of one outfit width (serving.log_probs): a row alone and the same row in
    a request of mixed widths get the same scores."""
    import torch

    mixed = requests.copy()
    mixed.loc[0, "article_ids"] = list(mixed.loc[0, "article_ids"][:1])  # widths 2, 3, 4 in one request
    encoded = core.encode(mixed)
    together = core.log_probs(encoded.outfits.items, encoded.outfits.context)
    for row in range(len(mixed)):
        alone = core.encode(mixed.iloc[[row]])
        expected = core.log_probs(alone.outfits.items, alone.outfits.context)[0]
        assert torch.equal(torch.isinf(together[row]), torch.isinf(expected))
        torch.testing.assert_close(together[row], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_name", [*VARIANTS, *BASELINE_MODELS])
def test_the_traced_forward_pass_equals_the_models_at_any_batch_and_width(tiny_project, requests, model_name):
    """Serving runs masked_logits as a trace taken on one small example: every model, at other batch
    sizes and outfit widths, gives exactly the model's own logits."""
    import torch

    from contextual_bert.data.feature_store import load_article_vocab
    from contextual_bert.data.outfit_encoder import OutfitEncoder
    from contextual_bert.model import build_model

    cfg = tiny_project.cfg
    torch.manual_seed(0)
    n_items = len(load_article_vocab(tiny_project.features_dir))
    model = build_model(cfg.model_for(model_name), model_name, n_items, load_spec(tiny_project.features_dir)).eval()
    wake_between_blocks(model)  # [GS2]'s reads of the outfit (and [GSU]'s updates) traced at work, not as identities
    encoder = OutfitEncoder.load(tiny_project.features_dir, cfg.model.max_set_size)
    core = OutfitCompleterCore(model, encoder, torch.device("cpu"))
    assert core.masked_logits != model.masked_logits  # the trace, not the module
    rows = pd.concat([requests] * 3, ignore_index=True)
    rows["article_ids"] = [list(ids[: 1 + i % 3]) for i, ids in enumerate(rows["article_ids"])]
    encoded = core.encode(rows)
    items, context = encoded.outfits.items, encoded.outfits.context
    widths = (items != 0).sum(dim=1)  # the items, then the [MASK], then padding
    assert len(widths.unique()) == 3
    with torch.no_grad():
        for rows in (torch.arange(len(items)), torch.tensor([0]), *((widths == w).nonzero()[:, 0] for w in (2, 3))):
            batch = items[rows][:, : int(widths[rows].max())]
            ctx = {k: v[rows] for k, v in context.items()}
            torch.testing.assert_close(core.masked_logits(batch, ctx), model.masked_logits(batch, ctx), rtol=0, atol=0)


def test_unknown_ids_and_missing_or_unseen_features_are_reported(core, requests):
    out = core.recommend(requests, top_k=3)
    assert out.loc[1, "unknown_article_ids"] == ["NOT-AN-ARTICLE"]
    assert out.loc[0, "unknown_article_ids"] == []
    assert "gender" in out.loc[2, "missing_features"]
    assert "country" in out.loc[3, "unknown_features"]
    # A request with no context at all is answered too: every feature reported missing.
    bare = core.recommend(pd.DataFrame({"article_ids": [requests.loc[0, "article_ids"]]}), top_k=3)
    assert set(bare.loc[0, "missing_features"]) == {f.name for f in core.encoder.context.spec.features}
    assert len(bare.loc[0, "article_ids"]) == 3


def test_scores_are_the_models_probabilities_in_order(core, requests):
    """The top article is the argmax of the model's own masked logits, outfit items excluded."""
    request = core.encode(requests).outfits
    logits = core.model.masked_logits(request.items, request.context).detach()
    logits.scatter_(1, request.items, float("-inf"))
    best = core.article_vocab.to_ids(logits.argmax(dim=1))
    assert core.recommend(requests, top_k=1)["article_ids"].map(lambda ids: ids[0]).tolist() == best


def test_the_served_ranking_is_the_plain_models_ranking(core, requests):
    """Serving's path (traced forward pass, rows grouped by width, top-k of whole batches) ranks the first
    k articles exactly as the model module does on the request's rows, outfit articles excluded."""
    import torch

    request = core.encode(requests).outfits
    with torch.no_grad():
        logits = core.model.masked_logits(request.items, request.context)
    logits.scatter_(1, request.items, float("-inf"))
    expected = torch.topk(torch.log_softmax(logits, dim=1), 10, dim=1)
    out = core.recommend(requests, top_k=10)
    assert out["article_ids"].tolist() == [core.article_vocab.to_ids(row) for row in expected.indices]
    np.testing.assert_allclose(np.array(out["scores"].tolist()), expected.values.exp().numpy(), rtol=1e-5)


@pytest.mark.parametrize(
    "article_ids, message",
    [
        ([], "row 0: 'article_ids' is empty"),
        (None, "row 0: 'article_ids' is empty"),
        ([f"A{i}" for i in range(8)], "row 0: 'article_ids' has 8 ids; an outfit to complete has at most 7"),
        (["A1", "A1"], "row 0: article id 'A1' appears twice"),
        ("A1", "row 0: 'article_ids' must be a list"),
        (["A1", None], "row 0: 'article_ids' holds None"),
    ],
)
def test_bad_outfits_are_refused_with_a_message_naming_the_row(core, article_ids, message):
    with pytest.raises(ContextualBertError, match=message.replace("(", r"\(")):
        core.recommend(pd.DataFrame({"article_ids": [article_ids]}), top_k=5)


def test_the_bad_row_is_named_in_a_batch(core, requests):
    rows = requests.copy()
    rows.at[2, "article_ids"] = []
    with pytest.raises(ContextualBertError, match="row 2"):
        core.recommend(rows, top_k=5)


def test_top_k_is_bounded_and_an_empty_batch_is_empty(core, requests):
    for k in (0, MAX_TOP_K + 1):
        with pytest.raises(ContextualBertError, match="top_k"):
            core.recommend(requests, top_k=k)
    assert list(core.recommend(requests.iloc[:0], top_k=5).columns) == list(OUTPUT_COLUMNS)
    assert len(core.recommend(requests.iloc[:1], top_k=MAX_TOP_K).loc[0, "article_ids"]) == MAX_TOP_K


def test_no_request_row_needs_a_column_but_article_ids(core):
    with pytest.raises(ContextualBertError, match="no 'article_ids' column"):
        core.recommend(pd.DataFrame({"gender": ["female"]}), top_k=5)


def test_requests_run_on_the_serving_threads_and_give_the_callers_back(monkeypatch):
    import torch

    from contextual_bert.serving.completer import PARALLEL_ROWS, cpu_threads, serving_threads

    monkeypatch.delenv("CONTEXTUAL_BERT_SERVING_THREADS", raising=False)
    assert serving_threads(1) == 1 and serving_threads(PARALLEL_ROWS - 1) == 1  # small requests: one thread
    assert serving_threads(PARALLEL_ROWS) == 1  # large ones too, unless told (threads contend on a shared CPU)
    monkeypatch.setenv("CONTEXTUAL_BERT_SERVING_THREADS", "2")
    assert serving_threads(1) == 1 and serving_threads(1024) == 2
    monkeypatch.setenv("CONTEXTUAL_BERT_SERVING_THREADS", "many")
    with pytest.raises(ContextualBertError, match="CONTEXTUAL_BERT_SERVING_THREADS"):
        serving_threads(1024)
    before = torch.get_num_threads()
    with cpu_threads(torch.device("cpu"), 1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_signature_declares_the_outfit_every_context_feature_and_top_k(tiny_project):
    spec = load_spec(tiny_project.features_dir)
    sig = signature(spec, top_k=12)
    inputs = {c.name: c for c in sig.inputs.inputs}
    assert set(inputs) == {"article_ids"} | {f.name for f in spec.features}
    assert not any(column.required for column in inputs.values())  # the model checks them (the fuzz test)
    assert [c.name for c in sig.outputs.inputs] == list(OUTPUT_COLUMNS)
    assert sig.params.params[0].name == "top_k" and sig.params.params[0].default == 12


@pytest.fixture(scope="session")
def logged_pyfunc(tiny_trained_runs):
    """The pyfunc logged from code into a LoggedModel of its own (no registry)."""
    cfg = tiny_trained_runs.cfg
    mlflow_client = client(cfg.mlflow)
    exp_id = experiment_id(mlflow_client, cfg.mlflow.experiment)
    logged = mlflow_client.create_logged_model(exp_id, name="serving-test")
    checkpoint = cfg.paths.models_dir / f"{STRONG[0]}-s{STRONG[1]}" / "checkpoint.pt"
    return log_pyfunc_model(
        checkpoint,
        cfg.paths.features_dir,
        model_name="serving-test",
        top_k=4,
        model_id=logged.model_id,
        input_example=example_request(cfg.paths.features_dir),
    )


def test_the_logged_pyfunc_is_code_not_a_pickle_and_answers_like_the_core(logged_pyfunc, core, requests):
    local = Path(mlflow.artifacts.download_artifacts(logged_pyfunc.model_uri))
    assert not list(local.rglob("*.pkl"))  # models from code: no pickled python_model
    assert (local / "code" / "contextual_bert" / "serving" / "completer.py").exists()
    pyfunc = mlflow.pyfunc.load_model(logged_pyfunc.model_uri)
    out = pyfunc.predict(requests)
    assert out["article_ids"].map(len).tolist() == [4] * len(requests)  # top_k from the model's settings
    expected = core.recommend(requests, top_k=4)
    assert out["article_ids"].tolist() == expected["article_ids"].tolist()
    np.testing.assert_allclose(np.concatenate(out["scores"].tolist()), np.concatenate(expected["scores"].tolist()),
                               rtol=1e-5)  # fmt: skip
    assert pyfunc.predict(requests, params={"top_k": 2})["article_ids"].map(len).tolist() == [2] * len(requests)
    assert pyfunc.predict(requests, params={"top_k": None})["article_ids"].map(len).tolist() == [4] * len(requests)


def test_the_pyfunc_turns_bad_input_into_an_mlflow_error(logged_pyfunc):
    pyfunc = mlflow.pyfunc.load_model(logged_pyfunc.model_uri)
    with pytest.raises(MlflowException, match="row 0: 'article_ids' is empty") as error:
        pyfunc.predict(pd.DataFrame({"article_ids": [[]]}))
    assert error.value.get_http_status_code() == 400
    with pytest.raises(MlflowException):
        pyfunc.predict(pd.DataFrame({"article_ids": [["A1"]]}), params={"top_k": 1000})
    # List columns are declared Any (MLflow checks no cell): the encoder refuses an outfit that is not a list
    with pytest.raises(MlflowException, match="row 1: 'article_ids' must be a list") as error:
        pyfunc.predict(pd.DataFrame({"article_ids": [["A1"], "A1"]}))
    assert error.value.get_http_status_code() == 400


def test_a_plain_string_in_a_list_column_is_one_value(logged_pyfunc, requests):
    """The encoder's rule (feature_store: a plain string counts as a one-value list) holds for served
    requests too."""
    pyfunc = mlflow.pyfunc.load_model(logged_pyfunc.model_uri)
    as_list, as_string = requests.iloc[[0]].copy(), requests.iloc[[0]].copy()
    brand = requests.loc[0, "preferred_brands"][0]
    as_list.at[0, "preferred_brands"] = [brand]
    as_string.at[0, "preferred_brands"] = brand
    expected, got = pyfunc.predict(as_list), pyfunc.predict(as_string)
    assert got["article_ids"].tolist() == expected["article_ids"].tolist()
    assert got["scores"].tolist() == expected["scores"].tolist()


# --- the served champion -------------------------------------------------------------------------------------


def _post(url: str, payload) -> tuple[int, dict]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


@pytest.mark.slow
def test_mlflow_models_serve_answers_the_champion(tiny_trained_runs, requests, tmp_path):
    from contextual_bert.registry.models import register_all
    from contextual_bert.registry.promotion import promote

    cfg = tiny_trained_runs.cfg
    cfg = cfg.model_copy(update={"mlflow": cfg.mlflow.model_copy(update={"model_name": "serving-champion"}),
                                 "train": cfg.train.model_copy(update={"models": [STRONG[0]]})})  # fmt: skip
    register_all(cfg)
    assert promote(cfg)["promoted"]

    bin_dir = Path(sys.executable).parent
    port = free_port()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen(
        [
            str(bin_dir / "mlflow"),
            "models",
            "serve",
            "-m",
            "models:/serving-champion@champion",
            "--env-manager",
            "local",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],  # fmt: skip
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/ping", server, timeout=120)
        url = f"http://127.0.0.1:{port}/invocations"
        records = json.loads(requests.to_json(orient="records"))
        status, body = _post(url, {"dataframe_records": records, "params": {"top_k": 5}})
        assert status == 200, body
        predictions = body["predictions"]
        assert len(predictions) == len(records)
        for record, prediction in zip(records, predictions):
            assert len(prediction["article_ids"]) == 5
            assert not set(prediction["article_ids"]) & set(record["article_ids"])
        assert predictions[1]["unknown_article_ids"] == ["NOT-AN-ARTICLE"]

        status, body = _post(url, {"dataframe_records": [{"article_ids": [f"A{i}" for i in range(9)]}]})
        assert status == 400 and "row 0: 'article_ids' has 9 ids" in body["message"]
        status, body = _post(url, {"dataframe_records": [{"article_ids": 5}]})
        assert status == 400
        status, body = _post(url, b"not json")
        assert status == 400
        # ... and the server is still up and answering.
        for params in ({}, {"params": {"top_k": None}}):  # no top_k, or a null one: the model's default
            status, body = _post(url, {"dataframe_records": records[:1], **params})
            assert status == 200 and len(body["predictions"][0]["article_ids"]) == cfg.mlflow.top_k, body
    finally:
        stop_process_group(server)
        log.close()


# --- articles added to the catalogue after training (issue 14) ----------------------------------------------


@pytest.fixture(scope="module")
def attribute_model(tmp_path_factory):
    """(checkpoint of a "none_attrs" model, its features dir, raw articles): the weights are untrained (the
    outfit offsets drawn at random, so that they count), the catalogue and its encoding are the features stage's."""
    import torch
    from feature_data import paper_cfg, paper_tables, write_validated

    from contextual_bert.config import ModelConfig
    from contextual_bert.data.contract import PAPER_SCHEMA, DataSchema
    from contextual_bert.data.feature_store import load_article_vocab, load_catalogue
    from contextual_bert.data.features import build_features
    from contextual_bert.model import AttributeOverlap, build_model, save_checkpoint

    root = tmp_path_factory.mktemp("attributes")
    articles, customers, outfits = paper_tables(n_outfits=600)
    validated = write_validated(
        root / "validated", DataSchema("synthetic", PAPER_SCHEMA.context_columns), articles, customers, outfits
    )
    attributes = {"synthetic": {"product_type": "categorical", "color": "categorical", "price": "numeric"}}
    cfg = paper_cfg(article_features=True, article_attributes=attributes)
    build_features(validated, root / "features", cfg, max_set_size=8)
    catalogue = load_catalogue(root / "features")
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=16),
        "none_attrs",
        len(load_article_vocab(root / "features")),
        load_spec(root / "features"),
        catalogue.spec,
    )
    model.set_catalogue(catalogue.tensors())
    with torch.no_grad():
        for offset in model.reader(AttributeOverlap).offsets:
            offset.normal_()
    save_checkpoint(root / "checkpoint.pt", model, {})
    return root / "checkpoint.pt", root / "features", articles


def test_an_article_added_after_training_is_recommended_and_may_be_named(attribute_model, tmp_path, monkeypatch):
    checkpoint, features_dir, articles = attribute_model
    new = pd.DataFrame(
        {
            "article_id": ["fresh-1", "fresh-2"],
            "product_type": ["top", "bag"],
            "color": ["red", "blue"],
            "price": [30.0, 80.0],
        }
    )
    pd.concat([articles, new]).to_parquet(tmp_path / "articles.parquet")  # this season's articles table
    before = OutfitCompleterCore.load(checkpoint, features_dir, device="cpu")
    monkeypatch.setenv("CONTEXTUAL_BERT_CATALOGUE", str(tmp_path / "articles.parquet"))
    after = OutfitCompleterCore.load(checkpoint, features_dir, device="cpu")
    assert len(after.article_vocab) == len(before.article_vocab) + 2
    request = pd.DataFrame({"article_ids": [["fresh-1", articles["article_id"][0]]], "gender": ["f"]})
    assert before.recommend(request, 5)["unknown_article_ids"][0] == ["fresh-1"]
    answer = after.recommend(request, MAX_TOP_K)  # more than the catalogue: every candidate, ranked
    assert answer["unknown_article_ids"][0] == []
    assert len(answer["article_ids"][0]) == len(after.article_vocab) - N_SPECIAL - 2  # all but the outfit's
    assert "fresh-2" in answer["article_ids"][0] and "fresh-1" not in answer["article_ids"][0]
    encoded = after.encode(request).outfits
    log_probs = after.log_probs(encoded.items, encoded.context)[0]
    assert np.isfinite(float(log_probs[after.article_vocab.ids.index("fresh-2")]))  # scored by its attributes
    # The CPU trace (made on a two-row example) scores any batch as the module does, outfit offsets included.
    ids = list(articles["article_id"][:3])
    rows = pd.DataFrame({"article_ids": [["fresh-1", ids[0]], [ids[1]], ids], "gender": ["f", "m", "f"]})
    encoded = after.encode(rows).outfits
    with torch.no_grad():
        torch.testing.assert_close(
            after.masked_logits(encoded.items, encoded.context),
            after.model.masked_logits(encoded.items, encoded.context),
        )


def test_an_ids_only_model_refuses_a_catalogue(core, tiny_trained_runs, tmp_path):
    checkpoint = tiny_trained_runs.cfg.paths.models_dir / f"{STRONG[0]}-s{STRONG[1]}" / "checkpoint.pt"
    pd.DataFrame({"article_id": ["x"]}).to_parquet(tmp_path / "a.parquet")
    with pytest.raises(ContextualBertError, match="article ids only"):
        OutfitCompleterCore.load(
            checkpoint, tiny_trained_runs.features_dir, device="cpu", catalogue=tmp_path / "a.parquet"
        )


def _junk(rng: np.random.Generator, ids: list[str]):
    """A value of a kind a client may send by mistake (or on purpose)."""
    kinds = [
        None,
        float("nan"),
        float("inf"),
        -1,
        0,
        2**70,
        3.5,
        True,
        "",
        " ",
        "30",
        "x" * 10_000,
        "é\u0000",
        [],
        [None],
        [[ids[0]]],
        [{"id": ids[0]}],
        {"a": 1},
        ids[0],
        [ids[0], 7],
        [ids[0], ids[0].lower()],
        list(ids[:3]),
        [str(i) for i in range(20)],
        np.int64(3),
        ["NaN"],
        [float("nan")],
        {"__proto__": []},
    ]
    return kinds[rng.integers(len(kinds))]


def _fuzzed_requests(requests: pd.DataFrame, n: int):
    """(rows, params) n times: real request rows with 1-3 cells, and now and then top_k, set to junk."""
    rng = np.random.default_rng(0)
    ids = [i for ids in requests["article_ids"] for i in ids]
    columns = list(requests.columns)
    for case in range(n):
        rows = requests.sample(n=int(rng.integers(1, len(requests) + 1)), random_state=case).reset_index(drop=True)
        rows = rows.astype(object)
        for _ in range(int(rng.integers(1, 4))):
            rows.at[int(rng.integers(len(rows))), columns[rng.integers(len(columns))]] = _junk(rng, ids)
        yield rows, ({"top_k": _junk(rng, ids)} if case % 3 == 0 else {})


def _names_the_fault(message: str) -> bool:
    """One line naming the row or the param at fault (over HTTP after the scoring server's 'Error: ')."""
    reason = message.rsplit("Error: ", 1)[-1]
    return "\n" not in reason and (reason.startswith("row ") or "top_k" in reason)


def test_malformed_traffic_is_answered_or_refused_naming_the_row_alike_in_process_and_over_http(
    logged_pyfunc, requests
):
    """Fuzzed requests (cells of every column and top_k, of every kind): each is answered within the contract
    (a context value the model cannot use reported per row) or refused with one line naming the row or
    top_k (HTTP 400), never a 500; the scoring server and the pyfunc in process give the same outcome."""
    from fastapi.testclient import TestClient
    from mlflow.pyfunc import scoring_server

    pyfunc = mlflow.pyfunc.load_model(logged_pyfunc.model_uri)
    http = TestClient(scoring_server.init(pyfunc))
    plain = lambda o: o.tolist()  # noqa: E731  numpy values (np.int64, a Parquet list cell) as JSON's
    outcomes = {"answered": 0, "refused": 0}
    for case, (rows, params) in enumerate(_fuzzed_requests(requests, 150)):
        try:
            got = pyfunc.predict(rows, params=params or None)
        except MlflowException as error:
            assert error.get_http_status_code() == 400 and _names_the_fault(str(error)), (case, str(error)[:500])
            got = None
        body = json.dumps({"dataframe_records": rows.to_dict("records"), "params": params}, default=plain)
        response = http.post("/invocations", content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == (400 if got is None else 200), (case, response.text[:500])
        if got is None:
            assert _names_the_fault(response.json()["message"]), (case, response.text[:500])
            outcomes["refused"] += 1
            continue
        assert len(got) == len(rows) and list(got.columns) == list(OUTPUT_COLUMNS), case
        for outfit, ids in zip(rows["article_ids"], got["article_ids"]):
            assert not set(ids) & set(outfit), case
        served = pd.DataFrame(response.json()["predictions"])
        for column in ("article_ids", "unknown_article_ids", "missing_features", "unknown_features"):
            assert served[column].map(list).tolist() == got[column].map(list).tolist(), (case, column)
        outcomes["answered"] += 1
    assert min(outcomes.values()) >= 30, outcomes  # both paths exercised


def test_a_request_without_the_outfit_column_is_refused_in_one_line_never_answered_empty(logged_pyfunc, requests):
    """No 'article_ids' (context only; a list body or a frame of unnamed columns, whose columns MLflow's schema
    check drops; no rows at all): HTTP 400 naming the column, not MLflow's dump of the schema and not an
    empty answer. A frame that has the column and no rows is answered with no rows."""
    from fastapi.testclient import TestClient
    from mlflow.pyfunc import scoring_server

    pyfunc = mlflow.pyfunc.load_model(logged_pyfunc.model_uri)
    http = TestClient(scoring_server.init(pyfunc))
    context_only = requests.drop(columns=["article_ids"]).head(2)
    bodies = [
        {"dataframe_records": json.loads(context_only.to_json(orient="records"))},
        {"dataframe_split": {"data": [[["A1", "A2"]]]}},
        {"inputs": [["A1", "A2"]]},
        {"dataframe_records": []},
    ]
    for body in bodies:
        response = http.post("/invocations", json=body)
        assert response.status_code == 400, (body, response.text[:300])
        reason = response.json()["message"].rsplit("Error: ", 1)[-1]
        assert reason == "the request has no 'article_ids' column (the partial outfit of each row)", body
    with pytest.raises(MlflowException, match="^the request has no 'article_ids' column"):
        pyfunc.predict(context_only)
    empty = pyfunc.predict(requests.head(0))
    assert len(empty) == 0 and list(empty.columns) == list(OUTPUT_COLUMNS)


def test_a_context_value_the_model_cannot_use_is_reported_not_cast(logged_pyfunc, requests):
    """true for a number is no age (MLflow's double column made it 1.0 over HTTP); a number as text is the
    number; a word or a list for a number, a dict for a category: unknown, reported, the row answered."""
    pyfunc = mlflow.pyfunc.load_model(logged_pyfunc.model_uri)
    rows = requests.iloc[[0] * 5].reset_index(drop=True).astype(object)
    rows.at[1, "age"], rows.at[2, "age"], rows.at[3, "age"] = True, "x", [30]
    rows.at[4, "age"], rows.at[4, "country"] = str(requests.loc[0, "age"]), {"a": 1}
    out = pyfunc.predict(rows)
    assert ["age" in u for u in out["unknown_features"]] == [False, True, True, True, False]
    assert "country" in out.loc[4, "unknown_features"]
    assert out.loc[4, "article_ids"] != out.loc[0, "article_ids"] or "country" not in out.loc[0, "unknown_features"]
    assert mlflow.models.get_model_info(logged_pyfunc.model_uri).metadata["context_features"]["age"] == "numeric"


@pytest.mark.parametrize("model_name", ["none", "bag_of_items"])
def test_a_model_of_data_without_context_is_traced_and_serves(tmp_path, model_name):
    """Outfits without customers give the models no context input at all: serving traces the outfit alone (the
    tracer takes no empty dict) and answers as the model does."""
    import yaml
    from helpers import TINY_MODEL
    from test_import_sets import write_polyvore

    from contextual_bert.cli import main
    from contextual_bert.config import load_config
    from contextual_bert.data.feature_store import load_article_vocab
    from contextual_bert.data.outfit_encoder import OutfitEncoder
    from contextual_bert.model import build_model

    source, _ = write_polyvore(tmp_path / "sets.json", n_sets=300)
    params = tmp_path / "params.yaml"
    dirs = ("raw_dir", "validated_dir", "quarantine_dir", "features_dir", "models_dir", "reports_dir")
    params.write_text(yaml.safe_dump({"paths": {d: str(tmp_path / d) for d in dirs}, "model": TINY_MODEL,
                                      "ingest": {"source": "sets"}, "import_sets": {"source": str(source)}}))  # fmt: skip
    for stage in ("ingest", "validate", "features"):
        assert main(["--params", str(params), stage]) == 0, stage
    cfg = load_config(params)
    features = cfg.paths.features_dir
    torch.manual_seed(0)
    model = build_model(cfg.model_for(model_name), model_name, len(load_article_vocab(features)), load_spec(features))
    core = OutfitCompleterCore(model.eval(), OutfitEncoder.load(features, cfg.model.max_set_size), torch.device("cpu"))
    vocab = core.article_vocab.ids[N_SPECIAL:]
    rows = pd.DataFrame({"article_ids": [vocab[:1], vocab[1:4], vocab[4:6]]})
    encoded = core.encode(rows)
    assert encoded.outfits.context == {}
    with torch.no_grad():
        torch.testing.assert_close(
            core.masked_logits(encoded.outfits.items, {}),
            model.masked_logits(encoded.outfits.items, {}),
            rtol=0,
            atol=0,
        )
    answer = core.recommend(rows, top_k=5)
    assert [len(ids) for ids in answer["article_ids"]] == [5, 5, 5]
    assert not any(set(ids) & set(outfit) for ids, outfit in zip(answer["article_ids"], rows["article_ids"]))
