"""The scale benchmark: LIST requests per job, listing time, the first batch from a warm index,
and what DataLoader workers add to memory (PSS) as the key set grows.

Parts (each case runs ``--repeats`` times; the report gives medians):

* ``lists``: moto (in this process, filled through its backend: no PUT per object) behind the
  counting proxy; ``torchrun`` with 1 and 2 ranks, each building ``list_objects`` and reading a
  whole epoch through a DataLoader with 0/2/4 workers. LIST requests are counted at the proxy.
* ``listing``: listing time, several chains (8 threads) vs one serial chain of pages. On moto
  (every LIST page costs the server O(N): it sorts the whole bucket) and on a latency-bound
  store model: a sorted key array answering ``list_page`` after a fixed delay per request
  (``--page-ms``, S3-like), in this process. The model measures the algorithm, not a server.
  With ``--s3rver-listing-sizes``, also on s3rver (npm), filled by writing its files straight
  into its data directory (keys ``data/DDDD/NNNNNNN.jpg``, 1,000 a directory, which its listing
  walks), behind the delay proxy (``--s3rver-delay-ms`` a chunk, S3's latency).
* ``cuts``: LIST requests of a listing with 8 threads against ``ceil(N/1000)``, on the store model
  without its delay, for keys numbered without gaps, numbered with gaps, random (hashed) and
  nested in directories, at 10^4 to 10^6 keys.
* ``moto``: one serial chain against 8 chains with moto's server in a child process of its own
  (as the tests run it; filled through its backend there), and a cProfile of moto's WSGI app
  answering LIST pages in this process: the time a page and where it goes.
* ``memory``: an index of N keys (ObjectInfo: URL, size, etag, mtime) written once to a local
  file; ``list_objects(url, manifest=index)`` read warm; a DataLoader with W workers (fork)
  reads a whole epoch in batches of 64. Measured: seconds from making the pipeline to the
  first batch; the CPU each worker spent to its first item; the PSS of the main process and
  its workers, sampled through the epoch (peak), minus the main process's PSS before the
  DataLoader started. Compared with the same pipeline over 10^3 keys.

    python -m benchmarks.scale --parts memory --repeats 3 --out docs/bench/scale-memory.json
    python -m benchmarks.scale --parts listing --repeats 3 --out docs/bench/scale-listing.json
    python -m benchmarks.scale --parts lists --repeats 3 --out docs/bench/scale-lists.json

(docs/scale.md gives the figures of those three files.)
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import psutil

from pipeflow.backends.base import Backend
from pipeflow.items import ObjectInfo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "pipeflow-scale"


# ---- a moto server in this process, filled through its backend ---------------------------------
#: moto accepts any credentials; these are dummies, not secrets
MOTO_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


@contextlib.contextmanager
def moto_server(keys: dict[str, list[str]]) -> Iterator[str]:
    """moto's threaded server on a free port, with ``keys`` (bucket -> keys) put directly into
    its backend (1-byte bodies). Yields the endpoint."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    from moto.server import ThreadedMotoServer

    from pipeflow.testing import free_port

    os.environ.update(MOTO_CREDENTIALS)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        for bucket, names in keys.items():
            backend.create_bucket(bucket, "us-east-1")
            for name in names:
                backend.put_object(bucket, name, b"x")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        s3_backends[DEFAULT_ACCOUNT_ID]["aws"].reset()


def numbered(n: int, prefix: str = "data/") -> list[str]:
    return [f"{prefix}{i:07d}.jpg" for i in range(n)]


# ---- part 1: LIST requests per job -------------------------------------------------------------
def part_lists(n: int, repeats: int) -> list[dict[str, Any]]:
    from pipeflow.testing.proxy import DelayProxy

    rows = []
    with moto_server({BUCKET: numbered(n)}) as endpoint, DelayProxy(endpoint, delay_ms=0) as proxy:
        for ranks in (1, 2):
            for workers in (0, 2, 4):
                counts = []
                for _ in range(repeats):
                    proxy.reset_counts()
                    _torchrun(ranks, proxy.url, workers, n)
                    counts.append(proxy.stats()["lists"])
                rows.append({"objects": n, "ranks": ranks, "workers": workers, "lists": counts,
                             "floor": -(-n // 1000)})
                print(f"lists: {n} objects, {ranks} ranks x {workers} workers: {counts}", flush=True)
    return rows


def _torchrun(ranks: int, endpoint: str, workers: int, n: int) -> None:
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    from pipeflow.testing import free_port

    cmd = [torchrun, f"--nproc_per_node={ranks}", "--nnodes=1", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", "-m", "benchmarks.scale", "--job", endpoint,
           str(workers), str(n)]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=900, capture_output=True)


def job(endpoint: str, workers: int, n: int) -> None:
    """One torchrun rank: list, read an epoch, check every rank together saw each key once."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import pipeflow as pf

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    pipe = pf.list_objects(f"s3://{BUCKET}/data/", endpoint=endpoint).map(_url).batch(256)
    seen = [u for batch in DataLoader(pipe, batch_size=None, num_workers=workers) for u in batch]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, len(seen))
    if sum(everyone) != n:
        raise SystemExit(f"ranks saw {everyone} keys, expected {n} in all")
    dist.destroy_process_group()


def _url(info: Any) -> str:
    return info.url


# ---- part 2: listing time ----------------------------------------------------------------------
class ModelStore(Backend):
    """A latency-bound store: sorted keys, ``list_page`` after ``page_ms`` (S3 answers a LIST
    page in tens of milliseconds whatever the bucket size; moto takes O(N))."""

    name = "model"
    pages_from_any_key = True

    def __init__(self, keys: list[str], page_ms: float) -> None:
        super().__init__()
        self.keys, self.delay = keys, page_ms / 1000

    def list_page(self, url: str, *, start_after: str | None, limit: int = 1000,
                  ) -> tuple[list[ObjectInfo], bool]:
        time.sleep(self.delay)
        i = 0 if start_after is None else bisect.bisect_right(self.keys, start_after)
        return [ObjectInfo(k, size=1) for k in self.keys[i:i + limit]], i + limit < len(self.keys)

    def list_prefixes(self, url: str) -> list[str]:
        time.sleep(self.delay)
        return []

    def open(self, url: str, *, start: int = 0) -> Any:
        raise NotImplementedError

    def list(self, url: str) -> Iterator[ObjectInfo]:
        after = None
        while True:
            page, more = self.list_page(url, start_after=after)
            yield from page
            if not more:
                return
            after = page[-1].url

    def info(self, url: str) -> ObjectInfo:
        raise NotImplementedError


def _time_listing(backend: Any, url: str, threads: int) -> tuple[float, int, int]:
    from pipeflow.backends.parallel_list import list_parallel

    started = time.perf_counter()
    listing = list_parallel(backend, url, concurrency=threads, pages_per_cut=PAGES_PER_CUT)
    return time.perf_counter() - started, listing.requests, len(listing.objects)


#: the budget of cuts (list_parallel's default; lower to measure what cuts buy on a small listing)
PAGES_PER_CUT = 100


def s3rver_keys(n: int) -> list[str]:
    return [f"data/{i // 1000:04d}/{i:07d}.jpg" for i in range(n)]


def fill_s3rver(data_dir: str, bucket: str, keys: list[str]) -> None:
    """Objects of one byte in s3rver's file layout: ``<key>._S3rver_object``, its metadata and
    its MD5 beside it (what a PUT writes; writing them directly skips N requests)."""
    md5 = "9dd4e461268c8034f5c8564e155c67a6"  # of b"x"
    for key in keys:
        path = os.path.join(data_dir, bucket, *key.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        for suffix, body in (("object", b"x"), ("object.md5", md5.encode()),
                             ("metadata.json", b'{"content-type": "image/jpeg"}')):
            with open(f"{path}._S3rver_{suffix}", "wb") as fh:
                fh.write(body)


def part_s3rver_listing(sizes: list[int], delay_ms: float, repeats: int) -> list[dict[str, Any]]:
    from benchmarks import s3rver
    from pipeflow.backends.registry import get_backend
    from pipeflow.testing.proxy import DelayProxy

    rows = []
    os.environ.update(s3rver.CREDENTIALS)
    for n in sizes:
        with s3rver.running() as endpoint:
            data_dir = _s3rver_data_dir(endpoint)
            started = time.perf_counter()
            fill_s3rver(data_dir, BUCKET, s3rver_keys(n))
            print(f"s3rver: {n} objects written in {time.perf_counter() - started:.0f} s", flush=True)
            with DelayProxy(endpoint, delay_ms=delay_ms) as proxy:
                be = get_backend("boto3", endpoint=proxy.url)
                rows += _listing_rows(f"s3rver, {delay_ms:g} ms delay", be, f"s3://{BUCKET}/data/",
                                      n, repeats)
    return rows


def _s3rver_data_dir(endpoint: str) -> str:
    """The data directory of the s3rver listening on ``endpoint`` (from its command line)."""
    port = endpoint.rsplit(":", 1)[1]
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "-p" in cmd and port in cmd and "-d" in cmd:
            return cmd[cmd.index("-d") + 1]
    raise RuntimeError(f"no s3rver process found for {endpoint}")


def shaped_keys(shape: str, n: int) -> list[str]:
    import random

    rng = random.Random(n)
    if shape == "numbered":
        return numbered(n)
    if shape == "numbered, gaps":  # one number in 11 missing
        return [f"data/{i:07d}.jpg" for i in range(n * 11 // 10 + 11) if i % 11 != 5][:n]
    if shape == "hashed":
        return sorted(f"data/{rng.getrandbits(64):016x}.jpg" for _ in range(n))
    return sorted(f"data/c{i % 1000:03d}/{i:08d}.jpg" for i in range(n))  # nested


def part_cuts(sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    from pipeflow.backends.parallel_list import serial_requests

    rows = []
    for shape in ("numbered", "numbered, gaps", "hashed", "nested"):
        for n in sizes:
            store = ModelStore([f"s3://b/{k}" for k in shaped_keys(shape, n)], 0)
            runs = [_time_listing(store, "s3://b/data/", 8) for _ in range(repeats)]
            assert all(r[2] == n for r in runs), runs
            rows.append({"shape": shape, "objects": n, "requests": [r[1] for r in runs],
                         "serial": serial_requests(n)})
            print(f"cuts: {shape} {n}: {[r[1] for r in runs]} requests, serial {serial_requests(n)}",
                  flush=True)
    return rows


def part_listing(sizes: list[int], moto_sizes: list[int], page_ms: float, repeats: int,
                 shapes: tuple[str, ...] = ("numbered",)) -> list[dict[str, Any]]:
    rows = []
    for shape in shapes:
        for n in sizes:
            store = ModelStore([f"s3://b/{k}" for k in shaped_keys(shape, n)], page_ms)
            for row in _listing_rows(f"model {page_ms:g} ms/page", store, "s3://b/data/", n,
                                     repeats):
                rows.append({"shape": shape, **row})
    for n in moto_sizes:
        from pipeflow.backends.registry import get_backend

        with moto_server({BUCKET: numbered(n)}) as endpoint:
            be = get_backend("boto3", endpoint=endpoint)
            rows += _listing_rows("moto (in process)", be, f"s3://{BUCKET}/data/", n, repeats)
    return rows


def _listing_rows(store: str, backend: Any, url: str, n: int, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for threads in (1, 8):
        runs = [_time_listing(backend, url, threads) for _ in range(repeats)]
        assert all(r[2] == n for r in runs), runs
        rows.append({"store": store, "objects": n, "threads": threads,
                     "seconds": [r[0] for r in runs], "requests": [r[1] for r in runs]})
        print(f"listing: {store} {n} threads={threads}: "
              f"{statistics.median(r[0] for r in runs):.2f} s, {runs[0][1]} requests", flush=True)
    return rows


# ---- moto: where its LIST time goes, and several chains against its own process --------------
@contextlib.contextmanager
def moto_process(n: int) -> Iterator[str]:
    """moto's server in a child process of its own (as the tests run it), holding ``n``
    numbered objects under ``data/`` (put through its backend in that process). Yields the
    endpoint; the child exits when its stdin closes."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.scale", "--moto-serve", str(n)],
                            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # no line a request
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline().split()
        if line[:1] != ["ready"]:
            raise RuntimeError(f"moto did not start: {line}")
        yield line[1]
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def moto_serve(n: int) -> None:
    """The child of :func:`moto_process`."""
    with moto_server({BUCKET: numbered(n)}) as endpoint:
        print(f"ready {endpoint}", flush=True)
        sys.stdin.read()


def part_moto(sizes: list[int], repeats: int, profile_pages: int) -> dict[str, Any]:
    """One serial chain against 8 chains with moto in its own process, and a profile of moto
    answering ``profile_pages`` LIST pages (from spread start keys) in this process."""
    from pipeflow.backends.registry import get_backend

    os.environ.update(MOTO_CREDENTIALS)
    rows = []
    for n in sizes:
        with moto_process(n) as endpoint:
            be = get_backend("boto3", endpoint=endpoint)
            rows += _listing_rows("moto (own process)", be, f"s3://{BUCKET}/data/", n, repeats)
    return {"listing": rows,
            "profile": [profile_moto(n, profile_pages) for n in sizes if profile_pages]}


def profile_moto(n: int, pages: int) -> dict[str, Any]:
    """cProfile of moto's WSGI app answering ListObjectsV2 pages over ``n`` keys, without a
    socket: the time per page and the functions it goes to."""
    import cProfile
    import io
    import pstats

    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from moto.s3.models import s3_backends
    from werkzeug.test import Client

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    backend.create_bucket(BUCKET, "us-east-1")
    keys = numbered(n)
    for name in keys:
        backend.put_object(BUCKET, name, b"x")
    client = Client(DomainDispatcherApplication(create_backend_app))
    auth = ("AWS4-HMAC-SHA256 Credential=testing/20261125/us-east-1/s3/aws4_request, "
            "SignedHeaders=host, Signature=0")
    starts = [keys[i * n // pages] for i in range(pages)]
    _moto_page(client, keys[-2000], auth)  # imports and caches: not a page's cost
    times = []
    for after in starts:  # without the profiler first
        started = time.perf_counter()
        _moto_page(client, after, auth)
        times.append(time.perf_counter() - started)
    prof = cProfile.Profile()
    started = time.perf_counter()
    for after in starts:
        prof.enable()
        _moto_page(client, after, auth)
        prof.disable()
    profiled = (time.perf_counter() - started) / pages
    per_page = statistics.median(times)
    s3_backends[DEFAULT_ACCOUNT_ID]["aws"].reset()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(12)
    table = stats.stats  # type: ignore[attr-defined]
    total = sum(row[2] for row in table.values())
    parts = {name: max((row[3] for (path, _, func), row in table.items()
                        if path.endswith(where) and func == func_name), default=0.0) / pages
             for name, (where, func_name) in _MOTO_PARTS.items()}
    print(f"moto profile: {n} keys, {per_page * 1000:.0f} ms a page: "
          + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in parts.items()), flush=True)
    return {"objects": n, "pages": pages, "seconds_a_page": per_page, "seconds_each": times,
            "profiled_seconds_a_page": profiled, "profiler_seconds_a_page": total / pages,
            "seconds_a_page_in": parts,
            "top_by_own_time": out.getvalue().splitlines()}


#: moto functions whose time (with what they call) a page is reported
_MOTO_PARTS = {
    "whole request (s3 responses.list_objects_v2)": ("s3/responses.py", "list_objects_v2"),
    "select and sort keys (models.list_objects_v2)": ("s3/models.py", "list_objects_v2"),
    "of which scan + sort (models.list_objects)": ("s3/models.py", "list_objects"),
    "of which token scan (_get_results_from_token)": ("s3/models.py", "_get_results_from_token"),
    "serialise the response (core serialize)": ("moto/core/serialize.py", "serialize"),
}


def _moto_page(client: Any, after: str, auth: str) -> None:
    resp = client.get(f"/{BUCKET}?list-type=2&prefix=data/&start-after={after}",
                      headers={"Host": "127.0.0.1:5000", "Authorization": auth})
    assert resp.status_code == 200 and resp.data.count(b"<Key>") >= 1000, resp.status_code


# ---- part 3: memory and the first batch --------------------------------------------------------
def write_model_index(path: str, n: int) -> None:
    """An index of ``n`` ObjectInfo under ``s3://b/data/``, written from a generator."""
    from pipeflow.keytable import write_index

    gen = (ObjectInfo(f"s3://b/data/{i:08d}.jpg", size=100_000 + i % 997, etag=f"{i:032x}",
                      mtime=1.7e9 + i) for i in range(n))
    with open(path, "wb") as fh:
        write_index(fh, gen, url="s3://b/data/", pattern=None, base="s3://b/data/")


def _pss(procs: list[psutil.Process]) -> float:
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_full_info().pss
    return total / 2**20


def first_item_cpu(info: Any) -> tuple[str, float | None]:
    """The item's URL, and this worker's CPU seconds at its first item (None after)."""
    if not getattr(first_item_cpu, "done", False):
        first_item_cpu.done = True  # type: ignore[attr-defined]
        return info.url, time.process_time()
    return info.url, None


def memory_case(index: str, workers: int, copies: int = 1) -> dict[str, Any]:
    """One run in a fresh interpreter (so nothing from an earlier case is in its memory)."""
    code = ("import json, sys; from benchmarks.scale import _memory_run; "
            f"print(json.dumps(_memory_run({index!r}, {workers}, {copies})))")
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True, timeout=1800).stdout
    return json.loads(out.strip().splitlines()[-1])


class _Copies:
    """Each key ``n`` times: a small key set read for as long as a large one (picklable)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, info: Any) -> list[Any]:
        return [info] * self.n


def _memory_run(index: str, workers: int, copies: int = 1) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    import pipeflow as pf

    me = psutil.Process()
    base = _pss([me])
    started = time.perf_counter()
    pipe = pf.list_objects("s3://b/data/", manifest=index)
    if copies > 1:
        pipe = pipe.map(_Copies(copies)).unbatch()
    pipe = pipe.map(first_item_cpu).batch(64)
    loader = DataLoader(pipe, batch_size=None, num_workers=workers,
                        multiprocessing_context="fork" if workers else None)
    count, first_batch, cpus = 0, None, []
    samples: list[float] = []
    last_sample = 0.0
    for batch in loader:
        now = time.perf_counter()
        if first_batch is None:
            first_batch = now - started
        if now - last_sample >= 0.25:  # while the workers are alive: the main process and them
            samples.append(_pss([me, *me.children(recursive=True)]))
            last_sample = time.perf_counter()
        count += len(batch)
        cpus += [c for _, c in batch if c is not None]
    peak = max(samples)
    return {"workers": workers, "items": count, "first_batch_s": first_batch, "base_pss_mb": base,
            "peak_pss_mb": peak, "added_mb": peak - base,
            "worker_cpu_to_first_item_s": sorted(cpus)}


def part_memory(sizes: list[int], workers: list[int], repeats: int, tmp: str,
                long_baseline: bool = False) -> list[dict[str, Any]]:
    """PSS against keys and workers. ``long_baseline``: the 10^3-key pipeline reads each key
    ``max(sizes) / 10^3`` times, as many items as the largest run: what the DataLoader's main
    process grows by over a long run (its queues' threads and allocator) is then in both."""
    rows = []
    for n in [1000, *sizes]:
        index = os.path.join(tmp, f"index-{n}.pfi")
        write_model_index(index, n)
        copies = max(sizes) // n if long_baseline and n == 1000 else 1
        for w in workers:
            runs = [memory_case(index, w, copies) for _ in range(repeats)]
            assert all(r["items"] == n * copies for r in runs), runs
            rows.append({"keys": n, "workers": w, "runs": runs, "items": n * copies,
                         "index_mb": os.path.getsize(index) / 2**20})
            print(f"memory: {n} keys x {copies}, {w} workers: added "
                  f"{statistics.median(r['added_mb'] for r in runs):.0f} MB, first batch "
                  f"{statistics.median(r['first_batch_s'] for r in runs):.2f} s", flush=True)
        os.unlink(index)
    return rows


def machine() -> dict[str, Any]:
    return {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                       f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
            "python": platform.python_version(), "load_1min_at_start": os.getloadavg()[0]}


def main() -> int:
    global PAGES_PER_CUT
    if len(sys.argv) > 1 and sys.argv[1] == "--job":
        job(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--moto-serve":
        moto_serve(int(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", nargs="+", default=["lists", "listing", "memory"],
                    choices=["lists", "listing", "cuts", "memory", "moto"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--list-objects", type=int, default=20_000, help="objects for the LIST count")
    ap.add_argument("--listing-sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--moto-listing-sizes", type=int, nargs="*", default=[20_000])
    ap.add_argument("--page-ms", type=float, default=30.0)
    ap.add_argument("--listing-shapes", nargs="+", default=["numbered"],
                    choices=["numbered", "numbered, gaps", "hashed", "nested"])
    ap.add_argument("--moto-process-sizes", type=int, nargs="*", default=[100_000],
                    help="objects in moto's own process (part moto)")
    ap.add_argument("--profile-pages", type=int, default=5)
    ap.add_argument("--s3rver-listing-sizes", type=int, nargs="*", default=[])
    ap.add_argument("--s3rver-delay-ms", type=float, default=20.0)
    ap.add_argument("--pages-per-cut", type=int, default=PAGES_PER_CUT)
    ap.add_argument("--memory-sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2, 4, 8])
    ap.add_argument("--long-baseline", action="store_true",
                    help="the 10^3-key pipeline reads as many items as the largest size")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    result: dict[str, Any] = {"machine": machine(), "repeats": args.repeats,
                              "pages_per_cut": args.pages_per_cut}
    PAGES_PER_CUT = args.pages_per_cut
    with tempfile.TemporaryDirectory(prefix="pipeflow-scale-") as tmp:
        if "lists" in args.parts:
            result["lists"] = part_lists(args.list_objects, args.repeats)
        if "listing" in args.parts:
            result["listing"] = part_listing(args.listing_sizes, args.moto_listing_sizes,
                                             args.page_ms, args.repeats, tuple(args.listing_shapes))
            result["listing"] += part_s3rver_listing(args.s3rver_listing_sizes,
                                                     args.s3rver_delay_ms, args.repeats)
        if "cuts" in args.parts:
            result["cuts"] = part_cuts([10_000, 20_000, 100_000, 250_000, 1_000_000], args.repeats)
        if "moto" in args.parts:
            result["moto"] = part_moto(args.moto_process_sizes, args.repeats, args.profile_pages)
        if "memory" in args.parts:
            result["memory"] = part_memory(args.memory_sizes, args.workers, args.repeats, tmp,
                                           args.long_baseline)
    result["machine"]["load_1min_at_end"] = os.getloadavg()[0]
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
