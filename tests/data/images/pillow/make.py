#!/usr/bin/python3
"""Writes the orientation and CMYK cases of tests/golden/vision_test.cpp and Pillow's pixels for each
(/usr/bin/python3 make.py in this folder, with Debian's python3-pil).

Each image file X gets X.ppm: the RGB pixels that the Hugging Face processors take, as
transformers.image_utils.load_image makes them: Pillow opens the file, ImageOps.exif_transpose applies
the EXIF orientation, and an image that is not RGB is composited over white and made RGB
(transformers.image_transforms.convert_to_rgb).

The picture is a 37 x 23 crop of tests/fuzz/images/test_image.png (odd sides, wider than high, so a
transposition or a mirror shows). Cases:
  jpeg-o1.jpg ... jpeg-o8.jpg  JPEG (quality 90, 4:4:4) with EXIF orientation 1-8, little-endian TIFF
  jpeg-o6-mm.jpg               orientation 6 in a big-endian ("MM") TIFF, after an APP1 that is XMP
  jpeg-o9.jpg                  orientation 9 (not a valid value: left as it is)
  png-o3.png, png-o7.png       PNG with an eXIf chunk (3: after the image data)
  webp-o5.webp, webp-o8.webp   lossless WebP with an EXIF chunk
  cmyk.jpg, cmyk-o6.jpg        CMYK JPEG (Pillow writes Adobe's inverted form), the second oriented
  tiny-o1.png ... tiny-o8.png  3 x 2 pixels of six colours with orientation 1-8 (no .ppm: the test
                               spells out each display order)
"""
import struct

from PIL import Image, ImageOps

base = Image.open("../../../fuzz/images/test_image.png").convert("RGB").crop((10, 12, 47, 35))


def exif(orientation):
    e = Image.Exif()
    e[0x0112] = orientation
    return e.tobytes()


def tiff_mm(orientation):  # big-endian TIFF: header, one IFD0 entry (SHORT), no next IFD
    return (b"Exif\0\0MM\0\x2a" + struct.pack(">I", 8) + struct.pack(">H", 1) +
            struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack(">I", 0))


def reference(path):
    im = ImageOps.exif_transpose(Image.open(path))
    if im.mode != "RGB":
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255))
        im = Image.alpha_composite(white, rgba).convert("RGB")
    im.save(path + ".ppm")


def jpeg_with_app1(path, app1):
    """Saves base as JPEG, then puts an XMP APP1 and the given APP1 right after SOI."""
    base.save(path, "JPEG", quality=90, subsampling=0)
    data = open(path, "rb").read()
    xmp = b"http://ns.adobe.com/xap/1.0/\0<x:xmpmeta/>"
    seg = lambda body: b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body
    open(path, "wb").write(data[:2] + seg(xmp) + seg(app1) + data[2:])


files = []
for o in range(1, 9):
    p = f"jpeg-o{o}.jpg"
    base.save(p, "JPEG", quality=90, subsampling=0, exif=exif(o))
    files.append(p)
jpeg_with_app1("jpeg-o6-mm.jpg", tiff_mm(6))
files.append("jpeg-o6-mm.jpg")
base.save("jpeg-o9.jpg", "JPEG", quality=90, subsampling=0, exif=exif(9))
files.append("jpeg-o9.jpg")

# PNG: eXIf before the image data (Pillow's own placement) and after it.
base.save("png-o7.png", "PNG", exif=exif(7))
files.append("png-o7.png")
base.save("png-o3.png", "PNG")
data = open("png-o3.png", "rb").read()
tiff = exif(3)[6:]
iend = data.rindex(b"IEND") - 4
import zlib
chunk = struct.pack(">I", len(tiff)) + b"eXIf" + tiff + struct.pack(">I", zlib.crc32(b"eXIf" + tiff))
open("png-o3.png", "wb").write(data[:iend] + chunk + data[iend:])
files.append("png-o3.png")

for o in (5, 8):
    p = f"webp-o{o}.webp"
    base.save(p, "WEBP", lossless=True, exif=exif(o))
    files.append(p)

base.convert("CMYK").save("cmyk.jpg", "JPEG", quality=90)
base.convert("CMYK").save("cmyk-o6.jpg", "JPEG", quality=90, exif=exif(6))
files += ["cmyk.jpg", "cmyk-o6.jpg"]

for p in files:
    reference(p)

tiny = Image.new("RGB", (3, 2))
tiny.putdata([(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255), (255, 0, 255)])
for o in range(1, 9):
    tiny.save(f"tiny-o{o}.png", "PNG", exif=exif(o))
