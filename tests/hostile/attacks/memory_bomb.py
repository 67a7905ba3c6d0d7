# Allocate and touch memory 8 MiB at a time, far past the limit.
chunks = []
mb = 0
while mb < 1024:
    chunks.append(b'\x01' * (8 << 20))
    mb += 8
    print('ALLOCATED', mb)
allowed('memory', '1024 MiB')
print('DONE')
