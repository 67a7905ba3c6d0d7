"""What the console's browser tests share: waiting for the page, driving it, and the signs
that a hostile payload ran (see conftest.py for the detectors). A module of its own name, so
that suites run together do not mix their conftest modules."""


from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

# What a payload logs when it runs: built by concatenation in the payloads, so that the
# marker appears in the browser's log only if a payload's code was executed.
MARKER = "PWNED-FIRED"


RUN_TIMEOUT_S = 120


def wait(driver, condition, timeout=30, message=""):
    # The list is redrawn every few seconds: an element found just before may be gone.
    return WebDriverWait(
        driver, timeout, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    ).until(lambda d: condition(d), message)


def by_id(driver, element_id):
    return driver.find_element(By.ID, element_id)


def visible(driver, element_id):
    return by_id(driver, element_id).is_displayed()


def set_code(driver, cell, code):
    """Types `code` into a cell (set as its value: the keyboard would take minutes)."""
    area = cell.find_element(By.CSS_SELECTOR, "textarea")
    driver.execute_script("arguments[0].value = arguments[1];", area, code)


def run_cell(driver, cell, code, timeout=RUN_TIMEOUT_S):
    """Runs `code` in `cell` and waits for it to end; returns the cell's output element."""
    before = cell.get_attribute("data-done") or "0"
    set_code(driver, cell, code)
    cell.find_element(By.CSS_SELECTOR, "button.run").click()
    wait(driver, lambda d: (cell.get_attribute("data-done") or "0") != before, timeout,
         f"the cell did not finish: {code!r}")
    return cell.find_element(By.CSS_SELECTOR, ".output")


def new_cell(driver):
    by_id(driver, "add-cell").click()
    return driver.find_elements(By.CSS_SELECTOR, "#cells .cell")[-1]


def open_console(driver, server, key=None):
    """Opens the console afresh: keyless (loopback), or with `key` typed into its key form."""
    driver.get(server.url + "/#/")
    driver.execute_script("sessionStorage.clear();")
    driver.refresh()
    if key:
        # Keyless use works on loopback: a key is chosen with "Use a key".
        wait(driver, lambda d: visible(d, "use-key"))
        by_id(driver, "use-key").click()
        wait(driver, lambda d: visible(d, "login"), message="no key form")
        by_id(driver, "login-key").send_keys(key)
        by_id(driver, "login-form").submit()
    wait(driver, lambda d: by_id(d, "who").text != "", message="the console did not load")


def create_sandbox(driver):
    wait(driver, lambda d: visible(d, "view-sandboxes"))
    by_id(driver, "create").click()
    wait(driver, lambda d: d.current_url.split("#", 1)[-1].startswith("/sandbox/"), 60,
         "creating a sandbox did not open its playground")
    wait(driver, lambda d: by_id(d, "pg-state").text == "running")
    return driver.current_url.split("#/sandbox/", 1)[1]


def click(driver, css):
    """Clicks the element `css` names, found afresh (the list is redrawn every few seconds)."""
    wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, css).click() is None)


def file_names(driver):
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#files li .name")]


def browser_logs(driver):
    """Every console message of every frame so far (kept across calls)."""
    driver.seen_logs.extend(e["message"] for e in driver.get_log("browser"))
    return driver.seen_logs


def pwned(driver, beacon):
    """What shows that a payload ran: marker logs, a dialog, `window.__pwned`, beacon hits."""
    signs = [m for m in browser_logs(driver) if MARKER in m]
    if driver.execute_script("return window.__pwned !== undefined"):
        signs.append("window.__pwned was set")
    signs += [f"posted: {m}" for m in driver.execute_script("return window.__pwnMessages || []")]
    signs += [f"beacon hit {h}" for h in beacon.hits if h.startswith(("/hit", "/img"))]
    return signs
