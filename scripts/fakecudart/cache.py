#!/usr/bin/env python3
"""Reads the callgrind dumps of the hot_path harness run under `CACHE=1 run.sh`: each counted
run of a row is dumped under the name "row config|side|calls" (ours or raw). Prints, per row,
the instructions, data reads and writes, level-1 data read and write misses and last-level
data misses per call of
ours beyond the raw call's, counting only code outside the fake runtime (the program and the C
library: the fake's own work, its counters and eviction, is left out). With FAKE_EVICT_KIB past
the simulated D1, the D1 misses are the distinct cache lines the library touches per call."""
import re
import sys

FAKE = ("libfakecudart", "ld-linux")


def self_costs(path):
    """(name, events, {object: [costs]}) of one dump: self costs per object file."""
    name, events, costs = None, None, {}
    names = {}
    ob = None
    skip_next = False
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("desc: Trigger: Client Request: "):
                name = line[len("desc: Trigger: Client Request: "):].strip()
            elif line.startswith("events: "):
                events = line.split()[1:]
            elif line.startswith("ob=") or line.startswith("cob="):
                # Object names are defined at first use, by ob= or cob= alike.
                m = re.match(r"c?ob=\((\d+)\)(?: (.*))?", line)
                key = m.group(1) if m else line.split("=", 1)[1]
                if m and m.group(2):
                    names[key] = m.group(2)
                if line.startswith("ob="):
                    ob = names.get(key, key)
            elif line.startswith("calls="):
                skip_next = True  # the next cost line is the call's inclusive cost
            elif line and (line[0].isdigit() or line[0] in "+-*"):
                if skip_next:
                    skip_next = False
                    continue
                vals = [int(x) for x in line.split()[1:]]
                acc = costs.setdefault(ob, [0] * len(events))
                for i, v in enumerate(vals):
                    acc[i] += v
    return name, events, costs


runs = {}
for path in sys.argv[1:]:
    name, events, costs = self_costs(path)
    if not (name and name.count("|") == 2 and events):
        continue
    row, side, calls = name.split("|")
    total = dict.fromkeys(events, 0)
    for ob, c in costs.items():
        if ob and any(k in ob for k in FAKE):
            continue
        for e, v in zip(events, c):
            total[e] += v
    runs[(row, side)] = (int(calls), total)

# Read misses stall the core; write misses mostly drain through the store buffer.
cols = [("Ir", ["Ir"]), ("Dr", ["Dr"]), ("Dw", ["Dw"]), ("D1mr", ["D1mr"]), ("D1mw", ["D1mw"]),
        ("LLmiss", ["DLmr", "DLmw"])]
print(f"{'row (per call, ours - raw)':<34}" + "".join(f"{c:>8}" for c, _ in cols))
for (row, side), (calls, ours) in runs.items():
    if side != "ours" or (row, "raw") not in runs:
        continue
    rcalls, raw = runs[(row, "raw")]
    out = []
    for _, evs in cols:
        o = sum(ours.get(e, 0) for e in evs) / calls
        r = sum(raw.get(e, 0) for e in evs) / rcalls
        out.append(f"{o - r:>8.1f}")
    print(f"{row:<34}" + "".join(out))
