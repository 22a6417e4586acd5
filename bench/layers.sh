#!/usr/bin/env bash
# bench/layers.sh — what each block layer costs: the bench/nbd.sh fio jobs
# through basalt's NBD server against volumes whose stacks differ by one
# layer over plain files, in one run, printing each layer's overhead
# against the bare `file` stack.
#
#   bench/layers.sh                        # SIZE=1G, ROUNDS=2 rounds of RUNTIME=6 s
#   LAYERS="file crypt" RUNTIME=10 bench/layers.sh
#   LAYERS="file checksum" JOBS=read-1M ROUNDS=7 bench/layers.sh   # a subset of the jobs
#
# Needs: go, fio (with the nbd engine), python3 (`make deps`).
#
# Stacks (volume types created for the run; F = {"type":"file"}):
#   file      F                         the baseline
#   stripe    stripe of 4 F             mirror    mirror of 2 F
#   parity    parity 3+1 F              cow       cow -> F
#   checksum  checksum -> F             crypt     crypt -> F
#   throttle  throttle (no limits) -> F
#   stack4    crypt -> checksum -> cow -> stripe of 4 F   (4 layers)
# Targets (issue 4): stripe, mirror, cow, checksum, crypt each cost <= 10 %
# (IOPS and throughput, every job); stack4 <= 25 %.
#
# Every volume is filled first so reads hit data. For each job the stacks
# take turns, round after round, in a rotating order, each after a sync;
# the median round counts (see bench/nbd.sh).
RUNTIME=${RUNTIME:-6}
ROUNDS=${ROUNDS:-2}
SIZE=${SIZE:-1G}
LAYERS=${LAYERS:-file stripe mirror parity cow checksum crypt throttle stack4}
source "$(dirname "$0")/lib.sh"

f() { echo "{\"type\":\"file\",\"params\":{\"path\":\"$1\"}}"; }
fs() { local out="" i; for i in $(seq "$2"); do out+="${out:+,}$(f "$1$i.img")"; done; echo "$out"; }
declare -A stacks=(
  [file]="$(f data.img)"
  [stripe]="{\"type\":\"stripe\",\"children\":[$(fs stripe 4)]}"
  [mirror]="{\"type\":\"mirror\",\"children\":[$(fs leg 2)]}"
  [parity]="{\"type\":\"parity\",\"children\":[$(fs leg 4)]}"
  [cow]="{\"type\":\"cow\",\"children\":[$(f data.img)]}"
  [checksum]="{\"type\":\"checksum\",\"children\":[$(f data.img)]}"
  [crypt]="{\"type\":\"crypt\",\"children\":[$(f data.img)]}"
  [throttle]="{\"type\":\"throttle\",\"children\":[$(f data.img)]}"
  [stack4]="{\"type\":\"crypt\",\"children\":[{\"type\":\"checksum\",\"children\":[{\"type\":\"cow\",\"children\":[{\"type\":\"stripe\",\"children\":[$(fs stripe 4)]}]}]}]}"
)

# job name -> fio rw, block size, queue depth (as bench/nbd.sh)
declare -A spec=([randread-4k]="randread 4k 32" [randwrite-4k]="randwrite 4k 32" [read-1M]="read 1M 8" [write-1M]="write 1M 8")
JOBS=${JOBS:-randread-4k randwrite-4k read-1M write-1M}
for j in $JOBS; do
  [[ -n ${spec[$j]:-} ]] || { echo "unknown job $j (known: ${!spec[*]})" >&2; exit 2; }
done

declare -A uris
for l in $LAYERS; do
  [[ -n ${stacks[$l]:-} ]] || { echo "unknown layer $l (known: ${!stacks[*]})" >&2; exit 2; }
  echo "${stacks[$l]}" >"$work/$l.json"
  "$BIN" type create "bench-$l" --stack "$work/$l.json" >/dev/null
  vol=$(vol_create "bench-$l" "$SIZE" --type "bench-$l")
  uris[$l]=$(vol_attach "$vol")
  fio --name=fill --ioengine=nbd --uri="${uris[$l]}" --rw=write --bs=1M --iodepth=8 \
    --size="$SIZE" --refill_buffers --output=/dev/null
done

results=$work/results
read -ra order <<<"$LAYERS"
for j in $JOBS; do
  set -- ${spec[$j]}
  for round in $(seq "$ROUNDS"); do
    # Each run starts with no dirty pages left by the previous one (write
    # back would be charged to whoever runs next), and the order rotates
    # every round so that no stack always runs first.
    for l in "${order[@]}"; do
      sync
      fio --name="$1-$2" --ioengine=nbd --uri="${uris[$l]}" --rw="$1" --bs="$2" --iodepth="$3" \
        --size="$SIZE" --runtime="$RUNTIME" --time_based --ramp_time=2 --output-format=json \
        --output="$results.$l.$1-$2.$round.json" >/dev/null
    done
    order=("${order[@]:1}" "${order[0]}")
  done
done

python3 - "$results" "$RUNTIME" "$SIZE" "$ROUNDS" "$JOBS" $LAYERS <<'PY'
import json, sys, platform, os, datetime
base, runtime, size, rounds, jobs, *layers = sys.argv[1:]
jobs = jobs.split()
targets = {"stripe": 10, "mirror": 10, "cow": 10, "checksum": 10, "crypt": 10, "stack4": 25}
def one(l, j, r):
    d = json.load(open(f"{base}.{l}.{j}.{r}.json"))["jobs"][0]
    side = d["read"] if d["read"]["io_bytes"] > 0 else d["write"]
    return side["iops"]
def load(l, j):
    runs = sorted(one(l, j, r) for r in range(1, int(rounds) + 1))
    return runs[len(runs) // 2]  # the median round
r = {(l, j): load(l, j) for l in layers for j in jobs}
cpu = next((x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo") if x.startswith("model name")), platform.machine())
print(f"# bench/layers.sh  {datetime.date.today()}  {os.cpu_count()} CPUs ({cpu}), {size} volumes, median of {rounds} interleaved rounds of {runtime}s")
print("IOPS (1M jobs: MB/s = IOPS) and overhead against the file stack (positive = slower)")
print(f"{'stack':<10}" + "".join(f"{j:>22}" for j in jobs) + f"{'worst':>8}{'target':>8}")
ok = True
for l in layers:
    row, worst = f"{l:<10}", None
    for j in jobs:
        iops = r[(l, j)]
        if "file" in layers and l != "file":
            over = 100 * (1 - iops / r[("file", j)])
            worst = over if worst is None else max(worst, over)
            row += f"{iops:>13.0f} {over:>+7.1f}%"
        else:
            row += f"{iops:>13.0f} {'':>8}"
    t = targets.get(l)
    status = ""
    if t is not None and worst is not None:
        met = worst <= t
        ok &= met
        status = f"<={t}% " + ("met" if met else "NOT")
    print(row + (f"{worst:>+7.1f}%" if worst is not None else f"{'':>8}") + f"  {status}")
if "file" in layers:
    print("targets:", "met" if ok else "NOT met")
PY
