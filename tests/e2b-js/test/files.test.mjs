// files.*: write/read, list, exists, getInfo, makeDir, rename, remove, watchDir, with the
// unmodified SDK. Paths: relative ones and /home/user/… name the workspace (/workspace).
import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import { FileType, FilesystemEventType, InvalidArgumentError, NotFoundError, SandboxError } from 'e2b'
import { eventually, fileSandbox, sh } from './helpers.mjs'

describe('files', () => {
  const sbx = fileSandbox()

  it('writes and reads text and bytes, relative and under /home/user', async () => {
    const info = await sbx().files.write('notes/a.txt', 'hello')
    assert.equal(info.name, 'a.txt')
    assert.equal(info.path, '/workspace/notes/a.txt')
    assert.equal(await sbx().files.read('/home/user/notes/a.txt'), 'hello')
    assert.equal(await sbx().files.read('/workspace/notes/a.txt'), 'hello')
    const bytes = new Uint8Array([0, 1, 2, 255])
    await sbx().files.write('bin.dat', bytes.buffer)
    const back = await sbx().files.read('bin.dat', { format: 'bytes' })
    assert.deepEqual(Array.from(back), [0, 1, 2, 255])
    // The program inside sees the same file.
    assert.equal(await sh(sbx(), 'cat /workspace/notes/a.txt'), 'hello')
    await assert.rejects(sbx().files.read('no-such-file'), NotFoundError)
  })

  it('reads as a blob and as a stream, and writes several files at once', async () => {
    const written = await sbx().files.writeFiles([
      { path: 'many/one.txt', data: 'one' },
      { path: '/home/user/many/two.bin', data: new Uint8Array([7, 8, 9]).buffer },
    ])
    assert.deepEqual(written.map((w) => w.path), ['/workspace/many/one.txt', '/workspace/many/two.bin'])
    const blob = await sbx().files.read('many/one.txt', { format: 'blob' })
    assert.equal(await blob.text(), 'one')
    const stream = await sbx().files.read('many/two.bin', { format: 'stream' })
    const chunks = []
    for await (const chunk of stream) chunks.push(...chunk)
    assert.deepEqual(chunks, [7, 8, 9])
  })

  it('lists with depth and entry info', async () => {
    await sbx().files.write('tree/x.txt', '12345')
    await sbx().files.write('tree/sub/y.txt', 'y')
    const top = await sbx().files.list('tree')
    assert.deepEqual(
      top.map((e) => [e.name, e.type]),
      [['sub', FileType.DIR], ['x.txt', FileType.FILE]],
    )
    const x = top.find((e) => e.name === 'x.txt')
    assert.equal(x.size, 5)
    assert.equal(x.path, '/workspace/tree/x.txt')
    assert.equal(x.permissions, '-rw-r--r--')
    assert.ok(x.modifiedTime instanceof Date && !Number.isNaN(x.modifiedTime.getTime()))
    const deep = await sbx().files.list('tree', { depth: 2 })
    assert.deepEqual(
      deep.map((e) => e.path),
      ['/workspace/tree/sub', '/workspace/tree/sub/y.txt', '/workspace/tree/x.txt'],
    )
    await assert.rejects(sbx().files.list('no-such-dir'), NotFoundError)
  })

  it('says whether a path exists, and what it is', async () => {
    await sbx().files.write('here.txt', 'x')
    assert.equal(await sbx().files.exists('here.txt'), true)
    assert.equal(await sbx().files.exists('not-here.txt'), false)
    const info = await sbx().files.getInfo('here.txt')
    assert.equal(info.type, FileType.FILE)
    assert.equal(info.size, 1)
    assert.equal((await sbx().files.getInfo('.')).type, FileType.DIR)
    await assert.rejects(sbx().files.getInfo('not-here.txt'), NotFoundError)
  })

  it('makes directories with their parents, and says whether it made them', async () => {
    assert.equal(await sbx().files.makeDir('made/a/b'), true)
    assert.equal(await sbx().files.makeDir('made/a/b'), false)
    assert.equal((await sbx().files.getInfo('made/a')).type, FileType.DIR)
  })

  it('renames, and never replaces what is at the destination', async () => {
    await sbx().files.write('mv/from.txt', 'from')
    await sbx().files.write('mv/taken.txt', 'taken')
    const moved = await sbx().files.rename('mv/from.txt', 'mv/deeper/to.txt')
    assert.equal(moved.path, '/workspace/mv/deeper/to.txt')
    assert.equal(await sbx().files.read('mv/deeper/to.txt'), 'from')
    assert.equal(await sbx().files.exists('mv/from.txt'), false)
    await assert.rejects(sbx().files.rename('mv/deeper/to.txt', 'mv/taken.txt'), SandboxError)
    assert.equal(await sbx().files.read('mv/taken.txt'), 'taken')
    assert.equal(await sbx().files.read('mv/deeper/to.txt'), 'from')
  })

  it('removes files and whole trees', async () => {
    await sbx().files.write('rm/one.txt', '1')
    await sbx().files.write('rm/tree/deep/two.txt', '2')
    await sbx().files.remove('rm/one.txt')
    await sbx().files.remove('rm/tree')
    assert.deepEqual(await sbx().files.list('rm'), [])
    // As envd: removing nothing is no error.
    await sbx().files.remove('rm/never-there')
  })

  it('reports a link the sandbox planted as a link and never follows it', async () => {
    await sh(sbx(), 'mkdir -p /workspace/links && ln -sfn /etc /workspace/links/etc && ln -sfn /etc/passwd /workspace/links/passwd')
    const info = await sbx().files.getInfo('links/passwd')
    assert.equal(info.symlinkTarget, '/etc/passwd')
    const listed = await sbx().files.list('links', { depth: 3 })
    // The link to a directory is listed, not entered.
    assert.deepEqual(listed.map((e) => e.name), ['etc', 'passwd'])
    await assert.rejects(sbx().files.read('links/passwd'), InvalidArgumentError)
    await assert.rejects(sbx().files.list('links/etc'), InvalidArgumentError)
    await assert.rejects(sbx().files.write('links/etc/evil', 'x'))
    // Removing the link removes the link, not /etc.
    await sbx().files.remove('links/etc')
    assert.equal(await sbx().files.exists('links/etc'), false)
    assert.match(await sh(sbx(), 'ls /etc/passwd'), /passwd/)
  })

  it('refuses paths outside the workspace', async () => {
    await assert.rejects(sbx().files.list('/etc'), InvalidArgumentError)
    await assert.rejects(sbx().files.read('/etc/passwd'), InvalidArgumentError)
    await assert.rejects(sbx().files.write('/tmp/x.txt', 'x'), InvalidArgumentError)
    await assert.rejects(sbx().files.makeDir('/tmp/x'), InvalidArgumentError)
    await assert.rejects(sbx().files.getInfo('../x'), InvalidArgumentError)
  })

  it('watches a directory and streams its changes', async () => {
    await sbx().files.makeDir('watched/sub')
    const seen = []
    const handle = await sbx().files.watchDir('watched', (e) => seen.push([e.name, e.type]))
    await sbx().files.write('watched/a.txt', 'a')
    await eventually(() => seen.length >= 1, 10_000, 'the create event')
    assert.deepEqual(seen, [['a.txt', FilesystemEventType.CREATE]])
    await sbx().files.remove('watched/a.txt')
    await eventually(() => seen.length >= 2, 10_000, 'the remove event')
    assert.deepEqual(seen[1], ['a.txt', FilesystemEventType.REMOVE])
    // Not recursive: a change in a subdirectory is not seen.
    await sbx().files.write('watched/sub/inner.txt', 'x')
    await new Promise((r) => setTimeout(r, 1000))
    assert.equal(seen.length, 2)
    await handle.stop()
    await sbx().files.write('watched/after-stop.txt', 'x')
    await new Promise((r) => setTimeout(r, 1000))
    assert.equal(seen.length, 2)

    const deep = []
    const recursive = await sbx().files.watchDir('/home/user/watched', (e) => deep.push([e.name, e.type]), {
      recursive: true,
    })
    await sh(sbx(), 'echo more >> /workspace/watched/sub/inner.txt')
    await eventually(() => deep.length >= 1, 10_000, 'the write event')
    assert.deepEqual(deep, [['sub/inner.txt', FilesystemEventType.WRITE]])
    await recursive.stop()
  })

  it('bounds watchers per sandbox and refuses what is no directory', async () => {
    await sbx().files.makeDir('many')
    const handles = []
    for (let i = 0; i < 8; i++) handles.push(await sbx().files.watchDir('many', () => {}))
    await assert.rejects(sbx().files.watchDir('many', () => {}), /watchers/)
    for (const h of handles) await h.stop()
    // The stopped streams gave their places back.
    await eventually(async () => {
      try {
        const h = await sbx().files.watchDir('many', () => {})
        await h.stop()
        return true
      } catch {
        return false
      }
    }, 10_000, 'a free watcher place')
    await assert.rejects(sbx().files.watchDir('no-such-dir', () => {}), NotFoundError)
    await sbx().files.write('plain.txt', 'x')
    await assert.rejects(sbx().files.watchDir('plain.txt', () => {}), InvalidArgumentError)
  })
})
