# One-shot entry: `python3 corral_run.py --oneshot PROGRAM [ARGS...]` (docs/kernel-protocol.md).
# Python compiles a script it runs on every start but imports modules from their bytecode, so
# this stub stays tiny and the kernel module comes from /run/corral/__pycache__ when the host
# has precompiled it for this image.
import sys

import corral_kernel

sys.exit(corral_kernel.main(sys.argv))
