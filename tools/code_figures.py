"""Figures of the source tree: module docstring lengths, lazy imports, strategy-name literals.

Usage: python tools/code_figures.py [TREE]   (TREE: a checkout, default this one)

Reads the four package folders (kernels, algorithms, bench, analysis) with ``ast``:
lines, docstring lines, imports inside function bodies, string constants that name a
shipped strategy outside ``algorithms/``, and the longest module docstrings.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

FOLDERS = ("kernels", "algorithms", "bench", "analysis")
STRATEGIES = ("ssgd", "asgd", "odsgd", "oscars", "localsgd")


def figures(root: Path) -> None:
    docs, lazy, literals, lines, doc_lines = [], 0, 0, 0, 0
    for path in sorted(root.glob("**/*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] not in FOLDERS:
            continue
        source = path.read_text()
        tree = ast.parse(source)
        lines += source.count("\n")
        module_doc = ast.get_docstring(tree, clean=False)
        if module_doc:
            docs.append((module_doc.count("\n") + 1, str(rel)))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lazy += sum(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(node))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
                doc = ast.get_docstring(node, clean=False)
                doc_lines += doc.count("\n") + 1 if doc else 0
            if (rel.parts[0] != "algorithms" and isinstance(node, ast.Constant)
                    and node.value in STRATEGIES):
                literals += 1
    docs.sort(reverse=True)
    print(f"lines {lines}; docstring lines {doc_lines} ({100 * doc_lines / lines:.0f}%); "
          f"imports inside functions {lazy}; strategy-name literals outside algorithms/ "
          f"{literals}")
    print("largest module docstrings:", ", ".join(f"{n} {p}" for n, p in docs[:6]))
    print("module docstrings over 30 lines:", sum(n > 30 for n, _ in docs), "of", len(docs))


if __name__ == "__main__":
    figures(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]))
