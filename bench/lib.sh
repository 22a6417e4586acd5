# bench/lib.sh — shared by the bench scripts (source it; do not run it).
#
# Starts one basalt node in a temp dir, exports BASALT_ENDPOINT and
# BASALT_IDENTITY for the CLI, and cleans everything up on exit.
#
#   BIN     the basalt binary          work   the temp dir
#   pids    processes killed on exit   freeport, cputicks, idleticks, vol_create, vol_attach, vol_file

set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
make -s build
BIN=$PWD/bin/basalt
work=$(mktemp -d /tmp/basalt-bench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# cputicks PID: user + system clock ticks the process has used (threads included).
cputicks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# idleticks: idle + iowait clock ticks of all CPUs since boot.
idleticks() { awk '/^cpu /{print $5 + $6; exit}' /proc/stat; }
jsonfield() { python3 -c "import json,sys; print(json.load(sys.stdin)[\"$1\"])"; }

api=$(freeport) nbd=$(freeport) s3=$(freeport) ec=$(freeport) ep=$(freeport) eh=$(freeport)
"$BIN" server --data "$work/basalt" --api 127.0.0.1:$api --nbd 127.0.0.1:$nbd --s3 127.0.0.1:$s3 \
  --etcd-client 127.0.0.1:$ec --etcd-peer 127.0.0.1:$ep --etcd-http 127.0.0.1:$eh --log-level warn >"$work/basalt.log" 2>&1 &
pids+=($!)
export BASALT_ENDPOINT=https://127.0.0.1:$api BASALT_IDENTITY=$work/basalt/identities/admin
for _ in $(seq 100); do "$BIN" status >/dev/null 2>&1 && break; sleep 0.2; done

# vol_create NAME SIZE [ARGS...] prints the new volume's id.
vol_create() { "$BIN" -o json volume create --name "$1" --size "$2" "${@:3}" | jsonfield id; }
# vol_attach VOL prints the nbd_uri of a new rw attachment.
vol_attach() { "$BIN" -o json attach "$1" --host bench | jsonfield nbd_uri; }
# vol_file VOL prints the path of the first file layer in the volume's stack.
vol_file() {
  "$BIN" -o json volume show "$1" | python3 -c '
import json, sys
def leaf(n):
    return n.get("path") or next(p for c in n.get("children", []) for p in [leaf(c)] if p)
print(leaf(json.load(sys.stdin)["stack"]))'
}

# --- more nodes (bench/meta.sh) ----------------------------------------------
# node_start NAME ARGS... starts one more server named NAME on free loopback
# ports, data in $work/NAME, log in $work/NAME.log, ARGS appended (e.g.
# --store DIR, --join URL --identity DIR). node_api, node_etcd (its member's
# gRPC), node_etcd_http (its /metrics) and node_pid say where it is;
# node_wait waits until it answers, node_stop stops it.
declare -A node_api=() node_etcd=() node_etcd_http=() node_pid=()
node_start() {
  local name=$1 a e h
  a=$(freeport) e=$(freeport) h=$(freeport)
  "$BIN" server --name "$name" --data "$work/$name" --api 127.0.0.1:$a --etcd-client 127.0.0.1:$e \
    --etcd-http 127.0.0.1:$h --etcd-peer 127.0.0.1:$(freeport) --s3 127.0.0.1:$(freeport) \
    --nbd 127.0.0.1:$(freeport) --log-level warn "${@:2}" >"$work/$name.log" 2>&1 &
  pids+=($!)
  node_pid[$name]=$! node_api[$name]=https://127.0.0.1:$a node_etcd[$name]=https://127.0.0.1:$e
  node_etcd_http[$name]=https://127.0.0.1:$h
}
# node_wait NAME IDENTITY waits (60 s at most) until NAME answers status.
node_wait() {
  for _ in $(seq 300); do
    "$BIN" --endpoint "${node_api[$1]}" --identity "$2" status >/dev/null 2>&1 && return 0
    kill -0 "${node_pid[$1]}" 2>/dev/null || break
    sleep 0.2
  done
  echo "node $1 did not start; the end of its log:" >&2
  tail -20 "$work/$1.log" >&2
  return 1
}
# node_stop PID stops a server and waits for it to exit.
node_stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
# voters_wait N IDENTITY ENDPOINT waits (90 s at most) until `node list`
# through ENDPOINT shows N nodes, all healthy voters.
voters_wait() {
  for _ in $(seq 300); do
    "$BIN" --endpoint "$3" --identity "$2" -o json node list 2>/dev/null | python3 -c '
import json, sys
ns = json.load(sys.stdin)
sys.exit(0 if len(ns) == int(sys.argv[1]) and all(n["role"] == "voter" and n["health"] == "healthy" for n in ns) else 1)' "$1" \
      2>/dev/null && return 0
    sleep 0.3
  done
  echo "the cluster did not reach $1 healthy voters" >&2
  return 1
}
