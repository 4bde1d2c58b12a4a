# Prometheus and Alertmanager from Debian's packages, for machines that reach no image
# registry (build.py beside this file builds both; deploy/compose/local-images.yml runs
# them in place of prom/prometheus and prom/alertmanager). Laid out as those official
# images are, so docker-compose.yml's commands, mounts and tmpfs run unchanged: the binary
# is the entrypoint, the process runs as nobody, and the data directory (/prometheus,
# /alertmanager) is its working directory, owned by nobody.
# Debian bookworm packages Prometheus 2.42 and Alertmanager 0.25 (the compose file pins
# the official 2.53.3 and 0.27.0); `make test` runs the same two versions.
ARG BASE_IMAGE=gpufleet-local/python:3.11-bookworm

FROM ${BASE_IMAGE} AS debian
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus prometheus-alertmanager \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb

FROM debian AS prometheus
RUN install -d -o nobody -g nogroup /prometheus
USER nobody
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]

FROM debian AS alertmanager
RUN install -d -o nobody -g nogroup /alertmanager
USER nobody
WORKDIR /alertmanager
EXPOSE 9093
ENTRYPOINT ["/usr/bin/prometheus-alertmanager"]
CMD ["--config.file=/etc/alertmanager/alertmanager.yml", "--storage.path=/alertmanager"]
