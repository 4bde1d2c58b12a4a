"""Every family gpufleet exports, defined once: name, type, help text and label names.

Producers (the agent's aggregator and self-metrics, the ledger, the simulator and
its history writer) take their names, help and types from here; tests check that
every rule and dashboard reads a series some entry produces. Where each area's
entries live:

- ``gpufleet.schema.gpu``: the per-GPU families (dcgm-exporter's names);
- ``gpufleet.schema.training``: training and checkpoint counters (agent);
- ``gpufleet.schema.agent``: the agent's ingest bookkeeping and self-metrics;
- ``gpufleet.schema.ledger``: the fleet ledger's families;
- ``gpufleet.schema.slurm`` and ``gpufleet.schema.kube``: the slurm-watch and kube-watch
  sidecars' own families;
- ``gpufleet.schema.index``: all of them in one tuple, to look any family up.

The schema is the bottom layer: its modules import nothing from gpufleet but
``gpufleet.exposition`` (the metric kinds).
"""
