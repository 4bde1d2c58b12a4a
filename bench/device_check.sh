#!/usr/bin/env bash
# What a session lent a GPU machine runs there, as one command (issue 33's CUDA path, and
# NVML fixtures recorded on real hardware). With the device tool:
#   run(command="bash bench/device_check.sh", timeout_s=480)
# The machine's python3 holds a CUDA PyTorch and nvidia-ml-py; gpufleet runs from this
# tree (PYTHONPATH), nothing is installed. What comes back (in $OUT):
#   nvml-<gpu>.json, nvml-<gpu>.prom  gpufleet nvml-record's fixture and its /metrics
#   cuda-timing.json                  bench/cuda_timing.py's figures (DDP, FSDP2, DeepSpeed)
#   device-check.log                  everything printed
# Commit the fixture under exporter/gpufleet/gpu/fixtures/ with a README entry, and quote
# cuda-timing.json's figures in docs/TIMING.md.
# Here, without a GPU: `OUT=/tmp/x bash bench/device_check.sh --device cpu` checks the script.
set -u
OUT=${OUT:-/tmp/gpufleet-device-check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/exporter${PYTHONPATH:+:$PYTHONPATH}"
PYTHON=${PYTHON:-python3}
DEVICE=cuda
[ "${1:-}" = "--device" ] && DEVICE=$2
{
    date -u
    "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
    if [ "$DEVICE" = cuda ]; then
        nvidia-smi -L
        name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-' | tr -cd 'A-Za-z0-9-')
        timeout 120 "$PYTHON" -m gpufleet nvml-record --node device-check \
            --out "$OUT/nvml-$name.json" --metrics-out "$OUT/nvml-$name.prom"
        echo "nvml-record rc=$?"
    fi
    timeout 300 "$PYTHON" bench/cuda_timing.py --device "$DEVICE" --steps 200 \
        --out "$OUT/cuda-timing.json"
    echo "cuda_timing rc=$?"
} 2>&1 | grep -v '^W[0-9]\{4\} ' | tee "$OUT/device-check.log"
