#!/usr/bin/env bash
# Builds Fn's build and run images locally, under exactly the tags Fn's client (`fn` 0.6.63,
# langs/python.go and langs/node.go) writes into the Dockerfiles of `fn build` and `fn deploy`:
#   fnproject/python:3.12-dev  fnproject/python:3.12   (and 3.11, the client's other python)
#   fnproject/node:24-dev      fnproject/node:24       (and 22, the client's other node)
# No image registry is reachable here, so they are made from what this machine has: the Debian
# bookworm root of invoker-python-base (scripts/build-images.sh, which calls this script), its
# python3 (3.11, whatever the tag says), and this machine's node. The -dev images install
# offline: pip from a wheelhouse of Fn's FDK (PIP_NO_INDEX, PIP_FIND_LINKS), npm from a cache
# holding Fn's node FDK (npm_config_offline), both fetched once from PyPI and npm into
# INVOKER_IMAGE_CACHE. A build with these images needs no network, and `docker build` here has
# none. On a machine that reaches Docker Hub, the real fnproject images work the same.
#
# Offline, a function's requirements.txt or package.json can name only what the wheelhouse or
# cache holds: Fn's FDK and what it depends on.
set -euo pipefail
cd "$(dirname "$0")/.."

sock=${INVOKER_DOCKER_SOCKET:-/run/invoker-docker/docker.sock}
cache=${INVOKER_IMAGE_CACHE:-/var/cache/invoker-images}
export DOCKER_HOST="unix://$sock"
python_fdk="fdk==0.1.128"
node_fdk_range=">=0.0.76"
pip_version="24.3.1"
npm_version="10.9.2"

docker image inspect invoker-python-base:bookworm >/dev/null 2>&1 \
  || { echo "fn-images.sh: invoker-python-base:bookworm is missing; run scripts/build-images.sh" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build() {
  docker build -q -t "$1" -f "$2" "$3" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
}
label() { docker image inspect -f '{{ index .Config.Labels "invoker.fn-image" }}' "$1" 2>/dev/null || true; }

# What the images are made of, fetched once: the wheelhouse, the npm cache and npm itself.
mkdir -p "$cache"
wheels="$cache/fn-wheelhouse-${python_fdk#fdk==}"
if [ ! -f "$wheels/.complete" ]; then
  pip="$(command -v pip3 || command -v pip)"
  version="$(docker run --rm --network none invoker-python-base:bookworm \
    python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  rm -rf "$wheels" && mkdir -p "$wheels"
  "$pip" download --quiet --disable-pip-version-check --dest "$wheels" --only-binary=:all: \
    --python-version "$version" "$python_fdk" "pip==$pip_version" >&2
  touch "$wheels/.complete"
fi
npm_cache="$cache/fn-npm-cache"
if [ ! -f "$npm_cache/.complete" ]; then
  rm -rf "$npm_cache" "$work/warm" && mkdir -p "$work/warm"
  # A real install of what `fn init --runtime node` writes fills the cache with every
  # package document and tarball that install needs.
  printf '{"name":"warm","version":"1.0.0","dependencies":{"@fnproject/fdk":"%s"}}\n' "$node_fdk_range" \
    >"$work/warm/package.json"
  (cd "$work/warm" && npm install --silent --no-audit --no-fund --cache "$npm_cache" >&2)
  touch "$npm_cache/.complete"
fi
npm_tgz="$cache/npm-$npm_version.tgz"
if [ ! -s "$npm_tgz" ]; then
  (cd "$work" && npm pack --silent "npm@$npm_version" >/dev/null)
  mv "$work/npm-$npm_version.tgz" "$npm_tgz"
fi

node_bin=$(readlink -f "$(command -v node)")
sum=$( { sha256sum "$0" "$node_bin" "$npm_tgz"; ls "$wheels"; find "$npm_cache" -path '*index-v5*' -type f | sort; } \
  | sha256sum | cut -c1-16)
path_env='ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'

if [ "$(label fnproject/python:3.12-dev)" != "$sum" ]; then
  mkdir -p "$work/py-dev"
  cp -a "$wheels" "$work/py-dev/wheelhouse"
  rm -f "$work/py-dev/wheelhouse/.complete"
  pip_wheel="/usr/local/share/fn-wheelhouse/pip-$pip_version-py3-none-any.whl"
  cat >"$work/py-dev.Dockerfile" <<EOF
FROM invoker-python-base:bookworm
$path_env
COPY wheelhouse /usr/local/share/fn-wheelhouse
RUN python3 $pip_wheel/pip install --quiet --no-index --break-system-packages --root-user-action=ignore $pip_wheel
ENV PIP_NO_INDEX=1 PIP_FIND_LINKS=/usr/local/share/fn-wheelhouse PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
LABEL invoker.fn-image=$sum
EOF
  build fnproject/python:3.12-dev "$work/py-dev.Dockerfile" "$work/py-dev"
  printf 'FROM invoker-python-base:bookworm\n%s\nLABEL invoker.fn-image=%s\n' "$path_env" "$sum" >"$work/py.Dockerfile"
  build fnproject/python:3.12 "$work/py.Dockerfile" "$work"
  docker tag fnproject/python:3.12-dev fnproject/python:3.11-dev
  docker tag fnproject/python:3.12 fnproject/python:3.11
  echo "built fnproject/python:3.12-dev, fnproject/python:3.12 (and 3.11) ($sum)"
fi

if [ "$(label fnproject/node:24-dev)" != "$sum" ]; then
  mkdir -p "$work/node/npm" "$work/node/npm-cache"
  cp "$node_bin" "$work/node/node"
  tar -C "$work/node/npm" --strip-components=1 -xzf "$npm_tgz"
  cp -a "$npm_cache/." "$work/node/npm-cache/"
  rm -rf "$work/node/npm-cache/.complete" "$work/node/npm-cache/_logs"
  cat >"$work/node.Dockerfile" <<EOF
FROM invoker-python-base:bookworm
$path_env
COPY node /usr/local/bin/node
RUN node --version >/dev/null
LABEL invoker.fn-image=$sum
EOF
  build fnproject/node:24 "$work/node.Dockerfile" "$work/node"
  cat >"$work/node-dev.Dockerfile" <<EOF
FROM fnproject/node:24
COPY npm /usr/local/lib/node_modules/npm
COPY npm-cache /usr/local/share/fn-npm-cache
RUN ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm && npm --version >/dev/null
ENV npm_config_cache=/usr/local/share/fn-npm-cache npm_config_offline=true npm_config_audit=false npm_config_fund=false npm_config_update_notifier=false
LABEL invoker.fn-image=$sum
EOF
  build fnproject/node:24-dev "$work/node-dev.Dockerfile" "$work/node"
  docker tag fnproject/node:24-dev fnproject/node:22-dev
  docker tag fnproject/node:24 fnproject/node:22
  echo "built fnproject/node:24-dev, fnproject/node:24 (and 22) ($sum)"
fi
