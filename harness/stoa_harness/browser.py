"""A real headless Chromium for the console's browser tests: Debian's `chromium` driven through its
`chromedriver` by Selenium, both by explicit path (Selenium's own manager never runs, so nothing is
downloaded); `make setup` installs the two Debian packages when they are missing.

    with Browser(output_dir) as browser:
        browser.open(url); browser.shot("01-signed-in")   # a PNG per step under output_dir
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException
from selenium.common.exceptions import StaleElementReferenceException as StaleElement
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from stoa_harness.lifecycle import Lifecycle

# Where the browser tests put their screenshots (one folder per test module); `.stoa/` is ignored by git.
OUTPUT_ENV = "STOA_TEST_OUTPUT"
DEFAULT_OUTPUT = Path(__file__).resolve().parents[2] / ".stoa" / "test-output"


class BrowserMissing(RuntimeError):
    """chromium or chromedriver is not installed (`make setup` installs them)."""


def binaries() -> tuple[str, str]:
    """(chromium, chromedriver): from STOA_CHROMIUM / STOA_CHROMEDRIVER, else on PATH."""
    chromium = os.environ.get("STOA_CHROMIUM") or shutil.which("chromium")
    driver = os.environ.get("STOA_CHROMEDRIVER") or shutil.which("chromedriver")
    if not chromium or not driver:
        raise BrowserMissing(
            "chromium and chromedriver are needed for the console's browser tests: `make setup` installs"
            " Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
        )
    return chromium, driver


def output_dir(name: str) -> Path:
    root = Path(os.environ.get(OUTPUT_ENV) or DEFAULT_OUTPUT)
    folder = root / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


class Browser(Lifecycle):
    def __init__(self, screenshots: Path, width: int = 1280, height: int = 1000) -> None:
        self.screenshots = screenshots
        self.size = (width, height)
        self.driver: webdriver.Chrome | None = None

    def _start(self) -> None:
        chromium, driver = binaries()
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for arg in (
            "--headless=new",
            "--no-sandbox",  # tests run as root, where Chromium's sandbox cannot start
            "--disable-dev-shm-usage",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-features=Translate,MediaRouter,OptimizationHints",
            f"--window-size={self.size[0]},{self.size[1]}",
        ):
            options.add_argument(arg)
        self.driver = webdriver.Chrome(options=options, service=Service(executable_path=driver))
        self.driver.set_page_load_timeout(20)

    def stop(self) -> None:
        if self.driver is not None:
            # Quits Chromium and stops chromedriver (the service's own process).
            self.driver.quit()
            self.driver = None

    @property
    def d(self) -> webdriver.Chrome:
        assert self.driver is not None, "browser not started"
        return self.driver

    def open(self, url: str) -> None:
        """Load `url` afresh (from the same page, a URL differing only in its #fragment would not reload)."""
        self.d.get("about:blank")
        self.d.get(url)

    def shot(self, name: str, at: WebElement | None = None) -> Path:
        """A PNG of the window, scrolled to `at` when given."""
        if at is not None:
            self.d.execute_script("arguments[0].scrollIntoView({block: 'center'})", at)
        path = self.screenshots / f"{name}.png"
        self.d.save_screenshot(str(path))
        return path

    def wait(self, condition: object, timeout: float = 15.0, what: str = "") -> object:
        # The console re-renders live parts of a page: an element read a moment ago may be gone.
        wait = WebDriverWait(
            self.d, timeout, poll_frequency=0.1, ignored_exceptions=(NoSuchElementException, StaleElement)
        )
        return wait.until(condition, what)  # type: ignore[arg-type]

    def css(self, selector: str, timeout: float = 15.0) -> WebElement:
        """The first element `selector` finds once it is displayed."""

        def shown(driver: webdriver.Chrome) -> WebElement | bool:
            for element in driver.find_elements("css selector", selector):
                if element.is_displayed():
                    return element
            return False

        return self.wait(shown, timeout, f"{selector} displayed")  # type: ignore[return-value]
