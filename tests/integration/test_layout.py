#!/usr/bin/python3
"""The layout docs/architecture.md promises, checked on the sources: dependencies point
down only (a file includes headers of its own component or of one below it), and no file
outside a component includes that component's private *_int.h headers (tests and the
bench included).

    common  <  kvindex, proto, tiers  <  transfer  <  server, router-plugin  <  bench

Usage: test_layout.py SOURCE_DIR
"""
import os
import re
import sys

LEVEL = {"common": 0, "kvindex": 1, "proto": 1, "tiers": 1, "transfer": 2, "server": 3,
         "router-plugin": 3, "bench": 4, "tests": 5}
# a component may use a sibling on its own level only where listed here
ALLOWED_SAME_LEVEL = set()
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(root):
    for top in LEVEL:
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith((".c", ".h")):
                    yield top, os.path.join(d, f)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    problems, checked = [], 0
    for comp, path in sources(root):
        with open(path, errors="replace") as f:
            text = f.read()
        for inc in INCLUDE.findall(text):
            dep = inc.split("/")[0]
            if dep not in LEVEL or dep == comp:
                continue
            checked += 1
            rel = os.path.relpath(path, root)
            if inc.endswith("_int.h"):
                problems.append("%s includes %s, another component's private header" % (rel, inc))
            elif LEVEL[dep] > LEVEL[comp] or (LEVEL[dep] == LEVEL[comp] and
                                              (comp, dep) not in ALLOWED_SAME_LEVEL):
                problems.append("%s (%s) includes %s: %s is not below %s" % (
                    rel, comp, inc, dep, comp))
    for p in problems:
        print("FAIL:", p)
    if checked == 0:
        print("FAIL: no cross-component include found under %s: wrong source dir?" % root)
        return 1
    print("test_layout: %d cross-component includes checked, %d problems" % (
        checked, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
