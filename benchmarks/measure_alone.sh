#!/usr/bin/env bash
# The performance bars, each compared side by side in one launch, in order, on a machine
# with nothing else running (no tests, no other benchmark): the load average is printed
# before and after each, and a figure taken under load is not a result. About 25 minutes
# on 2 cores; the peer benchmark (last) is a third of it.
#
#   bash benchmarks/measure_alone.sh [OUT]      (from the repository root; OUT: ./measured)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-measured}
mkdir -p "$out"
export OMP_NUM_THREADS=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

step() {  # step NAME COMMAND...: the load average around one comparison, and its output
    local name=$1
    shift
    echo "== $name: $*"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    "$@" 2>&1 | tee "$out/$name.txt"
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
}

# step overhead vs hand-written DDP at 2 ranks: the median of 3 launches (~2 min)
for i in 1 2 3; do
    step "overhead-$i" python benchmarks/overhead.py --sections overhead --procs 2 \
        --budget 10 --no-plots --no-optional --out "$out/overhead-$i"
done
# count= vs plain run.backward, W1 and W2 at 2 ranks (~3 min)
for w in W1 W2; do
    step "count-$w" python benchmarks/count_bench.py --workload "$w" --procs 2 --rounds 150
done
# armed for preemption vs unarmed, W1 and W2 at 2 ranks, the two loops only, then the same
# with the "armed" loop not armed (A/A: the method's own spread) (~6 min)
step armed python benchmarks/preempt_overhead.py --pair --workloads W1,W2 --rounds 200 \
    --block 50
step armed-aa python benchmarks/preempt_overhead.py --pair --calibrate --workloads W1,W2 \
    --rounds 200 --block 50
# the realistic loop, count= and armed, vs hand-written DDP at 2 ranks (~1 min)
step realistic python benchmarks/preempt_overhead.py --realistic --workloads W1,W2 \
    --rounds 60 --block 50
# run.resume + first step vs torch.load (plain, mmap) and dcp.load, warm and cold, 1 and 2
# ranks, checksums verified (~6 min)
mkdir -p "$out/resume-files"
step resume python benchmarks/resume_bench.py --gb 0.6 --rounds 5 --procs 1,2 \
    --cache cold,warm --load quiet --dir "$out/resume-files"
# the peers (Accelerate, Fabric, ignite, hand-written DDP) at 1 and 2 ranks, 3 rounds
# (~8-9 min): PEERS_BENCH names the peer benchmark's folder, BENCH_VENV a virtual
# environment with those toolkits (default: this python's)
if [ -n "${PEERS_BENCH:-}" ]; then
    venv=${BENCH_VENV:-$(dirname "$(dirname "$(command -v python)")")}
    step peers "$venv/bin/python" "$PEERS_BENCH/run.py" --rounds 3
else
    echo "== peers: skipped (set PEERS_BENCH to the peer benchmark's folder)"
fi
