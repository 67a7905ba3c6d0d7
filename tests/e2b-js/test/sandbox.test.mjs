// The control plane with the unmodified SDK: create (template → image), getInfo and its
// metadata, setTimeout, Sandbox.list (filters, pages), getMetrics, pause/resume/connect,
// kill.
import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import { Sandbox } from '@e2b/code-interpreter'
import { NotFoundError, SandboxError } from 'e2b'
import { eventually } from './helpers.mjs'

describe('sandbox', () => {
  it('creates from the default template and from an image named as the template', async () => {
    const sbx = await Sandbox.create()
    try {
      assert.match(sbx.sandboxId, /\S/)
      assert.equal((await sbx.getInfo()).templateId, 'code-interpreter-v1')
      assert.equal(await sbx.isRunning(), true)
      // The SDK's local values: the domain the server gave, the access token it sends.
      assert.equal(sbx.sandboxDomain, `localhost:${new URL(process.env.E2B_API_URL).port}`)
      assert.match(sbx.trafficAccessToken, /\S{16,}/)
    } finally {
      await sbx.kill()
    }
    const byImage = await Sandbox.create('default')
    try {
      assert.equal((await byImage.runCode('1 + 1')).text, '2')
    } finally {
      await byImage.kill()
    }
    const base = await Sandbox.create('base')
    try {
      assert.equal((await base.runCode('2 + 2')).text, '4')
    } finally {
      await base.kill()
    }
    await assert.rejects(Sandbox.create('no-such-image-here'), SandboxError)
  })

  it('keeps metadata, moves the timeout, lists with filters and pages, and has metrics', async () => {
    const tag = `js-${process.pid}-${Date.now()}`
    const made = []
    try {
      for (let i = 0; i < 3; i++) {
        made.push(await Sandbox.create({ metadata: { suite: tag, n: String(i) }, timeoutMs: 120_000 }))
      }
      const info = await made[0].getInfo()
      assert.deepEqual(info.metadata, { suite: tag, n: '0' })
      assert.equal(info.state, 'running')
      const full = await Sandbox.getFullInfo(made[1].sandboxId)
      assert.deepEqual(full.metadata, { suite: tag, n: '1' })
      assert.equal(full.envdVersion, '0.5.2')
      assert.ok(full.cpuCount >= 1 && full.memoryMB > 0, JSON.stringify(full))

      const before = (await made[0].getInfo()).endAt.getTime()
      await made[0].setTimeout(3_600_000)
      const after = (await made[0].getInfo()).endAt.getTime()
      assert.ok(after > before + 3_000_000, `${before} → ${after}`)

      const paginator = Sandbox.list({ limit: 2, query: { metadata: { suite: tag } } })
      const first = await paginator.nextItems()
      assert.equal(first.length, 2)
      assert.equal(paginator.hasNext, true)
      const second = await paginator.nextItems()
      assert.equal(second.length, 1)
      assert.equal(paginator.hasNext, false)
      const ids = [...first, ...second].map((s) => s.sandboxId).sort()
      assert.deepEqual(ids, made.map((s) => s.sandboxId).sort())

      const one = await Sandbox.list({ query: { metadata: { suite: tag, n: '1' } } }).nextItems()
      assert.deepEqual(one.map((s) => s.sandboxId), [made[1].sandboxId])
      const none = await Sandbox.list({ query: { metadata: { suite: tag }, state: ['paused'] } }).nextItems()
      assert.deepEqual(none, [])

      await made[0].runCode('x = [0] * 1000000')
      const metrics = await made[0].getMetrics()
      assert.ok(metrics.length >= 1)
      const last = metrics[metrics.length - 1]
      assert.ok(last.memUsed > 0 && last.memTotal >= last.memUsed, JSON.stringify(last))
      assert.ok(last.cpuCount >= 1)
      assert.ok(last.timestamp instanceof Date)
      // start and end bound the samples.
      const hour = 3_600_000
      assert.deepEqual(await made[0].getMetrics({ start: new Date(Date.now() + hour) }), [])
      assert.deepEqual(await Sandbox.getMetrics(made[0].sandboxId, { end: new Date(Date.now() - hour) }), [])
      const recent = await made[0].getMetrics({ start: new Date(Date.now() - 60_000), end: new Date(Date.now() + 60_000) })
      assert.ok(recent.length >= 1)
    } finally {
      for (const s of made) await s.kill()
    }
  })

  it('pauses, and resumes on connect with its state', async () => {
    const sbx = await Sandbox.create({ timeoutMs: 120_000 })
    try {
      await sbx.runCode('kept = "the same interpreter"')
      await sbx.files.write('kept.txt', 'file kept')
      // A background command is frozen with the rest, and goes on after.
      const running = await sbx.commands.run('sleep 600', { background: true })
      assert.equal(await sbx.betaPause(), true)
      const paused = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
      assert.ok(paused.some((s) => s.sandboxId === sbx.sandboxId))
      assert.equal((await sbx.getInfo()).state, 'paused')

      const again = await Sandbox.connect(sbx.sandboxId)
      assert.equal((await again.getInfo()).state, 'running')
      assert.equal((await again.runCode('kept')).text, 'the same interpreter')
      assert.equal(await again.files.read('kept.txt'), 'file kept')
      assert.ok((await again.commands.list()).some((p) => p.pid === running.pid))
      assert.equal(await again.commands.kill(running.pid), true)

      // The static pause, then the instance's connect.
      assert.equal(await Sandbox.pause(sbx.sandboxId), true)
      assert.equal(await Sandbox.pause(sbx.sandboxId), false) // already paused
      assert.equal(await sbx.connect(), sbx)
      assert.equal((await sbx.getInfo()).state, 'running')
      assert.equal((await sbx.runCode('kept')).text, 'the same interpreter')
    } finally {
      await sbx.kill()
    }
  })

  it('is killed at the timeout it was given', async () => {
    const sbx = await Sandbox.create()
    try {
      await Sandbox.setTimeout(sbx.sandboxId, 2_000)
      const endAt = (await Sandbox.getInfo(sbx.sandboxId)).endAt.getTime()
      assert.ok(endAt <= Date.now() + 3_000, `endAt ${new Date(endAt).toISOString()}`)
      // Listing does not count as use (a sandbox's own plane would).
      await eventually(
        async () => !(await Sandbox.list().nextItems()).some((s) => s.sandboxId === sbx.sandboxId),
        20_000,
        'the sandbox to expire',
      )
      await assert.rejects(Sandbox.getInfo(sbx.sandboxId), NotFoundError)
      assert.equal(await sbx.isRunning(), false)
    } finally {
      await sbx.kill()
    }
  })

  it('kills: the sandbox is gone and a second kill says so', async () => {
    const sbx = await Sandbox.create()
    const id = sbx.sandboxId
    assert.equal(await sbx.kill(), true)
    assert.equal(await sbx.isRunning(), false)
    assert.equal(await Sandbox.kill(id), false)
    await assert.rejects(Sandbox.getInfo(id))
    const listed = await Sandbox.list().nextItems()
    assert.ok(!listed.some((s) => s.sandboxId === id))
  })
})
