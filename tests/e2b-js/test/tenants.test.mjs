// A second tenant (another API key) reaches none of the first's sandboxes through the
// unmodified SDK: not in its list, no info, no connect, no kill, no metrics, no pause.
import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import { Sandbox } from '@e2b/code-interpreter'
import { NotFoundError, SandboxError } from 'e2b'
import { fileSandbox } from './helpers.mjs'

const other = process.env.CORRAL_OTHER_API_KEY

describe('tenants', () => {
  const sbx = fileSandbox({ metadata: { owner: 'first' } })

  it('has a second key to try with', () => {
    assert.ok(other, 'CORRAL_OTHER_API_KEY is not set (run.mjs makes one)')
    assert.notEqual(other, process.env.E2B_API_KEY)
  })

  it("cannot list, inspect, connect to, pause or kill another key's sandbox", async () => {
    const id = sbx().sandboxId
    const as = { apiKey: other }
    const theirs = await Sandbox.list({ ...as, query: { metadata: { owner: 'first' } } }).nextItems()
    assert.deepEqual(theirs, [])
    await assert.rejects(Sandbox.getInfo(id, as), NotFoundError)
    await assert.rejects(Sandbox.connect(id, as), (e) => e instanceof NotFoundError || e instanceof SandboxError)
    await assert.rejects(Sandbox.getMetrics(id, as), (e) => e instanceof NotFoundError || e instanceof SandboxError)
    await assert.rejects(Sandbox.betaPause(id, as), (e) => e instanceof NotFoundError || e instanceof SandboxError)
    assert.equal(await Sandbox.kill(id, as), false)
    // The owner's sandbox is untouched.
    const info = await sbx().getInfo()
    assert.equal(info.state, 'running')
    assert.equal((await sbx().runCode('6 * 7')).text, '42')
  })
})
