"""MAC unit (Match-Amend-Complete, docs/algorithms.md §2): Match, Merge and the MacUnit top."""
