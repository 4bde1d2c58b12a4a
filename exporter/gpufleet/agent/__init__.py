"""The per-node agent: GPU telemetry and the training-metrics ingest API."""
