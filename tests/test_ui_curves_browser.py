"""The Training-curves tab's bundled runs in a real Chromium, as a first-time visitor sees
them at 1400 and 1000 px: phase labels that do not print over each other, tables whose
words stay whole (no "GR" for GRPO, no "likelihoo d"), and one name per run.

The app runs in this process on loopback; no model runs (the tab reads logs only), so the
backend factory refuses every model and the retriever returns nothing. Screenshots go to
test-artifacts/ for a person to look at.
"""

from __future__ import annotations

import re

import pytest

from agent.backends.base import ModelLoadError
from agent.testing import free_port
from app.ui.curves_tab import BUNDLED_RUNS, bundled_groups, bundled_logs
from tests.browser import ARTIFACTS, open_details, open_tab, require_chromium

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_chromium()
if not bundled_logs():
    pytest.skip("assets/nano-runs is not in this checkout", allow_module_level=True)


def no_model(model: str):
    raise ModelLoadError(f"{model}: no model runs in this test")


class NoDocuments:
    def search(self, queries, topk=3):
        return [[] for _ in queries]


@pytest.fixture(scope="module")
def app_url():
    from app.ui import build_app, launch_options

    demo = build_app(no_model, NoDocuments())
    port = free_port()
    demo.launch(**launch_options(port=port, prevent_thread_lock=True, quiet=True))
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture(scope="module", params=[1400, 1000, 390], ids=lambda width: f"{width}px")
def bundled(request, browser, app_url):
    """The tab after "Show the bundled runs" (the collapse regime, the picker's first
    experiment), at one viewport width (plotted once a width: every test below only reads
    the page)."""
    from playwright.sync_api import expect

    width = request.param
    context = browser.new_context(viewport={"width": width, "height": 1100})
    page = context.new_page()
    page.goto(app_url)
    open_tab(page, "Training curves")
    page.locator("#curves-bundled").click()
    expect(page.locator("#curves-messages")).to_contain_text("What they show",
                                                             timeout=120_000)
    expect(page.locator("#curves-summary")).to_contain_text("GRPO", timeout=60_000)
    plots = page.locator(".js-plotly-plot")
    expect(plots.first).to_be_visible(timeout=60_000)
    page.wait_for_timeout(1500)  # plotly lays its annotations out after the first paint
    page.screenshot(path=str(ARTIFACTS / f"curves-bundled-{width}.png"), full_page=True)
    plots.first.screenshot(path=str(ARTIFACTS / f"curves-likelihood-{width}.png"))
    yield page
    context.close()


# Each plot's annotation text boxes (plotly draws one `g.annotation` per label).
LABEL_BOXES = """plot => [...plot.querySelectorAll('g.annotation')].map(g => {
  const r = g.querySelector('.annotation-text-g').getBoundingClientRect();
  return {text: g.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom};
})"""


def overlapping(boxes: list[dict], slack: float = 0.5) -> list[tuple[str, str]]:
    """Pairs of text boxes that share more than `slack` pixels either way."""
    pairs = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if (min(a["right"], b["right"]) - max(a["left"], b["left"]) > slack and
                    min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > slack):
                pairs.append((a["text"], b["text"]))
    return pairs


def test_phase_labels_of_the_bundled_runs_do_not_overlap(bundled):
    plots = bundled.locator(".js-plotly-plot")
    labelled = 0
    for index in range(plots.count()):
        plot = plots.nth(index)
        boxes = plot.evaluate(LABEL_BOXES)
        labelled += bool(boxes)
        assert overlapping(boxes) == [], f"plot {index}: labels print over each other"
        # And each label is inside the figure, not cut off at its edge.
        frame = plot.locator(".main-svg").first.bounding_box()
        for box in boxes:
            assert frame["x"] - 1 <= box["left"] and box["right"] <= frame["x"] + \
                frame["width"] + 1, f"plot {index}: {box['text']!r} runs off the figure"
    assert labelled >= 2  # the likelihood and reward panels, at least, carry labels


# Gradio draws a table's headers as a <table> and its rows as divs (`role=gridcell`).
# Words of its headers and cells drawn across two lines at a place that is not a hyphen or
# slash ("likelihoo d", "GR" + "PO"), and cells whose text runs past the cell's edge
# (clipped: "GR").
BROKEN_WORDS = """block => {
  const broken = [];
  for (const cell of block.querySelectorAll('th, [role=gridcell]')) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const text = node.textContent;
      for (const m of text.matchAll(/\\S+/g)) {
        let top = null;
        for (let i = m.index; i < m.index + m[0].length; i++) {
          const range = document.createRange();
          range.setStart(node, i);
          range.setEnd(node, i + 1);
          const rect = range.getBoundingClientRect();
          if (!rect.width) continue;
          const row = Math.round(rect.top);
          if (top !== null && row !== top && !'-/'.includes(text[i - 1]))
            broken.push(m[0]);
          top = row;
        }
      }
    }
  }
  return [...new Set(broken)];
}"""
CLIPPED = """block => [...block.querySelectorAll('th, [role=gridcell]')].filter(cell => {
  const range = document.createRange();
  range.selectNodeContents(cell);
  const text = range.getBoundingClientRect(), box = cell.getBoundingClientRect();
  return text.width && text.right > box.right + 1;
}).map(cell => cell.textContent)"""


def test_tables_keep_words_whole_and_show_the_methods(bundled):
    for block in ("#curves-summary", "#curves-labels"):
        assert bundled.locator(block).evaluate(BROKEN_WORDS) == [], block
        assert bundled.locator(block).evaluate(CLIPPED) == [], block
    methods = bundled.locator("#curves-labels [role=gridcell][data-col='1']")
    assert {text.strip() for text in methods.all_inner_texts()} == {"GRPO", "LLDS"}
    bundled.locator("#curves-labels").screenshot(
        path=str(ARTIFACTS / f"curves-labels-{bundled.viewport_size['width']}.png"))


def first_column_scrolled(page, table: str) -> set[str]:
    """The first column's texts of a table that renders the rows in view only."""
    cells = page.locator(f"{table} [role=gridcell][data-col='0']")
    seen: set[str] = set()
    for _ in range(12):
        seen |= {name.strip() for name in cells.all_inner_texts()}
        cells.last.scroll_into_view_if_needed()
        page.wait_for_timeout(200)
    return seen


def test_each_bundled_run_has_one_name_its_folder(bundled):
    # A run's folder under assets/nano-runs: `collapse/grpo-lr3e-4-seed0`; the experiment
    # shown first is the collapse regime.
    first = next(iter(bundled_groups().values()))
    folders = {log.parent.relative_to(BUNDLED_RUNS).as_posix() for log in first}
    assert folders and all(f.startswith("collapse/") for f in folders)
    # Both tables draw the rows in view only: read the names from each table's first
    # column, scrolled through as a visitor scrolls.
    assert first_column_scrolled(bundled, "#curves-labels") == folders
    assert first_column_scrolled(bundled, "#curves-summary") == folders
    summary = bundled.locator("#curves-summary").inner_text()
    messages = bundled.locator("#curves-messages").inner_text()
    details = open_details(bundled)
    logged = re.compile(r"nano-(grpo|llds)")  # the names the logs give their runs
    assert not logged.search(summary) and not logged.search(messages)
    assert not logged.search(details.split("Made with")[0])
    made_with = details.split("Made with", 1)[1]
    for folder in folders:
        assert folder in made_with
    names = " ".join(bundled.locator(".js-plotly-plot").first.evaluate(
        "p => [...p.querySelectorAll('.legendtext, .annotation')].map(e => e.textContent)"))
    assert not logged.search(names)
    assert re.search(r"collapse/grpo-lr3e-4", names)


def test_one_collapse_step_per_run_on_the_page(bundled):
    """collapse/grpo-lr3e-4-seed0 collapsed at step 49 by the pre-registered rule: the
    sentence, the Summary and the reward plot's mark say 49, and nothing says a second
    'collapse' step for it (the plot once said 'reward collapse @ 46', the Summary
    'collapse onset (III) 30')."""
    messages = bundled.locator("#curves-messages").inner_text()
    assert "at steps 49, 50" in messages
    summary = bundled.locator("#curves-summary")
    headers = [h.strip() for h in summary.locator("[role=columnheader]").all_inner_texts()]
    row = summary.locator("[role=row]", has_text="collapse/grpo-lr3e-4-seed0").first
    cells = [c.strip() for c in row.locator("[role=gridcell]").all_inner_texts()]
    assert cells[headers.index("collapse step")] == "49", (headers, cells)
    labels = " ".join(bundled.locator(".js-plotly-plot").evaluate_all(
        "plots => plots.flatMap(p => [...p.querySelectorAll('.annotation')]"
        ".map(e => e.textContent))"))
    assert "collapse @ 49" in labels and "reward collapse" not in labels
    assert not re.search(r"collapse @ (?!49\b)\d+", labels)
    assert "collapse onset" not in " ".join(headers)


# Each plot's title, subtitle and legend texts, and its modebar's box (drawn on hover).
TEXT_BOXES = """plot => {
  const box = el => { const r = el.getBoundingClientRect();
    return {text: el.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
  const bar = plot.querySelector('.modebar');
  const texts = sel => [...plot.querySelectorAll(sel)].filter(el => el.textContent.trim())
    .map(box);
  return {texts: texts('.legend text'), titles: texts('.gtitle, .gtitle-subtitle'),
          modebar: bar ? box(bar) : null, width: window.innerWidth};
}"""


def test_titles_and_legends_fit_the_window_and_the_modebar_leaves_the_title(bundled):
    # At 390 px the subtitle and the legend's names ran off both edges, and the modebar
    # (zoom, pan, …) sat over the title.
    plots = bundled.locator(".js-plotly-plot")
    for index in range(plots.count()):
        plot = plots.nth(index)
        plot.hover()  # the modebar shows
        found = plot.evaluate(TEXT_BOXES)
        for box in found["texts"] + found["titles"]:
            assert box["left"] >= -1 and box["right"] <= found["width"] + 1, \
                f"plot {index}: {box['text']!r} runs off the window"
        bar = found["modebar"]
        if bar is not None:
            covered = [b["text"] for b in found["titles"] if overlapping([bar, b])]
            assert covered == [], f"plot {index}: the modebar covers {covered}"


@pytest.mark.parametrize("width", [1400, 1000])
def test_the_confirmation_shows_survival_and_anchor_plots(browser, app_url, width):
    """Picking the confirmation: how many runs of each method stand at each step (its runs
    and the exploratory ones, told apart) and each run's anchor change by method, from the
    shipped logs, every title and legend name inside the window."""
    from playwright.sync_api import expect

    from agent.testing import ROOT
    from app.ui.curves_tab import CONFIRMATION
    from nano.experiments.confirm import read_runs

    runs = {cohort: [r for r in read_runs(ROOT / "assets" / "nano-runs" / folder) if r.judged]
            for cohort, folder in (("confirmatory", "confirm/runs"),
                                   ("exploratory", "collapse"))}
    context = browser.new_context(viewport={"width": width, "height": 1100})
    page = context.new_page()
    page.goto(app_url)
    open_tab(page, "Training curves")
    page.locator("#curves-group input").click()
    page.get_by_role("option", name=CONFIRMATION).click()
    survival = page.locator("#curves-survival .js-plotly-plot")
    anchor = page.locator("#curves-anchor .js-plotly-plot")
    expect(survival).to_be_visible(timeout=120_000)
    expect(anchor).to_be_visible()
    page.wait_for_timeout(1500)  # plotly lays its legend out after the first paint
    legend = " ".join(survival.locator(".legend text").all_text_contents())
    for cohort, readings in runs.items():
        for method in ("GRPO", "LLDS-A"):
            ran = [r for r in readings if r.method == method]
            standing = sum(not r.collapsed for r in ran)
            assert f"{method}, {cohort} ({standing} of {len(ran)} standing)" in legend
    measured = sum(r.anchor_change is not None for rs in runs.values() for r in rs)
    assert anchor.locator(".scatterlayer .point").count() == measured
    for plot in (survival, anchor):
        found = plot.evaluate(TEXT_BOXES)
        assert found["titles"], "a plot without its title"
        for box in found["texts"] + found["titles"]:
            assert box["left"] >= -1 and box["right"] <= found["width"] + 1, \
                f"{box['text']!r} runs off the window"
    # The other plots still show the confirmation's runs, and the sentence says where it is.
    expect(page.locator("#curves-messages")).to_contain_text("The pre-registered verdict")
    page.screenshot(path=str(ARTIFACTS / f"curves-confirmation-{width}.png"), full_page=True)
    context.close()
