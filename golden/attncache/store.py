"""AttnCache's on-disk map store (docs/algorithms.md section 3; docs/results_attncache.md, the
store): ONE raw file per stored input holding its reused layers' maps contiguously, crc32 in a
manifest, memory-mapped and checked once per store object; a prefix store (shared prompt
prefixes, docs/algorithms.md section 3.6) holds token ids instead of a projector and an index."""
from __future__ import annotations

import json
import time
import zlib
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from .config import AttnCacheConfig
from .projector import FeatureProjector

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16}
STORE_VERSION = 2


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
