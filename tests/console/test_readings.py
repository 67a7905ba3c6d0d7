"""What the console shows of a sandbox and of the server is what the API says: the list's CPU
reading (from the sandbox's cgroup) and its egress totals (a sandbox with a network policy:
connections, bytes, refusals; none without one), the egress decisions of the operations page
(`GET /v1/audit/egress`) and its zygote states and restart counts (from /healthz)."""

import json

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from console_support import by_id, open_console, wait


def test_the_list_shows_cpu_and_egress_totals(browser, server):
    driver = browser
    # A sandbox with a network policy, and one without.
    status, _, body = server.call(
        "POST", "/v1/sandboxes", body=json.dumps({"network": {"allow": ["a.example.org"]}}).encode()
    )
    assert status == 201, body
    policed = json.loads(body)["id"]
    status, _, body = server.call("POST", "/v1/sandboxes", body=b"{}")
    assert status == 201, body
    plain = json.loads(body)["id"]
    try:
        # A name the session's list lacks: refused by its proxy before any lookup. Then some
        # CPU time, for the reading.
        code = (
            "import urllib.request\n"
            "try:\n    urllib.request.urlopen('http://b.example.org/', timeout=20)\n"
            "except Exception as e:\n    print('refused', e)\n"
            "sum(i * i for i in range(3_000_000))"
        )
        status, _, body = server.call(
            "POST", f"/v1/sandboxes/{policed}/execute", body=json.dumps({"code": code}).encode(),
            headers={"Accept": "application/json"},
        )
        assert status == 200, body
        result = json.loads(body)
        assert "is not on this sandbox's network allow-list" in result["stdout"], result
        assert result["network"]["denied"] == 1, result

        open_console(driver, server)
        readings = lambda d, sid: d.find_elements(  # noqa: E731
            By.CSS_SELECTOR, f'#sandboxes tr[data-id="{sid}"] td.reading')
        # The readings are age, memory, CPU and egress, in the list's order.
        wait(driver, lambda d: len(readings(d, policed)) == 4 and len(readings(d, plain)) == 4,
             message="the sandboxes are not listed with their readings")
        wait(driver, lambda d: readings(d, policed)[3].text.endswith("(0 conn., 1 denied)"),
             message="the policed sandbox's egress totals are not shown")
        assert readings(driver, policed)[3].text.startswith("↑"), readings(driver, policed)[3].text
        assert readings(driver, plain)[3].text == "—"
        wait(driver, lambda d: readings(d, policed)[2].text.endswith(" %"),
             message="no CPU reading")
        float(readings(driver, policed)[2].text.removesuffix(" %"))

        # The ops page lists the refusal among the egress decisions; a filter narrows them.
        driver.get(server.url + "/#/ops")
        row = '#egress tbody tr[data-decision="denied"]'
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, row),
             message="the refusal is not among the egress decisions")
        cells = [c.text for c in driver.find_elements(By.CSS_SELECTOR, row + " td")]
        assert cells[3:8] == [policed, "b.example.org", "80", "denied", "not_allowed"], cells
        Select(by_id(driver, "egress-decision")).select_by_visible_text("allowed")
        by_id(driver, "egress-form").submit()
        wait(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, "#egress tbody tr"),
             message="the decision filter does not narrow the list")
    finally:
        for sid in (policed, plain):
            server.call("DELETE", f"/v1/sandboxes/{sid}")


def test_the_operations_page_shows_each_zygote_and_its_restarts(browser, server):
    driver = browser
    open_console(driver, server, server.operator_key)
    driver.get(server.url + "/#/ops")
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#pools tbody tr"), message="no pools")
    status, _, body = server.call("GET", "/healthz")
    assert status == 200
    pools = json.loads(body)["pools"]
    assert pools, body
    shown = [[c.text for c in r.find_elements(By.TAG_NAME, "td")]
             for r in driver.find_elements(By.CSS_SELECTOR, "#pools tbody tr")]
    assert shown == [
        [p["image"], "up" if p["zygote_alive"] else "down", str(p["zygote_restarts"]),
         "up" if p["lean_zygote_alive"] else "down", str(p["lean_zygote_restarts"])]
        for p in pools
    ]
