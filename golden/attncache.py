"""AttnCache golden model (docs/algorithms.md section 3): prefill attention-map memoization.

Computes: the feature projector (layer-0 attention input -> zero-pad/crop to ``max_len``
rows -> adaptive max-pool -> Linear -> BatchNorm -> Linear, 128-d), its Siamese training
on attention-map distances, a faiss index (HNSW or IVF-Flat) with ONE record per stored
input, an on-disk map store (ONE raw file per stored input holding its reused layers'
maps contiguously, crc32 in a manifest, memory-mapped and checked once per store object),
and the runtime that plugs into a transformers model through
``AttentionInterface``/``AttentionMaskInterface``: on a hit the reused layers (``layers``)
multiply the stored map with V; their Q/K projections, RoPE, QK^T and softmax are skipped.
Lookups are batched: a batch of B inputs (right-padded) is pooled, projected and searched at
once; hit rows reuse, miss rows compute attention as usual.

Choices fixed here (the papers leave them open):
* map distance ``d(A1, A2)`` = mean over layers, heads and rows p of
  ``0.5 * ||A1[p,:] - A2[p,:]||_2``, both maps zero-padded to ``max(len1, len2)``.
* label ``paper``: ``y = alpha * d_all + |len1 - len2|`` over all layers, pairs half among
  equal-length inputs, half random (the papers' AttnCache). Label ``map``: ``y = d_S`` over the
  reused layers S only, pairs among equal-length inputs only (a stored map serves only an input
  of the same length, so the length term only ever separated pairs the lookup never compares).
* similarity ``sqdist``: ``1 - ||f_q - f_db||_2^2``; ``dist``: ``1 - ||f_q - f_db||_2``, i.e.
  one minus the projector's predicted map distance, so ``theta`` reads "predicted ``d_S`` <=
  1 - theta".
* a stored map can only serve an input of the same token length (the map is L x L); the
  lookup fetches ``k`` neighbours and takes the nearest one of equal length; it is a hit if
  its similarity is >= theta. One lookup per input decides for all reused layers.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import BlockConfig, param
from .errors import DataError

ATTN_NAME = "ladmac_attncache"
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16}
STORE_VERSION = 2


@dataclass(frozen=True)
class AttnCacheConfig(BlockConfig):
    feature_dim: int = param(128, "width of the projector's feature vector (paper: 128)")
    max_len: int = param(64, "rows the layer-0 attention input is zero-padded/cropped to before pooling")
    pool_rows: int = param(32, "rows after adaptive max-pooling (<= max_len)")
    pool_cols: int = param(96, "columns after adaptive max-pooling (<= hidden size)")
    alpha: float = param(0.2, "weight of the attention-map distance in the training label (paper: 0.2)")
    theta: float = param(0.99, "hit when 1 - squared L2 between raw features >= theta (paper 0.99)")
    index: str = param("hnsw", "faiss index: hnsw (paper) or ivf (IVF-Flat, public code)")
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
        self.require(self.index in ("hnsw", "ivf"), f"index must be hnsw or ivf, got '{self.index}'")
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


# ----------------------------------------------------------------------------- projector
def pool_input(hidden: torch.Tensor, cfg: AttnCacheConfig) -> torch.Tensor:
    """(L, H) or (B, L, H) layer-0 attention input -> (B, pool_rows * pool_cols) max-pooled."""
    x = hidden.detach().float()
    if x.dim() == 2:
        x = x.unsqueeze(0)
    rows = x.shape[1]
    if rows >= cfg.max_len:
        x = x[:, :cfg.max_len]
    else:
        x = F.pad(x, (0, 0, 0, cfg.max_len - rows))
    pooled = F.adaptive_max_pool2d(x.unsqueeze(1), (cfg.pool_rows, min(cfg.pool_cols, x.shape[2])))
    return pooled.flatten(1)


class FeatureProjector(nn.Module):
    """Two linear layers with BatchNorm between and no nonlinearity (public code's LinearNet),
    after a fixed input standardisation (scalar mean/std of the pooled training inputs)."""

    def __init__(self, in_dim: int, feature_dim: int):
        super().__init__()
        self.register_buffer("in_mean", torch.zeros(()))
        self.register_buffer("in_std", torch.ones(()))
        self.fc1 = nn.Linear(in_dim, feature_dim)
        self.bn = nn.BatchNorm1d(feature_dim)
        self.fc2 = nn.Linear(feature_dim, feature_dim)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.bn(self.fc1((pooled - self.in_mean) / self.in_std)))


def map_distance(maps1, maps2) -> float:
    """mean over layers, heads, rows p of 0.5 * ||A1[p,:] - A2[p,:]||_2 (zero-padded to the longer)."""
    total = 0.0
    for a1, a2 in zip(maps1, maps2, strict=True):
        a1 = torch.as_tensor(a1).float().reshape(-1, a1.shape[-2], a1.shape[-1])
        a2 = torch.as_tensor(a2).float().reshape(-1, a2.shape[-2], a2.shape[-1])
        n = max(a1.shape[-1], a2.shape[-1])
        a1 = F.pad(a1, (0, n - a1.shape[-1], 0, n - a1.shape[-2]))
        a2 = F.pad(a2, (0, n - a2.shape[-1], 0, n - a2.shape[-2]))
        total += float((0.5 * torch.linalg.vector_norm(a1 - a2, dim=-1)).mean())
    return total / len(maps1)


def pair_label(maps1, maps2, len1: int, len2: int, alpha: float) -> float:
    """y = alpha * d(A1, A2) + |len1 - len2|."""
    return alpha * map_distance(maps1, maps2) + abs(len1 - len2)


def pair_labels(maps_all: list[list[torch.Tensor]], lengths: list[int], pairs: np.ndarray, alpha: float,
                progress: bool = False, budget: int = 2_000_000, layers: list[int] | None = None,
                length_term: bool = True) -> torch.Tensor:
    """``pair_label`` for many pairs at once: pairs sorted by length, zero-padded per chunk.
    ``layers``: the layers the distance averages over (default all); ``length_term=False`` and
    ``alpha=1`` give the ``map`` label ``d_S``."""
    from tqdm import tqdm
    lengths_a = np.asarray(lengths)
    n_all = len(maps_all[0])
    layers = list(range(n_all)) if layers is None else list(layers)
    stacked = [torch.stack([maps[li].reshape(-1, maps[li].shape[-2], maps[li].shape[-1]) for li in layers]).float()
               .reshape(-1, lengths[i], lengths[i]) for i, maps in enumerate(maps_all)]  # (layers*heads, L, L)
    n_layers = len(layers)
    longest = np.maximum(lengths_a[pairs[:, 0]], lengths_a[pairs[:, 1]])
    labels = torch.zeros(len(pairs))
    rows = stacked[0].shape[0]
    bar = tqdm(total=len(pairs), desc="pair labels", disable=not progress, leave=False)
    for n in np.unique(longest):  # pairs grouped by padded size n = max(len1, len2)
        group = np.nonzero(longest == n)[0]
        chunk = max(1, budget // (rows * int(n) * int(n)))
        for start in range(0, len(group), chunk):
            idx = group[start:start + chunk]

            def padded(which):
                out = torch.zeros(len(idx), rows, n, n)
                for r, i in enumerate(pairs[idx, which]):
                    out[r, :, :lengths[i], :lengths[i]] = stacked[i]
                return out
            rowdist = 0.5 * torch.linalg.vector_norm(padded(0) - padded(1), dim=-1)  # (chunk, layers*heads, n)
            dist = rowdist.reshape(len(idx), n_layers, -1).mean(-1)  # mean over heads and rows p
            dist = dist.mean(-1)  # mean over layers
            labels[torch.as_tensor(idx)] = alpha * dist
            if length_term:
                labels[torch.as_tensor(idx)] += torch.as_tensor(
                    np.abs(lengths_a[pairs[idx, 0]] - lengths_a[pairs[idx, 1]]), dtype=torch.float32)
            bar.update(len(idx))
    bar.close()
    return labels


def sample_pairs(lengths: list[int], cfg: AttnCacheConfig) -> np.ndarray:
    """(pairs, 2) index pairs: a share among inputs of equal length (the ones that can hit), the rest random
    (label ``map``: all among equal-length inputs)."""
    rng = np.random.default_rng(cfg.seed)
    n = len(lengths)
    buckets: dict[int, list[int]] = {}
    for i, length in enumerate(lengths):
        buckets.setdefault(length, []).append(i)
    multi = [np.array(v) for v in buckets.values() if len(v) >= 2]
    weights = np.array([len(v) * (len(v) - 1) for v in multi], dtype=float)
    out = []
    frac = 1.0 if cfg.label == "map" else cfg.same_len_frac
    n_same = int(round(cfg.pairs * frac)) if multi else 0
    for _ in range(n_same):
        members = multi[rng.choice(len(multi), p=weights / weights.sum())]
        i, j = rng.choice(members, 2, replace=False)
        out.append((i, j))
    while len(out) < cfg.pairs:
        i, j = rng.integers(0, n, 2)
        if i != j:
            out.append((i, j))
    return np.array(out, dtype=np.int64)


def train_projector(pooled: torch.Tensor, pairs: np.ndarray, labels: torch.Tensor, cfg: AttnCacheConfig,
                    progress: bool = False) -> tuple[FeatureProjector, list[float]]:
    """Siamese training: SmoothL1(||f(x1) - f(x2)||_2, y). Returns the projector (eval mode) and epoch losses."""
    torch.manual_seed(cfg.seed)
    proj = FeatureProjector(pooled.shape[1], cfg.feature_dim)
    proj.in_mean.fill_(float(pooled.mean()))
    proj.in_std.fill_(float(pooled.std().clamp_min(1e-6)))
    opt = torch.optim.Adam(proj.parameters(), lr=cfg.lr)
    loss_fn = nn.SmoothL1Loss()
    gen = torch.Generator().manual_seed(cfg.seed)
    pairs_t = torch.as_tensor(pairs)
    losses = []
    epochs = range(cfg.epochs)
    if progress:
        from tqdm import tqdm
        epochs = tqdm(epochs, desc="train projector", leave=False)
    proj.train()
    for _ in epochs:
        order = torch.randperm(len(pairs_t), generator=gen)
        running, count = 0.0, 0
        for start in range(0, len(order), cfg.batch_size):
            idx = order[start:start + cfg.batch_size]
            if len(idx) < 2:
                continue
            p = pairs_t[idx]
            f1, f2 = proj(pooled[p[:, 0]]), proj(pooled[p[:, 1]])
            dist = torch.sqrt(((f1 - f2) ** 2).sum(1) + 1e-12)
            loss = loss_fn(dist, labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            running += loss.item() * len(idx)
            count += len(idx)
        losses.append(running / max(count, 1))
    proj.eval()
    return proj, losses


# ----------------------------------------------------------------------------- index
def build_index(features: np.ndarray, cfg: AttnCacheConfig):
    import faiss
    features = np.ascontiguousarray(features, dtype=np.float32)
    d = features.shape[1]
    if cfg.index == "hnsw":
        index = faiss.IndexHNSWFlat(d, cfg.hnsw_m)
        index.hnsw.efSearch = cfg.hnsw_ef
    else:
        nlist = max(1, min(cfg.ivf_nlist, len(features) // 39))
        index = faiss.IndexIVFFlat(faiss.IndexFlatL2(d), d, nlist)
        index.train(features)
        index.nprobe = min(cfg.ivf_nprobe, nlist)
    index.add(features)
    return index


# ----------------------------------------------------------------------------- store
class MapStore:
    """Attention-map store: ``maps/NNNNNN.bin``, ONE raw file per stored input holding the maps of
    its stored layers back to back (each (heads, L, L), layer order of ``manifest["layers"]``),
    ``manifest.json`` (lengths, layer list, crc32 per file), ``projector.pt`` and ``index.faiss``.
    A file is memory-mapped (private mapping, no copy) the first time this store object fetches it,
    its size and crc32 checked then, and the mapping kept: later fetches cost nothing."""

    def __init__(self, root: Path, manifest: dict):
        self.root = Path(root)
        self.manifest = manifest
        self.entries = manifest["entries"]
        self.layers = [int(x) for x in manifest["layers"]]
        self.heads = int(manifest["heads"])
        self.dtype = np.dtype(manifest["dtype"])
        self.cfg = AttnCacheConfig(**manifest["config"])
        self.lengths = np.array([e["len"] for e in self.entries], dtype=np.int64)
        self.projector: FeatureProjector | None = None
        self.index = None
        self.kind = manifest.get("kind", "projector")
        # prefix store: the token ids whose map each entry is (a stored map's rows serve any input that
        # starts with these ids: in a causal model rows 0..P-1 depend on tokens 0..P-1 only)
        self.prefix_ids = [torch.as_tensor(ids, dtype=torch.long) for ids in manifest.get("prefix_ids", [])]
        self._mapped: dict[int, dict[int, torch.Tensor]] = {}
        self.crc_s = 0.0  # time spent in crc32 checks (first maps only)

    # -- writing ---------------------------------------------------------------------------
    @staticmethod
    def write_entry(root: Path, number: int, maps: list[torch.Tensor], layers: list[int], dtype: str) -> dict:
        """``maps``: every layer's (.., heads, L, L) map of one input; the ``layers`` ones are written."""
        name = f"maps/{number:06d}.bin"
        arr = np.ascontiguousarray(np.stack([maps[li].detach().reshape(maps[li].shape[-3:]).numpy()
                                             for li in layers]).astype(dtype))
        (Path(root) / "maps").mkdir(parents=True, exist_ok=True)
        arr.tofile(Path(root) / name)
        return {"len": int(maps[0].shape[-1]), "file": name, "crc32": zlib.crc32(arr.tobytes())}

    # -- reading ---------------------------------------------------------------------------
    @classmethod
    def open(cls, root) -> "MapStore":
        root = Path(root)
        path = root / "manifest.json"
        try:
            manifest = json.loads(path.read_text())
            if manifest.get("version") != STORE_VERSION:
                raise ValueError(f"version {manifest.get('version')!r}, expected {STORE_VERSION}")
            store = cls(root, manifest)
        except FileNotFoundError:
            raise DataError(f"AttnCache store {root} has no manifest.json") from None
        except (ValueError, KeyError, TypeError) as err:
            raise DataError(f"AttnCache store manifest {path} is corrupt: {err}") from None
        if store.kind == "prefix":
            if len(store.prefix_ids) != len(store.entries) or any(
                    len(ids) != int(e["len"]) for ids, e in zip(store.prefix_ids, store.entries)):
                raise DataError(f"AttnCache store manifest {path} is corrupt: prefix ids do not match the entries")
            return store  # looked up by token ids: no projector, no index
        try:
            state = torch.load(root / "projector.pt", map_location="cpu", weights_only=True)
            proj = FeatureProjector(state["fc1.weight"].shape[1], state["fc1.weight"].shape[0])
            proj.load_state_dict(state)
            proj.eval()
            store.projector = proj
        except Exception as err:
            raise DataError(f"AttnCache projector {root / 'projector.pt'} is missing or corrupt: "
                            f"{type(err).__name__}") from None
        try:
            import faiss
            store.index = faiss.read_index(str(root / "index.faiss"))
        except Exception as err:
            raise DataError(f"AttnCache index {root / 'index.faiss'} is missing or corrupt: "
                            f"{str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
        if store.index.ntotal != len(store.entries):
            raise DataError(f"AttnCache index {root / 'index.faiss'} holds {store.index.ntotal} records, "
                            f"manifest {len(store.entries)}")
        if hasattr(store.index, "hnsw"):
            store.index.hnsw.efSearch = store.cfg.hnsw_ef
        elif hasattr(store.index, "nprobe"):
            store.index.nprobe = min(store.cfg.ivf_nprobe, store.index.nlist)
        return store

    def features(self, pooled: torch.Tensor) -> np.ndarray:
        """Projector features, row by row (as at build time: a batch gives bit-identical features)."""
        with torch.no_grad():
            return np.concatenate([self.projector(pooled[i:i + 1]).numpy() for i in range(len(pooled))]
                                  ).astype(np.float32)

    def search_batch(self, features: np.ndarray, lengths) -> tuple[np.ndarray, np.ndarray]:
        """Per row: nearest stored input of equal token length among k neighbours -> (entries, sims);
        entry -1 and similarity -inf where none has that length. One faiss call for the batch."""
        dist, idx = self.index.search(np.ascontiguousarray(features, dtype=np.float32), self.cfg.k)
        entries = np.full(len(idx), -1, dtype=np.int64)
        sims = np.full(len(idx), -np.inf)
        for r, (drow, irow) in enumerate(zip(dist, idx)):
            for d, i in zip(drow, irow):
                if i >= 0 and self.lengths[i] == int(lengths[r]):
                    entries[r], sims[r] = int(i), float(self.cfg.sim(float(d)))
                    break
        return entries, sims

    def match_prefix(self, ids: torch.Tensor) -> int:
        """Prefix store: the entry whose token ids are the longest prefix of ``ids`` (1-D), or -1."""
        best, best_len = -1, 0
        n = int(ids.shape[0])
        for entry, pre in enumerate(self.prefix_ids):
            m = int(pre.shape[0])
            if best_len < m <= n and torch.equal(ids[:m], pre):
                best, best_len = entry, m
        return best

    def search(self, feature: np.ndarray, length: int) -> tuple[int, float]:
        """Nearest stored input of equal token length among k neighbours: (entry, similarity) or (-1, -inf)."""
        entries, sims = self.search_batch(feature.reshape(1, -1), [length])
        return int(entries[0]), float(sims[0])

    def map_file(self, entry: int, layer: int | None = None) -> Path:
        """The file holding ``entry``'s maps (every stored layer: ``layer`` is accepted and ignored)."""
        return self.root / self.entries[entry]["file"]

    def fetch(self, entry: int) -> dict[int, torch.Tensor]:
        """{layer: (1, heads, L, L) map} for every stored layer of ``entry``: views into the entry's file,
        memory-mapped once per store object (size and crc32 checked on that first mapping)."""
        got = self._mapped.get(entry)
        if got is not None:
            return got
        rec = self.entries[entry]
        path = self.root / rec["file"]
        length = int(rec["len"])
        count = len(self.layers) * self.heads * length * length
        want = count * self.dtype.itemsize
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise DataError(f"AttnCache map file {path} is missing") from None
        if size != want:
            raise DataError(f"AttnCache map file {path} is corrupt: {size} bytes, expected {want}")
        # private (copy-on-write) mmap of the file: no read into a new buffer
        tensor = torch.from_file(str(path), shared=False, size=count, dtype=_TORCH_DTYPES[self.dtype.name])
        t0 = time.perf_counter()
        ok = zlib.crc32(tensor.numpy()) == rec["crc32"]
        self.crc_s += time.perf_counter() - t0
        if not ok:
            raise DataError(f"AttnCache map file {path} is corrupt: crc32 mismatch")
        if tensor.dtype != torch.float32:
            tensor = tensor.float()  # float16 store: one conversion (the only copy)
        tensor = tensor.view(len(self.layers), 1, self.heads, length, length)
        got = {layer: tensor[n] for n, layer in enumerate(self.layers)}
        self._mapped[entry] = got
        return got


# ----------------------------------------------------------------------------- runtime
def _attention_modules(model: nn.Module) -> list[nn.Module]:
    mods = [m for m in model.modules()
            if hasattr(m, "layer_idx") and m.layer_idx is not None
            and (hasattr(m, "q_proj") or hasattr(m, "query"))]
    if not mods:
        raise ValueError("no attention modules with layer_idx and q_proj/query found in the model")
    return sorted(mods, key=lambda m: m.layer_idx)


class AttnCache:
    """Runtime attached to one transformers model. Modes: ``off`` (full model, sdpa), ``record``
    (eager maps kept in ``recorded``), ``lookup`` (search; on a hit reuse stored maps in the
    store's layers), ``force`` (reuse the nearest equal-length candidate whatever its similarity).
    Batches are right-padded (lengths from the model call's 2-D ``attention_mask``); hit rows reuse,
    miss rows compute. Per forward: ``last`` holds hit, entry, sim of row 0, ``rows`` (per row:
    hit, entry, sim) and times (attention, lookup)."""

    def __init__(self, model: nn.Module, cfg: AttnCacheConfig | None = None):
        self.model = model
        self.cfg = cfg or AttnCacheConfig()
        self.mode = "off"
        self.store: MapStore | None = None
        self.theta = self.cfg.theta
        self.hit_maps: dict[int, torch.Tensor] | None = None
        self.hit_rows: torch.Tensor | None = None
        self.all_hit = False
        self.lengths: list[int] | None = None
        self.input_ids: torch.Tensor | None = None
        self.rows_reused = 0  # prefix hit: rows 0..rows_reused-1 reuse the map, the rest compute; 0: all rows
        self.recorded: list[torch.Tensor] = []
        self.pooled: torch.Tensor | None = None
        self.last: dict = {}
        self._layer = -1
        self._attn_t0 = 0.0
        self._handles = []
        self._patched = []
        self.attn_modules = _attention_modules(model)
        self.num_layers = len(self.attn_modules)
        self._attach()

    # -- wiring ----------------------------------------------------------------------------
    def _attach(self):
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask
        AttentionInterface.register(ATTN_NAME, _attncache_attention)
        AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
        self._prev_impl = self.model.config._attn_implementation
        try:
            self.model.set_attn_implementation(ATTN_NAME)
        except Exception:
            self.model.config._attn_implementation = ATTN_NAME
        for mod in self.attn_modules:
            mod._ladmac_attncache = self
            for lin_name in (("q_proj", "k_proj") if hasattr(mod, "q_proj") else ("query", "key")):
                lin = getattr(mod, lin_name)
                lin.forward = _skippable(lin, self, mod.layer_idx, is_query=lin_name in ("q_proj", "query"))
                self._patched.append((lin, "forward", None))
            self._handles.append(mod.register_forward_pre_hook(self._attn_pre))
            self._handles.append(mod.register_forward_hook(self._attn_post))
        self._handles.append(self.attn_modules[0].register_forward_pre_hook(self._layer0_pre, with_kwargs=True,
                                                                              prepend=True))
        self._handles.append(self.model.register_forward_pre_hook(self._model_pre, with_kwargs=True))
        self._handles.append(self.model.register_forward_hook(self._model_post))
        # RoPE runs inside the attention module before the interface's function is called, and no
        # interface or hook can skip it; on a hit its inputs are the skipped projections' empty
        # tensors, so the modeling module's apply_rotary_pos_emb is wrapped (per cache, a closure;
        # restored by detach) to pass them through. Models without RoPE (BERT) are not touched.
        modeling = sys.modules.get(type(self.attn_modules[0]).__module__)
        if modeling is not None and hasattr(modeling, "apply_rotary_pos_emb"):
            original = modeling.apply_rotary_pos_emb
            modeling.apply_rotary_pos_emb = _skippable_rope(original, self, getattr(modeling, "rotate_half", None))
            self._patched.append((modeling, "apply_rotary_pos_emb", original))

    def detach(self):
        for handle in self._handles:
            handle.remove()
        for obj, name, original in self._patched:
            if original is None:
                del obj.__dict__[name]
            elif getattr(getattr(obj, name), "_ladmac_cache", None) is self:
                setattr(obj, name, original)
            # else another cache wrapped ours: ours stays below it and passes through (no hit_maps)
        for mod in self.attn_modules:
            mod.__dict__.pop("_ladmac_attncache", None)
        try:
            self.model.set_attn_implementation(self._prev_impl)
        except Exception:
            self.model.config._attn_implementation = self._prev_impl
        self._handles, self._patched = [], []

    def use_store(self, store: MapStore, theta: float | None = None):
        if store.layers and max(store.layers) >= self.num_layers:
            raise DataError(f"AttnCache store {store.root} holds layer {max(store.layers)}; "
                            f"the model has {self.num_layers}")
        self.store = store
        self.theta = store.cfg.theta if theta is None else theta

    # -- per layer state -------------------------------------------------------------------
    def reusing(self, layer: int):
        """None: layer computes; True: every row reuses (Q/K skipped); else the bool hit-row mask."""
        if self.hit_maps is None or layer not in self.hit_maps:
            return None
        return True if self.all_hit else self.hit_rows

    # -- hooks -----------------------------------------------------------------------------
    def _model_pre(self, module, args, kwargs):
        self.hit_maps, self.hit_rows, self.all_hit, self.recorded, self.pooled = None, None, False, [], None
        self.rows_reused = 0
        self.last = {"hit": False, "entry": -1, "sim": float("-inf"), "attn_s": 0.0, "lookup_s": 0.0,
                     "fetch_s": 0.0, "rows": [], "rows_reused": 0}
        self.input_ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        self.lengths = None
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and self.mode != "off":
            m = mask.bool()
            lengths = m.sum(1)
            expect = torch.arange(m.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
            if not torch.equal(m, expect):
                raise ValueError("AttnCache batches must be right-padded (padding_side='right')")
            self.lengths = [int(x) for x in lengths]

    def _model_post(self, module, args, output):
        self.hit_maps, self.hit_rows, self.all_hit, self.rows_reused = None, None, False, 0

    def _layer0_pre(self, module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if self.mode == "off":
            return None
        t0 = time.perf_counter()
        bsz, seq = hidden.shape[0], hidden.shape[1]
        lengths = self.lengths if self.lengths is not None else [seq] * bsz
        if self.mode == "lookup" and self.store is not None and self.store.kind == "prefix":
            return self._prefix_lookup(bsz, seq, lengths, t0)
        cfg = self.cfg if self.store is None else self.store.cfg
        self.pooled = torch.cat([pool_input(hidden[b, :lengths[b]], cfg) for b in range(bsz)])
        if self.mode in ("lookup", "force"):
            if self.store is None:
                raise ValueError("AttnCache lookup needs a store (use_store)")
            entries, sims = self.store.search_batch(self.store.features(self.pooled), lengths)
            hits = (entries >= 0) & ((self.mode == "force") | (sims >= self.theta))
            self.last["rows"] = [{"hit": bool(h), "entry": int(e), "sim": float(s)}
                                 for h, e, s in zip(hits, entries, sims)]
            self.last.update(self.last["rows"][0])
            if hits.any():
                t1 = time.perf_counter()
                fetched = {b: self.store.fetch(int(entries[b])) for b in np.nonzero(hits)[0]}
                self.last["fetch_s"] += time.perf_counter() - t1
                t0 += time.perf_counter() - t1  # lookup_s excludes the fetch
                self.all_hit = bool(hits.all())
                self.hit_rows = torch.as_tensor(hits)
                self.hit_maps = {}
                for layer in self.store.layers:
                    if bsz == 1:
                        self.hit_maps[layer] = fetched[0][layer]  # the mapped file itself, no copy
                        continue
                    heads = self.store.heads
                    out = torch.zeros(bsz, heads, seq, seq)
                    for b, maps in fetched.items():
                        n = lengths[b]
                        out[b, :, :n, :n] = maps[layer][0]
                    self.hit_maps[layer] = out
        self.last["lookup_s"] += time.perf_counter() - t0
        return None

    def _prefix_lookup(self, bsz, seq, lengths, t0):
        """Prefix store: the stored entry whose token ids start this input; its map serves rows 0..P-1
        exactly (causal attention: those rows see tokens 0..P-1 only), rows P.. compute."""
        if bsz != 1:
            raise ValueError("AttnCache prefix stores take one input at a time (batch 1)")
        if not isinstance(self.input_ids, torch.Tensor):
            raise ValueError("AttnCache prefix stores need the model called with input_ids")
        entry = self.store.match_prefix(self.input_ids[0, :lengths[0]])
        self.last["lookup_s"] += time.perf_counter() - t0
        self.last["rows"] = [{"hit": entry >= 0, "entry": entry, "sim": 1.0 if entry >= 0 else float("-inf")}]
        self.last.update(self.last["rows"][0])
        if entry >= 0:
            t1 = time.perf_counter()
            self.hit_maps = self.store.fetch(entry)
            self.last["fetch_s"] += time.perf_counter() - t1
            reused = int(self.store.lengths[entry])
            self.all_hit = True
            self.hit_rows = torch.ones(1, dtype=torch.bool)
            self.rows_reused = 0 if reused == seq else reused
            self.last["rows_reused"] = reused
        return None

    def _attn_pre(self, module, args):
        self._layer = module.layer_idx
        self._attn_t0 = time.perf_counter()

    def _attn_post(self, module, args, output):
        self.last["attn_s"] += time.perf_counter() - self._attn_t0


def _skippable(linear: nn.Linear, cache: AttnCache, layer: int, is_query: bool = True):
    """Instance forward for q/k projections: rows that reuse a stored map get zeros / uninitialised
    memory (never read). (The attention interface receives q and k already projected: skipping the
    projections, the point of a hit, needs this per-instance forward; the Linear class is not touched.)
    A prefix hit (rows 0..P-1 reused) projects q for rows P.. only and k for every row (rows P.. attend
    to all keys)."""
    original = type(linear).forward

    def forward(x):
        rows = cache.reusing(layer)
        if rows is None:
            return original(linear, x)
        if rows is True and cache.rows_reused:
            if not is_query:
                return original(linear, x)
            out = x.new_empty(*x.shape[:-1], linear.out_features)
            out[:, cache.rows_reused:] = original(linear, x[:, cache.rows_reused:])
            return out
        if rows is True:
            return x.new_empty(*x.shape[:-1], linear.out_features)
        out = x.new_zeros(*x.shape[:-1], linear.out_features)
        out[~rows] = original(linear, x[~rows])
        return out
    return forward


def _skippable_rope(original, cache: AttnCache, rotate_half=None):
    """``apply_rotary_pos_emb`` that passes q, k through while every row of the layer reuses a map; on a
    prefix hit (rows 0..P-1 reused) it rotates q's rows P.. and every row of k (the modeling module's
    formula, ``x * cos + rotate_half(x) * sin``)."""
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if cache.reusing(cache._layer) is True:
            p = cache.rows_reused
            if not p:
                return q, k
            if rotate_half is None or args or set(kwargs) - {"unsqueeze_dim"} or kwargs.get("unsqueeze_dim", 1) != 1:
                return original(q, k, cos, sin, *args, **kwargs)
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
            q_out = q.new_empty(q.shape)
            q_out[:, :, p:] = q[:, :, p:] * cos[:, :, p:] + rotate_half(q[:, :, p:]) * sin[:, :, p:]
            return q_out, k * cos + rotate_half(k) * sin
        return original(q, k, cos, sin, *args, **kwargs)
    apply_rotary_pos_emb._ladmac_cache = cache
    return apply_rotary_pos_emb


def _causal_or_given(scores, attention_mask, module):
    if attention_mask is not None:
        mask = attention_mask[:, :, :, : scores.shape[-1]]
        if mask.dtype == torch.bool:
            return scores.masked_fill(~mask, float("-inf"))
        return scores + mask
    if getattr(module, "is_causal", False):
        q_len, k_len = scores.shape[-2:]
        causal = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
        return scores.masked_fill(~causal, float("-inf"))
    return scores


def _reuse_matmul(amap, value):
    """(B, Hq, L, L) map @ (B, Hkv, L, D) values (GQA: Hq = g * Hkv) -> (B, L, Hq, D)."""
    bsz, h_kv, length, dim = value.shape
    h_q = amap.shape[1]
    out = torch.matmul(amap.view(bsz, h_kv, h_q // h_kv, length, length), value.unsqueeze(2))
    return out.view(bsz, h_q, length, dim).transpose(1, 2)


def _prefix_attention(amap, query, key, value, attention_mask, scaling, blocks: int = 4):
    """Batch 1, rows 0..P-1 from the stored (1, Hq, P, P) causal map (row blocks: block i multiplies
    only the columns up to its last row, the map being zero above the diagonal), rows P.. by sdpa over
    all keys (causal). -> (1, L, Hq, D)"""
    bsz, h_kv, length, dim = value.shape
    h_q, p = amap.shape[1], amap.shape[-1]
    a = amap.view(bsz, h_kv, h_q // h_kv, p, p)
    v = value[:, :, :p].unsqueeze(2)
    step = max(64, -(-p // blocks))
    head = torch.cat([torch.matmul(a[..., s:min(p, s + step), :min(p, s + step)], v[..., :min(p, s + step), :])
                      for s in range(0, p, step)], dim=-2).view(bsz, h_q, p, dim)
    if attention_mask is not None:
        mask = attention_mask[:, :, p:, :length]
    else:
        mask = torch.ones(length - p, length, dtype=torch.bool).tril(p)
    tail = F.scaled_dot_product_attention(query[:, :, p:], key, value, attn_mask=mask, scale=scaling,
                                          enable_gqa=h_q != h_kv)
    return torch.cat([head, tail], dim=2).transpose(1, 2).contiguous()


def _attncache_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """AttentionInterface function: stored map @ V on hit rows of a reused layer, eager maps when
    recording, else sdpa (miss rows of a partly hitting batch: sdpa on those rows only)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    cache: AttnCache | None = getattr(module, "_ladmac_attncache", None)
    rows = cache.reusing(module.layer_idx) if cache is not None else None
    if rows is not None:
        amap = cache.hit_maps[module.layer_idx]
        if rows is True and cache.rows_reused:
            return _prefix_attention(amap, query, key, value, attention_mask, scaling), None
        if amap.shape[-1] != value.shape[2]:
            raise ValueError(f"stored map length {amap.shape[-1]} != input length {value.shape[2]}")
        if rows is True:
            return _reuse_matmul(amap, value).contiguous(), None
        bsz, length, h_q, dim = value.shape[0], value.shape[2], amap.shape[1], value.shape[3]
        out = value.new_empty(bsz, length, h_q, dim)
        out[rows] = _reuse_matmul(amap[rows], value[rows])
        miss = ~rows
        mask = attention_mask[miss] if attention_mask is not None else None
        sub, _ = sdpa_attention_forward(module, query[miss], key[miss], value[miss], mask, dropout=dropout,
                                        scaling=scaling, **kwargs)
        out[miss] = sub
        return out, None
    if cache is not None and cache.mode == "record":
        groups = query.shape[1] // key.shape[1]
        k = key.repeat_interleave(groups, dim=1) if groups > 1 else key
        v = value.repeat_interleave(groups, dim=1) if groups > 1 else value
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        scores = _causal_or_given(torch.matmul(query, k.transpose(2, 3)) * scale, attention_mask, module)
        amap = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        cache.recorded.append(amap.detach())
        return torch.matmul(amap, v).transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


# ----------------------------------------------------------------------------- building
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
