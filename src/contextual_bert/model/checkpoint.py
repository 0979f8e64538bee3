"""Checkpoints: a model's payload (what rebuilds it with no other file) and the one atomic writer."""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

import torch

from contextual_bert.config import ModelConfig
from contextual_bert.data.feature_spec import ContextSpec
from contextual_bert.errors import ContextualBertError
from contextual_bert.model.build import build_model
from contextual_bert.model.scores import OutfitModel

# The layout's version of checkpoint.pt and last.pt (training.resume), in each: one of another version (or of
# none, written before it) is refused, never read as this code's.
CHECKPOINT_VERSION = 2


def atomic_save(obj, path: Path, write=torch.save) -> None:
    """`write(obj, tmp)` to a temporary file, then rename: a run killed while saving leaves the old file intact.
    The one atomic writer: checkpoints with torch.save, the training's JSON files with their own `write`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def model_payload(model: OutfitModel) -> dict:
    """What rebuilds the model with no other file: config, model name, n_items, spec and weights."""
    payload = {
        "version": CHECKPOINT_VERSION,
        "model_config": model.model_cfg.model_dump(),
        "model": model.name,
        "n_items": model.n_ids,
        "spec": model.spec.to_json(),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
    }
    if model.attributes is not None:  # the attributes' spec and the catalogue the model was trained with
        payload["attributes"] = model.attributes.spec.to_json()
        payload["combine"] = model.attributes.combine
        payload["catalogue"] = {k: v.detach().cpu() for k, v in model.attributes.catalogue().items()}
        payload["unseen_offset"] = model.attributes.unseen_offset
    return payload


def model_from_payload(payload: dict) -> OutfitModel:
    """The model a payload (`model_payload`) describes, its weights loaded; one of another CHECKPOINT_VERSION is
    refused."""
    version = payload.get("version")
    if version != CHECKPOINT_VERSION:
        raise ContextualBertError(
            f"checkpoint version {version}: this code reads version {CHECKPOINT_VERSION} (train the run again)"
        )
    attributes = payload.get("attributes")
    model = build_model(
        ModelConfig(**payload["model_config"]),
        payload["model"] if "model" in payload else payload["variant"],  # "variant": written before issue 92
        payload["n_items"],
        ContextSpec.from_json(payload["spec"]),
        None if attributes is None else ContextSpec.from_json(attributes),
        payload.get("combine", "sum"),
    )
    model.load_state_dict(payload["state_dict"])
    if attributes is not None:
        model.set_catalogue(payload["catalogue"])
        # fixed at training (a larger catalogue at serving keeps it): 0 before it existed
        model.set_unseen_offset(payload.get("unseen_offset", 0.0))
    return model


def save_checkpoint(path: Path, model: OutfitModel, meta: dict) -> None:
    atomic_save({**model_payload(model), "meta": meta}, path)


def load_checkpoint(path: Path, map_location="cpu") -> tuple[OutfitModel, dict]:
    """The model (in eval mode, on map_location) and the meta dict saved with it."""
    path = Path(path)
    if not path.exists():
        raise ContextualBertError(f"{path}: checkpoint not found (train this run first)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        model = model_from_payload(payload)
    except ContextualBertError as exc:
        raise ContextualBertError(f"{path}: {exc}") from None
    except (RuntimeError, KeyError, TypeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        raise ContextualBertError(f"{path}: not a valid checkpoint ({exc})") from None
    return model.to(map_location).eval(), payload.get("meta", {})
