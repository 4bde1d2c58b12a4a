"""Synthetic cluster: seeded fault model, live scrape targets, multi-day history."""
