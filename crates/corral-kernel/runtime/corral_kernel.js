'use strict';
// Corral's JavaScript kernel; it runs inside the sandbox (docs/kernel-protocol.md).
//
// Start: `node --expose-internals corral_kernel.js`, with the host's socket at fd 3. The
// flag gives access to Node's REPL rewriter (internal/repl/await), which turns top-level
// `await` code into an async function while keeping its declarations global, exactly as
// the `node` REPL does.
//
// Cells run as scripts in the main context, like the REPL, so variables (`let` and
// `const` included) persist between executions and `require`, `process`, `Buffer`, ...
// work as usual. The value of a cell's last expression is its main result.

const net = require('net');
const path = require('path');
const util = require('util');
const vm = require('vm');
const { createRequire } = require('module');
const { processTopLevelAwait } = requireReplRewriter();

const MAX_FRAME = 64 << 20;
const MAX_RESULT = 32 << 20;
const INTERRUPTED = 'Script execution was interrupted by `SIGINT`';

const socket = new net.Socket({ fd: 3, readable: true, writable: true });
let cellCount = 0;
// Rejects the cell being awaited, when an interrupt arrives while it is pending.
let interruptPending = null;

function requireReplRewriter() {
  try {
    return require('internal/repl/await');
  } catch {
    process.stderr.write('corral kernel: start me as `node --expose-internals corral_kernel.js`\n');
    process.exit(2);
  }
}

function log(text) {
  process.stderr.write(`corral kernel: ${text}\n`);
}

// JSON.stringify writes a lone surrogate as a \udxxx escape, which strict parsers (the
// host's) reject: it becomes U+FFFD. A backslash-escaped backslash before it is kept.
const LONE_SURROGATE = /(?<!\\)((?:\\\\)*)\\ud[89a-f][0-9a-f]{2}/g;

function encode(message) {
  return Buffer.from(JSON.stringify(message).replace(LONE_SURROGATE, '$1\\ufffd'), 'utf8');
}

function send(payload) {
  const header = Buffer.alloc(4);
  header.writeUInt32BE(payload.length);
  socket.write(Buffer.concat([header, payload]));
}

// ---- results ----------------------------------------------------------------------------

// True when `value` is made of JSON types only (plain objects and arrays, finite numbers,
// strings, booleans, null) and has no cycle, so application/json shows it faithfully.
function isPlainJson(value, ancestors = new Set()) {
  if (value === null || typeof value === 'string' || typeof value === 'boolean') return true;
  if (typeof value === 'number') return Number.isFinite(value);
  if (typeof value !== 'object' || ancestors.has(value)) return false;
  const proto = Object.getPrototypeOf(value);
  const isArray = Array.isArray(value);
  if (!isArray && proto !== Object.prototype && proto !== null) return false;
  ancestors.add(value);
  const children = isArray ? value : Object.values(value);
  const plain = children.every((child) => isPlainJson(child, ancestors));
  ancestors.delete(value);
  return plain;
}

// Sends the cell's value; false when it was too large and an error went instead.
function sendResult(id, value) {
  const data = { 'text/plain': util.inspect(value) };
  if (isPlainJson(value)) data['application/json'] = value;
  const payload = encode({ type: 'result', id, is_main_result: true, data });
  if (payload.length <= MAX_RESULT) {
    send(payload);
    return true;
  }
  const kinds = Object.keys(data).join(', ');
  const text = `a result of ${payload.length} bytes (${kinds}) exceeds the limit of ${MAX_RESULT} bytes`;
  send(encode({ type: 'error', id, name: 'ResultTooLarge', value: text, traceback: '' }));
  return false;
}

// ---- errors -----------------------------------------------------------------------------

// The stack without the kernel's and Node's own frames: what is left is the user's code
// (and the modules it called).
function userStack(stack) {
  return stack
    .split('\n')
    .filter((line) => !(/^\s+at /.test(line) && (/[( ]node:/.test(line) || line.includes(__filename))))
    .join('\n');
}

function sendError(id, thrown) {
  const isErrorLike =
    thrown !== null &&
    typeof thrown === 'object' &&
    typeof thrown.name === 'string' &&
    typeof thrown.message === 'string';
  if (isErrorLike) {
    const stack = typeof thrown.stack === 'string' ? thrown.stack : `${thrown.name}: ${thrown.message}`;
    send(encode({ type: 'error', id, name: thrown.name, value: thrown.message, traceback: userStack(stack) }));
  } else {
    const shown = util.inspect(thrown);
    send(encode({ type: 'error', id, name: 'Uncaught', value: shown, traceback: `Uncaught ${shown}` }));
  }
}

// ---- execution --------------------------------------------------------------------------

// Runs one cell; resolves to the value of its last expression (undefined if none).
async function runCell(code, filename) {
  let rewritten = null;
  if (code.includes('await')) {
    try {
      rewritten = processTopLevelAwait(code);
    } catch {
      // A syntax error: compiling the original below reports it with the cell's name.
    }
  }
  const script = new vm.Script(rewritten ?? code, { filename });
  // breakOnSigint: a SIGINT stops synchronous code with an error (the REPL's Ctrl-C).
  const completion = script.runInThisContext({ breakOnSigint: true });
  if (rewritten === null) return completion;
  const interrupted = new Promise((resolve, reject) => {
    // Like the error breakOnSigint throws; its stack would only show the kernel.
    const error = Object.assign(new Error(INTERRUPTED), { code: 'ERR_SCRIPT_EXECUTION_INTERRUPTED' });
    error.stack = `Error: ${INTERRUPTED}`;
    interruptPending = () => reject(error);
  });
  completion.catch(() => {}); // once interrupted, a later rejection has no one to report to
  try {
    const wrapped = await Promise.race([completion, interrupted]);
    return wrapped?.value; // the rewriter returns { value } when the cell ends in an expression
  } finally {
    interruptPending = null;
  }
}

// Resolves once everything written to `stream` has reached its file descriptor.
function drained(stream) {
  if (stream.writableLength === 0) return Promise.resolve();
  return new Promise((resolve) => stream.once('drain', resolve));
}

async function execute(id, code) {
  cellCount += 1;
  let ok = true;
  try {
    const value = await runCell(code, `In[${cellCount}]`);
    if (value !== undefined) ok = sendResult(id, value);
  } catch (thrown) {
    ok = false;
    sendError(id, thrown);
  }
  await Promise.all([drained(process.stdout), drained(process.stderr)]);
  send(encode({ type: 'done', id, status: ok ? 'ok' : 'error' }));
}

// ---- frames from the host -----------------------------------------------------------------

let queue = Promise.resolve(); // executions never overlap
let chunks = []; // received, not yet parsed
let buffered = 0;
let needed = 4; // bytes to wait for before parsing: a header, or a header and its payload

function handleFrame(payload) {
  let message;
  try {
    message = JSON.parse(payload.toString('utf8'));
  } catch (error) {
    log(`ignoring a frame that is not JSON: ${error.message}`);
    return;
  }
  if (message === null || typeof message !== 'object' || message.type !== 'execute') {
    log(`ignoring a frame of unknown type ${JSON.stringify(message?.type)}`);
    return;
  }
  if (typeof message.id !== 'string' || typeof message.code !== 'string') {
    log('ignoring an execute frame without a string id and code');
    return;
  }
  queue = queue.then(() => execute(message.id, message.code));
}

socket.on('data', (chunk) => {
  chunks.push(chunk);
  buffered += chunk.length;
  if (buffered < needed) return; // a large frame is joined once, when complete
  let inbox = Buffer.concat(chunks);
  while (inbox.length >= 4) {
    const size = inbox.readUInt32BE(0);
    if (size > MAX_FRAME) {
      log(`the host sent a frame of ${size} bytes`);
      process.exit(2);
    }
    if (inbox.length < 4 + size) break;
    handleFrame(inbox.subarray(4, 4 + size));
    inbox = inbox.subarray(4 + size);
  }
  chunks = [inbox];
  buffered = inbox.length;
  needed = inbox.length >= 4 ? 4 + inbox.readUInt32BE(0) : 4;
});
socket.on('end', () => process.exit(0));
socket.on('error', () => process.exit(0)); // the host went away

// Outside synchronous cell code (which breakOnSigint covers), SIGINT interrupts an
// awaiting cell; while idle it is ignored instead of killing the kernel.
process.on('SIGINT', () => interruptPending?.());
// A callback that throws after its cell finished (a timer, a promise nobody awaits) must
// not kill the session: report it on stderr, like the REPL.
process.on('uncaughtException', (error) => {
  const text = error instanceof Error && error.stack ? userStack(error.stack) : util.inspect(error);
  process.stderr.write(`Uncaught ${text}\n`);
});

globalThis.require = createRequire(path.join(process.cwd(), '[cell]'));
send(encode({ type: 'ready', language: 'javascript', version: process.versions.node }));
