#!/usr/bin/env bash
# Prints cera against llama-bench for every weight type, side by side: for each type an lfm2 model of
# that type (written by `cera synth` if missing), then `cera bench` and `llama-bench` on the same file
# back to back, ROUNDS times, and the median tokens/s of each with the ratios.
#
# Usage: bench/types.sh [-g] [-c CERA] [-l LLAMA_BENCH] [-a LLAMA_ARGS] [-d MODEL_DIR] [-t THREADS]
#                       [-r ROUNDS] [-p N_PROMPT] [-n N_GEN] [-P PRESET] [-B GBPS] [TYPE ...]
# Defaults: build/bin/cera, /tmp/peers/llama-bench (../shared/peers/README.md), /tmp/cera-types,
# 2 threads, 2 rounds, pp256 / tg64, lfm2-350m, the types Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_M
# Q4_K_M Q5_K_M Q6_K IQ4_NL IQ4_XS F16 BF16. The quantized files get a Q6_K token embedding, as
# llama-quantize writes it. LLAMA_ARGS are extra llama-bench arguments (e.g. "--poll 0").
# -g: on the GPU instead (cera --device cuda --kv-type f16, llama-bench -ngl 99 -fa 1; defaults
# lfm2-1.2b, pp512 / tg128, 3 rounds), with decode's share of the roofline at -B GB/s (4300: the
# H200's copy bandwidth). Both engines share the machine with whatever else runs on it: on a loaded
# one, compare only figures from the same run.
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
GPU=0
BW=4300
if [[ " $* " == *" -g "* ]]; then ROUNDS=3 PP=512 TG=128 PRESET=lfm2-1.2b; fi
while getopts "gc:l:a:d:t:r:p:n:P:B:h" opt; do
    case $opt in
        g) GPU=1 ;;
        B) BW=$OPTARG ;;
        c) CERA=$OPTARG ;;
        l) LLAMA=$OPTARG ;;
        a) LLAMA_ARGS=$OPTARG ;;
        d) DIR=$OPTARG ;;
        t) THREADS=$OPTARG ;;
        r) ROUNDS=$OPTARG ;;
        p) PP=$OPTARG ;;
        n) TG=$OPTARG ;;
        P) PRESET=$OPTARG ;;
        *) sed -n '2,16p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
TYPES=("$@")
[ ${#TYPES[@]} -gt 0 ] || TYPES=(Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_M Q4_K_M Q5_K_M Q6_K IQ4_NL IQ4_XS F16 BF16)
CERA_DEV=(-t "$THREADS" --bandwidth 20)
LLAMA_DEV=(-t "$THREADS")
if ((GPU)); then
    CERA_DEV=(--device cuda --kv-type f16 --bandwidth "$BW")
    LLAMA_DEV=(-ngl 99 -fa 1)
fi

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
        "$CERA" bench -m "$model" "${CERA_DEV[@]}" -p "$PP" -n "$TG" -r 1 --json 2>/dev/null |
            python3 -c 'import json, sys
j = json.load(sys.stdin)
for t in j["tests"]:
    print(sys.argv[1], "cera", "pp" if t["n_prompt"] else "tg", t["tokens_per_second"]["median"], sep="\t")
print(sys.argv[1], "cera", "roof", j.get("decode_roofline_fraction", 0), sep="\t")' "$type" >>"$RAW"
        # shellcheck disable=SC2086
        "$LLAMA" -m "$model" "${LLAMA_DEV[@]}" -p "$PP" -n "$TG" -r 1 $LLAMA_ARGS -o json 2>/dev/null |
            python3 -c 'import json, sys
for t in json.load(sys.stdin):
    print(sys.argv[1], "llama", "pp" if t["n_prompt"] else "tg", t["avg_ts"], sep="\t")' "$type" >>"$RAW"
    done
done

WHERE="$THREADS threads"
((GPU)) && WHERE="GPU (roofline at $BW GB/s)"
python3 - "$RAW" "$PRESET" "$WHERE" "$PP" "$TG" "$ROUNDS" "$GPU" <<'EOF'
import statistics, sys
raw, preset, where, pp, tg, rounds, gpu = sys.argv[1:]
gpu = gpu == "1"
vals = {}
order = []
for line in open(raw):
    ty, eng, test, v = line.split("\t")
    if ty not in order: order.append(ty)
    vals.setdefault((ty, eng, test), []).append(float(v))
def med(ty, eng, test):
    v = vals.get((ty, eng, test))
    return statistics.median(v) if v else float("nan")
print(f"{preset}, {where}, pp{pp} / tg{tg}, median of {rounds} rounds, tokens/s")
head = "| type | cera pp | llama.cpp pp | pp ratio | cera tg | llama.cpp tg | tg ratio |"
print(head + (" tg / roofline |" if gpu else ""))
print("| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if gpu else ""))
for ty in order:
    cp, lp, ct, lt = med(ty, "cera", "pp"), med(ty, "llama", "pp"), med(ty, "cera", "tg"), med(ty, "llama", "tg")
    roof = f" {100 * med(ty, 'cera', 'roof'):.1f}% |" if gpu else ""
    print(f"| {ty} | {cp:.1f} | {lp:.1f} | {cp / lp:.2f}x | {ct:.1f} | {lt:.1f} | {ct / lt:.2f}x |{roof}")
EOF
