# Read a planted host file by its absolute host path.
path = env('HOST_SECRET_PATH')
sdir = env('HOST_SECRET_DIR')
probe('abs-read', lambda: read_file(path))
probe('abs-stat', lambda: os.stat(path))
probe('abs-listdir', lambda: os.listdir(sdir))
probe('abs-parent-listdir', lambda: os.listdir(os.path.dirname(sdir)))
print('DONE')
