"""`python benchmarks/flow_headroom_cost.py`: where flow control's CPU against a member with 8 slots goes.

Against the canned server with 8 slots (429 beyond them), 5 rounds of 3,000 requests, each arm its own process,
rotating order, each round's CPU ratio to a hand-set `--flow-control off -c 8`: flow control at -c 64 with the
default headroom (1 slot left free: 7 in flight), a fixed -c 7, and flow control with `--headroom 0`.
"""
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _throughput import child
from canned_server import CannedServer
arms = [("kotoba-run-slots", 64), ("kotoba-run-slots-fixed", 8), ("kotoba-run-slots-fixed", 7), ("kotoba-run-slots-headroom-0", 64)]
runs = {a: [] for a in arms}
with CannedServer(delay_ms=20, cpu=1, slots=8) as srv:
    for r in range(5):
        k = r % len(arms)
        for a in arms[k:] + arms[:k]:
            runs[a].append(child(a[0], srv.base_urls[:1], a[1], 3000))
base = runs[arms[1]]
for a in arms:
    rat = [x["cpu_s"] / y["cpu_s"] for x, y in zip(runs[a], base)]
    print(a, "ms/req", round(statistics.median(x["cpu_s"] for x in runs[a]) / 3, 3), "wall", round(statistics.median(x["wall_s"] for x in runs[a]), 1),
          "good", min(x["good"] for x in runs[a]), "paired/fixed8", round(statistics.median(rat), 3), [round(v, 2) for v in rat])
