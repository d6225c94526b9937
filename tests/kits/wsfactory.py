"""Build small workspaces in a temporary directory for tests."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BUILD_TOML = """\
[workspace]
graphs = ["graphs/*.toml"]
"""

SIMPLE_GRAPH = """\
[layers.efa]
base = "example.com/pytorch:26.08-py3"
dockerfile = '''
ARG EFA_INSTALLER_VERSION=1.50.0
RUN echo installing efa ${EFA_INSTALLER_VERSION}
'''
args = { EFA_INSTALLER_VERSION = "1.50.0" }
artifact = true

[layers.deepep]
parent = "efa"
dockerfile = '''
ARG HYBRID_EP_COMMIT
RUN echo deepep ${HYBRID_EP_COMMIT}
'''
args = { HYBRID_EP_COMMIT = "94a9f8f6b146c07d97ec58f67cd6d303296d6098" }

[layers.user]
parent = "deepep"
dockerfile = '''
COPY app/ /workspace/app/
'''
context = ["app"]
artifact = true
"""

# an artifact layer on a base pinned by digest, for graphs that `make --check` rebuilds on the
# engine: format with base, digest and run (a run-unique ARG keeps BuildKit's cache cold)
TOOLS_LAYER = """
[layers.tools]
base = "{base}"
digest = "{digest}"
dockerfile = '''
ARG TEST_RUN
RUN mkdir -p /opt/tools && echo "$TEST_RUN" > /opt/tools/run
'''
args = {{ TEST_RUN = "{run}" }}
artifact = true
"""


def make_workspace(root: Path, graphs: dict[str, str] | None = None, build: str = BUILD_TOML,
                   files: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "BUILD.toml").write_text(textwrap.dedent(build))
    (root / "graphs").mkdir(exist_ok=True)
    for name, text in (graphs if graphs is not None else {"stack": SIMPLE_GRAPH}).items():
        (root / "graphs" / f"{name}.toml").write_text(text)
    default_files = {"app/train.py": "print('train')\n", "app/lib/util.py": "X = 1\n"}
    for rel, content in (files if files is not None else default_files).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


def demo_on_base(root: Path, ref: str, digest: str, run_id: str, build_toml: str) -> Path:
    """The shipped demo graph (and its app/) on the base `ref` pinned to `digest`, with a run-unique
    ARG the first RUN sees, so no builder's cache holds any of its steps."""
    from fixtures.builder import MINI_NGC_TAG

    root.mkdir()
    shutil.copytree(REPO / "app", root / "app")
    (root / "graphs").mkdir()
    text = (REPO / "graphs" / "demo.toml").read_text()
    text = text.replace(f'base = "{MINI_NGC_TAG}"', f'base = "{ref}"\ndigest = "{digest}"')
    text = text.replace("ARG EFA_INSTALLER_VERSION=1.50.0\n", "ARG EFA_INSTALLER_VERSION=1.50.0\nARG TEST_RUN\n")
    text = text.replace('args = { EFA_INSTALLER_VERSION = "1.50.0" }',
                        f'args = {{ EFA_INSTALLER_VERSION = "1.50.0", TEST_RUN = "{run_id}" }}')
    assert run_id in text and digest in text
    (root / "graphs" / "demo.toml").write_text(text)
    (root / "BUILD.toml").write_text(build_toml)
    return root
