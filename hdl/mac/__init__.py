"""MAC unit (Match-Amend-Complete, ALGORITHMS.md §2): Match, Merge and the MacUnit top."""
