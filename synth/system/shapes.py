"""Model shapes for the system model (docs/system.md, "The model"): what a decode step of a
whole transformer moves and computes outside attention. A shape is a name in :data:`SHAPES` (the
published ``config.json`` of each model, values copied with their source) or any transformers
``config.json`` (:func:`shape_from_config`)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from golden.errors import DataError


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer (Llama layout: q/k/v/o projections, a gated MLP of three
    matrices, RMSNorms) at ``weight_bits`` per weight."""
    name: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool              # the LM head is the embedding matrix (read once per token either way)
    max_positions: int
    source: str
    weight_bits: int = 16

    @property
    def kv_group(self) -> int:
        """Query heads that share one KV head (GQA's group; 1 without GQA)."""
        return self.q_heads // self.kv_heads

    @property
    def layer_weights(self) -> int:
        """Weights one layer reads per token: q, k, v, o and the MLP's gate, up and down."""
        attn = self.hidden * self.head_dim * (2 * self.q_heads + 2 * self.kv_heads)
        return attn + 3 * self.hidden * self.intermediate

    @property
    def step_weights(self) -> int:
        """Weights a decode step reads: every layer's plus the LM head (one embedding row is negligible)."""
        return self.layers * self.layer_weights + self.vocab * self.hidden

    @property
    def kv_bytes_per_position(self) -> int:
        """KV-cache bytes one position adds over all layers at 16 bits per element."""
        return self.layers * self.kv_heads * self.head_dim * 2 * 2


SHAPES = {
    "smollm2": ModelShape("SmolLM2-135M", layers=30, hidden=576, q_heads=9, kv_heads=3, head_dim=64,
                          intermediate=1536, vocab=49152, tied=True, max_positions=8192,
                          source="HuggingFaceTB/SmolLM2-135M-Instruct config.json (the model eval lad|mac runs)"),
    "llama2-7b": ModelShape("Llama-2-7B", layers=32, hidden=4096, q_heads=32, kv_heads=32, head_dim=128,
                            intermediate=11008, vocab=32000, tied=False, max_positions=4096,
                            source="meta-llama/Llama-2-7b-hf config.json"),
}


def shape_from_config(path: Path) -> ModelShape:
    """The shape of a transformers ``config.json``; :class:`DataError` (one line) for a file that is
    missing, not JSON or lacks a field the model needs."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"no model config {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{path} is not a JSON model config ({err})") from None
    if not isinstance(cfg, dict):
        raise DataError(f"{path} is not a JSON model config (not an object)")
    need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in need if not isinstance(cfg.get(k), int) or cfg[k] <= 0]
    if missing:
        raise DataError(f"{path}: model config lacks a positive integer {', '.join(missing)}")
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    if not isinstance(kv, int) or heads % kv or not isinstance(head_dim, int) or head_dim <= 0:
        raise DataError(f"{path}: num_key_value_heads ({kv}) must divide num_attention_heads ({heads}) "
                        f"and head_dim must be a positive integer")
    return ModelShape(cfg.get("_name_or_path") or path.stem, layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"],
                      q_heads=heads, kv_heads=kv, head_dim=head_dim, intermediate=cfg["intermediate_size"],
                      vocab=cfg["vocab_size"], tied=bool(cfg.get("tie_word_embeddings", False)),
                      max_positions=int(cfg.get("max_position_embeddings") or 0), source=str(path))


def get_shape(name_or_path: str) -> ModelShape:
    """A shape by name (:data:`SHAPES`) or from a ``config.json`` path."""
    if name_or_path in SHAPES:
        return SHAPES[name_or_path]
    if name_or_path.endswith(".json") or Path(name_or_path).is_file():
        return shape_from_config(Path(name_or_path))
    raise DataError(f"unknown model '{name_or_path}' (known: {', '.join(SHAPES)}, or a transformers config.json)")
