"""AttnCache golden model (docs/algorithms.md section 3): prefill attention-map memoization.

Computes: the feature projector (layer-0 attention input -> zero-pad/crop to ``max_len``
rows -> adaptive max-pool -> Linear -> BatchNorm -> Linear, 128-d), its Siamese training
on attention-map distances, a faiss index (HNSW or IVF-Flat) with ONE record per stored
input, an on-disk map store (one raw file per (input, layer), crc32 in a manifest,
memory-mapped at lookup), and the runtime that plugs into a transformers model through
``AttentionInterface``/``AttentionMaskInterface``: on a hit every layer and head multiplies
the stored map with V; Q/K projections, RoPE, QK^T and softmax are skipped.

Choices fixed here (the papers leave them open):
* map distance ``d(A1, A2)`` = mean over layers, heads and rows p of
  ``0.5 * ||A1[p,:] - A2[p,:]||_2``, both maps zero-padded to ``max(len1, len2)``;
  label ``y = alpha * d + |len1 - len2|``.
* similarity = ``1 - ||f_q - f_db||_2^2`` on the RAW (not normalised) projector features,
  i.e. in the metric the projector was trained for (faiss returns the squared L2 distance).
* a stored map can only serve an input of the same token length (the map is L x L); the
  lookup fetches ``k`` neighbours and takes the nearest one of equal length; it is a hit if
  its similarity is >= theta. One lookup per input decides for all layers and heads.
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
STORE_VERSION = 1


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
                progress: bool = False, budget: int = 2_000_000) -> torch.Tensor:
    """``pair_label`` for many pairs at once: pairs sorted by length, zero-padded per chunk."""
    from tqdm import tqdm
    lengths_a = np.asarray(lengths)
    stacked = [torch.stack([m.reshape(-1, m.shape[-2], m.shape[-1]) for m in maps]).float()
               .reshape(-1, lengths[i], lengths[i]) for i, maps in enumerate(maps_all)]  # (layers*heads, L, L)
    n_layers = len(maps_all[0])
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
            labels[torch.as_tensor(idx)] = alpha * dist + torch.as_tensor(
                np.abs(lengths_a[pairs[idx, 0]] - lengths_a[pairs[idx, 1]]), dtype=torch.float32)
            bar.update(len(idx))
    bar.close()
    return labels


def sample_pairs(lengths: list[int], cfg: AttnCacheConfig) -> np.ndarray:
    """(pairs, 2) index pairs: a share among inputs of equal length (the ones that can hit), the rest random."""
    rng = np.random.default_rng(cfg.seed)
    n = len(lengths)
    buckets: dict[int, list[int]] = {}
    for i, length in enumerate(lengths):
        buckets.setdefault(length, []).append(i)
    multi = [np.array(v) for v in buckets.values() if len(v) >= 2]
    weights = np.array([len(v) * (len(v) - 1) for v in multi], dtype=float)
    out = []
    n_same = int(round(cfg.pairs * cfg.same_len_frac)) if multi else 0
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
    """Attention-map store: ``maps/NNNNNN/LYY.bin`` raw arrays (heads, L, L), one per (input, layer),
    ``manifest.json`` (lengths, shapes, crc32 per file), ``projector.pt`` and ``index.faiss``."""

    def __init__(self, root: Path, manifest: dict):
        self.root = Path(root)
        self.manifest = manifest
        self.entries = manifest["entries"]
        self.dtype = np.dtype(manifest["dtype"])
        self.cfg = AttnCacheConfig(**manifest["config"])
        self.lengths = np.array([e["len"] for e in self.entries], dtype=np.int64)
        self.projector: FeatureProjector | None = None
        self.index = None

    # -- writing ---------------------------------------------------------------------------
    @staticmethod
    def write_entry(root: Path, number: int, maps: list[torch.Tensor], dtype: str) -> dict:
        folder = Path(root) / "maps" / f"{number:06d}"
        folder.mkdir(parents=True, exist_ok=True)
        files = []
        for layer, amap in enumerate(maps):
            arr = np.ascontiguousarray(amap.detach().reshape(amap.shape[-3:]).numpy().astype(dtype))
            name = f"maps/{number:06d}/L{layer:02d}.bin"
            arr.tofile(root / name)
            files.append({"name": name, "shape": list(arr.shape), "crc32": zlib.crc32(arr.tobytes())})
        return {"len": int(maps[0].shape[-1]), "files": files}

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
        with torch.no_grad():
            return self.projector(pooled).numpy().astype(np.float32)

    def search(self, feature: np.ndarray, length: int) -> tuple[int, float]:
        """Nearest stored input of equal token length among k neighbours: (entry, similarity) or (-1, -inf)."""
        dist, idx = self.index.search(np.ascontiguousarray(feature, dtype=np.float32), self.cfg.k)
        for d, i in zip(dist[0], idx[0]):
            if i >= 0 and self.lengths[i] == length:
                return int(i), 1.0 - float(d)
        return -1, float("-inf")

    def map_file(self, entry: int, layer: int) -> Path:
        return self.root / self.entries[entry]["files"][layer]["name"]

    def fetch(self, entry: int) -> list[torch.Tensor]:
        """Memory-map every layer's map of one entry (torch.from_file, private mapping, no copy), crc32-checked."""
        out = []
        for rec in self.entries[entry]["files"]:
            path = self.root / rec["name"]
            shape = tuple(rec["shape"])
            want = shape[0] * shape[1] * shape[2] * self.dtype.itemsize
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                raise DataError(f"AttnCache map file {path} is missing") from None
            if size != want:
                raise DataError(f"AttnCache map file {path} is corrupt: {size} bytes, expected {want}")
            # private (copy-on-write) mmap of the file: no read into a new buffer
            tensor = torch.from_file(str(path), shared=False, size=want // self.dtype.itemsize,
                                     dtype=_TORCH_DTYPES[self.dtype.name]).view(shape)
            if zlib.crc32(tensor.numpy()) != rec["crc32"]:
                raise DataError(f"AttnCache map file {path} is corrupt: crc32 mismatch")
            if tensor.dtype != torch.float32:
                tensor = tensor.float()  # float16 store: one conversion (the only copy)
            out.append(tensor.unsqueeze(0))
        return out


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
    (eager maps kept in ``recorded``), ``lookup`` (search; on a hit reuse stored maps),
    ``force`` (reuse the nearest equal-length candidate whatever its similarity).
    Per forward: ``last`` holds hit, entry, sim and times (attention, lookup)."""

    def __init__(self, model: nn.Module, cfg: AttnCacheConfig | None = None):
        self.model = model
        self.cfg = cfg or AttnCacheConfig()
        self.mode = "off"
        self.store: MapStore | None = None
        self.theta = self.cfg.theta
        self.hit_maps: list[torch.Tensor] | None = None
        self.recorded: list[torch.Tensor] = []
        self.pooled: torch.Tensor | None = None
        self.last: dict = {}
        self._attn_t0 = 0.0
        self._handles = []
        self._patched = []
        self.attn_modules = _attention_modules(model)
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
                lin.forward = _skippable(lin, self)
                self._patched.append((lin, "forward", None))
            self._handles.append(mod.register_forward_pre_hook(self._attn_pre))
            self._handles.append(mod.register_forward_hook(self._attn_post))
        self._handles.append(self.attn_modules[0].register_forward_pre_hook(self._layer0_pre, with_kwargs=True,
                                                                              prepend=True))
        self._handles.append(self.model.register_forward_pre_hook(self._model_pre))
        self._handles.append(self.model.register_forward_hook(self._model_post))
        # RoPE runs inside the attention module before the interface's function is called, and no
        # interface or hook can skip it; on a hit its inputs are the skipped projections' empty
        # tensors, so the modeling module's apply_rotary_pos_emb is wrapped (per cache, a closure;
        # restored by detach) to pass them through. Models without RoPE (BERT) are not touched.
        modeling = sys.modules.get(type(self.attn_modules[0]).__module__)
        if modeling is not None and hasattr(modeling, "apply_rotary_pos_emb"):
            original = modeling.apply_rotary_pos_emb
            modeling.apply_rotary_pos_emb = _skippable_rope(original, self)
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
        self.store = store
        self.theta = store.cfg.theta if theta is None else theta

    # -- hooks -----------------------------------------------------------------------------
    def _model_pre(self, module, args):
        self.hit_maps, self.recorded, self.pooled = None, [], None
        self.last = {"hit": False, "entry": -1, "sim": float("-inf"), "attn_s": 0.0, "lookup_s": 0.0}

    def _model_post(self, module, args, output):
        self.hit_maps = None

    def _layer0_pre(self, module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if self.mode == "off":
            return None
        t0 = time.perf_counter()
        self.pooled = pool_input(hidden, self.cfg if self.store is None else self.store.cfg)
        if self.mode in ("lookup", "force"):
            if hidden.shape[0] != 1:
                raise ValueError("AttnCache lookup runs one input at a time (batch 1)")
            if self.store is None:
                raise ValueError("AttnCache lookup needs a store (use_store)")
            feature = self.store.features(self.pooled)
            entry, sim = self.store.search(feature, int(hidden.shape[1]))
            self.last["entry"], self.last["sim"] = entry, sim
            if entry >= 0 and (self.mode == "force" or sim >= self.theta):
                self.hit_maps = self.store.fetch(entry)
                self.last["hit"] = True
        self.last["lookup_s"] += time.perf_counter() - t0
        return None

    def _attn_pre(self, module, args):
        self._attn_t0 = time.perf_counter()

    def _attn_post(self, module, args, output):
        self.last["attn_s"] += time.perf_counter() - self._attn_t0


def _skippable(linear: nn.Linear, cache: AttnCache):
    """Instance forward for q/k projections: on a hit returns uninitialised memory (never read).
    (The attention interface receives q and k already projected: skipping the projections, the
    point of a hit, needs this per-instance forward; the Linear class itself is not touched.)"""
    original = type(linear).forward

    def forward(x):
        if cache.hit_maps is not None:
            return x.new_empty(*x.shape[:-1], linear.out_features)
        return original(linear, x)
    return forward


def _skippable_rope(original, cache: AttnCache):
    """``apply_rotary_pos_emb`` that passes q, k through while ``cache`` serves a hit."""
    def apply_rotary_pos_emb(q, k, *args, **kwargs):
        if cache.hit_maps is not None:
            return q, k
        return original(q, k, *args, **kwargs)
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


def _attncache_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """AttentionInterface function: stored map @ V on a hit, eager maps when recording, else sdpa."""
    cache: AttnCache | None = getattr(module, "_ladmac_attncache", None)
    if cache is not None and cache.hit_maps is not None:
        amap = cache.hit_maps[module.layer_idx]
        bsz, h_kv, length, dim = value.shape
        h_q = amap.shape[1]
        if amap.shape[-1] != length:
            raise ValueError(f"stored map length {amap.shape[-1]} != input length {length}")
        out = torch.matmul(amap.view(bsz, h_kv, h_q // h_kv, length, length), value.unsqueeze(2))
        return out.view(bsz, h_q, length, dim).transpose(1, 2).contiguous(), None
    if cache is not None and cache.mode == "record":
        groups = query.shape[1] // key.shape[1]
        k = key.repeat_interleave(groups, dim=1) if groups > 1 else key
        v = value.repeat_interleave(groups, dim=1) if groups > 1 else value
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        scores = _causal_or_given(torch.matmul(query, k.transpose(2, 3)) * scale, attention_mask, module)
        amap = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        cache.recorded.append(amap.detach())
        return torch.matmul(amap, v).transpose(1, 2).contiguous(), None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


# ----------------------------------------------------------------------------- building
def build_store(cache: AttnCache, run_one, inputs: list, root, progress: bool = True) -> MapStore:
    """Record maps and layer-0 inputs of ``inputs`` (``run_one(x)`` runs the model on one input),
    train the projector on map-distance labels, index ONE feature per input, write the store."""
    from tqdm import tqdm
    cfg = cache.cfg
    root = Path(root)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    entries, pooled, maps_all = [], [], []
    cache.mode = "record"
    try:
        for number, item in enumerate(tqdm(inputs, desc="record maps", disable=not progress, leave=False)):
            with torch.no_grad():
                run_one(item)
            if len(cache.recorded) != len(cache.attn_modules):
                raise RuntimeError(f"recorded {len(cache.recorded)} maps, model has {len(cache.attn_modules)} layers")
            if cache.recorded[0].shape[0] != 1:
                raise ValueError("build_store records one input at a time (batch 1)")
            entries.append(MapStore.write_entry(root, number, cache.recorded, cfg.map_dtype))
            pooled.append(cache.pooled)
            maps_all.append([m[0] for m in cache.recorded])
    finally:
        cache.mode = "off"
    pooled_t = torch.cat(pooled)
    lengths = [e["len"] for e in entries]
    pairs = sample_pairs(lengths, cfg)
    labels = pair_labels(maps_all, lengths, pairs, cfg.alpha, progress=progress)
    proj, losses = train_projector(pooled_t, pairs, labels, cfg, progress=progress)
    with torch.no_grad():  # row by row, exactly as at lookup, so an input of the store finds itself at distance 0
        feats = np.concatenate([proj(pooled_t[i:i + 1]).numpy() for i in range(len(pooled_t))])
    import faiss
    faiss.write_index(build_index(feats, cfg), str(root / "index.faiss"))
    torch.save(proj.state_dict(), root / "projector.pt")
    manifest = {"version": STORE_VERSION, "config": dataclasses.asdict(cfg), "dtype": cfg.map_dtype,
                "num_layers": len(cache.attn_modules), "train_loss": losses, "entries": entries}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return MapStore.open(root)
