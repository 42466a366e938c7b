#!/usr/bin/env python3
"""SVG plots of the benchmark results (stdlib only; called by scripts/bench.sh).

    plot.py BENCH_DIR OUT_DIR [--since EPOCH] [--command TEXT]

Reads the JSON that the bench parts write (BENCH_DIR/routing.json, overhead.json, llama.json;
see scripts/bench/report.py and scripts/llama/client.py) and writes, for each one present and
newer than --since:

  routing-hit-rate.svg  prefix-cache hit rate per strategy, one group of bars per workload
  routing-ttft.svg      TTFT p50 (solid) and p90 (light) per strategy, one panel per workload
  overhead.svg          what the filter adds against the same Envoy without it, per body size:
                        p50 and p99 latency and Envoy CPU per request, one line per listener
  llama.svg             real llama.cpp replicas: engine-reported cached share (and the filter's
                        predicted share) and TTFT p50/p90 per strategy

Every plot carries the command, date and machine of the run it was drawn from. The SVG is
written by hand (a few rectangles, lines and text elements): no plotting library, so nothing
to install. Output is deterministic for a given JSON (no timestamps of its own), so a redraw of
the same data leaves git clean.
"""

import argparse
import json
import math
import os
import sys
from datetime import datetime, timezone
from xml.sax.saxutils import escape

# One colour per strategy/listener, the same in every plot.
COLOURS = {
    "round_robin": "#8c8c8c",
    "least_request": "#5b7083",
    "prefix": "#e6862e",
    "session": "#b05fb0",
    "affinity": "#2f6fb3",
    "affinity, read_usage off": "#8fb3dc",
    "floor: no-op wasm": "#9bbf6a",
    "floor: pause+read wasm": "#4f8f3a",
}
FALLBACK = ["#c0504d", "#8064a2", "#4bacc6", "#f79646"]
FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"


def colour(name, i=0):
    return COLOURS.get(name, FALLBACK[i % len(FALLBACK)])


def lighten(hex_colour, f=0.55):
    """The colour mixed with white (f = share of white)."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(c + (255 - c) * f):02x}" for c in (r, g, b))


def nice_ticks(lo, hi, n=5):
    """Round tick values covering [lo, hi] (lo <= 0 <= hi is kept if given)."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    end = math.ceil(hi / step) * step
    k = round((end - start) / step)
    return [start + i * step for i in range(k + 1)]


class Svg:
    """A minimal SVG writer: elements are appended as strings, coordinates in pixels."""

    def __init__(self, width, height):
        self.w, self.h, self.items = width, height, []

    def rect(self, x, y, w, h, fill, title=None):
        t = f"<title>{escape(title)}</title>" if title else ""
        self.items.append(f"<rect x='{x:.1f}' y='{y:.1f}' width='{max(w, 0):.1f}' "
                          f"height='{max(h, 0):.1f}' fill='{fill}'>{t}</rect>")

    def line(self, x1, y1, x2, y2, stroke="#000", width=1, dash=None):
        d = f" stroke-dasharray='{dash}'" if dash else ""
        self.items.append(f"<line x1='{x1:.1f}' y1='{y1:.1f}' x2='{x2:.1f}' y2='{y2:.1f}' "
                          f"stroke='{stroke}' stroke-width='{width}'{d}/>")

    def polyline(self, pts, stroke, width=2):
        p = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        self.items.append(f"<polyline points='{p}' fill='none' stroke='{stroke}' "
                          f"stroke-width='{width}'/>")

    def circle(self, x, y, r, fill, title=None):
        t = f"<title>{escape(title)}</title>" if title else ""
        self.items.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='{r}' fill='{fill}'>{t}</circle>")

    def text(self, x, y, s, size=12, anchor="start", weight="normal", fill="#222", rotate=None):
        rot = f" transform='rotate({rotate} {x:.1f} {y:.1f})'" if rotate else ""
        self.items.append(f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' "
                          f"text-anchor='{anchor}' font-weight='{weight}' fill='{fill}'{rot}>"
                          f"{escape(str(s))}</text>")

    def render(self):
        return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{self.w}' height='{self.h}' "
                f"viewBox='0 0 {self.w} {self.h}' {FONT}>\n"
                f"<rect width='{self.w}' height='{self.h}' fill='#fff'/>\n"
                + "\n".join(self.items) + "\n</svg>\n")


def header(svg, title, caption):
    svg.text(16, 24, title, size=16, weight="bold")
    svg.text(16, 42, caption, size=11, fill="#555")


def legend_width(entries):
    return sum(30 + 6.5 * len(e[0]) for e in entries)


def min_width(caption, entries):
    """Width that fits the caption line and the legend (approximate glyph widths)."""
    return int(max(16 + 6.2 * len(caption) + 16, 70 + legend_width(entries) + 16))


def legend(svg, x, y, entries):
    """entries: [(label, colour, kind)] with kind 'box' or 'line'; laid out left to right."""
    for label, c, kind in entries:
        if kind == "line":
            svg.line(x, y - 4, x + 18, y - 4, stroke=c, width=3)
            svg.circle(x + 9, y - 4, 3, c)
        else:
            svg.rect(x, y - 10, 12, 12, c)
        svg.text(x + 22, y, label, size=11)
        x += 30 + 6.5 * len(label)


def y_axis(svg, x0, x1, top, bottom, ticks, fmt, label=None):
    """Grid lines and tick labels; returns the value -> pixel function."""
    lo, hi = ticks[0], ticks[-1]

    def y(v):
        return bottom - (v - lo) / (hi - lo) * (bottom - top)

    for t in ticks:
        svg.line(x0, y(t), x1, y(t), stroke="#000" if t == 0 else "#ddd", width=1)
        svg.text(x0 - 6, y(t) + 4, fmt(t), size=11, anchor="end", fill="#444")
    if label:
        svg.text(x0 - 48, (top + bottom) / 2, label, size=11, anchor="middle", fill="#444",
                 rotate=-90)
    return y


def bar_panels(title, caption, panels, series, fmt, value_fmt, y_label, overlay=False,
               shared_scale=True, panel_w=None):
    """Bars grouped by category, in one or more panels.

    panels: [(panel title, [(category, {series: value or (value, value2)})][, fmt])]: fmt
    (default `fmt`/`value_fmt`) formats that panel's ticks and values. With overlay, value2
    (>= value) is drawn as a lighter bar behind (e.g. p90 behind p50).
    """
    n_bars = len(series)
    bar_w = 22
    group_w = n_bars * bar_w + 28
    if panel_w is None:
        panel_w = max(220, max(len(p[1]) for p in panels) * group_w + 40)
    entries = [(s, colour(s, i), "box") for i, s in enumerate(series)]
    if overlay:
        entries.append(("solid p50 / light p90", "#bbb", "box"))
    width = max(70 + len(panels) * (panel_w + 60), min_width(caption, entries))
    if len(panels) == 1:
        panel_w = width - 90
    height = 360
    svg = Svg(width, height)
    header(svg, title, caption)

    def values(cats):
        for _, d in cats:
            for v in d.values():
                if v is None:
                    continue
                yield from (v if isinstance(v, tuple) else (v,))

    all_vals = [v for p in panels for v in values(p[1]) if v is not None]
    top, bottom = 86, height - 44
    for pi, panel in enumerate(panels):
        ptitle, cats = panel[0], panel[1]
        pfmt = panel[2] if len(panel) > 2 else fmt
        pvfmt = panel[2] if len(panel) > 2 else value_fmt
        vals = all_vals if shared_scale else [v for v in values(cats) if v is not None]
        ticks = nice_ticks(min([0] + vals), max([0] + vals) * 1.08 or 1)
        x0 = 70 + pi * (panel_w + 60)
        y = y_axis(svg, x0, x0 + panel_w, top, bottom, ticks, pfmt,
                   y_label if pi == 0 else None)
        if ptitle:
            svg.text(x0 + panel_w / 2, top - 12, ptitle, size=12, anchor="middle", weight="bold")
        gw = panel_w / max(1, len(cats))
        for ci, (cat, d) in enumerate(cats):
            gx = x0 + ci * gw + (gw - n_bars * bar_w) / 2
            for si, s in enumerate(series):
                v = d.get(s)
                if v is None:
                    continue
                v1, v2 = (v if isinstance(v, tuple) else (v, None))
                bx = gx + si * bar_w
                c = colour(s, si)
                if overlay and v2 is not None:
                    svg.rect(bx + 2, y(max(v2, 0)), bar_w - 4, abs(y(v2) - y(0)), lighten(c),
                             f"{s}: {pvfmt(v2)}")
                    svg.text(bx + bar_w / 2, y(max(v2, 0)) - 3, pvfmt(v2), size=9,
                             anchor="middle", fill="#777")
                svg.rect(bx + 2, y(max(v1, 0)), bar_w - 4, abs(y(v1) - y(0)), c,
                         f"{s}: {pvfmt(v1)}")
                if not overlay:
                    svg.text(bx + bar_w / 2, y(max(v1, 0)) - 3, pvfmt(v1), size=9,
                             anchor="middle", fill="#333")
                elif abs(y(v1) - y(0)) > 14:
                    svg.text(bx + bar_w / 2, y(max(v1, 0)) + 11, pvfmt(v1), size=9,
                             anchor="middle", fill="#fff")
                elif v2 is None or y(v1) - y(v2) > 24:
                    # A short bar: its value just above it (inside the light bar, if any).
                    svg.text(bx + bar_w / 2, y(max(v1, 0)) - 3, pvfmt(v1), size=9,
                             anchor="middle", fill="#222")
            svg.text(x0 + ci * gw + gw / 2, bottom + 18, cat, size=12, anchor="middle")
    legend(svg, 70, height - 8, entries)
    return svg


def line_panels(title, caption, xs, x_labels, panels, fmt, width_per=300):
    """panels: [(panel title, y label, {series: [y per x or None]})]; x categorical, evenly spaced."""
    width = 70 + len(panels) * (width_per + 70)
    height = 360
    svg = Svg(width, height)
    header(svg, title, caption)
    top, bottom = 86, height - 58
    order = []
    for pi, (ptitle, ylabel, data) in enumerate(panels):
        vals = [v for ys in data.values() for v in ys if v is not None]
        ticks = nice_ticks(min([0] + vals), max([0] + vals) * 1.08 or 1)
        x0 = 70 + pi * (width_per + 70)
        y = y_axis(svg, x0, x0 + width_per, top, bottom, ticks, fmt, ylabel)
        svg.text(x0 + width_per / 2, top - 12, ptitle, size=12, anchor="middle", weight="bold")
        step = width_per / max(1, len(xs))

        def x(i):
            return x0 + step * (i + 0.5)

        for i, lab in enumerate(x_labels):
            svg.text(x(i), bottom + 16, lab, size=11, anchor="middle")
        svg.text(x0 + width_per / 2, bottom + 32, "request body", size=11, anchor="middle",
                 fill="#444")
        for si, (s, ys) in enumerate(data.items()):
            if s not in order:
                order.append(s)
            c = colour(s, si)
            pts = [(x(i), y(v)) for i, v in enumerate(ys) if v is not None]
            if len(pts) > 1:
                svg.polyline(pts, c)
            for (px, py), v in zip(pts, [v for v in ys if v is not None]):
                svg.circle(px, py, 3.5, c, f"{s}: {fmt(v)}")
    legend(svg, 70, height - 8, [(s, colour(s, i), "line") for i, s in enumerate(order)])
    return svg


def pct(v):
    return f"{v * 100:.0f} %"


def ms(v):
    return f"{v:.0f}"


def secs(v):
    """Milliseconds shown in seconds."""
    return f"{v / 1000:.1f}"


def us(v):
    return f"{v:+.0f}" if v else "0"


def caption_of(data, command, extra=""):
    date = (data.get("date") or "")[:10]
    parts = [command or None, date or None, data.get("machine") or None]
    text = " · ".join(p for p in parts if p)
    return text + (f" · {extra}" if extra else "")


def plot_routing(data, command):
    runs = data.get("runs") or {}
    workloads, strategies = [], []
    for key in runs:
        w, s = key.split("/", 1)
        if w not in workloads:
            workloads.append(w)
        if s not in strategies:
            strategies.append(s)
    cap = caption_of(data, command, "7 emulated replicas behind Envoy")
    hit = [(w, {s: runs[f"{w}/{s}"].get("hit_rate") for s in strategies if f"{w}/{s}" in runs})
           for w in workloads]
    out = {"routing-hit-rate.svg": bar_panels(
        "Prefix-cache hit rate per strategy", cap, [("", hit)], strategies,
        pct, pct, "hit rate (replicas' /metrics)")}
    panels = []
    for w in workloads:
        cats = [("", {s: (runs[f"{w}/{s}"]["ttft_ms"]["p50"], runs[f"{w}/{s}"]["ttft_ms"]["p90"])
                          for s in strategies if f"{w}/{s}" in runs})]
        panels.append((w, cats))
    out["routing-ttft.svg"] = bar_panels(
        "Time to first token per strategy (lower is better)", cap, panels, strategies, ms, ms,
        "TTFT, ms", overlay=True, shared_scale=False)
    return out


def plot_overhead(data, command):
    rows = data.get("rows") or []
    sizes = sorted({r["body_bytes"] for r in rows})
    labels = [f"{s // 1024} KiB" if s % 1024 == 0 else f"{s} B" for s in sizes]
    names = []
    for r in rows:
        if r["strategy"] not in names:
            names.append(r["strategy"])

    def series(get):
        d = {}
        for n in names:
            by = {r["body_bytes"]: r for r in rows if r["strategy"] == n}
            d[n] = [get(by[s]) if s in by else None for s in sizes]
        return d

    panels = [
        ("added p50 latency (c=1)", "µs vs no filter",
         series(lambda r: r["latency"]["added_p50_ms"] * 1000)),
        ("added p99 latency (c=1)", "µs vs no filter",
         series(lambda r: r["latency"]["added_p99_ms"] * 1000)),
        ("added Envoy CPU per request", "µs vs no filter",
         series(lambda r: r["throughput"].get("added_cpu_us_per_request"))),
    ]
    cap = caption_of(data, command, "one Envoy, --concurrency 1, medians over rounds")
    return {"overhead.svg": line_panels("Filter overhead against request body size", cap, sizes,
                                        labels, panels, us, width_per=260)}


def plot_llama(data, command):
    runs = data.get("runs") or {}
    strategies = list(runs)
    share = {s: runs[s].get("usage_cached_share") for s in strategies}
    pred = {s: (runs[s].get("filter_predicted_tokens") / runs[s]["filter_prompt_tokens"]
                if runs[s].get("filter_predicted_tokens") is not None
                and runs[s].get("filter_prompt_tokens") else None) for s in strategies}
    ttft = {s: (runs[s].get("ttft_p50_ms"), runs[s].get("ttft_p90_ms")) for s in strategies
            if runs[s].get("ttft_p50_ms") is not None}
    cap = caption_of(data, command, "3 x llama-server (SmolLM2-135M) behind Envoy")
    cats = [("delivered (engine)", share)]
    if any(v is not None for v in pred.values()):
        cats.append(("predicted (filter)", pred))
    svg = bar_panels("Real engines: cached share of prompt tokens, TTFT", cap,
                     [("cached share of prompt tokens", cats),
                      ("TTFT, s", [("p50", {s: v[0] for s, v in ttft.items()}),
                                       ("p90", {s: v[1] for s, v in ttft.items()})], secs)],
                     strategies, pct, pct, "", shared_scale=False)
    return {"llama.svg": svg}


PARTS = {"routing": plot_routing, "overhead": plot_overhead, "llama": plot_llama}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--since", type=float, default=0,
                    help="only parts whose JSON was written at or after this epoch time")
    ap.add_argument("--command", default="", help="the command shown in each plot's caption")
    ap.add_argument("--machine", default="",
                    help="the machine shown in the caption when the JSON does not name it")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    wrote = []
    for part, fn in PARTS.items():
        path = os.path.join(args.bench_dir, f"{part}.json")
        if not os.path.exists(path) or os.path.getmtime(path) < args.since:
            continue
        with open(path) as f:
            data = json.load(f)
        # Date and machine for the caption: the JSON's, else the file's time and --machine.
        if not data.get("date"):
            mtime = datetime.fromtimestamp(os.path.getmtime(path), timezone.utc)
            data["date"] = mtime.isoformat(timespec="seconds")
        data.setdefault("machine", args.machine)
        for name, svg in fn(data, args.command).items():
            out = os.path.join(args.out_dir, name)
            with open(out, "w") as f:
                f.write(svg.render())
            wrote.append(out)
    for w in wrote:
        print(f"plot: {w}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
