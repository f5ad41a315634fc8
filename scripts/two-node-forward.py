#!/usr/bin/env python3
"""Drive a two-station chain over the wire by hand (Python stdlib only).

    scripts/two-node-forward.py http://127.0.0.1:8081=0-12 http://127.0.0.1:8082=12-24
    scripts/two-node-forward.py --mesh specs/mesh-2.json

The same driver as three-node-forward.py (which documents the options), held to two
stations: entry (/embed + /forward 0-a) and exit (/forward a-L + /lm-head).
Exit codes: 0 PASS, 1 the argmax is not --expect, 2 usage or wire errors.
"""

import importlib.util
import os
import sys

_here = os.path.dirname(os.path.realpath(__file__))
_spec = importlib.util.spec_from_file_location(
    "three_node_forward", os.path.join(_here, "three-node-forward.py"))
driver = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(driver)

if __name__ == "__main__":
    try:
        sys.exit(driver.main(nodes=2, prog="two-node-forward.py"))
    except BrokenPipeError:
        sys.exit(0)
