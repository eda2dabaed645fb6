#!/usr/bin/env bash
# Install real llama.cpp for gptlab's GGUF tests: the npm package node-llama-cpp (pinned) with its
# prebuilt linux-x64 CPU binaries, into .cache/llama-cpp/ (git-ignored), beside the Node script that
# tests/interop/test_export_gguf_llama_cpp.py drives. Idempotent: an installed, matching copy is left as is.
# Only the CPU package is installed (--omit=optional drops the ~650 MB of CUDA/Vulkan builds).
set -euo pipefail
VERSION=3.21.1
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${GPTLAB_LLAMA_CPP_DIR:-$ROOT/.cache/llama-cpp}"
command -v npm >/dev/null || { echo "install_llama_cpp: npm (Node >= 20) is needed" >&2; exit 1; }
mkdir -p "$DEST"
cp "$ROOT"/tools/llama_cpp/*.mjs "$DEST/"
installed="$(node -p "require('$DEST/node_modules/node-llama-cpp/package.json').version" 2>/dev/null || true)"
if [ "$installed" = "$VERSION" ] && [ -d "$DEST/node_modules/@node-llama-cpp/linux-x64" ]; then
    echo "node-llama-cpp $VERSION already in $DEST"
    exit 0
fi
cd "$DEST"
[ -f package.json ] || echo '{"name": "gptlab-llama-cpp", "private": true, "type": "module"}' > package.json
NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --no-audit --no-fund --ignore-scripts --omit=optional -E \
    "node-llama-cpp@$VERSION" "@node-llama-cpp/linux-x64@$VERSION"
echo "node-llama-cpp $VERSION installed in $DEST"
