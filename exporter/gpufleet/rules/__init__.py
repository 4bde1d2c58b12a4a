"""gpufleet's Prometheus rules, generated from one configuration (``config.py``)."""
