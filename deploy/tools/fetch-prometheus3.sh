#!/usr/bin/env bash
# Prometheus 3, promtool, Alertmanager and VictoriaMetrics + vmalert from Debian sid,
# unpacked into a folder of this checkout (default .tools/prometheus3) without touching
# the system: apt runs on a private configuration, state and cache (under DEST/apt), only
# downloads, and dpkg-deb unpacks. Bookworm's own packages (Prometheus 2.42, Alertmanager
# 0.25, VictoriaMetrics 1.79) stay the system's; the tests run on both sets.
#
#   deploy/tools/fetch-prometheus3.sh [DEST]
#
# Each package is pinned to a major.minor series; sid's newer patch releases are accepted,
# another series fails naming what sid has. A second run with the same pins is a no-op.
set -euo pipefail

DEST="$(realpath -m "${1:-.tools/prometheus3}")"
ARCHIVE="${GPUFLEET_SID_ARCHIVE:-http://deb.debian.org/debian}"
# package=series: the version must start with the series and a dot.
PINS=(prometheus=3.5 promtool=3.5 prometheus-alertmanager=0.33 victoria-metrics=1.145)
# What the tests run; the rest of each package (vmagent, vmctl, ...) is not kept.
KEEP=(prometheus promtool prometheus-alertmanager amtool victoria-metrics vmalert)

STAMP="$DEST/fetched"
want="${PINS[*]} ${KEEP[*]}"
if [ -f "$STAMP" ] && [ "$(head -1 "$STAMP")" = "$want" ] \
   && "$DEST/usr/bin/promtool" --version >/dev/null 2>&1; then
  exit 0
fi

APT="$DEST/apt"
rm -rf "$DEST" && mkdir -p "$APT"/{lists/partial,cache/archives/partial,etc,debs}
echo "deb $ARCHIVE sid main" >"$APT/etc/sources.list"
touch "$APT/status"
opts=(
  -o "Dir::Etc::sourcelist=$APT/etc/sources.list" -o "Dir::Etc::sourceparts=-"
  -o "Dir::State::Lists=$APT/lists" -o "Dir::State::status=$APT/status"
  -o "Dir::Cache=$APT/cache" -o "APT::Get::List-Cleanup=0"
  -o "APT::Sandbox::User=$(id -un)" -o "Debug::NoLocking=1"
)
apt-get "${opts[@]}" -qq update

versions=()
for pin in "${PINS[@]}"; do
  package="${pin%%=*}" series="${pin#*=}"
  candidate="$(apt-cache "${opts[@]}" policy "$package" | awk '/Candidate:/ {print $2}')"
  case "$candidate" in
    "$series".*) versions+=("$package=$candidate") ;;
    *) echo "fetch-prometheus3: sid has $package '${candidate:-none}', not $series.x;" \
            "update PINS in $0 (and the tests' expectations) to move on" >&2
       exit 1 ;;
  esac
done

(cd "$APT/debs" && apt-get "${opts[@]}" -qq download "${versions[@]}")
unpacked="$APT/unpacked"
for deb in "$APT"/debs/*.deb; do dpkg-deb -x "$deb" "$unpacked"; done
mkdir -p "$DEST/usr/bin"
for name in "${KEEP[@]}"; do mv "$unpacked/usr/bin/$name" "$DEST/usr/bin/"; done
# The .debs stay (deploy/compose/local-images/build.py installs them into the images).
mv "$APT/debs" "$DEST/debs"
rm -rf "$APT"

"$DEST/usr/bin/promtool" --version >/dev/null
{ echo "$want"; printf '%s\n' "${versions[@]}"; } >"$STAMP"
echo "fetch-prometheus3: from Debian sid into $DEST: ${versions[*]}"
