# /proc files that name the host rather than the sandbox: its boot line and boot config,
# its kernel build, its hardware, its disks and its boot. Each must be unreadable or empty.
FILES = [
    'cmdline',          # the host's kernel command line
    'bootconfig',       # the host's boot configuration
    'config.gz',        # the host kernel's build configuration
    'modules',          # loaded drivers (and their addresses where kptr_restrict allows)
    'kallsyms',         # every kernel symbol (real addresses when perf_event_paranoid <= 1)
    'iomem',            # physical memory map and the devices in it
    'ioports',          # I/O port map and the devices in it
    'interrupts',       # interrupt lines by device name
    'devices',          # character and block drivers
    'misc',             # misc drivers (kvm, vsock, ...)
    'consoles',         # the host's consoles
    'crypto',           # crypto drivers, hardware accelerators among them
    'partitions',       # the host's disks and partitions
    'diskstats',        # the host's disks and their activity
    'swaps',            # the host's swap devices and files
    'buddyinfo',        # physical memory zones and their fragmentation
    'zoneinfo',         # physical memory zones
    'pagetypeinfo',
    'sys/kernel/random/boot_id',  # the host's boot, the same in every sandbox of this boot
]
for name in FILES:
    try:
        data = read_file('/proc/' + name)
    except OSError as ex:
        blocked(name, ex.errno)
    else:
        if data:
            print('LEAK %s %r' % (name, data[:200]), flush=True)
        else:
            blocked(name, 'EMPTY')

# Directories of host hardware and host filesystems: /proc/bus/pci (PCI devices),
# /proc/fs/ext4/<disk> (the host's disks and their options), /proc/irq, /proc/driver, ...
DIRS = ['bus', 'fs', 'irq', 'driver', 'scsi', 'acpi', 'asound']
for name in DIRS:
    readable = []
    for dirpath, dirnames, filenames in os.walk('/proc/' + name):
        for f in filenames:
            path = os.path.join(dirpath, f)
            try:
                if read_file(path, 64):
                    readable.append(path)
            except OSError:
                pass
        readable.extend(os.path.join(dirpath, d) for d in dirnames)
    if readable:
        print('LEAK %s %r' % (name, sorted(readable)[:10]), flush=True)
    else:
        blocked(name, 'EMPTY')

# What is deliberately left: /proc/version repeats uname(2), which no mount can hide.
print('VERSION %r' % read_file('/proc/version'))
print('MOUNTS %r' % read_file('/proc/mounts'))
print('DONE')
