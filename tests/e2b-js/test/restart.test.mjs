// A paused sandbox across a restart of the server, with the unmodified SDK: paused, the server
// stopped (SIGTERM) and started again on the same database, `Sandbox.connect(id)` resumes it
// on its files with a fresh kernel, and the server says `memory: not kept`. The test starts a
// server of its own (a restart of the shared one would end the other tests' sandboxes) and
// passes its URL and key to each SDK call.
import assert from 'node:assert/strict'
import { after, before, describe, it } from 'node:test'
import { Sandbox } from '@e2b/code-interpreter'
import { startServer } from '../server.mjs'

describe('a paused sandbox across a restart of the server', () => {
  let server = null
  let opts = null
  let resumed = null
  before(async () => {
    server = await startServer(['e2b-js-restart'])
    opts = { apiKey: server.keys[0], apiUrl: server.url, sandboxUrl: server.url }
  })
  after(async () => {
    if (resumed) await resumed.kill()
    if (server) assert.equal(await server.stop(), true)
  })

  it('resumes on its files with a fresh kernel: memory not kept', async () => {
    const sbx = await Sandbox.create({ ...opts, metadata: { purpose: 'restart' } })
    await sbx.files.write('notes/kept.txt', 'written before the restart')
    assert.equal((await sbx.runCode('in_memory = 42')).error, undefined)
    assert.equal(await sbx.pause(), true)
    await server.restart()

    const info = await Sandbox.getInfo(sbx.sandboxId, opts)
    assert.equal(info.state, 'paused')
    assert.deepEqual(info.metadata, { purpose: 'restart' })
    resumed = await Sandbox.connect(sbx.sandboxId, opts)
    assert.equal(resumed.sandboxId, sbx.sandboxId)
    assert.equal(await resumed.files.read('notes/kept.txt'), 'written before the restart')
    assert.equal((await resumed.runCode("'in_memory' in globals()")).text, 'False')
    assert.equal((await resumed.runCode('40 + 2')).text, '42')
    assert.equal((await resumed.getInfo()).state, 'running')
    // Corral's `memory` is a key of the answer getInfo parses that the SDK drops: read from
    // the same route.
    const detail = await fetch(`${server.url}/sandboxes/${sbx.sandboxId}`, {
      headers: { 'X-API-KEY': opts.apiKey },
    })
    assert.equal(detail.status, 200)
    assert.equal((await detail.json()).memory, 'not kept')
  })

  it('runs commands in the resumed sandbox', async () => {
    assert.ok(resumed, 'the sandbox was not resumed')
    const r = await resumed.commands.run('cat notes/kept.txt; echo; pwd')
    assert.equal(r.stdout, 'written before the restart\n/workspace\n')
  })
})
