"""Serving a model whose only attributes are article vectors (a file's and one derived from the text): an article
added after training, named with its vector (CONTEXTUAL_BERT_CATALOGUE), is ranked by it, in process and as the
logged pyfunc (its bundled catalogue files include the derived vectors' words)."""

import json
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from feature_data import paper_cfg, paper_tables, write_validated

from contextual_bert.config import MlflowConfig, ModelConfig, TrainConfig
from contextual_bert.data.contract import PAPER_SCHEMA, DataSchema
from contextual_bert.data.feature_spec import N_SPECIAL
from contextual_bert.data.feature_store import DERIVED_VECTORS_FILE
from contextual_bert.data.features import build_features
from contextual_bert.errors import DataError
from contextual_bert.registry.tracking import client, experiment_id
from contextual_bert.serving.completer import CATALOGUE_ENV, MAX_TOP_K, OutfitCompleterCore, log_pyfunc_model

LENGTH = 6


@pytest.fixture(scope="module")
def vector_model(tmp_path_factory):
    """(checkpoint of a "none_attrs" model trained two epochs on vectors alone, its features dir, articles)."""
    from contextual_bert.training import train

    root = tmp_path_factory.mktemp("vectors")
    articles, customers, outfits = paper_tables(n_outfits=600)
    rng = np.random.default_rng(0)
    articles["clip"] = [rng.normal(size=LENGTH).astype(np.float32) for _ in range(len(articles))]
    articles["desc"] = [f"{t} in {c}" for t, c in zip(articles.product_type, articles.color)]
    validated = write_validated(
        root / "validated", DataSchema("synthetic", PAPER_SCHEMA.context_columns), articles, customers, outfits
    )
    cfg = paper_cfg(
        article_features=True,
        article_attributes={"synthetic": {"clip": "vector", "text": "vector"}},
        vector_normalize={"clip": "l2"},
        derived_vectors={"text": {"columns": ["desc"], "dim": 3}},
    )
    build_features(validated, root / "features", cfg, max_set_size=8)
    model_cfg = ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=16)
    train_cfg = TrainConfig(max_epochs=2, batch_size=64, lr_warmup_steps=5, device="cpu", id_dropout=0.3)
    train(root / "features", root / "run", "none_attrs", 0, model_cfg, train_cfg)
    return root / "run" / "checkpoint.pt", root / "features", articles


def new_articles(articles: pd.DataFrame) -> pd.DataFrame:
    """Three articles of the new season: two of one vector and text, one of another; one without a vector."""
    v, w = articles.at[0, "clip"], articles.at[1, "clip"]
    return pd.DataFrame({
        "article_id": ["twin-1", "twin-2", "other", "bare"],
        "clip": [v.tolist(), v.tolist(), w.tolist(), None],
        "desc": ["top in red", "top in red", "top in red", "bag in blue"],
    })  # fmt: skip


def test_a_vector_only_model_ranks_an_article_added_after_training(vector_model, tmp_path):
    checkpoint, features_dir, articles = vector_model
    new_articles(articles).to_parquet(tmp_path / "season.parquet")
    core = OutfitCompleterCore.load(checkpoint, features_dir, device="cpu", catalogue=tmp_path / "season.parquet")
    request = pd.DataFrame({"article_ids": [["twin-1", articles.at[2, "article_id"]]]})
    answer = core.recommend(request, MAX_TOP_K)
    assert answer["unknown_article_ids"][0] == []  # named in the request: the model knows it by its vector
    assert {"twin-2", "other", "bare"} <= set(answer["article_ids"][0])
    encoded = core.encode(pd.DataFrame({"article_ids": [[articles.at[2, "article_id"]]]})).outfits
    scores = core.log_probs(encoded.items, encoded.context)[0]
    index = {a: core.article_vocab.ids.index(a) for a in ("twin-1", "twin-2", "other", "bare")}
    assert all(i >= core.model.n_ids for i in index.values())  # no id embedding: [UNK] + its vectors
    assert scores[index["twin-1"]] == scores[index["twin-2"]]  # the same vector and text, the same score
    assert scores[index["twin-1"]] != scores[index["other"]]  # another vector, another score
    assert np.isfinite(float(scores[index["bare"]]))  # without a vector: the learned missing one


def test_a_catalogue_of_json_text_vectors_is_read_and_a_bad_one_named(vector_model, tmp_path):
    checkpoint, features_dir, articles = vector_model
    season = new_articles(articles)
    season["clip"] = [None if v is None else json.dumps(v) for v in season["clip"]]
    season.to_csv(tmp_path / "season.csv", index=False)
    core = OutfitCompleterCore.load(checkpoint, features_dir, device="cpu", catalogue=tmp_path / "season.csv")
    assert len(core.article_vocab) == len(articles) + N_SPECIAL + 4
    season.loc[2, "clip"] = "[1.0, 2.0]"
    season.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(DataError, match=r"bad.csv, row 2, column 'clip': article 'other': 2 values, not 6"):
        OutfitCompleterCore.load(checkpoint, features_dir, device="cpu", catalogue=tmp_path / "bad.csv")


def test_the_logged_pyfunc_bundles_the_derived_vectors_and_ranks_a_new_article(vector_model, tmp_path, monkeypatch):
    checkpoint, features_dir, articles = vector_model
    mlflow_client = client(MlflowConfig())
    logged = mlflow_client.create_logged_model(experiment_id(mlflow_client, "tests"), name="vectors-test")
    example = pd.DataFrame({"article_ids": [[articles.at[0, "article_id"]]]})
    info = log_pyfunc_model(checkpoint, features_dir, model_name="vectors-test", top_k=5, model_id=logged.model_id,
                            input_example=example)  # fmt: skip
    local = mlflow.artifacts.download_artifacts(info.model_uri)
    assert list(Path(local).rglob(DERIVED_VECTORS_FILE))
    new_articles(articles).to_parquet(tmp_path / "season.parquet")
    monkeypatch.setenv(CATALOGUE_ENV, str(tmp_path / "season.parquet"))
    pyfunc = mlflow.pyfunc.load_model(info.model_uri)
    out = pyfunc.predict(pd.DataFrame({"article_ids": [["twin-1"]]}), params={"top_k": MAX_TOP_K})
    assert out["unknown_article_ids"][0] == [] and "other" in out["article_ids"][0]
