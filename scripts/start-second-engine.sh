#!/usr/bin/env bash
# Start a second dockerd beside the main one, on its own socket, data-root, exec-root and pidfile:
# a stand-in for a remote builder ([builder] host/context in BUILD.toml). Needs root.
# Idempotent: when it already answers, nothing is started. Prints its DOCKER_HOST URL on stdout.
#   EFABUILD_ENGINE2_RUN   socket, exec-root and pidfile   (default /run/efabuild-engine2)
#   EFABUILD_ENGINE2_DATA  images and build cache          (default /var/lib/efabuild-engine2)
#   EFABUILD_ENGINE2_BRIDGE, EFABUILD_ENGINE2_CIDR  its network bridge (efabuild2br, 10.213.213.1/24)
set -euo pipefail
log() { printf 'second-engine: %s\n' "$*" >&2; }

run_dir=${EFABUILD_ENGINE2_RUN:-/run/efabuild-engine2}
data_dir=${EFABUILD_ENGINE2_DATA:-/var/lib/efabuild-engine2}
host="unix://$run_dir/docker.sock"
pidfile="$run_dir/docker.pid"
logfile="$run_dir/dockerd.log"
bridge=${EFABUILD_ENGINE2_BRIDGE:-efabuild2br}
bridge_cidr=${EFABUILD_ENGINE2_CIDR:-10.213.213.1/24}

answers() { docker --host "$host" version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if answers; then echo "$host"; exit 0; fi
[ "$(id -u)" = 0 ] || { log "run as root (starts dockerd)"; exit 2; }
command -v dockerd >/dev/null || { log "dockerd missing: run scripts/setup-host.sh first"; exit 1; }

mkdir -p "$run_dir/exec" "$data_dir"
# Its own bridge: build steps (RUN) need one, and docker0 belongs to the main engine.
if ! ip link show "$bridge" >/dev/null 2>&1; then
  ip link add name "$bridge" type bridge
  ip addr add "$bridge_cidr" dev "$bridge"
fi
ip link set "$bridge" up
# a pid file left by an engine that died keeps dockerd from starting
if [ -f "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then rm -f "$pidfile"; fi
if [ ! -f "$pidfile" ]; then
  log "starting dockerd on $host"
  # Its own managed containerd (under exec-root) and namespace, its own bridge and no iptables
  # rules, so it cannot clash with the main engine's network set-up. Never `--bridge none`:
  # dockerd then deletes the docker0 interface, which the main engine's builds need.
  nohup dockerd \
    --host "$host" \
    --data-root "$data_dir" \
    --exec-root "$run_dir/exec" \
    --pidfile "$pidfile" \
    --containerd-namespace efabuild-engine2 \
    --containerd-plugins-namespace efabuild-engine2-plugins \
    --bridge "$bridge" --iptables=false --ip-masq=false \
    >"$logfile" 2>&1 &
fi
for _ in $(seq 1 60); do
  if answers; then echo "$host"; exit 0; fi
  sleep 0.5
done
log "dockerd on $host did not come up; see $logfile"
tail -n 20 "$logfile" >&2 || true
exit 1
