#!/usr/bin/env python3
"""Reads a kernel timeline trace (CERA_CUDA_TRACE build, CERA_CUDA_TRACE_FILE=path) and prints the
mean critical-path share of every launch of a decode step.

Usage: scripts/trace_report.py TRACE [--skip-steps N] [--steps N] [--blocks K]

--blocks K: also the blocks of launch K of the step (mean over the steps): each block's start, wait
release and end (thread 0) relative to the launch's release, sorted by end.

For each launch of the step, in order: the kernel, its blocks, `chain` = mean time from its PDL wait's
release (the first block's) to the next launch's (its share of the step), `ahead` = how long its
first block had been resident before the release, `late` = how long after the release its last
block started waiting (blocks that were not resident in time), `lastin` = how long before the release the
last block started (negative: after it), `run` = from the release to the last block's end (thread 0),
`arrive` = when the last block's thread 0 reached its first wait, from the release (negative: before it;
near zero or positive: the release waited for the block, not for the kernel before), `mark0` / `mark1` = the
last block's thread 0 at the kernel's trace_mark(0) / trace_mark(1), from the release (0: no such mark)."""
import glob, os, re, struct, sys

def fnv(s):
    h = 2166136261
    for c in s.encode():
        h = ((h ^ c) * 16777619) & 0xffffffff
    return h

def kernel_names(root):
    names = {}
    for p in glob.glob(os.path.join(root, "src/backends/cuda/*.cu")):
        h = fnv(os.path.basename(p))
        cur = "?"
        for i, line in enumerate(open(p), 1):
            m = re.search(r"__global__\s+void\s+(?:__\w+__\([^)]*\)\s+)*(\w+)\(", line)
            if m: cur = m.group(1)
            if "pdl_trigger()" in line: names[(h, i)] = cur
    return names

def main():
    path = sys.argv[1]
    skip = int(sys.argv[sys.argv.index("--skip-steps") + 1]) if "--skip-steps" in sys.argv else 8
    nsteps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 64
    rec = struct.Struct("<QQQQQQIIII")  # t0 t1 t2 ta m0 m1 file line_sm block grid
    data = open(path, "rb").read()
    r = [x for x in rec.iter_unpack(data[: len(data) // rec.size * rec.size])][1:]
    r = [x for x in r if x[0] > 0]
    T0, T1, T2, TA, M0, M1, FILE, LINE, BLOCK, GRID = range(10)
    names = kernel_names(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    order = sorted(range(len(r)), key=lambda i: r[i][T0])
    launches = {}  # key -> list of launches (list of record indices)
    for i in order:
        x = r[i]
        key = (x[FILE], x[LINE] & 0xffff, x[GRID])
        L = launches.setdefault(key, [])
        if not L or x[BLOCK] in L[-1][1]:
            L.append(([], set()))
        L[-1][0].append(i)
        L[-1][1].add(x[BLOCK])
    rows = []
    for key, L in launches.items():
        for idx, _ in L:
            t1v = [r[i][T1] for i in idx if r[i][T1] > 0]
            if not t1v: continue
            tav = [r[i][TA] for i in idx if r[i][TA] > 0]
            m0v = [r[i][M0] for i in idx if r[i][M0] > 0]
            m1v = [r[i][M1] for i in idx if r[i][M1] > 0]
            rows.append((min(t1v), min(r[i][T0] for i in idx), max(t1v), len(idx), key,
                         max(r[i][T0] for i in idx), max(r[i][T2] for i in idx), idx, max(tav) if tav else 0,
                         max(m0v) if m0v else 0, max(m1v) if m1v else 0))
    rows.sort()
    name = lambda key: names.get((key[0], key[1]), "?%d" % key[1])
    # A step ends with its pick: the arg-max launch, or the streamed LM head that makes it.
    ends = [i for i, x in enumerate(rows) if "argmax" in name(x[4]) or "gemv_stream" in name(x[4])]
    steps = [(ends[j] + 1, ends[j + 1] + 1) for j in range(len(ends) - 1)]
    if not steps:
        print("no steps found"); return
    lens = [b - a for a, b in steps]
    mode = max(set(lens), key=lens.count)
    steps = [s for s in steps if s[1] - s[0] == mode][skip:skip + nsteps]
    print("%d steps of %d launches (modal), %d used" % (len(lens), mode, len(steps)))
    chain = [0.0] * mode; ahead = [0.0] * mode; late = [0.0] * mode; total = 0.0
    start_last = [0.0] * mode; run = [0.0] * mode; arrive = [0.0] * mode
    mark0 = [0.0] * mode; mark1 = [0.0] * mode
    for a, b in steps:
        nxt = rows[b][0] if b < len(rows) else None
        for k in range(mode):
            t1, t0, t1max, n, key, t0max, t2max, _, tamax, m0max, m1max = rows[a + k]
            t1n = rows[a + k + 1][0] if a + k + 1 < len(rows) else t1
            chain[k] += (t1n - t1); ahead[k] += (t1 - t0); late[k] += (t1max - t1)
            start_last[k] += (t1 - t0max); run[k] += (t2max - t1); arrive[k] += (tamax - t1) if tamax else 0
            mark0[k] += (m0max - t1) if m0max else 0; mark1[k] += (m1max - t1) if m1max else 0
        total += rows[b - 1 + 1][0] - rows[a][0] if b < len(rows) else 0
    n = len(steps)
    print("step (release to release): %.1f us" % (total / n / 1e3))
    cols = ("#", "kernel", "blocks", "chain", "ahead", "lastin", "late", "run", "arrive", "mark0", "mark1")
    print("%-4s %-28s %7s %7s %7s %7s %7s %7s %7s %7s %7s" % cols)
    by = {}
    for k in range(mode):
        key = rows[steps[0][0] + k][4]
        nm = name(key)
        vals = (chain, ahead, start_last, late, run, arrive, mark0, mark1)
        print("%-4d %-28s %7d" % (k, nm[:28], key[2]) + "".join(" %7.2f" % (v[k] / n / 1e3) for v in vals))
        s = by.setdefault(nm + "/%d" % key[2], [0, 0.0]); s[0] += 1; s[1] += chain[k] / n / 1e3
    if "--blocks" in sys.argv:
        k = int(sys.argv[sys.argv.index("--blocks") + 1])
        acc = {}
        for a, b in steps:
            rel = rows[a + k][0]
            for i in rows[a + k][7]:
                e = acc.setdefault(r[i][BLOCK], [0.0] * 7)
                mk = lambda t: t - rel if t else 0
                for j, v in enumerate((r[i][T0] - rel, r[i][TA] - rel, r[i][T1] - rel, r[i][T2] - rel, mk(r[i][M0]),
                                       mk(r[i][M1]), 1)):
                    e[j] += v
        print("\nlaunch %d, per block (us from its release): block start arrive wait end mark0 mark1" % k)
        for blk, e in sorted(acc.items(), key=lambda x: x[1][3] / x[1][6]):
            print("  %5d %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f" % ((blk,) + tuple(e[j] / e[6] / 1e3 for j in range(6))))
    print("\nby kernel (launches, total chain us):")
    for nm, (c, t) in sorted(by.items(), key=lambda x: -x[1][1]):
        print("  %-40s %4d %8.1f  (%.2f each)" % (nm, c, t, t / c))

main()
