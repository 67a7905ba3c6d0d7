# A first program for Corral: it runs as an unprivileged user in a throwaway sandbox with
# no network, a read-only root filesystem and a private /workspace.
import getpass
import os
import platform
import socket
import statistics

print(f"Python {platform.python_version()} as {getpass.getuser()} (uid {os.getuid()}) in {os.getcwd()}")
print("hostname:", socket.gethostname())
print("network interfaces:", [name for _, name in socket.if_nameindex()])

salaries = {"Lisbon": [41_000, 45_500, 39_900], "Oslo": [61_200, 58_300], "Lima": [23_400, 27_800, 25_100]}
best = max(salaries, key=lambda city: statistics.mean(salaries[city]))
print(f"highest average salary: {best} ({statistics.mean(salaries[best]):,.0f})")

with open("report.txt", "w") as f:
    f.write(f"{best}\n")
print("wrote /workspace/report.txt (copy it out with --out DIR)")
