"""Every notebook in notebooks/ runs headless without error and is stored without outputs.

The notebooks run in a fresh ``python3`` kernel (ipykernel, from the dev extra) with a
temporary working directory, so nothing they write lands in the repository.
"""

import os
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
CELL_TIMEOUT = 60  # seconds per cell
NOTEBOOK_BUDGET = 60  # seconds per notebook, kernel start included (2 cores)
# notebooks that must draw something: the branch graph, the token-usage plots
MIN_IMAGES = {
    "01_quickstart.ipynb": 1,
    "02_memory_patterns.ipynb": 1,
    "03_multi_agent_coordination.ipynb": 1,
    "04_retention_policies.ipynb": 3,
}


def test_the_four_notebooks_exist():
    names = [p.name for p in NOTEBOOKS]
    assert names[:4] == [
        "01_quickstart.ipynb",
        "02_memory_patterns.ipynb",
        "03_multi_agent_coordination.ipynb",
        "04_retention_policies.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"cell {i} has outputs: clear them before committing"
            assert cell.execution_count is None, f"cell {i} has an execution count"
        assert not cell.get("attachments"), f"cell {i} has attachments"


def kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MPLBACKEND", None)  # the kernel picks its inline backend itself
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # no debugger notice on stderr
    return env


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
        allow_errors=False,
    )
    start = time.perf_counter()
    try:
        client.execute(env=kernel_env())
    except CellExecutionError as exc:  # the message holds the cell and the traceback
        pytest.fail(f"{path.name} failed:\n{exc}", pytrace=False)
    elapsed = time.perf_counter() - start

    outputs = [o for cell in nb.cells for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= MIN_IMAGES.get(path.name, 0), "a plot is missing"
    assert list(tmp_path.iterdir()) == [], "the notebook left files in its working directory"
    assert elapsed < NOTEBOOK_BUDGET, f"{path.name} took {elapsed:.0f} s"
