#!/usr/bin/env bash
# Start Debian's docker-registry on loopback as a layer-cache registry ([registry] url in BUILD.toml).
# Usage: start-registry.sh [PORT [DIR]]   (defaults: 5000, ${TMPDIR:-/tmp}/efabuild-registry-PORT)
# DIR holds its config, storage, pid file and log. Idempotent: when a registry answers on the port,
# nothing is started. Prints the address (127.0.0.1:PORT) on stdout.
# dockerd treats 127.0.0.0/8 as an insecure (plain HTTP) registry by default, so no daemon setting
# is needed to push and pull.
set -euo pipefail
log() { printf 'registry: %s\n' "$*" >&2; }

port=${1:-5000}
dir=${2:-${TMPDIR:-/tmp}/efabuild-registry-$port}
addr="127.0.0.1:$port"

answers() {
  curl -fsS -o /dev/null -m 2 -D - "http://$addr/v2/" 2>/dev/null |
    grep -qi '^docker-distribution-api-version: registry/2'
}

if answers; then echo "$addr"; exit 0; fi
command -v docker-registry >/dev/null || { log "docker-registry missing: run scripts/setup-host.sh first"; exit 1; }
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  log "port $port is taken by something that is not a registry; pass another port"; exit 1
fi

mkdir -p "$dir/storage"
config="$dir/config.yml"
cat >"$config.tmp" <<CONFIG
version: 0.1
log:
  level: warn
  fields:
    service: registry
storage:
  filesystem:
    rootdirectory: $dir/storage
  delete:
    enabled: true
http:
  addr: $addr
  headers:
    X-Content-Type-Options: [nosniff]
CONFIG
mv -f "$config.tmp" "$config"

pidfile="$dir/registry.pid"
if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  log "registry (pid $(cat "$pidfile")) is starting or stuck; waiting for it"
else
  log "starting docker-registry on $addr (storage $dir/storage)"
  nohup docker-registry serve "$config" >"$dir/registry.log" 2>&1 &
  echo $! >"$pidfile"
fi
for _ in $(seq 1 40); do
  if answers; then echo "$addr"; exit 0; fi
  sleep 0.25
done
log "registry on $addr did not come up; see $dir/registry.log"
tail -n 20 "$dir/registry.log" >&2 || true
exit 1
