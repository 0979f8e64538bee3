"""Every kind of data the README names, end to end as a user runs it: `dvc repro promote` on a tiny fixture, then
one request to the champion through the serving gate.

Kinds: the synthetic generator, planted data, H&M files with and without a customers file, curated sets as
(outfit, item) pairs without customers, sets with a customers table and a products table, Polyvore Outfits JSON.
Each fixture has a signal a model learns in a few epochs (articles go together by style), so that a model beats
its count and is promoted; the test fails if any stage fails, if no champion is promoted, or if the answer is not
the documented one (a ranked list of known articles, none of the request's, with probabilities).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import TINY_MODEL, dvc_project

pytestmark = pytest.mark.slow

TOKEN = "data-kinds-token"
N_STYLES, STYLE_ARTICLES = 8, 12  # articles of one style go together: what every fixture's models can learn
TOP_K = 5


def styled_outfits(n: int, seed: int = 0) -> list[tuple[int, list[int]]]:
    """n outfits of 4-8 distinct articles (indices), all of one style (and the style's index)."""
    rng = np.random.default_rng(seed)
    outfits = []
    for _ in range(n):
        style = int(rng.integers(N_STYLES))
        items = rng.choice(STYLE_ARTICLES, int(rng.integers(4, 9)), replace=False) + style * STYLE_ARTICLES
        outfits.append((style, [int(i) for i in items]))
    return outfits


def article_table(id_of) -> pd.DataFrame:
    """Products of the styled articles: a type, a colour and a short text per article."""
    n = N_STYLES * STYLE_ARTICLES
    types = ["Top", "Trousers", "Shoes", "Bag", "Jacket", "Skirt"]
    colours = ["Black", "White", "Navy", "Red"]
    return pd.DataFrame(
        {
            "article": [id_of(i) for i in range(n)],
            "type": [types[i % len(types)] for i in range(n)],
            "colour": [colours[(i // STYLE_ARTICLES) % len(colours)] for i in range(n)],
            "text": [
                f"{colours[(i // STYLE_ARTICLES) % len(colours)]} {types[i % len(types)]} in style {i // 12}"
                for i in range(n)
            ],  # fmt: skip
        }
    )


# --- the kinds: each writes its files under `project` and returns its settings --------------------------------


def synthetic(project: Path) -> dict:
    return {"ingest": {"source": "synthetic"}, "generate": {"size": "tiny"}}


def planted(project: Path) -> dict:
    sizes = {"n_outfits": 1500, "n_articles": 150, "n_customers": 300, "n_tastes": 16, "n_types": 10}
    return {"ingest": {"source": "planted"}, "planted": sizes}


def _hm_files(directory: Path, with_customers: bool) -> dict:
    directory.mkdir(parents=True)
    articles = article_table(lambda i: f"{108775000 + i:010d}")
    pd.DataFrame(
        {
            "article_id": articles["article"],
            "product_type_name": articles["type"],
            "section_name": ["Womens" if i % 2 else "Mens" for i in range(len(articles))],
            "colour_group_name": articles["colour"],
            "graphical_appearance_name": ["Solid"] * len(articles),
            "detail_desc": articles["text"],
        }
    ).to_csv(directory / "articles.csv", index=False)
    rows = []
    for n, (_, items) in enumerate(styled_outfits(1200)):
        customer = f"{n % 400:064x}"  # a customer's baskets are days apart: one basket a day
        day = pd.Timestamp("2020-01-01") + pd.Timedelta(days=n // 400)
        rows += [(day.strftime("%Y-%m-%d"), customer, articles["article"][i], 0.02, 2) for i in items]
    transactions = pd.DataFrame(rows, columns=["t_dat", "customer_id", "article_id", "price", "sales_channel_id"])
    transactions.to_csv(directory / "transactions_train.csv", index=False)
    if with_customers:
        customers = pd.DataFrame({"customer_id": transactions["customer_id"].unique()})
        customers["club_member_status"] = "ACTIVE"
        customers["fashion_news_frequency"] = np.where(np.arange(len(customers)) % 2, "NONE", "Regularly")
        customers["age"] = 20 + np.arange(len(customers)) % 50
        customers.to_csv(directory / "customers.csv", index=False)
    return {"ingest": {"source": "hm"}, "import_hm": {"source": str(directory)}}


def hm(project: Path) -> dict:
    return _hm_files(project / "data" / "hm", with_customers=True)


def hm_without_customers(project: Path) -> dict:
    return _hm_files(project / "data" / "hm", with_customers=False)


def _pairs(outfits, id_of) -> pd.DataFrame:
    return pd.DataFrame(
        [(f"look-{n}", id_of(i)) for n, (_, items) in enumerate(outfits) for i in items], columns=["Look", "Item"]
    )


def pairs(project: Path) -> dict:
    """The README's newcomer: a file of (outfit, item) pairs and nothing else, its two column names set."""
    _pairs(styled_outfits(1200), lambda i: f"P{i:04d}").to_csv(project / "data" / "looks.csv", index=False)
    return {"ingest": {"source": "sets"},
            "import_sets": {"source": "data/looks.csv", "outfit_column": "Look", "item_column": "Item"}}  # fmt: skip


def sets_with_customers_and_products(project: Path) -> dict:
    outfits = styled_outfits(1200)
    table = _pairs(outfits, lambda i: f"P{i:04d}")
    customer_of = {f"look-{n}": f"c{n % 300}" for n in range(len(outfits))}
    table["Customer"] = table["Look"].map(customer_of)
    table.to_csv(project / "data" / "looks.csv", index=False)
    customers = pd.DataFrame({"Customer": [f"c{k}" for k in range(300)]})
    customers["region"] = np.where(np.arange(300) % 3, "north", "south")
    customers["age"] = 20 + np.arange(300) % 40
    customers.to_csv(project / "data" / "customers.csv", index=False)
    products = article_table(lambda i: f"P{i:04d}").rename(columns={"article": "Item", "type": "Product Type"})
    products.to_csv(project / "data" / "products.tsv", sep="\t", index=False)
    return {
        "ingest": {"source": "sets"},
        "import_sets": {
            "source": "data/looks.csv", "outfit_column": "Look", "item_column": "Item",
            "customer_column": "Customer", "customers": "data/customers.csv",
            "context": {"region": "categorical", "age": "numeric"},
            "articles": "data/products.tsv",
        },
        # the products' columns as attributes (docs/curated_products.md), and a model that reads them
        "features": {"article_features": True,
                     "article_attributes": {"sets": {"product_type": "categorical", "colour": "categorical",
                                                     "text": "text"}}},
        "train": {"models": ["none", "concat", "concat_attrs"]},
    }  # fmt: skip


def polyvore(project: Path) -> dict:
    sets = [
        {"set_id": str(200_000 + n), "items": [{"item_id": str(100_000 + i), "index": k + 1} for k, i in
                                               enumerate(items)]}
        for n, (_, items) in enumerate(styled_outfits(1200))
    ]  # fmt: skip
    (project / "data" / "polyvore.json").write_text(json.dumps(sets))
    return {"ingest": {"source": "sets"}, "import_sets": {"source": "data/polyvore.json"}}


KINDS = {f.__name__: f for f in (synthetic, planted, hm, hm_without_customers, pairs,
                                  sets_with_customers_and_products, polyvore)}  # fmt: skip
CONTEXT_FREE = {"hm_without_customers", "pairs", "polyvore"}

# Only to keep each run to seconds: a tiny model, one seed, an encoder that reads c and one that does not.
FAST = {
    "model": TINY_MODEL,
    "train": {"models": ["none", "concat"], "seeds": [0], "max_epochs": 6, "batch_size": 32,
              "learning_rate": 0.005, "lr_warmup_steps": 10, "validation_outfits": 0, "device": "cpu"},
    "mlflow": {"top_k": TOP_K},
}  # fmt: skip


def merged(base: dict, changes: dict) -> dict:
    for key, value in changes.items():
        base[key] = merged(base.get(key) or {}, value) if isinstance(value, dict) and value else value
    return base


def answer(app, body: dict) -> tuple[int, dict]:
    """One POST /invocations to the ASGI app (the gate in front of MLflow's scoring app), in process."""
    raw = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/invocations", "raw_path": b"/invocations", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                         (b"authorization", f"Bearer {TOKEN}".encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}  # fmt: skip
    sent, messages = False, []

    async def receive():
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)
        sent = True
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message):
        messages.append(message)

    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in messages if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return status, json.loads(payload)


@dataclass(frozen=True)
class Pipeline:
    project: Path
    tracking_uri: str
    params: dict
    run: subprocess.CompletedProcess


def repro(kind: str, root: Path) -> Pipeline:
    """`dvc repro` of a new project holding `kind`'s data and settings."""
    project, tracking_uri = root / "project", f"sqlite:///{root / 'mlflow.db'}"
    dvc, env = dvc_project(project, MLFLOW_TRACKING_URI=tracking_uri)
    (project / "data").mkdir()
    params = yaml.safe_load((project / "params.yaml").read_text())
    merged(params, {**FAST, "mlflow": {**FAST["mlflow"], "tracking_uri": tracking_uri}})
    merged(params, KINDS[kind](project))  # after FAST: a kind may train more models
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    run = subprocess.run([str(dvc), "repro"], cwd=project, capture_output=True, text=True, env=env, timeout=1800)
    return Pipeline(project, tracking_uri, params, run)


@pytest.fixture(scope="module")
def pipelines(request, tmp_path_factory) -> dict[str, Future]:
    """The selected kinds' pipelines, started at once and run one per core (each training takes one thread)."""
    selected = [item.callspec.params["kind"] for item in request.session.items if hasattr(item, "callspec")
                and item.originalname == "test_each_kind_of_data_is_promoted_and_served"]  # fmt: skip
    pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
    runs = {kind: pool.submit(repro, kind, tmp_path_factory.mktemp(kind)) for kind in selected}
    yield runs
    pool.shutdown(cancel_futures=True)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_data_is_promoted_and_served(kind, pipelines, monkeypatch):
    pipeline = pipelines[kind].result()
    project, tracking_uri, params, run = pipeline.project, pipeline.tracking_uri, pipeline.params, pipeline.run
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    table = (project / "reports" / "table1.md").read_text()
    assert "| [None] |" in table and "| Popularity |" in table
    assert ("| [C] |" in table) is (kind not in CONTEXT_FREE), table
    if kind == "sets_with_customers_and_products":  # the products' attributes: their model and yardstick
        assert "| [C] + attributes |" in table and "| Popularity by attribute |" in table, table
    if kind in CONTEXT_FREE:
        assert "- Not trained on this data: [C]" in table
    promotion = json.loads((project / "reports" / "promotion.json").read_text())
    assert promotion["promoted"] is True, promotion["decision"]

    import mlflow

    from contextual_bert.data.feature_spec import N_SPECIAL
    from contextual_bert.data.feature_store import load_article_vocab
    from contextual_bert.serving.gate import build_app

    # the project's registry, also where an earlier test set another URI in this process (it wins over the env)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    before = (mlflow.get_tracking_uri(), mlflow.get_registry_uri())
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    try:
        app = build_app(f"models:/{params['mlflow']['model_name']}@champion", TOKEN, 1 << 20, 100)
    finally:
        mlflow.set_tracking_uri(before[0])
        mlflow.set_registry_uri(before[1])
    known = load_article_vocab(project / "data" / "features").ids[N_SPECIAL:]
    outfit = [str(known[0]), str(known[1])]
    status, body = answer(app, {"dataframe_records": [{"article_ids": outfit}]})
    assert status == 200, body
    (row,) = body["predictions"]
    ids, scores = row["article_ids"], row["scores"]
    assert len(ids) == TOP_K and set(ids) <= set(map(str, known)) and not set(ids) & set(outfit)
    assert all(0 < s <= 1 for s in scores) and scores == sorted(scores, reverse=True)
    assert row["unknown_article_ids"] == []
