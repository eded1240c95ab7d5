#!/usr/bin/env bash
# Checks that the AVX2 or AVX-512 build of the fused CPU kernels
# (cuda_ops/cpu_fused_isa.h) keeps its AVX code to its own namespace: every
# function in the given objects that holds a VEX- or EVEX-encoded
# (AVX/AVX2/FMA/AVX-512) instruction must be one of
# depthbench::cpu_fused::ISA's. An inline or template function shared with
# the rest of the program compiled for the wider ISA could be the copy the
# linker keeps, and would then fault on a CPU without it.
#   cpu_fused_isa_check.sh ISA OBJECT...     (ISA: avx2 or avx512)
set -euo pipefail
[[ $# -gt 1 ]] || { echo "usage: $0 ISA OBJECT..." >&2; exit 2; }
isa=$1
shift
command -v objdump >/dev/null || { echo "objdump (binutils) not found" >&2; exit 2; }
# CTest passes a generator-expression list as one ';'-separated argument.
objects=()
for a in "$@"; do IFS=';' read -ra parts <<<"$a"; objects+=("${parts[@]}"); done
bad=0 total=0
for o in "${objects[@]}"; do
  # Function headers are "ADDR <name>:"; instructions "  ADDR:\tMNEMONIC ...".
  report=$(objdump -d --no-show-raw-insn -C "$o" | awk '
    /^[0-9a-f]+ <.*>:$/ { name = $0; next }
    /^ *[0-9a-f]+:\t/ { split($0, f, "\t"); split(f[2], m, " ");
                        if (m[1] ~ /^v/) print name }' | sort -u)
  [[ -z "$report" ]] && continue
  total=$((total + $(wc -l <<<"$report")))
  outside=$(grep -v "depthbench::cpu_fused::$isa::" <<<"$report" || true)
  if [[ -n "$outside" ]]; then
    echo "AVX code outside depthbench::cpu_fused::$isa in $o:" >&2
    echo "$outside" >&2
    bad=1
  fi
done
# The AVX-512 build must use the 512-bit registers somewhere (the VF loops).
# (grep -c reads all of objdump's output: -q would stop early and, under
# pipefail, fail the pipeline on objdump's SIGPIPE.)
if [[ $isa == avx512 ]] &&
   [[ $(objdump -d --no-show-raw-insn "${objects[@]}" | grep -c zmm || true) -eq 0 ]]; then
  echo "no zmm register in ${objects[*]}: the avx512 build did not take effect" >&2
  exit 1
fi
if [[ $total -eq 0 ]]; then
  echo "no AVX code at all in ${objects[*]}: the $isa build did not take effect" >&2
  exit 1
fi
echo "$total functions with AVX code, all in depthbench::cpu_fused::$isa"
exit $bad
