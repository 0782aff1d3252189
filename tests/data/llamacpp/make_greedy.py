#!/usr/bin/env python3
"""Writes llama.cpp's greedy continuations of the tiny-lfm2 fixture quantized to each weight type.

For each type: llama-quantize writes fixtures/tiny-lfm2/model.gguf in that type (the bytes
`cera quantize` writes too, see golden/quantize_test), llama-server loads it with an F32 KV cache,
and for the fixture's prompts 0 and 2 (ref/prompt_N.json) a /completion request asks for up to 32
greedy tokens (ending with the end-of-text token where llama.cpp picks it) with the top 5
log-probabilities of the raw distribution at every step (n_probs, not post-sampling). Output:
tiny-lfm2-<TYPE>.json beside this script.

Usage: make_greedy.py FIXTURE_DIR PEERS_DIR [TYPE ...]   (PEERS_DIR holds llama-quantize and
llama-server from ../shared/peers)
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

TYPES = ["Q4_1", "Q5_0", "Q5_1", "Q5_K_M", "F16", "BF16", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K_M"]
PORT = 8391
STEPS = 32


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def wait_ready():
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.2)
    raise SystemExit("llama-server did not come up")


def main():
    fixture, peers = sys.argv[1], sys.argv[2]
    types = sys.argv[3:] or TYPES
    here = os.path.dirname(os.path.abspath(__file__))
    prompts = {p: json.load(open(f"{fixture}/ref/prompt_{p}.json"))["ids"] for p in (0, 2)}
    for ty in types:
        with tempfile.TemporaryDirectory() as tmp:
            model = f"{tmp}/model-{ty}.gguf"
            subprocess.run([f"{peers}/llama-quantize", f"{fixture}/model.gguf", model, ty, "2"], check=True,
                           capture_output=True)
            server = subprocess.Popen([f"{peers}/llama-server", "-m", model, "--port", str(PORT), "-t", "2", "-c", "256",
                                       "-np", "1", "-ctk", "f32", "-ctv", "f32", "--no-warmup"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_ready()
                out = {"type": ty, "tool": "llama-quantize + llama-server b10470, /completion, temperature 0, "
                                           "n_probs 5 (raw distribution), F32 KV cache, -t 2", "prompts": []}
                for p, ids in prompts.items():
                    r = post("/completion", {"prompt": ids, "n_predict": STEPS, "temperature": 0, "n_probs": 5,
                                             "cache_prompt": False})
                    steps = r["completion_probabilities"]
                    out["prompts"].append({
                        "prompt": p,
                        "token_ids": ids,
                        "greedy_ids": [s["id"] for s in steps],
                        "top5_logprobs": [[[t["id"], t["logprob"]] for t in s["top_logprobs"]] for s in steps],
                    })
            finally:
                server.terminate()
                server.wait()
        with open(f"{here}/tiny-lfm2-{ty}.json", "w") as f:
            json.dump(out, f, separators=(",", ":"))
            f.write("\n")
        g = [len(q["greedy_ids"]) for q in out["prompts"]]
        print(ty, "greedy tokens per prompt:", g)


if __name__ == "__main__":
    main()
