"""The training-process side: the Reporter and its framework adapters (standard library only)."""
