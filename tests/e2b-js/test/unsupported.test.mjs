// What the unmodified SDK gets for the calls Corral does not serve (docs/e2b.md §11, §12):
// an error that says so, never a NotFoundError (which the SDK would read as "gone") and never
// a hang; the sandbox goes on. And git, which the SDK runs through commands.run, in an image
// without git.
import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import { Sandbox } from '@e2b/code-interpreter'
import { CommandExitError, InvalidArgumentError, NotFoundError, SandboxError } from 'e2b'
import { fileSandbox } from './helpers.mjs'

const saysNotSupported = (e) => {
  assert.ok(e instanceof SandboxError, `${e?.constructor?.name}: ${e?.message}`)
  assert.ok(!(e instanceof NotFoundError), e.message)
  assert.match(e.message, /not supported by Corral/)
  return true
}

describe('unsupported calls', () => {
  const sbx = fileSandbox()

  it('refuses fork, snapshots and network updates, saying so', async () => {
    await assert.rejects(sbx().fork(), saysNotSupported)
    await assert.rejects(Sandbox.fork(sbx().sandboxId), saysNotSupported)
    await assert.rejects(sbx().createSnapshot(), saysNotSupported)
    await assert.rejects(Sandbox.listSnapshots().nextItems(), saysNotSupported)
    await assert.rejects(Sandbox.deleteSnapshot('snapshot-id'), saysNotSupported)
    await assert.rejects(sbx().updateNetwork({}), saysNotSupported)
    // The sandbox is untouched.
    assert.equal(await sbx().isRunning(), true)
    assert.equal((await sbx().runCode('6 * 7')).text, '42')
  })

  it('refuses a language the image lacks', async () => {
    // The JavaScript SDK reports the status of a non-200 /execute and drops its body (the
    // Python SDK shows the body: "not supported by Corral").
    await assert.rejects(sbx().runCode('1', { language: 'r' }), (e) => {
      assert.ok(e instanceof SandboxError && !(e instanceof NotFoundError), e.message)
      assert.match(e.message, /^501 /)
      return true
    })
    assert.equal((await sbx().runCode('1 + 1')).text, '2')
  })

  it('serves no signed URLs and no MCP gateway', async () => {
    await sbx().files.write('signed.txt', 'not through a signed URL')
    for (const made of [await sbx().downloadUrl('signed.txt'), await sbx().uploadUrl('signed.txt')]) {
      const url = new URL(made)
      assert.equal(url.origin, new URL(process.env.E2B_API_URL).origin)
      const answer = await fetch(url)
      assert.equal(answer.status, 404, made)
      assert.ok(!(await answer.text()).includes('not through a signed URL'))
    }
    assert.match(sbx().getMcpUrl(), new RegExp(`50005-${sbx().sandboxId}`))
    await assert.rejects(sbx().getMcpToken(), InvalidArgumentError)
  })

  it('runs git through commands.run: an image without git exits 127', async () => {
    await assert.rejects(sbx().git.init('repo'), (e) => {
      assert.ok(e instanceof CommandExitError, `${e?.constructor?.name}: ${e?.message}`)
      assert.equal(e.exitCode, 127)
      return true
    })
  })
})
