"""Output of untrusted code is inert in the console: results (HTML, SVG, Markdown, JSON,
text), stdout, stderr, tracebacks, file names and terminal output carrying `<script>`,
`<img onerror>`, an SVG with a script and a `javascript:` link run nothing, in the page or in
any frame. Each payload, if it ran, would log a marker, post it to its parent and top windows,
set `window.__pwned` (of its frame and of the top page) and fetch the test's beacon; the test
sees none of that. A control proves the
detectors work."""

import json

from selenium.webdriver.common.by import By

from console_support import (
    MARKER, browser_logs, by_id, create_sandbox, file_names, new_cell, open_console, pwned,
    run_cell, wait,
)


def payloads(beacon_url):
    """Markup that runs `fire` if it is ever treated as markup. `fire` builds the marker by
    concatenation, so that the marker is in the log only if the code ran."""
    fire = (
        "console.log('PWNED-'+'FIRED');window.__pwned=1;"
        "try{top.__pwned=1}catch(e){};"
        "parent.postMessage('PWNED-'+'FIRED','*');top.postMessage('PWNED-'+'FIRED','*');"
        f"fetch('{beacon_url}/'+'hit').catch(function(){{}});"
        "new Image().src='" + beacon_url + "/'+'img';alert(1)"
    )
    return {
        "script": f"<script>{fire}</script>",
        "img": f'<img src=x onerror="{fire}">',
        "svg": f'<svg xmlns="http://www.w3.org/2000/svg" onload="{fire}"><script>{fire}</script>'
        f'<rect width="10" height="10"/></svg>',
        "link": f'<a id="js-link" href="javascript:{fire}">click me</a>',
        "iframe": f'<iframe srcdoc="<script>{fire}</script>"></iframe>',
        "meta": f'<meta http-equiv="refresh" content="0;url=javascript:{fire}">',
    }


def assert_inert(driver, beacon, where):
    signs = pwned(driver, beacon)
    assert not signs, f"{where}: a payload ran: {signs}"


def test_the_detectors_see_a_payload_that_runs(browser, server, beacon):
    """The control: code that runs is seen by every detector the other tests rely on."""
    driver = browser
    fire = payloads(beacon.url)["script"][len("<script>"):-len("</script>")]
    # In the console's page (run by the test, so the page's policy does not stop it): the
    # marker, `window.__pwned` and the dialog. The page's policy keeps its fetches from the
    # beacon, another origin.
    open_console(driver, server)
    driver.execute_script(fire.replace("alert(1)", "alert('control')"))
    wait(driver, lambda d: any(MARKER in s for s in pwned(d, beacon)), message="no marker")
    assert "window.__pwned was set" in pwned(driver, beacon)
    assert any("dialog alert control" in m for m in browser_logs(driver))
    # In a page without a policy, the beacon sees it.
    driver.get(beacon.url + "/control")
    driver.execute_script(fire)
    wait(driver, lambda d: any(h.startswith("/hit") for h in beacon.hits), message="no beacon")
    # A script that runs in a frame is seen too: a frame allowed to run scripts.
    driver.seen_logs.clear()
    driver.execute_script(
        "const f = document.createElement('iframe');"
        "f.setAttribute('sandbox', 'allow-scripts');"
        "f.srcdoc = arguments[0]; document.body.append(f);",
        "<script>console.log('PWNED-'+'FIRED in a frame');"
        "parent.postMessage('PWNED-'+'FIRED posted by a frame', '*')</script>",
    )
    wait(driver, lambda d: any("FIRED in a frame" in m for m in browser_logs(d)),
         message="a frame's console is not seen")
    wait(driver, lambda d: "posted: PWNED-FIRED posted by a frame" in pwned(d, beacon),
         message="a frame's message is not seen")
    # Start the real tests from nothing.
    beacon.hits.clear()
    driver.seen_logs.clear()
    open_console(driver, server)
    assert not pwned(driver, beacon)


def test_results_output_errors_and_file_names_are_inert(browser, server, beacon):
    driver = browser
    open_console(driver, server)
    sandbox = create_sandbox(driver)
    p = payloads(beacon.url)
    everything = "".join(p.values())
    code = f"""
from IPython.display import display, HTML, SVG, Markdown, JSON
p = {json.dumps(p)}
everything = {json.dumps(everything)}
print(everything, flush=True)
import sys
print(everything, file=sys.stderr, flush=True)
display(HTML(everything))
display(SVG(p["svg"]))
display(Markdown(everything + " [md link](javascript:alert(1))"))
display(JSON({{"x": everything}}))
for name in ["<img src=x onerror=console.log('PWNED-'+'FIRED')>.csv",
             "<script>console.log('PWNED-'+'FIRED')<\\\\x2fscript>.txt",
             "javascript:console.log('PWNED-'+'FIRED')",
             "<svg onload=console.log('PWNED-'+'FIRED')>"]:
    open(name, "w").write(everything)
class Evil:
    def _repr_html_(self):
        return everything
    def __repr__(self):
        return everything
Evil()
"""
    cell = driver.find_elements(By.CSS_SELECTOR, "#cells .cell")[0]
    output = run_cell(driver, cell, code)
    # Everything arrived and is shown.
    assert p["script"] in output.find_element(By.CSS_SELECTOR, "pre.stdout").text
    assert p["img"] in output.find_element(By.CSS_SELECTOR, "pre.stderr").text
    frames = output.find_elements(By.CSS_SELECTOR, "iframe")
    assert len(frames) == 2, "the HTML display and the object's HTML each get a frame"
    for frame in frames:
        assert frame.get_attribute("sandbox") == "", "a frame with permissions"
        assert frame.get_attribute("class") == "result-html"
    assert output.find_elements(By.CSS_SELECTOR, "img.result-svg")
    texts = [e.text for e in output.find_elements(By.CSS_SELECTOR, "pre.result-text")]
    assert any("[md link](javascript:" in t for t in texts)
    # Only the console's own elements: no element of a payload made it into the page.
    assert not driver.find_elements(By.CSS_SELECTOR, "#cells script, #cells a, #cells svg, #cells meta")
    assert not driver.find_elements(By.CSS_SELECTOR, '#cells img[src="x"]')

    # Click the javascript: link in each frame (a sandboxed frame may not run it).
    for index in range(len(frames)):
        frame = output.find_elements(By.CSS_SELECTOR, "iframe")[index]
        driver.switch_to.frame(frame)
        try:
            links = driver.find_elements(By.ID, "js-link")
            assert links, "the HTML result is shown in its frame"
            links[0].click()
        finally:
            driver.switch_to.default_content()

    # An error whose value and traceback carry the payloads.
    output = run_cell(driver, new_cell(driver), f"raise ValueError({json.dumps(everything)})")
    assert p["img"] in output.find_element(By.CSS_SELECTOR, "pre.traceback").text

    # File names in the file browser, and the terminal's output.
    by_id(driver, "files-refresh").click()
    wait(driver, lambda d: len(file_names(d)) >= 4, message="the files are not listed")
    names = file_names(driver)
    assert "<img src=x onerror=console.log('PWNED-'+'FIRED')>.csv" in names
    assert "javascript:console.log('PWNED-'+'FIRED')" in names
    by_id(driver, "term-cmd").send_keys("ls -1 /workspace; cat /workspace/javascript*")
    by_id(driver, "term-form").submit()
    wait(driver, lambda d: "[exit" in by_id(d, "term-out").text, 60)
    assert "<img src=x onerror=" in by_id(driver, "term-out").text

    # Let anything that was going to fire (image errors, refreshes, fetches) fire.
    driver.execute_script("return new Promise(r => setTimeout(r, 1500))")
    assert driver.execute_script("return document.title") == "Corral console"
    assert_inert(driver, beacon, "results, output and file names")
    server.call("DELETE", f"/v1/sandboxes/{sandbox}")


def test_the_console_refuses_to_be_framed_and_answers_are_inert_documents(browser, server, beacon):
    """A page of another origin cannot frame the console (frame-ancestors 'none'), and an
    API answer opened as a page (a file holding HTML) runs nothing."""
    driver = browser
    open_console(driver, server)
    sandbox = create_sandbox(driver)
    evil = payloads(beacon.url)["script"].encode()
    status, _, _ = server.call(
        "PUT", f"/v1/sandboxes/{sandbox}/files/evil.html", body=evil,
        headers={"Content-Type": "text/html"},
    )
    assert status == 201
    # Opened by URL (keyless on loopback, so the browser can read it): downloaded or shown
    # as text, never run.
    driver.get(f"{server.url}/v1/sandboxes/{sandbox}/files/evil.html")
    driver.execute_script("return 1")
    driver.get(f"{beacon.url}/frame-test")
    driver.execute_script(
        "document.body.innerHTML = '<iframe id=f src=\"' + arguments[0] + '/\"></iframe>';",
        server.url,
    )
    driver.execute_script("return new Promise(r => setTimeout(r, 1500))")
    frame = driver.find_element(By.ID, "f")
    driver.switch_to.frame(frame)
    try:
        # A refused frame holds an error page, never the console.
        assert not driver.find_elements(By.ID, "create-form")
    finally:
        driver.switch_to.default_content()
    assert_inert(driver, beacon, "an answer opened as a page")
    server.call("DELETE", f"/v1/sandboxes/{sandbox}")
