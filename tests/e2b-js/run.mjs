// The JavaScript E2B suite's entry point: starts a real `corral serve` (as tests/e2b/conftest.py
// does for the Python SDK), points the unmodified SDK at it, runs every test/*.test.mjs with
// Node's own test runner, and stops the server.
//
//   node tests/e2b-js/run.mjs            # every test/*.test.mjs
//   node tests/e2b-js/run.mjs files      # the files whose names contain "files"
//
// With CORRAL_URL set (and CORRAL_API_KEY, and CORRAL_OTHER_API_KEY: a second key of that
// server, for the tenancy tests), the tests use that server instead. Otherwise server.mjs
// starts one (and the restart test one more of its own); it gets SIGTERM at the end.

import { spawnSync } from 'node:child_process'
import { readdirSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { corralBinary, logTail, startServer } from './server.mjs'

const HERE = dirname(fileURLToPath(import.meta.url))

let server = null
let url = (process.env.CORRAL_URL || '').replace(/\/+$/, '')
let key = process.env.CORRAL_API_KEY || 'corral-missing-api-key'
let otherKey = process.env.CORRAL_OTHER_API_KEY || ''
if (!url) {
  server = await startServer(['e2b-js-test', 'e2b-js-other-tenant'])
  url = server.url
  ;[key, otherKey] = server.keys
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
  // The binary, for the tests that start a server of their own (a restart).
  CORRAL_BIN: corralBinary(),
}
delete env.E2B_DOMAIN

// `node run.mjs NAME…` runs the test files whose names contain one of the NAMEs.
const only = process.argv.slice(2)
const files = readdirSync(join(HERE, 'test'))
  .filter((f) => f.endsWith('.test.mjs'))
  .filter((f) => only.length === 0 || only.some((name) => f.includes(name)))
  .sort()
  .map((f) => join(HERE, 'test', f))
if (files.length === 0) {
  console.error(`no test file matches ${JSON.stringify(only)}`)
  process.exit(2)
}
// --test-force-exit: a file's process ends when its tests have, not when the SDK's last timer
// does (runCode leaves its request timer running when the answer is an error status).
const run = spawnSync(process.execPath, ['--test', '--test-concurrency=1', '--test-force-exit', ...files], {
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
