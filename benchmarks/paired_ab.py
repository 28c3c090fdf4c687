"""`python benchmarks/paired_ab.py NAME[@TREE],... CONC`: client CPU per request, paired by round against the first
contender (6 rounds of 3,000 requests, the canned server answering after 20 ms; TREE: another checkout's kotoba_vllm)."""
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from canned_server import CannedServer
names = sys.argv[1].split(","); conc = sys.argv[2]
res = {k: [] for k in names}
with CannedServer(delay_ms=20, cpu=1) as srv:
    for r in range(6):
        for name in (names if r % 2 == 0 else names[::-1]):
            nm, _, tree = name.partition("@")
            p = subprocess.run(["taskset", "-c", "0", sys.executable, os.path.join(HERE, "_peers.py"), nm, srv.base_urls[0], conc, "3000"],
                               capture_output=True, text=True, env={**os.environ, "PYTHONPATH": tree or os.path.dirname(HERE)})
            res[name].append(json.loads(p.stdout.splitlines()[-1])["cpu_s"] / 3)
b = res[names[0]]
for k, v in res.items():
    print(k, [round(x, 3) for x in v], "paired", round(statistics.median(x / y for x, y in zip(v, b)), 3))
