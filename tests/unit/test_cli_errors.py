"""A command prints an error a user can fix as its message and notes, also when it was raised in
a DataLoader worker: torch raises it again in the main process with the worker's traceback as
the message (51 lines of it for a recipe pointed at data of another layout)."""

from __future__ import annotations

import torch.utils.data

from pipeflow._cli._errors import error_text
from pipeflow.errors import MissingFieldError


class _Broken(torch.utils.data.IterableDataset):
    def __iter__(self):
        err = MissingFieldError("this recipe reads samples with the fields image, label (key='0370')")
        err.add_note("pipeflow: raised in stage map(...) on __key__='0370'")
        raise err


def test_an_error_from_a_dataloader_worker_is_its_message_and_notes():
    loader = torch.utils.data.DataLoader(_Broken(), num_workers=1, multiprocessing_context="fork")
    try:
        next(iter(loader))
    except MissingFieldError as exc:
        assert "Traceback" in str(exc)  # what torch hands over
        assert error_text(exc) == ("this recipe reads samples with the fields image, label (key='0370')\n"
                                   "pipeflow: raised in stage map(...) on __key__='0370'\n"
                                   "(in DataLoader worker process 0)")
    else:
        raise AssertionError("no error")


def test_an_error_of_this_process_is_its_message_and_notes():
    err = MissingFieldError("no field 'jpg'")
    err.add_note("pipeflow: raised in stage decode")
    assert error_text(err) == "no field 'jpg'\npipeflow: raised in stage decode"

