# One image for the node agent, the fleet ledger, the simulator and the demo pager:
#   docker run gpufleet:0.1.0 agent | fleet | simulate ...
# The NVIDIA container runtime mounts the driver's NVML library (libnvidia-ml.so.1)
# into the container because of NVIDIA_VISIBLE_DEVICES / NVIDIA_DRIVER_CAPABILITIES
# below; the agent requests no GPU, it only reads them.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY exporter/ exporter/
# The package's demo configurations (gpufleet/deploy/) are links to these: one committed copy.
COPY deploy/prometheus/ deploy/prometheus/
COPY deploy/alertmanager/ deploy/alertmanager/
# The services' extras (agent and ledger; sim: the simulator, its numpy and pyyaml) at the
# exact versions CI runs (constraints.txt), without the dev/test extras; every dependency
# ships a binary wheel, so no compiler is needed here either.
RUN python -m venv /opt/gpufleet \
 && /opt/gpufleet/bin/pip install -c constraints.txt '.[agent,sim]'

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpufleet" \
      org.opencontainers.image.description="Observability for large GPU training clusters" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/gpufleet/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# /var/lib/gpufleet is the data directory (the ledger's database, the simulator's file_sd
# list). A named volume mounted there starts with this owner and mode; 0755 lets the
# compose Prometheus (user nobody) read the simulator's target list from it.
RUN groupadd --system --gid 10001 gpufleet \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/gpufleet --no-create-home \
      --shell /usr/sbin/nologin gpufleet \
 && install -d -o 10001 -g 10001 -m 0755 /var/lib/gpufleet
COPY --from=build /opt/gpufleet /opt/gpufleet
USER 10001:10001
WORKDIR /var/lib/gpufleet
EXPOSE 9405 9406 9500
ENTRYPOINT ["gpufleet"]
CMD ["agent"]
