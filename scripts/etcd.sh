#!/usr/bin/env bash
# Makes one etcd available for the cluster layer and its tests: installs Debian's etcd-server if
# it is missing, starts an etcd on 127.0.0.1 (a free client port, its own data dir, its peer port
# on loopback too) unless the one it started before still answers, waits until it answers, and
# prints ETCD_ENDPOINTS=http://127.0.0.1:PORT as its last line. Safe to run twice: the second
# run finds its etcd answering and prints the same line.
#   INVOKER_ETCD_DIR  where its data, log, pid and port live (default /tmp/invoker-etcd)
set -euo pipefail

dir=${INVOKER_ETCD_DIR:-/tmp/invoker-etcd}
port_file="$dir/client.port"

answers() { curl -sf --max-time 2 "http://127.0.0.1:$1/health" 2>/dev/null | grep -q '"health":"true"'; }

if ! command -v etcd >/dev/null 2>&1 || ! command -v curl >/dev/null 2>&1; then
  echo "etcd.sh: installing etcd-server from Debian" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server curl >/dev/null
fi

if [ -f "$port_file" ] && answers "$(cat "$port_file")"; then
  echo "ETCD_ENDPOINTS=http://127.0.0.1:$(cat "$port_file")"
  exit 0
fi

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
mkdir -p "$dir"
# The etcd this script started before, if it runs still but no longer answers. A pid file that
# outlived its etcd (a reboot, a machine image) may name another process now: kill only an etcd.
if [ -f "$dir/etcd.pid" ]; then
  old_pid=$(cat "$dir/etcd.pid" 2>/dev/null || true)
  if [ -n "$old_pid" ] && [ "$(cat "/proc/$old_pid/comm" 2>/dev/null || true)" = etcd ]; then
    kill "$old_pid" 2>/dev/null || true
  fi
  rm -f "$dir/etcd.pid"
fi
client=$(free_port)
peer=$(free_port)
while [ "$peer" = "$client" ]; do peer=$(free_port); done
echo "etcd.sh: starting etcd on 127.0.0.1:$client (data and log in $dir)" >&2
# setsid: etcd outlives this script and the shell that ran it. One member, everything on loopback.
setsid etcd \
  --name invoker-etcd \
  --data-dir "$dir/data" \
  --listen-client-urls "http://127.0.0.1:$client" \
  --advertise-client-urls "http://127.0.0.1:$client" \
  --listen-peer-urls "http://127.0.0.1:$peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
  --initial-cluster "invoker-etcd=http://127.0.0.1:$peer" \
  --initial-cluster-state new \
  --force-new-cluster \
  >"$dir/etcd.log" 2>&1 </dev/null &
echo $! >"$dir/etcd.pid"
for _ in $(seq 1 60); do
  answers "$client" && break
  sleep 0.5
done
if ! answers "$client"; then
  echo "etcd.sh: etcd did not answer within 30 s; its log:" >&2
  tail -20 "$dir/etcd.log" >&2
  exit 1
fi
echo "$client" >"$port_file"
echo "ETCD_ENDPOINTS=http://127.0.0.1:$client"
