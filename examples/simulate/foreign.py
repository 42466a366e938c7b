#!/usr/bin/env python3
"""Shipped Mooncake trace -> foreign format: epoch-ns string timestamps, 32-token blocks
(each 512-token id split into 16 sub-ids), only as many sub-blocks as input_length needs."""
import json, sys
src, dst = sys.argv[1], sys.argv[2]
base = 1_764_547_200_000_000_000
with open(src) as f, open(dst, "w") as o:
    for line in f:
        r = json.loads(line)
        n = -(-r["input_length"] // 32)
        ids = [h * 16 + j for h in r["hash_ids"] for j in range(16)][:n]
        o.write(json.dumps({"timestamp": str(base + int(r["timestamp"]) * 1_000_000),
                            "input_length": r["input_length"], "output_length": r["output_length"],
                            "hash_ids": ids}) + "\n")
