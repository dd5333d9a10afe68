"""mkdocs hook: the flags page (docs/flags.md) shows `python -m pal_hpc.main --help`
as the code prints it at build time, so the page cannot go stale."""

import os

MARKER = "<!-- pal_hpc.main --help -->"


def on_page_markdown(markdown, page, config, files):
    """Replace MARKER with the entry point's --help text (a fixed 100 columns wide)."""
    if MARKER not in markdown:
        return markdown
    os.environ["COLUMNS"] = "100"
    from pal_hpc.config_io import build_parser
    text = build_parser().format_help()
    return markdown.replace(MARKER, "```text\n" + text.rstrip() + "\n```")
