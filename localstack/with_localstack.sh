#!/usr/bin/env bash
# Run a command (make test: pytest) beside LocalStack's core runtime, started as a plain process on
# 127.0.0.1 with its endpoint in MOELESS_TEST_LOCALSTACK, and stopped afterwards whatever the
# command's outcome. Without LocalStack's venv (no Python 3.13 here) the command runs alone, and the
# LocalStack tests skip saying so. See localstack/README.md.
#
#   localstack/with_localstack.sh CMD...       run CMD with LocalStack; exit with CMD's status
#   localstack/with_localstack.sh --python     print a Python 3.13 interpreter, or nothing
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${LOCALSTACK_VENV:-$ROOT/.localstack-venv}"
LOG="$ROOT/.moeless/localstack.log"
# LocalStack keeps S3 objects here whatever its FILESYSTEM_ROOT or TMPDIR say (services/s3/provider.py).
S3_STORE=/tmp/localstack-s3-storage
STOP_GRACE_S=5
READY_TIMEOUT_S=120

find_python() {
    # A pyenv shim answers `command -v` even when its version is not selected: run each candidate.
    local candidate
    for candidate in "${LOCALSTACK_PYTHON:-}" python3.13 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python3.13; do
        if [ -n "$candidate" ] && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 13))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
}

if [ "${1:-}" = "--python" ]; then
    find_python
    exit 0
fi
[ $# -gt 0 ] || { echo "usage: $0 CMD... | --python" >&2; exit 2; }

if [ ! -x "$VENV/bin/python" ]; then
    echo "with_localstack: no LocalStack venv at $VENV (make test installs it where Python 3.13 exists): the LocalStack tests will skip" >&2
    exec "$@"
fi

PORT="$("$VENV/bin/python" -c '
import socket
with socket.socket() as s:
    try:
        s.bind(("127.0.0.1", 4566))
    except OSError:
        s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1])')"
STATE="$(mktemp -d "${TMPDIR:-/tmp}/moeless-localstack.XXXXXX")"
mkdir -p "$STATE/fs" "$STATE/tmp" "$(dirname "$LOG")"
# Another LocalStack may own the S3 store: remove it afterwards only if this run made it.
[ -e "$S3_STORE" ] && S3_STORE_WAS_THERE=1 || S3_STORE_WAS_THERE=0
PID=""
COMMAND_PID=""

stop() {
    if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
        kill -TERM "$PID" 2>/dev/null || true
        for _ in $(seq $((STOP_GRACE_S * 10))); do
            kill -0 "$PID" 2>/dev/null || break
            sleep 0.1
        done
        # Under hypercorn a SIGTERM has been seen to hang the shutdown: do not wait for ever.
        kill -0 "$PID" 2>/dev/null && kill -KILL "$PID" 2>/dev/null || true
        wait "$PID" 2>/dev/null || true
    fi
    rm -rf "$STATE"
    [ "$S3_STORE_WAS_THERE" = 1 ] || rm -rf "$S3_STORE"
}
# The command runs in the background so that a signal stops LocalStack at once; it is passed on
# as SIGTERM. A background job of a script starts with SIGINT ignored, and so would every process
# it starts (the tests that press Ctrl-C on a demo would find it deaf): the command is exec'd with
# SIGINT back to its default.
interrupted() {
    [ -z "$COMMAND_PID" ] || kill -TERM "$COMMAND_PID" 2>/dev/null || true
    exit "$1"
}
trap stop EXIT
trap 'interrupted 130' INT
trap 'interrupted 143' TERM

# The default (twisted) gateway binds 0.0.0.0 whatever GATEWAY_LISTEN says: hypercorn keeps to
# 127.0.0.1. OVERRIDE_IN_DOCKER=0 keeps its files under FILESYSTEM_ROOT instead of system folders.
env GATEWAY_LISTEN="127.0.0.1:$PORT" GATEWAY_SERVER=hypercorn LOCALSTACK_HOST="127.0.0.1:$PORT" \
    DNS_ADDRESS=0 OVERRIDE_IN_DOCKER=0 PERSISTENCE=0 SKIP_SSL_CERT_DOWNLOAD=1 DISABLE_EVENTS=1 \
    LOCALSTACK_TELEMETRY=0 FILESYSTEM_ROOT="$STATE/fs" TMPDIR="$STATE/tmp" \
    "$VENV/bin/python" -m localstack.runtime.main >"$LOG" 2>&1 &
PID=$!

URL="http://127.0.0.1:$PORT"
started=$SECONDS
until "$VENV/bin/python" -c "import urllib.request; urllib.request.urlopen('$URL/_localstack/health', timeout=1)" 2>/dev/null; do
    if ! kill -0 "$PID" 2>/dev/null || [ $((SECONDS - started)) -ge $READY_TIMEOUT_S ]; then
        echo "with_localstack: LocalStack did not start on $URL; its log ($LOG) ends:" >&2
        tail -n 30 "$LOG" >&2
        exit 1
    fi
    sleep 0.2
done
echo "with_localstack: LocalStack $URL ready in $((SECONDS - started)) s (log: $LOG)" >&2

MOELESS_TEST_LOCALSTACK="$URL" "$VENV/bin/python" -c '
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])' "$@" &
COMMAND_PID=$!
rc=0
wait "$COMMAND_PID" || rc=$?
exit "$rc"
