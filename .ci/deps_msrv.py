#!/usr/bin/env python3
"""Reads `cargo metadata` JSON on stdin; see deps-msrv.sh."""

import json, sys

def version(v):
    return tuple(int(x) for x in (v.split(".") + ["0", "0"])[:3])

meta = json.load(sys.stdin)
members = set(meta["workspace_members"])
by_id = {p["id"]: p for p in meta["packages"]}
ours = {by_id[m].get("rust_version") for m in members} - {None}
if len(ours) != 1:
    sys.exit(f"deps-msrv: the workspace members declare rust-versions {sorted(ours)}: want one")
msrv = ours.pop()
resolved = {n["id"] for n in meta["resolve"]["nodes"]} - members
too_new, unknown = [], []
for pid in sorted(resolved, key=lambda i: by_id[i]["name"]):
    p = by_id[pid]
    rv = p.get("rust_version")
    if rv is None:
        unknown.append(f"{p['name']} {p['version']}")
    elif version(rv) > version(msrv):
        too_new.append(f"{p['name']} {p['version']} needs Rust {rv}")
print(f"rust-version {msrv}: {len(resolved)} dependencies checked")
if unknown:
    print("no rust-version declared (not checked): " + ", ".join(unknown))
if too_new:
    print("dependencies that need a newer Rust than the workspace's rust-version " + msrv + ":")
    print("\n".join("  " + t for t in too_new))
    print("pin an older version (cargo update -p NAME --precise VERSION) or raise rust-version")
    sys.exit(1)

