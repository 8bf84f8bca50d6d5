#!/usr/bin/env python3
"""Checks the benchmark bars of `cuda-mem bench` against the C++ reference run in the same call.

usage: compare-refbench.py bench.json membench-before.txt [membench-after.txt ...]

Bars: our copies >= 99% of the raw path's bandwidth at 1 MiB and above, >= 95% at 4 KiB;
pinned H2D and D2H at 256 MiB >= 97% of ../shared/refbench/membench.cu (the best of the
reference runs given, before and after ours, so machine drift cannot flatter us); and the
per-call bars of the asynchronous calls section (issue 8).
Exit status 0 when every bar holds.
"""
import json
import sys


def ref_figures(path):
    out = {}
    for line in open(path):
        for part in line.split():
            if "=" in part:
                k, v = part.split("=", 1)
                try:
                    out[k] = float(v)
                except ValueError:
                    pass
    return out


def main():
    bench = json.load(open(sys.argv[1]))
    refs = [ref_figures(p) for p in sys.argv[2:]]
    ok = True
    print("bar 1: ours / raw (median of paired samples), every copy row")
    worst = {}
    for row in bench["copies"]:
        # host_pool rows compare two kinds of memory (host-pool pinned memory against
        # cudaHostAlloc memory, both through copy_async), not our calls against raw ones.
        if row["kind"] == "host_pool":
            continue
        # The bars are at 4 KiB and from 1 MiB up; sizes between are reported, not judged.
        need = 0.99 if row["bytes"] >= 1 << 20 else 0.95 if row["bytes"] == 4096 else 0.0
        good = row["ratio"] >= need
        key = (row["kind"], row["direction"])
        if not good:
            print(f"  MISS {row['kind']:>15} {row['direction']} {row['bytes']:>11} B: "
                  f"{row['gbps']:.2f} vs raw {row['raw_gbps']:.2f} GB/s, ratio {row['ratio']:.4f} < {need}")
        worst[key] = min(worst.get(key, 9.0), row["ratio"])
        ok &= good
    for (kind, d), r in sorted(worst.items()):
        print(f"  {kind:>15} {d}: worst ratio {r:.4f}")
    print("bar 2: pinned 256 MiB against the C++ reference (best of its runs)")
    for d, key in (("h2d", "h2d_pinned_gbps"), ("d2h", "d2h_pinned_gbps")):
        ours = [r["gbps"] for r in bench["copies"]
                if r["kind"] == "pinned" and r["direction"] == d and r["bytes"] == 256 << 20]
        ref = max(r.get(key, 0.0) for r in refs)
        if not ours or ref <= 0:
            print(f"  {d}: missing figures (ours {ours}, reference {ref})")
            ok = False
            continue
        ratio = ours[0] / ref
        good = ratio >= 0.97
        ok &= good
        print(f"  {d}: ours {ours[0]:.2f} GB/s, reference {ref:.2f} GB/s, "
              f"ratio {ratio:.4f} {'ok' if good else 'MISS (< 0.97)'}")
    print("bar 3: asynchronous calls (issue 8): loop of single 1-20 KB copy_async >= 0.95 of raw;")
    print("       host overhead of one call <= 0.3 us; four streams on quarters >= 0.98 of raw")
    calls = bench.get("calls", [])
    if not calls:
        print("  missing: no calls section")
        ok = False
    for row in calls:
        test, d = row["test"], row["direction"]
        if test == "loop":
            good, what = row["ratio"] >= 0.95, f"ratio {row['ratio']:.4f} (>= 0.95)"
        elif test == "enqueue":
            over = row["us"] - row["raw_us"]
            good, what = over <= 0.3, f"overhead {over:+.3f} us (<= 0.3)"
        elif test == "quarters_4_streams":
            good, what = row["ratio"] >= 0.98, f"ratio {row['ratio']:.4f} (>= 0.98)"
        else:
            good, what = True, f"ratio {row['ratio']:.4f} (reported)"
        ok &= good
        print(f"  {'ok  ' if good else 'MISS'} {test:>18} {d} {row['bytes']:>9} B: ours "
              f"{row['us']:.3f} us, raw {row['raw_us']:.3f} us, {what}")
    print("all bars met" if ok else "SOME BARS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
