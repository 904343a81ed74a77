#!/usr/bin/env bash
# Installs Fn's function development kits for the built-in `fn:python` and `fn:node` kinds:
# fdk (python) from PyPI and @fnproject/fdk (node) from npm, pinned to the versions the
# contract was measured against (../shared/reference/fn-http-stream.md), into
# /usr/local/lib/invoker-fdk (`config::kinds::FDK_DIR`), which those kinds show read-only in
# their containers. Nothing is fetched at run time. Idempotent: a kit already there is kept.
#
#   scripts/fdk.sh            # as root (CI, the README's test command)
set -euo pipefail
dir="${INVOKER_FDK_DIR:-/usr/local/lib/invoker-fdk}"
python_fdk="fdk==0.1.128"
node_fdk="@fnproject/fdk@0.0.76"

if [ ! -f "$dir/python/fdk/__init__.py" ]; then
    # The packages run under the system's python3 in a container (a private interpreter's
    # directories are not shown there): installed for its version, into a directory of their own.
    command -v pip3 >/dev/null 2>&1 || command -v pip >/dev/null 2>&1 \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip; }
    pip="$(command -v pip3 || command -v pip)"
    version="$(/usr/bin/python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    mkdir -p "$dir"
    rm -rf "$dir/python.new"
    "$pip" install --quiet --root-user-action=ignore --disable-pip-version-check --no-warn-script-location \
        --target "$dir/python.new" --python-version "$version" --only-binary=:all: "$python_fdk" >&2
    rm -rf "$dir/python"
    mv "$dir/python.new" "$dir/python"
fi
if [ ! -f "$dir/node/node_modules/@fnproject/fdk/package.json" ]; then
    command -v npm >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm; }
    mkdir -p "$dir"
    rm -rf "$dir/node.new"
    mkdir -p "$dir/node.new"
    npm install --silent --no-audit --no-fund --prefix "$dir/node.new" "$node_fdk" >&2
    rm -rf "$dir/node"
    mv "$dir/node.new" "$dir/node"
fi
# Readable by every container's user, written by none.
chmod -R a+rX,go-w "$dir"
echo "$dir"
