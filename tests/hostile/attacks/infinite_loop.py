# Spin forever, with a spinning child that carries the marker.
tag = 'proc-' + env('MARK')
if os.fork() == 0:
    os.execv(sys.executable, [sys.executable, '-c', 'while True: pass', tag])
print('SPINNING', flush=True)
while True:
    pass
