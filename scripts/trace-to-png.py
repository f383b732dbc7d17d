#!/usr/bin/env python3
"""Draws a ringccl timeline (a Chrome trace from `ringrun --trace DIR`, DIR/trace.json,
or one rank's DIR/rank-<r>.json) as a PNG: one row per rank and row of the trace
(collectives, ddp, trainer, ...), spans coloured by kind, a time axis in milliseconds.

    python3 scripts/trace-to-png.py DIR/trace.json timeline.png [--from MS] [--to MS]
        [--width PX] [--title TEXT]

--from/--to pick a window, in milliseconds from the first span (default: everything).
Python's standard library only: the PNG is written with zlib and struct, the labels with
a built-in 5x8 pixel font (upper case is drawn as lower case). A trace whose closing
bracket is missing (a rank that was killed) is read line by line.
"""

import argparse
import json
import math
import struct
import sys
import zlib

# --- the font: 5x7 glyphs (5x8 with descenders), '#' = ink ------------------------------------------------

GLYPHS = {
    "0": [".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."],
    "1": ["..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."],
    "2": [".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"],
    "3": ["#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."],
    "4": ["...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."],
    "5": ["#####", "#....", "####.", "....#", "....#", "#...#", ".###."],
    "6": ["..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."],
    "7": ["#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."],
    "8": [".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."],
    "9": [".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."],
    "a": [".....", ".....", ".###.", "....#", ".####", "#...#", ".####"],
    "b": ["#....", "#....", "#.##.", "##..#", "#...#", "#...#", "####."],
    "c": [".....", ".....", ".###.", "#....", "#....", "#...#", ".###."],
    "d": ["....#", "....#", ".##.#", "#..##", "#...#", "#...#", ".####"],
    "e": [".....", ".....", ".###.", "#...#", "#####", "#....", ".###."],
    "f": ["..##.", ".#..#", ".#...", "###..", ".#...", ".#...", ".#..."],
    "g": [".....", ".....", ".####", "#...#", "#...#", ".####", "....#", ".###."],
    "h": ["#....", "#....", "#.##.", "##..#", "#...#", "#...#", "#...#"],
    "i": ["..#..", ".....", ".##..", "..#..", "..#..", "..#..", ".###."],
    "j": ["...#.", ".....", "..##.", "...#.", "...#.", "...#.", "#..#.", ".##.."],
    "k": ["#....", "#....", "#..#.", "#.#..", "##...", "#.#..", "#..#."],
    "l": [".##..", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."],
    "m": [".....", ".....", "##.#.", "#.#.#", "#.#.#", "#...#", "#...#"],
    "n": [".....", ".....", "#.##.", "##..#", "#...#", "#...#", "#...#"],
    "o": [".....", ".....", ".###.", "#...#", "#...#", "#...#", ".###."],
    "p": [".....", ".....", "####.", "#...#", "#...#", "####.", "#....", "#...."],
    "q": [".....", ".....", ".####", "#...#", "#...#", ".####", "....#", "....#"],
    "r": [".....", ".....", "#.##.", "##..#", "#....", "#....", "#...."],
    "s": [".....", ".....", ".####", "#....", ".###.", "....#", "####."],
    "t": [".#...", ".#...", "###..", ".#...", ".#...", ".#..#", "..##."],
    "u": [".....", ".....", "#...#", "#...#", "#...#", "#..##", ".##.#"],
    "v": [".....", ".....", "#...#", "#...#", "#...#", ".#.#.", "..#.."],
    "w": [".....", ".....", "#...#", "#...#", "#.#.#", "#.#.#", ".#.#."],
    "x": [".....", ".....", "#...#", ".#.#.", "..#..", ".#.#.", "#...#"],
    "y": [".....", ".....", "#...#", "#...#", "#...#", ".####", "....#", ".###."],
    "z": [".....", ".....", "#####", "...#.", "..#..", ".#...", "#####"],
    " ": ["....."] * 8,
    ".": [".....", ".....", ".....", ".....", ".....", ".##..", ".##.."],
    ",": [".....", ".....", ".....", ".....", ".....", ".##..", "..#..", ".#..."],
    ":": [".....", ".##..", ".##..", ".....", ".##..", ".##..", "....."],
    "-": [".....", ".....", ".....", "#####", ".....", ".....", "....."],
    "_": [".....", ".....", ".....", ".....", ".....", ".....", "#####"],
    "/": [".....", "....#", "...#.", "..#..", ".#...", "#....", "....."],
    "(": ["...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."],
    ")": [".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."],
    "[": [".###.", ".#...", ".#...", ".#...", ".#...", ".#...", ".###."],
    "]": [".###.", "...#.", "...#.", "...#.", "...#.", "...#.", ".###."],
    "#": [".#.#.", ".#.#.", "#####", ".#.#.", "#####", ".#.#.", ".#.#."],
    "%": ["##...", "##..#", "...#.", "..#..", ".#...", "#..##", "...##"],
    "+": [".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."],
    "=": [".....", ".....", "#####", ".....", "#####", ".....", "....."],
    "|": ["..#.."] * 8,
    "?": [".###.", "#...#", "....#", "...#.", "..#..", ".....", "..#.."],
}
# Seven rows, and an eighth for the descenders of g, j, p, q, y and the comma.
for _glyph in GLYPHS.values():
    _glyph.extend(["....."] * (8 - len(_glyph)))
GLYPH_W, GLYPH_H, ADVANCE = 5, 8, 6

# --- colours -------------------------------------------------------------------------

WHITE = (255, 255, 255)
INK = (40, 40, 40)
GRID = (225, 225, 225)
LANE = (246, 246, 246)
FAILED = (220, 30, 30)
KIND_COLOURS = {
    "all_reduce": (66, 133, 244),
    "broadcast": (251, 140, 0),
    "barrier": (120, 120, 120),
    "all_gather": (52, 168, 83),
    "reduce_scatter": (0, 150, 136),
    "reduce": (142, 36, 170),
    "all_to_all": (141, 110, 99),
    "send/recv": (236, 64, 122),
    "bucket": (249, 200, 14),
    "forward": (255, 171, 145),
    "backward": (229, 57, 53),
    "ddp finish": (96, 96, 96),
}
OTHER_COLOURS = [(124, 179, 66), (0, 172, 193), (171, 71, 188), (255, 112, 67)]


def darker(rgb):
    return tuple(c * 3 // 5 for c in rgb)


def colour_of(name, others):
    """The colour of a span called `name` (DDP's "bucket N" share one)."""
    key = "bucket" if name.startswith("bucket ") else name
    if key in KIND_COLOURS:
        return KIND_COLOURS[key]
    if key not in others:
        others[key] = OTHER_COLOURS[len(others) % len(OTHER_COLOURS)]
    return others[key]


# --- the canvas ----------------------------------------------------------------------


class Canvas:
    def __init__(self, width, height):
        self.width, self.height = width, height
        self.rows = [bytearray(WHITE * width) for _ in range(height)]

    def rect(self, x0, y0, x1, y1, rgb):
        """Fills [x0, x1) x [y0, y1), clipped."""
        x0, x1 = max(0, int(x0)), min(self.width, int(x1))
        y0, y1 = max(0, int(y0)), min(self.height, int(y1))
        if x0 >= x1:
            return
        run = bytes(rgb) * (x1 - x0)
        for y in range(y0, y1):
            self.rows[y][3 * x0 : 3 * x1] = run

    def text(self, x, y, text, rgb=INK, scale=1):
        """Draws `text` with its top-left corner at (x, y); returns the end x."""
        for ch in text.lower():
            glyph = GLYPHS.get(ch, GLYPHS["?"])
            for gy, line in enumerate(glyph):
                for gx, bit in enumerate(line):
                    if bit == "#":
                        px, py = x + gx * scale, y + gy * scale
                        self.rect(px, py, px + scale, py + scale, rgb)
            x += ADVANCE * scale
        return x

    def png(self):
        def chunk(kind, data):
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        raw = b"".join(b"\x00" + bytes(row) for row in self.rows)
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )


# --- reading the trace ---------------------------------------------------------------


def read_events(path):
    """The events of a trace file; an unfinished one (no closing bracket, a last line cut
    short) is read line by line."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
        return data["traceEvents"] if isinstance(data, dict) else data
    except ValueError:
        events = []
        for line in text.splitlines():
            line = line.strip().lstrip(",").rstrip(",")
            if line in ("", "[", "]"):
                continue
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
        return events


def lanes_of(events):
    """(pid, tid) -> label, spans; in the order of ranks, then rows."""
    processes, threads, order, spans = {}, {}, {}, {}
    for e in events:
        pid, tid = e.get("pid"), e.get("tid")
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[pid] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(pid, tid)] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_sort_index":
            order[(pid, tid)] = e["args"]["sort_index"]
        elif e.get("ph") == "X":
            spans.setdefault((pid, tid), []).append(e)
    lanes = []
    for key in sorted(spans, key=lambda k: (k[0], order.get(k, k[1] or 0))):
        pid, tid = key
        label = "%s %s" % (processes.get(pid, "pid %s" % pid), threads.get(key, "tid %s" % tid))
        lanes.append((pid, label, spans[key]))
    return lanes


def nice_step(span_ms, ticks=10):
    raw = span_ms / ticks
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for m in (1, 2, 5, 10):
        if raw <= m * power:
            return m * power
    return 10 * power


def fmt_ms(value, step):
    decimals = max(0, -int(math.floor(math.log10(step)))) if step < 1 else 0
    return "%.*f" % (decimals, value)


def render(events, width, start_ms, end_ms, title):
    lanes = lanes_of(events)
    if not lanes:
        sys.exit("no spans in the trace")
    t0 = min(s["ts"] for _, _, spans in lanes for s in spans)
    t_end = max(s["ts"] + s.get("dur", 0) for _, _, spans in lanes for s in spans)
    lo = t0 + 1000.0 * (start_ms or 0.0)
    hi = t0 + 1000.0 * end_ms if end_ms is not None else t_end
    if hi <= lo:
        sys.exit("empty window: --to must be after --from")

    label_w = 8 + ADVANCE * max(len(label) for _, label, _ in lanes)
    left, right, top = label_w + 8, 16, 34
    lane_h, lane_gap, rank_gap = 16, 3, 9
    legend_h, axis_h = 30, 28
    heights, prev = [], None
    for pid, _, _ in lanes:
        heights.append(rank_gap if prev is not None and pid != prev else 0)
        prev = pid
    plot_h = sum(heights) + len(lanes) * (lane_h + lane_gap)
    height = top + plot_h + axis_h + legend_h
    canvas = Canvas(width, height)
    plot_w = width - left - right
    x_of = lambda us: left + (us - lo) * plot_w / (hi - lo)

    canvas.text(8, 8, title, scale=2)
    step = nice_step((hi - lo) / 1000.0)
    first_tick = math.ceil((lo - t0) / 1000.0 / step) * step
    tick = first_tick
    while t0 + 1000.0 * tick <= hi + 1e-6:
        x = int(x_of(t0 + 1000.0 * tick))
        canvas.rect(x, top - 2, x + 1, top + plot_h, GRID)
        tick += step

    others, seen = {}, []
    y = top
    for (pid, label, spans), gap in zip(lanes, heights):
        y += gap
        canvas.rect(left, y, left + plot_w, y + lane_h, LANE)
        canvas.text(8, y + (lane_h - GLYPH_H) // 2, label)
        for s in sorted(spans, key=lambda s: s["ts"]):
            a, b = s["ts"], s["ts"] + s.get("dur", 0)
            if b < lo or a > hi:
                continue
            x0, x1 = x_of(max(a, lo)), x_of(min(b, hi))
            x1 = max(x1, x0 + 1)
            rgb = colour_of(s["name"], others)
            canvas.rect(x0, y + 1, x1, y + lane_h - 1, rgb)
            if x1 - x0 >= 4:  # a darker first column keeps adjacent spans apart
                canvas.rect(x0, y + 1, x0 + 1, y + lane_h - 1, darker(rgb))
            number = s["name"][len("bucket "):] if s["name"].startswith("bucket ") else ""
            if number and x1 - x0 >= ADVANCE * len(number) + 4:
                canvas.text(x0 + 3, y + (lane_h - GLYPH_H) // 2 + 1, number)
            failed = s.get("args", {}).get("status") == "failed"
            if failed:
                canvas.rect(x0, y + lane_h - 4, x1, y + lane_h - 1, FAILED)
            key = "bucket" if s["name"].startswith("bucket ") else s["name"]
            if key not in seen:
                seen.append(key)
        y += lane_h + lane_gap

    axis_y = top + plot_h + 2
    canvas.rect(left, axis_y, left + plot_w, axis_y + 1, INK)
    tick = first_tick
    while t0 + 1000.0 * tick <= hi + 1e-6:
        x = int(x_of(t0 + 1000.0 * tick))
        canvas.rect(x, axis_y, x + 1, axis_y + 5, INK)
        text = fmt_ms(tick, step)
        canvas.text(x - ADVANCE * len(text) // 2, axis_y + 8, text)
        tick += step
    canvas.text(left + plot_w - ADVANCE * 2, axis_y + 18, "ms")

    x, ly = left, axis_y + axis_h
    for key in seen:
        rgb = colour_of(key if key != "bucket" else "bucket 0", others)
        canvas.rect(x, ly, x + 12, ly + 9, rgb)
        x = canvas.text(x + 16, ly + 1, key if key != "bucket" else "ddp bucket") + 14
    return canvas.png()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="a Chrome trace (DIR/trace.json or DIR/rank-<r>.json)")
    parser.add_argument("png", help="the image to write")
    parser.add_argument("--from", dest="start", type=float, default=None,
                        help="window start, ms after the first span")
    parser.add_argument("--to", dest="end", type=float, default=None,
                        help="window end, ms after the first span")
    parser.add_argument("--width", type=int, default=1400, help="image width in pixels")
    parser.add_argument("--title", default="ringccl timeline", help="title drawn on top")
    args = parser.parse_args()
    png = render(read_events(args.trace), args.width, args.start, args.end, args.title)
    with open(args.png, "wb") as f:
        f.write(png)
    print("%s: %d bytes" % (args.png, len(png)))


if __name__ == "__main__":
    main()
