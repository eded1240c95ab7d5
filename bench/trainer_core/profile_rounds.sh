#!/usr/bin/env bash
# Where a design's extra time goes, from one designs_bench run: perf samples
# (cpu-clock; the only event these VMs expose) split by the timed round they
# fall in (designs_bench --round-log), averaged per round of each design,
# and listed per symbol as design minus Pre-LN.
#
#   bench/trainer_core/profile_rounds.sh BUILD_DIR ARCH [ROUNDS] [STEPS] [THREADS] [FLAGS...]
#
# FLAGS: more designs_bench flags, e.g. --d 256 --heads 8 for another shape.
#
# Why one run: Pre-LN alone in its own process ran 21-22k tokens/s on the
# Zen 5 of session 36, and 14-20k beside another design; a profile of each
# in a process of its own (the "8 rounds minus 2 rounds" differences of
# sessions 34-35) mixed that process-to-process spread into every symbol.
# Split by rounds of the same process, the per-symbol figures add up to the
# bench's own ratio.
set -euo pipefail
usage="usage: profile_rounds.sh BUILD_DIR ARCH [ROUNDS] [STEPS] [THREADS] [FLAGS...]"
build=${1:?$usage}
arch=${2:?$usage}
rounds=${3:-8}
steps=${4:-8}
threads=${5:-2}
shift $(( $# < 5 ? $# : 5 ))
bench="$build/bench/trainer_core/designs_bench"
[[ -x "$bench" ]] || { echo "profile_rounds.sh: no $bench (build it first)" >&2; exit 2; }
command -v perf > /dev/null || { echo "profile_rounds.sh: perf is not installed (apt-get install linux-perf)" >&2; exit 2; }
here=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=/dev/null
source "$here/scripts/blas_env.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
perf record -q -k CLOCK_MONOTONIC -e cpu-clock -F 4000 -o "$work/perf.data" -- \
  "$bench" --archs "$arch" --threads "$threads" --rounds "$rounds" --steps "$steps" --no-memory \
  "$@" --round-log "$work/rounds.txt" > "$work/bench.txt"
grep -E "^\| (pre_ln|$arch) " "$work/bench.txt"
perf script -i "$work/perf.data" -F time,ip,sym,dso 2> /dev/null > "$work/samples.txt"
python3 - "$arch" "$work/rounds.txt" "$work/samples.txt" << 'PY'
import bisect, collections, re, sys
arch, rounds_file, samples_file = sys.argv[1:4]
rounds = sorted((float(t0), float(t1), name)
                for name, t0, t1 in (line.split() for line in open(rounds_file)))
starts = [r[0] for r in rounds]
per_round = collections.Counter(r[2] for r in rounds)
counts = collections.defaultdict(collections.Counter)
sample = re.compile(r'\s*(\d+\.\d+):\s+\S+\s+(.*)')
for line in open(samples_file):
    m = sample.match(line)
    if not m:
        continue
    t = float(m.group(1))
    i = bisect.bisect_right(starts, t) - 1
    if i < 0 or t > rounds[i][1]:
        continue  # start-up, warm-up, or between rounds
    sym = m.group(2)
    if '[unknown]' in sym or 'perf-' in sym:
        name = '(JIT code: oneDNN GEMMs)'
    else:
        name = re.sub(r'depthbench::|cpu_fused::|avx512::|avx2::|\(anonymous namespace\)::', '', sym)
        name = re.sub(r'\(.*', '', name).strip()[:70]
    counts[rounds[i][2]][name] += 1
base = {k: v / per_round['pre_ln'] for k, v in counts['pre_ln'].items()}
mine = {k: v / per_round[arch] for k, v in counts[arch].items()}
tb, tm = sum(base.values()), sum(mine.values())
print(f'samples per round (4 kHz, all threads): pre_ln {tb:.0f}, {arch} {tm:.0f}; '
      f'pre_ln / {arch} = {tb / tm:.3f}')
print(f'{"delta":>8} {"pre_ln":>8} {arch:>8}  symbol')
keys = sorted(set(base) | set(mine), key=lambda k: -(mine.get(k, 0) - base.get(k, 0)))
for k in keys[:30]:
    print(f'{mine.get(k, 0) - base.get(k, 0):8.1f} {base.get(k, 0):8.1f} {mine.get(k, 0):8.1f}  {k}')
PY
