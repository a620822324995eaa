#!/usr/bin/env python3
"""The layering check (docs/architecture.md, "Modules and dependencies").

Reads every `#include "..."` of the product and its tools (src/, include/, tools/, lab/ and the
Python bindings' C++ in python/src/), maps each file and each included header to its folder,
and fails when

  - a folder includes a folder that ALLOWED (below) does not list for it: an upward or
    sideways dependency;
  - the folder graph has a cycle;
  - a file includes another folder's private header (`*_impl.h`, `*_internal.h`, or one listed
    in PRIVATE): private headers are for their own folder (and the tests) only, so no tool and
    no other part reaches into a part's private state;
  - an include names a header that is in none of the folders (a stale path);
  - docs/architecture.md's copy of the table (between the `layering-table` markers) is not
    the table below.

It prints the folder graph (each edge with its number of includes) on every run, and the known
exceptions, if any, each time. Python standard library only. Exit 0: clean; 1: violations;
2: usage. Run by `make lint` (and so by .ci/run) and by ctest `layering_check`, which also runs
it on small fake trees that must fail.

Usage: check-layering.py [--root DIR] [--quiet]
"""

import argparse
import os
import re
import sys

# Who may include whom. `kvtier` is the public API (include/kvtier/): its headers include only
# each other and the standard library, and every folder may include them. The order of the
# rows is the order of the layers, bottom first; a folder lists only folders above it in this
# table (checked by CheckTable), so the allowed graph itself has no cycle.
ALLOWED = {
    "kvtier": [],
    "core": ["kvtier"],
    "index": ["kvtier", "core"],
    "tier": ["kvtier", "core", "index"],
    "transfer": ["kvtier", "core", "index", "tier"],
    "metrics": ["kvtier", "core"],
    "events": ["kvtier", "core"],
    "router": ["kvtier", "core", "events"],
    "proto": ["kvtier", "core"],
    "manager": ["kvtier", "core", "index", "tier", "transfer", "metrics", "events"],
    "client": ["kvtier", "core", "index", "tier", "transfer", "proto"],
    "connector": ["kvtier", "manager", "client"],
    "daemon": ["kvtier", "core", "index", "tier", "transfer", "metrics", "events", "proto",
               "manager"],
    "engine": ["kvtier", "core"],
    "lab": ["kvtier", "core", "index"],
    "tools": ["kvtier", "core", "index", "tier", "transfer", "metrics", "events", "router",
              "proto", "manager", "client", "connector", "daemon", "engine", "lab"],
    "python": ["kvtier"],
}

# Headers private to their folder besides the *_impl.h and *_internal.h ones.
PRIVATE = {"daemon/server_state.h"}

# Includes allowed although the table forbids them, each with its reason. Printed on every run.
# Empty: the tree keeps the table.
KNOWN_EXCEPTIONS = {}  # (including file, included header) -> reason

SOURCE_SUFFIXES = (".h", ".cc", ".cu")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
TABLE_BEGIN = "<!-- layering-table -->"
TABLE_END = "<!-- /layering-table -->"


def RenderTable():
    lines = []
    width = max(len(f) for f in ALLOWED)
    for folder, deps in ALLOWED.items():
        lines.append(f"{folder.ljust(width)}  <- {', '.join(deps) if deps else '(nothing)'}")
    return lines


def CheckTable():
    """The table's own sanity: known names, and each row names only rows before it."""
    errors = []
    seen = set()
    for folder, deps in ALLOWED.items():
        for d in deps:
            if d not in ALLOWED:
                errors.append(f"table: {folder} lists {d}, which is no folder of the table")
            elif d not in seen:
                errors.append(f"table: {folder} lists {d}, which is not below it")
        seen.add(folder)
    return errors


class Tree:
    """The folders of a source tree and where each header lives."""

    def __init__(self, root):
        self.root = root
        self.files = []  # (path relative to root, folder)
        self.folder_of = {}  # path relative to root -> folder
        self.headers = {}  # include spelling -> (folder, path)
        for top in ("include", "src", "tools", "lab", "python/src"):
            base = os.path.join(root, top)
            if not os.path.isdir(base):
                continue
            for dirpath, dirnames, filenames in os.walk(base):
                dirnames.sort()
                for name in sorted(filenames):
                    if not name.endswith(SOURCE_SUFFIXES):
                        continue
                    path = os.path.relpath(os.path.join(dirpath, name), root)
                    folder = self.FolderOf(path)
                    if folder is None:
                        continue
                    self.files.append((path, folder))
                    self.folder_of[path] = folder
                    for spelling in self.Spellings(path):
                        self.headers.setdefault(spelling, (folder, path))

    @staticmethod
    def FolderOf(path):
        parts = path.split(os.sep)
        if parts[0] == "include" and len(parts) > 2 and parts[1] == "kvtier":
            return "kvtier"
        if parts[0] == "src" and len(parts) > 2:
            return parts[1]
        if parts[0] in ("tools", "lab"):
            return parts[0]
        if parts[0] == "python":
            return "python"
        return None

    @staticmethod
    def Spellings(path):
        """How an #include names this file: relative to include/, src/, tools/ or lab/."""
        parts = path.split(os.sep)
        if parts[0] in ("include", "src", "tools", "lab") and len(parts) > 1:
            return ["/".join(parts[1:])]
        return []

    def Resolve(self, including, spelling):
        """(folder, path) of the header `including` names, or None."""
        local = os.path.normpath(os.path.join(os.path.dirname(including), spelling))
        if local in self.folder_of:
            return self.folder_of[local], local
        return self.headers.get(spelling)


def IsPrivate(spelling):
    name = spelling.rsplit("/", 1)[-1]
    return name.endswith("_impl.h") or name.endswith("_internal.h") or spelling in PRIVATE


def FindCycles(edges):
    """The strongly connected components of more than one folder (Tarjan), each sorted."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def Visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                Visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            Visit(v)
    return out


def CheckDocs(root):
    path = os.path.join(root, "docs", "architecture.md")
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        return [f"docs: cannot read {path}: {e.strerror}"]
    if TABLE_BEGIN not in text or TABLE_END not in text:
        return [f"docs: {path} has no {TABLE_BEGIN} ... {TABLE_END} block"]
    block = text.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0]
    got = [l.rstrip() for l in block.splitlines() if l.strip() and not l.startswith("```")]
    want = RenderTable()
    if got != want:
        return [f"docs: the table in {path} is not the script's; put there:"] + want
    return []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."),
                    help="the source tree (default: this script's)")
    ap.add_argument("--quiet", action="store_true", help="no folder graph, only problems")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    tree = Tree(root)
    if not tree.files:
        print(f"layering: no sources under {root}", file=sys.stderr)
        return 2

    errors = CheckTable()
    edges = {}  # folder -> {folder: count}
    used_exceptions = set()
    for path, folder in tree.files:
        text = open(os.path.join(root, path), encoding="utf-8", errors="replace").read()
        for spelling in INCLUDE_RE.findall(text):
            target = tree.Resolve(path, spelling)
            if target is None:
                errors.append(f"{path}: includes \"{spelling}\", which is in no folder "
                              f"(a stale path?)")
                continue
            to, to_path = target
            key = (path, spelling)
            if to != folder:
                edges.setdefault(folder, {}).setdefault(to, 0)
                edges[folder][to] += 1
            if key in KNOWN_EXCEPTIONS:
                used_exceptions.add(key)
                continue
            if to != folder and to not in ALLOWED.get(folder, []):
                errors.append(f"{path}: {folder} includes {to} (\"{spelling}\"): "
                              f"{folder} may include only {', '.join(ALLOWED.get(folder, []))}")
            if to != folder and IsPrivate(spelling):
                errors.append(f"{path}: includes \"{spelling}\", a header private to {to}")
    for folder in edges:
        if folder not in ALLOWED:
            errors.append(f"folder {folder} is not in the table (scripts/check-layering.py)")
    for comp in FindCycles(edges):
        errors.append("cycle between folders: " + " <-> ".join(comp))
    errors += CheckDocs(root)

    if not args.quiet:
        print("layering: the folder graph (folder -> what it includes, with counts):")
        for folder in list(ALLOWED) + sorted(set(edges) - set(ALLOWED)):
            if folder in edges:
                out = ", ".join(f"{t}({n})" for t, n in sorted(edges[folder].items()))
                print(f"  {folder:<9} -> {out}")
    for key in sorted(KNOWN_EXCEPTIONS):
        state = "used" if key in used_exceptions else "UNUSED (remove it)"
        print(f"layering: known exception ({state}): {key[0]} includes \"{key[1]}\": "
              f"{KNOWN_EXCEPTIONS[key]}")
    if errors:
        for e in errors:
            print("layering: " + e, file=sys.stderr)
        print(f"layering: {len(errors)} problem(s) in {len(tree.files)} files", file=sys.stderr)
        return 1
    print(f"layering: {len(tree.files)} files, {sum(len(v) for v in edges.values())} folder "
          f"edges, all allowed (docs/architecture.md), no cycle, no private header reached into")
    return 0


if __name__ == "__main__":
    sys.exit(main())
