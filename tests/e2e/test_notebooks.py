"""The notebooks run top to bottom, headless, against a server this test starts."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.e2e.server import REPO, ServerProcess

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def notebook_server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("nb") / "data").start()
    yield srv
    srv.stop()


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, notebook_server, monkeypatch, tmp_path):
    monkeypatch.setenv("TOPICLAKE_URL", notebook_server.url)
    monkeypatch.setenv("TOPICLAKE_ROOT", str(notebook_server.root))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "each notebook shows a plot"
