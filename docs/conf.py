"""Sphinx configuration of syncbench's documentation site (``make docs``).

The user guide is the Markdown files of ``docs/`` and the repository's ``README.md``
and ``CHANGELOG.md``, read by MyST; the reference (commands, scenario format, run-file
schema, report columns) is generated from the code by ``_ext/reference_text.py``; the
API reference of the extension points is autodoc over their docstrings. Building the
site imports the package but never starts MPI (``_ext/syncbench_docs.py`` checks).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

# A module that loaded mpi4py.MPI while being documented would not start MPI either:
# MPI_Init at import is switched off before anything is imported.
try:
    import mpi4py

    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
except ImportError:  # pragma: no cover - the package needs mpi4py; autodoc would say so
    pass

from syncbench.bench.mpi.provenance import package_version  # noqa: E402

project = "syncbench"
author = "the syncbench authors"
copyright = "the syncbench authors"
release = package_version()
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "syncbench_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# figures/README.md describes the files beside it (it is no page); _ext holds code.
exclude_patterns = ["_build", "_ext", "figures/README.md", "Thumbs.db", ".DS_Store"]

# ---------------------------------------------------------------- MyST (Markdown)
# Heading anchors: the docs link to sections with [text](FILE.md#a-heading) and
# [text](#a-heading), GitHub's slugs, which MyST makes for headings to this depth.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
# The docs link to repository files outside docs/ (jobs/, ../bench/cli.py, Makefile),
# which the site does not carry. No warning is suppressed for them: the RepositoryLinks
# and RepositoryDownloads transforms of _ext/syncbench_docs.py turn a link whose path
# exists in the repository into its text, titled with the path (where MyST would warn,
# or copy the file into the site), and README.md / CHANGELOG.md into their pages; a
# link to a path that exists nowhere is still a warning (a broken link), as is any
# other MyST problem. Links with a scheme (https:, mailto:) stay external links.
myst_url_schemes = ["http", "https", "mailto", "ftp"]
# The one warning suppressed: a heading level that skips one (## then ####). The
# Markdown files are written to be read on their own as well, where that is a choice of
# emphasis; the site still nests the sections as written. Nothing else is suppressed.
suppress_warnings = ["myst.header"]

# ---------------------------------------------------------------- autodoc
autodoc_default_options = {"members": True, "member-order": "bysource",
                           "show-inheritance": True}
autodoc_typehints = "description"
autodoc_class_signature = "separated"
# Docstrings are plain reStructuredText (no NumPy or Google sections): no napoleon.
# Type hints name classes of NumPy, mpi4py, h5py, which this site does not document:
# an unresolved name in a signature is text, not a warning (nitpicky is off).
nitpicky = False

# ---------------------------------------------------------------- HTML
html_theme = "alabaster"
html_title = f"syncbench {release}"
html_static_path: list[str] = []
html_theme_options = {
    "description": "MPI benchmark suite for synchronization strategies in data-parallel "
                   "training",
    "fixed_sidebar": True,
    "page_width": "1180px",
    "sidebar_width": "250px",
}
html_sidebars = {"**": ["about.html", "navigation.html", "relations.html", "searchbox.html"]}
html_show_sourcelink = False
