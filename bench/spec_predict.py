#!/usr/bin/env python3
"""Speculative decoding with a draft model: the measured speed-up against the one that the acceptance
and the two models' step times predict.

    bench/spec_predict.py CERA TARGET DRAFT PROMPT_FILE [--draft-max K] [-n N] [-r R] [cera bench flags...]

Runs `cera bench` (flags after the known ones go to every run, e.g. --device cuda -t 2):
  1. the target alone, decoding N tokens after the prompt: t_plain tok/s;
  2. the draft alone, the same: its step time t_d;
  3. the speculative run: tok/s, tokens drafted per target pass (k) and tokens per pass (tau);
  4. the target's prefill of K + 1 tokens at the depth the decode reaches halfway, t_p(K + 1), and a
     single step there, t_p(1).
Two predictions of the speculative tok/s, tau / (k t_d + t_v):
  - t_v = the target's step time (1 / t_plain): a verification of k + 1 tokens costs one step, as on a
    bandwidth-bound device (the textbook speed-up, tau / (k c + 1) with c = t_d / t_t);
  - t_v = t_p(1) + (t_p(K + 1) - t_p(1)) k / K: the prefill's cost of the extra tokens (it computes the
    last token's logits only, the verification every token's, so this is a lower bound).
"""
import argparse
import json
import subprocess
import sys


def bench(cera, model, extra, *args):
    cmd = [cera, "bench", "-m", model, "--json", *args, *extra]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def median(report, name_prefix):
    for t in report["tests"]:
        if t["name"].startswith(name_prefix):
            return t["tokens_per_second"]["median"]
    raise SystemExit(f"no test {name_prefix} in the report")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cera")
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("prompt_file")
    ap.add_argument("--draft-max", type=int, default=4)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=5)
    a, extra = ap.parse_known_args()
    common = ["-p", "0", "-n", str(a.n), "-r", str(a.r), "-f", a.prompt_file]

    plain = median(bench(a.cera, a.target, extra, *common), "tg")
    draft = median(bench(a.cera, a.draft, extra, *common), "tg")
    spec_report = bench(a.cera, a.target, extra, *common, "--draft-model", a.draft, "--draft-max", str(a.draft_max))
    spec = median(spec_report, "tg")
    s = spec_report["speculative"]
    passes = s["target_passes"]
    k = s["drafted"] / passes
    tau = s["tokens_per_pass"]

    # The prompt's length in the target's tokens: the depth the verification passes run at.
    n_prompt = spec_report.get("prompt_tokens")
    depth = (n_prompt or 0) + a.n // 2
    K = a.draft_max
    verify = bench(a.cera, a.target, extra, "-p", str(K + 1), "-n", "1", "-d", str(depth), "-r", str(max(a.r, 5)))
    t_vK = (K + 1) / median(verify, f"pp{K + 1}")
    t_v1 = 1.0 / median(verify, "tg1")
    t_d = 1.0 / draft
    t_t = 1.0 / plain
    step = tau / (k * t_d + t_t)
    prefill = tau / (k * t_d + t_v1 + (t_vK - t_v1) * k / K)

    print(f"target alone      {plain:10.1f} tok/s ({1e3 / plain:.3f} ms a step)")
    print(f"draft alone       {draft:10.1f} tok/s ({1e3 * t_d:.3f} ms a step)")
    print(f"target prefill    {1e3 * t_v1:.3f} ms for 1 token, {1e3 * t_vK:.3f} ms for {K + 1} (depth {depth})")
    print(f"speculative       acceptance {100 * s['acceptance_rate']:.1f}%, {k:.2f} drafted and {tau:.2f} "
          f"tokens a target pass")
    print(f"predicted (step)  {step:10.1f} tok/s ({step / plain:.2f}x plain): verification = one target step")
    print(f"predicted (pp)    {prefill:10.1f} tok/s ({prefill / plain:.2f}x plain): verification = prefill cost")
    print(f"measured          {spec:10.1f} tok/s ({spec / plain:.2f}x plain)")
    print(f"measured / predicted: {spec / step:.3f} (step), {spec / prefill:.3f} (pp)")


if __name__ == "__main__":
    sys.exit(main())
