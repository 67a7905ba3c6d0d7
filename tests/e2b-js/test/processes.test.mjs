// What the sandbox's process agent serves, with the unmodified SDK: commands listed,
// connected to and fed stdin; a real terminal that takes input, resizes and is killed;
// runCode in other languages, in code contexts, with per-execution envs; getHost.
import assert from 'node:assert/strict'
import http from 'node:http'
import { describe, it } from 'node:test'
import { CommandExitError } from 'e2b'
import { eventually, fileSandbox } from './helpers.mjs'

const text = (bytes) => new TextDecoder().decode(bytes)

describe('processes', () => {
  const sbx = fileSandbox()

  it('lists a background command, connects to it again and kills it', async () => {
    const handle = await sbx().commands.run(
      'for i in $(seq 1 600); do echo tick$i; sleep 0.1; done',
      { background: true, envs: { CORRAL_E2B: 'yes' } },
    )
    const listed = await sbx().commands.list()
    const info = listed.find((p) => p.pid === handle.pid)
    assert.ok(info, `pid ${handle.pid} not in ${JSON.stringify(listed)}`)
    assert.equal(info.cmd, '/bin/bash')
    assert.match(info.args.at(-1), /^for i in/)
    assert.equal(info.envs.CORRAL_E2B, 'yes')

    // Leaving the stream leaves the command running; a new stream gets output from now on.
    await handle.disconnect()
    const seen = []
    const again = await sbx().commands.connect(handle.pid, { onStdout: (line) => seen.push(line) })
    await eventually(() => seen.join('').split('\n').length > 3, 10_000, 'output after connect')
    assert.match(seen.join(''), /tick/)
    assert.ok(!seen.join('').startsWith('tick1\n'), 'connect replays output from the start')

    assert.equal(await sbx().commands.kill(handle.pid), true)
    await assert.rejects(again.wait(), (e) => {
      assert.ok(e instanceof CommandExitError)
      assert.match(e.error, /killed/)
      return true
    })
    const after = await sbx().commands.list()
    assert.ok(!after.some((p) => p.pid === handle.pid))
  })

  it('sends stdin to a command and closes it', async () => {
    assert.equal(sbx().commands.supportsStdinClose, true)
    const handle = await sbx().commands.run('cat; echo EOF', { background: true, stdin: true })
    await sbx().commands.sendStdin(handle.pid, 'hello ')
    await handle.sendStdin('world\n')
    await sbx().commands.closeStdin(handle.pid)
    const r = await handle.wait()
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hello world\nEOF\n')
  })

  it('runs a terminal that takes input, resizes and is killed', async () => {
    let output = ''
    const terminal = await sbx().pty.create({
      rows: 24,
      cols: 80,
      envs: { PS1: '$ ' },
      onData: (data) => {
        output += text(data)
      },
    })
    await sbx().pty.sendInput(terminal.pid, new TextEncoder().encode('tty; stty size\n'))
    await eventually(() => output.includes('24 80'), 10_000, `"24 80" in ${JSON.stringify(output)}`)
    assert.match(output, /\/dev\/pts\//)
    await sbx().pty.resize(terminal.pid, { rows: 40, cols: 100 })
    await sbx().pty.sendInput(terminal.pid, new TextEncoder().encode('stty size\n'))
    await eventually(() => output.includes('40 100'), 10_000, '"40 100" after the resize')

    // Leaving the terminal leaves it running; connecting again gets its output from now on.
    await terminal.disconnect()
    let again = ''
    const reconnected = await sbx().pty.connect(terminal.pid, {
      onData: (data) => {
        again += text(data)
      },
    })
    await sbx().pty.sendInput(terminal.pid, new TextEncoder().encode('echo $((6 * 7))\n'))
    await eventually(() => again.includes('42'), 10_000, `"42" in ${JSON.stringify(again)}`)
    assert.ok(!again.includes('24 80'), 'connect replays output from the start')

    assert.equal(await sbx().pty.kill(terminal.pid), true)
    await assert.rejects(reconnected.wait(), CommandExitError)
    assert.equal(await sbx().pty.kill(terminal.pid), false)
  })
})

describe('runCode beyond the defaults', () => {
  const sbx = fileSandbox()

  it('sets envs for one execution only', async () => {
    const code = "import os; print(os.environ.get('CORRAL_E2B'))"
    const withEnvs = await sbx().runCode(code, { envs: { CORRAL_E2B: 'yes' } })
    assert.equal(withEnvs.error, undefined)
    assert.equal(withEnvs.logs.stdout.join(''), 'yes\n')
    assert.equal((await sbx().runCode(code)).logs.stdout.join(''), 'None\n')
    const js = "process.env.CORRAL_E2B ?? 'unset'"
    assert.equal((await sbx().runCode(js, { language: 'js', envs: { CORRAL_E2B: 'js' } })).text, 'js')
    assert.equal((await sbx().runCode(js, { language: 'js' })).text, 'unset')
    // A bash context refuses them before anything runs: HTTP 400, which the SDK throws.
    await assert.rejects(
      sbx().runCode('echo $CORRAL_E2B > /tmp/ran', { language: 'bash', envs: { CORRAL_E2B: 'x' } }),
      /400/,
    )
    const ran = await sbx().runCode('test -e /tmp/ran || echo absent', { language: 'bash' })
    assert.deepEqual(ran.logs.stdout, ['absent\n'])
  })

  it('runs JavaScript and bash in their default contexts, each keeping its state', async () => {
    const js = await sbx().runCode('const a = 40; a + 2', { language: 'js' })
    assert.equal(js.error, undefined)
    assert.equal(js.text, '42')
    assert.equal((await sbx().runCode('a', { language: 'js' })).text, '40')
    const sh = await sbx().runCode('echo from-bash; cd /tmp', { language: 'bash' })
    assert.deepEqual(sh.logs.stdout, ['from-bash\n'])
    assert.deepEqual((await sbx().runCode('pwd', { language: 'bash' })).logs.stdout, ['/tmp\n'])
    assert.equal((await sbx().runCode('import os; os.getcwd()')).text, '/workspace')
  })

  it('creates, lists, restarts and removes code contexts', async () => {
    await sbx().files.write('ctx/data.txt', 'shared')
    const ctx = await sbx().createCodeContext({ cwd: '/home/user/ctx' })
    assert.equal(ctx.language, 'python')
    assert.equal(ctx.cwd, '/home/user/ctx')
    const read = await sbx().runCode("x = 1; open('data.txt').read()", { context: ctx })
    assert.equal(read.text, 'shared')
    assert.equal((await sbx().runCode("'x' in globals()")).text, 'False')
    assert.ok((await sbx().listCodeContexts()).some((c) => c.id === ctx.id))

    await sbx().restartCodeContext(ctx)
    assert.equal((await sbx().runCode('x', { context: ctx })).error.name, 'NameError')

    const jsCtx = await sbx().createCodeContext({ language: 'js' })
    assert.equal((await sbx().runCode('typeof require', { context: jsCtx })).text, 'function')
    const bashCtx = await sbx().createCodeContext({ language: 'bash', cwd: '/home/user/ctx' })
    assert.equal((await sbx().runCode('cat data.txt; echo', { context: bashCtx })).logs.stdout.join(''), 'shared\n')
    await sbx().removeCodeContext(jsCtx)
    await sbx().removeCodeContext(bashCtx)
    await sbx().removeCodeContext(ctx.id)
    const ids = (await sbx().listCodeContexts()).map((c) => c.id)
    assert.ok(![ctx.id, jsCtx.id, bashCtx.id].some((id) => ids.includes(id)))
  })
})

// A request to the server's address with the Host that getHost gave (what a browser sends,
// `*.localhost` being the loopback itself; this machine's resolver may not know such names).
// fetch() would not send that Host.
function viaHost(host, headers) {
  const api = new URL(process.env.E2B_API_URL)
  return new Promise((resolve, reject) => {
    const request = http.get(
      { host: api.hostname, port: api.port, path: '/hello.txt', headers: { Host: host, ...headers } },
      (response) => {
        let body = ''
        response.setEncoding('utf8')
        response.on('data', (chunk) => {
          body += chunk
        })
        response.on('end', () => resolve({ status: response.statusCode, body }))
      },
    )
    request.on('error', reject)
  })
}

describe('getHost', () => {
  const sbx = fileSandbox()

  it('reaches a server the sandbox runs, with the key, by the host name it gives', async () => {
    await sbx().files.write('hello.txt', 'hello from the sandbox')
    const server = await sbx().commands.run('python3 -m http.server 8000', { background: true })
    const host = sbx().getHost(8000)
    const api = new URL(process.env.E2B_API_URL)
    assert.equal(host, `8000-${sbx().sandboxId}.localhost:${api.port}`)
    const key = { 'X-API-KEY': process.env.E2B_API_KEY }
    const get = (headers) => viaHost(host, headers)
    let answer = null
    await eventually(async () => {
      answer = await get(key) // 502 port_closed until the server listens
      return answer.status === 200
    }, 30_000, 'the server in the sandbox to listen')
    assert.equal(answer.body, 'hello from the sandbox')
    const anonymous = await get({})
    assert.ok([401, 404].includes(anonymous.status), `keyless: ${anonymous.status}`)
    assert.ok(!anonymous.body.includes('hello from the sandbox'))
    await server.kill()
  })

  it("answers 409 for a paused sandbox's port, and serves again after connect", async () => {
    // Started by code (a background command would do as well): a process the code started
    // lives on, and is frozen with its sandbox.
    const started = await sbx().runCode(
      "import subprocess\nserver = subprocess.Popen(['python3', '-m', 'http.server', '8001'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)",
    )
    assert.equal(started.error, undefined)
    const host = sbx().getHost(8001)
    const get = () => viaHost(host, { 'X-API-KEY': process.env.E2B_API_KEY })
    await eventually(async () => (await get()).status === 200, 30_000, 'the server in the sandbox to listen')
    assert.equal(await sbx().pause(), true)
    const paused = await get()
    assert.equal(paused.status, 409)
    assert.equal(JSON.parse(paused.body).error.code, 'sandbox_paused')
    await sbx().connect()
    const again = await get()
    assert.equal(again.status, 200)
    assert.equal(again.body, 'hello from the sandbox')
  })
})
