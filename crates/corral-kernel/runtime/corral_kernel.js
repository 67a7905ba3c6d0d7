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

const { spawn } = require('child_process');
const fs = require('fs');
const net = require('net');
const os = require('os');
const path = require('path');
const util = require('util');
const vm = require('vm');
const { createRequire } = require('module');
const { processTopLevelAwait } = requireReplRewriter();

const MAX_FRAME = 64 << 20;
const MAX_RESULT = 32 << 20;
const INTERRUPTED = 'Script execution was interrupted by `SIGINT`';
const WORKSPACE = '/workspace'; // where commands run unless told otherwise

const socket = new net.Socket({ fd: 3, readable: true, writable: true });
let cellCount = 0;
// The code policy (corral_policy.js), once the host sent one: every cell is checked against it.
let codePolicy = null;
let policyRules = null;
// Rejects the cell being awaited, or kills the running command, when an interrupt arrives.
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
    .filter((line) => !(/^\s+at /.test(line) && (/[( ]node:/.test(line) || line.includes(__dirname + '/corral_'))))
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
    const error = { type: 'error', id, name: thrown.name, value: thrown.message, traceback: userStack(stack) };
    if (codePolicy !== null && thrown instanceof codePolicy.PolicyViolation) error.violations = thrown.violations;
    send(encode(error));
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

// Runs the cell `code`; with `env`, those variables are set in `process.env` for this
// execution only (its child processes see them too) and put back as they were after.
async function execute(id, code, env) {
  if (env === undefined || env === null) return executeCell(id, code);
  const saved = new Map(Object.keys(env).map((name) => [name, process.env[name]]));
  Object.assign(process.env, env);
  try {
    return await executeCell(id, code);
  } finally {
    for (const [name, value] of saved) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
  }
}

async function executeCell(id, code) {
  const refused = codePolicy === null ? null : codePolicy.refusal(policyRules, code);
  if (refused !== null) {
    const text = `PolicyViolation: ${refused.message}`;
    send(encode({ type: 'error', id, name: refused.name, value: refused.message, traceback: text, violations: refused.violations }));
    send(encode({ type: 'done', id, status: 'error' }));
    return;
  }
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

// ---- commands -----------------------------------------------------------------------------

// The readable text of a failed spawn: "No such file or directory: 'prog'".
function spawnErrorText(error, what) {
  const known = typeof error.errno === 'number' ? util.getSystemErrorMap().get(error.errno) : undefined;
  if (known === undefined) return error.message;
  const text = known[1].charAt(0).toUpperCase() + known[1].slice(1);
  return `${text}: '${what}'`;
}

// Runs a program beside the cells, with stdin /dev/null, stdout/stderr on fd 1/2 and
// /dev/null at fd 3 (not the host's socket), in its own session (detached), in `cwd`
// (relative to the workspace), with this process's environment plus `env`. SIGINT kills
// its process group. Resolves to null after exit status 0, else [name, value] of the error.
async function runCommand(argv, cwd, env) {
  const dir = path.resolve(WORKSPACE, cwd ?? '');
  try {
    if (!fs.statSync(dir).isDirectory()) return ['CommandError', `Not a directory: '${dir}'`];
  } catch (error) {
    return ['CommandError', spawnErrorText(error, dir)];
  }
  let child;
  const devNull = fs.openSync('/dev/null', 'r');
  try {
    child = spawn(argv[0], argv.slice(1), {
      cwd: dir,
      env: { ...process.env, ...env },
      stdio: ['ignore', 1, 2, devNull],
      detached: true,
    });
  } catch (error) {
    return ['CommandError', error.message];
  } finally {
    fs.closeSync(devNull);
  }
  let interrupted = false;
  const ended = new Promise((resolve) => {
    child.once('error', (error) => resolve({ error }));
    child.once('exit', (code, signal) => resolve({ code, signal }));
  });
  interruptPending = () => {
    interrupted = true;
    try {
      process.kill(-child.pid, 'SIGKILL');
    } catch {
      // the group is gone already
    }
  };
  try {
    const { error, code, signal } = await ended;
    if (error !== undefined) return ['CommandError', spawnErrorText(error, argv[0])];
    let status = code;
    if (interrupted && signal === 'SIGKILL') status = 128 + os.constants.signals.SIGINT;
    else if (signal !== null) status = 128 + os.constants.signals[signal];
    return status === 0 ? null : ['ExitCode', String(status)];
  } finally {
    interruptPending = null;
  }
}

async function command(id, argv, cwd, env) {
  const failure = await runCommand(argv, cwd, env);
  if (failure !== null) {
    send(encode({ type: 'error', id, name: failure[0], value: failure[1], traceback: '' }));
  }
  send(encode({ type: 'done', id, status: failure === null ? 'ok' : 'error' }));
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
  const kind = message !== null && typeof message === 'object' ? message.type : undefined;
  if (kind === 'execute') {
    const env = message.env;
    const envOk = env === undefined || env === null
      || (typeof env === 'object' && !Array.isArray(env) && Object.values(env).every((v) => typeof v === 'string'));
    if (typeof message.id !== 'string' || typeof message.code !== 'string' || !envOk) {
      log('ignoring an execute frame without a string id and code (and env of strings)');
      return;
    }
    queue = queue.then(() => execute(message.id, message.code, env));
  } else if (kind === 'command') {
    if (!isCommand(message)) {
      log('ignoring a command frame without a string id, argv, cwd and env');
      return;
    }
    queue = queue.then(() => command(message.id, message.argv, message.cwd, message.env));
  } else if (kind === 'policy') {
    queue = queue.then(() => setPolicy(message));
  } else {
    log(`ignoring a frame of unknown type ${JSON.stringify(kind)}`);
  }
}

// Checks every cell against the code policy of a `policy` frame from now on, and hooks
// `require` (docs/code-policy.md). Only the first one counts.
function setPolicy(message) {
  if (codePolicy !== null) {
    log('ignoring a second policy frame');
    return;
  }
  const library = require(path.join(__dirname, 'corral_policy.js'));
  try {
    policyRules = library.fromMessage(message);
  } catch (error) {
    log(`ignoring a policy frame: ${error.message}`);
    return;
  }
  codePolicy = library;
  library.install(policyRules, [__filename]);
}

// True when `message` has the fields of a `command` frame, well typed.
function isCommand(message) {
  const { id, argv, cwd, env } = message;
  const isStrings = (list) => list.every((item) => typeof item === 'string');
  return (
    typeof id === 'string' &&
    Array.isArray(argv) &&
    argv.length > 0 &&
    isStrings(argv) &&
    (cwd === undefined || cwd === null || typeof cwd === 'string') &&
    (env === undefined || env === null || (typeof env === 'object' && !Array.isArray(env) && isStrings(Object.values(env))))
  );
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
// awaiting cell or kills a running command; while idle it is ignored instead of killing
// the kernel.
process.on('SIGINT', () => interruptPending?.());
// A callback that throws after its cell finished (a timer, a promise nobody awaits) must
// not kill the session: report it on stderr, like the REPL.
process.on('uncaughtException', (error) => {
  const text = error instanceof Error && error.stack ? userStack(error.stack) : util.inspect(error);
  process.stderr.write(`Uncaught ${text}\n`);
});

globalThis.require = createRequire(path.join(process.cwd(), '[cell]'));
send(encode({ type: 'ready', language: 'javascript', version: process.versions.node }));
