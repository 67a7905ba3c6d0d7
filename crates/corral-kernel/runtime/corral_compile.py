"""Precompiles the one-shot runtime for the image's own Python (docs/kernel-protocol.md,
"Bytecode"). Runs alone in a sandbox, before any user code: `python3 corral_compile.py
SOURCE...` prints one JSON object mapping each bytecode file name (`corral_oneshot.cpython-311.pyc`)
to its base64 contents. The bytecode is hash-checked: Python ignores it when the source differs."""

import base64
import importlib.util
import json
import os
import py_compile
import sys

out = {}
for source in sys.argv[1:]:
    name = os.path.basename(importlib.util.cache_from_source(source))
    target = os.path.join("/tmp", name)
    py_compile.compile(
        source,
        cfile=target,
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
    )
    with open(target, "rb") as compiled:
        out[name] = base64.b64encode(compiled.read()).decode()
print(json.dumps(out))
