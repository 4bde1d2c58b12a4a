# Prometheus and Alertmanager from Debian's packages, for machines that reach no image
# registry (build.py beside this file builds both; deploy/compose/local-images.yml runs
# them in place of prom/prometheus and prom/alertmanager). Laid out as those official
# images are, so docker-compose.yml's commands, mounts and tmpfs run unchanged: the binary
# is the entrypoint, the process runs as nobody, and the data directory (/prometheus,
# /alertmanager) is its working directory, owned by nobody.
# The versions are the compose file's: Prometheus 3.5 LTS and Alertmanager 0.33, from
# Debian sid's packages (deploy/tools/fetch-prometheus3.sh downloads them; build.py puts
# them in the build context's debs/), installed on the bookworm base: they need only its
# libc6, adduser and tzdata. `make test` runs the same binaries.
ARG BASE_IMAGE=gpufleet-local/python:3.11-bookworm

FROM ${BASE_IMAGE} AS debian
COPY debs/ /tmp/debs/
RUN apt-get update \
 && apt-get install -y --no-install-recommends /tmp/debs/prometheus_*.deb \
      /tmp/debs/promtool_*.deb /tmp/debs/prometheus-alertmanager_*.deb \
 && rm -rf /tmp/debs /var/lib/apt/lists/* /var/cache/apt/archives/*.deb

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
