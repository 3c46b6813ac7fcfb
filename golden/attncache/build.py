"""Building an AttnCache store (docs/algorithms.md section 3): record every layer's map and the
pooled layer-0 input of each input through the runtime's ``record`` mode, then either train the
projector on map-distance labels, index one feature per input and write one map file per input
(:func:`build_store`), or write the maps of shared prompt prefixes looked up by their token ids
(:func:`build_prefix_store`)."""
from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .index import build_index
from .projector import pair_labels, sample_pairs, train_projector
from .runtime import AttnCache
from .store import STORE_VERSION, MapStore


@dataclass
class Recording:
    """Every layer's map (heads, L, L) and the pooled layer-0 input of each recorded input."""
    maps: list[list[torch.Tensor]]
    pooled: torch.Tensor
    lengths: list[int]


def record_inputs(cache: AttnCache, run_one, inputs: list, progress: bool = True) -> Recording:
    """Run ``run_one(x)`` (the model on one input) for each input in record mode."""
    from tqdm import tqdm
    maps_all, pooled = [], []
    cache.mode = "record"
    try:
        for item in tqdm(inputs, desc="record maps", disable=not progress, leave=False):
            with torch.no_grad():
                run_one(item)
            if len(cache.recorded) != len(cache.attn_modules):
                raise RuntimeError(f"recorded {len(cache.recorded)} maps, model has {len(cache.attn_modules)} layers")
            if cache.recorded[0].shape[0] != 1:
                raise ValueError("build_store records one input at a time (batch 1)")
            pooled.append(cache.pooled)
            maps_all.append([m[0] for m in cache.recorded])
    finally:
        cache.mode = "off"
    return Recording(maps_all, torch.cat(pooled), [int(m[0].shape[-1]) for m in maps_all])


def build_store(cache: AttnCache, run_one, inputs: list, root, progress: bool = True,
                recording: Recording | None = None) -> MapStore:
    """Record maps and layer-0 inputs of ``inputs`` (or take ``recording``), train the projector on
    map-distance labels (``cfg.label``), index ONE feature per input, write one map file per input
    (the reused layers ``cfg.layers``, contiguous) and the manifest."""
    cfg = cache.cfg
    layers = cfg.reuse_layers(cache.num_layers)
    rec = recording if recording is not None else record_inputs(cache, run_one, inputs, progress)
    root = Path(root)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    entries = [MapStore.write_entry(root, number, maps, layers, cfg.map_dtype) for number, maps in enumerate(rec.maps)]
    pairs = sample_pairs(rec.lengths, cfg)
    if cfg.label == "paper":
        labels = pair_labels(rec.maps, rec.lengths, pairs, cfg.alpha, progress=progress)
    else:
        labels = pair_labels(rec.maps, rec.lengths, pairs, 1.0, progress=progress, layers=layers, length_term=False)
    proj, losses = train_projector(rec.pooled, pairs, labels, cfg, progress=progress)
    with torch.no_grad():  # row by row, exactly as at lookup, so an input of the store finds itself at distance 0
        feats = np.concatenate([proj(rec.pooled[i:i + 1]).numpy() for i in range(len(rec.pooled))])
    import faiss
    faiss.write_index(build_index(feats, cfg), str(root / "index.faiss"))
    torch.save(proj.state_dict(), root / "projector.pt")
    heads = int(rec.maps[0][0].reshape(-1, rec.lengths[0], rec.lengths[0]).shape[0])
    manifest = {"version": STORE_VERSION, "config": dataclasses.asdict(cfg), "dtype": cfg.map_dtype,
                "num_layers": cache.num_layers, "layers": layers, "heads": heads, "train_loss": losses,
                "entries": entries}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return MapStore.open(root)


def build_prefix_store(cache: AttnCache, run_ids, prefixes: list, root, progress: bool = True,
                       texts: list[str] | None = None) -> MapStore:
    """A store whose entries are shared prompt prefixes (1-D token id tensors): each prefix is run alone
    (``run_ids(ids)``, batch 1, record mode) and its maps in ``cfg.layers`` are written; a lookup matches
    an input's leading token ids exactly (no projector, no index). Only for causal models: the rows
    0..P-1 of the map of any input that starts with the prefix equal the prefix's own map."""
    cfg = cache.cfg
    layers = cfg.reuse_layers(cache.num_layers)
    rec = record_inputs(cache, run_ids, prefixes, progress)
    root = Path(root)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    entries = [MapStore.write_entry(root, number, maps, layers, cfg.map_dtype) for number, maps in enumerate(rec.maps)]
    heads = int(rec.maps[0][0].reshape(-1, rec.lengths[0], rec.lengths[0]).shape[0])
    manifest = {"version": STORE_VERSION, "kind": "prefix", "config": dataclasses.asdict(cfg), "dtype": cfg.map_dtype,
                "num_layers": cache.num_layers, "layers": layers, "heads": heads, "train_loss": [],
                "entries": entries, "prefix_ids": [[int(t) for t in ids] for ids in prefixes]}
    if texts is not None:
        manifest["texts"] = list(texts)
    (root / "manifest.json").write_text(json.dumps(manifest))
    return MapStore.open(root)
