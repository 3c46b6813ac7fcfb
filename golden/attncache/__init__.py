"""AttnCache golden model (docs/algorithms.md section 3): prefill attention-map memoization.

One module per job: :mod:`.config` (the parameters), :mod:`.projector` (pooling, the feature
projector and its Siamese training), :mod:`.index` (faiss), :mod:`.store` (the on-disk map
store), :mod:`.runtime` (the model attachment), :mod:`.build` (recording and writing a store).
This file only re-exports their public names."""
from .build import Recording, build_prefix_store, build_store, record_inputs
from .config import AttnCacheConfig, parse_layers
from .index import build_index
from .projector import (FeatureProjector, map_distance, pair_label, pair_labels, pool_input, sample_pairs,
                        train_projector)
from .runtime import ATTN_NAME, AttnCache
from .store import STORE_VERSION, MapStore

__all__ = ["ATTN_NAME", "STORE_VERSION", "AttnCache", "AttnCacheConfig", "FeatureProjector", "MapStore", "Recording",
           "build_index", "build_prefix_store", "build_store", "map_distance", "pair_label", "pair_labels",
           "parse_layers", "pool_input", "record_inputs", "sample_pairs", "train_projector"]
