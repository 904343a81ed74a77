#!/usr/bin/env bash
# Builds the action runtime images locally (no registry is reachable here), for the Docker
# factory. Each image holds the project's own runtime (`invoker action-runtime`) at /invoker:
#   invoker-native:latest  FROM scratch: the binary, the shared libraries ldd lists, and
#                          busybox-static as /bin/sh (native actions are executables or scripts)
#   invoker-ow-native:latest  invoker-native with the runtime as its entry point, serving on
#                          0.0.0.0:8080 of its own network as OpenWhisk's images do (the Docker
#                          factory's `isolated` network is tested with it)
#   invoker-python:latest  a Debian minbase root with python3 and its standard library (debootstrap, built once
#                          and cached in INVOKER_IMAGE_CACHE), plus the binary
#   invoker-fn-python:latest  the same root with Fn's python FDK (scripts/fdk.sh), for fn:python
#   invoker-fn-node:latest  FROM scratch: this machine's node with its libraries, and Fn's node
#                          FDK (scripts/fdk.sh), for fn:node
#   fnproject/python:3.12-dev, fnproject/python:3.12, fnproject/node:24-dev, fnproject/node:24
#                          Fn's build and run images for Fn's client, made offline
#                          (scripts/fn-images.sh)
# An image is rebuilt only when the binary it holds changed (its sha256 is a label).
#   scripts/build-images.sh [path/to/invoker]   (default: a debug build, built if missing)
set -euo pipefail
cd "$(dirname "$0")/.."

sock=${INVOKER_DOCKER_SOCKET:-/run/invoker-docker/docker.sock}
cache=${INVOKER_IMAGE_CACHE:-/var/cache/invoker-images}
export DOCKER_HOST="unix://$sock"

binary=${1:-${CARGO_TARGET_DIR:-target}/debug/invoker}
if [ $# -eq 0 ]; then
  cargo build --quiet --bin invoker
fi
[ -x "$binary" ] || { echo "build-images.sh: no invoker binary at $binary" >&2; exit 1; }

need=()
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
# The fn:node image holds this machine's node.
command -v node >/dev/null 2>&1 || need+=(nodejs)
[ -x /bin/busybox ] && /bin/busybox --help 2>&1 | grep -q static || dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

sum=$(sha256sum "$binary" | cut -c1-16)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# docker build TAG DOCKERFILE CONTEXT, quiet unless it fails (the legacy builder needs no network).
build() {
  docker build -q -t "$1" -f "$2" "$3" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
}

current() { docker image inspect -f '{{ index .Config.Labels "invoker.binary" }}' "$1" 2>/dev/null || true; }

# The root filesystem of the native image: the binary with its libraries, and busybox.
if [ "$(current invoker-native:latest)" != "$sum" ]; then
  root="$work/native"
  mkdir -p "$root/bin" "$root/tmp" && chmod 1777 "$root/tmp"
  strip -o "$root/invoker" "$binary" 2>/dev/null || cp "$binary" "$root/invoker"
  for lib in $(ldd "$binary" | grep -o '/[^ ]*'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
  cp /bin/busybox "$root/bin/busybox"
  for tool in sh cat echo env ls sleep wget nc head; do ln -sf busybox "$root/bin/$tool"; done
  printf 'FROM scratch\nCOPY . /\nLABEL invoker.binary=%s\n' "$sum" >"$work/native.Dockerfile"
  build invoker-native:latest "$work/native.Dockerfile" "$root"
  echo "built invoker-native:latest ($sum)"
fi

# An image in OpenWhisk's shape: no command from the invoker, the runtime on :8080.
if [ "$(current invoker-ow-native:latest)" != "$sum" ]; then
  printf 'FROM invoker-native:latest\nENTRYPOINT ["/invoker", "action-runtime", "--listen", "0.0.0.0:8080", "--launcher", "native"]\nLABEL invoker.binary=%s\n' \
    "$sum" >"$work/ow.Dockerfile"
  build invoker-ow-native:latest "$work/ow.Dockerfile" "$work"
  echo "built invoker-ow-native:latest ($sum)"
fi

# The python image: a cached Debian root with python3, then the binary on top.
if [ "$(current invoker-python:latest)" != "$sum" ]; then
  if ! docker image inspect invoker-python-base:bookworm >/dev/null 2>&1; then
    mkdir -p "$cache"
    if [ ! -s "$cache/python3-rootfs.tar" ]; then
      echo "build-images.sh: debootstrap of a python3 root (once; cached in $cache)" >&2
      debootstrap --variant=minbase --include=python3 bookworm "$work/rootfs" \
        http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
        || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
      rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb
      tar -C "$work/rootfs" -cf "$cache/python3-rootfs.tar.part" .
      mv "$cache/python3-rootfs.tar.part" "$cache/python3-rootfs.tar"
      rm -rf "$work/rootfs"
    fi
    docker import "$cache/python3-rootfs.tar" invoker-python-base:bookworm >/dev/null
  fi
  mkdir -p "$work/python"
  strip -o "$work/python/invoker" "$binary" 2>/dev/null || cp "$binary" "$work/python/invoker"
  printf 'FROM invoker-python-base:bookworm\nCOPY invoker /invoker\nLABEL invoker.binary=%s\n' "$sum" \
    >"$work/python.Dockerfile"
  build invoker-python:latest "$work/python.Dockerfile" "$work/python"
  echo "built invoker-python:latest ($sum)"
fi
# Fn's python FDK (scripts/fdk.sh) on the python root: the image of the built-in fn:python
# kind, whose command runs the FDK with the function's code at /function.
fdk_dir=$(bash scripts/fdk.sh)
fdk_sum=$(find "$fdk_dir/python" -name METADATA -path '*fdk-*' -exec sha256sum {} + | sha256sum | cut -c1-16)
if [ "$(docker image inspect -f '{{ index .Config.Labels "invoker.fdk" }}' invoker-fn-python:latest 2>/dev/null || true)" != "$fdk_sum" ]; then
  mkdir -p "$work/fn-python"
  cp -a "$fdk_dir/python" "$work/fn-python/fdk"
  printf 'FROM invoker-python-base:bookworm
COPY fdk /usr/local/lib/invoker-fdk/python
ENV PYTHONPATH=/usr/local/lib/invoker-fdk/python PYTHONUNBUFFERED=1
LABEL invoker.fdk=%s
' \
    "$fdk_sum" >"$work/fn-python.Dockerfile"
  build invoker-fn-python:latest "$work/fn-python.Dockerfile" "$work/fn-python"
  echo "built invoker-fn-python:latest (fdk $fdk_sum)"
fi
# Fn's node FDK with this machine's node (installed by scripts/test.sh; its libraries as ldd
# lists them): the image of the built-in fn:node kind, the code at /function.
node_bin=$(readlink -f "$(command -v node)")
node_sum=$( { sha256sum "$node_bin"; find "$fdk_dir/node" -name package.json -path '*fdk*' -exec sha256sum {} +; } | sha256sum | cut -c1-16)
if [ "$(docker image inspect -f '{{ index .Config.Labels "invoker.fdk" }}' invoker-fn-node:latest 2>/dev/null || true)" != "$node_sum" ]; then
  root="$work/fn-node"
  mkdir -p "$root/usr/bin" "$root/tmp" "$root/usr/local/lib/invoker-fdk" && chmod 1777 "$root/tmp"
  cp "$node_bin" "$root/usr/bin/node"
  for lib in $(ldd "$node_bin" | grep -o '/[^ ]*'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
  cp -a "$fdk_dir/node" "$root/usr/local/lib/invoker-fdk/node"
  printf 'FROM scratch\nCOPY . /\nENV NODE_PATH=/usr/local/lib/invoker-fdk/node/node_modules\nLABEL invoker.fdk=%s\n' \
    "$node_sum" >"$work/fn-node.Dockerfile"
  build invoker-fn-node:latest "$work/fn-node.Dockerfile" "$root"
  echo "built invoker-fn-node:latest (node and fdk $node_sum)"
fi
# Fn's build and run images, for `fn build` and `fn deploy --local` (scripts/fn-images.sh).
bash scripts/fn-images.sh
# What rebuilds left untagged.
docker image prune -f >/dev/null
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^(invoker-|fnproject/)' | sort
