"""Medians of the runs collected by compare-peers.sh, side by side, with ratios."""
import collections
import pathlib
import statistics
import sys

out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/compare-peers")
UNIT = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}
COLS = {"allreduce": "all_reduce", "barrier": "barrier", "broadcast": "broadcast"}


def peer(path):
    """(op, bytes) -> lists of (us, busbw) from the peers' table format."""
    rows = collections.defaultdict(list)
    for line in path.read_text().splitlines() if path.exists() else []:
        f = line.split()
        if not f or f[0] not in COLS:
            continue
        if f[0] == "barrier":
            rows[("barrier", 0)].append((float(f[4]), None))
        else:
            size = int(f[1]) * UNIT[f[2]]
            rows[(COLS[f[0]], size)].append((float(f[5]), float(f[-1])))
    return rows


def ours(path):
    rows = collections.defaultdict(list)
    coll = None
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.startswith("# ringccl-bench "):
            coll = line.split()[2].rstrip(":")
            continue
        f = line.split()
        if len(f) == 11 and f[0].isdigit():
            rows[(coll, int(f[0]))].append((float(f[5]), float(f[7])))
    return rows


def med(values, i):
    vals = [v[i] for v in values if v[i] is not None]
    return statistics.median(vals) if vals else None


print("| case | N | ringccl TCP | ringccl shm | PyTorch gloo | OpenMPI TCP | PyTorch / ringccl TCP | PyTorch / ringccl shm |")
print("|---|---|---|---|---|---|---|---|")
for n in (2, 4):
    r, t, m = ours(out / f"ringccl_N{n}.txt"), peer(out / f"torch_N{n}.txt"), peer(out / f"mpi_tcp_N{n}.txt")
    sh = ours(out / f"ringccl_shm_N{n}.txt")
    for key in [("all_reduce", 8), ("all_reduce", 1 << 20), ("all_reduce", 64 << 20), ("barrier", 0), ("broadcast", 64 << 20)]:
        def cell(rows):
            if key not in rows:
                return "—", None
            us, bw = med(rows[key], 0), med(rows[key], 1)
            text = f"{us:.1f} us" if us < 10000 else f"{us / 1000:.1f} ms"
            if bw and key[1] >= 1 << 20:
                text += f" / {bw:.2f} GB/s"
            return text, us
        (rt, ru), (st, su), (tt, tu), (mt, _) = cell(r), cell(sh), cell(t), cell(m)
        ratio = f"{tu / ru:.2f}x" if ru and tu else "—"
        ratio_shm = f"{tu / su:.2f}x" if su and tu else "—"
        name = f"{key[0]} {key[1]} B" if key[1] else key[0]
        print(f"| {name} | {n} | {rt} | {st} | {tt} | {mt} | {ratio} | {ratio_shm} |")
