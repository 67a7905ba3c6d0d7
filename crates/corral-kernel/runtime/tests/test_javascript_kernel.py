"""The JavaScript session kernel (node --expose-internals corral_kernel.js)."""

import subprocess

from harness import JS_KERNEL, NODE, RUNTIME, kernel_env


def test_ready_names_the_language_and_node_version(js_kernel):
    assert js_kernel.ready["language"] == "javascript"
    version = subprocess.run([NODE, "--version"], capture_output=True, text=True).stdout.strip()
    assert "v" + js_kernel.ready["version"] == version


def test_let_and_const_persist_between_executions(js_kernel):
    assert js_kernel.execute("let a = 1").results == []
    assert js_kernel.execute("a + 1").main_result == {"text/plain": "2", "application/json": 2}
    js_kernel.execute("const greeting = 'hi'; var counter = 10; function twice(x) { return 2 * x }")
    assert js_kernel.execute("twice(counter) + greeting.length").main_result["text/plain"] == "22"


def test_top_level_await_gives_the_value(js_kernel):
    run = js_kernel.execute("await new Promise(r => setTimeout(() => r(5), 10))")
    assert run.main_result == {"text/plain": "5", "application/json": 5}


def test_declarations_in_await_cells_persist(js_kernel):
    run = js_kernel.execute("const { p, q } = await Promise.resolve({ p: 3, q: 4 }); p * q")
    assert run.main_result["text/plain"] == "12"
    assert js_kernel.execute("p + q").main_result["text/plain"] == "7"


def test_require_resolves_from_the_working_directory(js_kernel):
    run = js_kernel.execute("require('path').join('a', 'b') + ' ' + typeof require('fs').readFileSync")
    assert run.main_result["application/json"] == "a/b function"


def test_values_are_inspected_and_plain_data_is_json(js_kernel):
    data = js_kernel.execute("({ list: [1, 2.5, null, true], nested: { s: 'x' } })").main_result
    assert data["text/plain"] == "{ list: [ 1, 2.5, null, true ], nested: { s: 'x' } }"
    assert data["application/json"] == {"list": [1, 2.5, None, True], "nested": {"s": "x"}}
    for not_json in ("new Map([[1, 2]])", "(() => 1)", "({ when: new Date(0) })", "[NaN]", "var o = {}; o.o = o; o"):
        data = js_kernel.execute(not_json).main_result
        assert list(data) == ["text/plain"], (not_json, data)
    assert js_kernel.execute("null").main_result == {"text/plain": "null", "application/json": None}


def test_undefined_gives_no_result(js_kernel):
    assert js_kernel.execute("undefined").results == []
    assert js_kernel.execute("console.log('x')").results == []


def test_console_streams_live_to_stdout_and_stderr(js_kernel):
    run = js_kernel.execute(
        "console.log('first'); console.error('problem');"
        "await new Promise(r => setTimeout(r, 1000)); console.log('second')"
    )
    assert run.status == "ok"
    assert run.stdout == "first\nsecond\n" and run.stderr == "problem\n"
    first_at = next(at for at, chunk in run.stdout_chunks if b"first" in chunk)
    assert run.done_at - first_at > 0.8


def test_a_thrown_error_gives_name_value_and_the_user_stack(js_kernel):
    run = js_kernel.execute("function outer() { return inner() }\nfunction inner() { null.x }\nouter()")
    assert run.status == "error"
    [error] = run.errors
    assert error["name"] == "TypeError"
    assert error["value"] == "Cannot read properties of null (reading 'x')"
    assert "at inner (In[" in error["traceback"] and "at outer (In[" in error["traceback"]
    for internal in ("node:", "corral_kernel", str(RUNTIME)):
        assert internal not in error["traceback"], internal


def test_a_rejected_await_is_an_error(js_kernel):
    [error] = js_kernel.execute("await Promise.reject(new RangeError('too far'))").errors
    assert (error["name"], error["value"]) == ("RangeError", "too far")


def test_a_syntax_error_shows_the_line(js_kernel):
    for code in ("let broken = ;", "await 1; let broken = ;"):
        run = js_kernel.execute(code)
        assert run.status == "error"
        [error] = run.errors
        assert error["name"] == "SyntaxError"
        assert "let broken = ;" in error["traceback"] and "node:" not in error["traceback"]


def test_throwing_a_non_error_is_reported(js_kernel):
    [error] = js_kernel.execute("throw 'plain string'").errors
    assert (error["name"], error["value"]) == ("Uncaught", "'plain string'")


def test_a_callback_throwing_later_does_not_kill_the_kernel(js_kernel):
    js_kernel.execute("setTimeout(() => { throw new Error('later') }, 1)")
    run = js_kernel.execute("await new Promise(r => setTimeout(r, 50)); 'alive'")
    assert run.main_result["text/plain"] == "'alive'"
    assert "Uncaught Error: later" in js_kernel.stderr_text()


def test_an_unknown_frame_is_logged_and_ignored(js_kernel):
    js_kernel.send({"type": "no_such_frame"})
    assert js_kernel.execute("'still here'").main_result["application/json"] == "still here"
    assert 'unknown type "no_such_frame"' in js_kernel.stderr_text()


def test_a_result_over_32_mib_becomes_an_error(js_kernel):
    run = js_kernel.execute("'x'.repeat(33 << 20)", timeout=120)
    assert run.status == "error" and run.results == []
    assert run.errors[0]["name"] == "ResultTooLarge"


def test_sigint_stops_a_busy_loop_and_keeps_state(fresh_kernel):
    kernel = fresh_kernel(JS_KERNEL)
    kernel.execute("let kept = 'yes'")
    run = kernel.execute("let spins = 0; while (true) { spins++ }", interrupt_after=1)
    assert run.done_at - run.started < 5 and run.status == "error"
    assert "interrupted by `SIGINT`" in run.errors[0]["value"]
    assert kernel.execute("kept").main_result["text/plain"] == "'yes'"
    kernel.interrupt()  # while idle: ignored
    assert kernel.execute("1 + 1").main_result["text/plain"] == "2"


def test_sigint_stops_waiting_for_an_await(fresh_kernel):
    kernel = fresh_kernel(JS_KERNEL)
    run = kernel.execute("await new Promise(r => setTimeout(r, 30000))", interrupt_after=1)
    assert run.done_at - run.started < 5 and run.status == "error"
    assert "interrupted by `SIGINT`" in run.errors[0]["value"]
    assert kernel.execute("'next'").main_result["text/plain"] == "'next'"


def test_end_of_file_on_fd_3_exits_zero(fresh_kernel):
    kernel = fresh_kernel(JS_KERNEL)
    assert kernel.close() == 0


def test_without_expose_internals_it_says_how_to_start(tmp_path):
    done = subprocess.run(
        [NODE, str(RUNTIME / "corral_kernel.js")], env=kernel_env(), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2 and "--expose-internals" in done.stderr


def test_lone_surrogates_cannot_break_a_frame(js_kernel):
    run = js_kernel.execute("'a\\ud800b'")  # the harness parses frames as strictly as the host
    assert run.main_result["application/json"] == "a\ufffdb"


def test_a_40_mib_frame_is_accepted(js_kernel):
    run = js_kernel.execute("const big = '" + "a" * (40 << 20) + "'; big.length", timeout=120)
    assert run.main_result["text/plain"] == str(40 << 20)
