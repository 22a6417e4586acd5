# bench/lib.sh — shared by the bench scripts (source it; do not run it).
#
# Starts one basalt node in a temp dir, exports BASALT_ENDPOINT and
# BASALT_IDENTITY for the CLI, and cleans everything up on exit.
#
#   BIN     the basalt binary          work   the temp dir
#   pids    processes killed on exit   freeport, vol_create, vol_attach, vol_file

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
jsonfield() { python3 -c "import json,sys; print(json.load(sys.stdin)[\"$1\"])"; }

api=$(freeport) nbd=$(freeport) s3=$(freeport) ec=$(freeport) ep=$(freeport)
"$BIN" server --data "$work/basalt" --api 127.0.0.1:$api --nbd 127.0.0.1:$nbd --s3 127.0.0.1:$s3 \
  --etcd-client 127.0.0.1:$ec --etcd-peer 127.0.0.1:$ep --log-level warn >"$work/basalt.log" 2>&1 &
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
