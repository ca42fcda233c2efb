#!/usr/bin/env bash
# Uncontended acquire+release from Python and from C, shmlocks against
# flock(2) in the same language, side by side: medians of COUNT runs (make
# bench-lang, run by make bench; docs/benchmarks.md). Needs lib/ (make lib),
# gcc and python3. Raw output and the summary go to $OUT/lang.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
COUNT=${COUNT:-3}
OUT=${OUT:-bench-out}
N=${N:-200000}
LIBDIR=${LIBDIR:-lib}
mkdir -p "$OUT"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
${CC:-gcc} -O2 -I capi -o "$d/cbench" capi/bench/bench.c -L "$LIBDIR" -lshmlocks -Wl,-rpath,"$(cd "$LIBDIR" && pwd)"
: >"$d/raw"
for i in $(seq "$COUNT"); do
	"$d/cbench" "$d/t.tbl" "$d/f.lock" "$N" >>"$d/raw"
	python3 capi/bench/bench.py "$d/t.tbl" "$d/f.lock" "$((N / 4))" >>"$d/raw"
done
{
	echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs; $(python3 --version); $(${CC:-gcc} --version | head -1)"
	echo "uncontended acquire+release, ns per pair, median of $COUNT runs:"
	sort -k1,1 -k2,2n "$d/raw" | awk '
		{ v[$1, ++n[$1]] = $2 }
		END { for (k in n) { m = v[k, int((n[k] + 1) / 2)]; med[k] = m; printf "  %-22s %8.0f  (runs:", k, m; for (i = 1; i <= n[k]; i++) printf " %s", v[k, i]; print ")" }
		      printf "  ratio C shmlocks/flock(2): %.2f; Python acquire/flock: %.2f; Python with/flock: %.2f\n",
			med["c-shmlocks"] / med["c-flock"], med["py-shmlocks-acquire"] / med["py-flock"], med["py-shmlocks-with"] / med["py-flock"] }'
} | tee "$OUT/lang.txt"
