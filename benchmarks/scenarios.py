"""The five scenarios of the benchmark: data, cases, ceilings, one run.

Everything is measured in one run, on the same data, against the same server, with a delay
proxy (:mod:`pipeflow.testing.proxy`) in front of it that adds ``latency_ms`` before every
response and counts requests. Each case runs in its own process (:mod:`benchmarks.harness`).

1. Small objects, random access: one object per field (PNG pairs, ~115 KB JPEGs) at T=0 and
   T=latency; pipeflow with many requests in flight vs each peer at several worker counts;
   the server's raw GET ceiling and the latency bound (requests in flight / T).
2. Tar shards, sequential, several shard sizes, with and without decode; the raw streaming GET
   ceiling.
3. Several epochs with and without ``cache()``: GETs per epoch and epoch-2 throughput vs the
   same pipeline on local disk.
4. Decode-bound, data in memory: pipeflow ``map`` on threads and on processes vs a bare pool
   with the same worker count.
5. Per-stage overhead vs torchdata.nodes (:mod:`benchmarks.overhead`).
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import platform
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks.harness import Case, run_case

BUCKET = "pipeflow-bench"
PNG_FIELDS = ["image", "label"]
JPEG_FIELDS = ["cls", "jpg"]
#: S2 runs every loader with this many DataLoader workers, each reading one shard at a time
S2_WORKERS = 2
S2_SHARDS_IN_FLIGHT = 1
#: the pipeflow recipe that reproduces each S2 peer, as the article wrote it
S2_RECIPES = {
    "s3connector-shards": "S3IterableDataset",
    "wds-boto3": "webdataset + boto3 url_opener",
    "wds-pipe-cli": "webdataset pipe:s5cmd",
    "wds-s3fs": "webdataset + s3fs url_opener",
    "torchdata-fsspec": "DataPipes FSSpecFileOpener",
}
#: the bare loops of the S2 decode groups: the peers' decode (PIL, full size, resize), and
#: pipeflow's own decode call (the reference of pipeflow's CPU per sample)
BARE_PIL = "bare decode loop, PIL (in memory)"
BARE_OWN_DECODER = "bare decode loop, pipeflow's decoder (in memory)"
#: pipeflow's rows with a backend named: the same case code as the "pipeflow" row beside them, with
#: another backend (the smoke test leaves them out; each backend has its own conformance and fault
#: suites)
NAMED_BACKEND_ROWS = ("pipeflow (boto3 backend)", "pipeflow (s3torchconnector backend)")
#: the pipeline iterated in the training process by ``Pipeline.loader()``, no DataLoader workers
THREAD_NATIVE = "pipeflow loader()"
#: S4's decode inline in DataLoader worker processes (the counterpart of THREAD_NATIVE there)
S4_DATALOADER = "pipeflow in DataLoader workers"
#: the same decode call in a plain DataLoader: what collate and the DataLoader's IPC add
BARE_DATALOADER = "bare DataLoader, pipeflow's decoder (in memory)"
#: SPDL's engine (its own side venv) in S1, S2, S4 and S5; in the S2 decode groups twice, with
#: its FFmpeg batch decoder and with pipeflow's decoder, so engine and decoder can be told apart
SPDL = "SPDL pipeline"
SPDL_FFMPEG = "SPDL pipeline + spdl.io decode (FFmpeg)"
SPDL_OWN_DECODER = "SPDL pipeline + pipeflow's decoder"
SPDL_LIBRARIES = (SPDL, SPDL_FFMPEG, SPDL_OWN_DECODER)
SPDL_SCENARIOS = ("s1", "s2", "s4", "s5")
FFMPEG_HINT = ("Debian: apt-get install libavutil57 libavcodec59 libavformat59 libavfilter8 libswscale6 "
               "libswresample4 libavdevice59")
#: S5 against SPDL runs this fraction of the items of S5 (SPDL hands every item between threads)
SPDL_S5_FRACTION = 5
#: obstore (LitData's S3 client) refuses a plain-HTTP endpoint unless told (where it reads env)
SIDE_ENV = {"AWS_ALLOW_HTTP": "true"}
#: the same for S1, by layout
S1_RECIPES = {
    "single": {"single-boto3": "boto3 map-style", "single-s5cmd": "s5cmd sampler"},
    "jpeg": {"s3connector-map": "S3MapDataset", "fsspec-random": "fsspec random access"},
}


@dataclass
class Sizes:
    """How much data and which variations a run covers."""

    s1_count: int
    s1_png_size: int
    s1_layouts: tuple[str, ...]
    s1_latencies_both: bool  # also run T=0
    s1_peer_workers: tuple[int, ...]  # worker counts tried for the main peers
    s2_shard_mb: tuple[float, ...]
    s2_total_mb: float
    s2_decode_at: float  # the shard size of the decode groups
    s2_jpeg_size: int
    s2_decode_kinds: tuple[str, ...]  # photo-sized and ImageNet-sized JPEGs (benchmarks.photos)
    s2_decode_count: int
    s2_wds_mb: float  # shard size of the article 001 layout group (0: none)
    s3_count: int
    s3_epochs: int
    s4_count: int
    s4_png_count: int
    s4_png_size: int
    s5_items: int
    s5_repeats: int
    max_seconds: float
    #: every S1/S2/S4 case runs at least this many samples and this long (passes repeat)
    min_samples: int = 0
    min_seconds: float = 0.0
    s4_min_seconds: float = 0.0
    lean: bool = False  # the smoke test: no case twice where once shows it works
    #: seconds of the S1 raw GET ceiling (a rate: the smoke test needs only that it is measured)
    ceiling_seconds: float = 4.0
    #: cases run at once, each through a proxy of its own (:class:`_Lanes`). Above 1 only for the
    #: smoke test: cases side by side share the cores, so their figures are not comparable
    side_by_side: int = 1

    def __post_init__(self) -> None:
        if self.side_by_side < 1:
            raise ValueError(f"side_by_side must be >= 1, got {self.side_by_side}")


FULL = Sizes(
    s1_count=800,
    s1_png_size=128,
    s1_layouts=("single", "jpeg"),
    s1_latencies_both=True,
    s1_peer_workers=(2, 8, 16),
    s2_shard_mb=(4, 16, 64, 256),
    s2_total_mb=512,
    s2_decode_at=64,
    s2_jpeg_size=360,
    s2_decode_kinds=("photo", "imagenet"),
    s2_decode_count=1600,
    s2_wds_mb=16,
    s3_count=400,
    s3_epochs=3,
    s4_count=400,
    s4_png_count=40,
    s4_png_size=1024,
    s5_items=100_000,
    s5_repeats=5,
    max_seconds=40,
    min_samples=2000,
    min_seconds=5.0,
    s4_min_seconds=30.0,
)
QUICK = Sizes(
    s1_count=300,
    s1_png_size=128,
    s1_layouts=("single",),
    s1_latencies_both=False,
    s1_peer_workers=(2, 8),
    s2_shard_mb=(4, 16),
    s2_total_mb=32,
    s2_decode_at=16,
    s2_jpeg_size=360,
    s2_decode_kinds=("photo", "imagenet"),
    s2_decode_count=400,
    s2_wds_mb=16,
    s3_count=150,
    s3_epochs=2,
    s4_count=120,
    s4_png_count=12,
    s4_png_size=1024,
    s5_items=20_000,
    s5_repeats=3,
    max_seconds=8,
    min_samples=2000,
    min_seconds=5.0,
)
#: for the smoke test: every peer once, seconds per case
TINY = Sizes(
    s1_count=16,
    s1_png_size=32,
    s1_layouts=("single",),
    s1_latencies_both=False,
    s1_peer_workers=(2,),
    s2_shard_mb=(0.05,),
    s2_total_mb=0.1,
    s2_decode_at=0.05,
    s2_jpeg_size=32,
    s2_decode_kinds=("imagenet",),
    s2_decode_count=6,
    s2_wds_mb=0.05,
    lean=True,
    ceiling_seconds=0.5,
    s3_count=8,
    s3_epochs=2,
    s4_count=8,
    s4_png_count=0,
    s4_png_size=64,
    s5_items=2000,
    s5_repeats=1,
    max_seconds=3,
    side_by_side=2,
)


@dataclass
class BenchConfig:
    """Options of one run (the ``pipeflow bench`` flags)."""

    out: Path
    sizes: Sizes = field(default_factory=lambda: QUICK)
    mode: str = "quick"
    latency_ms: float = 20.0
    server: str = "moto"
    workdir: Path | None = None
    datapipes: bool = True
    streaming_peers: bool = True  # LitData and Mosaic Streaming (their own side venv)
    spdl: bool = True  # SPDL (its own side venv)
    scenarios: tuple[str, ...] = ("s1", "s2", "s3", "s4", "s5")
    only: tuple[str, ...] = ()  # run only the cases of these libraries (labels as in the tables)
    repeats: int = 1  # run each case this many times in a row (rows carry "repeat")


# ---- server, proxies, data ----------------------------------------------------------------------
def _listener_pid(endpoint: str) -> int | None:
    """The process listening on a loopback endpoint's port (the server), if it can be seen."""
    import psutil

    port = urlsplit(endpoint).port
    if port is None:
        return None
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for conn in conns:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return int(conn.pid)
    return None


@contextlib.contextmanager
def _server(spec: str, log: Callable[[str], None] = print) -> Iterator[str]:
    if spec == "moto":
        from pipeflow.testing import local_s3

        with local_s3() as s3:
            yield s3.endpoint
        return
    if spec == "s3rver":
        from benchmarks import s3rver

        with s3rver.running(log=log) as url, _environ(url, s3rver.CREDENTIALS):
            yield url
        return
    if not spec.startswith("http://"):
        raise ValueError(f"--server must be 'moto', 's3rver' or an http:// endpoint URL, got {spec!r}")
    with _environ(spec, {}):
        yield spec


@contextlib.contextmanager
def _environ(endpoint: str, extra: dict[str, str]) -> Iterator[None]:
    """Point every client of this run (children inherit the environment) at ``endpoint``."""
    values = {"AWS_ENDPOINT_URL": endpoint, "S3_ENDPOINT_URL": endpoint, **extra}
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


SERVER_NOTES = {
    "moto": "moto copies the whole object on every GET, ranged GETs included (a client that splits "
    "a 256 MB shard into 8 MB ranges makes it copy 256 MB per part), so range-splitting clients "
    "look worse here than on S3; compare with --server s3rver",
    "s3rver": "s3rver (npm) serves a ranged GET by streaming that range of the file only",
}


def server_name(spec: str) -> str:
    return {"moto": "moto (python -m moto.server)", "s3rver": "s3rver 3 (npm, Node.js)"}.get(spec, spec)


def _client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    # a fresh session: boto3's default one keeps the first credentials it resolved, which in a
    # process that talked to another server (moto's "testing" keys) are the wrong ones here
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=64),
    )


def _make_bucket(endpoint: str) -> None:
    client = _client(endpoint)
    with contextlib.suppress(
        client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists
    ):
        client.create_bucket(Bucket=BUCKET)


def _generate(layout: str, url: str, **kwargs: Any) -> Any:
    from pipeflow.testing.datagen import generate

    return generate(layout, url, **kwargs)


# ---- ceilings -----------------------------------------------------------------------------------
def raw_get_ceiling(
    endpoint: str, keys: list[str], *, threads: int = 32, seconds: float = 4.0
) -> dict[str, float]:
    """GETs/s of a light client (presigned URLs, keep-alive ``http.client``, ``threads`` in flight)."""
    client = _client(endpoint)
    urls = [
        client.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": k}, ExpiresIn=3600)
        for k in keys
    ]
    host = urlsplit(endpoint)
    counts = [0] * threads
    nbytes = [0] * threads
    deadline = time.perf_counter() + seconds

    def worker(i: int) -> None:
        conn = http.client.HTTPConnection(host.hostname or "127.0.0.1", host.port, timeout=30)
        j = i
        while time.perf_counter() < deadline:
            u = urlsplit(urls[j % len(urls)])
            conn.request("GET", f"{u.path}?{u.query}")
            resp = conn.getresponse()
            nbytes[i] += len(resp.read())
            if resp.status != 200:
                raise RuntimeError(f"GET {u.path}: HTTP {resp.status}")
            counts[i] += 1
            j += threads
        conn.close()

    t0 = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - t0
    return {
        "gets_per_s": round(sum(counts) / elapsed, 1),
        "mb_per_s": round(sum(nbytes) / elapsed / 1e6, 2),
        "threads": threads,
    }


def raw_stream_ceiling(endpoint: str, keys: list[str], *, streams: int = 1,
                       repeats: int = 2) -> dict[str, float]:
    """MB/s of ``streams`` concurrent plain streaming GETs (of different objects when there are
    enough) read to nowhere; best of ``repeats``."""
    client = _client(endpoint)
    urls = [
        urlsplit(client.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": k},
                                               ExpiresIn=3600))
        for k in keys
    ]
    best = 0.0

    def one(url: Any, total: list[int]) -> None:
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        conn.request("GET", f"{url.path}?{url.query}")
        resp = conn.getresponse()
        while chunk := resp.read(1 << 20):
            total.append(len(chunk))
        conn.close()

    for _ in range(repeats):
        total: list[int] = []
        t0 = time.perf_counter()
        pool = [threading.Thread(target=one, args=(urls[i % len(urls)], total)) for i in range(streams)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        best = max(best, sum(total) / (time.perf_counter() - t0) / 1e6)
    return {"mb_per_s": round(best, 1), "streams": streams}


def _s1_case(group: str, budget: dict[str, Any], library: str, factory: str, kwargs: dict[str, Any],
             workers: int, **options: Any) -> Case:
    return Case("s1", group, library, factory, kwargs, workers, **{**budget, **options})


# ---- the run ------------------------------------------------------------------------------------
class _Lanes:
    """Cases side by side (the smoke test: dozens of cases, each mostly the start of a fresh
    interpreter): ``n`` at once, each still in its own process, each through a delay proxy of its
    own with the same delay, so every row's request counts are its own case's and nothing else
    (the ceilings keep the run's proxies to themselves). Rows come back in the order the cases
    were asked for."""

    def __init__(self, stack: contextlib.ExitStack, endpoint: str, proxies: dict[float, Any], n: int) -> None:
        from pipeflow.testing.proxy import ProxyProcess

        self._own = {id(p): [stack.enter_context(ProxyProcess(endpoint, delay_ms=t)) for _ in range(n)]
                     for t, p in proxies.items()}
        self._free: queue.Queue[int] = queue.Queue()
        for lane in range(n):
            self._free.put(lane)
        self._pool = ThreadPoolExecutor(n, thread_name_prefix="bench-lane")
        # closed before the proxies (an exit stack unwinds in reverse): no case outlives its proxy
        stack.callback(self._pool.shutdown, wait=True, cancel_futures=True)
        self._pending: list[Future[list[dict[str, Any]]]] = []

    def submit(self, measure: Callable[[Any, Case, Callable[[dict[str, Any]], None]], None],
               proxy: Any, case: Case) -> None:
        self._pending.append(self._pool.submit(self._run, measure, proxy, case))

    def _run(self, measure: Callable[[Any, Case, Callable[[dict[str, Any]], None]], None],
             proxy: Any, case: Case) -> list[dict[str, Any]]:
        lane = self._free.get()
        rows: list[dict[str, Any]] = []
        try:
            measure(self._own[id(proxy)][lane], case, rows.append)
        finally:
            self._free.put(lane)
        return rows

    def settle(self) -> list[dict[str, Any]]:
        """Wait for every case asked for so far; their rows, in the order asked."""
        pending, self._pending = self._pending, []
        return [row for done in pending for row in done.result()]


class _Runner:
    def __init__(self, cfg: BenchConfig, log: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.sz = cfg.sizes
        self.log = log
        self.rows: list[dict[str, Any]] = []
        self.ceilings: dict[str, Any] = {}
        self.datasets: dict[str, Any] = {}
        self.datapipes_python: str | None = None
        self.peers_python: str | None = None  # the LitData / Mosaic side venv
        self.peers_missing: str | None = None
        self.spdl_python: str | None = None  # the SPDL side venv
        self.spdl_missing: str | None = None
        self.spdl_probe: dict[str, Any] = {}  # its version, and whether its FFmpeg decoder works
        self.spdl_overhead: list[dict[str, Any]] = []
        self.conversions: dict[str, Any] = {}
        self.notes: list[str] = []
        self.endpoint = ""
        self.workdir = Path(".")
        #: told of every case before it runs (the command's progress bar)
        self.on_case: Callable[[Case], None] | None = None
        #: cases side by side (``Sizes.side_by_side`` above 1), while the run's proxies are up
        self.lanes: _Lanes | None = None

    def case(self, proxy: Any, case: Case) -> None:
        """Measure ``case`` behind ``proxy`` (its repeats in a row), or hand it to the lanes."""
        if self.cfg.only and case.library not in self.cfg.only:
            return
        if self.sz.lean and case.library in NAMED_BACKEND_ROWS:
            return
        if self.on_case is not None:
            self.on_case(case)
        if self.lanes is not None:
            self.lanes.submit(self._measure, proxy, case)
        else:
            self._measure(proxy, case, self._keep)

    def _measure(self, proxy: Any, case: Case, keep: Callable[[dict[str, Any]], None]) -> None:
        env = {"AWS_ENDPOINT_URL": proxy.url, "S3_ENDPOINT_URL": proxy.url}
        for repeat in range(self.cfg.repeats):
            row = run_case(case, proxy_url=proxy.url, env=env, log=self.log,
                           others=self._others(proxy))
            row["latency_ms"] = proxy.delay_ms
            if self.cfg.repeats > 1:
                row["repeat"] = repeat
            keep(row)

    def _keep(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self._checkpoint()

    def settle(self) -> None:
        """Every case asked for has its rows (at once without lanes; with them, once they end)."""
        if self.lanes is not None:
            for row in self.lanes.settle():
                self._keep(row)

    def _others(self, proxy: Any) -> dict[str, int]:
        """The server's and the proxy's pids, whose CPU each row reports beside the client's."""
        pids = {"proxy": proxy.pid} if getattr(proxy, "pid", None) else {}
        server = _listener_pid(self.endpoint)
        if server is not None:
            pids["server"] = server
        return pids

    def _checkpoint(self) -> None:
        """Every row so far, so a run that is cut short still leaves its measurements."""
        path = self.cfg.out / "results.partial.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"rows": self.rows, "ceilings": self.ceilings,
                                    "conversions": self.conversions, "datasets": self.datasets}))

    # -- scenario 1 --
    def s1(self, proxies: dict[float, Any]) -> None:
        sz = self.sz
        for layout in sz.s1_layouts:
            fields = PNG_FIELDS if layout == "single" else JPEG_FIELDS
            prefix = f"s3://{BUCKET}/s1-{layout}/"
            size = sz.s1_png_size if layout == "single" else None
            ds = _generate(layout, prefix, count=sz.s1_count, image_size=size)
            name = "PNG pairs" if layout == "single" else "JPEG ~115 KB"
            bps = ds.nbytes / ds.count
            self.datasets[f"s1-{layout}"] = {
                "count": ds.count,
                "bytes_per_sample": round(bps),
                "objects": len(ds.objects),
                "image_size": ds.image_size,
            }
            keys = [f"s1-{layout}/{o}" for o in ds.objects]
            for t, proxy in proxies.items():
                self.ceilings[f"s1 {name}, T={t:g} ms"] = raw_get_ceiling(
                    proxy.url, keys, seconds=min(sz.ceiling_seconds, sz.max_seconds)
                )
                group = f"{name}, T={t:g} ms"
                common = {"prefix": prefix, "count": ds.count, "fields": fields}
                budget = {
                    "bytes_per_sample": bps,
                    "max_seconds": sz.max_seconds,
                    "min_samples": sz.min_samples,
                    "min_seconds": sz.min_seconds,
                    "extra": {"objects_per_sample": len(fields)},
                }
                mk = functools.partial(_s1_case, group, budget)
                cases = [
                    mk(
                        "pipeflow",
                        "benchmarks.pipeflow_cases:make_single",
                        {**common, "workers": 2, "backend": None, "inflight": 32},
                        2,
                    )
                ]
                cases.append(
                    mk(
                        THREAD_NATIVE,
                        "benchmarks.pipeflow_cases:make_single_loader",
                        {**common, "backend": None, "inflight": 64},
                        0,
                    )
                )
                spdl = self.spdl_case("s1", group, SPDL, "make_single",
                                      {**common, "settings": spdl_settings()}, budget)
                cases += [spdl] if spdl else []
                cases.append(
                    mk(
                        "pipeflow (boto3 backend)",
                        "benchmarks.pipeflow_cases:make_single",
                        {**common, "workers": 2, "backend": "boto3", "inflight": 32},
                        2,
                    )
                )
                for w in sz.s1_peer_workers:
                    cases.append(
                        mk(
                            "S3MapDataset",
                            "benchmarks.peers.s3torch:make_map",
                            {"prefix": prefix, "n_fields": len(fields), "workers": w},
                            w,
                        )
                    )
                    cases.append(
                        mk("boto3 map-style", "benchmarks.peers.boto3_map:make", {**common, "workers": w}, w)
                    )
                    cases.append(
                        mk(
                            "fsspec random access",
                            "benchmarks.peers.fsspec_random:make",
                            {**common, "workers": w},
                            w,
                        )
                    )
                cases.append(
                    mk("s5cmd sampler", "benchmarks.peers.s5cmd_sampler:make", {**common, "workers": 2}, 2)
                )
                if self.datapipes_python:
                    cases.append(
                        mk(
                            "DataPipes FSSpecFileOpener",
                            "benchmarks.peers.datapipes:make_single",
                            {**common, "workers": 2},
                            2,
                            python=self.datapipes_python,
                        )
                    )
                for recipe, original in S1_RECIPES[layout].items():
                    extra = {**budget["extra"], "reproduces": original}
                    cases.append(mk(f"recipe {recipe}", "benchmarks.pipeflow_cases:make_recipe",
                                    {"name": recipe, "url": prefix, "workers": 2}, 2,
                                    extra=extra))
                for c in cases:
                    # samples enough for the budget at the ceiling, not more (the tail is slow peers)
                    c.max_samples = ds.count
                    self.case(proxy, c)

    # -- scenario 2 --
    def s2(self, proxy: Any) -> None:
        sz = self.sz
        count = max(4, int(sz.s2_total_mb * 1e6 / 116_000)) if sz.s2_jpeg_size == 360 else 16
        for mb in sz.s2_shard_mb:
            prefix = f"s3://{BUCKET}/s2-{mb:g}mb/"
            ds = _generate("jpeg-shards", prefix, count=count, image_size=sz.s2_jpeg_size, shard_mb=mb)
            bps = ds.nbytes / ds.count
            self.datasets[f"s2-{mb:g}mb"] = {"count": ds.count, "shards": len(ds.objects),
                                             "bytes_per_sample": round(bps)}
            keys = [f"s2-{mb:g}mb/{o}" for o in ds.objects]
            self._stream_ceiling(proxy, f"s2 stream {mb:g} MB shard", keys)
            group = f"{mb:g} MB shards"
            kw = self._s2_budget(bps, {"shard_mb": mb, "decode": False})
            recipes = self._s2_recipes(group, prefix, kw, layout="jpeg-shards")
            for c in self._lean_sizes(self._s2_cases(group, ds.urls(), prefix, kw, decode=False), recipes):
                self.case(proxy, c)
            for c in recipes:
                self.case(proxy, c)
            for c in self._s2_streaming_peers(group, ds.urls(), f"s2-{mb:g}mb", mb, kw, decode=False):
                self.case(proxy, c)
        if sz.s2_wds_mb:
            self._s2_wds(proxy, sz.s2_wds_mb)
        for kind in sz.s2_decode_kinds:
            self._s2_decode(proxy, kind)

    def _lean_sizes(self, cases: list[Case], recipes: list[Case]) -> list[Case]:
        """The smoke test's shard-size group: without the article's peers that the article group
        runs with the same code (no recipe here reproduces them); every other run keeps them all."""
        if not (self.sz.lean and self.sz.s2_wds_mb):
            return cases
        beside = {c.extra.get("reproduces") for c in recipes}
        article = set(S2_RECIPES.values()) - beside
        return [c for c in cases if c.library not in article]

    def _s2_wds(self, proxy: Any, mb: float) -> None:
        """Article 001's own layout (PNG image + label pairs in tar shards): its webdataset and
        DataPipes code beside the recipes that reproduce it (they expect this layout)."""
        sz = self.sz
        prefix = f"s3://{BUCKET}/s2-wds-{mb:g}mb/"
        count = max(8, int(sz.s2_total_mb * 1e6 / 100_000))
        ds = _generate("wds", prefix, count=count, image_size=sz.s1_png_size, shard_mb=mb)
        bps = ds.nbytes / ds.count
        self.datasets[f"s2-wds-{mb:g}mb"] = {"count": ds.count, "shards": len(ds.objects),
                                             "bytes_per_sample": round(bps)}
        group = f"{mb:g} MB shards, article 001 layout (PNG pairs)"
        kw = self._s2_budget(bps, {"shard_mb": mb, "decode": False, "layout": "wds"})
        cases = self._s2_cases(group, ds.urls(), prefix, kw, decode=False)
        if sz.lean:  # the smoke test: only the article's code and its recipes
            cases = [c for c in cases if c.library in S2_RECIPES.values()]
        cases += self._s2_recipes(group, prefix, kw)
        for c in cases:
            self.case(proxy, c)

    def _s2_budget(self, bps: float, extra: dict[str, Any]) -> dict[str, Any]:
        return {"bytes_per_sample": bps, "max_seconds": self.sz.max_seconds, "extra": extra,
                "min_samples": self.sz.min_samples, "min_seconds": self.sz.min_seconds}

    def _stream_ceiling(self, proxy: Any, name: str, keys: list[str]) -> None:
        # the loader keeps one shard open per DataLoader worker: N concurrent streaming GETs
        streams = S2_WORKERS * S2_SHARDS_IN_FLIGHT
        self.ceilings[name] = raw_stream_ceiling(proxy.url, keys, streams=streams)

    def _s2_cases(self, group: str, shards: list[str], prefix: str, kw: dict[str, Any],
                  *, decode: bool) -> list[Case]:
        w = S2_WORKERS
        pipeflow_factory = "make_photo_shards" if decode else "make_shards"
        cases = [
            # the default pipeline: no backend named, as a user writes it
            Case("s2", group, "pipeflow", f"benchmarks.pipeflow_cases:{pipeflow_factory}",
                 {"shards": shards, "workers": w, "backend": None}, w, **kw),
            Case("s2", group, "S3IterableDataset", "benchmarks.peers.s3torch:make_iterable",
                 {"prefix": prefix, "workers": w, "decode": decode}, w, **kw),
            Case("s2", group, "webdataset + boto3 url_opener", "benchmarks.peers.webdataset_peers:make",
                 {"shards": shards, "opener": "boto3", "workers": w, "decode": decode}, w, **kw),
            Case("s2", group, "webdataset pipe:s5cmd", "benchmarks.peers.webdataset_peers:make",
                 {"shards": shards, "opener": "pipe", "workers": w, "decode": decode}, w, **kw),
        ]
        loader = "make_photo_shards_loader" if decode else "make_shards_loader"
        cases.append(Case("s2", group, THREAD_NATIVE, f"benchmarks.pipeflow_cases:{loader}",
                          {"shards": shards, "backend": None}, 0, **kw))
        cases += self._s2_spdl(group, shards, kw, decode=decode)
        if decode:
            return cases
        cases += [
            Case("s2", group, "pipeflow (boto3 backend)", "benchmarks.pipeflow_cases:make_shards",
                 {"shards": shards, "workers": w, "backend": "boto3"}, w, **kw),
            Case("s2", group, "pipeflow (s3torchconnector backend)", "benchmarks.pipeflow_cases:make_shards",
                 {"shards": shards, "workers": w, "backend": "s3torchconnector"}, w, **kw),
            Case("s2", group, "webdataset + s3fs url_opener", "benchmarks.peers.webdataset_peers:make",
                 {"shards": shards, "opener": "s3fs", "workers": w}, w, **kw),
        ]
        if self.datapipes_python:
            cases.append(Case("s2", group, "DataPipes FSSpecFileOpener",
                              "benchmarks.peers.datapipes:make_shards",
                              {"shards": shards, "workers": w}, w, python=self.datapipes_python, **kw))
        return cases

    def _s2_spdl(self, group: str, shards: list[str], kw: dict[str, Any], *, decode: bool) -> list[Case]:
        """SPDL's rows of an S2 group: without decode, or with each of the two batch decoders."""
        rows = ((SPDL_FFMPEG, "ffmpeg"), (SPDL_OWN_DECODER, "pipeflow")) if decode else ((SPDL, "none"),)
        cases = [self.spdl_case("s2", group, library, "make_shards",
                                {"shards": shards, "decoder": decoder, "settings": spdl_settings()}, kw)
                 for library, decoder in rows]
        return [c for c in cases if c is not None]

    def spdl_case(self, scenario: str, group: str, library: str, factory: str, kwargs: dict[str, Any],
                  budget: dict[str, Any]) -> Case | None:
        """One SPDL row, run by the SPDL side venv; None when it does not run: not asked for, or
        unavailable (then a row says why: the venv could not be made, or FFmpeg does not load)."""
        if not self.cfg.spdl or (self.cfg.only and library not in self.cfg.only):
            return None
        if not self.spdl_python:
            self.unavailable(scenario, group, library, self.spdl_missing or "SPDL side venv missing")
            return None
        if kwargs.get("decoder") == "ffmpeg" and not self.spdl_probe.get("ffmpeg"):
            why = self.spdl_probe.get("why", "not probed")
            self.unavailable(scenario, group, library,
                             f"spdl.io's FFmpeg decoder does not load here ({why}); {FFMPEG_HINT}")
            return None
        extra = {**budget.get("extra", {})}
        if "settings" in kwargs:
            extra["spdl_settings"] = kwargs["settings"]
        return Case(scenario, group, library, f"benchmarks.peers.spdl_peer:{factory}", kwargs, 0,
                    python=self.spdl_python, **{**budget, "extra": extra})

    def _s2_recipes(self, group: str, prefix: str, kw: dict[str, Any], layout: str = "wds") -> list[Case]:
        from pipeflow import recipes

        cases = []
        for recipe, original in S2_RECIPES.items():
            if recipes.get(recipe).layout != layout:
                continue  # the recipe reads its article's layout only
            if original == "DataPipes FSSpecFileOpener" and not self.datapipes_python:
                continue
            extra = {**kw["extra"], "reproduces": original}
            cases.append(Case("s2", group, f"recipe {recipe}", "benchmarks.pipeflow_cases:make_recipe",
                              {"name": recipe, "url": prefix, "workers": S2_WORKERS}, S2_WORKERS,
                              **{**kw, "extra": extra}))
        return cases

    def _s2_decode(self, proxy: Any, kind: str) -> None:
        from benchmarks import photos

        sz = self.sz
        mb = sz.s2_decode_at
        name = f"s2-{kind}"
        count = sz.s2_decode_count
        ps = photos.write_shards(_client(self.endpoint), BUCKET, name, kind, count=count, shard_mb=mb)
        bps = ps.nbytes / ps.count
        self.datasets[name] = {"count": ps.count, "shards": len(ps.urls), "bytes_per_sample": round(bps),
                               "image": f"{ps.width}x{ps.height}", "distinct_images": photos.DISTINCT}
        group = f"{mb:g} MB shards, decode {ps.width}x{ps.height} JPEG (~{bps / 1e3:.0f} KB) to 224x224"
        kw = self._s2_budget(bps, {"shard_mb": mb, "decode": True, "decode_kind": kind})
        cases = self._s2_cases(group, ps.urls, f"s3://{BUCKET}/{name}/", kw, decode=True)
        if sz.lean:  # the smoke test: webdataset's decode (one function) once, behind its pipe opener
            cases = [c for c in cases if c.library != "webdataset + boto3 url_opener"]
        cases += self._s2_streaming_peers(group, ps.urls, name, mb, kw, decode=True)
        bare = {"kind": kind, "count": min(count, 2000), "workers": S2_WORKERS}
        cases.append(Case("s2", group, BARE_PIL, "benchmarks.pipeflow_cases:make_bare_224",
                          bare, S2_WORKERS, **kw))
        cases.append(Case("s2", group, BARE_OWN_DECODER, "benchmarks.pipeflow_cases:make_bare_own_decoder",
                          bare, S2_WORKERS, **kw))
        cases.append(Case("s2", group, BARE_DATALOADER,
                          "benchmarks.pipeflow_cases:make_dataloader_own_decoder", bare, S2_WORKERS, **kw))
        for c in cases:
            self.case(proxy, c)

    def _s2_streaming_peers(self, group: str, shards: list[str], name: str, mb: float,
                            kw: dict[str, Any], *, decode: bool) -> list[Case]:
        """LitData and Mosaic Streaming over their own format, converted from the same shards."""
        cases: list[Case] = []
        if not self.cfg.streaming_peers:
            return cases
        for library, module, suffix in (("LitData StreamingDataset", "litdata_peer", "litdata"),
                                         ("Mosaic StreamingDataset", "mosaic", "mds")):
            if self.cfg.only and library not in self.cfg.only:
                continue  # neither its case nor its conversion (minutes at 512 MB) is wanted
            if not self.peers_python:
                self.unavailable("s2", group, library, self.peers_missing or "side venv missing")
                continue
            url = f"s3://{BUCKET}/{name}-{suffix}"
            key = f"{name} {suffix}"
            if key not in self.conversions:
                self.conversions[key] = self._convert(module, shards, url, mb)
            if "error" in self.conversions[key]:
                self.unavailable("s2", group, library, "conversion failed: " + self.conversions[key]["error"])
                continue
            cache = str(self.workdir / f"{suffix}-cache")
            cases.append(Case("s2", group, library, f"benchmarks.peers.{module}:make",
                              {"url": url, "cache_dir": cache, "workers": S2_WORKERS, "decode": decode},
                              S2_WORKERS, python=self.peers_python, env=dict(SIDE_ENV), **kw))
        return cases

    def _convert(self, module: str, shards: list[str], url: str, mb: float) -> dict[str, Any]:

        args = json.dumps({"shards": shards, "output": url, "chunk_mb": mb, "workdir": str(self.workdir)})
        env = {**os.environ, **SIDE_ENV, "AWS_ENDPOINT_URL": self.endpoint, "S3_ENDPOINT_URL": self.endpoint,
               "PYTHONPATH": str(Path(__file__).resolve().parent.parent), "PYTHONWARNINGS": "ignore"}
        assert self.peers_python
        done = subprocess.run([self.peers_python, "-m", f"benchmarks.peers.{module}", "convert", args],
                              capture_output=True, text=True, env=env, timeout=1800,
                              cwd=str(Path(__file__).resolve().parent.parent))
        line = next((x for x in done.stdout.splitlines() if x.startswith("CONVERTED ")), None)
        if done.returncode != 0 or line is None:
            err = (done.stderr or done.stdout)[-1500:].strip()
            self.log(f"  ! {module} conversion to {url} failed: {err[-600:]}")
            return {"error": err}
        seconds = float(line.split()[1])
        self.log(f"  {module} conversion to {url}: {seconds:.1f} s")
        return {"seconds": round(seconds, 2), "url": url, "shards_in": len(shards)}

    def unavailable(self, scenario: str, group: str, library: str, why: str) -> None:
        self.settle()  # after the rows of the cases asked for before it
        self.rows.append({"scenario": scenario, "group": group, "library": library, "workers": S2_WORKERS,
                          "error": f"unavailable: {why}"})

    # -- scenario 3 --
    def s3(self, proxy: Any, workdir: Path) -> None:
        sz = self.sz
        prefix = f"s3://{BUCKET}/s3-jpeg/"
        size = sz.s2_jpeg_size
        ds = _generate("jpeg", prefix, count=sz.s3_count, image_size=size)
        local = workdir / "s3-jpeg"
        shutil.rmtree(local, ignore_errors=True)
        _generate("jpeg", str(local), count=sz.s3_count, image_size=size)
        bps = ds.nbytes / ds.count
        self.datasets["s3-jpeg"] = {"count": ds.count, "bytes_per_sample": round(bps)}
        cache_dir = workdir / "s3-cache"
        shutil.rmtree(cache_dir, ignore_errors=True)
        common = {"count": ds.count, "fields": JPEG_FIELDS, "workers": 2, "backend": "s3torchconnector"}
        kw = {"bytes_per_sample": bps, "max_seconds": sz.max_seconds * 2, "epochs": sz.s3_epochs}
        group = f"JPEG ~115 KB, {sz.s3_epochs} epochs"
        for lib, kwargs in (
            ("pipeflow + cache()", {**common, "prefix": prefix, "cache_dir": str(cache_dir)}),
            ("pipeflow, no cache", {**common, "prefix": prefix, "cache_dir": None}),
            ("pipeflow, local disk", {**common, "prefix": str(local), "cache_dir": None, "backend": "local"}),
        ):
            self.case(proxy, Case("s3", group, lib, "benchmarks.pipeflow_cases:make_cached", kwargs, 2, **kw))
        self.settle()  # the cache case is done with its directory
        shutil.rmtree(cache_dir, ignore_errors=True)

    # -- scenario 4 --
    def s4(self, proxy: Any) -> None:
        sz = self.sz
        for layout, count, size, name in (
            ("jpeg", sz.s4_count, sz.s2_jpeg_size, "JPEG"),
            ("single", sz.s4_png_count, sz.s4_png_size, f"PNG {sz.s4_png_size} px"),
        ):
            if not count:
                continue
            budget: dict[str, Any] = {"max_seconds": sz.max_seconds, "min_samples": sz.min_samples,
                                      "min_seconds": sz.min_seconds}
            if sz.s4_min_seconds:
                # one long pass: enough items in memory for the whole run, cut at the time
                count, budget = count * 1000, {"max_seconds": sz.s4_min_seconds}
            for method in ("thread", "process"):
                group = f"{name}, {method} workers"
                for lib, m in (("pipeflow", method), ("bare decode loop", f"bare-{method}")):
                    kwargs = {"layout": layout, "count": count, "image_size": size, "workers": 2, "method": m}
                    factory = "benchmarks.pipeflow_cases:make_decode"
                    self.case(proxy, Case("s4", group, lib, factory, kwargs, 2, **budget))
                kwargs = {"layout": layout, "count": count, "image_size": size, "workers": 2}
                native = "benchmarks.pipeflow_cases:make_decode_loader"
                self.case(proxy, Case("s4", group, THREAD_NATIVE, native, {**kwargs, "method": method}, 0,
                                      **budget))
                spdl = self.spdl_case("s4", group, SPDL, "make_decode", {**kwargs, "method": method}, budget)
                if spdl:
                    self.case(proxy, spdl)
                if method == "process":  # DataLoader workers are processes: one row, in this group
                    in_workers = "benchmarks.pipeflow_cases:make_decode_dataloader"
                    self.case(proxy, Case("s4", group, S4_DATALOADER, in_workers, kwargs, 2, **budget))

    # -- scenario 5 --
    def s5(self) -> list[dict[str, Any]]:
        try:
            from benchmarks import overhead
        except ImportError:
            self.notes.append("scenario 5 skipped: benchmarks/overhead.py is missing")
            return []
        rows = overhead.run(items=self.sz.s5_items, repeats=self.sz.s5_repeats)
        self.spdl_overhead = self._s5_spdl()
        return rows

    def _s5_spdl(self) -> list[dict[str, Any]]:
        """S5's chains against SPDL's engine, alternated in one process of the SPDL venv."""
        if not self.spdl_python or (self.cfg.only and SPDL not in self.cfg.only):
            return []
        items = max(1000, self.sz.s5_items // SPDL_S5_FRACTION)
        args = ["overhead", str(items), str(self.sz.s5_repeats)]
        done = _spdl_command(self.spdl_python, args, timeout=1800)
        if "error" in done:
            self.notes.append(f"S5 against SPDL failed: {done['error'][-600:]}")
            return []
        return list(done["rows"])


def _datapipes_venv(log: Callable[[str], None]) -> str:
    from benchmarks.peers.datapipes import ensure_venv

    venv = Path(os.environ.get("PIPEFLOW_BENCH_DATAPIPES_VENV",
                               Path.home() / ".cache" / "pipeflow" / "datapipes-venv"))
    return ensure_venv(venv, log=log)


def _streaming_peers_venv(log: Callable[[str], None]) -> str:
    from benchmarks.peers import _sidevenv

    return _sidevenv.ensure_venv(log=log)


def _spdl_venv(log: Callable[[str], None]) -> str:
    from benchmarks.peers import _sidevenv

    return _sidevenv.ensure_venv(spec=_sidevenv.SPDL, log=log)


def spdl_settings() -> dict[str, Any]:
    """SPDL's settings for this machine (its docs' recommendations), as the rows record them."""
    import dataclasses

    from benchmarks.peers.spdl_peer import SpdlSettings

    return dataclasses.asdict(SpdlSettings())


def _spdl_command(python: str, args: list[str], *, timeout: float = 120) -> dict[str, Any]:
    """``python -m benchmarks.peers.spdl_peer ARGS`` in the SPDL venv; its JSON line, or an error."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONWARNINGS": "ignore"}
    try:
        done = subprocess.run([python, "-m", "benchmarks.peers.spdl_peer", *args], capture_output=True,
                              text=True, env=env, timeout=timeout, cwd=str(root))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("{")), None)
    if done.returncode != 0 or line is None:
        return {"error": (done.stderr or done.stdout)[-1500:].strip() or f"exit code {done.returncode}"}
    return dict(json.loads(line))


def wants_spdl(cfg: BenchConfig) -> bool:
    """Whether a run needs the SPDL venv: SPDL on, a scenario it joins, and (with ``only``) a row
    of it asked for."""
    if not cfg.spdl or not set(SPDL_SCENARIOS) & set(cfg.scenarios):
        return False
    return not cfg.only or bool(set(cfg.only) & set(SPDL_LIBRARIES))


def _prepare_spdl(runner: _Runner) -> None:
    runner.spdl_python = _side_venv(runner, "SPDL", _spdl_venv)
    if runner.spdl_python is None:
        runner.spdl_missing = runner.notes[-1]
        return
    runner.spdl_probe = _spdl_command(runner.spdl_python, ["probe"])
    if not runner.spdl_probe.get("ffmpeg"):
        why = runner.spdl_probe.get("why") or runner.spdl_probe
        runner.notes.append(f"SPDL's FFmpeg decoder unavailable: {why}")


def _side_venv(runner: _Runner, what: str, make: Callable[[Callable[[str], None]], str]) -> str | None:
    try:
        return make(runner.log)
    except Exception as exc:  # the peers are reported unavailable, the run goes on
        runner.notes.append(f"{what} peer(s) unavailable: {exc}")
        runner.log(f"! {what} peer(s) unavailable: {exc}")
        return None


def machine() -> dict[str, Any]:
    import psutil

    return {
        "cpus": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
    }


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in (
        "pipeflow",
        "torch",
        "torchdata",
        "boto3",
        "s3fs",
        "s3torchconnector",
        "webdataset",
        "moto",
        "s5cmd",
    ):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def run(cfg: BenchConfig, log: Callable[[str], None] = print,
        on_scenario: Callable[[str], None] | None = None,
        on_case: Callable[[Case], None] | None = None) -> dict[str, Any]:
    """Run the scenarios of ``cfg``; returns everything the report needs. ``on_scenario`` is
    called with each scenario's name (``"s1"``) as it starts, ``on_case`` with each case."""
    runner = _Runner(cfg, log)
    runner.on_case = on_case
    started_scenario = on_scenario or (lambda name: None)
    workdir = Path(cfg.workdir or tempfile.mkdtemp(prefix="pipeflow-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    runner.workdir = workdir
    if cfg.datapipes and {"s1", "s2"} & set(cfg.scenarios):
        runner.datapipes_python = _side_venv(runner, "DataPipes", _datapipes_venv)
    if cfg.streaming_peers and "s2" in set(cfg.scenarios):
        runner.peers_python = _side_venv(runner, "LitData / Mosaic", _streaming_peers_venv)
        if runner.peers_python is None:
            runner.peers_missing = runner.notes[-1]
    if wants_spdl(cfg):
        _prepare_spdl(runner)
    overhead_rows: list[dict[str, Any]] = []
    with _server(cfg.server, log=log) as endpoint:
        runner.endpoint = endpoint
        _make_bucket(endpoint)
        if cfg.server in SERVER_NOTES:
            runner.notes.append(SERVER_NOTES[cfg.server])
        _s1_to_s4(runner, endpoint, started_scenario)
        if "s5" in cfg.scenarios:
            started_scenario("s5")
            log("== scenario 5 (per-stage overhead vs torchdata.nodes)")
            overhead_rows = runner.s5()
    if cfg.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "duration_s": round(time.time() - started, 1),
        "mode": cfg.mode,
        "latency_ms": cfg.latency_ms,
        "server": server_name(cfg.server),
        "machine": machine(),
        "versions": {**_versions(), **{k: v for k, v in runner.spdl_probe.items() if k == "spdl"}},
        "datasets": runner.datasets,
        "ceilings": runner.ceilings,
        "rows": runner.rows,
        "overhead": overhead_rows,
        "overhead_spdl": runner.spdl_overhead,
        "conversions": runner.conversions,
        "notes": runner.notes,
    }


def _s1_to_s4(runner: _Runner, endpoint: str, started_scenario: Callable[[str], None]) -> None:
    """The scenarios behind the delay proxies, each done (every case ended) before the next."""
    from pipeflow.testing.proxy import ProxyProcess

    cfg = runner.cfg
    latencies = [cfg.latency_ms] + ([0.0] if cfg.sizes.s1_latencies_both and cfg.latency_ms else [])
    with contextlib.ExitStack() as stack:
        proxies = {t: stack.enter_context(ProxyProcess(endpoint, delay_ms=t)) for t in latencies}
        if cfg.sizes.side_by_side > 1:
            runner.lanes = _Lanes(stack, endpoint, proxies, cfg.sizes.side_by_side)
        main = proxies[cfg.latency_ms]
        steps = [
            ("s1", lambda: runner.s1(proxies)),
            ("s2", lambda: runner.s2(main)),
            ("s3", lambda: runner.s3(main, runner.workdir)),
            ("s4", lambda: runner.s4(main)),
        ]
        try:
            for name, step in steps:
                if name in cfg.scenarios:
                    started_scenario(name)
                    runner.log(f"== scenario {name[1:]}")
                    step()
                    runner.settle()
        finally:
            runner.lanes = None


def save(result: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=False))
    return path
