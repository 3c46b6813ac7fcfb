"""Scripts that print measured figures (not tests)."""
