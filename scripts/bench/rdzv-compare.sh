#!/usr/bin/env bash
# Side by side, in one run: gpujob's Consul rendezvous and torch's c10d
# dynamic rendezvous (Debian's python3-torch), with M separate member
# processes each, timed from a common start barrier to the last member's
# return. Prints one row per M with the ratio.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
ms=(8 32 64) # the M that BenchmarkRoundProcesses runs

cd "$repo"
ours=$(go test -run '^$' -bench 'BenchmarkRoundProcesses' -benchtime 1x ./driver/rendezvous/ 2>&1 |
	awk '/^BenchmarkRoundProcesses\/M=/ { split($1, a, "[=-]"); for (i = 1; i <= NF; i++) if ($(i+1) == "s/round") print a[2], $i }')
theirs=$(/usr/bin/python3 "$here/torch_rdzv.py" --m "${ms[@]}" |
	/usr/bin/python3 -c 'import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["m"], r["seconds"])')

printf '| M | gpujob (Consul) | torch c10d | ratio |\n| --- | --- | --- | --- |\n'
for m in "${ms[@]}"; do
	a=$(awk -v m="$m" '$1 == m { print $2 }' <<<"$ours")
	b=$(awk -v m="$m" '$1 == m { print $2 }' <<<"$theirs")
	[ -n "$a" ] && [ -n "$b" ] || { echo "missing figure for M=$m (ours: '$a', torch: '$b')" >&2; exit 1; }
	awk -v m="$m" -v a="$a" -v b="$b" 'BEGIN { printf "| %d | %.3f s | %.3f s | %.1fx |\n", m, a, b, b / a }'
done
