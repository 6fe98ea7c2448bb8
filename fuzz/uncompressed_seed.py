#!/usr/bin/env python3
"""Rewrite an lrnprof trace with every block stored uncompressed (codec 0)
and without its index and footer, as a seed for the analyze_checksummed
fuzz target: mutations of a zstd frame only make it undecodable, while
mutations of stored records reach the analyzer. Needs the zstd command.

    python3 uncompressed_seed.py TRACE SEED
"""

import struct
import subprocess
import sys
import zlib

MAGIC = b"\x89LPT\r\n\x1a\n"
FILE_HEADER_LEN = 20
BLOCK_HEADER_LEN = 40
INDEX_BLOCK = 1
ZSTD = 1


def main(src, dst):
    data = open(src, "rb").read()
    if data[:8] != MAGIC:
        sys.exit(f"{src}: not an lrnprof trace")
    (header_len,) = struct.unpack_from("<I", data, 12)
    out = bytearray(data[: FILE_HEADER_LEN + header_len])
    at = FILE_HEADER_LEN + header_len
    while data[at : at + 4] == b"LBLK":
        header = bytearray(data[at : at + BLOCK_HEADER_LEN])
        kind, codec = header[4], header[5]
        raw_len, stored_len = struct.unpack_from("<II", header, 8)
        payload = data[at + BLOCK_HEADER_LEN : at + BLOCK_HEADER_LEN + stored_len]
        at += BLOCK_HEADER_LEN + stored_len
        if kind == INDEX_BLOCK:
            # Its offsets would no longer hold; the reader scans without it.
            continue
        if codec == ZSTD:
            payload = subprocess.run(
                ["zstd", "-d", "-c"], input=payload, capture_output=True, check=True
            ).stdout
        if len(payload) != raw_len:
            sys.exit(f"{src}: a block at {at} decompresses to {len(payload)}, not {raw_len}")
        header[5] = 0
        struct.pack_into("<I", header, 12, len(payload))
        struct.pack_into("<I", header, 36, zlib.crc32(payload, zlib.crc32(bytes(header[:36]))))
        out += header + payload
    open(dst, "wb").write(out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
