"""The development harness, not runtime code: real multi-process PyTorch jobs (plain DDP,
Lightning, the Hugging Face Trainer) launched by ``torchrun`` as several "nodes" on one
machine, each reporting through gpufleet's client to its own agent, with a real
Prometheus evaluating gpufleet's rules (time-compressed) over them. The tests and the
benchmarks check detection claims on these jobs; nothing in a deployment imports this
package."""
