"""GPU telemetry: NVML sampling into snapshots, rendered as DCGM-compatible metrics."""
