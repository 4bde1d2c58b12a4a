#!/usr/bin/env bash
# `make test-containers`: Docker's engine (started here when none answers, its PID kept and
# stopped at the end), the local images (deploy/compose/local-images/build.py: the base by
# debootstrap only when missing), then tests/containers/compose_stack.py.
# Usage: tests/containers/run.sh PYTHON   (the venv's python, with pytest)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${1:?usage: $0 PYTHON}
START=$SECONDS
STATE=$(mktemp -d /tmp/gpufleet-dockerd.XXXXXX)
DOCKERD_PID=""

stop_dockerd() {
  if [ -n "$DOCKERD_PID" ]; then
    echo "test-containers: stopping dockerd (pid $DOCKERD_PID)"
    kill -TERM "$DOCKERD_PID" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 1; done
    kill -0 "$DOCKERD_PID" 2>/dev/null && kill -KILL "$DOCKERD_PID" 2>/dev/null || true
  fi
  rm -rf "$STATE"
}
trap stop_dockerd EXIT

if docker info >/dev/null 2>&1; then
  echo "test-containers: using the Docker engine that is running"
else
  # No systemd here: dockerd runs in the background, its own containerd with it.
  dockerd --host=unix:///var/run/docker.sock >"$STATE/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  echo "$DOCKERD_PID" >"$STATE/dockerd.pid"
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && break
    kill -0 "$DOCKERD_PID" 2>/dev/null || { tail -20 "$STATE/dockerd.log"; exit 1; }
    sleep 1
  done
  docker info >/dev/null 2>&1 || { echo "dockerd did not answer in 60 s"; tail -20 "$STATE/dockerd.log"; exit 1; }
  echo "test-containers: started dockerd (pid $DOCKERD_PID) in $((SECONDS - START)) s"
fi
docker version --format 'test-containers: Docker engine {{.Server.Version}}'

# The base and the Prometheus / Alertmanager stand-ins; the test builds the product image
# through `docker compose build` (the compose file's one build:).
"$PY" deploy/compose/local-images/build.py --only base --only monitoring
echo "test-containers: images ready at $((SECONDS - START)) s"
"$PY" -m pytest -p no:cacheprovider -s -v --timeout 1200 tests/containers/compose_stack.py
echo "test-containers: done in $((SECONDS - START)) s"
