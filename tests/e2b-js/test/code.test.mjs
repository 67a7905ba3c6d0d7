// runCode with the unmodified @e2b/code-interpreter: output callbacks, results (text, PNG,
// HTML), errors, state kept between calls, timeouts.
import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import { TimeoutError } from 'e2b'
import { fileSandbox } from './helpers.mjs'

describe('runCode', () => {
  const sbx = fileSandbox()

  it('streams stdout and stderr to the callbacks and into the logs', async () => {
    const out = []
    const err = []
    const execution = await sbx().runCode(
      "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)",
      { onStdout: (m) => out.push(m.line), onStderr: (m) => err.push(m.line) },
    )
    // Output comes in chunks as the program writes it (print may write the line and its
    // newline apart): what matters is the text, in order, each chunk once.
    assert.equal(out.join(''), 'to stdout\n')
    assert.equal(err.join(''), 'to stderr\n')
    assert.deepEqual(execution.logs.stdout, out)
    assert.deepEqual(execution.logs.stderr, err)
    assert.equal(execution.error, undefined)
  })

  it('returns the last expression as the main text result and keeps state', async () => {
    await sbx().runCode('x = 41')
    const execution = await sbx().runCode('x + 1')
    assert.equal(execution.text, '42')
    assert.equal(execution.results.length, 1)
    assert.equal(execution.results[0].isMainResult, true)
  })

  it('returns a matplotlib figure as a PNG and a DataFrame as HTML', async () => {
    const results = []
    const plot = await sbx().runCode(
      'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()',
      { onResult: (r) => results.push(r) },
    )
    const png = plot.results.find((r) => r.png)
    assert.ok(png, JSON.stringify(plot.results))
    assert.deepEqual([...Buffer.from(png.png, 'base64').subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])
    assert.equal(results.length, plot.results.length)
    const frame = await sbx().runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    assert.match(frame.results[0].html, /<table/)
    assert.match(frame.text, /a/)
  })

  it('reports an exception as the execution error, without throwing', async () => {
    const errors = []
    const execution = await sbx().runCode('1 / 0', { onError: (e) => errors.push(e) })
    assert.equal(execution.error.name, 'ZeroDivisionError')
    assert.match(execution.error.value, /division by zero/)
    assert.match(execution.error.traceback, /ZeroDivisionError/)
    assert.equal(errors.length, 1)
    assert.equal(errors[0].name, 'ZeroDivisionError')
    // The sandbox goes on.
    assert.equal((await sbx().runCode('2 * 21')).text, '42')
  })

  it('times out a long execution and goes on afterwards', async () => {
    await assert.rejects(
      sbx().runCode('import time\ntime.sleep(30)', { timeoutMs: 1500 }),
      TimeoutError,
    )
    // Leaving stopped the execution: the next one runs at once.
    const started = Date.now()
    assert.equal((await sbx().runCode('"still here"')).text, 'still here')
    assert.ok(Date.now() - started < 20_000)
  })
})
