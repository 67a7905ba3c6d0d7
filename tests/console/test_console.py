"""The console in a real browser: a newcomer's path (create a sandbox, upload the salaries CSV
of examples/, run the analysis, see the chart, use the terminal and the file browser, interrupt
and restart, kill the sandbox), an operator's pages, and a key that is not an operator's."""

import json
import os
import time

from selenium.webdriver.common.by import By

from console_support import (
    browser_logs, by_id, click, create_sandbox, file_names, new_cell, open_console, run_cell,
    set_code, visible, wait,
)
from corral_testing import REPO

def test_a_newcomer_runs_the_salary_analysis_and_sees_the_chart(browser, server, tmp_path):
    driver = browser
    open_console(driver, server)
    assert by_id(driver, "who").text == "local"
    sandbox = create_sandbox(driver)

    # Upload the CSV of examples/ with the file browser.
    csv = REPO / "examples" / "salaries.csv"
    by_id(driver, "upload").send_keys(str(csv))
    by_id(driver, "upload-form").submit()
    wait(driver, lambda d: "salaries.csv" in file_names(d), message="the upload is not listed")

    # Run the analysis: its stdout streams in, its figure is shown as an image.
    cell = driver.find_elements(By.CSS_SELECTOR, "#cells .cell")[0]
    output = run_cell(driver, cell, (REPO / "examples" / "analysis.py").read_text())
    stdout = output.find_element(By.CSS_SELECTOR, "pre.stdout").text
    assert "salaries.csv: 24 rows, 1 series" in stdout, stdout
    assert "wrote /workspace/chart.png" in stdout
    image = output.find_element(By.CSS_SELECTOR, "img.result-png")
    wait(driver, lambda d: d.execute_script(
        "return arguments[0].complete && arguments[0].naturalWidth", image) > 0,
        message="the chart did not render")
    assert driver.execute_script("return arguments[0].naturalWidth", image) >= 400
    assert image.get_attribute("src").startswith("data:image/png;base64,")
    assert cell.find_element(By.CSS_SELECTOR, ".status").text.startswith("success")

    # The chart the script saved is in the file browser; downloading it gives the PNG.
    by_id(driver, "files-refresh").click()
    wait(driver, lambda d: "chart.png" in file_names(d), message="chart.png is not listed")
    row = driver.find_element(By.CSS_SELECTOR, '#files li[data-path="chart.png"]')
    row.find_element(By.CSS_SELECTOR, "button.download").click()
    saved = driver.downloads / "chart.png"
    wait(driver, lambda d: saved.is_file() and saved.stat().st_size > 0, message="no download")
    assert saved.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A table: pandas' HTML in a sandboxed frame.
    output = run_cell(driver, new_cell(driver),
                      "import pandas as pd\npd.read_csv('salaries.csv').head(3)")
    frame = output.find_element(By.CSS_SELECTOR, "iframe.result-html")
    assert frame.get_attribute("sandbox") == ""
    driver.switch_to.frame(frame)
    try:
        assert len(driver.find_elements(By.CSS_SELECTOR, "table tbody tr")) == 3
    finally:
        driver.switch_to.default_content()

    # An error shows its traceback.
    output = run_cell(driver, new_cell(driver), "def f():\n    return 1 / 0\nf()")
    traceback = output.find_element(By.CSS_SELECTOR, "pre.traceback").text
    assert "ZeroDivisionError" in traceback and "f()" in traceback
    assert "\x1b" not in traceback

    # The terminal runs commands in the sandbox.
    by_id(driver, "term-cmd").send_keys("ls /workspace && echo oops >&2; exit 3")
    by_id(driver, "term-form").submit()
    wait(driver, lambda d: "[exit 3]" in by_id(d, "term-out").text, 60, "the command did not end")
    terminal = by_id(driver, "term-out").text
    assert "chart.png" in terminal and "salaries.csv" in terminal and "oops" in terminal

    driver.save_screenshot(str(tmp_path / "playground.png"))
    if os.environ.get("CORRAL_CONSOLE_SCREENSHOT"):
        # Tall enough to hold the first cell, its output and its chart.
        size = driver.get_window_size()
        driver.set_window_size(1440, 1900)
        driver.execute_script("window.scrollTo(0, 0);")
        driver.save_screenshot(os.environ["CORRAL_CONSOLE_SCREENSHOT"])
        driver.set_window_size(size["width"], size["height"])

    # Interrupt: the cell stops, the session keeps its state.
    run_cell(driver, new_cell(driver), "kept = 41")
    cell = new_cell(driver)
    set_code(driver, cell, "import time\nprint('sleeping', flush=True)\ntime.sleep(120)")
    cell.find_element(By.CSS_SELECTOR, "button.run").click()
    wait(driver, lambda d: "sleeping" in cell.find_element(By.CSS_SELECTOR, ".output").text, 60)
    started = time.monotonic()
    cell.find_element(By.CSS_SELECTOR, "button.interrupt").click()
    wait(driver, lambda d: cell.find_element(By.CSS_SELECTOR, ".status").text == "interrupted")
    output = run_cell(driver, new_cell(driver), "print(kept + 1)", timeout=60)
    assert output.text.strip() == "42"
    assert time.monotonic() - started < 60

    # Restart: the variables are gone, the files stay.
    by_id(driver, "pg-restart").click()
    time.sleep(0.5)
    output = run_cell(driver, new_cell(driver),
                      "import os\nprint('kept' in dir(), os.path.exists('salaries.csv'))")
    assert output.text.strip() == "False True"

    # The list shows it running, with its memory; kill it from the playground.
    driver.get(server.url + "/#/")
    row = f'#sandboxes tr[data-id="{sandbox}"]'
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, row), message="not listed")
    wait(driver, lambda d: "MiB" in d.find_element(By.CSS_SELECTOR, row).text
         and "running" in d.find_element(By.CSS_SELECTOR, row).text,
         message="no memory reading")
    driver.get(server.url + f"/#/sandbox/{sandbox}")
    wait(driver, lambda d: by_id(d, "pg-state").text == "running")
    by_id(driver, "pg-kill").click()
    wait(driver, lambda d: d.current_url.endswith("#/"))
    wait(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, row), message="still listed")
    status, _, _ = server.call("GET", f"/v1/sandboxes/{sandbox}")
    assert status == 404


def test_pause_and_resume_from_the_list(browser, server):
    driver = browser
    open_console(driver, server)
    sandbox = create_sandbox(driver)
    driver.get(server.url + "/#/")
    row = f'#sandboxes tr[data-id="{sandbox}"]'
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, row + " button.pause"))
    click(driver, row + " button.pause")
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, row + " button.resume"))
    status, _, body = server.call("GET", f"/v1/sandboxes/{sandbox}")
    assert status == 200 and b'"state":"paused"' in body
    click(driver, row + " button.resume")
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, row + " button.pause"))
    click(driver, row + " button.kill")
    wait(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, row))


def test_an_operator_sees_health_every_key_the_audit_log_and_manages_keys(browser, server):
    driver = browser
    # A sandbox of the plain key's, with an execution in the audit log.
    status, _, body = server.call("POST", "/v1/sandboxes", server.tenant_key, b"{}")
    assert status == 201, body
    theirs = json.loads(body)["id"]
    status, _, _ = server.call(
        "POST", f"/v1/sandboxes/{theirs}/execute", server.tenant_key, b'{"code": "1 + 1"}',
        headers={"Accept": "application/json"},
    )
    assert status == 200
    try:
        open_console(driver, server, server.operator_key)
        assert by_id(driver, "who").text == "ops (operator)"

        # Every key's sandboxes, filtered by key.
        by_id(driver, "owner-filter").find_element(By.CSS_SELECTOR, 'option[value="*"]').click()
        row = f'#sandboxes tr[data-id="{theirs}"]'
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, row), message="not listed")
        # Another key's sandbox is shown with its key and its memory, not driven: no buttons.
        wait(driver, lambda d: server.tenant_key_id in d.find_element(By.CSS_SELECTOR, row).text
             and "MiB" in d.find_element(By.CSS_SELECTOR, row).text
             and not d.find_elements(By.CSS_SELECTOR, row + " button"))
        # One key's: that key's sandbox is listed, and not under another key.
        select = by_id(driver, "owner-filter")
        select.find_element(By.CSS_SELECTOR, f'option[value="{server.tenant_key_id}"]').click()
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, row))
        by_id(driver, "owner-filter").find_element(By.CSS_SELECTOR, 'option[value="local"]').click()
        wait(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, row))

        driver.get(server.url + "/#/ops")
        wait(driver, lambda d: by_id(d, "health-status").text == "ok", message="no health")
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#pools tbody tr"))
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '#gauges [data-metric="corral_sessions_live"]'))
        for queue in ("corral_runs_waiting", "corral_uploads_waiting"):
            wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, f'#gauges [data-metric="{queue}"]'),
                 message=f"the admission queue {queue} is not shown")
        wait(driver, lambda d: server.tenant_key_id in by_id(d, "per-key").text)
        wait(driver, lambda d: server.tenant_key_id in by_id(d, "audit").text,
             message="the plain key's execution is not in the operator's audit log")

        # Filters narrow the audit log.
        by_id(driver, "audit-key").send_keys("key-nobody")
        by_id(driver, "audit-form").submit()
        wait(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, "#audit tbody tr"))

        # A key is made (its secret shown once) and revoked.
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#keys tbody tr"))
        by_id(driver, "key-name").send_keys("made-in-the-console")
        by_id(driver, "key-form").submit()
        wait(driver, lambda d: visible(d, "key-secret"))
        secret = by_id(driver, "key-secret-value").text
        assert secret.startswith("crl_")
        status, _, body = server.call("GET", "/v1/whoami", secret)
        assert status == 200 and b'"operator":false' in body
        wait(driver, lambda d: "made-in-the-console" in by_id(d, "keys").text)
        made = [r for r in driver.find_elements(By.CSS_SELECTOR, "#keys tbody tr")
                if "made-in-the-console" in r.text][0]
        assert secret not in by_id(driver, "keys").text
        made.find_element(By.CSS_SELECTOR, "button.revoke").click()
        wait(driver, lambda d: "revoked" in [r for r in d.find_elements(By.CSS_SELECTOR, "#keys tbody tr")
                                              if "made-in-the-console" in r.text][0].text)
        status, _, _ = server.call("GET", "/v1/whoami", secret)
        assert status == 401
    finally:
        server.call("DELETE", f"/v1/sandboxes/{theirs}", server.tenant_key)


def test_a_plain_key_sees_only_its_own(browser, server):
    driver = browser
    open_console(driver, server, server.tenant_key)
    assert by_id(driver, "who").text == "tenant"
    assert not visible(driver, "owner-filter-label")
    driver.get(server.url + "/#/ops")
    wait(driver, lambda d: by_id(d, "health-status").text == "ok")
    # No keys card, and the audit log holds its own lines only.
    assert not driver.find_element(By.CSS_SELECTOR, "#key-form").is_displayed()
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#audit tbody tr"))
    for row in driver.find_elements(By.CSS_SELECTOR, "#audit tbody tr"):
        assert server.tenant_key_id in row.text
    # A wrong key is refused and the key form comes back.
    driver.execute_script("sessionStorage.setItem('corral.key', 'crl_wrong');")
    driver.get(server.url + "/#/")
    driver.refresh()
    wait(driver, lambda d: visible(d, "login"), message="a wrong key was not refused")
    assert "unknown or revoked" in by_id(driver, "login-error").text
    assert not [m for m in browser_logs(driver) if "Uncaught" in m]
