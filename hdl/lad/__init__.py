"""LAD tile (docs/algorithms.md §1). So far: the dense-attention baseline it is compared with."""
