"""`python benchmarks/paired_ab.py NAME[@TREE],... CONC [N [ROUNDS]]`: client CPU per request, paired by round against
the first contender (ROUNDS rounds, 6 unless given, of N requests, 3,000 unless given; the canned server answering after
20 ms; TREE: another checkout's kotoba_vllm, passed as `_peers.py` reads it, KOTOBA_BENCH_TREE)."""
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from canned_server import CannedServer
names = sys.argv[1].split(","); conc = sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 6
res = {k: [] for k in names}
with CannedServer(delay_ms=20, cpu=1) as srv:
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            nm, _, tree = name.partition("@")
            p = subprocess.run(["taskset", "-c", "0", sys.executable, os.path.join(HERE, "_peers.py"), nm, srv.base_urls[0], conc, str(n)],
                               capture_output=True, text=True,
                               env={**os.environ, "KOTOBA_BENCH_TREE": tree or os.path.dirname(HERE)})
            res[name].append(json.loads(p.stdout.splitlines()[-1])["cpu_s"] / n * 1e3)
b = res[names[0]]
for k, v in res.items():
    print(k, [round(x, 3) for x in v], "paired", round(statistics.median(x / y for x, y in zip(v, b)), 3), flush=True)
