#!/usr/bin/env python3
"""Reads `cargo metadata` JSON on stdin; see deps-msrv.sh.

Each workspace member is checked against its own `rust-version`: every package it reaches in the
resolved graph (its dependencies, dev-dependencies and theirs) must not declare a newer one. A
member it reaches is checked as a dependency (its rust-version must not be newer either) and not
walked into: its own dependencies are checked against its own rust-version, which is no newer.
"""

import json, sys

def version(v):
    return tuple(int(x) for x in (v.split(".") + ["0", "0"])[:3])

meta = json.load(sys.stdin)
members = set(meta["workspace_members"])
by_id = {p["id"]: p for p in meta["packages"]}
deps = {n["id"]: [d["pkg"] for d in n["deps"]] for n in meta["resolve"]["nodes"]}
missing = sorted(by_id[m]["name"] for m in members if by_id[m].get("rust_version") is None)
if missing:
    sys.exit(f"deps-msrv: workspace members without a rust-version: {', '.join(missing)}")

failed = False
unknown = set()
for member in sorted(members, key=lambda i: by_id[i]["name"]):
    msrv = by_id[member]["rust_version"]
    reached, todo = set(), list(deps.get(member, []))
    while todo:
        pid = todo.pop()
        if pid in reached or pid == member:
            continue
        reached.add(pid)
        if pid not in members:
            todo.extend(deps.get(pid, []))
    too_new = []
    for pid in sorted(reached, key=lambda i: by_id[i]["name"]):
        p = by_id[pid]
        rv = p.get("rust_version")
        if rv is None:
            unknown.add(f"{p['name']} {p['version']}")
        elif version(rv) > version(msrv):
            too_new.append(f"{p['name']} {p['version']} needs Rust {rv}")
    name = by_id[member]["name"]
    print(f"{name} (rust-version {msrv}): {len(reached)} dependencies checked")
    if too_new:
        failed = True
        print(f"  dependencies of {name} that need a newer Rust than its rust-version {msrv}:")
        print("\n".join("    " + t for t in too_new))
if unknown:
    print("no rust-version declared (not checked): " + ", ".join(sorted(unknown)))
if failed:
    print("pin an older version (cargo update -p NAME --precise VERSION) or raise rust-version")
    sys.exit(1)
