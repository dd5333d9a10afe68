"""The README and the documentation pages: every relative link names a file that exists,
every result image is shown on some page, and the README states the test command.

(`make docs` builds the site with `mkdocs build --strict`, which also checks links
between pages and the API reference; this test needs no mkdocs and also covers the
README, which is not part of the site.)"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# [text](target) and ![alt](target); code spans are removed first.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def relative_links(page: Path) -> list[str]:
    """The link targets of `page` that point into the repository (no URL, no bare anchor)."""
    text = CODE.sub("", page.read_text())
    return [t for t in LINK.findall(text)
            if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_exist(page):
    missing = [t for t in relative_links(page)
               if not (page.parent / t.split("#", 1)[0]).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


def test_link_pattern_finds_links_and_skips_code(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("see [a](a.md#x), ![i](img/i.png), [web](https://x.org), [s](#top)\n"
                    "`[not](code.md)`\n```\n[nor](block.md)\n```\n")
    assert relative_links(page) == ["a.md#x", "img/i.png"]


def test_every_result_image_is_shown():
    shown = {t.split("#", 1)[0] for p in PAGES for t in relative_links(p)}
    images = sorted((ROOT / "docs" / "results").glob("*.png"))
    assert images
    for img in images:
        assert f"results/{img.name}" in shown, f"{img.name} is on no page"


def test_readme_states_the_two_commands_and_links_the_docs():
    text = (ROOT / "README.md").read_text()
    assert "make install" in text and "make test" in text
    linked = set(relative_links(ROOT / "README.md"))
    assert "docs/index.md" in linked
    assert len(text.splitlines()) < 150, "the README is the five-minute tour"
