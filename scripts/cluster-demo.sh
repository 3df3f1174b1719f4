#!/usr/bin/env bash
# The cluster demo as local processes — docker-compose.yml's topology on one machine: a real etcd
# on free loopback ports, three kvtierd joined through it (each with its own temporary data dir, a
# peer listener on a loopback port and a generated cluster token), then three separate processes,
# one per node:
#   A on node1  kvtier cluster-demo-prefill        puts a prompt's KV and snapshots it: node1:ID
#   B on node2  kvtier cluster-demo-decode node1:ID restores it from node1, checks every byte
#                                                   against what A computed, decodes on
#   C on node3  kvtier cluster-demo-lookup         a prompt sharing A's prefix: a remote hit
# Everything it started (daemons, etcd, temporary dirs, shared-memory segments) is cleaned up on
# exit, Ctrl-C or SIGTERM. Exits non-zero if any step fails (77: no etcd binary, nothing ran).
#
# Environment: SKIP_DEPS=1 (do not run install-deps.sh), SKIP_BUILD=1 (use the binaries as they
# are), KVTIER_BUILD_DIR (default build), ETCD (default: etcd on PATH), SEED (default: random).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KVTIER_BUILD_DIR:-build}
kvtierd=$build/daemon/kvtierd
kvtier=$build/tools/kvtier

[ "${SKIP_DEPS:-0}" = 1 ] || bash scripts/install-deps.sh
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" -j "${KVTIER_JOBS:-2}" --target kvtierd kvtier
fi
for b in "$kvtierd" "$kvtier"; do
  [ -x "$b" ] || { echo "cluster-demo: $b is missing (build it, or unset SKIP_BUILD)" >&2; exit 1; }
done
etcd=${ETCD:-$(command -v etcd || true)}
if [ -z "$etcd" ] || [ ! -x "$etcd" ]; then
  echo "cluster-demo: no etcd binary (Debian: apt-get install etcd-server; scripts/install-deps.sh)" >&2
  exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-cluster-demo-XXXXXX")
pids=() segments=() etcd_pid=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  # The daemons first (a graceful stop revokes the node's etcd lease), then etcd; each group gets
  # SIGTERM and, after 5 s, SIGKILL.
  stop() {
    for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "$@"; do
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    done
  }
  stop "${pids[@]}"
  stop $etcd_pid
  # A daemon stopped cleanly unlinks its segments; one that was killed leaves them behind.
  for prefix in "${segments[@]}"; do rm -f /dev/shm/"$prefix"*; done
  if [ "$rc" -ne 0 ] && [ -d "$tmp" ]; then
    for log in "$tmp"/*.log; do
      [ -s "$log" ] && { echo "--- last lines of $(basename "$log")"; tail -n 15 "$log"; }
    done >&2
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() { echo "cluster-demo: $*" >&2; exit 1; }

# etcd on two free loopback ports (chosen at random, retried if taken meanwhile).
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
etcd_healthy() {
  timeout 1 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" &&
    printf "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" >&3 &&
    grep -q "\"health\":\"true\"" <&3' _ "$1" 2>/dev/null
}
for attempt in 1 2 3 4 5; do
  client_port=$((20000 + RANDOM % 30000)) peer_port=$((20000 + RANDOM % 30000))
  [ "$client_port" != "$peer_port" ] && port_free "$client_port" && port_free "$peer_port" || continue
  client_url=http://127.0.0.1:$client_port peer_url=http://127.0.0.1:$peer_port
  "$etcd" --name demo --data-dir "$tmp/etcd" --listen-client-urls "$client_url" \
    --advertise-client-urls "$client_url" --listen-peer-urls "$peer_url" \
    --initial-advertise-peer-urls "$peer_url" --initial-cluster "demo=$peer_url" \
    --initial-cluster-state new >"$tmp/etcd.log" 2>&1 &
  etcd_pid=$!
  for _ in $(seq 1 150); do
    etcd_healthy "$client_port" && break
    kill -0 "$etcd_pid" 2>/dev/null || break
    sleep 0.1
  done
  etcd_healthy "$client_port" && break
  kill -KILL "$etcd_pid" 2>/dev/null || true
  wait "$etcd_pid" 2>/dev/null || true
  etcd_pid="" && rm -rf "$tmp/etcd"
done
[ -n "$etcd_pid" ] || fail "etcd did not start (its log follows)"
echo "etcd $("$etcd" --version | sed -n 's/^etcd Version: //p') serving on $client_url (pid $etcd_pid)"

# The cluster token: random, at least 32 bytes, readable by its owner only.
(umask 077 && head -c 48 /dev/urandom | base64 -w0 >"$tmp/cluster-token")

# Three daemons registered in etcd as cluster "demo"; each listens for peers on a loopback port
# the kernel picks. Cold tier on (a snapshot is written to disk too), nothing flushed on exit:
# their data dirs are thrown away.
sockets=()
for n in 1 2 3; do
  "$kvtierd" --data-dir "$tmp/node$n" --host-pool-bytes 256M --gpus none --huge-pages off \
    --flush-on-exit off --disk-bytes 1G \
    --listen 127.0.0.1:0 --cluster-token-file "$tmp/cluster-token" \
    --etcd "$client_url" --cluster demo --node-id "node$n" >"$tmp/node$n.log" 2>&1 &
  pids+=($!)
done
for n in 1 2 3; do
  log=$tmp/node$n.log
  for _ in $(seq 1 300); do
    grep -q "kvtierd ready" "$log" && break
    kill -0 "${pids[$((n - 1))]}" 2>/dev/null || fail "kvtierd node$n exited during startup"
    sleep 0.05
  done
  ready=$(grep -m1 "kvtierd ready" "$log") || fail "kvtierd node$n not ready within 15 s"
  echo "node$n: $ready"
  sockets+=("$(sed 's/.* socket=\([^ ]*\).*/\1/' <<<"$ready")")
  segments+=("$(sed 's/.* segments=\([^ ]*\).*/\1/' <<<"$ready")")
done

# Every node sees three members up (each one's etcd watch has seen the others join).
members_up() { "$kvtier" --socket "$1" stats | grep -o '"members_up": [0-9]*' | grep -o '[0-9]*$'; }
for _ in $(seq 1 200); do
  formed=1
  for s in "${sockets[@]}"; do [ "$(members_up "$s")" = 3 ] || formed=0; done
  [ "$formed" = 1 ] && break
  sleep 0.05
done
[ "$formed" = 1 ] || fail "the three nodes did not all see 3 members up within 10 s"
echo "cluster 'demo' formed through etcd; node2 sees:"
"$kvtier" --socket "${sockets[1]}" cluster

seed=${SEED:-$(( (RANDOM << 15 | RANDOM) + 1 ))}
echo "kvtier cluster demo (seed $seed): three processes, one per node"
out=$("$kvtier" --socket "${sockets[0]}" cluster-demo-prefill "$seed") || { echo "$out"; fail "step A (prefill on node1) failed"; }
echo "$out"
snapshot=$(sed -n 's/.* snapshot \([^ ]*:[0-9][0-9]*\) .*/\1/p' <<<"$out")
[ -n "$snapshot" ] || fail "step A printed no snapshot NODE:ID"
"$kvtier" --socket "${sockets[1]}" cluster-demo-decode "$snapshot" "$seed" || fail "step B (restore on node2) failed"
"$kvtier" --socket "${sockets[2]}" cluster-demo-lookup "$seed" || fail "step C (lookup on node3) failed"
cluster_stats() { "$kvtier" --socket "$1" stats | sed 's/.*"cluster": \({.*}\), "spaces".*/\1/'; }
served=""
for n in 1 2 3; do
  blocks=$(cluster_stats "${sockets[$((n - 1))]}" | grep -o '"served_blocks": [0-9]*' | grep -o '[0-9]*$')
  served+="${served:+, }node$n $blocks"
done
echo "blocks served to peers: $served"
echo "node3 stats, cluster: $(cluster_stats "${sockets[2]}")"
echo "cluster demo passed"
