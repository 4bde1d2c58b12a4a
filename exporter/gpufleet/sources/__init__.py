"""Collectors that record exclusions and attempts in the ledger from where they happen."""
