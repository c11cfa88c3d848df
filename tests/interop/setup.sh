#!/usr/bin/env bash
# Creates (once) a Python venv with the official A2A Python SDK for the interop test
# (tests/interop/a2a_sdk_client.py, run by tests/integration/a2a_sdk.rs).
# Idempotent: a no-op when the pinned version is already installed.
# Prints the venv's python path as its last line of stdout.
set -euo pipefail

A2A_SDK_VERSION="1.3.0"
VENV="${IDEM_VENV:-$HOME/.cache/idem-a2a-venv}"
PY="$VENV/bin/python"
MARKER="$VENV/.idem-a2a-sdk-$A2A_SDK_VERSION"

if [[ -f "$MARKER" && -x "$PY" ]] && "$PY" -c 'import a2a.client, httpx' 2>/dev/null; then
    echo "$PY"
    exit 0
fi

PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || { echo "setup.sh: $PYTHON not found" >&2; exit 1; }
if [[ ! -x "$PY" ]]; then
    "$PYTHON" -m venv "$VENV" >&2
fi
"$PY" -m pip install --quiet --disable-pip-version-check "a2a-sdk==$A2A_SDK_VERSION" httpx >&2
"$PY" -c 'import a2a.client, httpx' >&2
touch "$MARKER"
echo "$PY"
