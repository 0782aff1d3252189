#!/usr/bin/env python3
"""Writes the malformed GGUF corpus under tests/data/malformed/.

Every case is a small valid GGUF (built here field by field, like the GGUF
spec lays it out) with one thing broken. The valid base files go to valid/ so
the tests can check that the same builder makes files the reader accepts.
Standard library only. Usage: tools/make_malformed_gguf.py [OUT_DIR]
"""
import os
import struct
import sys

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
# ggml tensor types used here: (id, block size, bytes per block)
T_F32, T_F16, T_Q8_0 = (0, 1, 4), (1, 1, 2), (8, 32, 34)


def u32(x):
    return struct.pack("<I", x)


def u64(x):
    return struct.pack("<Q", x)


def gstr(b):
    if isinstance(b, str):
        b = b.encode()
    return u64(len(b)) + b


def kv(key, vtype, payload):
    return gstr(key) + u32(vtype) + payload


def arr(etype, items_payload, n):
    return u32(etype) + u64(n) + items_payload


def tinfo(name, dims, ttype, offset):
    out = gstr(name) + u32(len(dims))
    for d in dims:
        out += u64(d)
    return out + u32(ttype) + u64(offset)


def n_bytes(dims, t):
    n = 1
    for d in dims:
        n *= d
    return n // t[1] * t[2]


def base_kvs(alignment=32):
    return [
        kv("general.architecture", STRING, gstr("test")),
        kv("general.alignment", U32, u32(alignment)),
        kv("test.block_count", U32, u32(2)),
        kv("test.rope.freq_base", F32, struct.pack("<f", 10000.0)),
        kv("test.flag", BOOL, b"\x01"),
        kv("tokenizer.ggml.tokens", ARRAY, arr(STRING, gstr("a") + gstr("bc") + gstr("\u00e9"), 3)),
        kv("test.nested", ARRAY, arr(ARRAY, arr(I32, u32(1) + u32(2), 2) + arr(I32, b"", 0), 2)),
        kv("test.i64", I64, struct.pack("<q", -5)),
    ]


def base_tensors():
    # (name, dims, type); offsets follow, each aligned
    return [("a", [4, 2], T_F32), ("b", [32, 2], T_Q8_0), ("c", [8], T_F16)]


def layout(tensors, alignment):
    out, off = [], 0
    for name, dims, t in tensors:
        out.append((name, dims, t, off))
        off += (n_bytes(dims, t) + alignment - 1) // alignment * alignment
    return out, off


def build(kvs=None, tensors=None, infos=None, version=3, magic=b"GGUF", n_kv=None, n_tensors=None,
          alignment=32, data=None):
    """Returns (bytes, section offsets). `infos` overrides the encoded tensor infos."""
    kvs = base_kvs(alignment) if kvs is None else kvs
    tensors = base_tensors() if tensors is None else tensors
    placed, data_size = layout(tensors, alignment)
    if infos is None:
        infos = [tinfo(name, dims, t[0], off) for name, dims, t, off in placed]
    head = magic + u32(version) + u64(len(infos) if n_tensors is None else n_tensors)
    head += u64(len(kvs) if n_kv is None else n_kv)
    marks = {"header": len(head), "kv": []}
    body = head
    for k in kvs:
        marks["kv"].append((len(body), len(body) + len(k)))
        body += k
    marks["infos"] = (len(body), len(body) + sum(len(i) for i in infos))
    for i in infos:
        body += i
    body += b"\0" * ((-len(body)) % alignment)
    marks["data"] = len(body)
    if data is None:
        data = bytearray()
        for name, dims, t, off in placed:
            data += b"\0" * (off - len(data))
            data += bytes((i * 37 + 11) & 0xFF for i in range(n_bytes(dims, t)))
        data += b"\0" * ((-len(data)) % alignment)
    return bytes(body) + bytes(data), marks


def replace_kv(index, new):
    kvs = base_kvs()
    kvs[index] = new
    return kvs


def infos_with(changes):
    """The base tensor infos with fields replaced: changes = {index: dict(name=, dims=, type=, offset=)}."""
    placed, _ = layout(base_tensors(), 32)
    out = []
    for i, (name, dims, t, off) in enumerate(placed):
        c = changes.get(i, {})
        out.append(tinfo(c.get("name", name), c.get("dims", dims), c.get("type", t[0]), c.get("offset", off)))
    return out


def cases():
    valid, marks = build()
    c = {}
    c["empty"] = (b"", "empty file")
    c["magic_only"] = (b"GGUF", "only the magic")
    c["bad_magic"] = (b"GGML" + valid[4:], "magic GGML instead of GGUF")
    c["version_0"] = (build(version=0)[0], "version 0")
    c["version_1"] = (build(version=1)[0], "version 1 (unsupported)")
    c["version_99"] = (build(version=99)[0], "version 99")
    c["big_endian"] = (valid[:4] + struct.pack(">I", 3) + valid[8:], "version 3 stored big-endian")
    c["truncated_header"] = (valid[:12], "cut inside the tensor count")
    c["truncated_header_kv_count"] = (valid[:20], "cut inside the metadata count")
    for i, (start, end) in enumerate(marks["kv"]):
        c[f"truncated_kv_{i}"] = (valid[:(start + end) // 2], f"cut in the middle of metadata entry {i}")
    c["truncated_kv_boundary"] = (valid[:marks["kv"][3][0]], "cut exactly between two metadata entries")
    lo, hi = marks["infos"]
    c["truncated_tensor_infos"] = (valid[:(lo + hi) // 2], "cut in the middle of the tensor infos")
    c["truncated_tensor_infos_end"] = (valid[:hi - 3], "cut inside the last tensor's offset field")
    c["truncated_before_data"] = (valid[:marks["data"]], "no data section at all")
    c["truncated_data"] = (valid[:marks["data"] + 40], "cut inside the first tensors' data")
    c["truncated_last_tensor"] = (valid[:len(valid) - 20], "cut inside the last tensor's data")
    c["kv_count_absurd"] = (build(n_kv=1 << 63)[0], "metadata count 2^63")
    c["kv_count_too_many"] = (build(n_kv=len(base_kvs()) + 3)[0], "metadata count larger than the entries present")
    c["tensor_count_absurd"] = (build(n_tensors=(1 << 64) - 1)[0], "tensor count 2^64-1")
    c["tensor_count_too_many"] = (build(n_tensors=4)[0], "tensor count one more than the infos present")
    c["key_length_huge"] = (build(kvs=[u64((1 << 64) - 1) + b"x" * 16] + base_kvs())[0], "key length 2^64-1")
    c["key_length_past_eof"] = (build(kvs=replace_kv(2, u64(100000) + b"test.block_count"))[0],
                                "key length past the end of the file")
    c["string_length_past_eof"] = (build(kvs=replace_kv(0, kv("general.architecture", STRING, u64(5000) + b"test")))[0],
                                   "string value length past the end of the file")
    c["string_length_huge"] = (build(kvs=replace_kv(0, kv("general.architecture", STRING, u64(1 << 63) + b"test")))[0],
                               "string value length 2^63")
    c["unknown_value_type"] = (build(kvs=replace_kv(2, kv("test.block_count", 13, u32(2))))[0], "value type 13")
    c["unknown_value_type_huge"] = (build(kvs=replace_kv(2, kv("test.block_count", 0xFFFFFFFF, u32(2))))[0],
                                    "value type 2^32-1")
    c["unknown_array_elem_type"] = (build(kvs=replace_kv(5, kv("tokenizer.ggml.tokens", ARRAY, arr(99, b"", 0))))[0],
                                    "array element type 99")
    c["array_length_absurd"] = (build(kvs=replace_kv(5, kv("tokenizer.ggml.tokens", ARRAY, arr(U8, b"", 1 << 62))))[0],
                                "u8 array of 2^62 elements")
    c["array_length_past_eof"] = (build(kvs=replace_kv(5, kv("tokenizer.ggml.tokens", ARRAY,
                                                              arr(STRING, gstr("a"), 1000000))))[0],
                                  "string array of 10^6 elements in a small file")
    c["array_string_past_eof"] = (build(kvs=replace_kv(5, kv("tokenizer.ggml.tokens", ARRAY,
                                                              arr(STRING, u64(1 << 40) + b"ab", 2))))[0],
                                  "a string inside an array with a length past the end of the file")
    deep = arr(I32, b"", 0)
    for _ in range(100):
        deep = arr(ARRAY, deep, 1)
    c["nested_arrays_too_deep"] = (build(kvs=replace_kv(6, kv("test.nested", ARRAY, deep)))[0],
                                   "arrays nested 100 levels deep")
    c["empty_key"] = (build(kvs=replace_kv(2, kv("", U32, u32(2))))[0], "an empty key")
    c["key_not_utf8"] = (build(kvs=replace_kv(2, kv(b"test.\xff\xfe", U32, u32(2))))[0], "a key that is not UTF-8")
    c["bool_value_2"] = (build(kvs=replace_kv(4, kv("test.flag", BOOL, b"\x02")))[0], "bool value 2")
    c["duplicate_key"] = (build(kvs=base_kvs() + [kv("test.block_count", U32, u32(3))])[0], "a key given twice")
    c["alignment_zero"] = (build(kvs=replace_kv(1, kv("general.alignment", U32, u32(0))))[0], "alignment 0")
    c["alignment_not_pow2"] = (build(kvs=replace_kv(1, kv("general.alignment", U32, u32(48))))[0], "alignment 48")
    c["alignment_wrong_type"] = (build(kvs=replace_kv(1, kv("general.alignment", STRING, gstr("32"))))[0],
                                 "alignment as a string")
    c["alignment_u64"] = (build(kvs=replace_kv(1, kv("general.alignment", U64, u64(32))))[0],
                          "alignment as u64 (the spec says u32)")
    c["n_dims_0"] = (build(infos=infos_with({0: {"dims": []}}))[0], "a tensor with 0 dimensions")
    c["n_dims_5"] = (build(infos=infos_with({0: {"dims": [4, 2, 1, 1, 1]}}))[0], "a tensor with 5 dimensions")
    c["zero_dim"] = (build(infos=infos_with({0: {"dims": [4, 0]}}))[0], "a dimension of 0")
    c["negative_dim"] = (build(infos=infos_with({0: {"dims": [4, (1 << 63) + 2]}}))[0],
                         "a dimension >= 2^63 (negative as int64)")
    c["element_count_overflow"] = (build(infos=infos_with({0: {"dims": [1 << 32, 1 << 31]}}))[0],
                                   "element count 2^63 overflows int64")
    c["element_count_overflow_4d"] = (build(infos=infos_with({2: {"dims": [1 << 20, 1 << 20, 1 << 20, 1 << 20]}}))[0],
                                      "element count 2^80 over four dimensions")
    c["tensor_larger_than_file"] = (build(infos=infos_with({1: {"dims": [1 << 40, 2]}}))[0],
                                    "a Q8_0 tensor of 2^41 elements")
    c["unknown_tensor_type"] = (build(infos=infos_with({0: {"type": 4}}))[0], "tensor type 4 (the removed Q4_2)")
    c["unknown_tensor_type_huge"] = (build(infos=infos_with({0: {"type": 1000}}))[0], "tensor type 1000")
    c["ne0_not_block_multiple"] = (build(infos=infos_with({1: {"dims": [16, 4]}}))[0],
                                   "a Q8_0 tensor with ne0 = 16 (block size 32)")
    c["data_offset_out_of_range"] = (build(infos=infos_with({2: {"offset": 4096}}))[0],
                                     "a tensor offset past the end of the file")
    c["data_offset_wraps"] = (build(infos=infos_with({2: {"offset": (1 << 64) - 32}}))[0],
                              "a tensor offset that wraps around 2^64")
    c["data_end_past_eof"] = (build(infos=infos_with({2: {"dims": [8, 8]}}))[0],
                              "the last tensor's data runs past the end of the file")
    c["overlapping_tensors"] = (build(infos=infos_with({2: {"offset": 0}}))[0], "two tensors at the same offset")
    c["overlapping_partial"] = (build(infos=infos_with({0: {"dims": [12, 2]}}))[0],
                                "a tensor whose data runs into the next one")
    c["misaligned_offset"] = (build(infos=infos_with({2: {"offset": 36 + 68 + 4}}))[0],
                              "a tensor offset that is not a multiple of the alignment")
    c["duplicate_tensor_name"] = (build(infos=infos_with({1: {"name": "a"}}))[0], "two tensors named 'a'")
    c["empty_tensor_name"] = (build(infos=infos_with({1: {"name": ""}}))[0], "a tensor with an empty name")
    bad_name = u64(1 << 50) + b"a" + u32(1) + u64(4) + u32(0) + u64(0)
    c["tensor_name_length_huge"] = (build(infos=[bad_name] + infos_with({})[1:])[0], "tensor name length 2^50")
    return c


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "data", "malformed")
    os.makedirs(os.path.join(out, "valid"), exist_ok=True)
    with open(os.path.join(out, "valid", "base.gguf"), "wb") as f:
        f.write(build()[0])
    with open(os.path.join(out, "valid", "base_v2.gguf"), "wb") as f:
        f.write(build(version=2)[0])
    with open(os.path.join(out, "valid", "align64.gguf"), "wb") as f:
        f.write(build(alignment=64)[0])
    with open(os.path.join(out, "valid", "no_tensors.gguf"), "wb") as f:
        f.write(build(tensors=[])[0])
    rows = []
    for name, (data, what) in sorted(cases().items()):
        with open(os.path.join(out, name + ".gguf"), "wb") as f:
            f.write(data)
        rows.append(f"| `{name}.gguf` | {len(data)} | {what} |")
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("# Malformed GGUF corpus\n\n"
                "Written by `tools/make_malformed_gguf.py` (rerun it to regenerate). Each file is the small valid\n"
                "file `valid/base.gguf` (3 tensors: F32 [4,2], Q8_0 [32,2], F16 [8]; 8 metadata entries including a\n"
                "string array and nested arrays) with one thing broken. The reader must reject every file here with\n"
                "a one-line `cera::Error`, and must accept every file in `valid/`. The fuzzer uses all of them as\n"
                "seeds.\n\n| file | bytes | what is wrong |\n| --- | --- | --- |\n")
        f.write("\n".join(rows) + "\n")
    print(f"wrote {len(rows)} malformed files and 4 valid ones to {out}")


if __name__ == "__main__":
    main()
