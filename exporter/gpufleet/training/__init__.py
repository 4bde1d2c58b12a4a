"""Training metrics: ingest models, per-node aggregation, the client and its adapters."""
