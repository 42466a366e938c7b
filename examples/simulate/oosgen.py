#!/usr/bin/env python3
"""Out-of-sample trace families, unlike `tracegen.rs` (heldout, nsblocks) and
the shipped trace: other mechanisms, other block sizes, other time formats.

Usage: oosgen.py KIND SEED OUT.jsonl      (KIND: agent, longdoc, bursty, uniqmix)

Mooncake-style JSONL (`timestamp`, `input_length`, `output_length`,
`hash_ids`), deterministic in SEED (Python's `random.Random(SEED * 1000 +
kind number)`, no other source of randomness). The last block of a prompt is
partial, as in real traces. Sizes are set so that `--time-scale 1` loads 7
replicas (shared engine model) to a high but sustainable level; scale the
load with the fleet as `--time-scale 7/N`.

- `agent` (agent / tool traffic): 6 tool-laden system prompts of 6k-14k
  tokens (Zipf 1.2: two of them carry most traffic), 1500 short unrelated
  sessions of 1-3 steps (user text 50-400 tokens, each later step appends the
  tool output 100-800 tokens), outputs 20-300. A few hot, long shared
  prefixes against many replicas: can the router spread a hot prefix
  without losing it? 128-token blocks, prefix-chained ids, float-second
  timestamps from 0. About 3000 requests, 40 sessions/s.
- `longdoc` (RAG-heavy, long prefixes): 16 documents of 16k-64k tokens
  (Zipf 1.3), each request = a 1-block instruction + one document + a short
  question (20-200 tokens), outputs 20-200. Few very long shared prefixes
  asked many short questions: the holder of a hot document saturates, and a
  cold copy costs seconds. 512-token blocks, prefix-chained, integer
  millisecond timestamps. 2500 requests at 12/s.
- `bursty` (on/off arrivals at high load): 60 templates of 1k-8k tokens
  (Zipf 0.8) + a unique 50-600-token tail; arrivals alternate 8 s at 4x the
  mean rate and 32 s at 0.25x, so bursts overload the fleet and the queues
  drain in between. 64-token blocks, prefix-chained,
  integer millisecond timestamps. 3500 requests, mean 14/s.
- `uniqmix` (30 % unique): 30 % of requests are unique 1k-6k-token prompts
  (no shared block at all); 70 % are turns of multi-turn chats (4 system
  prompts of 300-1500 tokens, 1-6 turns, user 30-500 tokens, answers
  50-600 appended). 16-token blocks with **content ids** (not
  prefix-chained: a system prompt's ids repeat, the conversation's blocks are
  fresh), epoch microsecond integer timestamps. 3500 requests, 10/s.
"""

import json
import math
import random
import sys

KINDS = {"agent": 1, "longdoc": 2, "bursty": 3, "uniqmix": 4}


class Chain:
    """Prefix-chained ids: (parent id, content) -> a new sequential id."""

    def __init__(self):
        self.ids = {}

    def of(self, content):
        parent, out = None, []
        for c in content:
            key = (parent, c)
            if key not in self.ids:
                self.ids[key] = len(self.ids) + 1
            parent = self.ids[key]
            out.append(parent)
        return out


def zipf(rng, n, s):
    w = [1.0 / (k + 1) ** s for k in range(n)]
    return rng.choices(range(n), weights=w)[0]


def lognormal(rng, median, sigma, lo, hi):
    return int(min(hi, max(lo, round(median * math.exp(rng.gauss(0, sigma))))))


class Req:
    """One request: content block keys (uncut), prompt tokens, output."""

    def __init__(self, t, content, tokens, output):
        self.t, self.content, self.tokens, self.output = t, content, tokens, output


def blocks_of(pieces, b):
    """Block contents for a prompt made of (key, tokens) pieces laid end to end:
    a block's content is the tuple of (piece key, offset) runs it covers, so
    equal prefixes give equal blocks and the last block is partial."""
    runs, pos = [], 0
    for key, n in pieces:
        runs.append((key, pos, n))
        pos += n
    total, out = pos, []
    for start in range(0, total, b):
        end = min(total, start + b)
        out.append(
            tuple((k, max(start, p) - p, min(end, p + n) - p) for k, p, n in runs if p < end and p + n > start)
        )
    return out, total


def agent(rng):
    b = 128
    sys_len = [rng.randint(6000, 14000) for _ in range(6)]
    reqs, t = [], 0.0
    for s in range(1500):
        t += rng.expovariate(40.0 / 2.0)  # ~2 requests per session -> ~40 req/s
        sp = zipf(rng, 6, 1.2)
        pieces = [(("sys", sp), sys_len[sp]), (("user", s), rng.randint(50, 400))]
        at = t
        for step in range(rng.choice([1, 1, 2, 2, 3])):
            if step:
                pieces.append((("tool", s, step), rng.randint(100, 800)))
            out = rng.randint(20, 300)
            content, tokens = blocks_of(pieces, b)
            reqs.append(Req(at, content, tokens, out))
            pieces.append((("ans", s, step), out))
            at += 0.5 + out / 40.0 + rng.expovariate(1.0)
    return reqs, b, "s"


def longdoc(rng):
    b = 512
    doc_len = [rng.randint(16000, 64000) for _ in range(16)]
    reqs, t = [], 0.0
    for i in range(2500):
        t += rng.expovariate(12.0)
        d = zipf(rng, 16, 1.3)
        pieces = [("instr", 400), (("doc", d), doc_len[d]), (("q", i), rng.randint(20, 200))]
        content, tokens = blocks_of(pieces, b)
        reqs.append(Req(t, content, tokens, rng.randint(20, 200)))
    return reqs, b, "ms"


def bursty(rng):
    b = 64
    tpl_len = [rng.randint(1000, 8000) for _ in range(60)]
    reqs, t = [], 0.0
    mean = 14.0
    for i in range(3500):
        # 40 s cycle: 8 s "on" at 4x the mean rate, 32 s "off" at 0.25x.
        phase = t % 40.0
        rate = 4.0 * mean if phase < 8.0 else 0.25 * mean
        t += rng.expovariate(rate)
        k = zipf(rng, 60, 0.8)
        pieces = [(("tpl", k), tpl_len[k]), (("tail", i), rng.randint(50, 600))]
        content, tokens = blocks_of(pieces, b)
        reqs.append(Req(t, content, tokens, lognormal(rng, 150, 0.7, 5, 1200)))
    return reqs, b, "ms"


def uniqmix(rng):
    b = 16
    sys_len = [rng.randint(300, 1500) for _ in range(4)]
    reqs, t, i = [], 0.0, 0
    while len(reqs) < 3500:
        t += rng.expovariate(10.0 / 2.0)
        if rng.random() < 0.6:
            # 30 % of requests: p / (p + 3.5 (1 - p)) = 0.3 at p = 0.6
            # (a session has 3.5 turns on average)
            pieces = [(("uniq", i), rng.randint(1000, 6000))]
            content, tokens = blocks_of(pieces, b)
            reqs.append(Req(t, content, tokens, lognormal(rng, 200, 0.7, 5, 1500)))
        else:
            sp = rng.randrange(4)
            pieces = [(("sys", sp), sys_len[sp])]
            at = t
            for turn in range(rng.randint(1, 6)):
                pieces.append((("u", i, turn), rng.randint(30, 500)))
                out = rng.randint(50, 600)
                content, tokens = blocks_of(pieces, b)
                reqs.append(Req(at, content, tokens, out))
                pieces.append((("a", i, turn), out))
                at += 2.0 + out / 40.0 + rng.expovariate(1 / 10.0)
        i += 1
    return reqs[:3500], b, "us_epoch"


def write(reqs, b, unit, chained, out):
    reqs.sort(key=lambda r: r.t)
    chain, content_ids = Chain(), {}
    with open(out, "w") as f:
        for r in reqs:
            if chained:
                ids = chain.of(r.content)
            else:
                # content ids: a block's id depends on its own text only.
                ids = [content_ids.setdefault(c, len(content_ids) + 1) for c in r.content]
            if unit == "s":
                ts = round(r.t, 6)
            elif unit == "ms":
                ts = int(r.t * 1000)
            else:  # epoch microseconds
                ts = 1_764_547_200_000_000 + int(r.t * 1e6)
            f.write(
                json.dumps(
                    {"timestamp": ts, "input_length": r.tokens, "output_length": r.output, "hash_ids": ids}
                )
                + "\n"
            )


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in KINDS:
        sys.exit(__doc__)
    kind, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rng = random.Random(seed * 1000 + KINDS[kind])
    reqs, b, unit = globals()[kind](rng)
    write(reqs, b, unit, kind != "uniqmix", out)
    print(f"{out}: {len(reqs)} requests, {b}-token blocks, unit {unit}")


if __name__ == "__main__":
    main()
