"""The development harness, not runtime code; nothing in a deployment imports it.

- real Prometheus, Alertmanager, VictoriaMetrics and vmalert processes on 127.0.0.1
  (``devstack``, on ``processes``) and the compose layout they run (``deploytree``);
- ``gpufleet demo`` (``demo``, paging into ``pager``);
- the dashboards' simulated scenario behind a real Prometheus (``stack``) and their PNG
  previews (``preview``);
- real multi-process PyTorch jobs (plain DDP, Lightning, the Hugging Face Trainer)
  launched by ``torchrun`` as several "nodes" on one machine, each reporting through
  gpufleet's client to its own agent (``realjob``, ``ddp_worker``, ``workload``).

The tests and the benchmarks check detection claims on these; the wheel carries the
package because ``gpufleet demo`` runs from it."""
