#!/usr/bin/env python3
"""PyTorch reference rows for `cuda-mem bench --sections peers` (issue 21, section 4).

Measures, where PyTorch with CUDA is importable, the operations of the bench's `peers`
section the way a PyTorch user does them, with the same method, and prints rows with the same
`test` / `config` / `bytes` / `unit` keys, so that they sit beside the bench's cuda-mem and
cudarc figures:

- copy_async_call: host time of one 4 KiB `dev.copy_(pinned, non_blocking=True)` (and back),
  while the current stream is held by `torch.cuda._sleep` (only the host side is timed);
- copy_pinned / copy_pageable: 4 KiB, 1 MiB, 256 MiB, both ways: a loop of copies then a
  synchronize, wall clock (pinned: `non_blocking=True`; pageable: `non_blocking=False`);
- stream_alloc_free: `torch.empty(n, device="cuda")` + release, host time per pair in batches
  of 200 (the caching device allocator);
- pinned_alloc_free: `torch.empty(n, pin_memory=True)` + release, in batches of 20 (the
  caching host allocator);
- handoff: a 4 KiB copy host to device on stream A, device to host on stream B, host time per
  pair, ordered as PyTorch asks of its user (`B.wait_stream(A)`, then `A.wait_stream(B)`);
- graph_replay: 25 x (4 KiB copy from pinned memory, `zero_()`, 4 KiB device copy) captured
  once with `torch.cuda.graph` and replayed (`CUDAGraph.replay`): host time per replay and end
  to end (replay and synchronize), medians of 200 replays.

Run on the GPU machine (PyTorch lives in /opt/torch/.venv there):

    /opt/torch/.venv/bin/python scripts/torch-ref.py [--samples 15] [--json torch-ref.json]
    /opt/torch/.venv/bin/python scripts/torch-ref.py --bench bench.json   # beside a bench run

`--bench FILE` reads a `cuda-mem bench --json` file and prints each `peers` row with the
PyTorch figure beside cuda-mem's and cudarc's, and the speed of cuda-mem over PyTorch. The
rows come from another process than the bench's, so they are not interleaved with it: run
both on an otherwise idle machine, one after the other. Without PyTorch or without a GPU the
script says so and exits 0 (1 with --require).
"""
import argparse
import json
import statistics
import sys
import time

KIB, MIB = 1 << 10, 1 << 20
COPY_SIZES = [4 * KIB, MIB, 256 * MIB]
ALLOC_SIZES = [4 * KIB, MIB]
CALLS = 256
ALLOC_BATCH = 200
PINNED_PAIRS = 20
HANDOFF_PAIRS = 200


def fmt_size(b):
    for unit, name in ((1 << 30, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if b >= unit and b % unit == 0:
            return f"{b // unit}{name}"
    return f"{b}B"


def reps_for(b):
    """The bench's repetitions per copy sample (`reps_for`, capped at 64 in `peers`)."""
    return max(1, min(256, (512 * MIB) // max(b, 1), 64))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=15, help="timed samples per row (median)")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    ap.add_argument("--bench", metavar="FILE", help="a `cuda-mem bench --json` file to sit beside")
    ap.add_argument("--require", action="store_true", help="exit 1 without PyTorch or a GPU")
    a = ap.parse_args()

    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "not importable"
        print(f"SKIP torch-ref: PyTorch is not importable here ({e})")
        return 1 if a.require else 0
    if not torch.cuda.is_available():
        print(f"SKIP torch-ref: PyTorch {torch.__version__} sees no CUDA device")
        return 1 if a.require else 0

    torch.cuda.init()
    dev_name = torch.cuda.get_device_name(0)
    samples = max(3, a.samples)
    rows = []

    def median_of(sample):
        sample()  # warm-up
        return statistics.median(sample() for _ in range(samples))

    def add(test, config, nbytes, unit, value):
        rows.append({"test": test, "config": config, "bytes": nbytes, "unit": unit,
                     "torch": round(value, 4)})
        print(f"  {test} {config} {fmt_size(nbytes)}: {value:.3f} {unit}", file=sys.stderr)

    sync = torch.cuda.synchronize

    # copy_async_call: the stream held by a spin kernel (~0.1 s of clock cycles).
    n = 4 * KIB
    host = torch.zeros(n, dtype=torch.uint8).pin_memory()
    dev = torch.zeros(n, dtype=torch.uint8, device="cuda")
    for direction in ("h2d", "d2h"):
        def sample():
            torch.cuda._sleep(200_000_000)
            t0 = time.perf_counter()
            for _ in range(CALLS):
                if direction == "h2d":
                    dev.copy_(host, non_blocking=True)
                else:
                    host.copy_(dev, non_blocking=True)
            t = (time.perf_counter() - t0) / CALLS
            sync()
            return t
        add("copy_async_call", f"{direction}, pinned, host time per call", n, "us",
            median_of(sample) * 1e6)

    # copy_pinned / copy_pageable.
    for nbytes in COPY_SIZES:
        reps = reps_for(nbytes)
        dev = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
        for kind, host in (("copy_pinned", torch.full((nbytes,), 0x5A, dtype=torch.uint8).pin_memory()),
                           ("copy_pageable", torch.full((nbytes,), 0x3C, dtype=torch.uint8))):
            blocking = kind == "copy_pageable"
            for direction in ("h2d", "d2h"):
                def sample():
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        if direction == "h2d":
                            dev.copy_(host, non_blocking=not blocking)
                        else:
                            host.copy_(dev, non_blocking=not blocking)
                    sync()
                    return (time.perf_counter() - t0) / reps
                add(kind, direction, nbytes, "GB/s", nbytes / median_of(sample) / 1e9)
        del dev

    # stream_alloc_free and pinned_alloc_free.
    for nbytes in ALLOC_SIZES:
        def dev_sample():
            t0 = time.perf_counter()
            for _ in range(ALLOC_BATCH):
                x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
                del x
            t = (time.perf_counter() - t0) / ALLOC_BATCH
            sync()
            return t
        add("stream_alloc_free", f"caching device allocator, batches of {ALLOC_BATCH}", nbytes,
            "us", median_of(dev_sample) * 1e6)

        def pinned_sample():
            t0 = time.perf_counter()
            for _ in range(PINNED_PAIRS):
                x = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
                del x
            return (time.perf_counter() - t0) / PINNED_PAIRS
        add("pinned_alloc_free", "caching host allocator", nbytes, "us",
            median_of(pinned_sample) * 1e6)

    # handoff.
    n = 4 * KIB
    a_s, b_s = torch.cuda.Stream(), torch.cuda.Stream()
    src = torch.full((n,), 0x11, dtype=torch.uint8).pin_memory()
    dst = torch.zeros(n, dtype=torch.uint8).pin_memory()
    dev = torch.zeros(n, dtype=torch.uint8, device="cuda")

    def handoff_sample():
        t0 = time.perf_counter()
        for _ in range(HANDOFF_PAIRS):
            with torch.cuda.stream(a_s):
                a_s.wait_stream(b_s)  # the previous read of `dev` is done
                dev.copy_(src, non_blocking=True)
            with torch.cuda.stream(b_s):
                b_s.wait_stream(a_s)
                dst.copy_(dev, non_blocking=True)
        t = (time.perf_counter() - t0) / HANDOFF_PAIRS
        sync()
        return t
    add("handoff", "write on A, read on B, host time per pair", n, "us",
        median_of(handoff_sample) * 1e6)
    if not bool((dst == 0x11).all()):
        print("torch-ref: the hand-off read missed the write", file=sys.stderr)
        return 1

    # graph_replay.
    try:
        n = 4 * KIB
        src = torch.full((n,), 0x71, dtype=torch.uint8).pin_memory()
        d = torch.zeros(n, dtype=torch.uint8, device="cuda")
        e = torch.zeros(n, dtype=torch.uint8, device="cuda")
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        with torch.cuda.graph(g, stream=side):
            for _ in range(25):
                d.copy_(src, non_blocking=True)
                e.zero_()
                e.copy_(d, non_blocking=True)
        hosts, ends = [], []
        for i in range(220):
            t0 = time.perf_counter()
            g.replay()
            t1 = time.perf_counter()
            sync()
            t2 = time.perf_counter()
            if i >= 20:
                hosts.append(t1 - t0)
                ends.append(t2 - t0)
        add("graph_replay", "75 ops, host time per replay", n, "us", statistics.median(hosts) * 1e6)
        add("graph_replay", "75 ops, end to end per replay", n, "us", statistics.median(ends) * 1e6)
    except Exception as ex:  # noqa: BLE001 - reported, the other rows stand
        print(f"torch-ref: graph_replay not measured: {ex}", file=sys.stderr)

    doc = {"tool": "torch-ref", "torch": torch.__version__, "cuda": torch.version.cuda,
           "device": dev_name, "samples": samples, "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")

    print(f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) on {dev_name}, "
          f"median of {samples} samples")
    peers = []
    if a.bench:
        with open(a.bench) as f:
            peers = json.load(f).get("peers", [])
    def key(r):
        """The row's test, direction (where it has one) and size: what both sides share."""
        parts = [p.strip() for p in r["config"].split(",")]
        if parts[0] in ("h2d", "d2h"):
            return (r["test"], parts[0], r["bytes"])
        if r["test"] == "graph_replay":  # host time or end to end
            return (r["test"], parts[-1], r["bytes"])
        return (r["test"], "", r["bytes"])

    by_key = {key(r): r for r in peers}
    header = ["test", "configuration", "size", "unit", "torch"]
    if peers:
        header += ["cuda-mem", "cudarc", "cuda-mem / torch"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        cells = [r["test"], r["config"], fmt_size(r["bytes"]), r["unit"], f"{r['torch']:.3f}"]
        if peers:
            p = by_key.get(key(r))
            if p is None:
                cells += ["-", "-", "-"]
            else:
                ours = p.get("ours")
                speed = "-"
                if ours and r["torch"]:
                    # Higher is better for GB/s, lower for times.
                    speed = f"{ours / r['torch'] if r['unit'] == 'GB/s' else r['torch'] / ours:.2f}"
                cells += [f"{ours:.3f}" if ours is not None else "-",
                          f"{p['reference']:.3f}" if p.get("reference") is not None else "-",
                          speed]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
