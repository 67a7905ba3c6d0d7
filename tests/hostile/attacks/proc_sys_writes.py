# Reconfigure the kernel through /proc: hostname, core_pattern (a classic
# container escape), sysrq, caches, and the OOM score of ourselves.
mark = env('MARK')
def write(p, data):
    with open(p, 'w') as f:
        f.write(data)
attempt('proc-hostname', lambda: write('/proc/sys/kernel/hostname', 'pwn' + mark[:20]))
attempt('proc-core-pattern', lambda: write('/proc/sys/kernel/core_pattern', 'core-' + mark))
attempt('proc-sysrq-trigger', lambda: write('/proc/sysrq-trigger', 'h'))
attempt('proc-drop-caches', lambda: write('/proc/sys/vm/drop_caches', '1'))
attempt('proc-modprobe', lambda: write('/proc/sys/kernel/modprobe', '/workspace/pwn'))
attempt('oom-score-adj-lower', lambda: write('/proc/self/oom_score_adj', '-1000'))
print('DONE')
