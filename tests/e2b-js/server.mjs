// A real `corral serve` for the JavaScript E2B suite: run.mjs starts the shared one, and a test
// that must restart its server (test/restart.test.mjs) starts one of its own. The binary is
// $CORRAL_BIN, else <repo>/target/debug/corral; the database is fresh, in a temporary
// directory, with keys made by `corral key create`; the image store is $CORRAL_DATA_DIR's
// (passed through).

import { spawn, spawnSync } from 'node:child_process'
import { createServer } from 'node:net'
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..')
const START_TIMEOUT_MS = 120_000
const STOP_TIMEOUT_MS = 60_000

/** The corral binary the suite runs. */
export function corralBinary() {
  return process.env.CORRAL_BIN || join(REPO, 'target', 'debug', 'corral')
}

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

export function logTail(path, lines = 40) {
  try {
    return readFileSync(path, 'utf8').split('\n').slice(-lines).join('\n')
  } catch {
    return '(no log)'
  }
}

/**
 * Starts a server with a key per name in `keyNames`. Its `restart()` stops it (SIGTERM, which
 * must end it with status 0) and starts it again on the same database and port; `stop()`
 * stops it for good and removes its directory (false when SIGTERM did not stop it in time).
 */
export async function startServer(keyNames) {
  const binary = corralBinary()
  if (!existsSync(binary)) {
    throw new Error(`no corral binary at ${binary}: build it, set CORRAL_BIN, or set CORRAL_URL`)
  }
  const dir = mkdtempSync(join(tmpdir(), 'corral-e2b-js-'))
  const db = join(dir, 'corral.db')
  const keys = keyNames.map((name) => {
    const made = spawnSync(binary, ['key', 'create', '--name', name, '--db', db], {
      encoding: 'utf8',
    })
    const key = made.stdout.trim().split('\n').pop()
    if (made.status !== 0 || !key) {
      throw new Error(`\`corral key create\` failed (${made.status}): ${made.stderr}`)
    }
    return key
  })
  const port = await freePort()
  const url = `http://127.0.0.1:${port}`
  const logPath = join(dir, 'server.log')
  let proc = null
  let exited = null

  const launch = async () => {
    const log = openSync(logPath, 'a')
    exited = null
    proc = spawn(binary, ['serve', '--listen', `127.0.0.1:${port}`, '--db', db], {
      stdio: ['ignore', log, log],
    })
    proc.on('exit', (code, signal) => (exited = { code, signal }))
    const deadline = Date.now() + START_TIMEOUT_MS
    for (;;) {
      if (exited) {
        throw new Error(`corral serve exited (${JSON.stringify(exited)}); its log:\n${logTail(logPath)}`)
      }
      try {
        const r = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(2000) })
        if (r.status === 200) return
      } catch {
        // not up yet
      }
      if (Date.now() > deadline) {
        proc.kill('SIGKILL')
        throw new Error(`corral serve did not answer /healthz in time; its log:\n${logTail(logPath)}`)
      }
      await new Promise((r) => setTimeout(r, 100))
    }
  }

  /** SIGTERM; how the server ended, or null when it did not within the time allowed. */
  const halt = async () => {
    if (!exited) {
      const ended = new Promise((r) => proc.once('exit', () => r(true)))
      proc.kill('SIGTERM')
      let timer = null
      const stopped = await Promise.race([
        ended,
        new Promise((r) => (timer = setTimeout(() => r(false), STOP_TIMEOUT_MS))),
      ])
      clearTimeout(timer)
      if (!stopped) {
        proc.kill('SIGKILL')
        return null
      }
    }
    return exited
  }

  await launch()
  return {
    url,
    keys,
    logPath,
    restart: async () => {
      const ended = await halt()
      if (!ended || ended.code !== 0) {
        throw new Error(`corral serve did not stop cleanly on SIGTERM (${JSON.stringify(ended)}); its log:\n${logTail(logPath)}`)
      }
      await launch()
    },
    stop: async () => {
      const ended = await halt()
      if (!ended) {
        console.error(`corral serve did not stop within ${STOP_TIMEOUT_MS} ms of SIGTERM`)
        return false
      }
      rmSync(dir, { recursive: true, force: true })
      return true
    },
  }
}
