"""The type stubs (python/adjoint.pyi) and docstrings cover the API."""

import ast

import adjoint
from conftest import REPO


def stub_names():
    tree = ast.parse((REPO / "python/adjoint.pyi").read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def test_the_stub_declares_everything_the_module_exports():
    assert set(adjoint.__all__) <= stub_names()


def test_public_objects_have_docstrings():
    for name in adjoint.__all__:
        if name.startswith("__"):
            continue
        doc = getattr(adjoint, name).__doc__
        assert doc and len(doc) > 20, name
    assert "grad" in adjoint.__doc__
