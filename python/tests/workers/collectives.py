"""Every collective torch calls on CPU tensors, every element type and operator, on
ringccl against a reference: the same call on gloo where gloo takes it, and always
the exact result computed from every rank's input. ringccl's results must be
bit-identical on every rank. Prints RESULT {"checked": N, "failures": [...]}."""

import itertools
import sys

import torch
import torch.distributed as dist

from common import init, result

rank, size = init("ringccl")
gloo = dist.new_group(backend="gloo")
assert dist.get_backend() == "ringccl", dist.get_backend()
R = dist.ReduceOp

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
DTYPES = FLOATS + INTS + [torch.bool]
failures = []
checked = 0


def fail(what, detail):
    failures.append(f"rank {rank}: {what}: {detail}")


def make(dtype, n, seed):
    """Rank-dependent values, small enough that integer products stay meaningful."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype in FLOATS:
        return (torch.rand(n, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, (n,), generator=g).to(dtype)


def everyones(t):
    """Every rank's `t` (through gloo, as bytes, so any element type travels)."""
    raw = t.contiguous().view(-1).view(torch.uint8) if t.numel() else t.view(torch.uint8)
    rows = [torch.empty_like(raw) for _ in range(size)]
    dist.all_gather(rows, raw, group=gloo)
    return [r.view(t.dtype).view(t.shape) for r in rows]


def fold(op, rows):
    """The exact reduction of `rows` in rank order (in float64 for floats)."""
    dtype = rows[0].dtype
    wide = [r.double() if dtype in FLOATS else r for r in rows]
    if dtype == torch.bool:
        wide = [r.to(torch.uint8) for r in rows]
    out = wide[0].clone()
    for r in wide[1:]:
        if op in (R.SUM, R.AVG):
            out = out + r
        elif op == R.PRODUCT:
            out = out * r
        elif op == R.MIN:
            out = torch.minimum(out, r)
        elif op == R.MAX:
            out = torch.maximum(out, r)
        elif op == R.BAND:
            out = out & r
        elif op == R.BOR:
            out = out | r
        elif op == R.BXOR:
            out = out ^ r
    if op == R.AVG:
        out = out / size
    if dtype == torch.bool:
        return out.bool() if op != R.BXOR else (out % 2).bool()
    return out.to(dtype)


def close(got, want, what):
    global checked
    checked += 1
    if got.dtype in FLOATS:
        tol = {torch.float16: 1e-2, torch.bfloat16: 8e-2}.get(got.dtype, 1e-5)
        ok = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
    else:
        ok = torch.equal(got, want)
    if not ok:
        fail(what, f"got {got.tolist()[:8]}, want {want.tolist()[:8]}")


def same_everywhere(t, what):
    """ringccl's result must be bit-identical on every rank."""
    global checked
    checked += 1
    bits = [r.reshape(-1).view(torch.uint8) for r in everyones(t)]
    if any(not torch.equal(b, bits[0]) for b in bits):
        fail(what, "ranks disagree bit for bit")


def try_gloo(fn):
    """fn() on gloo, or None when gloo refuses the call."""
    try:
        return fn()
    except (RuntimeError, ValueError):
        return None


def ops_for(dtype):
    ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX]
    if dtype in FLOATS:
        ops += [R.AVG]
    if dtype in INTS or dtype == torch.bool:
        ops += [R.BAND, R.BOR, R.BXOR]
    return ops


def gloo_takes(fn):
    """Runs fn() on gloo; False when gloo refuses the call (AVG, bitwise operators...)."""
    try:
        fn()
        return True
    except (RuntimeError, ValueError):
        return False


# --- all_reduce: every type x operator, sync and async -------------------------------
for dtype, n in itertools.product(DTYPES, [1, 37, 5000]):
    for op in ops_for(dtype):
        x = make(dtype, n, seed=n)
        want = fold(op, everyones(x))
        what = f"all_reduce {dtype} x{n} {op}"
        mine = x.clone()
        work = dist.all_reduce(mine, op=op, async_op=(n == 37))
        if work is not None:
            work.wait()
        close(mine, want, what)
        same_everywhere(mine, what)
        theirs = x.clone()
        if gloo_takes(lambda: dist.all_reduce(theirs, op=op, group=gloo)):
            close(mine, theirs, what + " vs gloo")

# PREMUL_SUM (floats): every rank's input times the factor, summed.
for dtype in FLOATS:
    x = make(dtype, 64, seed=7)
    mine = x.clone()
    dist.all_reduce(mine, op=dist._make_nccl_premul_sum(0.5))
    close(mine, fold(R.SUM, [r * 0.5 for r in everyones(x)]), f"all_reduce {dtype} premul_sum")

# A non-contiguous tensor (a transposed view), as gloo treats it.
base = make(torch.float32, 12, seed=3).view(3, 4)
mine, theirs = base.clone().t(), base.clone().t()
dist.all_reduce(mine)
dist.all_reduce(theirs, group=gloo)
close(mine, theirs, "all_reduce of a transposed view vs gloo")
close(mine.contiguous(), fold(R.SUM, everyones(base.t().contiguous())), "all_reduce of a transposed view")

# Coalesced: several tensors in one call (int16 is reduced widened, then narrowed).
for dtype in (torch.float32, torch.int16):
    xs = [make(dtype, k, seed=k) for k in (3, 10, 1)]
    mine = [x.clone() for x in xs]
    dist.all_reduce_coalesced(mine)
    for x, m in zip(xs, mine):
        close(m, fold(R.SUM, everyones(x)), f"all_reduce_coalesced {dtype}")

# --- broadcast, reduce -------------------------------------------------------------
for dtype, root in itertools.product(DTYPES, range(size)):
    x = make(dtype, 33, seed=11)
    mine = x.clone()
    dist.broadcast(mine, root)
    close(mine, everyones(x)[root], f"broadcast {dtype} from {root}")
for dtype, op in itertools.product(FLOATS + INTS, [R.SUM, R.MAX]):
    root = size - 1
    x = make(dtype, 21, seed=13)
    want = fold(op, everyones(x))
    mine = x.clone()
    dist.reduce(mine, root, op=op)
    close(mine, want if rank == root else x, f"reduce {dtype} {op} to {root}")

# Bitwise reduce: the root gets the fold, the others keep their tensors (as gloo).
x = make(torch.int32, 16, seed=31)
want = fold(R.BXOR, everyones(x))
mine = x.clone()
dist.reduce(mine, 0, op=R.BXOR)
close(mine, want if rank == 0 else x, "reduce int32 bxor to 0")

# --- all_gather, reduce_scatter: list and single-tensor forms ----------------------
for dtype in DTYPES:
    x = make(dtype, 9, seed=17)
    rows = everyones(x)
    outs = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(outs, x)
    for r in range(size):
        close(outs[r], rows[r], f"all_gather {dtype} block {r}")
    flat = torch.empty(size * 9, dtype=dtype)
    work = dist.all_gather_into_tensor(flat, x, async_op=True)
    work.wait()
    close(flat, torch.cat(rows), f"all_gather_into_tensor {dtype}")
# In place: the input is this rank's block of the output (FSDP's use).
flat = torch.zeros(size * 4)
flat[rank * 4 : (rank + 1) * 4] = float(rank + 1)
dist.all_gather_into_tensor(flat, flat[rank * 4 : (rank + 1) * 4])
close(flat, torch.cat([torch.full((4,), float(r + 1)) for r in range(size)]), "all_gather_into_tensor in place")

for dtype, op in itertools.product(FLOATS + INTS + [torch.bool], [R.SUM, R.MAX]):
    x = make(dtype, size * 5, seed=19)
    want = fold(op, everyones(x))[rank * 5 : (rank + 1) * 5]
    out = torch.empty(5, dtype=dtype)
    dist.reduce_scatter_tensor(out, x, op=op)
    close(out, want, f"reduce_scatter_tensor {dtype} {op}")
    out2 = torch.empty(5, dtype=dtype)
    dist.reduce_scatter(out2, list(x.split(5)), op=op)
    close(out2, want, f"reduce_scatter {dtype} {op}")

# --- gather, scatter ----------------------------------------------------------------
for dtype in [torch.float32, torch.int16, torch.bool]:
    root = 0
    x = make(dtype, 6, seed=23)
    rows = everyones(x)
    outs = [torch.empty_like(x) for _ in range(size)] if rank == root else None
    dist.gather(x, outs, dst=root)
    if rank == root:
        for r in range(size):
            close(outs[r], rows[r], f"gather {dtype} block {r}")
    root = size - 1
    blocks = [torch.full((6,), r + 1).to(dtype) for r in range(size)]
    out = torch.empty(6, dtype=dtype)
    dist.scatter(out, blocks if rank == root else None, src=root)
    close(out, blocks[rank], f"scatter {dtype} from {root}")

# --- all_to_all: even, uneven, list form ------------------------------------------
x = torch.arange(size * 3, dtype=torch.float32) + 100 * rank
out = torch.empty(size * 3)
dist.all_to_all_single(out, x)
close(out, torch.cat([torch.arange(rank * 3, rank * 3 + 3, dtype=torch.float32) + 100 * r for r in range(size)]), "all_to_all_single even")
# Uneven: rank r sends (r + q + 1) rows of width 2 to rank q.
send_counts = [rank + q + 1 for q in range(size)]
recv_counts = [r + rank + 1 for r in range(size)]
x = torch.cat([torch.full((c, 2), float(100 * rank + q)) for q, c in enumerate(send_counts)])
out = torch.empty(sum(recv_counts), 2)
dist.all_to_all_single(out, x, recv_counts, send_counts)
close(out, torch.cat([torch.full((c, 2), float(100 * r + rank)) for r, c in enumerate(recv_counts)]), "all_to_all_single uneven")
ins = [torch.full((q + 1,), rank * 10 + q, dtype=torch.int64) for q in range(size)]
outs = [torch.empty(rank + 1, dtype=torch.int64) for _ in range(size)]
dist.all_to_all(outs, ins)
for r in range(size):
    close(outs[r], torch.full((rank + 1,), r * 10 + rank, dtype=torch.int64), f"all_to_all list block {r}")

# --- send / recv with tags, barrier, object collectives, monitored_barrier --------
if size >= 2:
    if rank == 0:
        dist.send(torch.tensor([1.5, 2.5]), 1, tag=7)
        work = dist.isend(torch.tensor([9], dtype=torch.int32), 1, tag=8)
        work.wait()
    elif rank == 1:
        a, b = torch.empty(2), torch.empty(1, dtype=torch.int32)
        dist.recv(a, 0, tag=7)
        dist.irecv(b, 0, tag=8).wait()
        close(a, torch.tensor([1.5, 2.5]), "send/recv tag 7")
        close(b, torch.tensor([9], dtype=torch.int32), "isend/irecv tag 8")
dist.barrier()
objs = [None] * size
dist.all_gather_object(objs, {"rank": rank, "name": f"r{rank}"})
if objs != [{"rank": r, "name": f"r{r}"} for r in range(size)]:
    fail("all_gather_object", objs)
lst = [{"from": rank}] if rank == 0 else [None]
dist.broadcast_object_list(lst, src=0)
if lst != [{"from": 0}]:
    fail("broadcast_object_list", lst)
got = [None]
dist.scatter_object_list(got, [f"to {r}" for r in range(size)] if rank == 0 else None, src=0)
if got != [f"to {rank}"]:
    fail("scatter_object_list", got)
dist.monitored_barrier(wait_all_ranks=True)
checked += 4

# Many async calls in flight at once, waited in reverse.
xs = [torch.full((100,), float(rank + i)) for i in range(20)]
works = [dist.all_reduce(x, async_op=True) for x in xs]
for w in reversed(works):
    w.wait()
for i, x in enumerate(xs):
    close(x, torch.full((100,), float(sum(r + i for r in range(size)))), f"async all_reduce #{i}")
# A future's callback may issue calls on the group, even blocking ones (it runs on the
# group's worker once the call's turn has passed on).
inner = []


def chained(done):
    t = torch.ones(2)
    dist.all_reduce(t)
    inner.append(float(t[0]))
    return done.value()


dist.all_reduce(torch.ones(3), async_op=True).get_future().then(chained).wait()
close(torch.tensor(inner), torch.tensor([float(size)]), "a blocking call in a future's callback")
fut = dist.all_reduce(torch.ones(3), async_op=True).get_future()
value = fut.wait()
close(value[0], torch.full((3,), float(size)), "future value")

# Empty tensors (DDP sends them: an empty tensor's address need not be aligned).
for dtype in (torch.int64, torch.float32):
    empty = torch.empty(0, dtype=dtype)
    dist.all_reduce(empty)
    dist.broadcast(empty, 0)
    dist.all_reduce(empty, async_op=True).wait()
    checked += 1

# all_gather_coalesced: outputs[r][i] is rank r's input i.
ins = [torch.full((2,), float(rank)), torch.full((3,), 10.0 * rank)]
outs = [[torch.empty(2), torch.empty(3)] for _ in range(size)]
dist.all_gather_coalesced(outs, ins)
for r in range(size):
    close(outs[r][0], torch.full((2,), float(r)), f"all_gather_coalesced block {r} tensor 0")
    close(outs[r][1], torch.full((3,), 10.0 * r), f"all_gather_coalesced block {r} tensor 1")

# Complex numbers: summed as pairs of reals.
z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64) * (rank + 1)
dist.all_reduce(z)
close(torch.view_as_real(z), torch.view_as_real(torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64) * sum(range(1, size + 1))), "all_reduce complex64")

# Groups formed from this one: new_group (through the store) and split_group.
pair = dist.new_group([0, 1])
if rank in (0, 1):
    x = torch.full((2,), float(rank + 1))
    dist.all_reduce(x, group=pair)
    close(x, torch.full((2,), 3.0), "all_reduce on new_group([0, 1])")
    if dist.get_backend(pair) != "ringccl":
        fail("new_group", dist.get_backend(pair))
split = dist.split_group(split_ranks=[[0], list(range(1, size))])
x = torch.full((1,), float(rank + 1))
dist.all_reduce(x, group=split)
close(x, torch.full((1,), 1.0 if rank == 0 else float(sum(range(2, size + 1)))), "all_reduce on split_group")

dist.destroy_process_group()
result({"checked": checked, "failures": failures[:50]})
sys.exit(1 if failures else 0)
