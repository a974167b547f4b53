#!/usr/bin/env python3
"""plan_digest.py PLAN... — one line per plan: SHA-256 over its content sections, provenance excluded.

For refactors that must not change what a plan holds: two plans with the same digest have the same
header feature bits and byte-identical FPRT, GLOB, GRID, LAYR, PRED, SQAT, FSCL and REPT sections
(payloads as stored; zlib output is deterministic for one zlib). PROV is left out because it names
the commit and the creation time. Layout: formats/PLAN_FORMAT.md §4 (header), §5 (section table)."""
import hashlib
import struct
import sys


def digest(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89KVPLAN\n":
        raise SystemExit(f"{path}: not a plan")
    major, minor, hsize, esize, bom, count, fsize, req, opt, toff = struct.unpack_from("<HHHHIIQQQQ", data, 8)
    h = hashlib.sha256()
    h.update(struct.pack("<HHQ", major, minor, req))
    for i in range(count):
        e = toff + i * esize
        tag = data[e:e + 4]
        flags, off, stored, size, crc = struct.unpack_from("<IQQQI", data, e + 4)
        if tag == b"PROV":
            continue
        h.update(tag + struct.pack("<IQ", flags, size))
        h.update(data[off:off + stored])
    return h.hexdigest()


for p in sys.argv[1:]:
    print(digest(p), p)
