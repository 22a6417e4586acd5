#!/usr/bin/env bash
# bench/s3.sh — basalt's S3 gateway against versitygw v1.8.0 (posix backend),
# both over a directory of the same file system, driven by the same load
# generator (bench/s3load, aws-sdk-go-v2), in one run.
#
#   bench/s3.sh                           # ROUNDS=3 rounds of RUNTIME=8 s per job and server
#   ROUNDS=1 RUNTIME=3 bench/s3.sh        # a quick check that it works
#
# Needs: go, python3, curl (`make deps`). versitygw is built from the module
# cache (it is a `tool` in go.mod) into bin/versitygw, s3load into bin/s3load.
#
# Jobs (issue 5) and targets, as basalt/versitygw ops/s:
#   GET 1 MiB objects, concurrency 8     >= 1.1
#   PUT 1 MiB objects, concurrency 8     >= 1.3
#   GET 4 KiB objects, concurrency 16    >= 1.1
#
# NOT the same guarantee: versitygw's posix backend never fsyncs (decision
# 0007, research §3): its PUT is acknowledged with the data in the page
# cache. basalt's PUT is durable when acknowledged (data, xattr metadata and
# the directory fsynced before the answer; docs/objects.md). The PUT ratio
# therefore compares durable writes with non-durable ones.
#
# Both servers run at once but only one is driven at a time; for each job
# they take turns, round after round, in a rotating order, each run after a
# sync (no dirty pages charged to the next run); the median round counts
# (see bench/nbd.sh). versitygw runs with --keep-alive (without it, GETs
# pay a new connection per request: decision 0007 §6). Client and servers
# share the machine's CPUs; the client signs every request (SigV4, payload
# hash), as the SDK does by default on plain HTTP.
RUNTIME=${RUNTIME:-8}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-1s}
source "$(dirname "$0")/lib.sh"

go build -o bin/versitygw github.com/versity/versitygw/cmd/versitygw
go build -o bin/s3load ./bench/s3load

# --- basalt: lib.sh started it with --s3 on a free port; a user's s3.env ---
"$BIN" user create bench --out "$work/bench-id" >/dev/null
basalt_ep=$(sed -n 's/^AWS_ENDPOINT_URL=//p' "$work/bench-id/s3.env")
basalt_ak=$(sed -n 's/^AWS_ACCESS_KEY_ID=//p' "$work/bench-id/s3.env")
basalt_sk=$(sed -n 's/^AWS_SECRET_ACCESS_KEY=//p' "$work/bench-id/s3.env")

# --- versitygw: posix backend beside basalt's store, same file system -------
mkdir -p "$work/versitygw"
vport=$(freeport)
ROOT_ACCESS_KEY=benchak ROOT_SECRET_KEY=benchsk bin/versitygw --port 127.0.0.1:$vport --region us-east-1 \
  --keep-alive --quiet posix "$work/versitygw" >"$work/versitygw.log" 2>&1 &
pids+=($!)
declare -A spid=([basalt]=${pids[0]} [versitygw]=$!)
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$vport/" && break; sleep 0.1; done
[[ $(stat -f -c %i "$work/versitygw") == $(stat -f -c %i "$work/basalt/store") ]] ||
  echo "warning: the two stores are on different file systems" >&2

declare -A args=(
  [basalt]="-endpoint $basalt_ep -access $basalt_ak -secret $basalt_sk"
  [versitygw]="-endpoint http://127.0.0.1:$vport -access benchak -secret benchsk"
)
load() { bin/s3load ${args[$1]} -label "$1" "${@:2}"; }

# The GET sets: 64 objects of 1 MiB, 256 of 4 KiB, on each server.
for s in basalt versitygw; do
  load "$s" -mode prep -size 1MiB -objects 64 -c 8 >/dev/null
  load "$s" -mode prep -size 4KiB -objects 256 -c 16 >/dev/null
done

jobs=("get 1MiB 8 64" "put 1MiB 8 64" "get 4KiB 16 256")
results=$work/results
order=(basalt versitygw)
for j in "${jobs[@]}"; do
  set -- $j
  for round in $(seq "$ROUNDS"); do
    for s in "${order[@]}"; do
      sync
      t0=$(cputicks "${spid[$s]}") i0=$(idleticks)
      load "$s" -mode "$1" -size "$2" -c "$3" -objects "$4" -duration "${RUNTIME}s" -warmup "$WARMUP" \
        >"$results.$s.$1-$2.$round.json"
      echo $(($(cputicks "${spid[$s]}") - t0)) $(($(idleticks) - i0)) >"$results.$s.$1-$2.$round.cpu"
    done
    order=("${order[@]:1}" "${order[0]}")
  done
done

python3 - "$results" "$RUNTIME" "$ROUNDS" "$WARMUP" <<'PY'
import json, sys, platform, os, datetime, re
base, runtime, rounds = sys.argv[1:4]
m = re.fullmatch(r"([0-9.]+)(ms|s)", sys.argv[4])
warmup = float(m[1]) / (1000 if m[2] == "ms" else 1) if m else 0
jobs = [("get-1MiB", "GET 1 MiB c8", 1.1), ("put-1MiB", "PUT 1 MiB c8", 1.3), ("get-4KiB", "GET 4 KiB c16", 1.1)]
servers = ["basalt", "versitygw"]
tick = os.sysconf("SC_CLK_TCK")
def one(s, j, r):
    d = json.load(open(f"{base}.{s}.{j}.{r}.json"))
    # The server's CPU was counted over the whole load run, warm-up
    # included, at about the rate measured after it.
    ops = d["ops_per_s"] * (float(runtime) + warmup)
    cpu, idle = map(int, open(f"{base}.{s}.{j}.{r}.cpu").read().split())
    d["cpu_us"] = cpu / tick * 1e6 / max(ops, 1)
    # Idle + iowait share of all CPUs over the run: how far from
    # CPU-bound the machine was.
    d["idle"] = idle / tick / ((float(runtime) + warmup) * os.cpu_count())
    return d
def load(s, j):
    runs = sorted((one(s, j, r) for r in range(1, int(rounds) + 1)), key=lambda d: d["ops_per_s"])
    return runs[len(runs) // 2]  # the median round
r = {(s, j): load(s, j) for s in servers for j, _, _ in jobs}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
print(f"# bench/s3.sh  {datetime.date.today()}  {os.cpu_count()} CPUs ({cpu}), median of {rounds} interleaved rounds of {runtime}s")
print("# versitygw v1.8.0 posix (no fsync) vs basalt (durable PUT); load: bench/s3load (aws-sdk-go-v2)")
print(f"{'job':<15}" + "".join(f"{s+' ops/s':>17}{'MB/s':>9}{'p50 ms':>8}{'p99 ms':>8}" for s in servers)
      + f"{'b/vgw':>8}{'target':>8}  ")
ok = True
for j, name, target in jobs:
    row = f"{name:<15}"
    for s in servers:
        d = r[(s, j)]
        row += f"{d['ops_per_s']:>17.0f}{d['mb_per_s']:>9.1f}{d['p50_ms']:>8.2f}{d['p99_ms']:>8.2f}"
    ratio = r[("basalt", j)]["ops_per_s"] / r[("versitygw", j)]["ops_per_s"]
    met = ratio >= target
    ok &= met
    print(row + f"{ratio:>8.2f}{'>=' + str(target):>8}  " + ("met" if met else "NOT met"))
print("targets (GET >= 1.1, PUT >= 1.3, small GET >= 1.1 x versitygw):", "all met" if ok else "NOT all met")
print(f"\nCPU per request, us (median round){'':<11}" + "".join(f"{s:>12}" for s in servers) + f"{'b/vgw':>8}"
      + "".join(f"{'client ' + s[:6]:>15}" for s in servers) + "".join(f"{'idle ' + s[:6]:>13}" for s in servers))
for j, name, _ in jobs:
    c = [r[(s, j)]["cpu_us"] for s in servers]
    print(f"{name:<44}" + "".join(f"{x:>12.1f}" for x in c) + f"{c[0] / c[1]:>8.2f}"
          + "".join(f"{r[(s, j)].get('client_cpu_us', 0):>15.1f}" for s in servers)
          + "".join(f"{r[(s, j)]['idle']:>12.0%} " for s in servers))
print("(server and client: CPU time per request; idle: idle + iowait share of all CPUs over the run)")
PY
