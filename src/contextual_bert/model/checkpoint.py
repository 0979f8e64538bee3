"""Checkpoints: a model's payload (what rebuilds it with no other file) and the one atomic writer."""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

import torch
from torch import nn

from contextual_bert.config import ModelConfig
from contextual_bert.data.feature_spec import ContextSpec
from contextual_bert.errors import ContextualBertError
from contextual_bert.model.build import build_model
from contextual_bert.model.readers import AttributeOverlap, HistoryBag, HistoryRepeat


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


def model_payload(model: nn.Module) -> dict:
    """What rebuilds the model with no other file: config, variant, n_items, spec and weights."""
    payload = {
        "model_config": model.model_cfg.model_dump(),
        "variant": model.variant,
        "n_items": model.n_ids,
        "spec": model.spec.to_json(),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
    }
    if model.attributes is not None:  # the attributes' spec and the catalogue the model was trained with
        payload["attributes"] = model.attributes.spec.to_json()
        payload["combine"] = model.attributes.combine
        payload["catalogue"] = {k: v.detach().cpu() for k, v in model.attributes.catalogue().items()}
    return payload


# what a checkpoint from before a model setting existed was trained with
CHECKPOINT_BEFORE = {"history_repeat": False, "history_bag": False}
# a reader's state_dict key before the readers were the two seams' lists -> its class there
READER_KEYS_BEFORE = {"overlap.": AttributeOverlap, "repeat.": HistoryRepeat, "history_gate": HistoryBag}


def _renamed_reader_keys(state_dict: dict, model: nn.Module) -> dict:
    """A state_dict from before the seams, with each reader's keys under its place in head_terms / logit_offsets."""
    places = {type(m): f"{seam}.{i}." for seam in ("head_terms", "logit_offsets")
              for i, m in enumerate(getattr(model, seam))}
    renamed = {}
    for key, value in state_dict.items():
        old = next((prefix for prefix in READER_KEYS_BEFORE if key.startswith(prefix)), None)
        if old is None or READER_KEYS_BEFORE[old] not in places:
            renamed[key] = value
        elif old == "history_gate":
            renamed[places[HistoryBag] + "gate"] = value
        else:
            renamed[places[READER_KEYS_BEFORE[old]] + key[len(old):]] = value
    return renamed


def model_from_payload(payload: dict) -> nn.Module:
    attributes = payload.get("attributes")
    settings = payload["model_config"]
    if "attribute_overlap" not in settings:  # a train setting before it was the model's
        settings = {**settings, "attribute_overlap": payload.get("overlap", False)}
    model = build_model(
        ModelConfig(**(CHECKPOINT_BEFORE | settings)),
        payload["variant"],
        payload["n_items"],
        ContextSpec.from_json(payload["spec"]),
        None if attributes is None else ContextSpec.from_json(attributes),
        payload.get("combine", "sum"),
    )
    model.load_state_dict(_renamed_reader_keys(payload["state_dict"], model))
    if attributes is not None:
        model.set_catalogue(payload["catalogue"])
    return model


def save_checkpoint(path: Path, model: nn.Module, meta: dict) -> None:
    atomic_save({**model_payload(model), "meta": meta}, path)


def load_checkpoint(path: Path, map_location="cpu") -> tuple[nn.Module, dict]:
    """The model (in eval mode, on map_location) and the meta dict saved with it."""
    path = Path(path)
    if not path.exists():
        raise ContextualBertError(f"{path}: checkpoint not found (train this run first)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        model = model_from_payload(payload)
    except (RuntimeError, KeyError, TypeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        raise ContextualBertError(f"{path}: not a valid checkpoint ({exc})") from None
    return model.to(map_location).eval(), payload.get("meta", {})
