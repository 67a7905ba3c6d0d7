'use strict';
// Corral's code policy for JavaScript, inside the sandbox (docs/code-policy.md).
//
// Two checks, both defence in depth and never a boundary (the code runs in this process and
// can undo them; the sandbox is what holds):
//
// - refusal(): before code runs, Node's own parser (acorn, `internal/deps/acorn`, hence
//   `--expose-internals`) reads it, and every module it names with a literal is judged:
//   `import ... from 'x'`, `import 'x'`, `export ... from 'x'`, `import('x')`, `require('x')`,
//   each with its line. Code that does not parse is not judged: running it reports its
//   SyntaxError. Without the parser no code is run at all.
// - install(): a hook on `Module._load`, through which every `require` goes: a module that
//   user code requires is judged, by package (`fs` for `node:fs` and `fs/promises`, `@a/b` for
//   `@a/b/c`; a path by the package its file belongs to, and not at all when the file is user
//   code itself). Modules' own requires are not judged, so an allowed package loads what it
//   needs. User code is code whose file is not in the image's directories: the program, cells,
//   files in /workspace or /tmp. ES module imports are not hooked: only the pre-check sees them.
//
// As the kernel's library: fromMessage(), refusal(), install(). As a preload of a one-shot run
// (`node --expose-internals --require /run/corral/corral_policy.js PROGRAM`): the rules are in
// corral_code_policy.json beside this file; PROGRAM is refused (an error frame on fd 3, the message
// on stderr, exit status 1) or runs under the hook.

const fs = require('fs');
const Module = require('module');
const path = require('path');

const NOT_ALLOWED = 'not_allowed';
const DENIED = 'denied';
// Beside this file (/run/corral), where the host places a one-shot run's rules.
const RULES_FILE = path.join(__dirname, 'corral_code_policy.json');
// Where the sandbox's code can write, or the program is placed: files there are user code.
const USER_DIRS = ['/workspace/', '/tmp/', '/dev/', '/run/corral/', '/proc/'];
const LISTED = 20; // modules listed in a message, at most

let acorn = null;
try {
  acorn = require('internal/deps/acorn/acorn/dist/acorn');
} catch {
  // Refused in refusal(): no code runs unchecked.
}

class PolicyViolation extends Error {
  constructor(message, violations) {
    super(message);
    this.name = 'PolicyViolation';
    // As for a module that is not installed: code that falls back when one is missing goes on.
    this.code = 'MODULE_NOT_FOUND';
    this.violations = violations;
  }
}

// The package a specifier names (`fs` for `node:fs` and `fs/promises`, `@a/b` for `@a/b/c`),
// or null for a path or a URL.
function packageOf(specifier) {
  const name = specifier.startsWith('node:') ? specifier.slice(5) : specifier;
  if (name === '' || name.startsWith('.') || name.startsWith('/') || /^[a-zA-Z][\w+.-]*:/.test(name)) {
    return null;
  }
  const parts = name.split('/');
  return name.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0];
}

// The package a module file belongs to (the part after the last node_modules/ or nodejs/),
// else the file itself.
function packageOfFile(filename) {
  const matches = [...filename.matchAll(/\/(?:node_modules|nodejs)\/((?:@[^/]+\/)?[^/]+)/g)];
  return matches.length > 0 ? matches[matches.length - 1][1] : filename;
}

function isStrings(value) {
  return Array.isArray(value) && value.every((item) => typeof item === 'string');
}

function listing(names) {
  const shown = [...names].sort();
  if (shown.length === 0) return 'none';
  const more = shown.length - LISTED;
  return shown.slice(0, LISTED).join(', ') + (more > 0 ? ` and ${more} more` : '');
}

// The module rules of a code policy: `allowed` (null: any module) and `denied` packages; denied wins.
class Policy {
  constructor(allowed, denied) {
    this.allowed = allowed === null ? null : new Set(allowed);
    this.denied = new Set(denied);
  }

  rule(name) {
    if (this.denied.has(name)) return DENIED;
    if (this.allowed !== null && !this.allowed.has(name)) return NOT_ALLOWED;
    return null;
  }

  describe(violations) {
    const parts = violations.map((v) => {
      const where = v.line === null ? '' : `line ${v.line}: `;
      return `${where}import of '${v.module}' is ${v.rule === DENIED ? 'denied' : 'not allowed'}`;
    });
    const notes = [];
    if (violations.some((v) => v.rule === NOT_ALLOWED)) notes.push(`allowed modules: ${listing(this.allowed)}`);
    if (violations.some((v) => v.rule === DENIED)) notes.push(`denied modules: ${listing(this.denied)}`);
    const text = parts.join('; ');
    return notes.length > 0 ? `${text} (${notes.join('; ')})` : text;
  }
}

// The rules of a host frame's `allowed_modules` and `denied_modules`.
function fromMessage(message) {
  const allowed = message.allowed_modules ?? null;
  const denied = message.denied_modules ?? [];
  if (!((allowed === null || isStrings(allowed)) && isStrings(denied))) {
    throw new TypeError('allowed_modules and denied_modules must be lists of strings');
  }
  return new Policy(allowed, denied);
}

// ---- the pre-check ------------------------------------------------------------------------

function parse(source) {
  const options = {
    ecmaVersion: 'latest',
    allowHashBang: true,
    allowAwaitOutsideFunction: true,
    allowReturnOutsideFunction: true,
    allowImportExportEverywhere: true,
    locations: true,
  };
  for (const sourceType of ['module', 'script']) {
    try {
      return acorn.parse(source, { ...options, sourceType });
    } catch {
      // A script that is not a module (`with`, octal literals), or no JavaScript at all.
    }
  }
  return null;
}

function literal(node) {
  if (node?.type === 'Literal' && typeof node.value === 'string') return node.value;
  if (node?.type === 'TemplateLiteral' && node.expressions.length === 0) return node.quasis[0].value.cooked;
  return null;
}

// The literal specifier a node loads, if it loads one.
function loaded(node) {
  switch (node.type) {
    case 'ImportDeclaration':
    case 'ExportAllDeclaration':
    case 'ExportNamedDeclaration':
      return node.source ? literal(node.source) : null;
    case 'ImportExpression':
      return literal(node.source);
    case 'CallExpression': {
      const callee = node.callee;
      const isRequire =
        (callee.type === 'Identifier' && callee.name === 'require') ||
        (callee.type === 'MemberExpression' &&
          !callee.computed &&
          callee.property.type === 'Identifier' &&
          callee.property.name === 'require');
      return isRequire ? literal(node.arguments[0]) : null;
    }
    default:
      return null;
  }
}

// The forbidden modules `source` loads, in the order of their lines.
function precheck(policy, source) {
  const tree = parse(source);
  if (tree === null) return [];
  const found = new Map();
  const stack = [tree];
  while (stack.length > 0) {
    const node = stack.pop();
    const specifier = loaded(node);
    const name = specifier === null ? null : packageOf(specifier);
    const rule = name === null ? null : policy.rule(name);
    if (rule !== null) {
      const line = node.loc.start.line;
      found.set(`${line}\0${name}`, { line, module: name, rule });
    }
    for (const value of Object.values(node)) {
      if (Array.isArray(value)) {
        for (const item of value) if (typeof item?.type === 'string') stack.push(item);
      } else if (typeof value?.type === 'string') {
        stack.push(value);
      }
    }
  }
  return [...found.values()].sort((a, b) => a.line - b.line || (a.module < b.module ? -1 : 1));
}

// The error that refuses `source` before it runs, or null when the policy lets it run.
function refusal(policy, source) {
  if (acorn === null) {
    const message =
      "the code policy cannot check JavaScript here: this Node.js has no parser at " +
      'internal/deps/acorn (run node with --expose-internals). The code was not run.';
    return new PolicyViolation(message, []);
  }
  const violations = precheck(policy, source);
  if (violations.length === 0) return null;
  return new PolicyViolation(`${policy.describe(violations)}. The code was not run.`, violations);
}

// ---- the hook -----------------------------------------------------------------------------

let installed = false;

// The line of the user code that is loading a module: the first frame of the stack outside
// Node, this file and `runtimeFiles`.
function callerLine(ours) {
  const holder = {};
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = 30;
  Error.captureStackTrace(holder, callerLine);
  Error.stackTraceLimit = limit;
  for (const line of holder.stack.split('\n').slice(1)) {
    const at = /\(?([^()\s]+):(\d+):\d+\)?$/.exec(line.trim());
    if (at && !at[1].startsWith('node:') && !ours.has(at[1])) return Number(at[2]);
  }
  return null;
}

// Judges what user code requires, from now on, for the rest of the process (once: a second
// call changes nothing). `runtimeFiles` are the file names of the caller's code (the kernel's).
function install(policy, runtimeFiles) {
  if (installed) return;
  installed = true;
  const ours = new Set([__filename, ...runtimeFiles]);
  const isUser = (filename) =>
    typeof filename === 'string' &&
    !ours.has(filename) &&
    (!filename.startsWith('/') || USER_DIRS.some((dir) => filename.startsWith(dir)));

  const judge = (request, parent) => {
    let name = packageOf(request);
    if (name === null) {
      let filename;
      try {
        filename = Module._resolveFilename(request, parent, false);
      } catch {
        return; // not found: the load itself says so
      }
      if (isUser(filename)) return; // the code's own file: its requires are judged in turn
      name = packageOfFile(filename);
    }
    const rule = policy.rule(name);
    if (rule !== null) {
      const violations = [{ line: callerLine(ours), module: name, rule }];
      throw new PolicyViolation(policy.describe(violations), violations);
    }
  };

  const load = Module._load;
  Module._load = function _load(request, parent, isMain) {
    if (!isMain && typeof request === 'string' && isUser(parent?.filename)) judge(request, parent);
    return load.apply(this, arguments); // eslint-disable-line prefer-rest-params
  };
}

module.exports = { PolicyViolation, fromMessage, refusal, install };

// ---- a one-shot run's preload -------------------------------------------------------------

// As the kernel's encode(): a lone surrogate, which the host rejects, becomes U+FFFD.
const LONE_SURROGATE = /(?<!\\)((?:\\\\)*)\\ud[89a-f][0-9a-f]{2}/g;

function writeFrame(fd, message) {
  const payload = Buffer.from(JSON.stringify(message).replace(LONE_SURROGATE, '$1\\ufffd'), 'utf8');
  const header = Buffer.alloc(4);
  header.writeUInt32BE(payload.length);
  const frame = Buffer.concat([header, payload]);
  for (let at = 0; at < frame.length; ) at += fs.writeSync(fd, frame, at);
}

function preload() {
  const policy = fromMessage(JSON.parse(fs.readFileSync(RULES_FILE, 'utf8')));
  const refused = refusal(policy, fs.readFileSync(process.argv[1], 'utf8'));
  if (refused !== null) {
    const text = `PolicyViolation: ${refused.message}\n`;
    fs.writeSync(2, text);
    const error = { type: 'error', id: 'oneshot', name: refused.name, value: refused.message };
    writeFrame(3, { ...error, traceback: text, violations: refused.violations });
    writeFrame(3, { type: 'done', id: 'oneshot', status: 'error' });
    process.exit(1);
  }
  fs.closeSync(3); // the program has nothing to tell the host
  install(policy, []);
}

if (module.parent?.id === 'internal/preload') preload();
