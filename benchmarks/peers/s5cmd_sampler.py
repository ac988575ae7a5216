"""000: a ``Sampler`` that downloads the next 1000 samples with one ``s5cmd run`` in the background.

As in the article: the sampler writes a command file of ``cp`` lines for the next
``samples_per_call`` samples and starts ``s5cmd --log error run`` on it while the previous
block is consumed (two blocks in flight); the dataset reads the local files and deletes them on
a thread. Changed from the printed snippet, which does not run as printed: the ``cp`` source is
the S3 URL (the snippet replaces ``base_path`` in a local path), ``local_path`` is a fresh
temporary directory, and the endpoint is passed with ``--endpoint-url``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import threading
import time
from subprocess import Popen
from typing import Any

import torch
from torch.utils.data import Dataset, SequentialSampler

from . import _common

samples_per_call = 1000


class S5cmdSampler(SequentialSampler):
    def __init__(self, data_source: Any, base_path: str, local_path: str, fields: tuple[str, ...],
                 shuffle: bool = False):
        super().__init__(data_source)
        self.shuffle = shuffle
        self.base_path = base_path.rstrip("/")
        self.local_path = local_path
        self.fields = fields
        self.s5cmd = _common.s5cmd_binary()

    def load_sample_files(self, handle: int, indices: list[int]) -> Popen:
        cmd_txt = os.path.join(self.local_path, f"{handle}.txt")
        with open(cmd_txt, "w") as f:
            for i in indices:
                for field in self.fields:
                    f.write(f"cp {self.base_path}/{i:06d}.{field} {self.local_path}/{i:06d}.{field}\n")
        s5cmd = f"{self.s5cmd} --endpoint-url {_common.endpoint()} --log error run {cmd_txt}"
        return Popen(shlex.split(s5cmd))

    def __iter__(self):
        n = len(self.data_source)
        if self.shuffle:
            r = torch.empty((), dtype=torch.int64).random_()
            generator = torch.Generator()
            generator.manual_seed(int(r.item()))
            slist = torch.randperm(n, generator=generator).tolist()
        else:
            slist = list(range(n))
        procs: list[Popen | None] = [None, None]
        sublists: list[list[int] | None] = [None, None]
        proc_index = 0
        list_index = 0
        end_index = min(list_index + samples_per_call, n)
        sublists[proc_index] = slist[list_index:end_index]
        procs[proc_index] = self.load_sample_files(proc_index, sublists[proc_index])
        try:
            while list_index < n:
                list_index = end_index
                if list_index < n:
                    end_index = min(list_index + samples_per_call, n)
                    sublists[1 - proc_index] = slist[list_index:end_index]
                    procs[1 - proc_index] = self.load_sample_files(1 - proc_index, sublists[1 - proc_index])
                counter = 0
                while procs[proc_index].poll() is None:
                    counter += 1
                    time.sleep(0.1)
                    if counter == 10:
                        print("data starvation")
                sublist = sublists[proc_index]
                proc_index = 1 - proc_index
                yield from sublist
        finally:  # not in the article: do not leave s5cmd running when iteration stops early
            for p in procs:
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait()


def release_files(file_list: list[str]) -> None:
    def delete_files(files: list[str]) -> None:
        for file in files:
            if os.path.exists(file):
                os.remove(file)

    threading.Thread(target=lambda: delete_files(file_list)).start()


class S5cmdDataset(Dataset):
    def __init__(self, count: int, local_path: str, fields: tuple[str, ...], decode: bool = False):
        super().__init__()
        self.count = count
        self.local_path = local_path
        self.fields = fields
        self.decode = decode

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, Any]:
        paths = [os.path.join(self.local_path, f"{index:06d}.{f}") for f in self.fields]
        sample = {}
        for field, path in zip(self.fields, paths):
            with open(path, "rb") as fh:
                sample[field] = fh.read()
        release_files(paths)
        return _common.decode_sample(sample) if self.decode else sample


class _Loader:
    """The DataLoader plus the temporary directory the sampler downloads into."""

    def __init__(self, prefix: str, count: int, fields: tuple[str, ...], workers: int, batch_size: int,
                 decode: bool) -> None:
        self.local_path = tempfile.mkdtemp(prefix="s5cmd-sampler-")  # local disk, as in the article
        ds = S5cmdDataset(count, self.local_path, fields, decode)
        sampler = S5cmdSampler(ds, prefix, self.local_path, fields)
        self.loader = _common.loader(ds, workers=workers, batch_size=batch_size, sampler=sampler)

    def __iter__(self):
        return iter(self.loader)

    def close(self) -> None:
        shutil.rmtree(self.local_path, ignore_errors=True)


def make(prefix: str, count: int, fields: list[str], workers: int, batch_size: int = 4,
         decode: bool = False) -> Any:
    return _Loader(prefix, count, tuple(fields), workers, batch_size, decode)
