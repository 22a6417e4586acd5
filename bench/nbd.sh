#!/usr/bin/env bash
# bench/nbd.sh — basalt's NBD server against nbdkit (file plugin) and
# qemu-nbd, serving the same 1 GiB file, with the same fio jobs, in one run.
#
#   bench/nbd.sh                 # ROUNDS=3 rounds of RUNTIME=8 seconds per job and server
#   RUNTIME=15 ROUNDS=5 SIZE=2G bench/nbd.sh
#   JOBS="randread-4k write-1M" bench/nbd.sh   # a subset of the four jobs
#
# Needs: go, fio (with the nbd engine), nbdkit, qemu-nbd, python3
# (`make deps` installs them). Prints IOPS and MB/s per server and job, and
# the ratios basalt/nbdkit and basalt/qemu-nbd, then each server's CPU time
# per request: on a host where fio and the server share the CPUs, a server
# that needs less CPU per request leaves fio more, and this column says so
# even when run-to-run noise hides it in the IOPS.
#
# All three servers serve the file at once but only one is driven at a
# time; for each job the servers take turns, round after round, in an
# order that rotates, and the median round counts. Interleaving keeps a machine whose speed drifts
# (shared hosts do) from favouring whichever server happens to run first.
RUNTIME=${RUNTIME:-8}
ROUNDS=${ROUNDS:-3}
SIZE=${SIZE:-1G}
source "$(dirname "$0")/lib.sh"

# --- basalt: a volume and an attachment -------------------------------------
vol=$(vol_create bench "$SIZE")
uri=$(vol_attach "$vol")
# The standard type is cow -> file: the file layer's path is in the stack.
file=$(vol_file "$vol")
# Fill the file so reads hit data, not holes (the same file serves all three).
fio --name=fill --filename="$file" --rw=write --bs=1M --size="$SIZE" --ioengine=psync \
  --end_fsync=1 --refill_buffers --output=/dev/null

# nbdkit and qemu-nbd daemonise once they listen, writing a pid file.
kport=$(freeport)
nbdkit -P "$work/nbdkit.pid" -p "$kport" -i 127.0.0.1 file "$file"
pids+=("$(cat "$work/nbdkit.pid")")
qport=$(freeport)
qemu-nbd --fork --pid-file "$work/qemu-nbd.pid" -f raw -t -b 127.0.0.1 -p "$qport" -x bench "$file"
pids+=("$(cat "$work/qemu-nbd.pid")")
declare -A spid=([basalt]=${pids[0]} [nbdkit]=$(cat "$work/nbdkit.pid") [qemu-nbd]=$(cat "$work/qemu-nbd.pid"))
declare -A uris=([basalt]=$uri [nbdkit]=nbd://127.0.0.1:$kport [qemu-nbd]=nbd://127.0.0.1:$qport/bench)

# job name -> fio rw, block size, queue depth
declare -A spec=([randread-4k]="randread 4k 32" [randwrite-4k]="randwrite 4k 32" [read-1M]="read 1M 8" [write-1M]="write 1M 8")
JOBS=${JOBS:-randread-4k randwrite-4k read-1M write-1M}
results=$work/results
for j in $JOBS; do
  [[ -n ${spec[$j]:-} ]] || { echo "unknown job $j (known: ${!spec[*]})" >&2; exit 2; }
  set -- ${spec[$j]}
  for round in $(seq "$ROUNDS"); do
    # The order rotates every round: no server always runs first.
    order=(basalt nbdkit qemu-nbd)
    order=("${order[@]:round%3}" "${order[@]:0:round%3}")
    for name in "${order[@]}"; do
      t0=$(cputicks "${spid[$name]}")
      fio --name="$1-$2" --ioengine=nbd --uri="${uris[$name]}" --rw="$1" --bs="$2" --iodepth="$3" \
        --size="$SIZE" --runtime="$RUNTIME" --time_based --ramp_time=2 --output-format=json \
        --output="$results.$name.$1-$2.$round.json" >/dev/null
      echo $(($(cputicks "${spid[$name]}") - t0)) >"$results.$name.$1-$2.$round.cpu"
    done
  done
done

python3 - "$results" "$RUNTIME" "$SIZE" "$ROUNDS" "$JOBS" <<'PY'
import json, sys, platform, os, datetime
base, runtime, size, rounds = sys.argv[1:5]
jobs = sys.argv[5].split()
servers = ["basalt", "nbdkit", "qemu-nbd"]
tick = os.sysconf("SC_CLK_TCK")
def one(s, j, r):
    d = json.load(open(f"{base}.{s}.{j}.{r}.json"))["jobs"][0]
    side = d["read"] if d["read"]["io_bytes"] > 0 else d["write"]
    # The CPU was counted over the whole fio run, ramp included, at about
    # the rate fio measured after the ramp.
    ops = side["iops"] * (int(runtime) + 2)
    cpu_us = int(open(f"{base}.{s}.{j}.{r}.cpu").read()) / tick * 1e6 / max(ops, 1)
    return side["iops"], side["bw_bytes"] / 1e6, cpu_us
def load(s, j):
    runs = sorted(one(s, j, r) for r in range(1, int(rounds) + 1))
    return runs[len(runs) // 2]  # the median round
r = {(s, j): load(s, j) for s in servers for j in jobs}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
print(f"# bench/nbd.sh  {datetime.date.today()}  {os.cpu_count()} CPUs ({cpu}), {size} file, median of {rounds} interleaved rounds of {runtime}s")
print(f"{'job':<14}" + "".join(f"{s+' IOPS':>16}{s+' MB/s':>14}" for s in servers) + f"{'b/nbdkit':>10}{'b/qemu':>9}")
ok = True
for j in jobs:
    row = f"{j:<14}"
    for s in servers:
        iops, mbs, _ = r[(s, j)]
        row += f"{iops:>16.0f}{mbs:>14.1f}"
    k = r[("basalt", j)][0] / r[("nbdkit", j)][0]
    q = r[("basalt", j)][0] / r[("qemu-nbd", j)][0]
    ok &= k >= 1.0
    print(row + f"{k:>10.2f}{q:>9.2f}")
print("target basalt/nbdkit >= 1.0 on all jobs:", "met" if ok else "NOT met")
print(f"\nserver CPU per request, us (median round){'':<6}" + "".join(f"{s:>12}" for s in servers) + f"{'b/nbdkit':>10}")
for j in jobs:
    c = [r[(s, j)][2] for s in servers]
    print(f"{j:<46}" + "".join(f"{x:>12.1f}" for x in c) + f"{c[0] / c[1]:>10.2f}")
PY
