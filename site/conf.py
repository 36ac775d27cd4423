"""Sphinx configuration of the course's static site (built by `python -m course_lib.classroom.site`).

The builder copies this folder, the executed notebooks, the course map, the comparison's tables
and the instructor's guides into a staging folder and runs Sphinx there; nothing is executed.

Why Sphinx with myst-nb rather than jupyter-book: jupyter-book 2 is a distribution of mystmd, a
Node.js program, so it needs Node at run time (and fetches one through nodeenv where none is
installed): a second toolchain, and a download, for a course that needs only Python.
jupyter-book 1 is Sphinx and myst-nb underneath, with its own configuration layer on top. Sphinx
and myst-nb install from PyPI with the rest of requirements.txt, read the stored outputs of the
notebooks (no kernel), and write plain HTML whose search (a JavaScript index in a file) works from
a folder opened from disk.

Math is typeset by MathJax 3's SVG build (`tex-svg.js`, from the `django-static-mathjax`
package, which ships MathJax's own files and depends on nothing), copied into the site: no
request leaves the page. The SVG output draws its glyphs from paths inside the script, so no web
font has to load (a page opened from disk may be refused fonts from disk).

Reading aids: sphinx-copybutton (a pip package, no network) puts a copy button on every code
block; the sidebar lists the page's own sections ("On this page": `_templates/localtoc.html`)
and scrolls on its own, with the search box near its top so that it stays in view; code and
outputs wrap in `_static/course.css` rather than scroll. The icon, `_extra/favicon.ico` (a dot
turned on a circle: a position as a rotation), is linked from every page and also sits at the
site's root, where a browser asks for `/favicon.ico` when a page is served.
"""

import shutil
from pathlib import Path

import mathjax

project = "Positional encodings, from scratch to Triton"
author = "the course's authors"
copyright = "the course's authors"
html_title = project

extensions = ["myst_nb", "sphinx_copybutton"]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # the committed outputs are the page; nothing runs
nb_ipywidgets_js = {}  # explorers are shown as their static figure (no widget JavaScript)
nb_merge_streams = True
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

html_theme = "alabaster"
html_theme_options = {
    "description": "A hands-on course: every encoding from its formula, checked, then fused.",
    "fixed_sidebar": True,
    "show_relbars": True,
    "page_width": "1240px",
    "sidebar_width": "260px",
}
html_sidebars = {
    "**": ["about.html", "searchbox.html", "localtoc.html", "navigation.html", "relations.html"]
}
templates_path = ["_templates"]  # localtoc.html: the page's sections, "On this page"
html_static_path = ["_static"]
html_extra_path = ["_extra"]
html_favicon = "_extra/favicon.ico"
html_css_files = ["course.css"]
html_copy_source = False
html_show_sourcelink = False
html_last_updated_fmt = None
# Search results without a text summary: a summary is read by fetching each result's page, which
# a browser refuses for pages opened from disk (file://). The results themselves need no fetch.
html_show_search_summary = False

MATHJAX_ES5 = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
# What tex-svg.js loads: itself, and on demand the TeX extensions, the menu and assistive MathML.
MATHJAX_PARTS = ("tex-svg.js", "input", "ui", "a11y")
mathjax_path = "mathjax/tex-svg.js"
mathjax3_config = {"options": {"enableMenu": False}}


def copy_mathjax(app, exception):
    """Put the local MathJax into the built site's _static/mathjax."""
    if exception is not None or app.builder.format != "html":
        return
    target = Path(app.outdir) / "_static" / "mathjax"
    for part in MATHJAX_PARTS:
        source = MATHJAX_ES5 / part
        if source.is_dir():
            shutil.copytree(source, target / part, dirs_exist_ok=True)
        else:
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / part)


def setup(app):
    app.connect("build-finished", copy_mathjax)
