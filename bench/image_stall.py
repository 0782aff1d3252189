#!/usr/bin/env python3
"""A text stream's gaps while a server encodes an image: starts `CERA serve -m MODEL --mmproj MMPROJ`
on PORT (2 threads), streams a 300-token completion, sends a chat request with a random 512x512 image
4 s later, and prints the image request's time and the text stream's largest gap during it.
Usage: bench/image_stall.py CERA MODEL MMPROJ PORT (needs python3-requests)."""
import base64, os, random, struct, subprocess, sys, threading, time, requests
binary, model, mmproj, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
w = h = 512
random.seed(1)
pix = bytes(random.getrandbits(8) for _ in range(w * h * 3))
bmp = b'BM' + struct.pack('<IHHI', 54 + len(pix), 0, 0, 54) + struct.pack('<IiiHHIIiiII', 40, w, h, 1, 24, 0, len(pix), 2835, 2835, 0, 0) + pix
url = 'data:image/bmp;base64,' + base64.b64encode(bmp).decode()
srv = subprocess.Popen([binary, 'serve', '-m', model, '--mmproj', mmproj, '-t', '2', '--ctx', '1024', '--max-seqs', '4',
                        '--port', str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
base = f'http://127.0.0.1:{port}'
for _ in range(600):
    try:
        if requests.get(base + '/health', timeout=1).status_code == 200: break
    except Exception: pass
    time.sleep(0.5)
stamps = []
def text():
    r = requests.post(base + '/v1/completions', json={'prompt': 'Once upon a time', 'max_tokens': 300, 'temperature': 0,
                      'stream': True, 'ignore_eos': True}, stream=True)
    for line in r.iter_lines():
        if line.startswith(b'data: {'): stamps.append(time.time())
img = {}
def image():
    t0 = time.time()
    r = requests.post(base + '/v1/chat/completions', json={'messages': [{'role': 'user', 'content': [
        {'type': 'image_url', 'image_url': {'url': url}}, {'type': 'text', 'text': 'Describe.'}]}],
        'max_tokens': 1, 'temperature': 0})
    img['t0'], img['t1'], img['status'] = t0, time.time(), r.status_code
a = threading.Thread(target=text); a.start()
time.sleep(4)
b = threading.Thread(target=image); b.start()
b.join(); a.join()
srv.terminate(); srv.wait()
during = [s for s in stamps if img['t0'] <= s <= img['t1'] + 0.5]
gaps = [y - x for x, y in zip(stamps, stamps[1:])]
gaps_during = [y - x for x, y in zip(stamps, stamps[1:]) if img['t0'] <= y and x <= img['t1']]
print(f"{os.path.basename(binary)}: image request {img['t1']-img['t0']:.1f} s (status {img['status']}); text chunks {len(stamps)}, "
      f"{len(during)} during the image; largest gap {max(gaps):.2f} s; median gap before {sorted(gaps[:20])[10]*1000:.0f} ms, "
      f"largest during {max(gaps_during) if gaps_during else 0:.2f} s")
