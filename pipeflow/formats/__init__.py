"""Pure data formats, independent of stages: tar, sample keys, decoders, TFRecord.

Every function here works on plain bytes and file objects, so it can be used (and tested)
without building a pipeline.
"""

from __future__ import annotations

from .decoders import DecodeOptions, decode_sample, decode_value
from .example import decode_example, encode_example
from .keys import split_key
from .tar import TarMember, iter_tar
from .tfrecord import TFRecordWriter, iter_tfrecords, write_tfrecords

__all__ = [
    "DecodeOptions",
    "TFRecordWriter",
    "TarMember",
    "decode_example",
    "decode_sample",
    "decode_value",
    "encode_example",
    "iter_tar",
    "iter_tfrecords",
    "split_key",
    "write_tfrecords",
]
