// What the test files share: a sandbox per test file, killed at the end, and a shell helper.
import { after, before } from 'node:test'
import { Sandbox } from '@e2b/code-interpreter'

/** A sandbox made before the file's tests and killed after them: `sbx()` is it. */
export function fileSandbox(opts) {
  let sandbox = null
  before(async () => {
    sandbox = await Sandbox.create(opts)
  })
  after(async () => {
    if (sandbox) await sandbox.kill()
  })
  return () => sandbox
}

/** Runs a shell command in the sandbox; its stdout. */
export async function sh(sandbox, cmd) {
  const r = await sandbox.commands.run(cmd)
  return r.stdout
}

/** Waits until `check()` is true (polled every 100 ms), or fails after `ms`. */
export async function eventually(check, ms = 10_000, what = 'the condition') {
  const deadline = Date.now() + ms
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}
