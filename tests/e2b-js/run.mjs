// The JavaScript E2B suite's entry point: starts a real `corral serve` (as tests/e2b/conftest.py
// does for the Python SDK), points the unmodified SDK at it, runs every test/*.test.mjs with
// Node's own test runner, and stops the server.
//
//   node tests/e2b-js/run.mjs
//
// With CORRAL_URL set (and CORRAL_API_KEY, and CORRAL_OTHER_API_KEY: a second key of that
// server, for the tenancy tests), the tests use that server instead. Otherwise the binary is $CORRAL_BIN, else <repo>/target/debug/corral; the
// database is fresh, in a temporary directory, with a key made by `corral key create`; the
// image store is $CORRAL_DATA_DIR's (passed through). The server gets SIGTERM at the end.

import { spawn, spawnSync } from 'node:child_process'
import { createServer } from 'node:net'
import { existsSync, mkdtempSync, openSync, readFileSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

const HERE = dirname(fileURLToPath(import.meta.url))
const REPO = resolve(HERE, '..', '..')
const START_TIMEOUT_MS = 120_000
const STOP_TIMEOUT_MS = 60_000

function freePort() {
  return new Promise((ok, fail) => {
    const server = createServer()
    server.on('error', fail)
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address()
      server.close(() => ok(port))
    })
  })
}

function logTail(path, lines = 40) {
  try {
    return readFileSync(path, 'utf8').split('\n').slice(-lines).join('\n')
  } catch {
    return '(no log)'
  }
}

async function startServer() {
  const binary = process.env.CORRAL_BIN || join(REPO, 'target', 'debug', 'corral')
  if (!existsSync(binary)) {
    throw new Error(`no corral binary at ${binary}: build it, set CORRAL_BIN, or set CORRAL_URL`)
  }
  const dir = mkdtempSync(join(tmpdir(), 'corral-e2b-js-'))
  const db = join(dir, 'corral.db')
  const makeKey = (name) => {
    const made = spawnSync(binary, ['key', 'create', '--name', name, '--db', db], {
      encoding: 'utf8',
    })
    const key = made.stdout.trim().split('\n').pop()
    if (made.status !== 0 || !key) {
      throw new Error(`\`corral key create\` failed (${made.status}): ${made.stderr}`)
    }
    return key
  }
  const key = makeKey('e2b-js-test')
  const otherKey = makeKey('e2b-js-other-tenant')
  const port = await freePort()
  const url = `http://127.0.0.1:${port}`
  const logPath = join(dir, 'server.log')
  const log = openSync(logPath, 'w')
  const proc = spawn(binary, ['serve', '--listen', `127.0.0.1:${port}`, '--db', db], {
    stdio: ['ignore', log, log],
  })
  let exited = null
  proc.on('exit', (code, signal) => (exited = { code, signal }))
  const deadline = Date.now() + START_TIMEOUT_MS
  for (;;) {
    if (exited) {
      throw new Error(`corral serve exited (${JSON.stringify(exited)}); its log:\n${logTail(logPath)}`)
    }
    try {
      const r = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(2000) })
      if (r.status === 200) break
    } catch {
      // not up yet
    }
    if (Date.now() > deadline) {
      proc.kill('SIGKILL')
      throw new Error(`corral serve did not answer /healthz in time; its log:\n${logTail(logPath)}`)
    }
    await new Promise((r) => setTimeout(r, 100))
  }
  const stop = async () => {
    if (!exited) {
      proc.kill('SIGTERM')
      const stopped = await Promise.race([
        new Promise((r) => proc.once('exit', () => r(true))),
        new Promise((r) => setTimeout(() => r(false), STOP_TIMEOUT_MS)),
      ])
      if (!stopped) {
        proc.kill('SIGKILL')
        console.error(`corral serve did not stop within ${STOP_TIMEOUT_MS} ms of SIGTERM`)
        return false
      }
    }
    rmSync(dir, { recursive: true, force: true })
    return true
  }
  return { url, key, otherKey, stop, logPath }
}

let server = null
let url = (process.env.CORRAL_URL || '').replace(/\/+$/, '')
let key = process.env.CORRAL_API_KEY || 'corral-missing-api-key'
let otherKey = process.env.CORRAL_OTHER_API_KEY || ''
if (!url) {
  server = await startServer()
  ;({ url, key, otherKey } = server)
}

// What makes the SDK speak plain HTTP to one server: both URLs, http://, no trailing slash.
// E2B_DEBUG must stay off (in debug mode the SDK sends no create or kill at all).
const env = {
  ...process.env,
  E2B_API_URL: url,
  E2B_SANDBOX_URL: url,
  E2B_API_KEY: key,
  E2B_DEBUG: 'false',
  // A second tenant's key, for the tests that one tenant cannot reach another's sandboxes.
  CORRAL_OTHER_API_KEY: otherKey,
}
delete env.E2B_DOMAIN

const files = readdirSync(join(HERE, 'test'))
  .filter((f) => f.endsWith('.test.mjs'))
  .sort()
  .map((f) => join(HERE, 'test', f))
const run = spawnSync(process.execPath, ['--test', '--test-concurrency=1', ...files], {
  stdio: 'inherit',
  env,
  cwd: HERE,
})
let status = run.status ?? 1
if (status !== 0 && server) {
  console.error(`the server's log (last lines):\n${logTail(server.logPath)}`)
}
if (server && !(await server.stop())) {
  status = status || 1
}
process.exit(status)
