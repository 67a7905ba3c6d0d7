# Baseline for `corral bench`: an ipykernel started and driven with jupyter_client inside the
# same sandbox (loopback TCP in the sandbox's own network namespace). Prints one JSON line:
# start_ms (start -> first print(1) result) and the execute_request round trips of "1+1".
import json
import sys
import time

from jupyter_client.manager import start_new_kernel

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
t0 = time.perf_counter()
km, kc = start_new_kernel(kernel_name="python3")
kc.execute_interactive("print(1)", output_hook=lambda msg: None, timeout=60)
start_ms = (time.perf_counter() - t0) * 1000
trips = []
for _ in range(rounds):
    t = time.perf_counter()
    reply = kc.execute_interactive("1+1", output_hook=lambda msg: None, timeout=60)
    trips.append((time.perf_counter() - t) * 1000)
    assert reply["content"]["status"] == "ok"
kc.stop_channels()
km.shutdown_kernel(now=True)
print(json.dumps({"start_ms": start_ms, "round_trips_ms": trips}))
