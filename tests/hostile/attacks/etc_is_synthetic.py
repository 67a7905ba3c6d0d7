# The sandbox's /etc is synthetic: no shadow, no host accounts, no host
# home or runtime dirs.
import pwd
probe('etc-shadow', lambda: read_file('/etc/shadow'))
probe('etc-gshadow', lambda: read_file('/etc/gshadow'))
probe('etc-sudoers', lambda: read_file('/etc/sudoers'))
probe('etc-ssh-hostkey', lambda: read_file('/etc/ssh/ssh_host_ed25519_key'))
probe('root-home', lambda: os.listdir('/root'))
probe('home', lambda: os.listdir('/home'))
try:
    print('RUN', ' '.join(sorted(os.listdir('/run'))))
except OSError as ex:
    print('RUN <%s>' % ename(ex.errno))
probe('var-run-docker', lambda: os.stat('/var/run/docker.sock'))
print('PASSWD', read_file('/etc/passwd').decode().replace('\n', '|'))
u = pwd.getpwuid(os.getuid())
print('IDENTITY', os.getuid(), os.getgid(), u.pw_name, os.getcwd(), os.environ.get('HOME'))
print('DONE')
