#!/usr/bin/env bash
# Serves the browser demo (web/, after web/build.sh) on http://127.0.0.1:PORT/ (default 8080),
# local connections only. Any static file server works; this one needs only Python 3.
set -euo pipefail
cd "$(dirname "$0")"
port=${1:-${PORT:-8080}}
if [ ! -f pkg/rill.js ]; then
    echo "web/pkg is missing: run web/build.sh first" >&2
    exit 1
fi
echo "rill demo: http://127.0.0.1:$port/" >&2
exec python3 -m http.server --bind 127.0.0.1 "$port"
