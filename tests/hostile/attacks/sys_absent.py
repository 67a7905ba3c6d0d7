# /sys exposes the host's cgroups, devices and firmware: it must be absent.
probe('sys-list', lambda: os.listdir('/sys'))
probe('sys-cgroup', lambda: os.listdir('/sys/fs/cgroup'))
probe('sys-class-net', lambda: os.listdir('/sys/class/net'))
probe('sys-kernel-notes', lambda: read_file('/sys/kernel/notes'))
probe('sys-dmi', lambda: read_file('/sys/class/dmi/id/product_uuid'))
print('DONE')
