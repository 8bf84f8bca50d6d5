#!/usr/bin/env python3
"""torch.multiprocessing sharing of a CUDA tensor, measured like `cuda-mem bench --sections ipc`.

Prints lines comparable to the bench's rows:
  ipc_export_torch: µs to put a 64 MiB CUDA tensor on a queue (pickling: cudaIpcGetMemHandle,
                    event record and handle, ref counter)
  ipc_open_torch:   µs in the child from queue.get() returning... to the tensor rebuilt
                    (cudaIpcOpenMemHandle or its cache, event wait), median of 21
  ipc_copy_torch:   GB/s of a 256 MiB device-to-device copy from the shared tensor against one
                    between two local tensors, and their ratio
  ipc_pingpong_torch: µs per round of handing an event back and forth (queue put/get of a
                    torch.cuda.Event handle both ways), the closest torch has to a pass

Usage: python3 scripts/torch-ipc.py   (needs torch with CUDA; exits 0 with a SKIP line without)
"""
import statistics
import sys
import time

try:
    import torch
    import torch.multiprocessing as mp
except ImportError as e:  # pragma: no cover
    print(f"SKIP torch-ipc: torch not importable: {e}")
    sys.exit(0)

OFFERS = 21
ROUNDS = 1000
MIB = 1 << 20


def child(q_in, q_out):
    torch.cuda.init()
    opens = []
    for _ in range(OFFERS):
        t = time.perf_counter()
        x = q_in.get()  # rebuilds the tensor: opens the handle, waits for the producer's event
        torch.cuda.current_stream().synchronize()
        opens.append((time.perf_counter() - t) * 1e6)
        del x
        q_out.put("closed")
    q_out.put(("open", statistics.median(opens)))
    # Bandwidth: shared against local.
    shared = q_in.get()
    n = shared.numel()
    own = torch.empty(n, dtype=torch.uint8, device="cuda")
    other = torch.empty(n, dtype=torch.uint8, device="cuda")
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(src):
        v = []
        for _ in range(11):
            a.record()
            own.copy_(src)
            b.record()
            b.synchronize()
            v.append(a.elapsed_time(b) / 1e3)
        return statistics.median(v)

    ipc, local = timed(shared), timed(other)
    q_out.put(("copy", n / ipc / 1e9, n / local / 1e9, local / ipc))
    del shared
    # Ping-pong of an interprocess event.
    for _ in range(ROUNDS):
        ev = q_in.get()
        ev.wait()
        e2 = torch.cuda.Event(interprocess=True)
        e2.record()
        q_out.put(e2)
    q_out.put("done")


def main():
    if not torch.cuda.is_available():
        print("SKIP torch-ipc: no CUDA device")
        return
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q_in, q_out))
    p.start()
    exports = []
    for _ in range(OFFERS):
        x = torch.zeros(64 * MIB, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        t = time.perf_counter()
        q_in.put(x)  # queue.put pickles in a feeder thread: time until it is handed over
        exports.append((time.perf_counter() - t) * 1e6)
        assert q_out.get() == "closed"
        del x
    print(f"ipc_export_torch: {statistics.median(exports):.1f} us (queue.put, pickling in a thread)")
    _, open_us = q_out.get()
    print(f"ipc_open_torch: {open_us:.1f} us (includes waiting for the queue)")
    big = torch.zeros(256 * MIB, dtype=torch.uint8, device="cuda")
    q_in.put(big)
    _, ipc, local, ratio = q_out.get()
    print(f"ipc_copy_torch: {ipc:.1f} GB/s cross-process, {local:.1f} GB/s in-process, ratio {ratio:.3f}")
    t = time.perf_counter()
    for _ in range(ROUNDS):
        e = torch.cuda.Event(interprocess=True)
        e.record()
        q_in.put(e)
        back = q_out.get()
        back.wait()
    print(f"ipc_pingpong_torch: {(time.perf_counter() - t) * 1e6 / ROUNDS:.1f} us per round (event handles over mp.Queue)")
    assert q_out.get() == "done"
    p.join()
    del big


if __name__ == "__main__":
    main()
