# An exponential fork bomb that keeps retrying; the marker in argv is
# inherited by every copy.
bomb = ('import os\n'
        'while True:\n'
        '    try:\n'
        '        os.fork()\n'
        '    except OSError:\n'
        '        pass\n')
os.execv(sys.executable, [sys.executable, '-c', bomb, 'bomb-' + env('MARK')])
