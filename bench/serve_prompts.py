#!/usr/bin/env python3
"""Prompts for `cera bench-serve --prompts FILE` that a server can answer in full.

Writes COUNT prompts of exactly TOKENS tokens (random common words, cut through the server's
/tokenize and /detokenize) for which the server's greedy /v1/completions of MAX_TOKENS tokens with
ignore_eos succeeds. A random-weight model's output is often not valid UTF-8; llama-server ends such
a request with an error ("does not match the expected Content-only format"), so an even comparison
sends both servers the prompts that llama-server completes.

    bench/serve_prompts.py --url http://127.0.0.1:8080 --count 32 --tokens 128 --max-tokens 64 -o prompts.txt

--ascii-bias FILE also writes {"logit_bias": {...}} banning every token whose text is not printable ASCII
(each token id through /detokenize), for `cera bench-serve --extra-body FILE`: batched, llama-server still
fails some requests of a random-weight model (its sums differ from one at a time), and with the bias every
output is ASCII. The prompts are then kept with the bias on.
"""
import argparse
import json
import random
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

WORDS = ("the time people year way day man thing woman life child world school state family student group "
         "country problem hand part place case week company system program question work number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city name team "
         "red green blue happy quick slow warm cold bright dark soft loud quiet small big old new good long").split()


def post(url, body, timeout=600):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, None


def post_get(url, timeout=600):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--count", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--ascii-bias", metavar="FILE")
    ap.add_argument("--vocab", type=int, help="token count (default: the server's /v1/models meta.n_vocab)")
    a = ap.parse_args()

    extra = {}
    if a.ascii_bias:
        n_vocab = a.vocab
        if not n_vocab:
            _, models = post_get(a.url + "/v1/models")
            n_vocab = ((models or {}).get("data") or [{}])[0].get("meta", {}).get("n_vocab")
            if not n_vocab:
                sys.exit("serve_prompts: the server does not give its vocabulary size: pass --vocab")

        def banned(i):
            _, d = post(a.url + "/detokenize", {"tokens": [i]})
            text = (d or {}).get("content", "")
            return not text or any(not (c == "\n" or " " <= c <= "~") for c in text)

        with ThreadPoolExecutor(a.parallel) as pool:
            ban = [i for i, b in zip(range(n_vocab), pool.map(banned, range(n_vocab))) if b]
        extra = {"logit_bias": {str(i): -100 for i in ban}}
        with open(a.ascii_bias, "w") as f:
            json.dump(extra, f)
        print(f"serve_prompts: {len(ban)} of {n_vocab} tokens banned -> {a.ascii_bias}")

    def candidate(i):
        rng = random.Random(a.seed * 1000003 + i)  # the same candidates, in the same order, every run
        text = " ".join(rng.choice(WORDS) for _ in range(a.tokens * 2))
        _, tok = post(a.url + "/tokenize", {"content": text})
        _, detok = post(a.url + "/detokenize", {"tokens": tok["tokens"][: a.tokens]})
        prompt = detok["content"].lstrip(" ")
        status, _ = post(a.url + "/v1/completions", {"prompt": prompt, "max_tokens": a.max_tokens,
                                                      "temperature": 0, "ignore_eos": True, **extra})
        return prompt if status == 200 else None

    kept, tried = [], 0
    with ThreadPoolExecutor(a.parallel) as pool:
        while len(kept) < a.count:
            batch = list(pool.map(candidate, range(tried, tried + a.parallel)))
            tried += len(batch)
            kept += [p for p in batch if p]
            if tried > 20 * a.count:
                sys.exit(f"serve_prompts: only {len(kept)} of {tried} prompts were answered in full")
    with open(a.out, "w") as f:
        f.write("\n".join(kept[: a.count]) + "\n")
    print(f"serve_prompts: {a.count} prompts kept of {tried} tried -> {a.out}")


if __name__ == "__main__":
    main()
