"""The search page in a real headless browser (Debian's chromium + chromedriver, driven by selenium): load the
page, type a query, read the results, follow a result to its document."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

from retr.cli.main import main

pytest.importorskip("fastapi")
webdriver = pytest.importorskip("selenium.webdriver")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
if not (CHROMIUM and DRIVER):
    if os.environ.get("CI"):  # .ci/run installs them: missing there is a broken CI, not a reason to skip
        pytest.fail("chromium and chromedriver are missing in CI", pytrace=False)
    pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)",
                allow_module_level=True)


@pytest.fixture
def browser(tmp_path_factory):
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    # a profile in pytest's temporary folder (not a leftover in /tmp), and no connections beyond loopback
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def test_the_search_page_finds_highlights_and_links(tiny_dataset, tiny_bi_encoder, tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from retr.retrieval.encoder import EncoderConfig
    from retr.serve.config import ServeConfig

    from .serving import Server

    idx = tmp_path / "idx"
    assert main(["index", "--corpus", str(tiny_dataset), "--out", str(idx), "--model", str(tiny_bi_encoder),
                 "--backend", "onnx", "--bm25"]) == 0
    server = Server(idx, ServeConfig(encoder=EncoderConfig(backend="onnx")))
    try:
        browser.get(server.url + "/")
        assert browser.title == "retr search"
        assert browser.find_element(By.ID, "rerank").get_attribute("disabled") is not None  # no cross-encoder
        Select(browser.find_element(By.ID, "mode")).select_by_visible_text("bm25")
        box = browser.find_element(By.ID, "q")
        box.send_keys("wolves tundra")
        box.submit()
        WebDriverWait(browser, 20).until(ec.presence_of_element_located((By.CSS_SELECTOR, "#results .hit")))
        hits = browser.find_elements(By.CSS_SELECTOR, "#results .hit")
        assert len(hits) >= 2 and "d9" in hits[0].text and "d16" in hits[1].text  # the two docs with both words
        marks = {m.text.lower() for m in browser.find_elements(By.CSS_SELECTOR, "#results mark")}
        assert {"wolves", "tundra"} <= marks
        assert "bm25" in browser.find_element(By.ID, "timings").text
        hits[1].find_element(By.TAG_NAME, "a").click()
        WebDriverWait(browser, 20).until(ec.presence_of_element_located((By.TAG_NAME, "h1")))
        assert "treeless plain" in browser.find_element(By.TAG_NAME, "p").text
        browser.back()
        box = WebDriverWait(browser, 20).until(ec.presence_of_element_located((By.ID, "q")))
        box.clear()
        box.send_keys("   ")  # whitespace: the server's error is shown, not a broken page
        box.submit()
        WebDriverWait(browser, 20).until(lambda d: d.find_element(By.ID, "error").text)
        assert "empty" in browser.find_element(By.ID, "error").text
    finally:
        server.stop()


def test_the_search_page_keeps_its_query_in_the_url(tiny_dataset, tiny_bi_encoder, tmp_path, browser):
    """A URL ``/?q=&mode=&k=`` runs its search when loaded (a result can be shared); a new search is a new history
    entry, and the back and forward buttons bring each search back, its form and its results."""
    from urllib.parse import parse_qs, urlsplit

    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from retr.retrieval.encoder import EncoderConfig
    from retr.retrieval.request import DEFAULT_MODE
    from retr.serve.config import ServeConfig

    from .serving import Server

    idx = tmp_path / "idx"
    assert main(["index", "--corpus", str(tiny_dataset), "--out", str(idx), "--model", str(tiny_bi_encoder),
                 "--backend", "onnx", "--bm25"]) == 0
    server = Server(idx, ServeConfig(encoder=EncoderConfig(backend="onnx")))

    def shown(query: str, count: int):
        """Wait until the page shows ``count`` hits for ``query`` (the results may be replaced while they are read:
        a stale element is read again)."""
        def ready(d):
            hits = d.find_elements(By.CSS_SELECTOR, "#results .hit")
            marks = {m.text.lower() for m in d.find_elements(By.CSS_SELECTOR, "#results mark")}
            return len(hits) == count and query.split()[0] in marks
        return WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,)).until(ready)

    def url_query() -> dict:
        return {k: v[0] for k, v in parse_qs(urlsplit(browser.current_url).query).items()}

    try:
        browser.get(server.url + "/?q=wolves+tundra&mode=bm25&k=2")
        shown("wolves", 2)
        assert browser.find_element(By.ID, "q").get_attribute("value") == "wolves tundra"
        assert Select(browser.find_element(By.ID, "mode")).first_selected_option.text == "bm25"
        assert browser.find_element(By.ID, "k").get_attribute("value") == "2"
        first = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "#results .hit .meta")]
        assert "d9" in first[0] and "d16" in first[1]  # the two docs with both words, as on a typed search
        box = browser.find_element(By.ID, "q")
        box.clear()
        box.send_keys("solar panels")
        box.submit()
        WebDriverWait(browser, 20).until(lambda d: url_query().get("q") == "solar panels")
        assert url_query() == {"q": "solar panels", "mode": "bm25", "k": "2"}
        shown("solar", 2)
        browser.back()  # the first search again: its URL, form and results
        WebDriverWait(browser, 20).until(lambda d: url_query().get("q") == "wolves tundra")
        shown("wolves", 2)
        assert browser.find_element(By.ID, "q").get_attribute("value") == "wolves tundra"
        browser.forward()
        WebDriverWait(browser, 20).until(lambda d: url_query().get("q") == "solar panels")
        shown("solar", 2)
        assert browser.find_element(By.ID, "q").get_attribute("value") == "solar panels"
        # a shared URL with a mode this server does not know: the default mode, and the search still runs
        browser.get(server.url + "/?q=wolves&mode=colbert")
        shown("wolves", 10)
        assert Select(browser.find_element(By.ID, "mode")).first_selected_option.text == DEFAULT_MODE
        browser.get(server.url + "/")  # no query: an empty page, no search
        assert browser.find_element(By.ID, "q").get_attribute("value") == ""
        assert not browser.find_elements(By.CSS_SELECTOR, "#results .hit")
    finally:
        server.stop()


def test_the_html_report_renders_with_its_figures(tiny_dataset, tiny_bi_encoder, tmp_path, browser):
    """`retr report`'s page in the browser: the summary table is there and every embedded figure decodes."""
    from selenium.webdriver.common.by import By

    report = tmp_path / "r.json"
    assert main(["eval", "--dataset", str(tiny_dataset), "--model", str(tiny_bi_encoder), "--backend", "onnx",
                 "--pipelines", "bm25,dense,hybrid", "--k-values", "1,3,10", "--warmup", "1", "--out", str(report)]) == 0
    page = tmp_path / "report.html"
    assert main(["report", str(report), "--out", str(page)]) == 0
    browser.get(page.as_uri())
    rows = browser.find_elements(By.CSS_SELECTOR, "#summary tr")
    assert len(rows) == 4 and "hybrid" in rows[-1].text
    images = browser.find_elements(By.TAG_NAME, "img")
    assert len(images) == 4  # quality/latency, Recall@k, hybrid against bm25 and against dense
    sizes = [browser.execute_script("return [arguments[0].complete, arguments[0].naturalWidth, "
                                    "arguments[0].naturalHeight]", img) for img in images]
    assert all(done and w > 200 and h > 100 for done, w, h in sizes), sizes


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs not installed (pip install -e '.[docs]')")
def test_no_code_block_of_the_docs_site_is_cut_at_1280_px(tmp_path, browser):
    """Every page of the built site at a 1280 px wide window: each code block shows all its text (it wraps at the
    page's edge; nothing is left past a hidden right edge)."""
    import subprocess
    import sys

    from selenium.webdriver.common.by import By

    from .conftest import REPO

    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "-q", "-d", str(site)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    browser.set_window_size(1280, 900)
    pages = sorted(p for p in site.rglob("index.html") if "assets" not in p.parts)
    assert len(pages) > 20
    cut, blocks = [], 0
    for page in pages:
        browser.get(page.as_uri())
        for code in browser.find_elements(By.CSS_SELECTOR, ".md-typeset pre > code"):
            blocks += 1
            over = browser.execute_script("return arguments[0].scrollWidth - arguments[0].clientWidth", code)
            if over > 1:
                cut.append(f"{page.relative_to(site)}: {over} px past the edge: {code.text[:60]!r}")
    assert blocks > 30 and not cut, "\n".join(cut[:20])
