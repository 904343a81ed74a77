#!/usr/bin/env bash
# Makes a Docker Engine available for the Docker factory and its tests: installs docker.io from
# Debian if it is missing, starts dockerd unless one already answers on the socket, waits until
# it answers, and prints the socket's path as its last line. Safe to run twice.
#
# The engine gets no bridge and no iptables rules: action containers run without a network
# (the factory's default) or on the host's, and nothing is routed anywhere.
#   INVOKER_DOCKER_SOCKET  the socket (default /run/invoker-docker/docker.sock)
#   INVOKER_DOCKER_ROOT    the engine's data root (default /var/lib/invoker-docker)
#   INVOKER_DOCKER_PROXY   the proxy the engine pulls through (default http://127.0.0.1:9, where
#                          nothing listens: no registry is reachable here, and a pull, such as
#                          the one `fn build` asks for, fails at once on loopback instead of
#                          sending anything off the machine; registries on loopback are reached
#                          directly). Set it empty on a machine that may reach Docker Hub.
set -euo pipefail

sock=${INVOKER_DOCKER_SOCKET:-/run/invoker-docker/docker.sock}
root=${INVOKER_DOCKER_ROOT:-/var/lib/invoker-docker}
run_dir=$(dirname "$sock")
proxy=${INVOKER_DOCKER_PROXY-http://127.0.0.1:9}

answers() { curl -sf --max-time 2 --unix-socket "$sock" http://docker/_ping >/dev/null 2>&1; }

if ! command -v dockerd >/dev/null 2>&1 || ! command -v curl >/dev/null 2>&1; then
  echo "dockerd.sh: installing docker.io from Debian" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io curl >/dev/null
fi

if ! answers; then
  if [ "$(id -u)" != 0 ]; then
    echo "dockerd.sh: no engine answers on $sock, and starting one needs root" >&2
    exit 1
  fi
  mkdir -p "$run_dir" "$root"
  # A pid file left by an engine that is gone (a reboot, or a machine image taken while one
  # ran, when /run is not a tmpfs) may name a pid some other process now has: dockerd then
  # takes it for its containerd "still running" and waits for a socket nobody will open.
  # Keep a pid file only while the process it names is what wrote it.
  for pair in "$run_dir/dockerd.pid:dockerd" "$run_dir/exec/containerd/containerd.pid:containerd"; do
    file=${pair%%:*}
    name=${pair##*:}
    [ -f "$file" ] || continue
    pid=$(cat "$file" 2>/dev/null || true)
    if [ -z "$pid" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" != "$name" ]; then
      echo "dockerd.sh: removing stale $file (pid ${pid:-none} is not $name)" >&2
      rm -f "$file"
    fi
  done
  echo "dockerd.sh: starting dockerd on $sock (log: $run_dir/dockerd.log)" >&2
  # setsid: the engine outlives this script and the shell that ran it.
  HTTP_PROXY=$proxy HTTPS_PROXY=$proxy NO_PROXY=localhost,127.0.0.1,::1 setsid dockerd \
    --host "unix://$sock" \
    --data-root "$root" \
    --exec-root "$run_dir/exec" \
    --pidfile "$run_dir/dockerd.pid" \
    --bridge=none --iptables=false --ip-masq=false \
    >"$run_dir/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 1 120); do
    answers && break
    sleep 0.5
  done
  if ! answers; then
    echo "dockerd.sh: dockerd did not answer within 60 s; its log:" >&2
    grep -v 'module=grpc' "$run_dir/dockerd.log" | tail -20 >&2
    exit 1
  fi
fi
echo "$sock"
