"""Prints `go mod edit -replace` flags for a module's go.mod (read as `go mod edit -json` on stdin).

  gomod_replaces.py              the non-local replaces (local ones point into a repository we don't have)
  gomod_replaces.py STAGING_V    also every ./staging/... replace of k8s.io/kubernetes, pointed at its published STAGING_V
"""
import json
import sys

staging_version = sys.argv[1] if len(sys.argv) > 1 else None
for r in json.load(sys.stdin).get("Replace") or []:
    old, new = r["Old"], r["New"]
    old_ref = old["Path"] + ("@" + old["Version"] if old.get("Version") else "")
    if new.get("Version"):
        print(f"-replace={old_ref}={new['Path']}@{new['Version']}")
    elif staging_version and new["Path"].startswith("./staging/"):
        print(f"-replace={old_ref}={old['Path']}@{staging_version}")
