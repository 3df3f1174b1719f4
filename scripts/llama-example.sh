#!/usr/bin/env bash
# llama.cpp on kvtier, from a fresh Debian 12 machine: install dependencies (llama.cpp's prebuilt
# libraries included), build, generate a llama model with random weights (no weights can be
# downloaded: integrations/llama/make_gguf.py, ~25 M parameters), start kvtierd, and run two
# separate llama.cpp processes on one document: the first evaluates it and stores its KV in
# kvtier; the second, asking another question about it, restores the document from kvtier and
# evaluates only its question, then checks its logits against a recompute. Everything it made
# (daemon, model, data directory) is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SKIP_DEPS:-0}" = 1 ] || bash scripts/install-deps.sh
bash scripts/build.sh

work=$(mktemp -d)
daemon=
stop() {
  if [ -n "$daemon" ]; then kill -TERM "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap stop EXIT
/usr/bin/python3 integrations/llama/make_gguf.py --preset medium --seed 1 --out "$work/model.gguf"
build/daemon/kvtierd --data-dir "$work/data" --socket "$work/kvtierd.sock" --cold-tier off \
  >"$work/kvtierd.log" 2>&1 &
daemon=$!
for _ in $(seq 1 200); do
  grep -q "kvtierd ready" "$work/kvtierd.log" && break
  kill -0 "$daemon" 2>/dev/null || { cat "$work/kvtierd.log"; echo "kvtierd failed to start"; exit 1; }
  sleep 0.05
done

example=(build/examples/llama/kvtier-llama-example --model "$work/model.gguf"
         --socket "$work/kvtierd.sock" --document docs/llama.md --max-bytes 3000 --threads 2)
echo "--- process 1: the document"
"${example[@]}"
echo "--- process 2: the document and a question about it"
"${example[@]}" --question "Which tokens does a restore bring back?"
