#!/usr/bin/env python3
"""Fails when cuda-mem's layers import each other in a cycle, or a layer names one above it.

Reads every `crate::a::b` path in cuda-mem/src (imports and qualified uses, outside comments
and `#[cfg(test)]` modules), maps each file to its top-level module (its folder: `fence`,
`handles`, `contract`, `alloc`, `kinds`, `ops`, `transfer`, `interop`, `ipc`; or its own file: `error`,
`profiler`), builds the graph "module -> modules it names", and fails (exit 1) on
- a strongly connected component of more than one module (an import cycle), or
- an edge from a module to one of a higher layer in LAYERS (the order the README's map shows).

    scripts/check-layers.py            # check
    scripts/check-layers.py --graph    # print the graph too
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cuda-mem", "src")
# Modules that are not layers: the crate root re-exports everything, and the test seams
# (`testing`, compiled only for the crate's own tests) may reach anything.
IGNORED = {"lib", "testing", "measure"}
# Bottom to top: a module may name modules of its own layer or below.
LAYERS = [
    {"error"},
    {"handles"},
    {"fence"},
    {"contract"},
    {"alloc"},
    {"kinds"},
    {"ops"},
    {"transfer"},
    {"interop", "profiler", "ipc"},
]


def layer_of(m):
    for i, layer in enumerate(LAYERS):
        if m in layer:
            return i
    return None


def module_of(path):
    rel = os.path.relpath(path, ROOT)
    parts = rel.split(os.sep)
    if len(parts) == 1:
        return os.path.splitext(parts[0])[0]
    return parts[0]


def strip(text):
    # Drop comments and `#[cfg(test)] mod ... { ... }` blocks (brace matched).
    text = re.sub(r"//[^\n]*", "", text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def crate_paths(text):
    """Top-level module names that `text` names through `crate::`, including inside
    `use crate::{a, b::c}` groups."""
    names = set(re.findall(r"\bcrate::(\w+)", text))
    for group in re.findall(r"\bcrate::\{([^;]*)\}", text):
        depth, cur, items = 0, "", []
        for ch in group:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                items.append(cur)
                cur = ""
            else:
                cur += ch
        items.append(cur)
        for it in items:
            m = re.match(r"\s*(\w+)", it)
            if m:
                names.add(m.group(1))
    return names


def graph():
    mods = set()
    edges = {}
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".rs"):
                p = os.path.join(dirpath, f)
                mods.add(module_of(p))
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if not f.endswith(".rs"):
                continue
            p = os.path.join(dirpath, f)
            m = module_of(p)
            if m in IGNORED:
                continue
            text = strip(open(p, encoding="utf-8").read())
            for n in crate_paths(text):
                if n in mods and n != m and n not in IGNORED:
                    edges.setdefault(m, set()).add(n)
    return mods - IGNORED, edges


def sccs(nodes, edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main():
    nodes, edges = graph()
    if "--graph" in sys.argv:
        for m in sorted(nodes):
            print(f"{m} -> {', '.join(sorted(edges.get(m, ()))) or '-'}")
    cycles = [c for c in sccs(nodes, edges) if len(c) > 1]
    upward = []
    for a in sorted(nodes):
        if layer_of(a) is None:
            upward.append(f"module {a} is in no layer (add it to LAYERS in {__file__})")
            continue
        for b in sorted(edges.get(a, ())):
            if layer_of(b) is not None and layer_of(b) > layer_of(a):
                upward.append(f"{a} (layer {layer_of(a)}) names {b} (layer {layer_of(b)}), a layer above it")
    for u in upward:
        print("layer order: " + u)
    for c in cycles:
        print("import cycle among cuda-mem modules: " + " <-> ".join(c))
        for a in c:
            for b in sorted(edges.get(a, ())):
                if b in c:
                    print(f"    {a} -> {b}")
    if cycles or upward:
        return 1
    print(f"check-layers: {len(nodes)} layers of cuda-mem, no import cycle, none names a layer above it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
