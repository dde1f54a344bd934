#!/usr/bin/env python3
"""Checks the build layering of cmake/layers.txt (docs/architecture.md, "Build layering").

1. Includes: a file may include a private header (a .h under src/) only of its own row or of a row
   it names after its colon: private headers are not passed on (the runtime depends on the
   backend registry, which depends on the CPU backend, yet includes none of its headers). Public
   headers (include/pto) are open to everyone.
2. Symbols (with --lib NAME=ARCHIVE for each library, as ctest passes them): every symbol a
   library uses and another of our libraries defines must come from a row it may depend on, so a
   call against the direction of the data flow fails here even where the link happens to work.

    python3 tests/check_layering.py                       # includes only, no build needed
    python3 tests/check_layering.py --lib ir=build/libpto_ir.a ...

Exits 1 and lists every violation, 0 when the layering holds.
"""

import argparse
import os
import re
import subprocess
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.M)


def read_table(path):
    """Rows of layers.txt: name -> (paths, deps, is_library)."""
    rows = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            head, sep, deps = line.partition(":")
            words = head.split()
            if not sep or len(words) < 2:
                sys.exit(f"{path}:{n}: expected 'name paths... : deps...'")
            name = words[0]
            rows[name.lstrip("@")] = (words[1:], deps.split(), not name.startswith("@"))
    return rows


def direct(rows):
    """Each row's rows whose private headers it may include: itself and those it names."""
    libs = [r for r, (_, _, lib) in rows.items() if lib]
    return {r: {r} | (set(libs) if "*" in deps else {d for d in deps if d in rows})
            for r, (_, deps, _) in rows.items()}


def closure(rows):
    """Each row's allowed rows for symbols: itself and everything it depends on, transitively."""
    libs = [r for r, (_, _, lib) in rows.items() if lib]
    allowed = {}

    def visit(r, stack=()):
        if r in allowed:
            return allowed[r]
        if r in stack:
            sys.exit(f"layers.txt: dependency cycle through {' -> '.join(stack + (r,))}")
        out = {r}
        for d in rows[r][1]:
            if d == "*":
                out.update(libs)
            elif d in rows:
                out |= visit(d, stack + (r,))
            # anything else is an outside library (onnx_proto)
        allowed[r] = out
        return out

    for r in rows:
        visit(r)
    return allowed


def owner(rows, rel):
    """The row whose longest path matches the repository-relative path `rel`, or None."""
    best, best_len = None, 0
    for r, (paths, _, _) in rows.items():
        for p in paths:
            if (rel == p or (p.endswith("/") and rel.startswith(p))) and len(p) > best_len:
                best, best_len = r, len(p)
    return best


def check_includes(rows, allowed):
    errors = []
    for top in ("src", "tests", "bench", "python/src"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for fn in sorted(files):
                if not fn.endswith((".cpp", ".h")):
                    continue
                path = os.path.join(dirpath, fn)
                rel = os.path.relpath(path, ROOT)
                me = owner(rows, rel)
                if me is None:
                    if rel.startswith("src/"):
                        errors.append(f"{rel}: belongs to no row of cmake/layers.txt")
                    continue
                with open(path, errors="replace") as f:
                    text = f.read()
                for m in INCLUDE_RE.finditer(text):
                    inc = m.group(1)
                    line = text.count("\n", 0, m.start()) + 1
                    target = None
                    for base in (dirpath, os.path.join(ROOT, "src")):
                        cand = os.path.normpath(os.path.join(base, inc))
                        if os.path.isfile(cand):
                            target = os.path.relpath(cand, ROOT)
                            break
                    if target is None or not target.startswith("src/"):
                        continue  # public (include/pto), generated, or local to tests/python
                    theirs = owner(rows, target)
                    if theirs is not None and theirs not in allowed[me]:
                        errors.append(
                            f"{rel}:{line}: includes {target}, a private header of '{theirs}', "
                            f"and '{me}' may include those only of {sorted(allowed[me] - {me})}")
    return errors


def nm(archive):
    """(defined, undefined) mangled names of an archive, with the member that uses each."""
    out = subprocess.run(["nm", "-P", "-A", archive], capture_output=True, text=True, check=True)
    defined, undefined = set(), {}
    for line in out.stdout.splitlines():
        # "lib.a[obj.o]: name T value size" (POSIX format)
        where, _, rest = line.partition(": ")
        parts = rest.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind in "TDBR":  # strong definitions; inline and template code is weak (W, V, u)
            defined.add(name)
        elif kind == "U":
            undefined.setdefault(name, where.rsplit("[", 1)[-1].rstrip("]"))
    return defined, undefined


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                             text=True, check=True)
        return out.stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return list(names)


def check_symbols(libs, allowed):
    defs, uses = {}, {}
    for name, archive in libs.items():
        defs[name], uses[name] = nm(archive)
    definer = defaultdict(set)
    for name, symbols in defs.items():
        for s in symbols:
            definer[s].add(name)
    errors = []
    for me, symbols in sorted(uses.items()):
        bad = defaultdict(list)
        for s, obj in symbols.items():
            whose = definer.get(s, set()) - {me}
            if whose and not (whose & allowed[me]):
                bad[min(whose)].append((s, obj))
        for theirs, items in sorted(bad.items()):
            shown = demangle([s for s, _ in items[:3]])
            errors.append(f"pto_{me} uses {len(items)} symbol(s) of pto_{theirs}, which it may "
                          f"not depend on: " +
                          "; ".join(f"{d} (in {o})" for d, (_, o) in zip(shown, items)))
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", default=os.path.join(ROOT, "cmake", "layers.txt"))
    ap.add_argument("--lib", action="append", default=[], metavar="NAME=ARCHIVE",
                    help="a library of the table and its archive, for the symbol check")
    args = ap.parse_args()
    rows = read_table(args.table)
    allowed = closure(rows)
    errors = check_includes(rows, direct(rows))
    libs = dict(x.split("=", 1) for x in args.lib)
    unknown = [n for n in libs if n not in rows or not rows[n][2]]
    if unknown:
        sys.exit(f"--lib names no library of the table: {unknown}")
    errors += check_symbols(libs, allowed)
    for e in errors:
        print(e)
    checked = "includes" + (f" and the symbols of {len(libs)} libraries" if libs else "")
    print(f"layering: {checked}: {len(errors)} violation(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
