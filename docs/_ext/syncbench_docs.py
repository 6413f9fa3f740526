"""The site's Sphinx extension: generated reference parts, the guide's page list, and
links from the Markdown docs to repository files.

- ``.. syncbench-reference:: PART`` puts one generated part of
  :mod:`reference_text` (``commands``, ``runfile``, ``scenario``, ``columns``) into a
  reStructuredText page, parsed with its section titles.
- The user guide's page list is the Markdown files of ``docs/`` that exist when the
  site is built, in :data:`GUIDE_ORDER` and then any other by name (a line
  ``%% guide-pages`` in ``index.md`` becomes that list), so a guide page that is added,
  renamed or removed needs no edit here and never leaves a page outside every toctree.
- ``changelog.md``: ``CHANGELOG.md`` at the repository's root when it exists, else a
  line saying it does not (:func:`changelog_source`).
- Links in the Markdown docs to repository paths outside ``docs/`` (``jobs/``,
  ``../bench/cli.py``, ``Makefile``): the site carries no copy of the repository and
  names no hosting service, so such a link becomes its text, marked up with the path it
  points to (an ``<abbr>`` whose title is the path), where MyST would otherwise warn (a
  folder, a path written from the repository's root in README.md) or copy the file into
  the site as a download (:class:`RepositoryDownloads`, :class:`RepositoryLinks`). A
  link whose path exists nowhere in the repository is still a warning: a broken link.
  ``README.md`` and ``CHANGELOG.md`` are pages of the site: links to them become links
  to those pages.
- The build fails (a warning) if it loaded ``mpi4py.MPI``: documenting a module must
  not start MPI (:func:`no_mpi`).
"""

from __future__ import annotations

import re
from pathlib import Path

import reference_text
from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

LOGGER = logging.getLogger(__name__)

#: The user guide's pages (Markdown documents of docs/, without ``.md``) in reading
#: order; those missing are left out, the other Markdown documents follow by name.
GUIDE_ORDER = ("USAGE", "STRATEGIES", "ALGORITHMS", "CLUSTER", "GPU", "FLAGS", "DESIGN",
               "RESULTS")
#: Markdown documents that are no guide page: the site's own pages.
NOT_GUIDE = ("index", "changelog")
GUIDE_MARKER = "%% guide-pages"
#: Repository files that are pages of the site, and their page.
INCLUDED_PAGES = {"README.md": "index", "CHANGELOG.md": "changelog"}


class ReferenceDirective(SphinxDirective):
    """``.. syncbench-reference:: PART``: a generated part of the reference."""

    required_arguments = 1
    option_spec = {"class": directives.class_option}

    def run(self) -> list[nodes.Node]:
        part = self.arguments[0]
        if part not in reference_text.PARTS:
            raise self.error(f"unknown part {part!r}: {', '.join(reference_text.PARTS)}")
        # the generated text depends on the code: rebuild the page when its modules change
        self.env.note_dependency(reference_text.__file__)
        text = reference_text.PARTS[part]()
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, StringList(text.splitlines(), part), node)
        return node.children


def repo_root(app: Sphinx) -> Path:
    """The repository's root: the folder above ``docs/``."""
    return Path(app.srcdir).parent


def guide_pages(app: Sphinx) -> list[str]:
    """The guide's pages: every Markdown document Sphinx found (in sub-folders too, and
    not ``exclude_patterns``), in :data:`GUIDE_ORDER`, then the others by name."""
    found = sorted(name for name in app.env.found_docs if name not in NOT_GUIDE
                   and str(app.env.doc2path(name)).endswith(".md"))
    return [n for n in GUIDE_ORDER if n in found] + [n for n in found if n not in GUIDE_ORDER]


def changelog_source(app: Sphinx) -> str:
    """The changelog page: ``CHANGELOG.md`` included, or a line saying there is none."""
    if (repo_root(app) / "CHANGELOG.md").is_file():
        return "```{include} ../CHANGELOG.md\n:relative-docs: docs/\n:relative-images:\n```\n"
    return "# Changelog\n\nThis checkout has no `CHANGELOG.md` yet.\n"


def fill_sources(app: Sphinx, docname: str, source: list[str]) -> None:
    """``source-read``: the guide's page list into ``index``, the changelog's text."""
    if docname == "index" and GUIDE_MARKER in source[0]:
        source[0] = source[0].replace(GUIDE_MARKER, "\n".join(guide_pages(app)))
    elif docname == "changelog":
        source[0] = changelog_source(app)


def note_included(app: Sphinx, env: object, added: set[str], changed: set[str],
                  removed: set[str]) -> list[str]:
    """``env-get-outdated``: the front page (README.md, the guide's list) and the
    changelog are read again on every build: they follow files Sphinx does not track."""
    return ["index", "changelog"]


class RepositoryLinks(SphinxPostTransform):
    """Links from Markdown to repository paths that are not pages of the site.

    MyST turns ``[text](path)`` into a download of the file when ``path`` is a file
    relative to the page, and otherwise into a reference it then fails to resolve
    (``myst.xref_missing``): a folder (``jobs/``), or a path written relative to the
    repository's root in a file the site includes from there (``README.md``). This
    runs first (MyST's resolver has priority 9): a path that exists in the repository,
    relative to the page or to the root (``syncbench/X`` read as the folder ``X``, as
    setup.py installs it), becomes its text with the path as its title; ``README.md``
    and ``CHANGELOG.md`` become links to their pages. Anything else is left to MyST.
    """

    default_priority = 8

    def run(self, **kwargs: object) -> None:
        root = repo_root(self.app)
        for node in list(self.document.findall(addnodes.pending_xref)):
            target = self._outside_target(node)
            if target is None:
                continue
            path = self._repo_path(root, node, target)
            if path is None:
                continue
            page = INCLUDED_PAGES.get(path)
            if page is not None:
                node["refdomain"], node["reftarget"], node["reftargetid"] = "doc", page, None
                continue
            text = node.astext() or path
            node.replace_self(nodes.abbreviation(text, text, explanation=f"repository: {path}"))

    def _outside_target(self, node: addnodes.pending_xref) -> str | None:
        """The path of a MyST link that names no page of the site, else None: a link
        MyST could not place (no domain), or one to a Markdown file outside docs/ (a
        document name that is no document)."""
        if node.get("reftype") != "myst":
            return None
        if node.get("refdomain") is None:
            target = str(node["reftarget"]).split("#", 1)[0]
            return target if target and "://" not in target else None
        if node.get("refdomain") == "doc" and node["reftarget"] not in self.env.all_docs:
            return str(node["reftarget"]) + ".md"  # MyST made it a document name
        return None

    def _repo_path(self, root: Path, node: nodes.Node, target: str) -> str | None:
        """``target`` as a path inside the repository that exists, or None."""
        page_dir = Path(self.env.doc2path(node.get("refdoc", self.env.docname))).parent
        bases = [page_dir, root]
        source = node.get("source") or node.source
        if source:
            bases.insert(0, Path(str(source)).parent)
        # syncbench.X is the folder X (setup.py's package_dir): ../syncbench/bench -> ../bench
        candidates = dict.fromkeys((target, re.sub(r"^((?:\.\./)*)syncbench/", r"\1", target)))
        for base in bases:
            for candidate in candidates:
                path = (base / candidate).resolve()
                if path.exists() and path.is_relative_to(root):
                    return path.relative_to(root).as_posix() or "."
        return None


class RepositoryDownloads(SphinxTransform):
    """MyST makes ``[text](../jobs/gpu_check.py)`` a download when the file exists
    relative to the page, which would copy repository files into the site: a link to a
    file outside ``docs/`` becomes its text titled with its path instead, as
    :class:`RepositoryLinks` makes the links MyST cannot place. Runs while the page is
    read, before Sphinx collects the files to copy; files inside ``docs/`` (a figure)
    stay downloads."""

    default_priority = 870  # before doctree-read (880), where Sphinx collects downloads

    def apply(self, **kwargs: object) -> None:
        src, root = Path(self.env.srcdir).resolve(), repo_root(self.app).resolve()
        for node in list(self.document.findall(addnodes.download_reference)):
            if node.get("reftype") != "myst":
                continue
            _, path = self.env.relfn2path(str(node["reftarget"]), self.env.docname)
            path = Path(path).resolve()
            if path.is_relative_to(src) or not path.is_relative_to(root):
                continue
            rel = path.relative_to(root).as_posix()
            page = INCLUDED_PAGES.get(rel)
            text = node.astext() or rel
            if page is not None:
                node.replace_self(addnodes.pending_xref(
                    "", *node.children, refdomain="doc", reftarget=page, reftargetid=None,
                    refdoc=self.env.docname, reftype="myst", refexplicit=True))
                continue
            node.replace_self(nodes.abbreviation(text, text, explanation=f"repository: {rel}"))


def no_mpi(app: Sphinx, exc: Exception | None) -> None:
    """``build-finished``: the build must not have loaded ``mpi4py.MPI``."""
    import sys

    if exc is None and "mpi4py.MPI" in sys.modules:
        LOGGER.warning("building the site loaded mpi4py.MPI: a documented module "
                       "imports MPI at import time")


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("syncbench-reference", ReferenceDirective)
    app.connect("source-read", fill_sources)
    app.connect("env-get-outdated", note_included)
    app.add_transform(RepositoryDownloads)
    app.add_post_transform(RepositoryLinks)
    app.connect("build-finished", no_mpi)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
