#!/usr/bin/env bash
# Prints cera against llama-bench for every weight type, side by side on the CPU: for each type an
# lfm2 model of that type (written by `cera synth` if missing), then `cera bench` and `llama-bench`
# on the same file back to back, ROUNDS times, and the median tokens/s of each with the ratios.
#
# Usage: bench/types.sh [-c CERA] [-l LLAMA_BENCH] [-a LLAMA_ARGS] [-d MODEL_DIR] [-t THREADS]
#                       [-r ROUNDS] [-p N_PROMPT] [-n N_GEN] [-P PRESET] [TYPE ...]
# Defaults: build/bin/cera, /tmp/peers/llama-bench (../shared/peers/README.md), /tmp/cera-types,
# 2 threads, 2 rounds, pp256 / tg64, lfm2-350m, the types Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K_M Q5_K_M
# Q6_K F16 BF16. The quantized files get a Q6_K token embedding, as llama-quantize writes it.
# LLAMA_ARGS are extra llama-bench arguments (e.g. "--poll 0"). Both engines share the machine with
# whatever else runs on it: on a loaded one, compare only figures from the same run.
set -euo pipefail

CERA=build/bin/cera
LLAMA=/tmp/peers/llama-bench
LLAMA_ARGS=""
DIR=/tmp/cera-types
THREADS=2
ROUNDS=2
PP=256
TG=64
PRESET=lfm2-350m
while getopts "c:l:a:d:t:r:p:n:P:h" opt; do
    case $opt in
        c) CERA=$OPTARG ;;
        l) LLAMA=$OPTARG ;;
        a) LLAMA_ARGS=$OPTARG ;;
        d) DIR=$OPTARG ;;
        t) THREADS=$OPTARG ;;
        r) ROUNDS=$OPTARG ;;
        p) PP=$OPTARG ;;
        n) TG=$OPTARG ;;
        P) PRESET=$OPTARG ;;
        *) sed -n '2,12p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
TYPES=("$@")
[ ${#TYPES[@]} -gt 0 ] || TYPES=(Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K_M Q5_K_M Q6_K F16 BF16)

[ -x "$CERA" ] || { echo "types.sh: no cera binary at $CERA (-c)" >&2; exit 1; }
[ -x "$LLAMA" ] || { echo "types.sh: no llama-bench at $LLAMA (-l; see ../shared/peers/README.md)" >&2; exit 1; }
mkdir -p "$DIR"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VOCAB="$DIR/vocab/ggml-vocab-gpt-2.gguf"
[ -f "$VOCAB" ] || tar -xJf "$ROOT/tests/data/archives/vocab.tar.xz" -C "$DIR" --wildcards '*ggml-vocab-gpt-2.gguf'

RAW="$DIR/results.tsv"  # type, engine, test, tokens/s: one line per measurement
: >"$RAW"
for type in "${TYPES[@]}"; do
    model="$DIR/$PRESET-$type.gguf"
    if [ ! -f "$model" ]; then
        embd=Q6_K
        case $type in F16 | BF16 | F32 | Q8_0 | Q6_K) embd=$type ;; esac
        "$CERA" synth --arch lfm2 --preset "$PRESET" --type "$type" --embd-type "$embd" --vocab-from "$VOCAB" \
            -o "$model" >/dev/null
    fi
    for ((round = 0; round < ROUNDS; ++round)); do
        "$CERA" bench -m "$model" -t "$THREADS" -p "$PP" -n "$TG" -r 1 --bandwidth 20 --json 2>/dev/null |
            python3 -c 'import json, sys
for t in json.load(sys.stdin)["tests"]:
    print(sys.argv[1], "cera", "pp" if t["n_prompt"] else "tg", t["tokens_per_second"]["median"], sep="\t")' \
                "$type" >>"$RAW"
        # shellcheck disable=SC2086
        "$LLAMA" -m "$model" -t "$THREADS" -p "$PP" -n "$TG" -r 1 $LLAMA_ARGS -o json 2>/dev/null |
            python3 -c 'import json, sys
for t in json.load(sys.stdin):
    print(sys.argv[1], "llama", "pp" if t["n_prompt"] else "tg", t["avg_ts"], sep="\t")' "$type" >>"$RAW"
    done
done

python3 - "$RAW" "$PRESET" "$THREADS" "$PP" "$TG" "$ROUNDS" <<'EOF'
import statistics, sys
raw, preset, threads, pp, tg, rounds = sys.argv[1:]
vals = {}
order = []
for line in open(raw):
    ty, eng, test, v = line.split("\t")
    if ty not in order: order.append(ty)
    vals.setdefault((ty, eng, test), []).append(float(v))
def med(ty, eng, test):
    v = vals.get((ty, eng, test))
    return statistics.median(v) if v else float("nan")
print(f"{preset}, {threads} threads, pp{pp} / tg{tg}, median of {rounds} rounds, tokens/s")
print("| type | cera pp | llama.cpp pp | pp ratio | cera tg | llama.cpp tg | tg ratio |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for ty in order:
    cp, lp, ct, lt = med(ty, "cera", "pp"), med(ty, "llama", "pp"), med(ty, "cera", "tg"), med(ty, "llama", "tg")
    print(f"| {ty} | {cp:.1f} | {lp:.1f} | {cp / lp:.2f}x | {ct:.1f} | {lt:.1f} | {ct / lt:.2f}x |")
EOF
