"""Corral's Python session kernel, entry point; it runs inside the sandbox
(docs/kernel-protocol.md).

``python3 corral_kernel.py``: an IPython shell executing the cells the host sends on fd 3.
A zygote imports this module, calls ``prepare()`` (heavy imports, the shell), forks, and each
child calls ``reseed()`` then ``serve()``. The protocol and the IPython session live in
corral_kernel_lib.py. (One-shot runs use corral_oneshot.py.)
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _library():
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import corral_kernel_lib

    return corral_kernel_lib


def prepare(preload=("numpy", "pandas", "matplotlib.pyplot")):
    """Before a zygote forks: create the IPython shell and import `preload`."""
    return _library().prepare(preload)


def reseed():
    """In a forked child: fresh random streams (`random`, numpy's global state)."""
    _library().reseed()


def serve(sock_fd=3):
    """Send `ready` on `sock_fd`, then execute cells until the host hangs up."""
    _library().serve(sock_fd)


def main(argv):
    if len(argv) > 1:
        sys.stderr.write("usage: corral_kernel.py (one-shot runs: corral_oneshot.py)\n")
        return 2
    serve(3)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
