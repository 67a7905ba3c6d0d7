# A rich PNG result (saved as result-N.png without --json) while the
# workspace holds a file named like the next free result-N.png, and the
# --out directory already has result-1..3.png as a FIFO, a symlink out and a
# hard link to a file elsewhere.
mark = env('MARK')
with open('/workspace/' + env('WORKSPACE_NAME'), 'w') as f:
    f.write('WORKSPACE-' + mark)


class Figure:
    def _repr_png_(self):
        return b'\x89PNG\r\n\x1a\n' + ('FIGURE-' + mark).encode()


print('DONE')
Figure()
