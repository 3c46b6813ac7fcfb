"""AttnCache's feature projector and its Siamese training (docs/algorithms.md section 3).

The layer-0 attention input is zero-padded/cropped to ``max_len`` rows and adaptive-max-pooled
(:func:`pool_input`), then projected by two linear layers with BatchNorm between
(:class:`FeatureProjector`, 128-d). Training pairs (:func:`sample_pairs`) are labelled with the
attention-map distance ``d(A1, A2)`` = mean over layers, heads and rows p of
``0.5 * ||A1[p,:] - A2[p,:]||_2``, both maps zero-padded to ``max(len1, len2)``
(:func:`map_distance`): label ``paper`` is ``alpha * d_all + |len1 - len2|`` over all layers, pairs
half among equal-length inputs, half random (the papers' AttnCache); label ``map`` is ``d_S`` over
the reused layers S only, pairs among equal-length inputs only (a stored map serves only an input
of the same length, so the length term only ever separated pairs the lookup never compares).
:func:`train_projector` fits ``||f(x1) - f(x2)||_2`` to the label (SmoothL1)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import AttnCacheConfig


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
