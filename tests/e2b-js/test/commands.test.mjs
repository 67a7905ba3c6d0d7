// commands.run with the unmodified SDK: output, env, cwd, exit codes, background + wait, kill.
import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import { CommandExitError } from 'e2b'
import { fileSandbox } from './helpers.mjs'

describe('commands', () => {
  const sbx = fileSandbox({ envs: { FROM_CREATE: 'made' } })

  it('runs a command with its output, env and cwd', async () => {
    const out = []
    await sbx().files.makeDir('work')
    const r = await sbx().commands.run('echo "$FOO $FROM_CREATE"; pwd; echo oops >&2', {
      envs: { FOO: 'bar' },
      cwd: '/home/user/work',
      onStdout: (line) => out.push(line),
    })
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'bar made\n/workspace/work\n')
    assert.equal(r.stderr, 'oops\n')
    assert.equal(out.join(''), r.stdout)
  })

  it('throws CommandExitError with the exit code of a failing command', async () => {
    await assert.rejects(sbx().commands.run('echo partial; exit 3'), (e) => {
      assert.ok(e instanceof CommandExitError)
      assert.equal(e.exitCode, 3)
      assert.equal(e.stdout, 'partial\n')
      return true
    })
  })

  it('runs a background command and waits for it', async () => {
    const handle = await sbx().commands.run('sleep 1; echo done', { background: true })
    assert.ok(handle.pid > 0)
    const r = await handle.wait()
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'done\n')
  })

  it('kills a background command', async () => {
    const handle = await sbx().commands.run('sleep 60', { background: true })
    assert.equal(await handle.kill(), true)
    await assert.rejects(handle.wait(), (e) => {
      assert.ok(e instanceof CommandExitError)
      assert.match(e.error, /killed/)
      return true
    })
    // Once it has ended there is nothing to kill.
    assert.equal(await sbx().commands.kill(handle.pid), false)
    const r = await sbx().commands.run('echo after')
    assert.equal(r.stdout, 'after\n')
  })

  it('ends the call at its timeout, not the command', async () => {
    const started = Date.now()
    await assert.rejects(sbx().commands.run('sleep 30', { timeoutMs: 1500 }))
    assert.ok(Date.now() - started < 20_000)
    // The stream ended, not the command (docs/e2b.md §11).
    const left = (await sbx().commands.list()).filter((p) => p.args.at(-1) === 'sleep 30')
    assert.equal(left.length, 1)
    assert.equal(await sbx().commands.kill(left[0].pid), true)
    assert.equal((await sbx().commands.run('echo next')).stdout, 'next\n')
  })
})
