// JavaScript: read the planted host secret and connect to the host listener.
const fs = require('fs');
const net = require('net');
console.log('START');
for (const [what, p] of [['js-read', process.env.HOST_SECRET_PATH],
                         ['js-proc1-root', '/proc/1/root' + process.env.HOST_SECRET_PATH]]) {
  try {
    console.log('LEAK ' + what + ' ' + fs.readFileSync(p, 'utf8'));
  } catch (e) {
    console.log('BLOCKED ' + what + ' ' + e.code);
  }
}
const s = net.connect({ host: '127.0.0.1', port: Number(process.env.PORT) });
const timer = setTimeout(() => { console.log('BLOCKED js-tcp TIMEOUT'); done(); }, 5000);
function done() { clearTimeout(timer); console.log('DONE'); process.exit(0); }
s.on('connect', () => { console.log('ALLOWED js-tcp'); s.end(process.env.MARK, done); });
s.on('error', (e) => { console.log('BLOCKED js-tcp ' + e.code); done(); });
