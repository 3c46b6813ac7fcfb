"""AttnCache's configuration (docs/algorithms.md section 3): :class:`AttnCacheConfig`, every
parameter of the projector, index, store and lookup, and :func:`parse_layers`, the reused-layer
list syntax (``all`` or ``0,1,4-5``).

Choices fixed here (the papers leave them open):
* similarity ``sqdist``: ``1 - ||f_q - f_db||_2^2``; ``dist``: ``1 - ||f_q - f_db||_2``, i.e.
  one minus the projector's predicted map distance, so ``theta`` reads "predicted ``d_S`` <=
  1 - theta".
* a stored map can only serve an input of the same token length (the map is L x L); the
  lookup fetches ``k`` neighbours and takes the nearest one of equal length; it is a hit if
  its similarity is >= theta. One lookup per input decides for all reused layers.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import BlockConfig, param


@dataclass(frozen=True)
class AttnCacheConfig(BlockConfig):
    feature_dim: int = param(128, "width of the projector's feature vector (paper: 128)")
    max_len: int = param(64, "rows the layer-0 attention input is zero-padded/cropped to before pooling")
    pool_rows: int = param(32, "rows after adaptive max-pooling (<= max_len)")
    pool_cols: int = param(96, "columns after adaptive max-pooling (<= hidden size)")
    alpha: float = param(0.2, "weight of the attention-map distance in the training label (paper: 0.2)")
    theta: float = param(0.99, "hit when 1 - squared L2 between raw features >= theta (paper 0.99)")
    index: str = param("hnsw", "faiss index: hnsw (paper), ivf (IVF-Flat, public code) or flat "
                                         "(exact; a store of hundreds)")
    hnsw_m: int = param(32, "HNSW graph degree M")
    hnsw_ef: int = param(64, "HNSW efSearch")
    ivf_nlist: int = param(32, "IVF lists (capped at n/39 of the stored inputs)")
    ivf_nprobe: int = param(8, "IVF lists probed per query")
    k: int = param(8, "neighbours fetched per lookup; the nearest of equal token length is the candidate")
    pairs: int = param(10000, "Siamese training pairs")
    same_len_frac: float = param(0.5, "fraction of training pairs drawn among inputs of equal token length")
    epochs: int = param(20, "training epochs over the pairs")
    batch_size: int = param(64, "training batch (paper: 64)")
    lr: float = param(0.001, "Adam learning rate")
    seed: int = param(0, "seed of pair sampling and projector initialisation")
    map_dtype: str = param("float32", "stored map dtype: float32 or float16")
    layers: str = param("all", "layers that reuse the stored maps on a hit: all, or a list such as 0,1,4-5")
    label: str = param("paper", "training label: paper (alpha*d_all + |len1-len2|) or map (d over the reused "
                                "layers, equal-length pairs)")
    similarity: str = param("sqdist", "sqdist: 1 - ||f1-f2||^2 (paper), dist: 1 - ||f1-f2|| (predicted distance)")

    def validate(self) -> None:
        self.require(self.feature_dim >= 1, "feature_dim must be >= 1")
        self.require(self.max_len >= 1, "max_len must be >= 1")
        self.require(1 <= self.pool_rows <= self.max_len, "pool_rows must be in 1..max_len")
        self.require(self.pool_cols >= 1, "pool_cols must be >= 1")
        self.require(self.alpha >= 0, "alpha must be >= 0")
        self.require(-1e6 < self.theta <= 1.0, "theta must be <= 1 (similarity is 1 - squared L2)")
        self.require(self.index in ("hnsw", "ivf", "flat"), f"index must be hnsw, ivf or flat, got '{self.index}'")
        self.require(self.hnsw_m >= 2 and self.hnsw_ef >= 1, "hnsw_m must be >= 2 and hnsw_ef >= 1")
        self.require(self.ivf_nlist >= 1 and self.ivf_nprobe >= 1, "ivf_nlist and ivf_nprobe must be >= 1")
        self.require(self.k >= 1, "k must be >= 1")
        self.require(self.pairs >= 1 and self.epochs >= 0 and self.batch_size >= 2,
                     "pairs >= 1, epochs >= 0, batch_size >= 2")
        self.require(0.0 <= self.same_len_frac <= 1.0, "same_len_frac must be in [0, 1]")
        self.require(self.lr > 0, "lr must be > 0")
        self.require(self.map_dtype in ("float32", "float16"), "map_dtype must be float32 or float16")
        self.require(self.label in ("paper", "map"), f"label must be paper or map, got '{self.label}'")
        self.require(self.similarity in ("sqdist", "dist"),
                     f"similarity must be sqdist or dist, got '{self.similarity}'")
        try:
            parse_layers(self.layers, 1 << 16)
        except ValueError as err:
            self.require(False, f"layers: {err}")

    def reuse_layers(self, n_layers: int) -> list[int]:
        """The reused layers of a model with ``n_layers`` layers (ConfigError if out of range)."""
        try:
            return parse_layers(self.layers, n_layers)
        except ValueError as err:
            self.require(False, f"layers: {err}")

    def sim(self, dist2):
        """Similarity from faiss's squared L2 distance(s)."""
        if self.similarity == "sqdist":
            return 1.0 - dist2
        return 1.0 - np.sqrt(np.maximum(dist2, 0.0))


def parse_layers(text: str, n_layers: int) -> list[int]:
    """``"all"`` -> 0..n-1; ``"0,2,4-5"`` -> [0, 2, 4, 5]; ValueError on bad syntax or out of range."""
    text = str(text).strip()
    if text == "all":
        return list(range(n_layers))
    out = set()
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            lo_i = int(lo)
            hi_i = int(hi) if sep else lo_i
        except ValueError:
            raise ValueError(f"'{text}' is not 'all' or a list of layers such as 0,1,4-5") from None
        if lo_i < 0 or hi_i < lo_i or hi_i >= n_layers:
            raise ValueError(f"'{part}' outside 0..{n_layers - 1}")
        out.update(range(lo_i, hi_i + 1))
    if not out:
        raise ValueError("no layer given")
    return sorted(out)
