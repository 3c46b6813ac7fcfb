"""AttnCache's faiss index (docs/algorithms.md section 3): ONE record per stored input, HNSW (the
paper), IVF-Flat (the public code) or flat (exact search, for a store small enough to scan)."""
from __future__ import annotations

import numpy as np

from .config import AttnCacheConfig


def build_index(features: np.ndarray, cfg: AttnCacheConfig):
    import faiss
    features = np.ascontiguousarray(features, dtype=np.float32)
    d = features.shape[1]
    if cfg.index == "flat":
        index = faiss.IndexFlatL2(d)
    elif cfg.index == "hnsw":
        index = faiss.IndexHNSWFlat(d, cfg.hnsw_m)
        index.hnsw.efSearch = cfg.hnsw_ef
    else:
        nlist = max(1, min(cfg.ivf_nlist, len(features) // 39))
        index = faiss.IndexIVFFlat(faiss.IndexFlatL2(d), d, nlist)
        index.train(features)
        index.nprobe = min(cfg.ivf_nprobe, nlist)
    index.add(features)
    return index
