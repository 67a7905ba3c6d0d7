# kexec a new kernel or reboot the machine (CAD_OFF is the harmless command).
try_sys('kexec-load', 'kexec_load', 0, 0, 0, 0)
try_sys('kexec-file-load', 'kexec_file_load', -1, -1, 0, b'', 0)
try_sys('reboot', 'reboot', 0xfee1dead, 672274793, 0, 0)
try_sys('swapon', 'swapon', b'/workspace/swap', 0)
print('DONE')
