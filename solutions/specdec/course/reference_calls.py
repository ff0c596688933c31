"""Answers that call the reference: an answer cell whose function hands its work to the ``specdec`` function
of the same name (or imports it over its own) scores the reference's marks, not the learner's. Self-grading
prints a note; cohort grading flags the submission for the instructor.

Read with ``ast`` from the notebook, never run: every import of ``specdec`` in any cell is followed, so
``from specdec.greedy import greedy_verify as ref`` then ``return ref(...)`` is found, as is
``specdec.greedy.greedy_verify(...)``.
"""

from __future__ import annotations

import ast
import threading

import nbformat

from specdec.course.equivalents import EQUIVALENTS

_PARSE_LOCK = threading.Lock()
_ast_parse = ast.parse  # the original, kept when the test suite routes every ast.parse through parse() below


def parse(source: str | bytes, filename: str = "<unknown>", mode: str = "exec", **options) -> ast.AST:
    """``ast.parse``, safe in cohort grading's worker threads. CPython 3.11 keeps the AST constructor's recursion
    depth in per-interpreter state, and two threads parsing at once can fail with a spurious "SystemError: AST
    constructor recursion depth mismatch" (python/cpython#106905; seen in this project's test suite, beside pytest
    parsing in the main thread). Every parse of the package goes through one lock (the test suite routes
    ``ast.parse`` here too), and that error is retried once."""
    with _PARSE_LOCK:
        try:
            return _ast_parse(source, filename, mode, **options)
        except SystemError:  # left by a parse outside the lock (another library's): once more
            return _ast_parse(source, filename, mode, **options)


def parse_cell(source: str) -> ast.Module | None:
    """:func:`parse` of a cell, or None for one that is not Python (IPython magics, unfinished code)."""
    try:
        return parse(source)
    except SyntaxError:
        return None


def _specdec_names(notebook: nbformat.NotebookNode) -> tuple[dict[str, str], set[str]]:
    """(alias -> the specdec object's name, aliases bound to specdec modules) over every code cell."""
    objects, modules = {}, set()
    for cell in notebook.cells:
        tree = parse_cell(cell.source) if cell.cell_type == "code" else None
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "specdec":
                        modules.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "specdec":
                for alias in node.names:
                    # a submodule (from specdec import greedy) or an object (from specdec.greedy import f)
                    objects[alias.asname or alias.name] = alias.name
                    modules.add(alias.asname or alias.name)
    return objects, modules


def _calls_specdec(function: ast.FunctionDef, objects: dict[str, str], modules: set[str], names: set[str]) -> str:
    """The first of ``names`` that ``function`` calls as a ``specdec`` object, or ''."""
    for node in ast.walk(function):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and objects.get(func.id) in names:
            return objects[func.id]
        if isinstance(func, ast.Attribute) and func.attr in names:
            root = func.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in modules:
                return func.attr
    return ""


def _calls_reference(function: ast.FunctionDef, objects: dict[str, str], modules: set[str]) -> bool:
    return bool(_calls_specdec(function, objects, modules, {function.name}))


def _defined(source: str) -> set[str]:
    tree = parse_cell(source)
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} if tree else set()


def reference_calls(submission: nbformat.NotebookNode, source: nbformat.NotebookNode) -> list[str]:
    """One line per answer cell that calls or imports the reference of what it is meant to implement."""
    to_write = {c.metadata["nbgrader"]["grade_id"]: _defined(c.source) for c in source.cells
                if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")}
    objects, modules = _specdec_names(submission)
    found = []
    for cell in submission.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        names = to_write.get(grade_id, set())
        tree = parse_cell(cell.source) if names else None
        if tree is None:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in names and _calls_reference(node, objects, modules):
                found.append(f"{grade_id}: {node.name} calls specdec's {node.name}, the reference it is meant to "
                             "implement")
            elif isinstance(node, ast.FunctionDef) and node.name in names:
                helpers = {h.split(":")[1]: h for h in EQUIVALENTS.get(node.name, ())}
                helper = _calls_specdec(node, objects, modules, set(helpers))
                if helper:
                    found.append(f"{grade_id}: {node.name} calls {helpers[helper].replace(':', '.')}, a helper of the "
                                 f"package that computes what {node.name} asks for")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specdec"):
                for alias in node.names:
                    if (alias.asname or alias.name) in names:
                        found.append(f"{grade_id}: imports {alias.name} from {node.module} instead of writing it")
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in node.targets):
                value = node.value
                while isinstance(value, ast.Attribute):
                    value = value.value
                if isinstance(value, ast.Name) and (value.id in modules or value.id in objects):
                    found.append(f"{grade_id}: binds its function to specdec's instead of writing it")
    return found
