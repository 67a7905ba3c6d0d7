# Floods the kernel protocol socket at fd 3 (where the one-shot runner reports rich results)
# with what the host would otherwise keep: 24 result frames of 32 MiB each (768 MiB, valid
# base64 "PNGs"), then 400 tiny ones. The sandbox needs only one frame in memory; the host
# must neither buffer nor keep more than its per-execution result limits.
import stat

print('START')
if not stat.S_ISSOCK(os.fstat(3).st_mode):
    print('NOSOCKET')
    sys.exit(1)


def send(payload):
    view = memoryview(len(payload).to_bytes(4, 'big') + payload)
    while view:
        view = view[os.write(3, view):]


head = b'{"type":"result","id":"oneshot","is_main_result":false,"data":{"image/png":"'
tail = b'"}}'
body = (32 << 20) - len(head) - len(tail)
big = head + b'A' * (body - body % 4) + tail
for i in range(24):
    send(big)
    print('SENT', i + 1)
del big
for i in range(400):
    send(b'{"type":"result","id":"oneshot","is_main_result":false,"data":{"text/plain":"%d"}}' % i)
print('SENT small 400')
print('DONE')
