# 100 MiB on stdout, then 100 MiB on stderr, without newlines.
out = sys.stdout.buffer
chunk = b'A' * (1 << 20)
for _ in range(100):
    out.write(chunk)
out.flush()
err = sys.stderr.buffer
chunk = b'E' * (1 << 20)
for _ in range(100):
    err.write(chunk)
err.flush()
