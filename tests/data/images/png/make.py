#!/usr/bin/env python3
"""Writes the PNG cases of tests/golden/vision_test.cpp (python3 make.py, in this folder).

Each interlaced image (Adam7) has a non-interlaced sibling of the same pixels, and each a sibling
NAME-extra.png whose image data decompresses to more bytes than the pixels need (libpng and Pillow
read up to the pixels); rgb8-17x2-adam7-extra.png is the interlaced one, rgb8-17x2-trailing.png has
bytes after the end of its zlib stream. bomb-1x1.png is a 1 x 1 grayscale image whose image data
decompresses to 16 MiB instead of its 2 bytes (one black pixel).
"""
import random
import struct
import zlib


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(w, h, depth, color, rows_of, interlace, palette=None, idat=None, extra=b"", trailing=b""):
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color, 0, 0, interlace)
    if idat is None:
        raw = b""
        passes = [(0, 0, 1, 1)] if not interlace else [
            (0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
        for x0, y0, dx, dy in passes:
            xs, ys = list(range(x0, w, dx)), list(range(y0, h, dy))
            if not xs or not ys:
                continue
            for y in ys:
                raw += b"\0" + rows_of(xs, y)
        idat = zlib.compress(raw + extra, 9) + trailing
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
    if palette:
        out += chunk(b"PLTE", palette)
    return out + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def packed(samples, depth):
    bits = "".join(format(s, "0%db" % depth) for s in samples)
    bits += "0" * (-len(bits) % 8)
    return bytes(int(bits[i:i + 8], 2) for i in range(0, len(bits), 8))


rnd = random.Random(7)
cases = {
    # name: (width, height, depth, color, channels)
    "rgba16-13x7": (13, 7, 16, 6, 4),
    "gray1-5x3": (5, 3, 1, 0, 1),
    "pal4-9x9": (9, 9, 4, 3, 1),
    "graya8-1x10": (1, 10, 8, 4, 2),
    "rgb8-17x2": (17, 2, 8, 2, 3),
}
for name, (w, h, depth, color, ch) in cases.items():
    top = (1 << depth) - 1
    px = {(x, y): [rnd.randint(0, top) for _ in range(ch)] for x in range(w) for y in range(h)}
    palette = bytes(rnd.randint(0, 255) for _ in range(3 << depth)) if color == 3 else None

    def rows_of(xs, y):
        if depth == 16:
            return b"".join(struct.pack(">H", s) for x in xs for s in px[(x, y)])
        return packed([s for x in xs for s in px[(x, y)]], depth)

    for interlace in (0, 1):
        with open("%s-%s.png" % (name, "adam7" if interlace else "plain"), "wb") as f:
            f.write(png(w, h, depth, color, rows_of, interlace, palette))
    with open("%s-extra.png" % name, "wb") as f:
        f.write(png(w, h, depth, color, rows_of, 0, palette, extra=bytes(range(256)) * 300))
    if name == "rgb8-17x2":
        with open("%s-adam7-extra.png" % name, "wb") as f:
            f.write(png(w, h, depth, color, rows_of, 1, palette, extra=b"\x07" * 1000))
        with open("%s-trailing.png" % name, "wb") as f:
            f.write(png(w, h, depth, color, rows_of, 0, palette, trailing=b"junk after the stream"))

with open("bomb-1x1.png", "wb") as f:
    f.write(png(1, 1, 8, 0, None, 0, idat=zlib.compress(b"\0" * (16 << 20), 9)))
